//! Creating or replacing a file whole: a temporary in the target's directory that takes the
//! target's name when complete. The temporary is an unnamed inode (`O_TMPFILE`) where the file
//! system allows, so that a process killed mid-write leaves nothing in the directory; elsewhere
//! it is a named file that the next run removes. Both are made and named relative to the
//! target's directory handle ([`super::resolve`]).

use super::keep::Kept;
use super::kind::is_no_space;
use super::resolve::{check_owner, resolve, Resolved};
use super::temporary::{remove_stale_in, temp_name, Temporary};
use crate::error::{Error, FileError, Result};
use rustix::fs::{linkat, openat, renameat, AtFlags, Mode, OFlags, CWD};
use rustix::io::Errno;
use std::ffi::{OsStr, OsString};
use std::fs::File;
use std::io::Write;
use std::os::fd::AsRawFd;
use std::os::unix::fs::MetadataExt;
use std::path::{Path, PathBuf};
use std::sync::Arc;

/// How [`AtomicFile`] treats an existing target and durability.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ReplaceOptions {
    /// Replace a target that exists (default `false`: [`Error::Exists`]).
    pub overwrite: bool,
    /// `fsync` the file before the rename and its directory after (default `true`). Without
    /// it a power loss soon after the commit may leave the target empty or old on some file
    /// systems; a process failure still never leaves a partial target.
    pub fsync: bool,
}

impl Default for ReplaceOptions {
    fn default() -> Self {
        ReplaceOptions {
            overwrite: false,
            fsync: true,
        }
    }
}

impl ReplaceOptions {
    /// Sets [`ReplaceOptions::overwrite`].
    pub fn overwrite(mut self, yes: bool) -> Self {
        self.overwrite = yes;
        self
    }
    /// Sets [`ReplaceOptions::fsync`].
    pub fn fsync(mut self, yes: bool) -> Self {
        self.fsync = yes;
        self
    }
}

/// A file being created or replaced whole. [`AtomicFile::create`] makes a temporary file in the
/// target's directory, relative to a handle of it (`O_PATH`) opened when the target was
/// checked, so that a directory renamed or swapped afterwards cannot redirect the write: an
/// unnamed inode (`openat(dir, ".", O_TMPFILE)`) where the file system supports
/// it, else a file named as [`super::TEMP_MARKER`] says, created exclusively (nothing that exists
/// is opened). The data goes into it through its descriptor, never by a path: through
/// [`std::io::Write`] or through the engine (`gdpath::file::AtomicFileExt::memory` registers
/// the descriptor itself); [`AtomicFile::commit`] syncs it, gives it the target's
/// name and syncs the directory. An unnamed temporary takes the name by `linkat` through
/// `/proc/self/fd/N` (`AT_SYMLINK_FOLLOW`, which needs no capability): straight to the target when
/// it must not be replaced (`EEXIST` if it appeared meanwhile), else to a fresh temporary name
/// that is renamed over the target at once, so the replacement stays atomic and a name exists
/// for only the two system calls. Dropped without a commit (an error, an early return, a panic)
/// the temporary goes: an unnamed one with its descriptor, a named one is removed; a signal
/// handler removes a named one through [`super::remove_live_temporaries`], and a `SIGKILL`
/// frees an unnamed one with the process. Either way the target is as it was.
///
/// **Symbolic links.** Every component of the path, and of the text of every link met, is
/// opened by gdpath one at a time (`openat(O_PATH | O_NOFOLLOW)` relative to the directory
/// reached), so every link, in a directory of the path as at its end, is followed as `open(2)`
/// would follow it, with the kernel's `protected_symlinks` rule applied to it whatever
/// `fs.protected_symlinks` says: a link in a sticky world-writable directory (`/tmp`) whose owner
/// is neither the writer (its effective uid) nor the directory's owner is refused
/// ([`Error::SymlinkRefused`]). This is the kernel's rule, no stricter: a link in a directory
/// that another user owns (a folder that user made inside `/tmp`) is that user's to point
/// anywhere, as it is for `open(2)`, so a privileged writer must not write below directories
/// others own (docs/engine.md, "Writing files whole"). A magic link of `/proc` (`/dev/stdout` is one) is
/// refused ([`Error::MagicLinkRefused`]). At most 40 links are followed (`ELOOP` beyond, as
/// the kernel's `MAXSYMLINKS`); a dangling link is refused. [`AtomicFile::target`] is the file the
/// commit replaces (the real one, when the last component was a link:
/// [`AtomicFile::through_link`]), and the link itself stays.
///
/// **Another user's file.** With `overwrite`, a regular file in a sticky directory writable by
/// others (`/tmp`) whose owner is neither the writer nor the directory's owner is not replaced
/// ([`Error::ForeignFileRefused`], the kernel's `protected_regular=2` rule for `O_CREAT` opens,
/// applied whatever the sysctl says): anyone may plant such a file, and the replacement would
/// keep its owner. Checked when the write begins and again at the commit.
///
/// **What a replaced file keeps.** The commit renames a new inode over the old name, so it
/// gives the new one the attributes of the file it replaces, read just before the rename
/// (`openat(O_PATH | O_NOFOLLOW)` of the name in the directory handle, `fstat`):
/// - owner and group: kept where the writer may set them — root sets both; another writer keeps
///   the group when it is a member of it (`chown` refuses others with `EPERM`, and the write
///   carries on with the file the writer's);
/// - permission bits (`rwx`): kept, but the group bits only with the group (where the new file
///   has the writer's group instead, they would grant it what the old group had, so they are
///   cleared); set-user-ID, set-group-ID and sticky bits are dropped, as the kernel drops set-id
///   bits when a file is written;
/// - extended attributes (POSIX ACLs, SELinux labels, `user.*`): copied where the writer can
///   read and set them, except `security.capability` (file capabilities), dropped as set-id bits
///   are, and the POSIX ACL where the group is not kept;
/// - other hard links to the old inode keep the old content (and its owner and mode);
/// - until the commit, the temporary of a replacement is readable by its owner only (mode
///   0600), so a secret file's new content is never readable by others meanwhile.
///
/// A new file gets the writer's owner and group and mode `0666 & ~umask`, as `open(O_CREAT)`
/// gives.
#[derive(Debug)]
pub struct AtomicFile {
    target: PathBuf,
    linked: bool,
    /// The target's directory, `O_PATH`: the temporary is made, linked, renamed and removed
    /// relative to it.
    dir: Arc<File>,
    dir_path: PathBuf,
    name: OsString,
    temp: Temp,
    file: File,
    opts: ReplaceOptions,
    /// The attributes of the file there to replace when this began: the commit reads them again
    /// from the file it replaces, and uses these only where that file has gone meanwhile.
    kept: Option<Kept>,
    written: u64,
    needed: Option<u64>,
}

impl AtomicFile {
    /// Starts creating or replacing `target`. Nothing is written to `target` until
    /// [`AtomicFile::commit`]. Named temporaries of `target` that killed runs left are removed
    /// first ([`super::remove_stale_temporaries`]).
    ///
    /// Errors: [`Error::NotAFile`] when `target` is a directory, device, FIFO, socket or a
    /// dangling symbolic link (nothing is opened for writing); [`Error::SymlinkRefused`] for a
    /// link the `protected_symlinks` rule forbids following (see the type's docs);
    /// [`Error::MagicLinkRefused`] for a path through a magic link of `/proc`;
    /// [`Error::Exists`] when it exists and `opts.overwrite` is false;
    /// [`Error::ForeignFileRefused`] when it is another user's file in a sticky directory (see
    /// the type's docs); [`Error::Open`] when it cannot be examined (permission, `ELOOP`,
    /// `ENOTDIR`); [`Error::CreateIn`], naming the target's directory, when no temporary can be
    /// created there (permission, a missing directory, a read-only file system).
    pub fn create(target: impl AsRef<Path>, opts: ReplaceOptions) -> Result<AtomicFile> {
        Self::create_as(target.as_ref(), opts, true)
    }

    /// [`AtomicFile::create`] with a named temporary even where the file system makes unnamed
    /// ones: for the tests of that fallback (the engine's among them). Errors: as `create`'s.
    #[doc(hidden)]
    pub fn create_named(target: impl AsRef<Path>, opts: ReplaceOptions) -> Result<AtomicFile> {
        Self::create_as(target.as_ref(), opts, false)
    }

    /// [`AtomicFile::create`], with an unnamed temporary only when `unnamed` (the tests take the
    /// named fallback on file systems that would not need it).
    fn create_as(target: &Path, opts: ReplaceOptions, unnamed: bool) -> Result<AtomicFile> {
        let r = checked(target, opts.overwrite)?;
        remove_stale_in(&r.dir, &r.name, &r.dir_path);
        let dir = Arc::new(r.dir);
        // A replacement stays the writer's alone until the commit gives it the old file's mode.
        let mode = if r.existing.is_some() { 0o600 } else { 0o666 };
        let tried = if unnamed {
            open_unnamed(&dir, mode)
        } else {
            Ok(None)
        };
        let (file, temp) = match tried {
            Ok(Some((file, path))) => (file, Temp::Unnamed(path)),
            Ok(None) => {
                let (file, temp, name) = create_named(&dir, &r.dir_path, &r.name, mode)?;
                (file, Temp::Named(temp, name))
            }
            Err(e) => {
                return Err(Error::CreateIn {
                    dir: r.dir_path,
                    source: Arc::new(e),
                })
            }
        };
        super::test_hook("created");
        Ok(AtomicFile {
            target: r.path,
            linked: r.linked,
            dir,
            dir_path: r.dir_path,
            name: r.name,
            temp,
            file,
            opts,
            kept: r.existing.as_ref().map(|(old, md)| Kept::of(old, md)),
            written: 0,
            needed: None,
        })
    }

    /// The file that [`AtomicFile::commit`] creates or replaces: the path given, or, when that
    /// was a symbolic link ([`AtomicFile::through_link`]), the real path of the file it leads
    /// to.
    pub fn target(&self) -> &Path {
        &self.target
    }

    /// Whether the path given was a symbolic link, followed to [`AtomicFile::target`]; a
    /// command says so ("wrote out.bin (the file /data/x.bin it links to)").
    pub fn through_link(&self) -> bool {
        self.linked
    }

    /// [`AtomicFile::target`], [`AtomicFile::through_link`] and [`AtomicFile::replaces`] as
    /// one value, for a caller that reports which file it wrote after the commit.
    pub fn as_target(&self) -> Target {
        Target {
            path: self.target.clone(),
            through_link: self.linked,
            exists: self.replaces(),
        }
    }

    /// A path of the temporary file the data goes into until the commit, for messages:
    /// `/proc/self/fd/N` for an unnamed one, else the named file. Reach the temporary through
    /// [`AtomicFile::file`] (or the engine's registration of it), not through this path, which a directory
    /// renamed meanwhile redirects.
    pub fn temp_path(&self) -> &Path {
        self.temp.path()
    }

    /// Whether the temporary is an unnamed inode (`O_TMPFILE`), which no kill can leave behind;
    /// false where the file system refused it and a named temporary is used.
    pub fn is_unnamed(&self) -> bool {
        matches!(self.temp, Temp::Unnamed(_))
    }

    /// The temporary opened again with `O_DIRECT`, for the engine's direct I/O where `/proc`
    /// is not mounted (elsewhere the engine opens `/proc/self/fd/N` of [`AtomicFile::file`]):
    /// a named temporary's name opened relative to the directory handle (`O_NOFOLLOW`) and
    /// kept only if it is the same inode. `None` with `/proc`, for an unnamed temporary, where
    /// the file system refuses `O_DIRECT` (the engine then says so), or where the name now
    /// names another file.
    pub fn reopen_direct(&self) -> Option<File> {
        match &self.temp {
            Temp::Named(_, name) => {
                direct_by_name(&self.file, &self.dir, name, true, self.temp.path())
            }
            Temp::Unnamed(_) => None,
        }
    }

    /// The temporary's descriptor.
    pub fn file(&self) -> &File {
        &self.file
    }

    /// Whether the target existed when this began (the commit replaces it).
    pub fn replaces(&self) -> bool {
        self.kept.is_some()
    }

    /// Bytes written through [`std::io::Write`] so far.
    pub fn written(&self) -> u64 {
        self.written
    }

    /// Reserves `len` bytes of disk for the temporary: the free space `statvfs` reports for
    /// unprivileged users (`f_bavail × f_frsize`) is compared first, then
    /// `fallocate(FALLOC_FL_KEEP_SIZE)` takes the blocks where the file system can (which also
    /// meets quotas), so that a file system too small fails now, before any data is written,
    /// and says how much was needed. `len` is also the "needed" figure of later [`Error::NoSpace`] errors.
    ///
    /// Errors: [`Error::NoSpace`] (`written` 0); [`Error::Io`] with op `fallocate` for other
    /// failures.
    pub fn reserve(&mut self, len: u64) -> Result<()> {
        use nix::fcntl::{fallocate, FallocateFlags};
        self.needed = Some(len);
        if len == 0 {
            return Ok(());
        }
        // The free space first: a clear figure, and no blocks taken for a reservation that
        // cannot succeed.
        self.check_free(len)?;
        let l = i64::try_from(len)
            .map_err(|_| Error::Config(format!("{len} bytes is more than a file can hold")))?;
        match fallocate(
            self.file.as_raw_fd(),
            FallocateFlags::FALLOC_FL_KEEP_SIZE,
            0,
            l,
        ) {
            Ok(()) => Ok(()),
            Err(e @ (nix::errno::Errno::ENOSPC | nix::errno::Errno::EDQUOT)) => {
                Err(self.no_space(std::io::Error::from(e), 0))
            }
            Err(
                nix::errno::Errno::EOPNOTSUPP
                | nix::errno::Errno::ENOSYS
                | nix::errno::Errno::EINVAL,
            ) => Ok(()), // the free space was checked above
            Err(e) => Err(Error::io(
                "fallocate",
                self.temp.path(),
                0,
                std::io::Error::from(e),
            )),
        }
    }

    /// Compares `len` with the free space of the file system (`f_bavail × f_frsize`).
    fn check_free(&self, len: u64) -> Result<()> {
        let Ok(st) = nix::sys::statvfs::fstatvfs(&self.file) else {
            return Ok(()); // unknown: the writes themselves report ENOSPC
        };
        let free = st.blocks_available().saturating_mul(st.fragment_size());
        if len > free {
            return Err(self.no_space(std::io::Error::other(format!("{free} bytes free")), 0));
        }
        Ok(())
    }

    fn no_space(&self, source: std::io::Error, written: u64) -> Error {
        Error::NoSpace {
            path: self.target.clone(),
            needed: self.needed,
            written,
            source: Arc::new(source),
        }
    }

    /// The error for a failure while writing the temporary, `written` bytes in: a full file
    /// system (`ENOSPC`, `EDQUOT`) becomes [`Error::NoSpace`] naming the target, the bytes
    /// needed (when [`AtomicFile::reserve`] said) and written; an [`Error::Io`] or
    /// [`Error::Open`] that names an unnamed temporary (`/proc/self/fd/N`) names the target
    /// instead; anything else stays as it is. `e` is this crate's error or one that carries it
    /// (the engine's: [`FileError`]).
    pub fn explain<E: FileError>(&self, e: E, written: u64) -> E {
        match e.into_file_error() {
            Ok(f) => E::from(self.explain_file(f, written)),
            Err(other) => other,
        }
    }

    /// [`AtomicFile::explain`] for this crate's error.
    fn explain_file(&self, e: Error, written: u64) -> Error {
        let e = match e {
            Error::Io {
                op,
                path,
                offset,
                source,
            } => Error::Io {
                op,
                path: self.rename_proc(path),
                offset,
                source,
            },
            Error::Open { path, source } => Error::Open {
                path: self.rename_proc(path),
                source,
            },
            e => e,
        };
        match &e {
            Error::Io { source, .. } | Error::Open { source, .. } if is_no_space(source) => {
                Error::NoSpace {
                    path: self.target.clone(),
                    needed: self.needed,
                    written,
                    source: source.clone(),
                }
            }
            _ => e,
        }
    }

    /// `path`, or the target when `path` is the unnamed temporary's `/proc/self/fd/N`.
    fn rename_proc(&self, path: PathBuf) -> PathBuf {
        match &self.temp {
            Temp::Unnamed(p) if *p == path => self.target.clone(),
            _ => path,
        }
    }

    /// As [`AtomicFile::explain`] for an error of this value's own [`std::io::Write`]
    /// (op `write`, at [`AtomicFile::written`]).
    pub fn write_error(&self, e: std::io::Error) -> Error {
        self.explain(
            Error::io("write", self.temp.path(), self.written, e),
            self.written,
        )
    }

    /// Makes the data the target's: the replaced file's owner, group, mode and extended
    /// attributes (see the type's docs), `fsync` of the temporary (unless
    /// [`ReplaceOptions::fsync`] is off), the target's name for it (see the type's docs: a link
    /// of an unnamed temporary, a rename of a named one, both relative to the target's
    /// directory handle; without `overwrite`, one that refuses to replace a target made
    /// meanwhile), `fsync` of the directory.
    ///
    /// Errors: [`Error::NoSpace`] or [`Error::Io`] (op `fchmod`, `fsync`, `link`, `rename`) — before the
    /// target has its new content the temporary is removed and the target is as it was;
    /// [`Error::Exists`] when the target appeared meanwhile without `overwrite`; an `fsync` of
    /// the directory that fails afterwards is [`Error::Io`] too (the target is replaced, its
    /// durability unknown).
    pub fn commit(mut self) -> Result<()> {
        let written = self.written;
        self.file
            .flush()
            .map_err(|e| self.explain(Error::io("flush", self.temp.path(), 0, e), written))?;
        if let Some(kept) = self.replaced()? {
            // Before the fsync, so that the attributes are as durable as the data.
            kept.apply(&self.file)
                .map_err(|e| self.explain(Error::io("fchmod", self.temp.path(), 0, e), written))?;
        }
        if self.opts.fsync {
            self.file
                .sync_all()
                .map_err(|e| self.explain(Error::io("fsync", self.temp.path(), 0, e), written))?;
        }
        match &mut self.temp {
            Temp::Named(temp, from_name) => {
                if self.opts.overwrite {
                    renameat(&*self.dir, &*from_name, &*self.dir, &self.name)
                        .map_err(|e| Error::io("rename", &self.target, 0, e.into()))?;
                } else {
                    rename_no_replace(&self.dir, from_name, &self.name, &self.target)?;
                }
                temp.disarm();
            }
            Temp::Unnamed(proc) => {
                let proc = proc.clone();
                self.link_unnamed(&proc)?;
            }
        }
        if self.opts.fsync {
            openat(
                &*self.dir,
                ".",
                OFlags::RDONLY | OFlags::DIRECTORY | OFlags::CLOEXEC,
                Mode::empty(),
            )
            .map_err(std::io::Error::from)
            .and_then(|d| File::from(d).sync_all())
            .map_err(|e| Error::io("fsync", &self.dir_path, 0, e))?;
        }
        Ok(())
    }

    /// The attributes the new file takes at the commit: those of the regular file the commit
    /// replaces, read now (`openat(O_PATH | O_NOFOLLOW)` of its name relative to the directory
    /// handle, `fstat`), or, where it has gone or something else took its name, those read
    /// when this began; none for a new file or without `overwrite` (the commit then refuses to
    /// replace anything). Errors: [`Error::ForeignFileRefused`] when the file there is now
    /// another user's in a sticky directory; [`Error::Open`] naming the target when it cannot
    /// be examined.
    fn replaced(&self) -> Result<Option<Kept>> {
        if !self.opts.overwrite {
            return Ok(None);
        }
        let open_err = |e: Errno| Error::Open {
            path: self.target.clone(),
            source: Arc::new(e.into()),
        };
        let entry = match openat(
            &*self.dir,
            &self.name,
            OFlags::PATH | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::empty(),
        ) {
            Ok(fd) => File::from(fd),
            Err(Errno::NOENT) => return Ok(self.kept.clone()),
            Err(e) => return Err(open_err(e)),
        };
        let md = entry
            .metadata()
            .map_err(|e| open_err(Errno::from_io_error(&e).unwrap_or(Errno::IO)))?;
        if !md.is_file() {
            return Ok(self.kept.clone());
        }
        check_owner(&self.dir, &self.dir_path, &self.target, &md)?;
        Ok(Some(Kept::of(&entry, &md)))
    }

    /// Gives the unnamed temporary at `proc` (`/proc/self/fd/N`) the target's name in the
    /// target's directory: a link straight to the target when it must not be replaced, else a
    /// link to a fresh temporary name (registered for removal before it exists) renamed over
    /// the target.
    fn link_unnamed(&self, proc: &Path) -> Result<()> {
        let link = |to: &OsStr| linkat(CWD, proc, &*self.dir, to, AtFlags::SYMLINK_FOLLOW);
        let failed = |e: Errno| {
            self.explain(
                Error::io("link", &self.target, 0, std::io::Error::from(e)),
                self.written,
            )
        };
        if !self.opts.overwrite {
            return match link(&self.name) {
                Ok(()) => Ok(()),
                Err(Errno::EXIST) => Err(Error::Exists {
                    path: self.target.clone(),
                }),
                Err(e) => Err(failed(e)),
            };
        }
        let mut attempt = 0;
        loop {
            let name = temp_name(&self.name, random_name(&self.dir_path)?);
            let path = self.dir_path.join(&name);
            // Registered before it exists, so that an interrupt between the link and the
            // rename removes it.
            let temp = Temporary::adopt_at(&self.dir, &name, path);
            match link(&name) {
                Ok(()) => {
                    // On failure `temp` drops and removes the name: the target stays as it was.
                    renameat(&*self.dir, &name, &*self.dir, &self.name)
                        .map_err(|e| Error::io("rename", &self.target, 0, e.into()))?;
                    temp.keep();
                    return Ok(());
                }
                Err(Errno::EXIST) if attempt < 8 => {
                    // Someone else's file: not ours to remove.
                    temp.keep();
                    attempt += 1;
                }
                Err(e) => {
                    temp.keep();
                    return Err(failed(e));
                }
            }
        }
    }
}

impl Write for AtomicFile {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.file.write(buf)?;
        self.written += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.file.flush()
    }
}

/// The file a write to a path would create or replace, as [`check_target`] found it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Target {
    /// The path given, or, when it is a symbolic link, the real path of the file it leads to.
    pub path: PathBuf,
    /// Whether the path given is a symbolic link (followed to `path`).
    pub through_link: bool,
    /// Whether the file exists (the write would replace it).
    pub exists: bool,
}

/// Checks, creating nothing, what [`AtomicFile::create`] would refuse for `target` with
/// [`ReplaceOptions::overwrite`] `overwrite`, so that a command can refuse before it does any
/// work (loads a checkpoint, runs its measurements), and says which file the write would
/// replace. The create checks again, since the answer may change meanwhile.
///
/// Errors: as [`AtomicFile::create`]'s before it creates anything: [`Error::NotAFile`] for a
/// directory, device, FIFO, socket or dangling symbolic link, [`Error::SymlinkRefused`],
/// [`Error::Exists`] for an existing file without `overwrite`, [`Error::CreateIn`] for a
/// missing directory, [`Error::Open`] when the path cannot be examined.
pub fn check_target(target: &Path, overwrite: bool) -> Result<Target> {
    let r = checked(target, overwrite)?;
    Ok(Target {
        exists: r.existing.is_some(),
        path: r.path,
        through_link: r.linked,
    })
}

/// `target` resolved ([`resolve`]), refused when it exists and `overwrite` is off, or when
/// it is another user's file in a sticky directory ([`check_owner`]).
pub(super) fn checked(target: &Path, overwrite: bool) -> Result<Resolved> {
    let r = resolve(target)?;
    if let Some((_, md)) = &r.existing {
        if !overwrite {
            return Err(Error::Exists { path: r.path });
        }
        check_owner(&r.dir, &r.dir_path, &r.path, md)?;
    }
    Ok(r)
}

/// `file`, whose name in the directory open as `dir` is `name`, opened again by that name with
/// `O_DIRECT` relative to the handle (`O_NOFOLLOW | O_NONBLOCK | O_NOCTTY`, read-write when
/// `writable`), only where `/proc` is not mounted (the engine opens `/proc/self/fd/N` of `file`
/// for O_DIRECT) and kept only if it is the same inode; `shown` names it in the log. `None`
/// with `/proc`, where the open fails (`EINVAL`: no O_DIRECT on this file system), or where the
/// name now names another file.
pub(super) fn direct_by_name(
    file: &File,
    dir: &File,
    name: &OsStr,
    writable: bool,
    shown: &Path,
) -> Option<File> {
    if Path::new("/proc/self/fd").is_dir() {
        return None;
    }
    let flags = OFlags::DIRECT
        | OFlags::NOFOLLOW
        | OFlags::NONBLOCK
        | OFlags::NOCTTY
        | OFlags::CLOEXEC
        | if writable {
            OFlags::RDWR
        } else {
            OFlags::RDONLY
        };
    let d = File::from(openat(dir, name, flags, Mode::empty()).ok()?);
    let same = match (file.metadata(), d.metadata()) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    };
    if !same {
        tracing::debug!(
            "{} names another file now: no O_DIRECT descriptor",
            shown.display()
        );
        return None;
    }
    // The registration clears O_NONBLOCK (io_uring would fail reads that must wait).
    Some(d)
}

/// Where the data waits until the commit.
#[derive(Debug)]
enum Temp {
    /// An unnamed inode (`O_TMPFILE`) in the target's directory, reached as `/proc/self/fd/N`
    /// while its descriptor is open: a kill frees it with the process.
    Unnamed(PathBuf),
    /// A named file in the target's directory (where `O_TMPFILE` is refused), with its name
    /// there, removed by its [`Temporary`] or, after a kill, by the next run.
    Named(Temporary, OsString),
}

impl Temp {
    fn path(&self) -> &Path {
        match self {
            Temp::Unnamed(p) => p,
            Temp::Named(t, _) => t.path(),
        }
    }
}

/// An unnamed temporary in the directory open as `dir` (`openat(dir, ".", O_TMPFILE | O_RDWR |
/// O_CLOEXEC, mode)`) and the `/proc/self/fd/N` path that reaches it. `Ok(None)` where the file
/// system or kernel refuses `O_TMPFILE` (`EOPNOTSUPP`, `EISDIR` on kernels that predate it,
/// `EINVAL`, `ENOSYS`) or `/proc` does not show the descriptor (the engine and the commit reach
/// the inode through it): the caller then makes a named one. Errors: the `open`'s other errors
/// (permission, a read-only file system).
fn open_unnamed(dir: &File, mode: u32) -> std::io::Result<Option<(File, PathBuf)>> {
    let fd = match openat(
        dir,
        ".",
        OFlags::TMPFILE | OFlags::RDWR | OFlags::CLOEXEC,
        Mode::from_raw_mode(mode),
    ) {
        Ok(fd) => fd,
        Err(Errno::OPNOTSUPP | Errno::ISDIR | Errno::INVAL | Errno::NOSYS) => return Ok(None),
        Err(e) => return Err(e.into()),
    };
    let file = File::from(fd);
    let path = PathBuf::from(format!("/proc/self/fd/{}", file.as_raw_fd()));
    let same = match (file.metadata(), std::fs::metadata(&path)) {
        (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
        _ => false,
    };
    Ok(same.then_some((file, path)))
}

/// A named temporary for the target named `target` in the directory open as `dir` (`shown`
/// in messages), created exclusively (`O_EXCL`, `O_NOFOLLOW`) relative to the directory
/// handle, with permission bits `mode`, and registered for removal (relative to the handle)
/// before it exists; and its name. Errors: [`Error::CreateIn`] naming the directory when it
/// cannot be created.
fn create_named(
    dir: &Arc<File>,
    shown: &Path,
    target: &OsStr,
    mode: u32,
) -> Result<(File, Temporary, OsString)> {
    let mut attempt = 0;
    loop {
        let name = temp_name(target, random_name(shown)?);
        // Registered before it exists: a signal between the open and the registration would
        // otherwise leave the file behind.
        let temp = Temporary::adopt_at(dir, &name, shown.join(&name));
        let opened = openat(
            &**dir,
            &name,
            OFlags::RDWR | OFlags::CREATE | OFlags::EXCL | OFlags::NOFOLLOW | OFlags::CLOEXEC,
            Mode::from_raw_mode(mode),
        );
        match opened {
            Ok(f) => return Ok((File::from(f), temp, name)),
            Err(Errno::EXIST) if attempt < 8 => {
                // Someone else's file: not ours to remove.
                temp.keep();
                attempt += 1;
            }
            Err(e) => {
                temp.keep();
                return Err(Error::CreateIn {
                    dir: shown.to_owned(),
                    source: Arc::new(e.into()),
                });
            }
        }
    }
}

/// The random part of a temporary's name. Errors: [`Error::Open`] naming `dir` when the system
/// has no randomness to give.
fn random_name(dir: &Path) -> Result<u64> {
    getrandom::u64().map_err(|e| Error::Open {
        path: dir.to_owned(),
        source: Arc::new(std::io::Error::other(format!("no random name: {e}"))),
    })
}

/// Renames `from` to `to` in the directory open as `dir` unless `to` exists
/// (`renameat2(RENAME_NOREPLACE)`; where the file system does not support it, a hard link and
/// an unlink, which fail the same way; where hard links are not supported either, a check and a
/// plain rename). `to_shown` is the target's path for errors.
fn rename_no_replace(dir: &File, from: &OsStr, to: &OsStr, to_shown: &Path) -> Result<()> {
    use rustix::fs::{renameat_with, statat, unlinkat, RenameFlags};
    let exists = || Error::Exists {
        path: to_shown.to_owned(),
    };
    let err = |op, e: Errno| Error::io(op, to_shown, 0, std::io::Error::from(e));
    match renameat_with(dir, from, dir, to, RenameFlags::NOREPLACE) {
        Ok(()) => return Ok(()),
        Err(Errno::EXIST) => return Err(exists()),
        Err(Errno::INVAL | Errno::NOSYS) => {}
        Err(e) => return Err(err("rename", e)),
    }
    match linkat(dir, from, dir, to, AtFlags::empty()) {
        Ok(()) => unlinkat(dir, from, AtFlags::empty()).map_err(|e| err("unlink", e)),
        Err(Errno::EXIST) => Err(exists()),
        Err(_) => {
            if statat(dir, to, AtFlags::SYMLINK_NOFOLLOW).is_ok() {
                return Err(exists());
            }
            renameat(dir, from, dir, to).map_err(|e| err("rename", e))
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdpath_testkit::temporaries;
    use std::io::Write;
    use std::os::unix::fs::PermissionsExt;

    const TEMP_MARKER_TEXT: &str = super::super::TEMP_MARKER;

    /// Whether the file system of `dir` makes unnamed temporaries (`O_TMPFILE`).
    fn unnamed_here(dir: &Path) -> bool {
        let d = File::open(dir).unwrap();
        matches!(open_unnamed(&d, 0o600), Ok(Some(_)))
    }

    #[test]
    fn the_target_changes_only_at_commit_and_a_dropped_file_leaves_nothing() {
        for unnamed in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let t = dir.path().join("t");
            std::fs::write(&t, b"old").unwrap();
            std::fs::set_permissions(&t, std::fs::Permissions::from_mode(0o640)).unwrap();
            // Root keeps another user's ownership (tests/atomic_links.rs checks more).
            let root = rustix::process::geteuid().is_root();
            if root {
                std::os::unix::fs::chown(&t, Some(65534), Some(65534)).unwrap();
            }
            let opts = ReplaceOptions::default().overwrite(true);
            let mut a = AtomicFile::create_as(&t, opts, unnamed).unwrap();
            assert!(a.replaces());
            let is_unnamed = unnamed && unnamed_here(dir.path());
            assert_eq!(a.is_unnamed(), is_unnamed);
            a.write_all(b"new contents").unwrap();
            assert_eq!(std::fs::read(&t).unwrap(), b"old", "not before the commit");
            assert_eq!(
                temporaries(dir.path()).len(),
                usize::from(!is_unnamed),
                "an unnamed temporary has no name in the directory until the commit"
            );
            a.commit().unwrap();
            assert_eq!(std::fs::read(&t).unwrap(), b"new contents");
            let md = std::fs::metadata(&t).unwrap();
            assert_eq!(
                md.mode() & 0o7777,
                0o640,
                "the replaced file's permissions are kept"
            );
            if root {
                assert_eq!((md.uid(), md.gid()), (65534, 65534), "and its owner");
            }
            assert!(temporaries(dir.path()).is_empty());

            let mut a = AtomicFile::create_as(&t, opts, unnamed).unwrap();
            a.write_all(b"partial").unwrap();
            drop(a);
            assert_eq!(std::fs::read(&t).unwrap(), b"new contents");
            assert!(temporaries(dir.path()).is_empty(), "dropped: removed");
            assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
        }
    }

    #[test]
    fn an_unnamed_temporary_is_reached_through_proc_and_errors_name_the_target() {
        let dir = tempfile::tempdir().unwrap();
        if !unnamed_here(dir.path()) {
            eprintln!("skipped: this file system refuses O_TMPFILE");
            return;
        }
        let t = dir.path().join("t");
        let mut a = AtomicFile::create(&t, ReplaceOptions::default()).unwrap();
        assert!(a.is_unnamed());
        assert!(
            a.temp_path().starts_with("/proc/self/fd"),
            "{:?}",
            a.temp_path()
        );
        a.write_all(b"through the descriptor").unwrap();
        // Another open of the path reaches the same inode, as the engine's registration does.
        assert_eq!(
            std::fs::read(a.temp_path()).unwrap(),
            b"through the descriptor"
        );
        let eio = Error::io(
            "write",
            a.temp_path(),
            7,
            std::io::Error::from_raw_os_error(libc::EIO),
        );
        match a.explain(eio, 0) {
            Error::Io { path, offset, .. } => assert_eq!((path, offset), (t.clone(), 7)),
            other => panic!("{other}"),
        }
        a.commit().unwrap();
        assert_eq!(std::fs::read(&t).unwrap(), b"through the descriptor");
        assert_eq!(std::fs::read_dir(dir.path()).unwrap().count(), 1);
    }

    #[test]
    fn an_existing_target_needs_overwrite_even_if_it_appears_meanwhile() {
        for unnamed in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let t = dir.path().join("t");
            std::fs::write(&t, b"old").unwrap();
            let e = AtomicFile::create_as(&t, ReplaceOptions::default(), unnamed).unwrap_err();
            assert!(matches!(&e, Error::Exists { path } if *path == t), "{e}");
            let u = dir.path().join("u");
            let mut a = AtomicFile::create_as(&u, ReplaceOptions::default(), unnamed).unwrap();
            a.write_all(b"mine").unwrap();
            std::fs::write(&u, b"someone else's").unwrap();
            let e = a.commit().unwrap_err();
            assert!(matches!(e, Error::Exists { .. }), "{e}");
            assert_eq!(std::fs::read(&u).unwrap(), b"someone else's");
            assert!(temporaries(dir.path()).is_empty());
        }
    }

    #[test]
    fn a_missing_directory_is_named_not_a_temporary() {
        for unnamed in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let t = dir.path().join("nodir/x");
            let e = AtomicFile::create_as(&t, ReplaceOptions::default(), unnamed).unwrap_err();
            match &e {
                Error::CreateIn { dir: path, source } => {
                    assert_eq!(*path, dir.path().join("nodir"));
                    assert_eq!(source.kind(), std::io::ErrorKind::NotFound);
                }
                other => panic!("{other}"),
            }
            assert!(!e.to_string().contains(TEMP_MARKER_TEXT), "{e}");
        }
    }

    #[test]
    fn special_files_and_dangling_links_are_refused_before_anything_is_created() {
        let dir = tempfile::tempdir().unwrap();
        let fifo = dir.path().join("fifo");
        nix::unistd::mkfifo(&fifo, nix::sys::stat::Mode::S_IRWXU).unwrap();
        let dangling = dir.path().join("dangling");
        std::os::unix::fs::symlink(dir.path().join("nowhere"), &dangling).unwrap();
        for p in [Path::new("/dev/null"), &fifo, dir.path(), &dangling] {
            let e = AtomicFile::create(p, ReplaceOptions::default().overwrite(true)).unwrap_err();
            assert!(matches!(e, Error::NotAFile { .. }), "{}: {e}", p.display());
        }
        assert!(temporaries(dir.path()).is_empty());
        assert!(temporaries(Path::new("/dev")).is_empty());
    }

    #[test]
    fn a_link_is_followed_and_the_file_it_points_to_is_replaced() {
        let dir = tempfile::tempdir().unwrap();
        let real = dir.path().join("real");
        std::fs::write(&real, b"old").unwrap();
        let link = dir.path().join("link");
        std::os::unix::fs::symlink(&real, &link).unwrap();
        let mut a = AtomicFile::create(&link, ReplaceOptions::default().overwrite(true)).unwrap();
        a.write_all(b"new").unwrap();
        a.commit().unwrap();
        assert!(std::fs::symlink_metadata(&link)
            .unwrap()
            .file_type()
            .is_symlink());
        assert_eq!(std::fs::read(&real).unwrap(), b"new");
    }

    #[test]
    fn a_full_file_system_while_writing_is_no_space_naming_the_target() {
        let dir = tempfile::tempdir().unwrap();
        let t = dir.path().join("t");
        let mut a = AtomicFile::create(&t, ReplaceOptions::default()).unwrap();
        a.reserve(100).unwrap();
        a.write_all(&[1u8; 40]).unwrap();
        // What a write to a full file system returns, typed.
        let full = std::io::Error::from_raw_os_error(libc::ENOSPC);
        match a.write_error(full) {
            Error::NoSpace {
                path,
                needed,
                written,
                ..
            } => assert_eq!((path, needed, written), (t.clone(), Some(100), 40)),
            other => panic!("{other}"),
        }
        let eio = Error::io(
            "write",
            a.temp_path(),
            0,
            std::io::Error::from_raw_os_error(libc::EIO),
        );
        assert!(
            matches!(a.explain(eio, 0), Error::Io { .. }),
            "other errors stay"
        );
        let msg = a
            .write_error(std::io::Error::from_raw_os_error(libc::EDQUOT))
            .to_string();
        assert!(
            msg.contains("100 bytes (100 B) needed, 40 bytes written"),
            "{msg}"
        );
    }

    /// A directory raced in at the target's name fails the commit's rename with an error that
    /// names the target (main named the temporary), and leaves no temporary.
    #[test]
    fn a_failed_rename_names_the_target() {
        for unnamed in [true, false] {
            let dir = tempfile::tempdir().unwrap();
            let t = dir.path().join("race");
            std::fs::write(&t, b"old").unwrap();
            let mut a =
                AtomicFile::create_as(&t, ReplaceOptions::default().overwrite(true), unnamed)
                    .unwrap();
            a.write_all(b"new").unwrap();
            std::fs::remove_file(&t).unwrap();
            std::fs::create_dir(&t).unwrap();
            match a.commit().unwrap_err() {
                Error::Io { op, path, .. } => assert_eq!((op, path), ("rename", t.clone())),
                other => panic!("{other}"),
            }
            assert!(temporaries(dir.path()).is_empty());
        }
    }
}
