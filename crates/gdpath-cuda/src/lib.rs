//! gdpath's hardware layer: the CUDA driver API, NVML and cuFile, loaded at run time, as safe
//! RAII types, plus [`gather_facts`] which fills [`gdpath_topo::facts::DriverFacts`].
//!
//! Nothing is linked at build time: the crate builds and its CPU tests run on a machine without
//! any NVIDIA software, and at run time a missing library is a [`CudaError::LibraryMissing`]
//! naming the library and what installs it. See `docs/gpu.md` for how each library is found,
//! which facts come from which call, and the version policy.
//!
//! Shapes in one place:
//! - [`Cuda`] → [`Device`] (queries) → [`Context`] (primary context, retained).
//! - [`DeviceBuffer`], [`PinnedHostBuffer`], [`HostRegistration`]: memory; [`Stream`] copies
//!   between them asynchronously and keeps them alive until [`Stream::synchronize`].
//! - [`Event`] for timing; [`enable_peer_access`] for P2P.
//! - [`blocks`]: block-list copies ([`BlockCopier`], [`BlockRegion`], [`BlockCopy`]): N
//!   descriptors with one `cuMemcpyBatchAsync` or one kernel launch, for KV-cache blocks.
//! - [`IpcMemHandle`]: CUDA IPC, device memory shared with another process.
//! - [`cufile`]: [`CuFileDriver`], [`CuFileBuf`], [`CuFileHandle`].
//! - [`pattern`] and the `Stream::{fill_pattern, verify_pattern, compare}` kernels to verify
//!   data on the GPU without copying it back.
//!
//! Units: bytes; milliseconds for events; GB/s = 1e9 B/s.

pub mod blocks;
mod context;
mod cuda;
pub mod cufile;
mod driver;
mod error;
pub mod facts;
mod ipc;
mod kernels;
pub mod loader;
mod memory;
mod module;
pub mod nvml;
pub mod nvtx;
pub mod pattern;
mod pci;
mod slab;
mod stream;

pub use blocks::{
    BatchAbi, BlockCopier, BlockCopy, BlockCopyReport, BlockListError, BlockMethod, BlockRegion,
    KernelTuning, MemLocation, Unavailable,
};
pub use context::{enable_peer_access, Context, PeerAccess};
pub use cuda::{Cuda, Device, DeviceAttribute};
pub use cufile::{CuFileBuf, CuFileDriver, CuFileHandle, CuFileProperties};
pub use error::{CudaError, Library};
pub use facts::gather_facts;
pub use ipc::IpcMemHandle;
pub use memory::{
    check_range, DeviceBuffer, HostMemory, HostRegistration, PinnedHost, PinnedHostBuffer,
    RawHostMemory,
};
pub use pattern::Verdict;
pub use slab::{PinnedSlab, SlabPart};
pub use stream::{Event, Stream};
