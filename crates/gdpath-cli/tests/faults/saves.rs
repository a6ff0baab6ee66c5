//! The checkpoint save's promise that a save leaves the old file or the new one, never a torn
//! one, checked through `gdpath resave --host`: kills at random points, a full
//! file system, an existing destination.

use super::files::tmpfs;
use super::*;

/// A safetensors file of three tensors (4 MiB of U8, 256 KiB of F32, an empty I64), their
/// bytes from `seed`, written here byte by byte (the format, not the code under test).
fn checkpoint(path: &Path, seed: u8) {
    let a = data(4 << 20, seed);
    let b = data(256 << 10, seed.wrapping_add(1));
    let json = format!(
        "{{\"__metadata__\":{{\"format\":\"pt\"}},\
         \"b\":{{\"dtype\":\"F32\",\"shape\":[256,256],\"data_offsets\":[0,{}]}},\
         \"e\":{{\"dtype\":\"I64\",\"shape\":[0,3],\"data_offsets\":[{0},{0}]}},\
         \"a\":{{\"dtype\":\"U8\",\"shape\":[4096,1024],\"data_offsets\":[{0},{1}]}}}}",
        b.len(),
        b.len() + a.len()
    );
    let mut h = json.into_bytes();
    h.resize(h.len().next_multiple_of(8), b' ');
    let mut out = (h.len() as u64).to_le_bytes().to_vec();
    out.extend_from_slice(&h);
    out.extend_from_slice(&b);
    out.extend_from_slice(&a);
    std::fs::write(path, out).unwrap();
}

fn resave(src: &Path, dst: &Path, extra: &[&str]) -> Command {
    let mut c = gdpath();
    c.args(["resave", s(src), s(dst), "--host"])
        .args(extra)
        .stdout(Stdio::null())
        .stderr(Stdio::piped());
    c
}

fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill has no memory effects; the id is of a child not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, sig) };
}

/// A save killed with SIGKILL at random points, 100 times, over an existing
/// checkpoint (and, every fourth trial, to a new name) leaves the old checkpoint or the new
/// one, byte-exact, never a torn one; each kill leaves at most one temporary, named as
/// gdpath's, which the next save of the same target removes. Where the file system makes
/// unnamed temporaries (`O_TMPFILE`), a kill leaves no partial temporary, only, in the commit's
/// window between link and rename, a whole one, so a crash never leaves a torn file behind.
#[test]
fn sigkill_at_random_points_of_a_save_leaves_the_old_checkpoint_or_the_new_one() {
    let dir = disk_dir();
    let src = dir.path().join("src.safetensors");
    checkpoint(&src, 3);
    let old_path = dir.path().join("old.safetensors");
    checkpoint(&old_path, 77);
    let old = std::fs::read(&old_path).unwrap();
    // One whole save: what the new file must be, and how long a run takes here.
    let reference = dir.path().join("reference.safetensors");
    // The quickest of three runs: the first is slower (cold caches, other tests running).
    let mut took = Duration::MAX;
    for _ in 0..3 {
        let t0 = Instant::now();
        let (st, err) = wait(
            resave(&src, &reference, &["--overwrite"]).spawn().unwrap(),
            "resave",
        );
        assert!(st.success(), "{err}");
        took = took.min(t0.elapsed());
    }
    let new = std::fs::read(&reference).unwrap();
    assert_ne!(new, old);
    let dst = dir.path().join("dst.safetensors");
    let unnamed = unnamed_temporaries(dir.path());
    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("one resave: {took:?}; seed {seed}");
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut killed, mut completed) = (0, 0);
    for trial in 0..100 {
        let replacing = trial % 4 != 3;
        if replacing {
            std::fs::write(&dst, &old).unwrap();
        } else {
            let _ = std::fs::remove_file(&dst);
        }
        let before = temporaries(dir.path());
        let delay = took.mul_f64((rand() % 1000) as f64 / 1000.0);
        let child = resave(&src, &dst, &["--overwrite"]).spawn().unwrap();
        std::thread::sleep(delay);
        signal(&child, libc::SIGKILL);
        let (st, err) = wait(child, "resave");
        let got = std::fs::read(&dst).ok();
        let what = format!(
            "trial {trial} ({}, SIGKILL after {delay:?})",
            if replacing {
                "over an old file"
            } else {
                "new file"
            }
        );
        let whole = got.as_deref() == Some(&new[..]);
        if st.success() {
            completed += 1;
            assert!(
                whole,
                "{what}: completed but the file is not the new one: {err}"
            );
        } else {
            assert_eq!(st.signal(), Some(libc::SIGKILL), "{what}: {err}");
            if !whole {
                killed += 1;
            }
            if replacing {
                assert!(
                    whole || got.as_deref() == Some(&old[..]),
                    "{what}: the old checkpoint changed ({} bytes now)",
                    got.map_or(0, |g| g.len())
                );
            } else {
                assert!(
                    whole || got.is_none(),
                    "{what}: a torn file of {} bytes is left",
                    got.map_or(0, |g| g.len())
                );
            }
        }
        assert_killed_leaves_no_partial(
            dir.path(),
            &before,
            ".dst.safetensors.gdpath-tmp-",
            unnamed,
            &new,
            &what,
        );
        // What earlier kills left is removed by this run (unless it was killed first).
        if st.success() {
            assert!(
                temporaries(dir.path()).is_empty(),
                "{what}: stale ones stay"
            );
        }
    }
    eprintln!("{killed} killed before the rename, {completed} completed");
    assert!(
        killed >= 30,
        "only {killed} of 100 kills landed before the rename: the test did not test"
    );
    let (st, err) = wait(
        resave(&src, &dst, &["--overwrite"]).spawn().unwrap(),
        "resave",
    );
    assert!(st.success(), "{err}");
    assert!(temporaries(dir.path()).is_empty());
    assert!(std::fs::read(&dst).unwrap() == new);
}

/// A full file system must fail the save before it touches the old checkpoint: a save onto a 4 MiB tmpfs (the checkpoint is 4.25 MiB) fails with the file
/// system's no-space error naming the target and the bytes needed, exit status 1 and kind
/// `no_space`, before any data is written: an old checkpoint there stays byte-exact and no
/// temporary is left.
#[test]
fn a_full_file_system_fails_the_save_clearly_and_leaves_the_old_checkpoint() {
    let Some(m) = tmpfs("4m") else { return };
    let disk = disk_dir();
    let src = disk.path().join("src.safetensors");
    checkpoint(&src, 5);
    let dst = m.dir.path().join("model.safetensors");
    let old = b"an old checkpoint".to_vec();
    std::fs::write(&dst, &old).unwrap();
    for extra in [&["--overwrite"][..], &["--overwrite", "--no-fsync"]] {
        let out = resave(&src, &dst, extra)
            .arg("--json")
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        let doc = common::error_doc(&out);
        assert_eq!(doc["kind"], "no_space", "{doc}");
        assert!(
            err.contains(&format!("no space left for {}", dst.display()))
                && err.contains("(4.25 MiB) needed, 0 bytes written"),
            "{err}"
        );
        assert_eq!(std::fs::read(&dst).unwrap(), old, "the old file is intact");
        assert!(temporaries(m.dir.path()).is_empty());
    }
}

/// An existing destination is not replaced without --overwrite (kind `exists`, status 1,
/// nothing loaded or written); the save's JSON says fsync and the path.
#[test]
fn resave_refuses_an_existing_file_without_overwrite_and_reports_fsync() {
    let dir = disk_dir();
    let src = dir.path().join("src.safetensors");
    checkpoint(&src, 9);
    let dst = dir.path().join("dst.safetensors");
    std::fs::write(&dst, b"keep").unwrap();
    let out = resave(&src, &dst, &["--json"])
        .stdout(Stdio::piped())
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(common::error_doc(&out)["kind"], "exists");
    assert_eq!(std::fs::read(&dst).unwrap(), b"keep");
    for (extra, fsync) in [
        (&["--overwrite"][..], true),
        (&["--overwrite", "--no-fsync"], false),
    ] {
        let out = resave(&src, &dst, extra)
            .arg("--json")
            .stdout(Stdio::piped())
            .output()
            .unwrap();
        let v = common::json_ok(&out);
        assert_eq!(v["schema"], "gdpath.resave/1");
        assert_eq!(v["verified"], true, "{v}");
        assert_eq!(v["fsync"], fsync, "{v}");
        assert!(v["paths"][0].is_string(), "{v}");
        assert_eq!(v["runs"][0]["report"]["paths"], v["paths"], "{v}");
        assert_eq!(v["runs"][0]["report"]["tensors"], 3, "{v}");
    }
    assert!(temporaries(dir.path()).is_empty());
}
