//! GPU memory through pinned host staging buffers, for UCX builds without CUDA support
//! (Debian's and Ubuntu's `libucx0`): a put copies the GPU range into a staging buffer and puts
//! from there; a get lands in a staging buffer and is copied to the GPU when it completes. The
//! pairs report `Ucx { transport }` with the finding `gdr.ucx-no-cuda`.
//!
//! The copies are synchronous on a stream of the GPU (tens of GB/s, far above what the network
//! moves), done while posting (put) or completing (get). Staging buffers are pinned
//! (`cuMemHostAlloc`, portable), registered with UCX, and reused through the shared
//! bounce-buffer pool (`backend::bounce`): at most [`MAX_FREE`] are kept, [`BUDGET`] bytes held.

use crate::backend::bounce::{Bounce, BouncePool, Pooled, Wait};
use crate::error::{Error, Result};
use gdpath_cuda::{DeviceBuffer, PinnedHostBuffer, Stream};
use gdpath_ucx::{Context, MemHandle};

/// Staging buffers kept for reuse.
const MAX_FREE: usize = 16;
/// Smallest staging buffer allocated (bytes): small messages share one size class.
const MIN_STAGE: usize = 1 << 20;
/// Most bytes of staging buffers out and kept at once (a staged pair needs one buffer of its
/// length, so this is also the longest staged pair): 16 pairs of 1 GiB in flight, the widest run
/// of `gdpath bench net` (its default queue depth and its largest message).
const BUDGET: u64 = 16 << 30;

/// A pinned host buffer registered with UCX. Field order is drop order: unmapped first.
pub(crate) struct Staged {
    mem: MemHandle,
    buf: PinnedHostBuffer,
}

impl Bounce for Staged {
    fn len(&self) -> usize {
        self.buf.len()
    }
    fn idle(&mut self) -> bool {
        self.buf.idle()
    }
}

/// A staging buffer in use: its UCX registration, for the put or get, and the buffer, back to
/// the pool when dropped (after its request ended). Field order is drop order.
pub(crate) struct Stage {
    pub(crate) mem: MemHandle,
    staged: Pooled<Staged>,
}

impl std::fmt::Debug for Stage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stage")
            .field("len", &self.staged.buf.len())
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

/// The network backend's staging buffers: the shared bounce-buffer pool of pinned buffers
/// registered with UCX.
pub(crate) struct Stages {
    pool: BouncePool<Staged>,
}

impl Default for Stages {
    fn default() -> Self {
        Stages {
            pool: BouncePool::new("ucx", MIN_STAGE, BUDGET, MAX_FREE),
        }
    }
}

impl Stages {
    /// A buffer of at least `len` bytes, pinned in `dev`'s context and mapped in `ctx`. Never
    /// waits: the buffers out come back from this same thread's progress.
    ///
    /// Errors: `Error::BounceExhausted`; the pinned allocation's `Error::Cuda`; the mapping's
    /// `Error::Ucx`.
    pub(crate) fn take(&mut self, ctx: &Context, dev: &DeviceBuffer, len: usize) -> Result<Stage> {
        let staged = self
            .pool
            .take(1, len, Wait::Never, |size| {
                let mut buf = PinnedHostBuffer::new(dev.context(), size)
                    .map_err(|e| cuda("pinned staging buffer", e))?;
                // The Staged owns the buffer together with this handle, which is dropped
                // first (field order); stages are given back only after their request ended.
                let mem =
                    crate::os::mem::ucx_map_pinned(ctx, &mut buf).map_err(|source| Error::Ucx {
                        op: "ucp_mem_map",
                        source,
                    })?;
                Ok::<_, Error>(Staged { mem, buf })
            })?
            .remove(0);
        Ok(Stage {
            mem: staged.mem.clone(),
            staged,
        })
    }

    /// Returns a buffer UCX no longer uses.
    pub(crate) fn give(&mut self, s: Stage) {
        drop(s);
    }
}

/// `len` bytes of `dev` at `off` → the stage.
pub(crate) fn d2h(dev: &DeviceBuffer, off: usize, stage: &mut Stage, len: usize) -> Result<()> {
    let s = Stream::new(dev.context()).map_err(|e| cuda("stream", e))?;
    s.copy_d2h(&mut stage.staged.buf, 0, dev, off, len)
        .and_then(|()| s.synchronize())
        .map_err(|e| cuda("GPU → staging copy", e))
}

/// The stage → `len` bytes of `dev` at `off`.
pub(crate) fn h2d(dev: &DeviceBuffer, off: usize, stage: &Stage, len: usize) -> Result<()> {
    let s = Stream::new(dev.context()).map_err(|e| cuda("stream", e))?;
    s.copy_h2d(dev, off, &stage.staged.buf, 0, len)
        .and_then(|()| s.synchronize())
        .map_err(|e| cuda("staging → GPU copy", e))
}
