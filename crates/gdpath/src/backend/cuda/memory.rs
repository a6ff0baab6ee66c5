//! GPU memory regions and pinned host regions.
//!
//! - `Memory::Gpu { ordinal, len }`: allocated here (`cuMemAlloc` in the GPU's primary
//!   context), freed when the region's last handle drops — after every in-flight transfer,
//!   because work items hold the region.
//! - `Memory::GpuPointer`: someone else's device memory, wrapped without taking ownership.
//! - `Memory::Host { pinned: true }`: the region's own buffer, page-locked in place
//!   (`cuMemHostRegister`, portable) at registration and unregistered when the region is freed,
//!   before the buffer itself (the region drops backend handles first).
//! - `Memory::HostPointer { pinned: true }`: the same for someone else's memory; where its owner
//!   page-locked it already (the driver answers `CUDA_ERROR_HOST_MEMORY_ALREADY_REGISTERED`:
//!   PyTorch's pinned tensors, `cudaHostAlloc`) it is used as it is and left locked.

use super::devices::Gpus;
use crate::error::{Error, Result};
use crate::memory::{Memory, MemoryKind};
use crate::os::mem::{self as os_mem, HostMem};
use crate::region::{BackendHandle, ForeignMemory, Region};
use gdpath_cuda::{CudaError, DeviceBuffer, HostRegistration};
use std::any::Any;
use std::sync::{Mutex, MutexGuard};

/// GPU memory of a region: the device buffer (owned, or borrowed for a [`crate::GpuPointer`]).
/// Other backends (cuFile, UCX) reach it with [`gpu_buffer`].
#[derive(Debug)]
pub struct GpuMemory {
    buf: DeviceBuffer,
}

impl GpuMemory {
    /// The device buffer.
    pub fn buffer(&self) -> &DeviceBuffer {
        &self.buf
    }
}

impl ForeignMemory for GpuMemory {
    fn len(&self) -> u64 {
        self.buf.len() as u64
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

/// The device buffer of a GPU region (any backend may call this), or `None` for other kinds.
pub fn gpu_buffer(region: &Region) -> Option<&DeviceBuffer> {
    region
        .foreign()
        .and_then(|m| m.as_any().downcast_ref::<GpuMemory>())
        .map(GpuMemory::buffer)
}

/// The `cuda` backend's registration of a pinned host region.
pub(crate) struct PinnedHandle(Mutex<HostRegistration<HostMem>>);

impl PinnedHandle {
    pub(crate) fn new(reg: HostRegistration<HostMem>) -> PinnedHandle {
        PinnedHandle(Mutex::new(reg))
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, HostRegistration<HostMem>> {
        self.0.lock().unwrap_or_else(|p| p.into_inner())
    }
}

/// Whether `region` is host memory page-locked by the `cuda` backend.
pub fn is_pinned(region: &Region) -> bool {
    region.with_backend_handle(super::NAME, |h| {
        h.is_some_and(|h| h.downcast_ref::<PinnedHandle>().is_some())
    })
}

/// A failure of the `cuda` backend while doing `what`, keeping the driver's error.
pub(crate) fn cuda_err(what: impl std::fmt::Display, e: CudaError) -> Error {
    Error::Cuda {
        backend: super::NAME,
        what: what.to_string(),
        source: e,
    }
}

/// Makes the device buffer for `Memory::Gpu` / `Memory::GpuPointer`; `None` for other kinds.
pub(crate) fn materialize(gpus: &Gpus, memory: &Memory) -> Option<Result<Box<dyn ForeignMemory>>> {
    let (ordinal, made) = match memory {
        Memory::Gpu { ordinal, len } => (
            *ordinal,
            usize::try_from(*len)
                .map_err(|_| CudaError::InvalidArgument(format!("{len} bytes")))
                .and_then(|len| {
                    gpus.context(*ordinal)
                        .and_then(|ctx| DeviceBuffer::new(&ctx, len))
                }),
        ),
        Memory::GpuPointer(p) => (
            p.ordinal(),
            usize::try_from(p.len())
                .map_err(|_| CudaError::InvalidArgument(format!("{} bytes", p.len())))
                .and_then(|len| {
                    gpus.context(p.ordinal())
                        .and_then(|ctx| os_mem::borrow_device_memory(&ctx, p, len))
                }),
        ),
        _ => return None,
    };
    Some(
        made.map(|buf| Box::new(GpuMemory { buf }) as Box<dyn ForeignMemory>)
            .map_err(|e| cuda_err(format!("GPU {ordinal} memory"), e)),
    )
}

/// Page-locks a pinned host region; other regions need nothing.
pub(crate) fn register(gpus: &Gpus, region: &Region) -> Result<Option<BackendHandle>> {
    if *region.kind() != (MemoryKind::Host { pinned: true }) {
        return Ok(None);
    }
    let (Some(mem), len) = (region.host_mem(), region.len()?) else {
        return Ok(None);
    };
    if len == 0 {
        // Nothing to lock; copies of zero bytes never reach the driver.
        return Ok(None);
    }
    let ctx = gpus
        .context(0)
        .map_err(|e| cuda_err("pinning host memory", e))?;
    // The registration shares the memory, so it cannot outlive it. Memory its owner
    // page-locked already (PyTorch's pinned memory) is used as it is and left locked.
    let reg = os_mem::pin_host_memory(&ctx, mem)
        .map_err(|e| cuda_err(format!("pinning {len} bytes of host memory"), e))?;
    Ok(Some(Box::new(PinnedHandle::new(reg))))
}
