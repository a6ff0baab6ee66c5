//! GPU suite: `gdpath report --measure` on a machine with an NVIDIA GPU, as a user runs it:
//! the quick benches run (host ↔ GPU copies, P2P where two GPUs exist, storage into host memory
//! and onto GPU 0 in a scratch directory), each charted with its command line, and nothing
//! that a GPU makes possible is listed as not measured. Ignored without a GPU (run with
//! `--ignored` through `scripts/gpu-suite.sh`); the `gdpath` binary is the one cargo built for
//! this test, or `GDPATH_BIN` when the test binary was copied to another machine.

use std::process::Command;

mod common;

#[test]
#[ignore = "needs an NVIDIA GPU: run with scripts/gpu-suite.sh"]
fn report_measure_charts_the_gpu_benches_it_ran() {
    let dir = tempfile::tempdir().unwrap();
    let html = dir.path().join("report.html");
    let out = Command::new(common::bin())
        .args(["report", "--measure", "-o"])
        .arg(&html)
        .arg("--path")
        .arg(dir.path())
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{err}");
    let page = std::fs::read_to_string(&html).unwrap();
    for command in [
        "bench h2d",
        "bench d2h",
        "bench storage",
        "bench storage --gpu 0",
    ] {
        assert!(page.contains(command), "no {command:?} in the report");
    }
    for path in ["h2d-pinned", "d2h-pinned"] {
        assert!(page.contains(path), "no {path} line charted");
    }
    for gpu_bench in ["bench h2d: not measured", "bench d2h: not measured"] {
        assert!(!page.contains(gpu_bench), "{gpu_bench} on a GPU machine");
    }
    // A bench that could not run (P2P on one GPU) is listed as not measured, with no empty card.
    assert!(
        !page.contains("No verified row with a size to chart"),
        "an empty chart card"
    );
    // The scratch files of the storage benches are removed.
    let left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .filter_map(|e| e.ok())
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n != "report.html")
        .collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
