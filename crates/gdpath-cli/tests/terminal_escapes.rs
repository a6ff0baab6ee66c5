//! Untrusted strings reach the terminal escaped (`gdpath_topo::text::escape`): hostile tensor
//! names through `load --tensors`, a snapshot's `osrelease` through `doctor --verbose`, a NUL in
//! a checkpoint index's `weight_map` through the error. The JSON documents keep the strings as
//! they are (JSON's own escaping covers them). Each input is built here.

use std::path::Path;
use std::process::{Command, Output};

mod common;

/// ESC starting "clear the screen" and "red", a NUL, and a newline that forges a line.
const HOSTILE: [&str; 3] = [
    "evil\u{1b}[2J\u{1b}[31mred",
    "nul\u{0}name",
    "line\nforged: 0 tensors",
];

/// The same names as [`HOSTILE`], escaped.
const ESCAPED: [&str; 3] = [
    r"evil\u{1b}[2J\u{1b}[31mred",
    r"nul\0name",
    r"line\nforged: 0 tensors",
];

/// Fails naming the first byte a terminal would act on (any control but the line ends the
/// output itself writes).
fn assert_no_controls(what: &str, text: &[u8]) {
    let text = String::from_utf8_lossy(text);
    if let Some(c) = text.chars().find(|&c| c.is_control() && c != '\n') {
        panic!("{what} holds {c:?} raw: {text:?}");
    }
}

/// A one-file checkpoint whose tensors are named [`HOSTILE`] (4 bytes of U8 each).
fn hostile_checkpoint(path: &Path) {
    let mut header = serde_json::Map::new();
    for (i, name) in HOSTILE.iter().enumerate() {
        header.insert(
            (*name).to_owned(),
            serde_json::json!({"dtype": "U8", "shape": [4], "data_offsets": [4 * i, 4 * i + 4]}),
        );
    }
    let h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend([0u8; 12]);
    std::fs::write(path, bytes).unwrap();
}

fn run(args: &[&str]) -> Output {
    Command::new(common::bin()).args(args).output().unwrap()
}

#[test]
fn hostile_tensor_names_are_escaped_in_the_table_and_kept_in_json() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = dir.path().join("hostile.safetensors");
    hostile_checkpoint(&f);
    let file = f.to_str().unwrap();

    let out = run(&["load", file, "--host", "--tensors"]);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_no_controls("load --tensors", &out.stdout);
    let text = String::from_utf8_lossy(&out.stdout);
    for name in ESCAPED {
        assert!(
            text.lines().any(|l| l.starts_with(name)),
            "no row for {name}: {text}"
        );
    }
    // The forged line is part of its row, not a line of its own.
    assert!(!text.lines().any(|l| l.starts_with("forged")), "{text}");

    let v = common::json_ok(&run(&["load", file, "--host", "--json"]));
    let mut names: Vec<&str> = v["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .map(|t| t["name"].as_str().unwrap())
        .collect();
    names.sort();
    let mut want = HOSTILE.to_vec();
    want.sort();
    assert_eq!(names, want, "JSON carries the names as they are");
}

#[test]
fn a_snapshots_osrelease_is_escaped_in_the_doctors_text_and_kept_in_json() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let tree = dir.path().join("tree");
    std::fs::create_dir(&tree).unwrap();
    let untar = Command::new("tar")
        .arg("xzf")
        .arg(gdpath_testkit::h200x2_snapshot())
        .arg("-C")
        .arg(&tree)
        .status()
        .unwrap();
    assert!(untar.success());
    gdpath_testkit::write(
        &tree,
        "fs/proc/sys/kernel/osrelease",
        "6.8.0\u{1b}[2J\u{1b}[31mFORGED\u{0}\rx\n",
    );
    let snap = dir.path().join("hostile.tar.gz");
    let tar = Command::new("tar")
        .arg("czf")
        .arg(&snap)
        .arg("-C")
        .arg(&tree)
        .args(["manifest.json", "driver.json", "fs"])
        .status()
        .unwrap();
    assert!(tar.success());
    let snap = snap.to_str().unwrap();

    let out = run(&["doctor", "--verbose", "--all", "--snapshot", snap]);
    assert_no_controls("doctor --verbose", &out.stdout);
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        text.contains(r"Linux 6.8.0\u{1b}[2J\u{1b}[31mFORGED\0\rx"),
        "the kernel release is not shown escaped: {text}"
    );
    // The default one-line-per-finding text too.
    let out = run(&["doctor", "--all", "--snapshot", snap]);
    assert_no_controls("doctor", &out.stdout);

    // The H200 machine's verdict is "unavailable" (exit status 2): the document is on stdout.
    let out = run(&["doctor", "--json", "--snapshot", snap]);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let kernel = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "system.kernel")
        .expect("a system.kernel finding");
    assert_eq!(
        kernel["evidence"].as_str().unwrap(),
        "Linux 6.8.0\u{1b}[2J\u{1b}[31mFORGED\u{0}\rx (/proc/sys/kernel/osrelease)",
        "JSON carries the text as it is"
    );
}

#[test]
fn a_nul_in_an_index_weight_map_is_escaped_in_the_error() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let index = dir.path().join("model.safetensors.index.json");
    // In the shard's file name, and in a tensor name of a map whose shard holds other names.
    std::fs::write(
        &index,
        r#"{"weight_map": {"w": "a\u0000.safetensors\u001b[2J"}}"#,
    )
    .unwrap();
    let out = run(&["load", index.to_str().unwrap(), "--host"]);
    assert!(!out.status.success());
    assert_no_controls("the error", &out.stderr);
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains(r"a\0.safetensors\u{1b}[2J"), "{err}");

    hostile_checkpoint(&dir.path().join("m.safetensors"));
    std::fs::write(
        &index,
        r#"{"weight_map": {"w\u0000\u001b[2J": "m.safetensors"}}"#,
    )
    .unwrap();
    let out = run(&["load", index.to_str().unwrap(), "--host"]);
    assert!(!out.status.success());
    assert_no_controls("the error", &out.stderr);
}
