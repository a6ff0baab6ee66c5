//! `AtomicFile` and symbolic links another user planted, and what a replaced file keeps: real
//! links made by `nobody` (through `setpriv`) in a real sticky world-writable directory, real
//! owners. As root only (CI runs as root); each test says so when it skips.

use gdpath_file::{check_target, AtomicFile, Error, ReplaceOptions};
use gdpath_testkit::{as_nobody, is_root, planted_link, NOBODY};
use std::io::Write;
use std::os::unix::fs::{MetadataExt, PermissionsExt};
use std::path::Path;

fn overwrite() -> ReplaceOptions {
    ReplaceOptions::default().overwrite(true)
}

fn write(target: &Path, data: &[u8]) -> gdpath_file::Result<AtomicFile> {
    let mut f = AtomicFile::create(target, overwrite())?;
    f.write_all(data).unwrap();
    Ok(f)
}

/// The attack of the report: root writes to a name in a sticky world-writable directory where
/// `nobody` planted a link to root's 0600 file. On main the file was replaced (main resolved
/// the link with `canonicalize` and renamed over what it found). Now the create is refused
/// with a typed error naming the link, its owner and the directory, before anything is
/// created, and `check_target` refuses it the same way.
#[test]
fn a_link_another_user_planted_in_a_sticky_directory_is_refused() {
    let Some(p) = planted_link("a_link_another_user_planted_in_a_sticky_directory_is_refused")
    else {
        return;
    };
    for opts in [overwrite(), ReplaceOptions::default()] {
        let e = AtomicFile::create(&p.link, opts).unwrap_err();
        match &e {
            Error::SymlinkRefused { link, owner, dir } => {
                assert_eq!((link, *owner, dir), (&p.link, NOBODY, &p.sticky), "{e}")
            }
            other => panic!("{other}"),
        }
        let msg = e.to_string();
        for part in [
            "owned by uid 65534",
            "sticky world-writable directory",
            "protected_symlinks",
            "remove the link or write elsewhere",
        ] {
            assert!(msg.contains(part), "{msg}");
        }
        let e = check_target(&p.link, true).unwrap_err();
        assert!(matches!(e, Error::SymlinkRefused { .. }), "{e}");
    }
    assert!(p.victim_untouched());
    assert!(p.temporaries().is_empty(), "{:?}", p.temporaries());
}

/// The rule holds at every link, not only the first: root's own link to `nobody`'s link is
/// refused at the second; a loop ends with `ELOOP` after the kernel's 40 links.
#[test]
fn every_link_on_the_way_is_checked_and_a_loop_ends() {
    let Some(p) = planted_link("every_link_on_the_way_is_checked_and_a_loop_ends") else {
        return;
    };
    let outer = p.victim.parent().unwrap().join("via");
    std::os::unix::fs::symlink(&p.link, &outer).unwrap();
    let e = write(&outer, b"x").unwrap_err();
    match &e {
        Error::SymlinkRefused { link, dir, .. } => {
            assert_eq!(
                (link, dir),
                (
                    &p.sticky.canonicalize().unwrap().join("model.safetensors"),
                    &p.sticky.canonicalize().unwrap()
                ),
                "{e}"
            )
        }
        other => panic!("{other}"),
    }
    assert!(p.victim_untouched());
    let a = p.sticky.join("a");
    std::os::unix::fs::symlink("b", &a).unwrap();
    std::os::unix::fs::symlink("a", p.sticky.join("b")).unwrap();
    match write(&a, b"x").unwrap_err() {
        Error::Open { source, .. } => assert_eq!(source.raw_os_error(), Some(libc::ELOOP)),
        other => panic!("{other}"),
    }
}

/// What the rule allows is followed, as `open(2)` follows it: root's own link in the sticky
/// directory, and `nobody`'s link in a directory that is world-writable but not sticky. The
/// file written is the real one, and `target` and `through_link` say so.
#[test]
fn a_link_the_rule_allows_is_followed_and_named() {
    let Some(p) = planted_link("a_link_the_rule_allows_is_followed_and_named") else {
        return;
    };
    let real = p.victim.canonicalize().unwrap();
    let f = write(&p.own_link, b"through root's own link").unwrap();
    assert!(f.through_link());
    assert_eq!(f.target(), real);
    f.commit().unwrap();
    assert_eq!(
        std::fs::read(&p.victim).unwrap(),
        b"through root's own link"
    );
    assert!(std::fs::symlink_metadata(&p.own_link)
        .unwrap()
        .file_type()
        .is_symlink());
    let t = check_target(&p.own_link, true).unwrap();
    assert!(t.through_link && t.exists && t.path == real, "{t:?}");

    let open = p.victim.parent().unwrap().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let link = open.join("l");
    as_nobody(&[
        "ln",
        "-s",
        p.victim.to_str().unwrap(),
        link.to_str().unwrap(),
    ]);
    write(&link, b"not sticky").unwrap().commit().unwrap();
    assert_eq!(std::fs::read(&p.victim).unwrap(), b"not sticky");

    // A file that is no link: its own path, no link followed.
    let plain = p.victim.parent().unwrap().join("plain");
    let f = write(&plain, b"x").unwrap();
    assert!(!f.through_link());
    assert_eq!(f.target(), plain);
}

/// A replaced file must stay readable by its owner and keep its labels: it keeps its owner and group (root sets both), its permission
/// bits and its extended attributes; set-user-ID is dropped, as documented.
#[test]
fn a_replaced_file_keeps_owner_group_mode_and_xattrs_but_not_setuid() {
    if !is_root() {
        eprintln!("skipped a_replaced_file_keeps_owner_group_mode_and_xattrs_but_not_setuid: needs root (to own a file as another user)");
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let f = dir.path().join("theirs");
    std::fs::write(&f, b"old").unwrap();
    std::os::unix::fs::chown(&f, Some(NOBODY), Some(NOBODY)).unwrap();
    std::fs::set_permissions(&f, std::fs::Permissions::from_mode(0o4640)).unwrap();
    let flags = rustix::fs::XattrFlags::empty();
    let xattr = rustix::fs::setxattr(&f, "user.gdpath.test", b"kept", flags);
    let mut a = AtomicFile::create(&f, overwrite()).unwrap();
    assert!(a.replaces());
    a.write_all(b"new").unwrap();
    a.commit().unwrap();
    let md = std::fs::metadata(&f).unwrap();
    assert_eq!(std::fs::read(&f).unwrap(), b"new");
    assert_eq!(
        (md.uid(), md.gid()),
        (NOBODY, NOBODY),
        "owner and group kept"
    );
    assert_eq!(md.mode() & 0o7777, 0o640, "rwx kept, set-user-ID dropped");
    match xattr {
        Ok(()) => {
            let mut v = [0u8; 16];
            let n = rustix::fs::getxattr(&f, "user.gdpath.test", &mut v[..]).unwrap();
            assert_eq!(&v[..n], b"kept");
        }
        Err(e) => eprintln!("user xattrs not tested: this file system refuses them ({e})"),
    }
    // nobody reads it, as before the replacement.
    let input = format!("if={}", f.display());
    as_nobody(&["dd", &input, "of=/dev/null", "status=none"]);
}

// The second round: the hostile tester's reproductions 3 to 5 against the engine itself (the
// CLI's tests/faults/links.rs runs them through the commands, and 1 and 2 with their races).

/// Reproduction 3: a link `nobody` planted is refused as a directory of the path too, not only
/// at its end (`S/sub/P`, `sub` pointing at the directory of root's file), and inside the text
/// of root's own link (`S/rl2` → `sub/P`). On main the kernel resolved the directories and,
/// with `fs.protected_symlinks=0`, replaced root's file.
#[test]
fn a_link_another_user_planted_is_refused_as_a_directory_of_the_path() {
    let Some(p) = planted_link("a_link_another_user_planted_is_refused_as_a_directory_of_the_path")
    else {
        return;
    };
    let sub = p.sticky.join("sub");
    as_nobody(&[
        "ln",
        "-s",
        p.victim.parent().unwrap().to_str().unwrap(),
        sub.to_str().unwrap(),
    ]);
    let rl2 = p.sticky.join("rl2");
    std::os::unix::fs::symlink("sub/P", &rl2).unwrap();
    for t in [sub.join("P"), rl2] {
        let e = write(&t, b"x").unwrap_err();
        match &e {
            Error::SymlinkRefused { link, owner, dir } => {
                assert_eq!((link, *owner, dir), (&sub, NOBODY, &p.sticky), "{e}")
            }
            other => panic!("{}: {other}", t.display()),
        }
        assert!(matches!(
            check_target(&t, true),
            Err(Error::SymlinkRefused { .. })
        ));
    }
    assert!(p.victim_untouched());
    assert!(p.temporaries().is_empty(), "{:?}", p.temporaries());
}

/// `..` is taken as the kernel takes it, relative to the directory reached so far (after a
/// link, the parent of where it led), and a link the rule allows as a directory is followed:
/// the file found is the one `open(2)` finds.
#[test]
fn dot_dot_and_allowed_directory_links_resolve_as_the_kernel_does() {
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a");
    let deep = a.join("b/c");
    std::fs::create_dir_all(&deep).unwrap();
    std::fs::write(a.join("b/f"), b"b's").unwrap();
    std::os::unix::fs::symlink(&deep, dir.path().join("to-c")).unwrap();
    std::os::unix::fs::symlink("a/b/c/../f", dir.path().join("rel")).unwrap();
    for (given, want) in [
        // The link leads to a/b/c; its `..` is a/b, not the link's own directory.
        ("to-c/../f", a.join("b/f")),
        ("a/b/c/../../b/f", a.join("b/f")),
        ("rel", a.join("b/f")),
    ] {
        let t = dir.path().join(given);
        let mut f = write(&t, b"new").unwrap();
        f.flush().unwrap();
        f.commit().unwrap();
        assert_eq!(std::fs::read(&want).unwrap(), b"new", "{given}");
        std::fs::write(&want, b"b's").unwrap();
    }
    assert!(!dir.path().join("f").exists() && !a.join("f").exists());
}

/// Reproduction 4: with `overwrite`, a file `nobody` owns in the sticky directory is not
/// replaced by root (the kernel's `protected_regular=2`), neither when the write begins nor
/// when it appears before the commit; root's own file there and `nobody`'s file in a directory
/// that is not sticky are. On main root's content became `nobody`'s, mode 0666.
#[test]
fn another_users_file_in_a_sticky_directory_is_not_replaced() {
    let Some(p) = planted_link("another_users_file_in_a_sticky_directory_is_not_replaced") else {
        return;
    };
    let rep = p.sticky.join("rep.html");
    let line = format!("echo x > {r}; chmod 666 {r}", r = rep.display());
    as_nobody(&["sh", "-c", &line]);
    let e = write(&rep, b"root's").unwrap_err();
    match &e {
        Error::ForeignFileRefused { path, owner, dir } => {
            assert_eq!((path, *owner, dir), (&rep, NOBODY, &p.sticky), "{e}")
        }
        other => panic!("{other}"),
    }
    assert!(e.to_string().contains("protected_regular"), "{e}");
    assert!(matches!(
        check_target(&rep, true),
        Err(Error::ForeignFileRefused { .. })
    ));
    assert!(matches!(
        check_target(&rep, false),
        Err(Error::Exists { .. })
    ));
    assert_eq!(std::fs::read(&rep).unwrap(), b"x\n");

    // Planted between the create and the commit: refused at the commit.
    let late = p.sticky.join("late.html");
    let f = write(&late, b"root's").unwrap();
    let line = format!("echo x > {}", late.display());
    as_nobody(&["sh", "-c", &line]);
    assert!(matches!(f.commit(), Err(Error::ForeignFileRefused { .. })));
    assert_eq!(std::fs::read(&late).unwrap(), b"x\n");
    assert!(p.temporaries().is_empty(), "{:?}", p.temporaries());

    let mine = p.sticky.join("mine");
    std::fs::write(&mine, b"old").unwrap();
    write(&mine, b"new").unwrap().commit().unwrap();
    assert_eq!(std::fs::read(&mine).unwrap(), b"new");
    let open = p.victim.parent().unwrap().join("open");
    std::fs::create_dir(&open).unwrap();
    std::fs::set_permissions(&open, std::fs::Permissions::from_mode(0o777)).unwrap();
    let theirs = open.join("theirs");
    let line = format!("echo x > {}", theirs.display());
    as_nobody(&["sh", "-c", &line]);
    write(&theirs, b"new").unwrap().commit().unwrap();
    assert_eq!(std::fs::read(&theirs).unwrap(), b"new");
}

/// Reproduction 5: a magic link of `/proc` anywhere on the way (`/dev/stdout` →
/// `/proc/self/fd/1`; a link through `/proc/self/cwd`) is refused with its own error, not
/// followed through `readlink`'s text (main replaced the file stdout went to) nor refused as
/// `ELOOP`.
#[test]
fn a_magic_link_of_proc_is_refused() {
    let dir = tempfile::tempdir().unwrap();
    let through_cwd = dir.path().join("l");
    std::os::unix::fs::symlink("/proc/self/cwd/t2", &through_cwd).unwrap();
    for (t, link) in [
        (Path::new("/dev/stdout"), "/proc/self/fd/1"),
        (through_cwd.as_path(), "/proc/self/cwd"),
        (Path::new("/proc/self/cwd/x"), "/proc/self/cwd"),
    ] {
        let e = write(t, b"x").unwrap_err();
        match &e {
            Error::MagicLinkRefused { path, link: l } => {
                assert_eq!((path.as_path(), l.as_path()), (t, Path::new(link)), "{e}")
            }
            other => panic!("{}: {other}", t.display()),
        }
        assert!(e.to_string().contains("write to a file"), "{e}");
    }
    assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
}
