//! Faults and bad input, as a user or a script meets them (issue 21): devices, FIFOs and
//! sockets given to every command that writes, destinations replaced only whole and only when
//! asked, interrupts and kills during `copy` and `bench storage`, closed and full stdout for
//! every command, arguments that do not apply refused. Real files, real signals, the real
//! binary. The tests that need root (a loop device, a small tmpfs) are here too and say when
//! they skip; `scripts/fault-suite.sh` runs this file and the shell-level checks in CI.

mod common;

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// No command here may take longer: a FIFO that blocks an open fails the test, not CI.
const DEADLINE: Duration = Duration::from_secs(60);

const H200_SNAPSHOT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../assets/snapshots/h200x2.tar.gz"
);

fn gdpath() -> Command {
    let mut c = Command::new(common::bin());
    c.stdin(Stdio::null());
    c
}

fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// Waits for `child` at most [`DEADLINE`]; a child still running then is killed and the test
/// fails (it hung).
fn wait(mut child: Child, what: &str) -> (ExitStatus, String) {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let mut err = String::new();
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return (st, err);
        }
        if t0.elapsed() > DEADLINE {
            let _ = child.kill();
            let _ = child.wait();
            panic!("{what}: still running after {DEADLINE:?} (blocked?)");
        }
        std::thread::sleep(Duration::from_millis(10));
    }
}

/// Runs `args` with stdout to `/dev/null`: (status, stderr).
fn run(args: &[&str]) -> (ExitStatus, String) {
    let child = gdpath()
        .args(args)
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait(child, &args.join(" "))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

/// gdpath's temporaries (`.NAME.gdpath-tmp-…`) in `dir`.
fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(gdpath::file::TEMP_MARKER))
        .collect()
}

/// `len` bytes that differ from any other call's `seed`.
fn data(len: usize, seed: u8) -> Vec<u8> {
    (0..len)
        .map(|i| ((i as u32).wrapping_mul(2654435761) >> 13) as u8 ^ seed)
        .collect()
}

/// The write end of a pipe whose read end is already closed: every write fails with EPIPE.
fn closed_pipe() -> Stdio {
    let mut fds = [0; 2];
    // SAFETY: pipe2 fills two descriptors this test then owns.
    assert_eq!(unsafe { libc::pipe2(fds.as_mut_ptr(), libc::O_CLOEXEC) }, 0);
    // SAFETY: both were just created and are owned by nothing else.
    let (r, w) = unsafe { (OwnedFd::from_raw_fd(fds[0]), OwnedFd::from_raw_fd(fds[1])) };
    drop(r);
    Stdio::from(w)
}

fn dev_full() -> Stdio {
    Stdio::from(
        std::fs::OpenOptions::new()
            .write(true)
            .open("/dev/full")
            .unwrap(),
    )
}

/// A FIFO, a listening Unix socket and a character device, each with a way to tell it was not
/// written: the FIFO has a reader open (non-blocking) whose read must find nothing.
struct Specials {
    _dir: tempfile::TempDir,
    fifo: PathBuf,
    fifo_reader: std::fs::File,
    sock: PathBuf,
    _listener: std::os::unix::net::UnixListener,
}

fn specials() -> Specials {
    use std::os::unix::fs::OpenOptionsExt;
    let dir = disk_dir();
    let fifo = dir.path().join("fifo");
    let c = std::ffi::CString::new(fifo.to_str().unwrap()).unwrap();
    // SAFETY: a valid C string; mkfifo only creates the node.
    assert_eq!(unsafe { libc::mkfifo(c.as_ptr(), 0o600) }, 0);
    let fifo_reader = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK)
        .open(&fifo)
        .unwrap();
    let sock = dir.path().join("sock");
    let listener = std::os::unix::net::UnixListener::bind(&sock).unwrap();
    Specials {
        _dir: dir,
        fifo,
        fifo_reader,
        sock,
        _listener: listener,
    }
}

impl Specials {
    fn targets(&self) -> [(&Path, &'static str); 3] {
        [
            (&self.fifo, "a FIFO"),
            (&self.sock, "a socket"),
            (Path::new("/dev/null"), "a character device"),
        ]
    }

    /// Nothing was written into the FIFO, and it and the socket are still what they were.
    fn untouched(&mut self, what: &str) {
        let mut b = [0u8; 16];
        match self.fifo_reader.read(&mut b) {
            Ok(0) => {}
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => {}
            other => panic!("{what}: the FIFO was written: {other:?}"),
        }
        let ft = std::fs::metadata(&self.fifo).unwrap().file_type();
        assert!(ft.is_fifo(), "{what}: the FIFO was replaced");
        let ft = std::fs::metadata(&self.sock).unwrap().file_type();
        assert!(ft.is_socket(), "{what}: the socket was replaced");
        let dir = self.fifo.parent().unwrap();
        assert!(temporaries(dir).is_empty(), "{what}: temporaries left");
    }
}

/// Issue 21 items 1 and 4: a device, FIFO or socket given to any command that writes (or to
/// `copy` as its source) is refused by its type, with a message naming it, without blocking
/// and without a byte written. On main `bench storage --file FIFO` blocked for ever and a
/// device was written with the test pattern.
#[test]
fn every_writing_command_refuses_devices_fifos_and_sockets() {
    let mut sp = specials();
    let dir = disk_dir();
    let src = dir.path().join("src");
    std::fs::write(&src, data(1 << 20, 1)).unwrap();
    let targets: Vec<(PathBuf, &str)> = sp
        .targets()
        .iter()
        .map(|(p, w)| (p.to_path_buf(), *w))
        .collect();
    let out = dir.path().join("out");
    for (t, what) in &targets {
        let t = s(t);
        let bench = |extra: &[&'static str]| {
            let mut v = vec!["bench", "storage", "--file", t, "--size", "1MiB"];
            v.extend_from_slice(extra);
            v
        };
        let cases: Vec<Vec<&str>> = vec![
            bench(&[]),
            bench(&["--overwrite"]),
            bench(&["--write", "--overwrite"]),
            bench(&["--gpu", "0", "--overwrite"]),
            vec!["copy", s(&src), t],
            vec!["copy", s(&src), t, "--overwrite"],
            vec!["copy", t, s(&out)],
            vec!["copy", "gpu:0", t, "--size", "1MiB", "--overwrite"],
            vec!["topo", "capture", "-o", t, "--overwrite"],
        ];
        for args in cases {
            let (st, err) = run(&args);
            let line = args.join(" ");
            sp.untouched(&line);
            assert!(!st.success(), "{line} succeeded");
            assert_eq!(st.code(), Some(1), "{line}: {err}");
            assert!(
                err.contains(&format!("is {what}, not a regular file")),
                "{line}: {err}"
            );
        }
        // Reading a FIFO would block: the readers that are this refuse it too.
        for args in [vec!["load", t], vec!["p2p", "--facts", t]] {
            let (st, err) = run(&args);
            sp.untouched(&args.join(" "));
            assert_eq!(st.code(), Some(1), "{}: {err}", args.join(" "));
            assert!(err.contains("not a regular file"), "{err}");
        }
        // The doctor's probe files go into --path directories.
        let (st, err) = run(&["doctor", "--measure", "--path", t]);
        assert_eq!(st.code(), Some(3), "doctor --path {t}: {err}");
        assert!(err.contains("not a directory"), "{err}");
        sp.untouched("doctor");
    }
    assert!(!out.exists());
}

/// Issue 21 item 10 and the rough items: an existing destination is replaced only with
/// `--overwrite`, and then whole, keeping its permissions; without it nothing changes. On main
/// `copy` truncated the destination without asking and `topo capture` replaced its output.
#[test]
fn an_existing_destination_is_replaced_only_with_overwrite() {
    let dir = disk_dir();
    let src = dir.path().join("src");
    let new = data(3 << 20, 2);
    std::fs::write(&src, &new).unwrap();
    let dst = dir.path().join("dst");
    let old = data(100_000, 3);
    std::fs::write(&dst, &old).unwrap();
    std::fs::set_permissions(&dst, std::fs::Permissions::from_mode(0o640)).unwrap();
    let snap = dir.path().join("snap.tar.gz");
    std::fs::write(&snap, b"an old snapshot").unwrap();
    for args in [
        vec!["copy", s(&src), s(&dst)],
        vec!["copy", "gpu:0", s(&dst), "--size", "1MiB"],
        vec!["topo", "capture", "-o", s(&snap)],
    ] {
        let (st, err) = run(&args);
        assert_eq!(st.code(), Some(1), "{}: {err}", args.join(" "));
        assert!(
            err.contains("exists: it is replaced only with --overwrite"),
            "{err}"
        );
    }
    assert!(
        std::fs::read(&dst).unwrap() == old,
        "the old file is intact"
    );
    assert_eq!(std::fs::read(&snap).unwrap(), b"an old snapshot");

    let (st, err) = run(&["copy", s(&src), s(&dst), "--overwrite", "--verify"]);
    assert!(st.success(), "{err}");
    assert!(std::fs::read(&dst).unwrap() == new, "replaced whole");
    let mode = std::fs::metadata(&dst).unwrap().permissions().mode() & 0o777;
    assert_eq!(mode, 0o640, "the replaced file keeps its permissions");
    let (st, err) = run(&["topo", "capture", "-o", s(&snap), "--overwrite"]);
    assert!(st.success(), "{err}");
    let (st, err) = run(&["topo", "--snapshot", s(&snap)]);
    assert!(st.success(), "the new snapshot replays: {err}");
    assert!(temporaries(dir.path()).is_empty());
}

/// `p2p --facts /dev/zero` is refused at once (a character device), and a facts file larger
/// than the bound is refused naming it, instead of being read into memory without end.
#[test]
fn p2p_facts_input_is_bounded() {
    let (st, err) = run(&["p2p", "--facts", "/dev/zero"]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("is a character device"), "{err}");
    let dir = disk_dir();
    let big = dir.path().join("facts.json");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len((64 << 20) + 1).unwrap();
    let (st, err) = run(&["p2p", "--facts", s(&big)]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("holds more than 67108864 bytes"), "{err}");
}

/// `copy --size N` copies the first N bytes of a file source (main ignored it and copied the
/// whole file), and refuses N beyond its end before writing anything.
#[test]
fn copy_honours_size_for_file_sources() {
    let dir = disk_dir();
    let src = dir.path().join("src");
    let d = data((2 << 20) + 5, 4);
    std::fs::write(&src, &d).unwrap();
    let dst = dir.path().join("dst");
    let (st, err) = run(&["copy", s(&src), s(&dst), "--size", "1MiB", "--verify"]);
    assert!(st.success(), "{err}");
    assert!(
        std::fs::read(&dst).unwrap() == d[..1 << 20],
        "the first MiB only"
    );
    let far = dir.path().join("far");
    let (st, err) = run(&["copy", s(&src), s(&far), "--size", "3MiB"]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(err.contains("short file"), "{err}");
    assert!(!far.exists());
    assert!(temporaries(dir.path()).is_empty());
}

/// Item 4: values that mean nothing and options that do not apply to the chosen mode are
/// usage errors (status 2) that say why, before anything is created; a malformed GPU end is
/// named as such first. On main each of these was accepted and ignored (or, for `gpu:x`,
/// blamed on a missing --size).
#[test]
fn arguments_that_do_not_apply_are_refused_before_anything_runs() {
    let dir = disk_dir();
    let f = dir.path().join("f");
    std::fs::write(&f, data(1 << 20, 5)).unwrap();
    let new = dir.path().join("new");
    let cases: Vec<(Vec<&str>, &str)> = vec![
        (
            vec!["bench", "storage", "--file", s(&new), "--size", "0"],
            "at least 1 byte",
        ),
        (
            vec!["bench", "storage", "--file", s(&new), "--runs", "0"],
            "at least 1",
        ),
        (
            vec!["bench", "storage", "--file", s(&new), "--qd", "0"],
            "--qd",
        ),
        (
            vec!["bench", "storage", "--file", s(&new), "--threads", "4"],
            "--threads applies to the GDS bench",
        ),
        (
            vec!["bench", "storage", "--file", s(&new), "--path", "gds"],
            "--path applies to the GDS bench",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--gpu",
                "0",
                "--compare",
            ],
            "--compare applies to the host-memory bench",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--gpu",
                "0",
                "--qd",
                "4",
            ],
            "--qd applies to the host-memory bench",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--gpu",
                "0",
                "--buffered",
            ],
            "--buffered applies",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--gpu",
                "0",
                "--threads",
                "0",
            ],
            "at least 1",
        ),
        (
            vec![
                "bench",
                "storage",
                "--file",
                s(&new),
                "--write",
                "--compare",
            ],
            "--compare runs a buffered read loop",
        ),
        (vec!["bench", "h2d", "--runs", "0"], "at least 1"),
        (
            vec!["copy", s(&f), s(&new), "--size", "0"],
            "at least 1 byte",
        ),
        (
            vec!["copy", s(&f), s(&new), "--window", "0"],
            "at least 1 byte",
        ),
        (vec!["copy", s(&f), s(&new), "--qd", "0"], "--qd"),
        (
            vec!["copy", s(&f), "--overwrite"],
            "--overwrite applies to a destination file",
        ),
        (
            vec!["copy", s(&f), "--no-fsync"],
            "--no-fsync applies to a destination file",
        ),
        (vec!["copy", "gpu:x", s(&new)], "bad GPU: gpu:x"),
        (vec!["copy", s(&f), "gpu:0@zz"], "bad GPU"),
        (vec!["copy", "gpu:0", s(&new)], "--size is needed"),
        (
            vec![
                "copy",
                "gpu:0",
                s(&new),
                "--size",
                "1MiB",
                "--window",
                "1MiB",
            ],
            "--window applies to copies between files",
        ),
        (
            vec!["copy", s(&f), "gpu:0", "--buffered"],
            "--buffered applies to copies between files",
        ),
        (
            vec!["copy", s(&f), "gpu:0", "--overwrite"],
            "--overwrite applies to a destination file",
        ),
        (vec!["load", s(&f), "--repeat", "0"], "at least 1"),
        (vec!["load", s(&f), "--chunk", "0"], "at least 1 byte"),
        (vec!["load", s(&f), "--threads", "0"], "at least 1"),
    ];
    for (args, says) in cases {
        let (st, err) = run(&args);
        let line = args.join(" ");
        assert_eq!(st.code(), Some(2), "{line}: {err}");
        assert!(err.contains(says), "{line}: {err:?} lacks {says:?}");
        assert!(!new.exists(), "{line} created a file");
        assert!(temporaries(dir.path()).is_empty(), "{line}");
    }
}

/// Item 3: every command, with stdout closed by its reader (EPIPE) and with stdout full
/// (`/dev/full`). Closed: no panic, no message, the status a normal run has (the doctor's
/// verdict too). Full: the output is lost, so the command fails (1; the doctor 3) saying so.
/// On main each panicked with "failed printing to stdout" and status 101.
#[test]
fn a_closed_or_full_stdout_ends_every_command_with_its_status() {
    let dir = disk_dir();
    let f = dir.path().join("f");
    std::fs::write(&f, data(1 << 20, 6)).unwrap();
    let facts = dir.path().join("driver.json");
    std::fs::write(&facts, gdpath_testkit::H200_DRIVER_FACTS_JSON).unwrap();
    let snap = |n: &str| s(&dir.path().join(n)).to_owned();
    let (s1, s2, s3) = (snap("s1"), snap("s2"), snap("s3"));
    let bench = vec![
        "bench",
        "storage",
        "--file",
        s(&f),
        "--size",
        "1MiB",
        "--runs",
        "1",
    ];
    let commands: Vec<(Vec<&str>, Option<&str>)> = vec![
        (vec!["topo"], None),
        (vec!["topo", "--json"], None),
        (vec!["topo", "--snapshot", H200_SNAPSHOT], None),
        (vec!["doctor"], None),
        (vec!["doctor", "--json"], None),
        (vec!["doctor", "--snapshot", H200_SNAPSHOT, "--all"], None),
        (vec!["p2p", "--snapshot", H200_SNAPSHOT], None),
        (vec!["p2p", "--json", "--facts", s(&facts)], None),
        (vec!["copy", s(&f)], None),
        (vec!["copy", s(&f), "--json", "--verify"], None),
        (bench.clone(), None),
        ([&bench[..], &["--json"]].concat(), None),
        // Failures print their error document on stdout with --json.
        (vec!["load", s(&f), "--json"], None),
        (vec!["bench", "h2d", "--json"], None),
        (vec!["p2p", "--json", "--facts", "/nonexistent"], None),
        (vec!["copy", "/nonexistent", "--json"], None),
        // A capture writes a new file each time (the output is its summary).
        (vec!["topo", "capture", "-o", &s1], Some(s1.as_str())),
        (vec!["topo", "capture", "-o", &s2], Some(s2.as_str())),
        (vec!["topo", "capture", "-o", &s3], Some(s3.as_str())),
    ];
    // The capture commands run three times (normal, closed, full): one output each.
    let mut i = 0;
    for (args, made) in &commands {
        let line = args.join(" ");
        let fresh = |n: usize| -> Vec<String> {
            args.iter()
                .map(|a| match made {
                    Some(m) if a == m => format!("{m}-{n}"),
                    _ => (*a).to_owned(),
                })
                .collect()
        };
        i += 1;
        let spawn = |stdout: Stdio, n: usize| {
            let child = gdpath()
                .args(fresh(n))
                .stdout(stdout)
                .stderr(Stdio::piped())
                .spawn()
                .unwrap();
            wait(child, &line)
        };
        let (normal, err0) = spawn(Stdio::null(), 3 * i);
        assert_ne!(normal.code(), Some(101), "{line}: {err0}");
        let doctor = args[0] == "doctor";

        let (closed, err) = spawn(closed_pipe(), 3 * i + 1);
        assert!(!err.contains("panicked"), "{line}, closed stdout: {err}");
        assert_eq!(
            closed.code(),
            normal.code(),
            "{line}, closed stdout: {err}\nnormal run: {err0}"
        );
        assert!(
            !err.contains("cannot write to stdout"),
            "{line}: a reader that left is not an error: {err}"
        );

        let (full, err) = spawn(dev_full(), 3 * i + 2);
        assert!(!err.contains("panicked"), "{line}, full stdout: {err}");
        let failed = if doctor { 3 } else { 1 };
        assert_eq!(full.code(), Some(failed), "{line}, full stdout: {err}");
        if normal.success() {
            assert!(
                err.contains("cannot write to stdout: No space left on device"),
                "{line}: {err}"
            );
        }
    }
}

/// A file for the interrupt tests: large enough that a copy takes a while.
const BIG: usize = 96 << 20;

/// Sends `sig` to `child` (by its id, which this test owns).
fn signal(child: &Child, sig: libc::c_int) {
    // SAFETY: kill has no memory effects; the id is of a child not yet reaped.
    unsafe { libc::kill(child.id() as libc::pid_t, sig) };
}

/// Item 10: SIGINT and SIGKILL at random points of `copy`, 24 times, to a new destination and
/// (`--overwrite`) over an existing one: unless the copy got as far as its rename (then the
/// destination is the source, whole), a new destination does not exist and an old one survives
/// byte-exact; a
/// SIGINT leaves no temporary; a SIGKILL leaves at most one, named as gdpath's, which the next
/// copy to the same destination removes. On main a SIGINT left a partial destination (557 MB
/// of 3 GiB) and the old content was gone as soon as the copy began.
#[test]
fn sigint_and_sigkill_during_copy_leave_the_old_file_or_the_new_one_whole() {
    let dir = disk_dir();
    let src = dir.path().join("src");
    let new = data(BIG, 7);
    std::fs::write(&src, &new).unwrap();
    let dst = dir.path().join("dst");
    let old = data(1 << 20, 8);
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
        let left: Vec<String> = temporaries(dir.path())
            .into_iter()
            .filter(|n| !before.contains(n))
            .collect();
        if kill {
            assert!(left.len() <= 1, "{what}: {left:?}");
            assert!(
                left.iter().all(|n| n.starts_with(".dst.gdpath-tmp-")),
                "{left:?}"
            );
        } else {
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

/// Item 10: a SIGINT while `bench storage` writes its test file leaves no file (on main a
/// partial one, which the next run then refused as shorter than --size), and the next run
/// works.
#[test]
fn sigint_while_bench_storage_makes_its_test_file_leaves_none() {
    let dir = disk_dir();
    let f = dir.path().join("bench-file");
    let child = gdpath()
        .args([
            "bench",
            "storage",
            "--file",
            s(&f),
            "--size",
            "1GiB",
            "--runs",
            "1",
        ])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Until the file (or its temporary) holds data: the creation is under way.
    let t0 = Instant::now();
    loop {
        let busy = std::fs::read_dir(dir.path())
            .unwrap()
            .flatten()
            .any(|e| e.metadata().is_ok_and(|m| m.len() > 0));
        if busy {
            break;
        }
        assert!(t0.elapsed() < DEADLINE, "no test file is being written");
        std::thread::sleep(Duration::from_millis(5));
    }
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
    let (st, err) = run(&[
        "bench",
        "storage",
        "--file",
        s(&f),
        "--size",
        "4MiB",
        "--runs",
        "1",
    ]);
    assert!(st.success(), "the next run is not refused: {err}");
}

/// Whether this process may mount (root in CI); otherwise the caller skips, saying why.
fn tmpfs(size: &str) -> Option<Mounted> {
    let dir = disk_dir();
    let st = Command::new("mount")
        .args([
            "-t",
            "tmpfs",
            "-o",
            &format!("size={size}"),
            "tmpfs",
            s(dir.path()),
        ])
        .stderr(Stdio::null())
        .status();
    match st {
        Ok(st) if st.success() => Some(Mounted { dir }),
        _ => {
            eprintln!("skipped: cannot mount a tmpfs here (needs root; CI runs as root)");
            None
        }
    }
}

struct Mounted {
    dir: tempfile::TempDir,
}

impl Drop for Mounted {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg(self.dir.path()).status();
    }
}

/// Item 10 and the rough items: `copy` of 16 MiB onto an existing file of an 8 MiB tmpfs
/// fails naming the file and the bytes needed, the old file survives byte-exact and nothing
/// partial is left; `topo capture` on a full file system leaves no 0-byte snapshot and an
/// old one intact. On main the copy destroyed the old file and left an 8 MiB partial one
/// ("No space left on device" only), and the capture left a 0-byte file.
#[test]
fn a_full_file_system_destroys_nothing_and_says_what_was_needed() {
    let Some(m) = tmpfs("8m") else { return };
    let disk = disk_dir();
    let src = disk.path().join("src");
    let new = data(16 << 20, 9);
    std::fs::write(&src, &new).unwrap();
    let dst = m.dir.path().join("dst");
    let old = data(1 << 20, 10);
    std::fs::write(&dst, &old).unwrap();
    // Without --overwrite the old file is not even opened.
    let (st, err) = run(&["copy", s(&src), s(&dst)]);
    assert!(
        std::fs::read(&dst).unwrap() == old,
        "the old file is intact"
    );
    assert_eq!(st.code(), Some(1), "{err}");
    let (st, err) = run(&["copy", s(&src), s(&dst), "--overwrite"]);
    assert_eq!(st.code(), Some(1), "{err}");
    assert!(
        err.contains(&format!("no space left for {}", dst.display()))
            && err.contains("16777216 bytes (16 MiB) needed"),
        "{err}"
    );
    assert!(
        std::fs::read(&dst).unwrap() == old,
        "the old file is intact"
    );
    assert!(temporaries(m.dir.path()).is_empty());

    // Fill the file system to the last block, then capture into it.
    let snap = m.dir.path().join("snap.tar.gz");
    std::fs::write(&snap, b"old snapshot").unwrap();
    let filler = m.dir.path().join("filler");
    {
        use std::io::Write;
        let mut w = std::fs::File::create(&filler).unwrap();
        let block = vec![1u8; 4096];
        while w.write_all(&block).is_ok() {}
    }
    for (args, keeps) in [
        (
            vec!["topo", "capture", "-o", s(&snap), "--overwrite"],
            Some(&b"old snapshot"[..]),
        ),
        (
            vec!["topo", "capture", "-o", s(&m.dir.path().join("fresh"))],
            None,
        ),
    ] {
        let (st, err) = run(&args);
        assert_eq!(st.code(), Some(1), "{}: {err}", args.join(" "));
        assert!(err.contains("no space left for"), "{err}");
        match keeps {
            Some(k) => assert_eq!(std::fs::read(&snap).unwrap(), k),
            None => assert!(!m.dir.path().join("fresh").exists(), "no 0-byte snapshot"),
        }
        assert!(temporaries(m.dir.path()).is_empty());
    }
}

/// Item 1: a block device (a loop device over a file of zeros) given to `bench storage`,
/// `copy` and `topo capture` is refused and not written. On main `bench storage --file
/// /dev/loopN --size 16MiB` wrote 16 MiB of test pattern into it.
#[test]
fn a_block_device_is_never_written() {
    let dir = disk_dir();
    let img = dir.path().join("disk.img");
    std::fs::write(&img, vec![0u8; 32 << 20]).unwrap();
    let out = Command::new("losetup")
        .args(["-f", "--show", s(&img)])
        .output();
    let dev = match out {
        Ok(o) if o.status.success() => String::from_utf8(o.stdout).unwrap().trim().to_owned(),
        _ => {
            eprintln!("skipped: losetup is not permitted here (needs root; CI runs as root)");
            return;
        }
    };
    struct Detach(String);
    impl Drop for Detach {
        fn drop(&mut self) {
            let _ = Command::new("losetup").args(["-d", &self.0]).status();
        }
    }
    let _detach = Detach(dev.clone());
    let src = dir.path().join("src");
    std::fs::write(&src, data(1 << 20, 11)).unwrap();
    for args in [
        vec!["bench", "storage", "--file", &dev, "--size", "16MiB"],
        vec![
            "bench",
            "storage",
            "--file",
            &dev,
            "--size",
            "16MiB",
            "--overwrite",
        ],
        vec![
            "bench",
            "storage",
            "--file",
            &dev,
            "--size",
            "16MiB",
            "--write",
            "--overwrite",
        ],
        vec!["copy", s(&src), &dev, "--overwrite"],
        vec!["topo", "capture", "-o", &dev, "--overwrite"],
    ] {
        let (st, err) = run(&args);
        let line = args.join(" ");
        let mut back = vec![0u8; 32 << 20];
        std::fs::File::open(&dev)
            .unwrap()
            .read_exact(&mut back)
            .unwrap();
        assert!(
            back.iter().all(|&b| b == 0),
            "{line}: the device was written"
        );
        assert_eq!(st.code(), Some(1), "{line}: {err}");
        assert!(
            err.contains("is a block device, not a regular file"),
            "{err}"
        );
    }
}
