//! Finding the file a write creates or replaces: a symbolic link at the end of the path is
//! followed one link at a time, relative to directory handles, with the kernel's
//! `protected_symlinks` rule applied to every link whatever the sysctl says.
//!
//! The rule (Documentation/admin-guide/sysctl/fs.rst, `protected_symlinks`): a link in a
//! sticky, world-writable directory (`/tmp`) is followed only by its owner or when the
//! directory's owner owns it too. Without it, anyone who may create names there can point a
//! name at a file of another user and wait for a privileged writer to replace that file; with
//! `fs.protected_symlinks=0` (or a container that leaves it so) the kernel does not check, so
//! the writer does.

use crate::error::{Error, Result};
use rustix::fs::{openat, openat2, readlinkat, Mode, OFlags, ResolveFlags, CWD};
use rustix::io::Errno;
use std::ffi::OsString;
use std::fs::{File, Metadata};
use std::os::fd::{AsFd, AsRawFd};
use std::os::unix::ffi::{OsStrExt, OsStringExt};
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// The most symbolic links one resolution follows: the kernel's `MAXSYMLINKS`
/// (include/linux/namei.h), past which `open(2)` fails with `ELOOP`.
const MAX_LINKS: usize = 40;

/// `S_ISVTX | S_IWOTH`: the directory mode the rule guards (sticky and world-writable).
const STICKY_WORLD_WRITABLE: u32 = 0o1002;

/// The file a write to a path creates or replaces.
#[derive(Debug)]
pub(super) struct Resolved {
    /// Its directory, opened `O_PATH`: the temporary is made and renamed relative to it, so a
    /// directory renamed or swapped after the checks cannot redirect the write.
    pub dir: File,
    /// A path of that directory, for messages and the temporaries' registry: the parent as
    /// given, or the directory's real path when a link was followed.
    pub dir_path: PathBuf,
    /// Its name in `dir`.
    pub name: OsString,
    /// Its path: the one given when no link was followed, else the real path of the file the
    /// link leads to.
    pub path: PathBuf,
    /// Whether a symbolic link was followed to reach it.
    pub linked: bool,
    /// The regular file there now, opened `O_PATH | O_NOFOLLOW`, and its status; `None` when
    /// nothing is there.
    pub existing: Option<(File, Metadata)>,
}

/// Resolves `target` for a write. The directories of the path are opened by the kernel
/// (`open(O_PATH | O_DIRECTORY)`, as `open(2)` resolves them); its last component, when it is
/// a symbolic link, is followed here: read with `readlinkat`, its directories opened relative
/// to the link's (`openat2` with `RESOLVE_NO_MAGICLINKS` where the kernel has it: a link's
/// text must not jump through `/proc/PID/fd/N` or `/proc/PID/root`), and so on for at most
/// [`MAX_LINKS`] links, each checked by [`check_link`].
///
/// Errors: [`Error::SymlinkRefused`] for a link the rule forbids following;
/// [`Error::NotAFile`] for a directory, device, FIFO, socket, a path that can only name a
/// directory (ending in `/`, `.` or `..`) or a link that leads nowhere; [`Error::CreateIn`]
/// when the target's directory does not exist; [`Error::Open`] for other failures (`ELOOP`
/// past [`MAX_LINKS`] links, permission).
pub(super) fn resolve(target: &Path) -> Result<Resolved> {
    let (parent, name) = split(target).ok_or_else(|| directory_path(target))?;
    let open_failed = |e: Errno| match e {
        Errno::NOENT => Error::CreateIn {
            dir: parent.clone(),
            source: Arc::new(e.into()),
        },
        e => open_error(target, e),
    };
    let mut dir = File::from(
        openat(
            CWD,
            dot(&parent),
            OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map_err(open_failed)?,
    );
    let mut dir_path = parent;
    let mut name = name;
    let mut links = 0;
    loop {
        // The entry itself, never what it points to: its status and, for a link, its text
        // come from one inode, so a name swapped between the two cannot mix them.
        let shown = if links == 0 {
            target.to_owned()
        } else {
            dir_path.join(&name)
        };
        let entry = match openat(
            &dir,
            &name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => File::from(fd),
            Err(Errno::NOENT) if links > 0 => return Err(dangling(target)),
            Err(Errno::NOENT) => {
                return Ok(Resolved {
                    dir,
                    dir_path,
                    name,
                    path: target.to_owned(),
                    linked: false,
                    existing: None,
                })
            }
            Err(e) => return Err(open_error(&shown, e)),
        };
        let md = entry
            .metadata()
            .map_err(|e| open_error(&shown, Errno::from_io_error(&e).unwrap_or(Errno::IO)))?;
        if md.file_type().is_symlink() {
            check_link(&dir, &dir_path, &shown, &md)?;
            links += 1;
            if links > MAX_LINKS {
                return Err(open_error(target, Errno::LOOP));
            }
            let text = readlinkat(&entry, "", Vec::new()).map_err(|e| open_error(&shown, e))?;
            let text = PathBuf::from(OsString::from_vec(text.into_bytes()));
            let (to_dir, to_name) = split(&text).ok_or_else(|| Error::NotAFile {
                path: shown.clone(),
                what: "a symbolic link to a directory",
            })?;
            let next = open_linked_dir(&dir, &to_dir).map_err(|e| match e {
                Errno::NOENT => dangling(target),
                e => open_error(&shown, e),
            })?;
            dir_path = real_path(&next).unwrap_or_else(|| dir_path.join(&to_dir));
            dir = next;
            name = to_name;
            continue;
        }
        if let Some(what) = super::special_kind(&md) {
            return Err(Error::NotAFile { path: shown, what });
        }
        let path = if links == 0 {
            target.to_owned()
        } else {
            dir_path.join(&name)
        };
        return Ok(Resolved {
            dir,
            dir_path,
            name,
            path,
            linked: links > 0,
            existing: Some((entry, md)),
        });
    }
}

/// Applies the kernel's `protected_symlinks` rule to the link `link` (status `md`) in the
/// directory `dir`, whatever the sysctl says: refused when `dir` is sticky and world-writable
/// and the link's owner is neither this process's effective uid (the kernel compares the
/// file-system uid, which is the effective one unless `setfsuid` set it apart) nor `dir`'s
/// owner. Errors: [`Error::SymlinkRefused`]; [`Error::Open`] when `dir` cannot be examined.
fn check_link(dir: &File, dir_path: &Path, link: &Path, md: &Metadata) -> Result<()> {
    let d = dir
        .metadata()
        .map_err(|e| open_error(dir_path, Errno::from_io_error(&e).unwrap_or(Errno::IO)))?;
    let writer = rustix::process::geteuid().as_raw();
    if follows(d.mode(), d.uid(), md.uid(), writer) {
        return Ok(());
    }
    Err(Error::SymlinkRefused {
        link: link.to_owned(),
        owner: md.uid(),
        dir: dot(dir_path).to_owned(),
    })
}

/// The rule itself: whether a link owned by `link_owner` in a directory of mode `dir_mode`
/// owned by `dir_owner` may be followed by a process of uid `writer`.
fn follows(dir_mode: u32, dir_owner: u32, link_owner: u32, writer: u32) -> bool {
    link_owner == writer
        || dir_mode & STICKY_WORLD_WRITABLE != STICKY_WORLD_WRITABLE
        || link_owner == dir_owner
}

/// Opens the directory part `to_dir` of a link's text, relative to the link's directory
/// `from` (an absolute text starts from the root). Magic links (`/proc/PID/fd/N`) are refused
/// where `openat2` exists; elsewhere (before Linux 5.6, or a seccomp filter that refuses it)
/// it is opened as `open(2)` would.
fn open_linked_dir(from: &File, to_dir: &Path) -> std::result::Result<File, Errno> {
    let flags = OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC;
    let to = dot(to_dir);
    match openat2(from, to, flags, Mode::empty(), ResolveFlags::NO_MAGICLINKS) {
        Err(Errno::NOSYS | Errno::PERM) => openat(from, to, flags, Mode::empty()).map(File::from),
        r => r.map(File::from),
    }
}

/// The real path of the directory open as `dir` (`/proc/self/fd/N`), if `/proc` shows one.
fn real_path(dir: &impl AsFd) -> Option<PathBuf> {
    let p = std::fs::read_link(format!("/proc/self/fd/{}", dir.as_fd().as_raw_fd())).ok()?;
    p.is_absolute().then_some(p)
}

/// `path` split into its directory (`.` for the current one) and its last name; `None`
/// when it can only name a directory: it is empty, ends in `/`, or its last component is `.`
/// or `..`.
fn split(path: &Path) -> Option<(PathBuf, OsString)> {
    let bytes = path.as_os_str().as_bytes();
    let last = bytes.rsplit(|&b| b == b'/').next()?;
    if matches!(last, b"" | b"." | b"..") {
        return None;
    }
    let mut dir = &bytes[..bytes.len() - last.len()];
    // `a/b/` is shown as `a/b`; `/` stays.
    while dir.len() > 1 && dir.ends_with(b"/") {
        dir = &dir[..dir.len() - 1];
    }
    let dir = PathBuf::from(std::ffi::OsStr::from_bytes(dir));
    Some((
        dot(&dir).to_owned(),
        std::ffi::OsStr::from_bytes(last).to_owned(),
    ))
}

/// `p`, or `.` for the empty path (the current directory).
fn dot(p: &Path) -> &Path {
    if p.as_os_str().is_empty() {
        Path::new(".")
    } else {
        p
    }
}

fn open_error(path: &Path, e: Errno) -> Error {
    Error::Open {
        path: path.to_owned(),
        source: Arc::new(e.into()),
    }
}

fn dangling(target: &Path) -> Error {
    Error::NotAFile {
        path: target.to_owned(),
        what: "a dangling symbolic link",
    }
}

fn directory_path(target: &Path) -> Error {
    Error::NotAFile {
        path: target.to_owned(),
        what: "a directory path (it ends in /, . or ..)",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_rule_is_the_kernels() {
        let sticky_ww = 0o41777;
        // Another user's link in /tmp: refused; the writer's own, or the directory owner's: followed.
        assert!(!follows(sticky_ww, 0, 65534, 0));
        assert!(follows(sticky_ww, 0, 0, 0));
        assert!(follows(sticky_ww, 0, 1000, 1000));
        assert!(
            follows(sticky_ww, 1000, 1000, 0),
            "the directory owner's link"
        );
        // Sticky but not world-writable, or world-writable but not sticky: not guarded.
        assert!(follows(0o41770, 0, 65534, 0));
        assert!(follows(0o40777, 0, 65534, 0));
    }

    #[test]
    fn a_path_that_can_only_name_a_directory_has_no_name() {
        for p in ["", "/", "a/", "a/.", "..", "a/..", "."] {
            assert!(split(Path::new(p)).is_none(), "{p:?}");
        }
        let (d, n) = split(Path::new("a/b/c")).unwrap();
        assert_eq!(d.as_os_str(), "a/b");
        assert_eq!(n, "c");
        let (d, n) = split(Path::new("c")).unwrap();
        assert_eq!((d.as_os_str(), n.as_os_str()), (".".as_ref(), "c".as_ref()));
        let (d, n) = split(Path::new("/c")).unwrap();
        assert_eq!((d.as_os_str(), n.as_os_str()), ("/".as_ref(), "c".as_ref()));
    }
}
