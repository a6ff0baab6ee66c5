//! `gdpath bench storage` and `gdpath copy` run as a user would, on real files.

use std::process::Command;

mod common;

use common::{error_doc, json_ok};

fn gdpath() -> Command {
    Command::new(common::bin())
}

#[test]
fn bench_storage_json_rows_have_the_shared_fields() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = dir.path().join("b");
    let out = gdpath()
        .args(["bench", "storage", "--file"])
        .arg(&f)
        .args([
            "--size",
            "4MiB",
            "--block",
            "256KiB..512KiB",
            "--qd",
            "4",
            "--runs",
            "2",
            "--compare",
            "--json",
        ])
        .output()
        .unwrap();
    let v = json_ok(&out);
    assert!(
        out.stderr.is_empty(),
        "quiet when piped: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(v["schema"], "gdpath.bench/1");
    let rows = v["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 4, "two block sizes × (engine, read-loop)");
    for r in rows {
        for k in gdpath_bench::ROW_FIELDS {
            assert!(!r[k].is_null(), "row lacks {k}: {r}");
        }
        assert_eq!(r["verified"], true);
        assert_eq!(r["bytes"], 4 << 20);
    }
    assert_eq!(rows[0]["path"], "posix-direct");
    assert_eq!(rows[0]["block"], 256 << 10);
    assert_eq!(rows[2]["block"], 512 << 10);
}

#[test]
fn copy_prints_paths_and_verifies() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let src = dir.path().join("src");
    let data: Vec<u8> = (0..3_000_001u32).map(|i| (i * 7 % 251) as u8).collect();
    std::fs::write(&src, &data).unwrap();
    let dst = dir.path().join("dst");
    let out = gdpath()
        .arg("copy")
        .arg(&src)
        .arg(&dst)
        .args(["--verify", "--window", "1MiB"])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "{text} {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(text.contains("file -> host: posix-direct"), "{text}");
    assert!(text.contains("host -> file: posix-direct"), "{text}");
    assert!(text.contains("verified: yes"), "{text}");
    assert!(text.contains("GB/s"), "{text}");
    assert_eq!(std::fs::read(&dst).unwrap(), data);
    // A directory is a clear error, exit code 1.
    let out = gdpath().arg("copy").arg(dir.path()).output().unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("is a directory"));
}

#[test]
fn copy_onto_itself_is_refused_and_the_source_survives() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = dir.path().join("src");
    let data: Vec<u8> = (0..100_003u32).map(|i| (i % 251) as u8).collect();
    std::fs::write(&f, &data).unwrap();
    let link = dir.path().join("link");
    std::os::unix::fs::symlink(&f, &link).unwrap();
    for (src, dst) in [(&f, &f), (&link, &f)] {
        let out = gdpath().arg("copy").arg(src).arg(dst).output().unwrap();
        assert!(
            !out.status.success(),
            "{} -> {} must fail",
            src.display(),
            dst.display()
        );
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains("same file"), "stderr: {err}");
        assert_eq!(std::fs::read(&f).unwrap(), data, "the source is intact");
    }
}

#[test]
fn bench_storage_refuses_a_file_larger_than_the_free_space_and_leaves_nothing() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = dir.path().join("huge");
    // 1 EiB: more than any file system here has free.
    let out = gdpath()
        .args(["bench", "storage", "--file"])
        .arg(&f)
        .args(["--size", "1048576TiB"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("bytes free"), "stderr: {err}");
    assert!(!f.exists(), "no partial file left behind");
}

#[test]
fn copy_refuses_a_window_below_one_page() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = dir.path().join("src");
    std::fs::write(&f, vec![7u8; 10_000]).unwrap();
    let out = gdpath()
        .arg("copy")
        .arg(&f)
        .arg(dir.path().join("dst"))
        .args(["--window", "3"])
        .output()
        .unwrap();
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("minimum of 4096 bytes"), "stderr: {err}");
}

/// Generated files (procfs reports a size of 0, sysfs 4096) are read to their end with
/// read(2): the destination holds what reading the source gives, and the output says how it
/// was read.
#[test]
fn copy_reads_a_generated_file_to_its_end() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    for (i, src) in ["/proc/version", "/sys/class/net/lo/address"]
        .iter()
        .enumerate()
    {
        let dst = dir.path().join(format!("copy{i}"));
        let out = gdpath()
            .args(["copy", src, dst.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            out.status.success(),
            "{src}: {text} {}",
            String::from_utf8_lossy(&out.stderr)
        );
        assert!(text.contains("generated file"), "{text}");
        let want = std::fs::read(src).unwrap();
        assert!(!want.is_empty());
        assert_eq!(std::fs::read(&dst).unwrap(), want, "{src}");
    }
}

/// A block larger than `--size` would be cut to the size, so no I/O of the block its row
/// reports would be made: refused, naming the blocks and the size, before the file is made.
/// A block equal to the size runs, and its rows report that block.
#[test]
fn bench_storage_refuses_a_block_larger_than_the_size() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = dir.path().join("b");
    let out = gdpath()
        .args(["bench", "storage", "--file"])
        .arg(&f)
        .args(["--size", "1MiB", "--block", "512KiB..4MiB", "--runs", "1"])
        .args(["--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2), "a bad command line, as clap's");
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("block 2 MiB, 4 MiB exceeds the size 1 MiB of a run"),
        "stderr: {err}"
    );
    let v = error_doc(&out);
    assert_eq!(v["kind"], "usage", "{v}");
    assert!(!f.exists(), "nothing written for a refused run");
    let out = gdpath()
        .args(["bench", "storage", "--file"])
        .arg(&f)
        .args(["--size", "1MiB", "--block", "1MiB", "--runs", "1", "--json"])
        .output()
        .unwrap();
    let v = json_ok(&out);
    for r in v["rows"].as_array().unwrap() {
        assert_eq!(r["block"], 1 << 20, "{r}");
        assert_eq!(r["bytes"], 1 << 20, "{r}");
    }
}
