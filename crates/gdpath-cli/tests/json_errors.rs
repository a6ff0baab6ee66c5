//! A failing `--json` run still gives a script a JSON document on stdout (schema
//! `gdpath.error/1`: the message of stderr and a machine-readable kind) and a non-zero exit.

use std::process::{Command, Output};

mod common;

use common::error_doc;

fn run(args: &[&str]) -> Output {
    Command::new(common::bin()).args(args).output().unwrap()
}

#[test]
fn copy_of_a_missing_file_is_a_json_error() {
    let out = run(&["copy", "/nonexistent/gdpath-json-error", "x", "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v = error_doc(&out);
    assert_eq!(v["kind"], "open", "{v}");
    assert!(v["error"]
        .as_str()
        .unwrap()
        .contains("/nonexistent/gdpath-json-error"));
}

#[test]
fn without_json_stdout_stays_empty() {
    let out = run(&["copy", "/nonexistent/gdpath-json-error", "x"]);
    assert_eq!(out.status.code(), Some(1));
    assert!(
        out.stdout.is_empty(),
        "{}",
        String::from_utf8_lossy(&out.stdout)
    );
    assert!(String::from_utf8_lossy(&out.stderr).contains("gdpath: error: "));
}

#[test]
fn a_bad_argument_value_is_a_json_usage_error_with_clap_s_status() {
    let out = run(&[
        "bench", "storage", "--file", "x", "--size", "lots", "--json",
    ]);
    assert_eq!(out.status.code(), Some(2));
    let v = error_doc(&out);
    assert_eq!(v["kind"], "usage", "{v}");
    assert!(v["error"].as_str().unwrap().contains("lots"), "{v}");
}

#[test]
fn a_failing_doctor_keeps_its_exit_status_and_gives_json() {
    let out = run(&[
        "doctor",
        "--path",
        "/nonexistent/gdpath-doctor-test",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(3));
    let v = error_doc(&out);
    assert_eq!(v["kind"], "usage", "{v}");
    assert!(
        v["error"].as_str().unwrap().contains("not a directory"),
        "{v}"
    );
}

#[test]
fn help_is_not_an_error() {
    let out = run(&["bench", "storage", "--help", "--json"]);
    assert!(out.status.success());
    assert!(String::from_utf8_lossy(&out.stdout).contains("Usage:"));
}

/// The doctor's exit statuses 1 and 2 are verdicts (degraded, unavailable): a command line it
/// cannot parse is 3 ("the doctor failed"), never clap's 2; other commands keep 2.
#[test]
fn a_bad_doctor_command_line_is_3_not_unavailable() {
    let out = run(&["doctor", "--no-such-option"]);
    assert_eq!(out.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&out.stderr).contains("--no-such-option"));
    let out = run(&["doctor", "--no-such-option", "--json"]);
    assert_eq!(out.status.code(), Some(3));
    assert_eq!(error_doc(&out)["kind"], "usage");
    let out = run(&["topo", "--no-such-option"]);
    assert_eq!(out.status.code(), Some(2));
}

/// A malformed checkpoint is kind `checkpoint`, whatever the machine (the header is read before
/// anything touches a GPU's memory for the load).
#[test]
fn a_malformed_checkpoint_is_kind_checkpoint() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = dir.path().join("bad.safetensors");
    std::fs::write(&f, b"xx").unwrap();
    let out = run(&["load", f.to_str().unwrap(), "--json"]);
    assert_eq!(out.status.code(), Some(1));
    let v = error_doc(&out);
    assert_eq!(v["kind"], "checkpoint", "{v}");
    assert!(v["error"].as_str().unwrap().contains("too short"), "{v}");
}

/// Command-line mistakes the CLI finds itself (not clap) are usage errors too: status 2, kind
/// `usage` (with --json), naming the value.
#[test]
fn the_cli_s_own_argument_checks_are_usage_errors() {
    // `serve` has no --json: the status and the message.
    for (spec, says) in [
        ("host:0", "size must be > 0"),
        ("disk:1MiB", "unknown memory kind"),
    ] {
        let out = run(&["serve", "--export", spec]);
        assert_eq!(out.status.code(), Some(2), "{spec}");
        let err = String::from_utf8_lossy(&out.stderr);
        assert!(err.contains(spec) && err.contains(says), "{err}");
    }
    let out = Command::new(common::bin())
        .args(["bench", "net", "--peer", "127.0.0.1:9", "--json"])
        .args(["--token", "one shared secret of some length"])
        .env("GDPATH_TOKEN", "another shared secret of some length")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(2));
    let v = error_doc(&out);
    assert_eq!(v["kind"], "usage", "{v}");
    assert!(v["error"].as_str().unwrap().contains("differ"), "{v}");
}

/// A token shorter than 16 bytes is kind `config`, as the engine calls it, although the
/// protocol crate (`gdpath-wire`) makes the refusal: the CLI converts it to the engine's error.
#[test]
fn a_short_token_is_kind_config() {
    let out = run(&[
        "bench",
        "net",
        "--peer",
        "127.0.0.1:1",
        "--token",
        "short",
        "--json",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let v = error_doc(&out);
    assert_eq!(v["kind"], "config", "{v}");
    assert!(v["error"].as_str().unwrap().contains("too short"), "{v}");
}
