//! `gdpath load --host` on real files (the repository's disk, and tmpfs at /dev/shm): the
//! storage settings the chooser picked appear in the text and the JSON with the reason, flags
//! override them, `--cold` makes the chooser see a cold file, and `--verify` compares the
//! loaded bytes with the file. No GPU needed (host memory destination).

use std::process::Command;

mod common;

fn load_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new(common::bin())
        .arg("load")
        .args(args)
        .args(["--host", "--json"])
        .output()
        .unwrap();
    common::json_ok(&out)
}

#[test]
fn a_hot_disk_file_is_chosen_from_memory_verified_and_flags_override() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = dir.path().join("m.safetensors");
    let (bytes, _) = common::write_checkpoint(&f, &[("a", 3 << 20), ("b", 1000)]);
    let file = f.to_str().unwrap();
    // Read once so that it is in the page cache whatever the sync did.
    std::fs::read(&f).unwrap();

    let v = load_json(&[file, "--verify"]);
    assert_eq!(v["tensor_bytes"], bytes, "{v}");
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["host"], true, "{v}");
    let c = &v["chosen"];
    assert_eq!(c["chunk"], 4 << 20, "{v}");
    assert_eq!(c["direct"], false, "{v}");
    assert_eq!(c["cufile"], false, "{v}");
    assert_eq!(
        c["facts"]["file_bytes"],
        std::fs::metadata(&f).unwrap().len()
    );
    assert!(
        c["reason"].as_str().unwrap().contains("in page cache"),
        "{v}"
    );
    assert!(c["overridden"].as_array().unwrap().is_empty(), "{v}");
    assert!(v["chosen_text"]
        .as_str()
        .unwrap()
        .contains(" threads × 4 MiB, buffered: "));
    // 12 MiB: three 4 MiB chunks, at most one thread each.
    assert!(c["threads"].as_u64().unwrap() <= 4, "{v}");

    // Flags win, and are named.
    let v = load_json(&[
        file,
        "--threads",
        "2",
        "--chunk",
        "1MiB",
        "--direct",
        "--verify",
    ]);
    let c = &v["chosen"];
    assert_eq!(
        (c["threads"].as_u64(), c["chunk"].as_u64()),
        (Some(2), Some(1 << 20))
    );
    assert_eq!(c["direct"], true, "{v}");
    assert_eq!(
        c["overridden"],
        serde_json::json!(["threads", "chunk", "direct"])
    );
    assert_eq!(v["verified"], true, "{v}");
    // O_DIRECT where the file system allows it (overlay may refuse it: then buffered).
    let path = v["path"].as_str().unwrap();
    assert!(["posix-direct", "posix-buffered"].contains(&path), "{v}");

    // The text form: the choice first, the verdict last.
    let (ok, text, err) = common::gdpath(&["load", file, "--host", "--verify"]);
    assert!(ok, "{err}");
    let lines: Vec<&str> = text.lines().collect();
    assert!(lines[0].starts_with("chosen: "), "{text}");
    assert!(lines[0].contains("in page cache"), "{text}");
    assert!(text.contains("onto host memory"), "{text}");
    assert!(
        lines.last().unwrap().starts_with("verified: true ("),
        "{text}"
    );
}

#[test]
fn cold_makes_the_chooser_see_a_cold_file() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let f = dir.path().join("m.safetensors");
    common::write_checkpoint(&f, &[("a", 4 << 20)]);
    let v = load_json(&[f.to_str().unwrap(), "--cold", "--verify"]);
    assert_eq!(v["cold"], true);
    assert_eq!(v["verified"], true, "{v}");
    let c = &v["chosen"];
    let resident = c["facts"]["resident"].as_f64();
    if c["facts"]["fs"] == "tmpfs" {
        eprintln!("skipped: the target dir is on tmpfs here ({v})");
        return;
    }
    if resident.is_some_and(|r| r >= gdpath_checkpoint::chooser::HOT_FRACTION) {
        eprintln!("skipped: the kernel kept the file cached after DONTNEED ({resident:?})");
        return;
    }
    let reason = c["reason"].as_str().unwrap();
    assert!(reason.starts_with("cold files"), "{v}");
    if c["facts"]["fs"] == "network" {
        eprintln!("skipped: a network file system takes its client's readahead ({v})");
        return;
    }
    // Into host memory: 16 MiB requests; O_DIRECT on the kinds that take it when (nearly)
    // nothing is cached or residency is unknown, and the load took it (or said why not).
    assert_eq!(c["chunk"], 16 << 20, "{v}");
    let direct_fs = ["ext4", "xfs", "btrfs"].contains(&c["facts"]["fs"].as_str().unwrap());
    let direct = direct_fs && resident.is_none_or(|r| r < gdpath_checkpoint::chooser::DIRECT_BELOW);
    assert_eq!(c["direct"], direct, "{v}");
    if direct {
        assert!(
            v["path"] == "posix-direct" || v["finding"] == "storage.odirect-unsupported",
            "{v}"
        );
    } else {
        assert_eq!(v["path"], "posix-buffered", "{v}");
    }
}

#[test]
fn a_tmpfs_file_is_memory() {
    let Ok(dir) = tempfile::tempdir_in("/dev/shm") else {
        eprintln!("skipped: /dev/shm is not writable here");
        return;
    };
    let f = dir.path().join("m.safetensors");
    common::write_checkpoint(&f, &[("a", 9 << 20)]);
    let v = load_json(&[f.to_str().unwrap(), "--cold", "--verify"]);
    let c = &v["chosen"];
    assert_eq!(c["facts"]["fs"], "tmpfs", "{v}");
    assert_eq!(c["direct"], false, "{v}");
    assert!(c["reason"].as_str().unwrap().contains("tmpfs"), "{v}");
    assert_eq!(v["verified"], true, "{v}");
    assert_eq!(v["path"], "posix-buffered", "{v}");
}

/// A sharded checkpoint loads as one, named by its files or by its index, verified against
/// every shard; `resave` of an index says it takes one file. The new-user trial found `load`
/// reading the index as a safetensors header ("header length 7017841271895827067 bytes") and
/// refusing a second file.
#[test]
fn a_sharded_checkpoint_loads_by_its_files_or_its_index() {
    let dir = tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap();
    let a = dir.path().join("model-00001-of-00002.safetensors");
    let b = dir.path().join("model-00002-of-00002.safetensors");
    let (ab, _) = common::write_checkpoint(&a, &[("x.0", 1 << 18), ("x.1", 77)]);
    let (bb, _) = common::write_checkpoint(&b, &[("y.0", 5000)]);
    let index = dir.path().join("model.safetensors.index.json");
    std::fs::write(
        &index,
        serde_json::json!({
            "metadata": {"total_size": ab + bb},
            "weight_map": {
                "x.0": "model-00001-of-00002.safetensors",
                "x.1": "model-00001-of-00002.safetensors",
                "y.0": "model-00002-of-00002.safetensors",
            }
        })
        .to_string(),
    )
    .unwrap();
    let s = |p: &std::path::Path| p.to_str().unwrap().to_owned();
    for args in [vec![s(&a), s(&b)], vec![s(&index)]] {
        let mut with: Vec<&str> = args.iter().map(String::as_str).collect();
        with.push("--verify");
        let v = load_json(&with);
        assert_eq!(v["tensor_bytes"], ab + bb, "{args:?}: {v}");
        assert_eq!(v["tensors"].as_array().unwrap().len(), 3, "{v}");
        assert_eq!(v["verified"], true, "{v}");
        assert_eq!(v["files"].as_array().unwrap().len(), 2, "{v}");
    }
    let out = Command::new(common::bin())
        .args([
            "resave",
            &s(&index),
            &s(&dir.path().join("out.safetensors")),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("resave takes one .safetensors file"), "{err}");
}

/// `--slabs` outside 0 or 2..=16 is a usage error naming the flag and the range (exit 2), before
/// any file is read; with `--host` or `--direct` it is refused too, since only buffered reads
/// into a GPU take slabs.
#[test]
fn slabs_out_of_range_or_where_they_do_not_apply_are_usage_errors() {
    for (args, want) in [
        (
            &["--gpu", "0", "--slabs", "1"][..],
            "0 (a buffer pair per thread) or 2..=16",
        ),
        (
            &["--gpu", "0", "--slabs", "17"][..],
            "0 (a buffer pair per thread) or 2..=16",
        ),
        (&["--host", "--slabs", "3"][..], "--host"),
        (&["--gpu", "0", "--direct", "--slabs", "3"][..], "--direct"),
    ] {
        let out = Command::new(common::bin())
            .args(["load", "/nonexistent/x.safetensors"])
            .args(args)
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(2), "{args:?}: {err}");
        assert!(
            err.contains("--slabs") && err.contains(want),
            "{args:?}: {err}"
        );
    }
}
