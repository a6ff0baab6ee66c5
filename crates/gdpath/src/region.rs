//! Registered memory: regions and descriptors.
//!
//! A [`Region`] is a cheap handle (`Arc`) to registered memory. Every descriptor and every work
//! item a backend holds keeps its region alive, so memory cannot be freed while a transfer uses
//! it: the last handle's drop deregisters it from each backend and frees it. Taking host memory
//! back ([`Region::into_host_buffer`]) or deregistering ([`crate::Agent::deregister`]) while a
//! transfer is in flight is a typed error ([`Error::RegionBusy`]).

use crate::error::{Error, Result};
use crate::memory::{DirectIo, FileAccess, HostBuffer, MemoryKind};
use crate::os::mem::{Exclusive, HostMem, Keep};
pub use crate::region_id::RegionId;
use std::any::Any;
use std::fmt;
use std::fs::File;
use std::ops::{Deref, DerefMut};
use std::os::fd::{AsRawFd, RawFd};
use std::os::unix::fs::OpenOptionsExt;
use std::path::{Path as FsPath, PathBuf};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};

/// Memory a backend materialised for a kind gdpath does not store itself (GPU memory, remote
/// regions). Backends downcast it with [`Region::foreign`].
pub trait ForeignMemory: Any + Send + Sync + fmt::Debug {
    /// Length in bytes.
    fn len(&self) -> u64;
    /// True when the memory has no bytes.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }
    /// For downcasting.
    fn as_any(&self) -> &dyn Any;
}

/// Per-backend registration state (a pinned mapping, a cuFile handle, a UCX memory handle).
/// Dropped, and so deregistered, when the region is freed.
pub type BackendHandle = Box<dyn Any + Send + Sync>;

/// Alignment O_DIRECT needs for a file, from `statx(STATX_DIOALIGN)` (Linux 6.1+), or 4096
/// bytes when the kernel does not say.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DioAlign {
    /// File offset and length alignment (bytes).
    pub offset: u64,
    /// Memory address alignment (bytes).
    pub memory: u64,
}

/// Why a file region has no O_DIRECT descriptor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum DirectStatus {
    /// O_DIRECT is open and usable.
    Enabled,
    /// The file system refused O_DIRECT (`open` returned EINVAL).
    Refused,
    /// The caller asked for buffered I/O ([`DirectIo::Off`]).
    Disabled,
}

/// A registered file: a buffered descriptor, and an O_DIRECT one where the file system allows.
#[derive(Debug)]
pub struct FileRegion {
    path: PathBuf,
    buffered: File,
    direct: Option<File>,
    status: DirectStatus,
    align: DioAlign,
    cache_block: u64,
    access: FileAccess,
}

impl FileRegion {
    /// Opens both descriptors through [`crate::file`]'s type check: a directory, device, FIFO or
    /// socket is [`Error::NotAFile`] before anything is opened, and again on the open
    /// descriptor (`fstat`) should the path change in between.
    pub(crate) fn open(path: &FsPath, access: FileAccess, mode: DirectIo) -> Result<Self> {
        let mut oo = std::fs::OpenOptions::new();
        oo.read(true);
        match access {
            FileAccess::ReadOnly => {}
            FileAccess::ReadWrite => {
                oo.write(true);
            }
            FileAccess::Create { truncate } => {
                oo.write(true).create(true).truncate(truncate);
            }
        }
        let buffered = crate::file::open_regular(path, oo, 0)?;
        let (direct, status) = if mode == DirectIo::Off {
            (None, DirectStatus::Disabled)
        } else {
            let mut od = std::fs::OpenOptions::new();
            od.read(true).write(access.writable());
            match crate::file::open_regular(path, od, crate::os::file::O_DIRECT) {
                Ok(f) => (Some(f), DirectStatus::Enabled),
                Err(crate::file::Error::Open { source, .. })
                    if source.raw_os_error() == Some(libc::EINVAL) =>
                {
                    (
                        None,
                        refused_direct(path, mode, "the file system refused it")?,
                    )
                }
                Err(e) => return Err(e.into()),
            }
        };
        // The second open went by path too: it must have found the same file.
        Self::assemble(path.to_owned(), buffered, direct, status, access)
    }

    /// Uses the descriptors of `file` ([`crate::OpenFile`]), opening nothing by a path: the
    /// buffered descriptor as it is (a regular file open for reading, and writing when its
    /// access is writable, without `O_APPEND`; `O_DIRECT` and `O_NONBLOCK` flags on it are
    /// cleared), and for
    /// O_DIRECT the descriptor given with it or else `/proc/self/fd/N` of the buffered one
    /// opened again with `O_DIRECT` (the same inode, by no name; without `/proc` the file goes
    /// through the page cache, [`DirectStatus::Refused`]).
    ///
    /// Errors: [`Error::NotAFile`]; [`Error::Open`] for a descriptor opened the wrong way or a
    /// direct descriptor of another inode; [`Error::Unsupported`] for [`DirectIo::Required`]
    /// without O_DIRECT.
    pub(crate) fn from_open(file: crate::memory::OpenFile, mode: DirectIo) -> Result<Self> {
        use nix::fcntl::{fcntl, FcntlArg, OFlag};
        let crate::memory::OpenFile {
            file: buffered,
            direct_file,
            path,
            access,
            ..
        } = file;
        let open_err = |e: std::io::Error| Error::Open {
            path: path.clone(),
            source: Arc::new(e),
        };
        let md = buffered.metadata().map_err(open_err)?;
        if let Some(what) = crate::file::special_kind(&md) {
            return Err(Error::NotAFile { path, what });
        }
        let getfl = |f: &File| {
            fcntl(f.as_raw_fd(), FcntlArg::F_GETFL)
                .map(OFlag::from_bits_truncate)
                .map_err(|e| open_err(e.into()))
        };
        let fl = getfl(&buffered)?;
        let wrong = |why: &str| open_err(std::io::Error::other(why.to_owned()));
        let acc = fl & OFlag::O_ACCMODE;
        if acc == OFlag::O_WRONLY {
            return Err(wrong("the descriptor is not open for reading"));
        }
        if access.writable() && acc == OFlag::O_RDONLY {
            return Err(wrong("the descriptor is not open for writing"));
        }
        if fl.contains(OFlag::O_APPEND) {
            return Err(wrong(
                "the descriptor is open with O_APPEND: positioned writes would append",
            ));
        }
        // Through the page cache, and blocking: io_uring fails reads that must wait with
        // EAGAIN on an O_NONBLOCK descriptor.
        let clear = OFlag::O_DIRECT | OFlag::O_NONBLOCK;
        if fl.intersects(clear) {
            fcntl(buffered.as_raw_fd(), FcntlArg::F_SETFL(fl - clear))
                .map_err(|e| open_err(e.into()))?;
        }
        if let FileAccess::Create { truncate: true } = access {
            buffered.set_len(0).map_err(open_err)?;
        }
        let (direct, status) = match (mode, direct_file) {
            (DirectIo::Off, _) => (None, DirectStatus::Disabled),
            (_, Some(d)) => {
                let dfl = getfl(&d)?;
                let want = (dfl | OFlag::O_DIRECT) - OFlag::O_NONBLOCK;
                if dfl != want {
                    // An open file description of its own: its flags are no other
                    // descriptor's.
                    fcntl(d.as_raw_fd(), FcntlArg::F_SETFL(want))
                        .map_err(|e| open_err(e.into()))?;
                }
                (Some(d), DirectStatus::Enabled)
            }
            (_, None) => {
                let again = format!("/proc/self/fd/{}", buffered.as_raw_fd());
                let mut od = std::fs::OpenOptions::new();
                od.read(true).write(access.writable());
                od.custom_flags(crate::os::file::O_DIRECT | libc::O_CLOEXEC);
                match od.open(&again) {
                    Ok(f) => (Some(f), DirectStatus::Enabled),
                    Err(e) if e.raw_os_error() == Some(libc::EINVAL) => (
                        None,
                        refused_direct(&path, mode, "the file system refused it")?,
                    ),
                    Err(e) if e.raw_os_error() == Some(libc::ENOENT) => (
                        None,
                        refused_direct(&path, mode, "/proc is not mounted to open it again")?,
                    ),
                    Err(e) => return Err(open_err(e)),
                }
            }
        };
        Self::assemble(path, buffered, direct, status, access)
    }

    /// The region of the descriptors opened: the O_DIRECT one, opened apart, must be the same
    /// inode as the buffered one ([`Error::Open`] otherwise).
    fn assemble(
        path: PathBuf,
        buffered: File,
        direct: Option<File>,
        status: DirectStatus,
        access: FileAccess,
    ) -> Result<Self> {
        use std::os::unix::fs::MetadataExt;
        if let Some(d) = &direct {
            let same = match (buffered.metadata(), d.metadata()) {
                (Ok(a), Ok(b)) => (a.dev(), a.ino()) == (b.dev(), b.ino()),
                _ => false,
            };
            if !same {
                return Err(Error::Open {
                    path,
                    source: Arc::new(std::io::Error::other(
                        "the O_DIRECT descriptor is another file than the buffered one",
                    )),
                });
            }
        }
        let align = dio_align(&buffered);
        let cache_block = cache_block(&buffered, align);
        Ok(FileRegion {
            path,
            buffered,
            direct,
            status,
            align,
            cache_block,
            access,
        })
    }

    /// The file's path as registered.
    pub fn path(&self) -> &FsPath {
        &self.path
    }
    /// The buffered (page cache) descriptor.
    pub fn buffered_fd(&self) -> RawFd {
        self.buffered.as_raw_fd()
    }
    /// The O_DIRECT descriptor, when O_DIRECT is usable.
    pub fn direct_fd(&self) -> Option<RawFd> {
        self.direct.as_ref().map(AsRawFd::as_raw_fd)
    }
    /// The buffered (page cache) file.
    pub(crate) fn buffered_file(&self) -> &File {
        &self.buffered
    }
    /// The file opened with O_DIRECT, when O_DIRECT is usable.
    pub(crate) fn direct_file(&self) -> Option<&File> {
        self.direct.as_ref()
    }
    /// Whether O_DIRECT is usable, and if not why.
    pub fn direct_status(&self) -> DirectStatus {
        self.status
    }
    /// O_DIRECT alignment.
    pub fn align(&self) -> DioAlign {
        self.align
    }
    /// The unit, in bytes, in which the page cache and the file system track this file's data:
    /// the largest of the page size, the file system block (`stx_blksize`) and the O_DIRECT
    /// offset alignment. A power of two, at least [`DioAlign::offset`]. O_DIRECT I/O and
    /// buffered I/O that run at the same time must not share one of these blocks (see
    /// `backend::posix_direct`); O_DIRECT alignment alone (often 512 B) is finer than this.
    pub fn cache_block(&self) -> u64 {
        self.cache_block
    }
    /// The access mode it was registered with.
    pub fn access(&self) -> FileAccess {
        self.access
    }
    /// The file's current size in bytes (`fstat`).
    pub fn size(&self) -> Result<u64> {
        self.buffered
            .metadata()
            .map(|m| m.len())
            .map_err(|e| Error::io("fstat", &self.path, 0, e))
    }
}

/// The status of a file without O_DIRECT (`why`: the reason, in words), or, for
/// [`DirectIo::Required`], the error.
fn refused_direct(path: &FsPath, mode: DirectIo, why: &str) -> Result<DirectStatus> {
    if mode == DirectIo::Required {
        return Err(Error::Unsupported {
            what: format!("O_DIRECT on {} ({why})", gdpath_topo::text::escape(path)),
            backend: "posix-direct",
        });
    }
    tracing::debug!("no O_DIRECT for {}: {why}", path.display());
    Ok(DirectStatus::Refused)
}

fn dio_align(f: &File) -> DioAlign {
    match crate::os::file::dio_align(f) {
        Some((offset, memory)) => DioAlign {
            offset: u64::from(offset).max(512),
            memory: u64::from(memory).max(1),
        },
        None => DioAlign {
            offset: 4096,
            memory: 4096,
        },
    }
}

fn cache_block(f: &File, align: DioAlign) -> u64 {
    use std::os::unix::fs::MetadataExt;
    let page = crate::os::file::page_size() as u64;
    // Some file systems (NFS, Lustre) report a preferred I/O size of MiBs as st_blksize; ignore
    // such values so heads and tails stay small (the page is the page cache's own unit).
    let block = f
        .metadata()
        .map(|m| m.blksize())
        .ok()
        .filter(|b| b.is_power_of_two() && *b <= 64 << 10)
        .unwrap_or(page);
    page.max(block).max(align.offset).next_power_of_two()
}

pub(crate) enum Storage {
    /// Host memory (gdpath's own, or someone else's: [`crate::Memory::HostPointer`]), shared
    /// with the I/O in flight on it and its CUDA registration.
    Host(HostMem),
    File(FileRegion),
    Foreign(Box<dyn ForeignMemory>),
}

/// A region's use, in one atomic word: the work items (descriptor pairs) in flight that touch
/// it in the low bits, and two flags. Every pair posted takes it and releases it, twice (its
/// local and its target region), so it is one atomic operation each time rather than a lock.
/// Every change goes through the methods below, which hold the memory orderings.
#[derive(Default)]
struct UseState(AtomicU64);

impl UseState {
    /// Deregistered (or withdrawn by the exporting peer): no new use.
    const DEREGISTERED: u64 = 1 << 63;
    /// A [`HostView`] is out: no new use, no second view.
    const VIEWED: u64 = 1 << 62;
    const COUNT: u64 = Self::VIEWED - 1;

    fn load(&self) -> u64 {
        self.0.load(Ordering::Acquire)
    }

    /// Applies `f` to the word atomically; `f` returns the new word or refuses with the word it
    /// saw, which is returned as the error.
    fn update(&self, f: impl FnMut(u64) -> Option<u64>) -> std::result::Result<u64, u64> {
        self.0.fetch_update(Ordering::AcqRel, Ordering::Acquire, f)
    }

    /// Ends one use taken by a successful `update` that added one.
    fn release(&self) {
        self.0.fetch_sub(1, Ordering::AcqRel);
    }

    /// Sets `flag` whatever the count.
    fn set(&self, flag: u64) {
        self.0.fetch_or(flag, Ordering::AcqRel);
    }

    /// Clears `flag`.
    fn clear(&self, flag: u64) {
        self.0.fetch_and(!flag, Ordering::AcqRel);
    }
}

pub(crate) struct RegionInner {
    // Field order is drop order: backend registrations go before the memory they refer to, and
    // the memory before the object that keeps it alive (`keep`).
    handles: Mutex<Vec<(&'static str, BackendHandle)>>,
    pub(crate) id: RegionId,
    pub(crate) agent: u64,
    pub(crate) kind: MemoryKind,
    pub(crate) storage: Storage,
    state: UseState,
    read_only: bool,
    /// The owner of memory other than host memory ([`crate::Agent::register_kept`] with a
    /// [`crate::GpuPointer`]), held only to be dropped last. Borrowed host memory keeps its
    /// owner in its [`HostMem`] instead, which I/O the kernel has not completed may hold past
    /// the region.
    _keep: Option<Keep>,
    /// The region's bytes in the engine's registered-memory gauge while it lives.
    _counted: Option<crate::metrics::Registered>,
}

/// A handle to registered memory. Clones share the registration; the memory is freed when the
/// last clone (including those held by in-flight transfers) is dropped.
#[derive(Clone)]
pub struct Region {
    pub(crate) inner: Arc<RegionInner>,
}

impl fmt::Debug for Region {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Region")
            .field("id", &self.inner.id)
            .field("kind", &self.inner.kind)
            .finish()
    }
}

impl Region {
    /// A region of `storage`; `read_only` memory is never written, `keep` is dropped after the
    /// storage.
    pub(crate) fn new(
        id: RegionId,
        agent: u64,
        kind: MemoryKind,
        storage: Storage,
        read_only: bool,
        keep: Option<Keep>,
    ) -> Self {
        let counted = match &storage {
            Storage::Host(b) => crate::metrics::Registered::new(&kind, b.len() as u64),
            Storage::Foreign(m) => crate::metrics::Registered::new(&kind, m.len()),
            Storage::File(_) => None,
        };
        Region {
            inner: Arc::new(RegionInner {
                handles: Mutex::new(Vec::new()),
                id,
                agent,
                kind,
                storage,
                state: UseState::default(),
                read_only,
                _keep: keep,
                _counted: counted,
            }),
        }
    }

    /// True for memory registered read-only ([`crate::HostPointer::new`] with `writable: false`,
    /// [`crate::GpuPointer::read_only`]): no transfer writes it ([`Error::ReadOnlyMemory`]), it
    /// gives no host view and is never exported. Files say it through their access mode.
    pub fn is_read_only(&self) -> bool {
        self.inner.read_only
    }

    /// The region's id.
    pub fn id(&self) -> RegionId {
        self.inner.id
    }

    /// The region's memory kind.
    pub fn kind(&self) -> &MemoryKind {
        &self.inner.kind
    }

    /// Length in bytes: the buffer's length, or a file's current size.
    pub fn len(&self) -> Result<u64> {
        match &self.inner.storage {
            Storage::Host(b) => Ok(b.len() as u64),
            Storage::File(f) => f.size(),
            Storage::Foreign(m) => Ok(m.len()),
        }
    }

    /// True when [`Region::len`] is 0.
    pub fn is_empty(&self) -> Result<bool> {
        self.len().map(|n| n == 0)
    }

    /// A descriptor for `len` bytes at `offset` in this region (bounds are checked at post).
    pub fn desc(&self, offset: u64, len: u64) -> Descriptor {
        Descriptor {
            region: self.clone(),
            offset,
            len,
        }
    }

    /// The host memory's start address, for host regions (backends use it). Not aligned for
    /// borrowed memory ([`crate::Memory::HostPointer`]).
    pub fn host_ptr(&self) -> Option<*mut u8> {
        self.host_mem().map(HostMem::as_ptr)
    }

    /// The host memory, for host regions: backends copy into and out of it.
    pub(crate) fn host_mem(&self) -> Option<&HostMem> {
        match &self.inner.storage {
            Storage::Host(m) => Some(m),
            _ => None,
        }
    }

    /// The file, for file regions (backends use it).
    pub fn file(&self) -> Option<&FileRegion> {
        match &self.inner.storage {
            Storage::File(f) => Some(f),
            _ => None,
        }
    }

    /// Backend-materialised memory (GPU, remote), for the backend that made it.
    pub fn foreign(&self) -> Option<&dyn ForeignMemory> {
        match &self.inner.storage {
            Storage::Foreign(m) => Some(m.as_ref()),
            _ => None,
        }
    }

    /// Runs `f` on the registration handle that backend `backend` stored at registration.
    pub fn with_backend_handle<R>(
        &self,
        backend: &str,
        f: impl FnOnce(Option<&BackendHandle>) -> R,
    ) -> R {
        let handles = lock(&self.inner.handles);
        f(handles.iter().find(|(b, _)| *b == backend).map(|(_, h)| h))
    }

    pub(crate) fn push_handle(&self, backend: &'static str, handle: BackendHandle) {
        lock(&self.inner.handles).push((backend, handle));
    }

    /// Exclusive access to a host region's bytes. Fails with [`Error::RegionBusy`] while a
    /// transfer uses the region or another view is out; while the view lives, posting a transfer
    /// on the region fails the same way. Not a host region: [`Error::Unsupported`]; read-only
    /// memory (the view is writable): [`Error::ReadOnlyMemory`].
    pub fn host_view(&self) -> Result<HostView<'_>> {
        let Storage::Host(buf) = &self.inner.storage else {
            return Err(Error::Unsupported {
                what: format!("a host view of {} memory", self.inner.kind),
                backend: "host",
            });
        };
        let read_only = || Error::ReadOnlyMemory {
            region: self.inner.id,
            detail: "a host view of it would be writable".into(),
        };
        if self.inner.read_only {
            return Err(read_only());
        }
        let taken = self.inner.state.update(|w| {
            (w & (UseState::COUNT | UseState::VIEWED) == 0).then_some(w | UseState::VIEWED)
        });
        if let Err(w) = taken {
            return Err(Error::RegionBusy {
                region: self.inner.id,
                reason: if w & UseState::VIEWED != 0 {
                    "another host view is out".into()
                } else {
                    format!("{} descriptor pair(s) in flight", w & UseState::COUNT)
                },
            });
        }
        // The viewed flag is set and no pair is in flight: the bytes are the view's alone.
        let Some(bytes) = buf.exclusive() else {
            // Memory the region was registered writable from is writable: not reached.
            self.inner.state.clear(UseState::VIEWED);
            return Err(read_only());
        };
        Ok(HostView {
            region: self,
            bytes,
        })
    }

    /// Takes a host region's buffer back: succeeds only when this is the last handle (no
    /// descriptor, transfer or clone holds the region) and no I/O or driver registration still
    /// uses the memory. Otherwise the region is returned with the reason; in the second case
    /// (I/O the kernel never completed) it comes back without its backend registrations.
    /// Memory gdpath does not own ([`crate::Memory::HostPointer`]) has no buffer to give
    /// ([`Error::Unsupported`]).
    pub fn into_host_buffer(self) -> std::result::Result<HostBuffer, (Region, Error)> {
        let id = self.inner.id;
        if self.host_mem().is_some_and(|m| !m.is_owned()) {
            let what = "taking a host buffer out of memory gdpath does not own".to_owned();
            return Err((
                self,
                Error::Unsupported {
                    what,
                    backend: "host",
                },
            ));
        }
        if !matches!(self.inner.storage, Storage::Host(_)) {
            let what = format!("taking a host buffer out of a {} region", self.inner.kind);
            return Err((
                self,
                Error::Unsupported {
                    what,
                    backend: "host",
                },
            ));
        }
        match Arc::try_unwrap(self.inner) {
            Ok(RegionInner {
                storage,
                handles,
                id,
                agent,
                kind,
                state,
                read_only,
                _keep,
                _counted,
            }) => {
                drop(handles); // deregister from backends before handing the memory out
                let Storage::Host(mem) = storage else {
                    unreachable!("checked to be host storage above")
                };
                mem.try_unwrap()
                    .map(HostBuffer::from_aligned)
                    .map_err(|mem| {
                        let region = Region {
                            inner: Arc::new(RegionInner {
                                handles: Mutex::new(Vec::new()),
                                id,
                                agent,
                                kind,
                                storage: Storage::Host(mem),
                                state,
                                read_only,
                                _keep,
                                _counted,
                            }),
                        };
                        let e = Error::RegionBusy {
                            region: id,
                            reason: "its memory is still used by I/O the kernel has not completed"
                                .into(),
                        };
                        (region, e)
                    })
            }
            Err(inner) => {
                let n = Arc::strong_count(&inner) - 1;
                Err((
                    Region { inner },
                    Error::RegionBusy {
                        region: id,
                        reason: format!(
                            "{n} other handle(s) (clones, descriptors or transfers) hold it"
                        ),
                    },
                ))
            }
        }
    }

    /// Marks one descriptor pair in flight; fails when deregistered or viewed.
    pub(crate) fn begin_use(&self) -> Result<UseGuard> {
        let taken = self
            .inner
            .state
            .update(|w| (w & (UseState::DEREGISTERED | UseState::VIEWED) == 0).then_some(w + 1));
        match taken {
            Ok(_) => Ok(UseGuard {
                region: self.clone(),
            }),
            Err(w) => Err(self.unusable(w)),
        }
    }

    pub(crate) fn check_usable(&self) -> Result<()> {
        let w = self.inner.state.load();
        if w & (UseState::DEREGISTERED | UseState::VIEWED) != 0 {
            return Err(self.unusable(w));
        }
        Ok(())
    }

    /// The error for a region whose use word `w` has a flag set.
    fn unusable(&self, w: u64) -> Error {
        if w & UseState::DEREGISTERED != 0 {
            Error::Deregistered {
                region: self.inner.id,
            }
        } else {
            Error::RegionBusy {
                region: self.inner.id,
                reason: "a host view is out".into(),
            }
        }
    }

    pub(crate) fn mark_deregistered(&self) -> Result<()> {
        let done = self
            .inner
            .state
            .update(|w| (w & UseState::COUNT == 0).then_some(w | UseState::DEREGISTERED));
        match done {
            Ok(_) => Ok(()),
            Err(w) => Err(Error::RegionBusy {
                region: self.inner.id,
                reason: format!("{} descriptor pair(s) in flight", w & UseState::COUNT),
            }),
        }
    }

    /// Marks the region deregistered even while pairs are in flight. The network backend does
    /// this when the peer that exported a remote region withdraws it: later posts fail with
    /// [`Error::Deregistered`]; pairs already in flight complete (the peer keeps the memory
    /// until this agent acknowledges that they have).
    pub(crate) fn mark_withdrawn(&self) {
        self.inner.state.set(UseState::DEREGISTERED);
    }

    /// A weak handle that does not keep the region alive.
    pub(crate) fn downgrade(&self) -> std::sync::Weak<RegionInner> {
        Arc::downgrade(&self.inner)
    }

    /// The region behind a weak handle, while it is alive.
    pub(crate) fn upgrade(weak: &std::sync::Weak<RegionInner>) -> Option<Region> {
        weak.upgrade().map(|inner| Region { inner })
    }

    /// Descriptor pairs in flight on this region. A pair counts from the moment `Agent::post`
    /// checks it (so a post that then fails planning held the region briefly) until it
    /// completes.
    pub fn in_flight(&self) -> usize {
        (self.inner.state.load() & UseState::COUNT) as usize
    }
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    // A panic while holding these locks leaves only counters behind; keep going.
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Keeps a region counted as in use (and alive) while a backend holds a work item.
pub(crate) struct UseGuard {
    region: Region,
}

impl UseGuard {
    /// The region held in use.
    pub(crate) fn region(&self) -> &Region {
        &self.region
    }
}

impl Drop for UseGuard {
    fn drop(&mut self) {
        // Taken by `begin_use`, so the count is at least one.
        self.region.inner.state.release();
    }
}

/// Exclusive access to a host region's bytes; see [`Region::host_view`].
pub struct HostView<'a> {
    region: &'a Region,
    bytes: Exclusive<'a>,
}

impl Deref for HostView<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &self.bytes
    }
}

impl DerefMut for HostView<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        &mut self.bytes
    }
}

impl Drop for HostView<'_> {
    fn drop(&mut self) {
        self.region.inner.state.clear(UseState::VIEWED);
    }
}

/// `len` bytes at `offset` (bytes) in a region.
#[derive(Debug, Clone)]
pub struct Descriptor {
    /// The region the bytes are in.
    pub region: Region,
    /// Where they start in the region (bytes).
    pub offset: u64,
    /// How many there are (bytes).
    pub len: u64,
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::memory::{HostBuffer, MemoryKind};
    use std::sync::atomic::AtomicBool;

    fn host_region(len: usize) -> Region {
        Region::new(
            RegionId(u64::MAX),
            0,
            MemoryKind::Host { pinned: false },
            Storage::Host(HostMem::new(HostBuffer::zeroed(len).into_aligned())),
            false,
            None,
        )
    }

    /// Uses and views race on the atomic word: a view is never granted while a use is out, no
    /// use is granted while a view is out, and every use given back leaves the count at zero.
    #[test]
    fn uses_and_views_exclude_each_other_under_contention() {
        let r = host_region(64);
        let stop = Arc::new(AtomicBool::new(false));
        let used = Arc::new(std::sync::atomic::AtomicU64::new(0));
        let users: Vec<_> = (0..2)
            .map(|_| {
                let (r, stop, used) = (r.clone(), stop.clone(), used.clone());
                std::thread::spawn(move || {
                    let mut taken = 0u64;
                    while !stop.load(Ordering::Relaxed) {
                        if let Ok(g) = r.begin_use() {
                            taken += 1;
                            used.fetch_add(1, Ordering::Relaxed);
                            drop(g);
                        }
                    }
                    taken
                })
            })
            .collect();
        let mut views = 0u64;
        // Enough views to have raced many uses, and at least one use (on a loaded machine the
        // users may not have been scheduled during the first 50 000 views); bounded in time.
        let until = std::time::Instant::now() + std::time::Duration::from_secs(10);
        while (views < 50_000 || used.load(Ordering::Relaxed) == 0)
            && std::time::Instant::now() < until
        {
            if let Ok(v) = r.host_view() {
                views += 1;
                // While the view is out no use may start, and none was out when it was granted.
                assert_eq!(r.in_flight(), 0);
                assert!(matches!(r.begin_use(), Err(Error::RegionBusy { .. })));
                drop(v);
            }
        }
        stop.store(true, Ordering::Relaxed);
        let taken: u64 = users.into_iter().map(|t| t.join().unwrap()).sum();
        assert!(views > 0 && taken > 0, "views {views}, uses {taken}");
        assert_eq!(r.in_flight(), 0);
        r.mark_deregistered().unwrap();
        assert!(matches!(r.begin_use(), Err(Error::Deregistered { .. })));
    }
}
