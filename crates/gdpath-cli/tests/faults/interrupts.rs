//! SIGINT and SIGKILL while files are written.

use super::*;

/// A file for the interrupt tests: large enough that a copy takes a while.
const BIG: usize = 96 << 20;

/// Sends `sig` to `child` (by its id, which this test owns).
fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill has no memory effects; the id is of a child not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, sig) };
}

/// SIGINT and SIGKILL at random points of `copy`, 24 times, to a new destination and
/// (`--overwrite`) over an existing one: unless the copy got as far as its rename (then the
/// destination is the source, whole), a new destination does not exist and an old one survives
/// byte-exact; a SIGINT leaves no temporary. A SIGKILL leaves no partial temporary where the
/// file system makes unnamed ones (`O_TMPFILE`): at most a whole one, named only between the
/// commit's link and rename; elsewhere at most one named as gdpath's. The next copy to the
/// same destination removes what is left. On main a SIGINT left a partial destination (557 MB
/// of 3 GiB) and the old content was gone as soon as the copy began; before unnamed
/// temporaries each SIGKILL left a partial one (up to 96 MiB here) until the next run.
#[test]
fn sigint_and_sigkill_during_copy_leave_the_old_file_or_the_new_one_whole() {
    let dir = disk_dir();
    let src = dir.path().join("src");
    let new = data(BIG, 7);
    std::fs::write(&src, &new).unwrap();
    let dst = dir.path().join("dst");
    let old = data(1 << 20, 8);
    let unnamed = unnamed_temporaries(dir.path());
    let copy = |d: &Path, overwrite: bool| {
        let mut c = gdpath();
        c.args(["copy", s(&src), s(d), "--window", "4MiB"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        if overwrite {
            c.arg("--overwrite");
        }
        c
    };
    // How long one copy takes here, to spread the signals over it.
    let t0 = Instant::now();
    let (st, err) = wait(copy(&dst, false).spawn().unwrap(), "copy");
    assert!(st.success(), "{err}");
    let took = t0.elapsed();

    let mut seed = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .unwrap()
        .as_nanos() as u64
        | 1;
    eprintln!("one copy: {took:?}; seed {seed}");
    let mut rand = move || {
        seed ^= seed << 13;
        seed ^= seed >> 7;
        seed ^= seed << 17;
        seed
    };
    let (mut interrupted, mut completed) = (0, 0);
    for trial in 0..24 {
        // Trials 0, 1 (mod 4): a new destination; 2, 3: over an old one.
        let replacing = trial % 4 >= 2;
        let kill = trial % 2 == 1;
        if replacing {
            std::fs::write(&dst, &old).unwrap();
        } else {
            let _ = std::fs::remove_file(&dst);
        }
        // What earlier SIGKILLs left (this run may remove it, or be interrupted first).
        let before = temporaries(dir.path());
        let delay = took.mul_f64((rand() % 1000) as f64 / 1000.0 * 0.9);
        let child = copy(&dst, replacing).spawn().unwrap();
        std::thread::sleep(delay);
        signal(&child, if kill { libc::SIGKILL } else { libc::SIGINT });
        let (st, err) = wait(child, "copy");
        let got = std::fs::read(&dst).ok();
        let what = format!(
            "trial {trial} ({}, {}, after {delay:?})",
            if kill { "SIGKILL" } else { "SIGINT" },
            if replacing {
                "over an old file"
            } else {
                "new file"
            }
        );
        if st.success() {
            completed += 1;
            assert!(
                got.as_deref() == Some(&new[..]),
                "{what}: completed but the destination is not the source"
            );
        } else {
            // A signal after the rename (the copy was complete) but before the exit ends
            // the run interrupted with the new file in place, whole: also right.
            let whole = got.as_deref() == Some(&new[..]);
            if !whole {
                interrupted += 1;
            }
            if replacing {
                assert!(
                    whole || got.as_deref() == Some(&old[..]),
                    "{what}: interrupted ({st:?}) and the old file changed: {err}"
                );
            } else {
                assert!(
                    whole || got.is_none(),
                    "{what}: interrupted ({st:?}) and a partial destination of {} bytes is \
                     left: {err}",
                    got.map_or(0, |g| g.len())
                );
            }
            if kill {
                assert_eq!(st.signal(), Some(libc::SIGKILL), "{what}");
            } else {
                // The handler's 130, or the signal itself when it came before the handler
                // was installed (nothing was written yet then).
                assert!(
                    st.code() == Some(130) || st.signal() == Some(libc::SIGINT),
                    "{what}: {st:?} {err}"
                );
            }
        }
        if kill {
            assert_killed_leaves_no_partial(
                dir.path(),
                &before,
                ".dst.gdpath-tmp-",
                unnamed,
                &new,
                &what,
            );
        } else {
            let left: Vec<String> = temporaries(dir.path())
                .into_iter()
                .filter(|n| !before.contains(n))
                .collect();
            assert!(left.is_empty(), "{what}: SIGINT left {left:?}");
            assert!(!err.contains("panicked"), "{what}: {err}");
        }
    }
    eprintln!("{interrupted} interrupted before the rename, {completed} completed");
    assert!(
        interrupted >= 8,
        "only {interrupted} of 24 trials interrupted a copy before its end: the test did not \
         test"
    );
    // The next copy to the same destination removes what a SIGKILL left.
    let (st, err) = wait(copy(&dst, true).spawn().unwrap(), "copy");
    assert!(st.success(), "{err}");
    assert!(temporaries(dir.path()).is_empty());
    assert!(std::fs::read(&dst).unwrap() == new);
}

/// `child` (a `bench storage` run) once it is writing its test file in `dir` (the file or its
/// temporary, named or unnamed, holds data); a run that ends first fails the test.
fn writing_test_file(mut child: Child, dir: &Path) -> Child {
    let t0 = Instant::now();
    loop {
        if writing_under(&child, dir) {
            return child;
        }
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = std::io::Read::read_to_string(&mut e, &mut err);
            }
            panic!("bench storage ended ({st}) before writing its test file: {err}");
        }
        assert!(t0.elapsed() < DEADLINE, "no test file is being written");
        std::thread::sleep(Duration::from_millis(5));
    }
}

/// A `bench storage` run that makes a 1 GiB test file in `dir`.
fn bench_making(f: &Path) -> Child {
    gdpath()
        .args([
            "bench",
            "storage",
            "--file",
            s(f),
            "--size",
            "1GiB",
            "--runs",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap()
}

/// A kill must leave no partial file behind: a SIGKILL while `bench storage` writes its test file
/// leaves neither the file nor a temporary where the file system makes unnamed temporaries
/// (a named temporary of up to 1 GiB would stay until the next run), and the next run works.
#[test]
fn sigkill_while_bench_storage_makes_its_test_file_leaves_nothing() {
    let dir = disk_dir();
    if !unnamed_temporaries(dir.path()) {
        eprintln!("skipped: this file system refuses O_TMPFILE (a named temporary stays)");
        return;
    }
    let f = dir.path().join("bench-file");
    let child = writing_test_file(bench_making(&f), dir.path());
    signal(&child, libc::SIGKILL);
    let (st, err) = wait(child, "bench storage");
    assert_eq!(st.signal(), Some(libc::SIGKILL), "{err}");
    let left: Vec<String> = std::fs::read_dir(dir.path())
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .collect();
    assert!(left.is_empty(), "SIGKILL left {left:?}");
    next_bench_storage_runs(&f);
}

/// A SIGINT while `bench storage` writes its test file leaves no file (a partial one would be
/// refused by the next run as shorter than --size), and the next run works.
#[test]
fn sigint_while_bench_storage_makes_its_test_file_leaves_none() {
    let dir = disk_dir();
    let f = dir.path().join("bench-file");
    let child = writing_test_file(bench_making(&f), dir.path());
    signal(&child, libc::SIGINT);
    let (st, err) = wait(child, "bench storage");
    let left = std::fs::metadata(&f).map(|m| m.len());
    assert!(
        left.is_err(),
        "a partial test file of {left:?} bytes is left"
    );
    assert_eq!(st.code(), Some(130), "{err}");
    assert!(err.contains("interrupted"), "{err}");
    assert!(temporaries(dir.path()).is_empty());
    next_bench_storage_runs(&f);
}

/// The `bench storage` run after an interrupted one on `f` works (nothing it left is refused).
fn next_bench_storage_runs(f: &Path) {
    let (st, err) = run(&[
        "bench",
        "storage",
        "--file",
        s(f),
        "--size",
        "4MiB",
        "--runs",
        "1",
    ]);
    assert!(st.success(), "the next run is not refused: {err}");
}
