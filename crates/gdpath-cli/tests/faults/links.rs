//! Issue 37 items 1 and 7, as a user meets them: a symbolic link `nobody` planted in a sticky
//! world-writable directory is never followed by a command that writes (the kernel's
//! `protected_symlinks` rule, applied whatever the sysctl says), a link the rule allows is
//! followed and named, and a replaced file keeps its owner, group and mode. As root only (CI
//! runs as root): planting as another user needs it; each test says so when it skips.

use super::*;
use gdpath_testkit::{as_nobody, is_root, planted_link, PlantedLink, NOBODY};
use std::os::unix::fs::MetadataExt;

/// A checkpoint with no tensors (a header of `{}`): enough for `resave` to write a file.
fn empty_checkpoint(dir: &Path) -> PathBuf {
    let ck = dir.join("ck.safetensors");
    std::fs::write(&ck, b"\x08\0\0\0\0\0\0\0{}      ").unwrap();
    ck
}

/// Every command that writes a file, aimed at `t` (each replaces an existing file).
fn writers<'a>(t: &'a str, src: &'a str, ck: &'a str) -> Vec<Vec<&'a str>> {
    let snap = h200_snapshot();
    let bench = |extra: &[&'a str]| {
        let mut v = vec![
            "bench",
            "storage",
            "--file",
            t,
            "--size",
            "1MiB",
            "--overwrite",
        ];
        v.extend_from_slice(extra);
        v
    };
    vec![
        vec!["copy", src, t, "--overwrite"],
        vec!["copy", "gpu:0", t, "--size", "1MiB", "--overwrite"],
        vec!["resave", ck, t, "--host", "--overwrite"],
        vec!["report", "-o", t, "--snapshot", snap, "--overwrite"],
        vec!["topo", "--snapshot", snap, "--svg", t, "--overwrite"],
        vec!["topo", "capture", "-o", t, "--overwrite"],
        // The test file is shorter than --size: replaced with the pattern.
        bench(&[]),
        bench(&["--gpu", "0"]),
        // An existing file is written in place.
        bench(&["--runs", "1", "--write"]),
    ]
}

fn scene(test: &str) -> Option<(PlantedLink, tempfile::TempDir, PathBuf, PathBuf)> {
    let p = planted_link(test)?;
    let dir = disk_dir();
    let src = dir.path().join("src");
    std::fs::write(&src, data(64 << 10, 5)).unwrap();
    let ck = empty_checkpoint(dir.path());
    Some((p, dir, src, ck))
}

/// Item 1: root writing to `S/model.safetensors`, a link `nobody` planted in the sticky
/// directory `S` to root's 0600 file, is refused by every command that writes: status 1, a
/// message naming the link, its owner and the rule, kind `symlink_refused` in `--json`, the
/// victim untouched byte for byte and no temporary left. On main `copy --overwrite`, `report
/// -o --overwrite` and the others replaced the victim ("wrote S/report.html").
#[test]
fn every_writing_command_refuses_a_link_another_user_planted() {
    let Some((p, _dir, src, ck)) =
        scene("every_writing_command_refuses_a_link_another_user_planted")
    else {
        return;
    };
    for args in writers(s(&p.link), s(&src), s(&ck)) {
        let line = args.join(" ");
        let (st, err) = run(&args);
        assert_eq!(st.code(), Some(1), "{line}: {err}");
        for part in [
            s(&p.link),
            "a symbolic link owned by uid 65534 in the sticky world-writable directory",
            "protected_symlinks",
        ] {
            assert!(err.contains(part), "{line}: {err}");
        }
        assert!(p.victim_untouched(), "{line}: the victim changed");
        assert!(p.temporaries().is_empty(), "{line}: {:?}", p.temporaries());
    }
    let out = gdpath()
        .args(["copy", s(&src), s(&p.link), "--overwrite", "--json"])
        .output()
        .unwrap();
    assert_eq!(common::error_doc(&out)["kind"], "symlink_refused");
    assert!(p.victim_untouched());
}

/// What the rule allows is followed, as `open(2)` follows it, and the message names the file
/// written: root's own link in the same sticky directory (`copy`, `resave`, `report`, `topo
/// capture`, `topo --svg`), and `copy --json` gives it as `dst_file`. On main the messages
/// named only the link.
#[test]
fn a_link_the_rule_allows_is_followed_and_the_message_names_the_real_file() {
    let Some((p, _dir, src, ck)) =
        scene("a_link_the_rule_allows_is_followed_and_the_message_names_the_real_file")
    else {
        return;
    };
    let real = p.victim.canonicalize().unwrap();
    let named = format!(
        "{} (the file {} it links to)",
        p.own_link.display(),
        real.display()
    );
    for args in writers(s(&p.own_link), s(&src), s(&ck)) {
        let line = args.join(" ");
        if line.contains("gpu") || line.contains("bench") {
            continue; // no GPU here; the benches name no file
        }
        std::fs::write(&p.victim, b"before").unwrap();
        let (st, out, err) = run_output(&args, Stdio::piped());
        assert!(st.success(), "{line}: {err}");
        assert!(out.contains(&named), "{line}: {out}");
        assert_ne!(std::fs::read(&p.victim).unwrap(), b"before", "{line}");
        assert!(std::fs::symlink_metadata(&p.own_link)
            .unwrap()
            .file_type()
            .is_symlink());
    }
    let out = gdpath()
        .args(["copy", s(&src), s(&p.own_link), "--overwrite", "--json"])
        .output()
        .unwrap();
    let v = common::json_ok(&out);
    assert_eq!(v["report"]["dst_file"], s(&real), "{v}");
    assert_eq!(std::fs::read(&p.victim).unwrap(), data(64 << 10, 5));
    // No link, no dst_file: the JSON is as it was.
    let plain = p.victim.parent().unwrap().join("plain");
    let out = gdpath()
        .args(["copy", s(&src), s(&plain), "--json"])
        .output()
        .unwrap();
    let v = common::json_ok(&out);
    assert!(v["report"].get("dst_file").is_none(), "{v}");
}

/// Item 7: `copy --overwrite` as root onto `nobody:nogroup` files keeps their owner, group and
/// permission bits, so `nobody` can still read them; a set-user-ID bit is dropped (docs/engine.md,
/// "Writing files whole"). On main the file became `root:root` and unreadable to `nobody`.
#[test]
fn copy_overwrite_keeps_the_owner_group_and_mode_of_the_replaced_file() {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        eprintln!(
            "skipped copy_overwrite_keeps_the_owner_group_and_mode_of_the_replaced_file: \
             needs root (to own a file as another user)"
        );
        return;
    }
    let dir = disk_dir();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let src = dir.path().join("src");
    std::fs::write(&src, data(1 << 20, 9)).unwrap();
    for (before, after) in [(0o640, 0o640), (0o4750, 0o750), (0o2640, 0o640)] {
        let dst = dir.path().join(format!("theirs-{before:o}"));
        std::fs::write(&dst, b"old").unwrap();
        std::os::unix::fs::chown(&dst, Some(NOBODY), Some(NOBODY)).unwrap();
        std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(before)).unwrap();
        let (st, err) = run(&["copy", s(&src), s(&dst), "--overwrite"]);
        assert!(st.success(), "{err}");
        let md = std::fs::metadata(&dst).unwrap();
        assert_eq!(std::fs::read(&dst).unwrap(), data(1 << 20, 9));
        assert_eq!(
            (md.uid(), md.gid()),
            (NOBODY, NOBODY),
            "{before:o}: owner kept"
        );
        assert_eq!(md.mode() & 0o7777, after, "{before:o}: mode");
        let input = format!("if={}", dst.display());
        as_nobody(&["dd", &input, "of=/dev/null", "status=none"]);
    }
    assert!(temporaries(dir.path()).is_empty());
}
