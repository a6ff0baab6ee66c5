//! Faults and bad input, as a user or a script meets them, so that none blocks, panics or
//! destroys a file: devices, FIFOs and
//! sockets given to every command that writes, destinations replaced only whole and only when
//! asked, interrupts and kills during `copy` and `bench storage`, closed and full stdout for
//! every command, arguments that do not apply refused. Real files, real signals, the real
//! binary. The tests that need root (a loop device, a small tmpfs) are here too and say when
//! they skip; [`saves`] holds the checkpoint-save checks, [`links`] the symbolic
//! links another user planted and the owner a replaced file keeps; `scripts/fault-suite.sh` runs these and the shell-level checks in CI. Here: the
//! helpers; [`files`], [`arguments`], [`stdout`] and [`interrupts`] hold the tests.

mod arguments;
#[path = "../common/mod.rs"]
mod common;
mod files;
mod interrupts;
mod links;
mod saves;
mod stdout;

use std::io::Read;
use std::os::fd::{FromRawFd, OwnedFd};
use std::os::unix::fs::{FileTypeExt, PermissionsExt};
use std::os::unix::process::ExitStatusExt;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

/// No command here may take longer: a FIFO that blocks an open fails the test, not CI.
const DEADLINE: Duration = Duration::from_secs(60);

fn h200_snapshot() -> &'static str {
    gdpath_testkit::h200x2_snapshot()
}

fn gdpath() -> Command {
    let mut c = Command::new(common::bin());
    c.stdin(Stdio::null());
    c
}

fn disk_dir() -> tempfile::TempDir {
    tempfile::tempdir_in(env!("CARGO_TARGET_TMPDIR")).unwrap()
}

/// Waits for `child` at most [`DEADLINE`]; a child still running then is killed and the test
/// fails (it hung). Returns its status and stderr.
fn wait(child: Child, what: &str) -> (ExitStatus, String) {
    let (st, _, err) = wait_output(child, what);
    (st, err)
}

/// [`wait`], returning stdout too (what a piped stdout held; a command's few lines fit a pipe).
fn wait_output(mut child: Child, what: &str) -> (ExitStatus, String, String) {
    let t0 = Instant::now();
    loop {
        if let Some(st) = child.try_wait().unwrap() {
            let (mut out, mut err) = (String::new(), String::new());
            if let Some(mut o) = child.stdout.take() {
                let _ = o.read_to_string(&mut out);
            }
            if let Some(mut e) = child.stderr.take() {
                let _ = e.read_to_string(&mut err);
            }
            return (st, out, err);
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
    let (st, _, err) = run_output(args, Stdio::null());
    (st, err)
}

/// Runs `args` with stdout to `stdout`: (status, stdout if piped, stderr).
fn run_output(args: &[&str], stdout: Stdio) -> (ExitStatus, String, String) {
    let child = gdpath()
        .args(args)
        .stdout(stdout)
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    wait_output(child, &args.join(" "))
}

fn s(p: &Path) -> &str {
    p.to_str().unwrap()
}

use gdpath_testkit::temporaries;

/// What a `SIGKILL` may leave in `dir` beside the temporaries `before` it: at most one
/// temporary of the target (its name starts with `prefix`), and where temporaries are unnamed
/// (`O_TMPFILE`, only named between link and rename) only a complete one, holding `new`.
fn assert_killed_leaves_no_partial(
    dir: &Path,
    before: &[String],
    prefix: &str,
    unnamed: bool,
    new: &[u8],
    what: &str,
) {
    let left: Vec<String> = temporaries(dir)
        .into_iter()
        .filter(|n| !before.contains(n))
        .collect();
    assert!(left.len() <= 1, "{what}: {left:?}");
    assert!(
        left.iter().all(|n| n.starts_with(prefix)),
        "{what}: {left:?}"
    );
    if unnamed {
        for n in &left {
            let len = std::fs::metadata(dir.join(n)).map_or(0, |m| m.len());
            assert!(
                std::fs::read(dir.join(n)).ok().as_deref() == Some(new),
                "{what}: a partial temporary {n} of {len} bytes is left"
            );
        }
    }
}

/// Whether the file system of `dir` makes unnamed temporaries (`O_TMPFILE`), which gdpath then
/// uses and which a `SIGKILL` cannot leave behind (elsewhere a named one stays until the next
/// run).
fn unnamed_temporaries(dir: &Path) -> bool {
    use std::os::unix::ffi::OsStrExt;
    let c = std::ffi::CString::new(dir.as_os_str().as_bytes()).unwrap();
    // SAFETY: a valid C string; the descriptor, if any, is owned and closed below.
    let fd = unsafe {
        libc::open(
            c.as_ptr(),
            libc::O_TMPFILE | libc::O_RDWR | libc::O_CLOEXEC,
            0o600,
        )
    };
    if fd < 0 {
        return false;
    }
    // SAFETY: just opened, owned by nothing else.
    drop(unsafe { OwnedFd::from_raw_fd(fd) });
    true
}

/// Whether `child` holds a file under `dir` open that has data in it: a file or temporary it is
/// writing, named or unnamed (`/proc/PID/fd` shows both).
fn writing_under(child: &Child, dir: &Path) -> bool {
    let dir = dir.canonicalize().unwrap();
    let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fd", child.id())) else {
        return false;
    };
    fds.flatten().any(|e| {
        std::fs::read_link(e.path()).is_ok_and(|t| t.starts_with(&dir))
            && std::fs::metadata(e.path()).is_ok_and(|m| m.len() > 0)
    })
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
