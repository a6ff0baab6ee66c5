//! A write must not be redirected by another user's link nor take a file from its owner, as a
//! user meets it: a symbolic link `nobody` planted in a sticky
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

/// The `kind` of the `gdpath.error/1` document `gdpath copy src dst --overwrite --json`
/// prints.
fn copy_error_kind(src: &str, dst: &str) -> String {
    let out = gdpath()
        .args(["copy", src, dst, "--overwrite", "--json"])
        .output()
        .unwrap();
    let kind = &common::error_doc(&out)["kind"];
    kind.as_str().unwrap_or_default().to_owned()
}

fn scene(test: &str) -> Option<(PlantedLink, tempfile::TempDir, PathBuf, PathBuf)> {
    let p = planted_link(test)?;
    let dir = disk_dir();
    let src = dir.path().join("src");
    std::fs::write(&src, data(64 << 10, 5)).unwrap();
    let ck = empty_checkpoint(dir.path());
    Some((p, dir, src, ck))
}

/// Root writing to `S/model.safetensors`, a link `nobody` planted in the sticky
/// directory `S` to root's 0600 file, is refused by every command that writes: status 1, a
/// message naming the link, its owner and the rule, kind `symlink_refused` in `--json`, the
/// victim untouched byte for byte and no temporary left, so
/// that another user cannot make root overwrite a file it chooses.
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
    assert_eq!(copy_error_kind(s(&src), s(&p.link)), "symlink_refused");
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

/// `copy --overwrite` as root onto `nobody:nogroup` files keeps their owner, group and
/// permission bits, so `nobody` can still read them; a set-user-ID bit is dropped (docs/engine.md,
/// "Writing files whole"), rather than the file becoming `root:root` and unreadable to `nobody`.
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

// The second round (the hostile tester's report on the symlink-safe writer): each test is one
// of its reproductions, made deterministic where it was a race by the debug build's pause point
// (`GDPATH_TEST_HOOK`, gdpath::file::test_hook), which runs the other user's move at the one
// moment a path-based open would have been redirected.

/// `setpriv` as `nobody`, for a shell line of a hook.
const AS_NOBODY: &str = "setpriv --reuid=65534 --regid=65534 --clear-groups";

/// `gdpath args` with `GDPATH_TEST_HOOK=hook` (its `$1` names the pause point), stdout piped:
/// (status, stdout, stderr).
fn run_hooked(args: &[&str], hook: &str) -> (ExitStatus, String, String) {
    let child = gdpath()
        .env("GDPATH_TEST_HOOK", hook)
        .args(args)
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_output(child, &args.join(" "))
}

/// A directory of `nobody`'s (mode 0755, not sticky) beside the scene's victim: its owner may
/// rename and replace any name in it, as a user may in their own directory.
fn nobodys_dir(p: &PlantedLink, name: &str) -> PathBuf {
    let d = p.victim.parent().unwrap().join(name);
    std::fs::create_dir(&d).unwrap();
    std::os::unix::fs::chown(&d, Some(NOBODY), Some(NOBODY)).unwrap();
    d
}

fn is_link(p: &Path) -> bool {
    std::fs::symlink_metadata(p).is_ok_and(|m| m.file_type().is_symlink())
}

/// Reproduction 1: `bench storage --write --overwrite` on a file in another user's directory
/// opens it once, through the directory handle, and writes every block of every block size and
/// run through that descriptor. The owner swaps the name for a link to root's file once the
/// bench has its file (the pause point `in-place`); main re-opened the path for every block
/// size and wrote root's file.
#[test]
fn bench_storage_write_in_place_writes_the_file_it_opened_whatever_the_name_becomes() {
    let Some(p) = planted_link(
        "bench_storage_write_in_place_writes_the_file_it_opened_whatever_the_name_becomes",
    ) else {
        return;
    };
    for (i, buffered) in [true, false].into_iter().enumerate() {
        let d = nobodys_dir(&p, &format!("theirs{i}"));
        let f = d.join("bench.dat");
        let line = format!("head -c 1048576 /dev/urandom > {}", s(&f));
        as_nobody(&["sh", "-c", &line]);
        let hook = format!(
            "[ \"$1\" = in-place ] || exit 0; {AS_NOBODY} sh -c 'ln -s {v} {d}/evil && mv -T {d}/evil {f}'",
            v = s(&p.victim),
            d = s(&d),
            f = s(&f)
        );
        let mut args = vec![
            "bench",
            "storage",
            "--file",
            s(&f),
            "--write",
            "--overwrite",
            "--size",
            "1MiB",
            "--block",
            "256KiB,512KiB",
            "--runs",
            "2",
        ];
        if buffered {
            args.push("--buffered");
        }
        let (st, _, err) = run_hooked(&args, &hook);
        assert!(is_link(&f), "the hook did not run: {err}");
        assert!(
            p.victim_untouched(),
            "buffered {buffered}: root's file was written: {err}"
        );
        assert_eq!(st.code(), Some(0), "buffered {buffered}: {err}");
    }
}

/// Reproduction 2: where temporaries are named (here: `/proc` unmounted, as on a system
/// without it; NFS and some FUSE file systems refuse `O_TMPFILE` too), the data goes into the
/// temporary through its descriptor, never by its path. The owner of the parent directory
/// swaps the target's directory for one holding a link, named as the temporary, to root's
/// file, once the temporary exists (pause point `created`); main opened the temporary's path
/// and wrote root's file. The write completes in the directory it was checked in (renamed
/// `e.old` meanwhile).
#[test]
fn a_named_temporary_is_written_through_its_descriptor_when_its_directory_is_swapped() {
    let Some(p) = planted_link(
        "a_named_temporary_is_written_through_its_descriptor_when_its_directory_is_swapped",
    ) else {
        return;
    };
    let probe = Command::new("unshare")
        .args(["-m", "sh", "-c", "umount -l /proc"])
        .status();
    if !probe.is_ok_and(|s| s.success()) {
        eprintln!(
            "skipped a_named_temporary_is_written_through_its_descriptor_when_its_directory_is_swapped: \
             cannot unmount /proc in a mount namespace here (needs root and unshare)"
        );
        return;
    }
    let src = p.victim.parent().unwrap().join("src");
    std::fs::write(&src, data(1 << 20, 3)).unwrap();
    let bin = common::bin();
    let cases: [&[&str]; 3] = [
        &["copy", s(&src), "OUT"],
        &[
            "bench",
            "storage",
            "--file",
            "OUT",
            "--write",
            "--size",
            "1MiB",
            "--block",
            "256KiB,512KiB",
            "--runs",
            "1",
            "--buffered",
        ],
        &[
            "bench", "storage", "--file", "OUT", "--write", "--size", "1MiB", "--block", "256KiB",
            "--runs", "1",
        ],
    ];
    for (i, case) in cases.iter().enumerate() {
        let d2 = nobodys_dir(&p, &format!("d2-{i}"));
        let e = d2.join("e");
        std::fs::create_dir(&e).unwrap();
        let out = e.join("out.bin");
        let hook = format!(
            "[ \"$1\" = created ] || exit 0; n=$(ls -A {e} | grep gdpath-tmp) || exit 0; \
             {AS_NOBODY} sh -c \"mv {e} {e}.old && mkdir {e} && ln -s {v} {e}/$n\"",
            e = s(&e),
            v = s(&p.victim)
        );
        let args: Vec<&str> = case
            .iter()
            .map(|a| if *a == "OUT" { s(&out) } else { a })
            .collect();
        let child = Command::new("unshare")
            .args(["-m", "sh", "-c", "umount -l /proc && exec \"$0\" \"$@\""])
            .arg(&bin)
            .args(&args)
            .env("GDPATH_TEST_HOOK", &hook)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let line = args.join(" ");
        let (st, _, err) = wait_output(child, &line);
        assert!(
            std::fs::read_dir(&e)
                .unwrap()
                .flatten()
                .any(|x| is_link(&x.path())),
            "{line}: the hook did not run: {err}"
        );
        assert!(
            p.victim_untouched(),
            "{line}: root's file was written: {err}"
        );
        assert_eq!(st.code(), Some(0), "{line}: {err}");
        let written = std::fs::read(d2.join("e.old/out.bin")).unwrap();
        assert_eq!(written.len(), 1 << 20, "{line}");
        assert!(temporaries(&d2.join("e.old")).is_empty(), "{line}");
    }
}

/// Reproduction 3: a link `nobody` planted in the sticky directory is refused as a directory
/// of the path too (`S/sub/P`, `sub` pointing at root's directory), and inside the text of
/// root's own link (`S/rl2` → `sub/P`). Main left directories to the kernel, which with
/// `fs.protected_symlinks=0` followed them, and replaced root's file.
#[test]
fn a_link_another_user_planted_is_refused_as_a_directory_of_the_path() {
    let Some((p, _dir, src, ck)) =
        scene("a_link_another_user_planted_is_refused_as_a_directory_of_the_path")
    else {
        return;
    };
    let sub = p.sticky.join("sub");
    as_nobody(&["ln", "-s", s(p.victim.parent().unwrap()), s(&sub)]);
    let rl2 = p.sticky.join("rl2");
    std::os::unix::fs::symlink("sub/P", &rl2).unwrap();
    let through_sub = sub.join("P");
    for t in [&through_sub, &rl2] {
        for args in [
            vec!["copy", s(&src), s(t), "--overwrite"],
            vec!["resave", s(&ck), s(t), "--host", "--overwrite"],
            vec![
                "report",
                "-o",
                s(t),
                "--snapshot",
                h200_snapshot(),
                "--overwrite",
            ],
        ] {
            let line = args.join(" ");
            let (st, err) = run(&args);
            assert_eq!(st.code(), Some(1), "{line}: {err}");
            for part in [
                s(&sub),
                "a symbolic link owned by uid 65534 in the sticky world-writable directory",
            ] {
                assert!(err.contains(part), "{line}: {err}");
            }
            assert!(p.victim_untouched(), "{line}: the victim changed");
        }
    }
    assert_eq!(copy_error_kind(s(&src), s(&through_sub)), "symlink_refused");
    assert!(p.temporaries().is_empty(), "{:?}", p.temporaries());
}

/// Reproduction 4: a file `nobody` owns in the sticky directory is not replaced by root with
/// `--overwrite` (the kernel's `fs.protected_regular=2` rule for `O_CREAT` opens, applied
/// whatever the sysctl says), so keeping the replaced file's owner never hands root's content
/// to the user who planted the file; main replaced it and kept it `nobody`'s, mode 0666. The
/// directory owner's file and root's own are replaced as before.
#[test]
fn overwrite_refuses_another_users_file_in_a_sticky_directory() {
    let Some((p, _dir, src, _ck)) =
        scene("overwrite_refuses_another_users_file_in_a_sticky_directory")
    else {
        return;
    };
    let rep = p.sticky.join("rep.html");
    let line = format!("echo x > {r}; chmod 666 {r}", r = s(&rep));
    as_nobody(&["sh", "-c", &line]);
    let (st, err) = run(&["copy", s(&src), s(&rep), "--overwrite"]);
    assert_eq!(st.code(), Some(1), "{err}");
    for part in [s(&rep), "owned by uid 65534", "protected_regular"] {
        assert!(err.contains(part), "{err}");
    }
    assert_eq!(std::fs::read(&rep).unwrap(), b"x\n");
    assert_eq!(copy_error_kind(s(&src), s(&rep)), "foreign_file_refused");
    let mine = p.sticky.join("mine.html");
    std::fs::write(&mine, b"root's").unwrap();
    let (st, err) = run(&["copy", s(&src), s(&mine), "--overwrite"]);
    assert!(st.success(), "{err}");
    assert!(p.temporaries().is_empty(), "{:?}", p.temporaries());
}

/// Reproduction 4's other half: `bench storage --write` replaces an existing file, an empty one
/// too, only with `--overwrite`, as its help says; main replaced an empty file without it.
#[test]
fn bench_storage_write_needs_overwrite_for_an_existing_empty_file() {
    let dir = disk_dir();
    let f = dir.path().join("empty");
    std::fs::write(&f, b"").unwrap();
    let ino = std::fs::metadata(&f).unwrap().ino();
    let (st, err) = run(&[
        "bench",
        "storage",
        "--file",
        s(&f),
        "--write",
        "--size",
        "1MiB",
    ]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("--overwrite"), "{err}");
    let md = std::fs::metadata(&f).unwrap();
    assert_eq!(
        (md.ino(), md.len()),
        (ino, 0),
        "the empty file was replaced"
    );
    let (st, err) = run(&[
        "bench",
        "storage",
        "--file",
        s(&f),
        "--write",
        "--size",
        "1MiB",
        "--overwrite",
    ]);
    assert!(st.success(), "{err}");
    assert_eq!(std::fs::metadata(&f).unwrap().len(), 1 << 20);
}

/// Reproduction 5: a magic link of `/proc` (`/dev/stdout` → `/proc/self/fd/1`, a link whose
/// text goes through `/proc/self/cwd`) is refused with its reason, not followed through
/// `readlink`'s text (main renamed a new file over the file stdout was redirected to) nor
/// refused with `ELOOP`'s "Too many levels of symbolic links".
#[test]
fn a_magic_link_of_proc_is_refused_with_its_reason() {
    let dir = disk_dir();
    let src = dir.path().join("src");
    std::fs::write(&src, data(4096, 1)).unwrap();
    let k2 = dir.path().join("k2");
    std::fs::write(&k2, b"KEEP\n").unwrap();
    let child = gdpath()
        .args(["copy", s(&src), "/dev/stdout", "--overwrite"])
        .stdout(std::fs::OpenOptions::new().append(true).open(&k2).unwrap())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let (st, err) = wait(child, "copy src /dev/stdout --overwrite > k2");
    assert_eq!(st.code(), Some(1), "{err}");
    for part in ["/dev/stdout", "magic link of /proc", "write to a file"] {
        assert!(err.contains(part), "{err}");
    }
    assert_eq!(std::fs::read(&k2).unwrap(), b"KEEP\n", "k2 was replaced");
    let l = dir.path().join("through-cwd");
    std::os::unix::fs::symlink("/proc/self/cwd/t2", &l).unwrap();
    let (st, err) = run(&["copy", s(&src), s(&l), "--overwrite"]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("magic link of /proc"), "{err}");
    assert!(!err.contains("Too many levels"), "{err}");
    assert_eq!(copy_error_kind(s(&src), s(&l)), "magic_link_refused");
}

/// Reproduction 6: a hostile link name (ESC, newline, CR) reaches the terminal escaped in the
/// refusal, as every other file name does; main printed it raw.
#[test]
fn a_hostile_link_name_is_escaped_in_the_refusal() {
    let Some((p, _dir, src, _ck)) = scene("a_hostile_link_name_is_escaped_in_the_refusal") else {
        return;
    };
    let name = p.sticky.join("ev\x1b[31mRED\nfake: ok\r");
    as_nobody(&["ln", "-s", s(&p.victim), s(&name)]);
    let (st, err) = run(&["copy", s(&src), s(&name), "--overwrite"]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("ev\\u{1b}[31mRED\\nfake: ok\\r"), "{err}");
    assert!(!err.contains('\x1b') && !err.contains('\r'), "{err:?}");
    assert!(p.victim_untouched());
}

/// Reproduction 7: a writer that is not root replacing root's 0664 file in its own directory
/// cannot keep the owner or the group, so the group bits are not kept either: they would now
/// grant the writer's own group what root's group had. Main kept them (0664, group nogroup).
#[test]
fn a_writer_that_cannot_keep_the_group_does_not_keep_the_group_bits() {
    let Some(p) = planted_link("a_writer_that_cannot_keep_the_group_does_not_keep_the_group_bits")
    else {
        return;
    };
    let d = nobodys_dir(&p, "nobodys");
    let src = d.join("src");
    std::fs::write(&src, data(64 << 10, 2)).unwrap();
    let f = d.join("roots");
    std::fs::write(&f, b"old").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o664)).unwrap();
    let bin = common::bin();
    let st = Command::new("setpriv")
        .args(["--reuid=65534", "--regid=65534", "--clear-groups", "--"])
        .arg(&bin)
        .args(["copy", s(&src), s(&f), "--overwrite"])
        .stdout(Stdio::null())
        .status()
        .unwrap();
    assert!(st.success());
    let md = std::fs::metadata(&f).unwrap();
    assert_eq!((md.uid(), md.gid()), (NOBODY, NOBODY), "the writer's own");
    assert_eq!(
        md.mode() & 0o7777,
        0o604,
        "group bits masked, the others kept"
    );
}

/// Reproduction 7: the attributes kept are those of the file the commit replaces, read then,
/// not when the write began: a `chmod 600` meanwhile (at the pause point `created`) holds.
/// And a directory raced in at the target's name fails the rename with an error naming the
/// target, not the temporary.
#[test]
fn the_kept_attributes_are_read_at_the_commit_and_a_failed_rename_names_the_target() {
    let dir = disk_dir();
    let src = dir.path().join("src");
    std::fs::write(&src, data(64 << 10, 4)).unwrap();
    let f = dir.path().join("t");
    std::fs::write(&f, b"old").unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o644)).unwrap();
    let hook = format!("[ \"$1\" = created ] && chmod 600 {}", s(&f));
    let (st, _, err) = run_hooked(&["copy", s(&src), s(&f), "--overwrite"], &hook);
    assert!(st.success(), "{err}");
    assert_eq!(std::fs::read(&f).unwrap(), data(64 << 10, 4));
    assert_eq!(
        std::fs::metadata(&f).unwrap().mode() & 0o7777,
        0o600,
        "the mode at the commit"
    );
    let race = dir.path().join("race");
    std::fs::write(&race, b"old").unwrap();
    let hook = format!("[ \"$1\" = created ] && rm {r} && mkdir {r}", r = s(&race));
    let (st, _, err) = run_hooked(&["copy", s(&src), s(&race), "--overwrite"], &hook);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains(&format!("rename {}", s(&race))), "{err}");
    assert!(!err.contains("gdpath-tmp"), "{err}");
    assert!(temporaries(dir.path()).is_empty());
}
