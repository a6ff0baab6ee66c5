//! NVTX ranges with `GDPATH_NVTX=1`: the engine loads the library named by `GDPATH_LIBNVTX` at
//! run time and marks every transfer (a start/end range, ended where its last pair completes)
//! and the phases of a post (push/pop). The library here is a stand-in built by the test with
//! the machine's C compiler, exporting NVTX's four range functions and logging each call to a
//! file, so that the calls a real `gdpath bench kv` makes can be counted without Nsight. Skipped
//! aloud without a C compiler (`scripts/setup.sh` installs g++).

use std::path::{Path, PathBuf};
use std::process::Command;

const SHIM: &str = r#"
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
static FILE *out;
__attribute__((constructor)) static void open_out(void) {
    out = fopen(getenv("NVTX_SHIM_OUT"), "a");
    setvbuf(out, NULL, _IOLBF, 0);
}
uint64_t nvtxRangeStartA(const char *m) {
    static uint64_t n;
    uint64_t id = __atomic_add_fetch(&n, 1, __ATOMIC_SEQ_CST);
    fprintf(out, "start %llu %s\n", (unsigned long long)id, m);
    return id;
}
void nvtxRangeEnd(uint64_t id) { fprintf(out, "end %llu\n", (unsigned long long)id); }
int nvtxRangePushA(const char *m) { fprintf(out, "push %s\n", m); return 0; }
int nvtxRangePop(void) { fprintf(out, "pop\n"); return 0; }
"#;

/// The stand-in library built in `dir`, or `None` without a C compiler.
fn build_shim(dir: &Path) -> Option<PathBuf> {
    let src = dir.join("nvtx_shim.c");
    std::fs::write(&src, SHIM).unwrap();
    let lib = dir.join("libnvtx_shim.so");
    let status = Command::new("cc")
        .args(["-shared", "-fPIC", "-O1", "-o"])
        .arg(&lib)
        .arg(&src)
        .status()
        .ok()?;
    assert!(status.success(), "cc failed on the NVTX stand-in");
    Some(lib)
}

fn bench_kv(envs: &[(&str, &Path)], nvtx: bool) {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gdpath"));
    c.args([
        "bench", "kv", "--src", "host", "--dst", "host", "--blocks", "64", "--runs", "2", "--json",
    ]);
    for (k, v) in envs {
        c.env(k, v);
    }
    if nvtx {
        c.env("GDPATH_NVTX", "1");
    } else {
        c.env_remove("GDPATH_NVTX");
    }
    let out = c.output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

#[test]
fn transfers_and_post_phases_are_nvtx_ranges() {
    let dir = tempfile::tempdir().unwrap();
    let Some(lib) = build_shim(dir.path()) else {
        eprintln!("SKIPPED transfers_and_post_phases_are_nvtx_ranges: no C compiler (cc) to build the NVTX stand-in");
        return;
    };
    let log = dir.path().join("calls");
    let envs = [
        ("GDPATH_LIBNVTX", lib.as_path()),
        ("NVTX_SHIM_OUT", log.as_path()),
    ];
    // Off unless asked: the library is not even loaded.
    bench_kv(&envs, false);
    assert!(!log.exists(), "NVTX called without GDPATH_NVTX=1");

    bench_kv(&envs, true);
    let calls = std::fs::read_to_string(&log).unwrap();
    let count = |p: &str| calls.lines().filter(|l| l.starts_with(p)).count();
    let starts: Vec<&str> = calls
        .lines()
        .filter_map(|l| l.strip_prefix("start "))
        .collect();
    // A warm-up and two timed runs of each row (blocks, contiguous): at least 6 transfers.
    assert!(starts.len() >= 6, "{calls}");
    assert!(
        starts.iter().all(|s| s.contains(" gdpath transfer ")),
        "{calls}"
    );
    // Every range started was ended, each once.
    let mut ended: Vec<&str> = calls
        .lines()
        .filter_map(|l| l.strip_prefix("end "))
        .collect();
    let mut started: Vec<&str> = starts
        .iter()
        .map(|s| s.split(' ').next().unwrap())
        .collect();
    ended.sort_unstable();
    started.sort_unstable();
    assert_eq!(started, ended, "{calls}");
    // The contiguous row posts through Agent::post: its plan and post phases, each popped.
    assert!(count("push gdpath plan") >= 3, "{calls}");
    assert!(count("push gdpath post") >= 3, "{calls}");
    assert_eq!(count("push "), count("pop"), "{calls}");
}
