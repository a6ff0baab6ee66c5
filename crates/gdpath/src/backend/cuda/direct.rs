//! Direct copies by the GPUs' copy engines: peer copies (P2P over NVLink or PCIe, and copies
//! within one GPU) and pinned host ↔ GPU copies. Each enqueues one asynchronous copy on a pooled
//! stream and waits for it.

use super::devices::Gpus;
use super::memory::PinnedHandle;
use gdpath_cuda::{CudaError, DeviceBuffer};

/// GPU → GPU (`cuMemcpyPeerAsync` on a stream of the source GPU; peer access must already be on
/// for a direct copy, see [`Gpus::ensure_peer_access`]), or within one GPU
/// (`cuMemcpyDtoDAsync`).
pub(crate) fn peer(
    gpus: &Gpus,
    src: &DeviceBuffer,
    src_off: usize,
    dst: &DeviceBuffer,
    dst_off: usize,
    len: usize,
) -> Result<(), CudaError> {
    let stream = gpus.stream(src.ordinal())?;
    if src.ordinal() == dst.ordinal() {
        stream.copy_d2d(dst, dst_off, src, src_off, len)?;
    } else {
        stream.copy_peer(dst, dst_off, src, src_off, len)?;
    }
    stream.synchronize()
}

/// Pinned host → GPU (`cuMemcpyHtoDAsync`).
pub(crate) fn h2d_pinned(
    gpus: &Gpus,
    src: &PinnedHandle,
    src_off: usize,
    dst: &DeviceBuffer,
    dst_off: usize,
    len: usize,
) -> Result<(), CudaError> {
    let stream = gpus.stream(dst.ordinal())?;
    stream.copy_h2d(dst, dst_off, &*src.lock(), src_off, len)?;
    stream.synchronize()
}

/// GPU → pinned host (`cuMemcpyDtoHAsync`).
pub(crate) fn d2h_pinned(
    gpus: &Gpus,
    src: &DeviceBuffer,
    src_off: usize,
    dst: &PinnedHandle,
    dst_off: usize,
    len: usize,
) -> Result<(), CudaError> {
    let stream = gpus.stream(src.ordinal())?;
    stream.copy_d2h(&mut *dst.lock(), dst_off, src, src_off, len)?;
    stream.synchronize()
}
