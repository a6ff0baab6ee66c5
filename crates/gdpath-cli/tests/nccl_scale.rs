//! `gdpath nccl` on a large log: what it prints and holds grows with the distinct pairs, not
//! the log. A file of its own, so that the children's peak resident size is this test's only.

mod common;
use common::{bin, json_ok};
use std::process::Command;

/// The largest resident size of the children waited for so far, bytes.
fn children_max_rss() -> u64 {
    // SAFETY: rusage is plain integers, for which all zero bytes are a value.
    let mut u: libc::rusage = unsafe { std::mem::zeroed() };
    // SAFETY: getrusage writes the struct it is given and nothing else.
    let rc = unsafe { libc::getrusage(libc::RUSAGE_CHILDREN, &mut u) };
    assert_eq!(rc, 0, "getrusage");
    u.ru_maxrss as u64 * 1024
}

#[test]
fn output_and_memory_grow_with_the_pairs_not_the_log() {
    // Issue 42: a 72 MB log of 10^6 lines gave 404 MB of JSON at 681 MB resident. Here 10^5
    // lines of about 1 KB (a 100 MB log) of 64 pairs.
    let dir = gdpath_testkit::scratch();
    let log = dir.path().join("big.log");
    let pad = "x".repeat(900);
    let mut text = String::with_capacity(104 << 20);
    for i in 0..100_000u32 {
        let (a, b) = (i % 8, (i / 8) % 8);
        text.push_str(&format!(
            "algo-1:1:1 [{a}] NCCL INFO Channel {:02}/0 : {a}[{a}] -> {b}[{b}] via P2P/CUMEM/read {pad}\n",
            i % 32
        ));
    }
    std::fs::write(&log, &text).unwrap();
    drop(text);
    let json = Command::new(bin())
        .arg("nccl")
        .arg(&log)
        .arg("--json")
        .output()
        .unwrap();
    let v = json_ok(&json);
    let rss = children_max_rss();
    let verbose = Command::new(bin())
        .args(["nccl", "-v"])
        .arg(&log)
        .output()
        .unwrap();
    assert!(verbose.status.success());
    assert!(
        json.stdout.len() < 1 << 20,
        "JSON of {} bytes",
        json.stdout.len()
    );
    assert!(
        verbose.stdout.len() < 64 << 10,
        "text of {} bytes",
        verbose.stdout.len()
    );
    let pairs = v["pairs"].as_array().unwrap();
    assert_eq!(pairs.len(), 64);
    assert_eq!(pairs[0]["lines"], 100_000 / 64 + 1);
    assert_eq!(pairs[0]["samples"].as_array().unwrap().len(), 8);
    assert_eq!(pairs[0]["samples"][0]["cut"], true, "a sample is 512 bytes");
    // The log's 100 MB are not held (this file's one test: its children are the two above).
    assert!(rss < 96 << 20, "a child reached {rss} bytes resident");
}
