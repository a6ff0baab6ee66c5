//! Temporary files this process made: removed when dropped, when a signal handler asks, and,
//! once their process is gone, by the next run. A temporary an [`super::AtomicFile`] made is
//! removed relative to the handle of its directory (`unlinkat`), never by a path, which a
//! directory renamed meanwhile would send elsewhere.

use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// The part of every temporary's name that marks it as gdpath's: a temporary for `dir/NAME` is
/// `dir/.NAME.gdpath-tmp-PID-RANDOM` (PID: the process that made it, RANDOM: 16 hex digits).
pub const TEMP_MARKER: &str = ".gdpath-tmp-";

/// Where a temporary is: a path, or a name in a directory held open.
#[derive(Debug, Clone)]
enum Place {
    Path(PathBuf),
    At(Arc<File>, OsString),
}

impl Place {
    /// Removes the file; `ENOENT` is an error too (the caller tells it apart).
    fn remove(&self) -> std::io::Result<()> {
        match self {
            Place::Path(p) => std::fs::remove_file(p),
            Place::At(dir, name) => {
                rustix::fs::unlinkat(dir, name, rustix::fs::AtFlags::empty()).map_err(Into::into)
            }
        }
    }
}

/// The temporaries alive in this process, by id, for [`remove_live_temporaries`].
static LIVE: Mutex<Vec<(u64, Place)>> = Mutex::new(Vec::new());

/// The next [`Temporary`]'s id.
static NEXT: AtomicU64 = AtomicU64::new(0);

fn live() -> MutexGuard<'static, Vec<(u64, Place)>> {
    // Only places are kept under this lock: a panic while holding it leaves a usable list.
    LIVE.lock().unwrap_or_else(|p| p.into_inner())
}

/// A file this process created that is removed when this value drops, unless
/// [`Temporary::keep`] was called; while it lives, [`remove_live_temporaries`] removes it too
/// (a signal handler's thread calls that before ending the process).
#[derive(Debug)]
pub struct Temporary {
    id: u64,
    path: PathBuf,
    place: Place,
    armed: bool,
}

impl Temporary {
    /// Takes charge of removing `path` (a file the caller created), by that path.
    pub fn adopt(path: impl Into<PathBuf>) -> Temporary {
        let path = path.into();
        Self::register(path.clone(), Place::Path(path))
    }

    /// Takes charge of removing `name` in the directory open as `dir` (`unlinkat`); `path`
    /// names it in messages.
    pub(super) fn adopt_at(dir: &Arc<File>, name: &OsStr, path: PathBuf) -> Temporary {
        Self::register(path, Place::At(dir.clone(), name.to_owned()))
    }

    fn register(path: PathBuf, place: Place) -> Temporary {
        let id = NEXT.fetch_add(1, Ordering::Relaxed);
        live().push((id, place.clone()));
        Temporary {
            id,
            path,
            place,
            armed: true,
        }
    }

    /// The file's path.
    pub fn path(&self) -> &Path {
        &self.path
    }

    /// No longer removes the file (it was renamed away, or is kept on purpose).
    pub fn keep(mut self) -> PathBuf {
        self.disarm();
        std::mem::take(&mut self.path)
    }

    /// Stops removing the file (the commit renamed it away).
    pub(super) fn disarm(&mut self) {
        if self.armed {
            self.armed = false;
            let mut l = live();
            if let Some(i) = l.iter().position(|(id, _)| *id == self.id) {
                l.swap_remove(i);
            }
        }
    }
}

impl Drop for Temporary {
    fn drop(&mut self) {
        if self.armed {
            self.disarm();
            if let Err(e) = self.place.remove() {
                if e.kind() != std::io::ErrorKind::NotFound {
                    tracing::warn!(
                        "cannot remove the temporary {}: {e}",
                        gdpath_topo::text::escape(&self.path)
                    );
                }
            }
        }
    }
}

/// Removes every [`Temporary`] alive in this process and returns how many files it removed.
/// For the thread that handles SIGINT/SIGTERM just before it ends the process: a temporary an
/// [`super::AtomicFile`] is renaming at that moment is either renamed (its target is then
/// complete: it was synced first) or removed (its rename fails and the old target stays).
///
/// The registry stays locked afterwards, so another thread's [`Temporary::adopt`] (which an
/// `AtomicFile` calls before it creates its file) blocks until the process ends instead of
/// creating a file nobody removes: call it only on the way out.
pub fn remove_live_temporaries() -> usize {
    let mut registry = live();
    let removed = registry
        .drain(..)
        .filter(|(_, place)| place.remove().is_ok())
        .count();
    std::mem::forget(registry);
    removed
}

/// Longest part of the target's name kept in a temporary's name, in bytes: with the marker, the
/// process id and the random part the name stays below `NAME_MAX` (255).
const NAME_KEPT: usize = 200;

/// `.NAME.gdpath-tmp-` for a target named `name` (its first [`NAME_KEPT`] bytes).
fn prefix(name: &OsStr) -> OsString {
    let b = name.as_bytes();
    let mut p = b".".to_vec();
    p.extend_from_slice(&b[..b.len().min(NAME_KEPT)]);
    p.extend_from_slice(TEMP_MARKER.as_bytes());
    OsString::from_vec(p)
}

/// A fresh temporary's name for a target named `name`, made by this process.
pub(super) fn temp_name(name: &OsStr, random: u64) -> OsString {
    let mut n = prefix(name);
    n.push(format!("{}-{random:016x}", std::process::id()));
    n
}

/// Whether process `pid` exists (`kill(pid, 0)`; a process of another user exists too).
fn alive(pid: i32) -> bool {
    use nix::sys::signal::kill;
    use nix::unistd::Pid;
    !matches!(
        kill(Pid::from_raw(pid), None),
        Err(nix::errno::Errno::ESRCH)
    )
}

/// Removes the temporaries that earlier runs left for `target` when they were killed
/// (`SIGKILL`, a crash): files of `target`'s directory named as [`TEMP_MARKER`] says whose
/// process no longer exists. Returns how many were removed; a directory that cannot be read
/// removes none. A temporary of a live process, this one's included, is left alone (a process
/// of another PID namespace sharing the directory looks dead here: its rename then fails and
/// its target stays as it was).
pub fn remove_stale_temporaries(target: &Path) -> usize {
    let (Some(dir), Some(name)) = (target.parent(), target.file_name()) else {
        return 0;
    };
    let dir = if dir.as_os_str().is_empty() {
        Path::new(".")
    } else {
        dir
    };
    match File::open(dir) {
        Ok(d) => remove_stale_in(&d, name, dir),
        Err(_) => 0,
    }
}

/// [`remove_stale_temporaries`] for the target named `name` in the directory open as `dir`
/// (any descriptor of it, `O_PATH` too; `shown` in messages): listed and removed relative to
/// that descriptor.
pub(super) fn remove_stale_in(dir: &File, name: &OsStr, shown: &Path) -> usize {
    use rustix::fs::{openat, statat, unlinkat, AtFlags, Dir, FileType, Mode, OFlags};
    let prefix = prefix(name);
    let Ok(listing) = openat(
        dir,
        ".",
        OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    ) else {
        return 0;
    };
    let Ok(entries) = Dir::read_from(&listing) else {
        return 0;
    };
    let mut removed = 0;
    for e in entries.flatten() {
        let n = OsStr::from_bytes(e.file_name().to_bytes());
        let Some(rest) = n.as_bytes().strip_prefix(prefix.as_bytes()) else {
            continue;
        };
        let Some(pid) = std::str::from_utf8(rest)
            .ok()
            .and_then(|r| r.split_once('-'))
            .and_then(|(pid, _)| pid.parse::<i32>().ok())
            .filter(|&p| p > 0)
        else {
            continue;
        };
        if pid as u32 == std::process::id() || alive(pid) {
            continue;
        }
        let is_file = statat(dir, n, AtFlags::SYMLINK_NOFOLLOW)
            .is_ok_and(|st| FileType::from_raw_mode(st.st_mode) == FileType::RegularFile);
        if is_file && unlinkat(dir, n, AtFlags::empty()).is_ok() {
            tracing::info!(
                "removed {} (left by a killed run)",
                gdpath_topo::text::escape(&shown.join(n))
            );
            removed += 1;
        }
    }
    removed
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_temporary_is_removed_on_drop_and_kept_when_asked() {
        let dir = tempfile::tempdir().unwrap();
        let a = dir.path().join("a");
        std::fs::write(&a, b"1").unwrap();
        drop(Temporary::adopt(&a));
        assert!(!a.exists());
        std::fs::write(&a, b"1").unwrap();
        let kept = Temporary::adopt(&a).keep();
        assert_eq!(kept, a);
        assert!(a.exists());
        assert!(
            !live()
                .iter()
                .any(|(_, p)| matches!(p, Place::Path(x) if *x == a)),
            "a kept temporary is no longer listed"
        );
    }

    #[test]
    fn only_the_temporaries_of_dead_processes_are_stale() {
        let dir = tempfile::tempdir().unwrap();
        let target = dir.path().join("out.bin");
        // A process that has exited and been reaped: its id is free (until reused).
        let mut child = std::process::Command::new("true").spawn().unwrap();
        let dead = child.id();
        child.wait().unwrap();
        let stale = dir
            .path()
            .join(format!(".out.bin{TEMP_MARKER}{dead}-00000000000000ff"));
        let ours = dir.path().join(temp_name(OsStr::new("out.bin"), 1));
        let other = dir
            .path()
            .join(format!(".other{TEMP_MARKER}{dead}-00000000000000ff"));
        for p in [&stale, &ours, &other] {
            std::fs::write(p, b"partial").unwrap();
        }
        if alive(dead as i32) {
            eprintln!("skipped: pid {dead} was reused at once");
            return;
        }
        assert_eq!(remove_stale_temporaries(&target), 1);
        assert!(!stale.exists());
        assert!(ours.exists(), "this process's own temporary stays");
        assert!(other.exists(), "another target's temporary stays");
    }
}
