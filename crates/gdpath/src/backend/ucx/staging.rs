//! GPU memory through pinned host staging buffers, for UCX builds without CUDA support
//! (Debian's and Ubuntu's `libucx0`): a put copies the GPU range into a staging buffer and puts
//! from there; a get lands in a staging buffer and is copied to the GPU when it completes. The
//! pairs report `Ucx { transport }` with the finding `gdr.ucx-no-cuda`.
//!
//! The copies are synchronous on a stream of the GPU (tens of GB/s, far above what the network
//! moves), done while posting (put) or completing (get). Staging buffers are pinned
//! (`cuMemHostAlloc`, portable), registered with UCX, and reused: at most [`MAX_FREE`] are kept.

use crate::error::{Error, Result};
use gdpath_cuda::{DeviceBuffer, PinnedHostBuffer, Stream};
use gdpath_ucx::{Context, MemHandle};

/// Staging buffers kept for reuse.
const MAX_FREE: usize = 16;
/// Smallest staging buffer allocated (bytes): small messages share one size class.
const MIN_STAGE: usize = 1 << 20;

/// A pinned host buffer registered with UCX. Field order is drop order: unmapped first.
pub(crate) struct Stage {
    pub(crate) mem: MemHandle,
    buf: PinnedHostBuffer,
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("len", &self.buf.len())
            .finish()
    }
}

fn cuda(what: &str, e: gdpath_cuda::CudaError) -> Error {
    Error::Cuda {
        backend: "ucx",
        what: what.into(),
        source: e,
    }
}

/// Free staging buffers.
#[derive(Default)]
pub(crate) struct Stages {
    free: Vec<Stage>,
}

impl Stages {
    /// A buffer of at least `len` bytes, pinned in `dev`'s context.
    pub(crate) fn take(&mut self, ctx: &Context, dev: &DeviceBuffer, len: usize) -> Result<Stage> {
        if let Some(i) = self.free.iter().position(|s| s.buf.len() >= len) {
            return Ok(self.free.swap_remove(i));
        }
        let mut buf = PinnedHostBuffer::new(dev.context(), len.max(MIN_STAGE))
            .map_err(|e| cuda("pinned staging buffer", e))?;
        // The Stage owns the buffer together with this handle, which is dropped first (field
        // order); stages are given back only after their request ended.
        let mem = crate::os::mem::ucx_map_pinned(ctx, &mut buf).map_err(|source| Error::Ucx {
            op: "ucp_mem_map",
            source,
        })?;
        Ok(Stage { mem, buf })
    }

    /// Returns a buffer UCX no longer uses.
    pub(crate) fn give(&mut self, s: Stage) {
        if self.free.len() < MAX_FREE {
            self.free.push(s);
        }
    }
}

/// `len` bytes of `dev` at `off` → the stage.
pub(crate) fn d2h(dev: &DeviceBuffer, off: usize, stage: &mut Stage, len: usize) -> Result<()> {
    let s = Stream::new(dev.context()).map_err(|e| cuda("stream", e))?;
    s.copy_d2h(&mut stage.buf, 0, dev, off, len)
        .and_then(|()| s.synchronize())
        .map_err(|e| cuda("GPU → staging copy", e))
}

/// The stage → `len` bytes of `dev` at `off`.
pub(crate) fn h2d(dev: &DeviceBuffer, off: usize, stage: &Stage, len: usize) -> Result<()> {
    let s = Stream::new(dev.context()).map_err(|e| cuda("stream", e))?;
    s.copy_h2d(dev, off, &stage.buf, 0, len)
        .and_then(|()| s.synchronize())
        .map_err(|e| cuda("staging → GPU copy", e))
}
