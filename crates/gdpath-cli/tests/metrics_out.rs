//! `gdpath bench … --metrics-out FILE` writes the engine's metrics after the run (the bytes the
//! bench moved, by path), writes none with `GDPATH_METRICS=0`, and refuses a target it must not
//! replace; `gdpath serve --metrics` on an address in use fails with a clear error.

use std::process::{Command, Output};

fn gdpath(args: &[&str], metrics_off: bool) -> Output {
    let mut c = Command::new(env!("CARGO_BIN_EXE_gdpath"));
    c.args(args);
    if metrics_off {
        c.env("GDPATH_METRICS", "0");
    } else {
        c.env_remove("GDPATH_METRICS");
    }
    c.output().unwrap()
}

fn kv(out: &std::path::Path, metrics_off: bool) -> Output {
    gdpath(
        &[
            "bench",
            "kv",
            "--src",
            "host",
            "--dst",
            "host",
            "--blocks",
            "100",
            "--block-size",
            "4KiB",
            "--runs",
            "1",
            "--json",
            "--metrics-out",
            out.to_str().unwrap(),
        ],
        metrics_off,
    )
}

#[test]
fn bench_kv_writes_the_bytes_it_moved() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("kv.prom");
    let out = kv(&f, false);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    // Every row's transfers (a warm-up and one timed run each) moved its bytes on host-copy.
    let moved: u64 = doc["rows"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| 2 * r["bytes"].as_u64().unwrap())
        .sum();
    let text = std::fs::read_to_string(&f).unwrap();
    let want = format!(
        "gdpath_bytes_total{{op=\"write\",path=\"host-copy\",peer=\"local\",outcome=\"ok\"}} {moved}\n"
    );
    assert!(text.contains(&want), "{want}\n{text}");
}

#[test]
fn metrics_off_writes_no_series() {
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("off.prom");
    let out = kv(&f, true);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // Written, and empty: the metrics were never made.
    let text = std::fs::read_to_string(&f).unwrap();
    assert!(text.is_empty(), "series with GDPATH_METRICS=0:\n{text}");
}

#[test]
fn a_directory_as_metrics_out_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let out = kv(dir.path(), false);
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("--metrics-out"), "{err}");
    assert!(dir.path().is_dir());
}

#[test]
fn serve_metrics_on_an_address_in_use_fails_clearly() {
    let busy = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = busy.local_addr().unwrap().to_string();
    let out = gdpath(
        &[
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--metrics",
            &addr,
            "--duration",
            "5",
        ],
        false,
    );
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains(&format!("cannot listen for metrics on {addr}")),
        "{err}"
    );
}
