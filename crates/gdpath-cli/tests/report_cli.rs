//! `gdpath report` and `gdpath topo --svg` through the binary: the file is written, replaced
//! whole on a second run, never written over a directory; a bad `--path` or `--from` is an
//! error that names it.

use gdpath_testkit::fixture;
use std::process::Command;

mod common;

fn run(cwd: &std::path::Path, args: &[&str]) -> std::process::Output {
    Command::new(common::bin())
        .args(args)
        .current_dir(cwd)
        .output()
        .unwrap()
}

#[test]
fn writes_and_replaces_the_report() {
    let dir = tempfile::tempdir().unwrap();
    let snap = fixture("device/h200x1-capture-2026-12-01.tar.gz");
    let snap = snap.to_str().unwrap();
    let out = run(dir.path(), &["report", "--snapshot", snap]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // The default file, in the current directory; the report names its command line.
    let first = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(first.starts_with("<!DOCTYPE html>") && first.trim_end().ends_with("</html>"));
    assert!(first.contains("gdpath report --snapshot"));
    assert!(String::from_utf8_lossy(&out.stdout).contains("wrote report.html"));
    // Again, with results: refused without --overwrite (before the report is made), then
    // the file is replaced, nothing else is left in the directory.
    let bench = fixture("bench/storage-var-tmp-2026-12-01.json");
    let again = [
        "report",
        "-o",
        "report.html",
        "--snapshot",
        snap,
        "--from",
        bench.to_str().unwrap(),
    ];
    let out = run(dir.path(), &again);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("report.html exists: it is replaced only with --overwrite"),
        "{err}"
    );
    assert_eq!(
        std::fs::read_to_string(dir.path().join("report.html")).unwrap(),
        first
    );
    let out = run(dir.path(), &[&again[..], &["--overwrite"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let second = std::fs::read_to_string(dir.path().join("report.html")).unwrap();
    assert!(second.contains("posix-direct") && !first.contains("posix-direct"));
    let names: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name().to_string_lossy().into_owned())
        .collect();
    assert_eq!(names, vec!["report.html".to_owned()]);
}

#[test]
fn refuses_a_directory_a_bad_path_and_a_bad_document() {
    let dir = tempfile::tempdir().unwrap();
    let snap = fixture("device/h200x1-capture-2026-12-01.tar.gz");
    let snap = snap.to_str().unwrap();
    std::fs::create_dir(dir.path().join("out")).unwrap();
    let out = run(dir.path(), &["report", "-o", "out", "--snapshot", snap]);
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("not a regular file") && err.contains("out"),
        "{err}"
    );
    let out = run(
        dir.path(),
        &["report", "--snapshot", snap, "--path", "nowhere"],
    );
    assert_eq!(out.status.code(), Some(2), "a bad --path is a usage error");
    assert!(String::from_utf8_lossy(&out.stderr).contains("--path nowhere: not a directory"));
    let topo = fixture("nccl-xml/nccl-aws-p4d-24xl-topo.xml");
    let out = run(
        dir.path(),
        &[
            "report",
            "--snapshot",
            snap,
            "--from",
            topo.to_str().unwrap(),
        ],
    );
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("nccl-aws-p4d-24xl-topo.xml") && err.contains("not JSON"),
        "{err}"
    );
    assert!(
        !dir.path().join("report.html").exists(),
        "nothing written on failure"
    );
}

#[test]
fn topo_svg_writes_the_drawing_alone() {
    let dir = tempfile::tempdir().unwrap();
    let f = fixture("nccl-xml/nccl-aws-p4d-24xl-topo.xml");
    let out = run(
        dir.path(),
        &[
            "topo",
            "--nccl-xml",
            f.to_str().unwrap(),
            "--svg",
            "p4d.svg",
        ],
    );
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let svg = std::fs::read_to_string(dir.path().join("p4d.svg")).unwrap();
    assert!(svg.starts_with("<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"machine\""));
    for id in ["GPU0", "GPU7", "NIC3"] {
        assert!(svg.contains(&format!("data-id=\"{id}\"")), "{id}");
    }
    assert!(!svg.contains("<html"), "the drawing alone, not the page");
    // An existing file is replaced only with --overwrite; --overwrite alone is refused.
    let args = [
        "topo",
        "--nccl-xml",
        f.to_str().unwrap(),
        "--svg",
        "p4d.svg",
    ];
    let out = run(dir.path(), &args);
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr)
        .contains("exists: it is replaced only with --overwrite"));
    let out = run(dir.path(), &[&args[..], &["--overwrite"]].concat());
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = run(
        dir.path(),
        &["topo", "--nccl-xml", f.to_str().unwrap(), "--overwrite"],
    );
    assert_eq!(out.status.code(), Some(2));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--overwrite applies to --svg FILE"));
}
