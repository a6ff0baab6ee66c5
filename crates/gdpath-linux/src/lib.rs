//! The engine's boundary to Linux and to the drivers' raw memory registrations: the `unsafe`
//! system calls of the engine live here, so that `gdpath` itself forbids `unsafe` code. Each
//! module wraps one concern behind safe functions and types, with the invariant that makes each
//! `unsafe` sound written where it is used. The engine re-exports this crate as `gdpath::os`;
//! its items are the engine's interface to the system, not a stable API of their own.
//!
//! - [`mem`]: aligned host allocations, the registered host memory that regions, in-flight I/O
//!   and driver registrations share (gdpath's own, or memory someone else owns with the object
//!   that keeps it alive: `HostPointer`, whose unsafe constructor is the caller's promise), raw
//!   copies into and out of it (bounds-checked, never writing read-only memory), and the
//!   registrations of memory with CUDA and UCX (`cuMemHostRegister`, `ucp_mem_map`).
//! - [`file`]: what the kernel says about a file's O_DIRECT alignment (`statx`), the page size,
//!   and the O_DIRECT open flag (safe calls through `rustix`; kept here with the other system
//!   interfaces).
//! - [`cache`], [`dl`], [`process`]: evicting a file from the page cache, probing a shared library
//!   for a symbol, leaving the process at once from a signal handler (public: the doctor, the
//!   benches and the CLI call them).
//! - [`pages`]: how much of a file is in the page cache (`mincore` on a mapping of it) and its
//!   file system's magic number (`fstatfs`), for the storage chooser.
//! - [`malloc`]: glibc's allocator thresholds (`mallopt`), which a serving agent raises.
//! - [`netif`]: the host's network interfaces and their addresses (`getifaddrs`), from which the
//!   network backend chooses the devices UCX may listen on.
//! - [`node`]: this node's identity (the kernel's boot id), shared by every process of it.
//! - [`shm`]: host memory another process of this node maps (a sealed memfd, named by pid, fd
//!   number, device and inode) and the importer's checked mapping of it through `/proc`.
//! - [`uring`]: an io_uring whose submissions own the memory they point to until the kernel
//!   completes them.
//!
//! Two invariants are upheld by the rest of the engine rather than by the types here; the
//! functions that rely on them say so:
//! 1. A region's backend registrations (UCX memory handles) are dropped before its memory
//!    (`RegionInner`'s field order), and every UCX request that uses such a handle holds the
//!    region (its work item).
//! 2. A reference (`&[u8]` / `&mut [u8]`) to a region's host bytes exists only inside a
//!    `HostView` (the engine's), which the region's use word grants only while no descriptor pair is in
//!    flight on it; transfers reach the bytes through the raw copies of [`mem::HostMem`], each
//!    within the range of its own pair (transfers the caller runs at the same time over the same
//!    bytes leave those bytes unspecified, as concurrent DMA into one buffer does).

mod cache;
mod dl;
pub mod file;
pub mod malloc;
pub mod mem;
pub mod netif;
mod node;
mod pages;
mod process;
pub mod shm;
pub mod uring;

pub use cache::{evict_file_pages, evict_page_cache};

/// A system call that failed: which one (`op`, e.g. `fdatasync`) and the error it returned.
#[derive(Debug, thiserror::Error)]
#[error("{op}: {source}")]
pub struct SysError {
    /// The system call, as its manual page names it.
    pub op: &'static str,
    /// What it returned.
    #[source]
    pub source: std::io::Error,
}

impl SysError {
    /// `op` failed with `source`.
    pub fn new(op: &'static str, source: std::io::Error) -> SysError {
        SysError { op, source }
    }
}
pub use dl::library_exports;
pub use node::boot_id;
pub use pages::{fs_magic, resident_bytes};
pub use process::exit_immediately;
pub use shm::ShmId;
