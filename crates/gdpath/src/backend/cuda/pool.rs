//! The `cuda` backend's pinned bounce buffers: the shared [`BouncePool`] with buffers of
//! `GpuConfig::chunk` bytes (`cuMemHostAlloc`, portable, so any GPU's copies may use them),
//! reused across copies: allocating pinned memory costs milliseconds, far more than a copy of one
//! chunk.

use crate::backend::bounce::{BouncePool, Pooled, Wait};
use crate::config::GpuConfig;
use crate::error::Error;
use crate::os::mem::RangeError;
use gdpath_cuda::{Context, CudaError, PinnedHostBuffer};
use std::time::Duration;

/// Why a pipelined copy stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    Cuda(CudaError),
    /// Cancelled or past its deadline between chunks.
    Engine(Error),
}

impl From<crate::backend::bounce::Exhausted> for Stop {
    fn from(e: crate::backend::bounce::Exhausted) -> Self {
        Stop::Engine(e.into())
    }
}

impl From<RangeError> for Stop {
    fn from(e: RangeError) -> Self {
        Stop::Engine(crate::backend::range_err(super::NAME, e))
    }
}

impl From<CudaError> for Stop {
    fn from(e: CudaError) -> Self {
        Stop::Cuda(e)
    }
}

/// Most buffers kept for reuse; more may be out at once, and are freed when given back.
const KEEP: usize = 64;

/// How long a copy waits for buffers when the budget is out: each comes back when the copy of
/// one chunk ends (milliseconds), so a wait this long means copies are stuck.
const WAIT: Duration = Duration::from_secs(10);

pub(crate) struct StagingPool {
    chunk: usize,
    pool: BouncePool<PinnedHostBuffer>,
}

impl StagingPool {
    /// Buffers of `cfg.chunk` bytes. Budget: every worker thread's copy at its widest (a
    /// pageable copy's `2 × copy_threads` buffers, a staged copy's `staging_buffers`), and as
    /// much again for the copies run on posting threads (small ones, see `INLINE_MAX`).
    pub(crate) fn new(cfg: &GpuConfig) -> Self {
        let per_copy = (2 * cfg.copy_threads).max(cfg.staging_buffers) as u64 * cfg.chunk;
        StagingPool {
            chunk: cfg.chunk as usize,
            pool: BouncePool::new(
                super::NAME,
                cfg.chunk as usize,
                (cfg.workers as u64 + 1) * per_copy,
                KEEP,
            ),
        }
    }

    /// Bytes per buffer.
    pub(crate) fn chunk(&self) -> usize {
        self.chunk
    }

    /// `n` buffers, from the pool or newly allocated in `ctx`; back to the pool when dropped
    /// (drop them after the copies using them are synchronized, or they are freed, not kept).
    ///
    /// Errors: [`Stop::Engine`] with `Error::BounceExhausted`; the allocation's [`Stop::Cuda`].
    pub(crate) fn take(
        &self,
        ctx: &Context,
        n: usize,
    ) -> Result<Vec<Pooled<PinnedHostBuffer>>, Stop> {
        self.pool.take(n, self.chunk, Wait::For(WAIT), |len| {
            PinnedHostBuffer::new(ctx, len).map_err(Stop::Cuda)
        })
    }
}
