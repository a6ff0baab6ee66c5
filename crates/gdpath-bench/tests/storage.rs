//! The bench harness and `gdpath copy`'s one-shot copy on real files in a real directory (the
//! work disk, which accepts O_DIRECT): data verified, rows well-formed, typed errors.

use gdpath::finding::ids;
use gdpath::{Agent, AgentConfig, DataPath, DirectIo, Error};
use std::path::PathBuf;

/// A temporary directory on the work disk (ext4 here; accepts O_DIRECT).
fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).expect("tempdir on the work disk")
}

fn agent() -> Agent {
    Agent::new(AgentConfig::default()).expect("agent")
}

/// `len` bytes of the benches' own pattern.
fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    gdpath_bench::fill_pattern(&mut v, 0, seed);
    v
}

fn file_in(dir: &std::path::Path, name: &str, bytes: &[u8]) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, bytes).expect("write test file");
    p
}

#[test]
fn copy_streams_through_bounded_windows_and_verifies() {
    let dir = disk_dir();
    let a = agent();
    let data = pattern((10 << 20) + 7, 5);
    let src = file_in(dir.path(), "src", &data);
    let dst = dir.path().join("dst");
    let opts = gdpath_bench::copy::CopyOptions {
        window: 1 << 20,
        verify: true,
        ..Default::default()
    };
    let r = gdpath_bench::copy::copy_file(&a, &src, Some(&dst), &opts, &gdpath_bench::NoProgress)
        .unwrap();
    assert_eq!(r.bytes, data.len() as u64);
    assert_eq!(r.verified, Some(true));
    assert_eq!(r.read.as_ref().unwrap().path, DataPath::PosixDirect);
    assert_eq!(r.write.as_ref().unwrap().path, DataPath::PosixDirect);
    assert_eq!(std::fs::read(&dst).unwrap(), data);
    // Into memory only, and an empty file.
    let r =
        gdpath_bench::copy::copy_file(&a, &src, None, &opts, &gdpath_bench::NoProgress).unwrap();
    assert_eq!(r.verified, Some(true));
    assert!(r.write.is_none());
    let empty = file_in(dir.path(), "empty", &[]);
    let r = gdpath_bench::copy::copy_file(
        &a,
        &empty,
        Some(&dir.path().join("e2")),
        &opts,
        &gdpath_bench::NoProgress,
    )
    .unwrap();
    assert_eq!(r.bytes, 0);
    assert_eq!(std::fs::metadata(dir.path().join("e2")).unwrap().len(), 0);
}

#[test]
fn storage_bench_runs_and_verifies_on_a_small_file() {
    let dir = disk_dir();
    let cfg = gdpath_bench::storage::StorageBenchConfig {
        file: dir.path().join("bench"),
        size: 8 << 20,
        blocks: vec![64 << 10, 1 << 20],
        qd: 4,
        op: gdpath::Op::Read,
        runs: 2,
        compare: true,
        direct: DirectIo::Auto,
        cold: false,
        overwrite: false,
        fsync: true,
    };
    let rep = gdpath_bench::storage::run(&cfg, &gdpath_bench::NoProgress).unwrap();
    assert!(rep.prepared);
    assert_eq!(rep.rows.len(), 4);
    for r in &rep.rows {
        assert!(r.verified, "{r:?}");
        assert!(r.gbps_min > 0.0 && r.gbps_min <= r.gbps_median && r.gbps_median <= r.gbps_max);
        assert!(r.latency_us_p50 > 0.0 && r.latency_us_p50 <= r.latency_us_p99);
    }
    assert_eq!(rep.rows[0].path, "posix-direct");
    assert_eq!(rep.rows[1].path, "read-loop");
    let w = gdpath_bench::storage::StorageBenchConfig {
        op: gdpath::Op::Write,
        compare: false,
        ..cfg.clone()
    };
    let e = gdpath_bench::storage::run(&w, &gdpath_bench::NoProgress).unwrap_err();
    assert!(
        matches!(e, Error::Exists { .. }),
        "existing file needs --overwrite: {e}"
    );
    let w = gdpath_bench::storage::StorageBenchConfig {
        overwrite: true,
        direct: DirectIo::Off,
        ..w
    };
    let rep = gdpath_bench::storage::run(&w, &gdpath_bench::NoProgress).unwrap();
    assert!(rep
        .rows
        .iter()
        .all(|r| r.verified && r.path == "posix-buffered"));
    assert_eq!(rep.findings[0].as_str(), ids::STORAGE_ODIRECT_DISABLED);
}
