//! `gdpath nccl`: a real NCCL log against a real `nvidia-smi topo -m` matrix, `nccl run`
//! keeping the command's exit status and explaining the log it wrote, and usage errors.

mod common;

use common::finding;
use std::process::Command;

fn gdpath() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gdpath"))
}

/// Fails the test with the command's stderr unless it exited 0.
fn succeeded(out: &std::process::Output) {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn shm_on_an_nvlink_pair_is_explained_from_the_topology() {
    let log = gdpath_testkit::fixture("nccl/nccl-1609-shm-nvml.log");
    let topo = gdpath_testkit::fixture("nvidia-smi/topo-nccl-1264-hgx-h100-sxm-10nic.txt");
    let out = gdpath()
        .arg("nccl")
        .arg(&log)
        .arg("--smi-topo")
        .arg(&topo)
        .arg("--json")
        .output()
        .unwrap();
    succeeded(&out);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "gdpath.nccl/2");
    // Ranks 2 and 3 are GPUs 6 and 7 (NVML index in the log's brackets): NV18 on this HGX.
    let row = &v["pairs"][0];
    assert_eq!(row["class"], "SHM");
    assert_eq!(row["topo_class"], "NV18", "{row}");
    let f = finding(&v, "nccl.shm-fallback");
    assert_eq!(f["basis"], "derived");
    assert!(f["reason"].as_str().unwrap().contains("NV18"), "{f}");
    // Without the topology the reason is unknown, and says what would tell.
    let out = gdpath()
        .arg("nccl")
        .arg(&log)
        .arg("--json")
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let f = finding(&v, "nccl.shm-fallback");
    assert_eq!(f["basis"], "unknown");
}

#[test]
fn run_keeps_the_exit_status_and_explains_the_log_written() {
    let log = gdpath_testkit::fixture("nccl/nccl-899-gdr-no-module.log");
    // The command stands in for an NCCL program: it writes its log where NCCL_DEBUG_FILE says
    // (NCCL expands %h and %p itself) and fails with status 3.
    let script = format!(
        "test \"$NCCL_DEBUG\" = INFO && cp '{}' \"${{NCCL_DEBUG_FILE%/*}}/nccl.h.1.log\" && exit 3",
        log.display()
    );
    let out = gdpath()
        .args(["nccl", "run", "--smi-topo"])
        .arg(gdpath_testkit::fixture(
            "nvidia-smi/topo-nccl-1264-hgx-h100-sxm-10nic.txt",
        ))
        .args(["--", "sh", "-c", &script])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("nccl.gdr-off"), "{text}");
}

#[test]
fn bad_arguments_are_usage_errors() {
    let out = gdpath().arg("nccl").output().unwrap();
    assert_eq!(out.status.code(), Some(2));
    let out = gdpath()
        .args(["nccl", "/nonexistent/nccl.log"])
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("/nonexistent/nccl.log"));
    let out = gdpath().args(["nccl", "/"]).output().unwrap();
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"));
}

#[test]
fn report_draws_nccls_pairs_beside_the_machines_classes() {
    let dir = gdpath_testkit::scratch();
    // A log name with markup in it: the page must show it escaped.
    let log = dir.path().join("rank<b>&.log");
    std::fs::copy(gdpath_testkit::fixture("nccl/nccl-1609-shm-nvml.log"), &log).unwrap();
    let page = dir.path().join("report.html");
    let out = gdpath()
        .arg("report")
        .arg("--smi-topo")
        .arg(gdpath_testkit::fixture(
            "nvidia-smi/topo-nccl-1264-hgx-h100-sxm-10nic.txt",
        ))
        .arg("--nccl-log")
        .arg(&log)
        .arg("-o")
        .arg(&page)
        .output()
        .unwrap();
    succeeded(&out);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(html.contains("<h2>NCCL's paths</h2>"));
    // Ranks 2 and 3 (GPUs 6 and 7, NV18 on this HGX) used SHM: the row says all three.
    let row = html
        .split("<tr class=\"nccl-pair\">")
        .nth(1)
        .expect("a pair row")
        .split("</tr>")
        .next()
        .unwrap();
    for want in [
        "2 → 3",
        "SHM",
        "SHM/direct/direct",
        "NV18",
        "nccl.shm-fallback",
    ] {
        assert!(row.contains(want), "{want} not in {row}");
    }
    assert!(
        html.contains("rank&lt;b&gt;&amp;.log"),
        "the log name escaped"
    );
    assert!(!html.contains("rank<b>"), "no raw log text in the page");
    // A log that cannot be read fails the report before it is written.
    let out = gdpath()
        .arg("report")
        .arg("--smi-topo")
        .arg(gdpath_testkit::fixture(
            "nvidia-smi/topo-nccl-1264-hgx-h100-sxm-10nic.txt",
        ))
        .args(["--nccl-log", "/"])
        .arg("-o")
        .arg(dir.path().join("no.html"))
        .output()
        .unwrap();
    assert_ne!(out.status.code(), Some(0));
    assert!(String::from_utf8_lossy(&out.stderr).contains("not a regular file"));
    assert!(!dir.path().join("no.html").exists());
}
