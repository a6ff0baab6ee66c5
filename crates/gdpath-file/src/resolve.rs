//! Finding the file a write creates or replaces: every component of the path, and of the text
//! of every symbolic link met on the way, is opened here one at a time relative to the
//! directory reached so far (`openat(O_PATH | O_NOFOLLOW)`, then `fstat`), so that every link,
//! in a directory of the path as at its end, is seen and checked before it is followed:
//!
//! - the kernel's `protected_symlinks` rule, whatever the sysctl says
//!   (Documentation/admin-guide/sysctl/fs.rst): a link in a sticky, world-writable directory
//!   (`/tmp`) is followed only by its owner or when the directory's owner owns it too. Without
//!   it, anyone who may create names there can point a name at a file or directory of another
//!   user and wait for a privileged writer to replace that file; with
//!   `fs.protected_symlinks=0` (or a container that leaves it so) the kernel does not check,
//!   so the writer does;
//! - magic links of `/proc` (`/proc/PID/fd/N`, `cwd`, `root`, `exe`, ...), which lead to an
//!   open file or a process's directory rather than to a name, are refused (the kernel's
//!   `RESOLVE_NO_MAGICLINKS`);
//! - at most 40 links in all (the kernel's `MAXSYMLINKS`, then `ELOOP`).
//!
//! `..` is opened relative to the directory reached so far, as the kernel resolves it (after a
//! link, the parent of where the link led). Each component costs an `openat` and an `fstat`; a
//! link adds the directory's `fstat` and `fstatfs` and a `readlinkat`.

use crate::error::{Error, Result};
use rustix::fs::{fstatfs, openat, openat2, readlinkat, Mode, OFlags, ResolveFlags, CWD};
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

/// `S_ISVTX | S_IWOTH`: the directory mode the `protected_symlinks` rule guards (sticky and
/// world-writable).
const STICKY_WORLD_WRITABLE: u32 = 0o1002;

/// `S_IWGRP | S_IWOTH`: a sticky directory writable by these is guarded by
/// `protected_regular=2`.
const GROUP_OR_WORLD_WRITABLE: u32 = 0o022;

/// The inode number of procfs's root directory (`PROC_ROOT_INO`, fs/proc/internal.h): its
/// links (`self`, `thread-self`, `mounts`, `net`) are plain ones.
const PROC_ROOT_INO: u64 = 1;

/// The file a write to a path creates or replaces.
#[derive(Debug)]
pub(super) struct Resolved {
    /// Its directory, opened `O_PATH`: the temporary is made and renamed relative to it, so a
    /// directory renamed or swapped after the checks cannot redirect the write.
    pub dir: File,
    /// A path of that directory, for messages: the parent as given, or the directory's real
    /// path when the last component was a link that was followed.
    pub dir_path: PathBuf,
    /// Its name in `dir`.
    pub name: OsString,
    /// Its path: the one given when its last component is no link, else the real path of the
    /// file the link leads to.
    pub path: PathBuf,
    /// Whether the path's last component was a symbolic link, followed to reach it.
    pub linked: bool,
    /// The regular file there now, opened `O_PATH | O_NOFOLLOW`, and its status; `None` when
    /// nothing is there.
    pub existing: Option<(File, Metadata)>,
}

/// Resolves `target` for a write: its directories and the directories of every link's text
/// are walked component by component (see the module's docs), and its last component, when it
/// is a link, is followed the same way.
///
/// Errors: [`Error::SymlinkRefused`] for a link the rule forbids following;
/// [`Error::MagicLinkRefused`] for a magic link of `/proc`; [`Error::NotAFile`] for a
/// directory, device, FIFO, socket, a path that can only name a directory (ending in `/`, `.`
/// or `..`) or a link that leads nowhere; [`Error::CreateIn`] when a directory of the path
/// does not exist; [`Error::Open`] for other failures (`ELOOP` past [`MAX_LINKS`] links,
/// `ENOTDIR`, permission).
pub(super) fn resolve(target: &Path) -> Result<Resolved> {
    let (parent, name) = split(target).ok_or_else(|| directory_path(target))?;
    let mut w = Walk::start(target)?;
    let missing = |e: Errno| Error::CreateIn {
        dir: parent.clone(),
        source: Arc::new(e.into()),
    };
    w.dirs(parent.as_os_str().as_bytes(), &missing)?;
    let mut name = name;
    let mut linked = false;
    loop {
        // The entry itself, never what it points to: its status and, for a link, its text
        // come from one inode, so a name swapped between the two cannot mix them.
        let shown = if linked {
            w.shown.join(&name)
        } else {
            target.to_owned()
        };
        let entry = match w.entry(&name) {
            Ok(fd) => fd,
            Err(Errno::NOENT) if linked => return Err(dangling(target)),
            Err(Errno::NOENT) => {
                return Ok(Resolved {
                    dir: w.dir,
                    dir_path: parent,
                    name,
                    path: target.to_owned(),
                    linked: false,
                    existing: None,
                })
            }
            Err(e) => return Err(open_error(&shown, e)),
        };
        let md = status(&entry, &shown)?;
        if md.file_type().is_symlink() {
            let (text, _) = w.follow(&entry, &md, &name, &shown)?;
            linked = true;
            let (to_dir, to_name) = split(&text).ok_or_else(|| Error::NotAFile {
                path: shown.clone(),
                what: "a symbolic link to a directory",
            })?;
            let dangles = |_: Errno| dangling(target);
            w.dirs(to_dir.as_os_str().as_bytes(), &dangles)?;
            name = to_name;
            continue;
        }
        if let Some(what) = super::special_kind(&md) {
            return Err(Error::NotAFile { path: shown, what });
        }
        let (dir_path, path) = if linked {
            let d = real_path(&w.dir).unwrap_or_else(|| w.shown.clone());
            let p = d.join(&name);
            (d, p)
        } else {
            (parent, target.to_owned())
        };
        return Ok(Resolved {
            dir: w.dir,
            dir_path,
            name,
            path,
            linked,
            existing: Some((entry, md)),
        });
    }
}

/// A walk through a path: the directory reached so far, its path as the walk spelled it (for
/// messages), and the links followed.
struct Walk<'a> {
    target: &'a Path,
    dir: File,
    shown: PathBuf,
    links: usize,
}

impl<'a> Walk<'a> {
    /// At the current directory ([`Walk::dirs`] goes to the root for an absolute path).
    fn start(target: &'a Path) -> Result<Walk<'a>> {
        Ok(Walk {
            target,
            dir: open_dir(CWD, ".").map_err(|e| open_error(target, e))?,
            shown: PathBuf::new(),
            links: 0,
        })
    }

    fn go_to_root(&mut self) -> Result<()> {
        self.dir = open_dir(CWD, "/").map_err(|e| open_error(self.target, e))?;
        self.shown = PathBuf::from("/");
        Ok(())
    }

    /// `name` in the directory reached, opened `O_PATH | O_NOFOLLOW`.
    fn entry(&self, name: &std::ffi::OsStr) -> std::result::Result<File, Errno> {
        openat(
            &self.dir,
            name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        )
        .map(File::from)
    }

    /// Walks `path`, every component of which must be a directory (or a link to one), from
    /// the directory reached (from the root when it is absolute). `missing` makes the error
    /// for a component that does not exist.
    fn dirs(&mut self, path: &[u8], missing: &dyn Fn(Errno) -> Error) -> Result<()> {
        if path.starts_with(b"/") {
            self.go_to_root()?;
        }
        // The components still to walk, the next one last (a link's text is pushed in its
        // place), each with whether messages show it.
        let mut pending: Vec<(Vec<u8>, bool)> =
            components(path).rev().map(|c| (c.to_vec(), true)).collect();
        while let Some((c, show)) = pending.pop() {
            let name = std::ffi::OsStr::from_bytes(&c);
            match &c[..] {
                b"." => continue,
                b".." => {
                    // The parent of the directory reached, as the kernel takes it (at `/` it
                    // stays `/`).
                    self.dir = open_dir(&self.dir, "..").map_err(|e| open_error(self.target, e))?;
                    if show {
                        self.shown.push("..");
                    }
                    continue;
                }
                _ => {}
            }
            let shown = self.shown.join(name);
            let entry = match self.entry(name) {
                Ok(f) => f,
                Err(Errno::NOENT) => return Err(missing(Errno::NOENT)),
                Err(e) => return Err(open_error(self.target, e)),
            };
            let md = status(&entry, &shown)?;
            if md.file_type().is_symlink() {
                let (text, keep_name) = self.follow(&entry, &md, name, &shown)?;
                let bytes = text.as_os_str().as_bytes();
                if bytes.is_empty() {
                    return Err(missing(Errno::NOENT));
                }
                if bytes.starts_with(b"/") {
                    self.go_to_root()?;
                }
                // `/proc/self` stays so in messages, not `/proc/1234`.
                if keep_name {
                    self.shown = shown;
                }
                pending.extend(components(bytes).rev().map(|c| (c.to_vec(), !keep_name)));
                continue;
            }
            if !md.is_dir() {
                return Err(open_error(self.target, Errno::NOTDIR));
            }
            self.dir = entry;
            if show {
                self.shown = shown;
            }
        }
        Ok(())
    }

    /// Checks the link `entry` (status `md`, named `name` in the directory reached, `shown` in
    /// messages) and returns its text, and whether it is a plain link of procfs's root
    /// (`self`, `thread-self`: messages keep its name); refused by the `protected_symlinks`
    /// rule ([`check_link`]), as a magic link of `/proc`, or past [`MAX_LINKS`] links.
    fn follow(
        &mut self,
        entry: &File,
        md: &Metadata,
        name: &std::ffi::OsStr,
        shown: &Path,
    ) -> Result<(PathBuf, bool)> {
        check_link(&self.dir, &self.shown, shown, md)?;
        let proc = proc_link(&self.dir, name);
        if proc == Some(true) {
            return Err(Error::MagicLinkRefused {
                path: self.target.to_owned(),
                link: shown.to_owned(),
            });
        }
        self.links += 1;
        if self.links > MAX_LINKS {
            return Err(open_error(self.target, Errno::LOOP));
        }
        let text = readlinkat(entry, "", Vec::new()).map_err(|e| open_error(shown, e))?;
        Ok((
            PathBuf::from(OsString::from_vec(text.into_bytes())),
            proc.is_some(),
        ))
    }
}

/// The non-empty components of `path` (`a//b/` → `a`, `b`).
fn components(path: &[u8]) -> impl DoubleEndedIterator<Item = &[u8]> {
    path.split(|&b| b == b'/').filter(|c| !c.is_empty())
}

/// `path` in `dir`, opened `O_PATH | O_DIRECTORY` (following a link: only `.`, `..` and `/`
/// are opened so, which are none).
fn open_dir(dir: impl AsFd, path: &str) -> std::result::Result<File, Errno> {
    openat(
        dir,
        path,
        OFlags::PATH | OFlags::DIRECTORY | OFlags::CLOEXEC,
        Mode::empty(),
    )
    .map(File::from)
}

/// `fstat` of `f`, named `shown` in errors.
fn status(f: &File, shown: &Path) -> Result<Metadata> {
    f.metadata()
        .map_err(|e| open_error(shown, Errno::from_io_error(&e).unwrap_or(Errno::IO)))
}

/// What the link `name` in the directory `dir` is to procfs: `None` off procfs, `Some(true)`
/// for a magic link (one `openat2(RESOLVE_NO_MAGICLINKS)` refuses to follow, `ELOOP`; where
/// `openat2` is missing, before Linux 5.6 or under a seccomp filter, any link of procfs
/// outside its root directory, which holds the only plain ones), `Some(false)` for a plain
/// link of procfs (`/proc/self`).
fn proc_link(dir: &File, name: &std::ffi::OsStr) -> Option<bool> {
    // `PROC_SUPER_MAGIC` (include/uapi/linux/magic.h): `statfs`'s `f_type` of procfs.
    let on_proc = fstatfs(dir).is_ok_and(|s| s.f_type == libc::PROC_SUPER_MAGIC);
    if !on_proc {
        return None;
    }
    Some(
        match openat2(
            dir,
            name,
            OFlags::PATH | OFlags::CLOEXEC,
            Mode::empty(),
            ResolveFlags::NO_MAGICLINKS,
        ) {
            Err(Errno::LOOP) => true,
            Err(Errno::NOSYS | Errno::PERM) => {
                dir.metadata().is_ok_and(|d| d.ino() != PROC_ROOT_INO)
            }
            _ => false,
        },
    )
}

/// The `protected_symlinks` rule applied to the link `link` (status `md`) in the directory
/// `dir` (`dir_path` in messages), whatever the sysctl says: refused when `dir` is sticky and
/// world-writable and the link's owner is neither this process's effective uid (the kernel
/// compares the file-system uid, which is the effective one unless `setfsuid` set it apart)
/// nor `dir`'s owner. Errors: [`Error::SymlinkRefused`]; [`Error::Open`] when `dir` cannot be
/// examined.
fn check_link(dir: &File, dir_path: &Path, link: &Path, md: &Metadata) -> Result<()> {
    match refused_by(follows, dir, dir_path, md)? {
        None => Ok(()),
        Some(dir) => Err(Error::SymlinkRefused {
            link: link.to_owned(),
            owner: md.uid(),
            dir,
        }),
    }
}

/// The `protected_regular=2` rule applied to the regular file `path` (status `md`) in the
/// directory `dir` (`dir_path` in messages), whatever the sysctl says: a write that replaces or
/// writes into it is refused when `dir` is sticky and world- or group-writable and the file's
/// owner is neither the writer (effective uid) nor `dir`'s owner (fs/namei.c,
/// `may_create_in_sticky`). Errors: [`Error::ForeignFileRefused`]; [`Error::Open`] when `dir`
/// cannot be examined.
pub(super) fn check_owner(dir: &File, dir_path: &Path, path: &Path, md: &Metadata) -> Result<()> {
    match refused_by(may_write, dir, dir_path, md)? {
        None => Ok(()),
        Some(dir) => Err(Error::ForeignFileRefused {
            path: path.to_owned(),
            owner: md.uid(),
            dir,
        }),
    }
}

/// Applies `rule` (one of [`follows`], [`may_write`]) to the entry of status `md` in the
/// directory `dir` and this process: `Some(dir_path)`, as messages show it, when it refuses.
fn refused_by(
    rule: fn(u32, u32, u32, u32) -> bool,
    dir: &File,
    dir_path: &Path,
    md: &Metadata,
) -> Result<Option<PathBuf>> {
    let d = status(dir, dir_path)?;
    Ok((!rule(d.mode(), d.uid(), md.uid(), writer())).then(|| dot(dir_path).to_owned()))
}

/// This process's effective uid: the writer the rules compare owners with.
fn writer() -> u32 {
    rustix::process::geteuid().as_raw()
}

/// The `protected_symlinks` rule itself: whether a link owned by `link_owner` in a directory of
/// mode `dir_mode` owned by `dir_owner` may be followed by a process of uid `writer`.
fn follows(dir_mode: u32, dir_owner: u32, link_owner: u32, writer: u32) -> bool {
    link_owner == writer
        || dir_mode & STICKY_WORLD_WRITABLE != STICKY_WORLD_WRITABLE
        || link_owner == dir_owner
}

/// The `protected_regular=2` rule itself: whether a regular file owned by `owner` in a
/// directory of mode `dir_mode` owned by `dir_owner` may be replaced by a process of uid
/// `writer`.
fn may_write(dir_mode: u32, dir_owner: u32, owner: u32, writer: u32) -> bool {
    owner == writer
        || owner == dir_owner
        || dir_mode & 0o1000 == 0
        || dir_mode & GROUP_OR_WORLD_WRITABLE == 0
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
    fn the_regular_file_rule_is_the_kernels_protected_regular_2() {
        // Another user's file in /tmp (1777) or a sticky group-writable directory (1770):
        // refused; the writer's own, or the directory owner's: written.
        assert!(!may_write(0o41777, 0, 65534, 0));
        assert!(!may_write(0o41770, 0, 65534, 0));
        assert!(may_write(0o41777, 0, 0, 0));
        assert!(
            may_write(0o41777, 1000, 1000, 0),
            "the directory owner's file"
        );
        assert!(may_write(0o41777, 0, 1000, 1000));
        // Not sticky, or sticky but writable by its owner only: not guarded.
        assert!(may_write(0o40777, 0, 65534, 0));
        assert!(may_write(0o41755, 0, 65534, 0));
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
