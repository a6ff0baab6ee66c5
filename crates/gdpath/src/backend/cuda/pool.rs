//! A pool of pinned bounce buffers (`cuMemHostAlloc`, portable, so any GPU's copies may use
//! them), all of one size, reused across copies: allocating pinned memory costs milliseconds,
//! far more than a copy of one chunk.

use gdpath_cuda::{Context, CudaError, PinnedHostBuffer};
use std::sync::Mutex;

/// Most buffers kept for reuse; more may be out at once, and are freed when given back.
const KEEP: usize = 64;

pub(crate) struct StagingPool {
    chunk: usize,
    free: Mutex<Vec<PinnedHostBuffer>>,
}

impl StagingPool {
    pub(crate) fn new(chunk: usize) -> Self {
        StagingPool {
            chunk,
            free: Mutex::new(Vec::new()),
        }
    }

    /// Bytes per buffer.
    pub(crate) fn chunk(&self) -> usize {
        self.chunk
    }

    /// `n` buffers, from the pool or newly allocated in `ctx`.
    pub(crate) fn take(&self, ctx: &Context, n: usize) -> Result<Vec<PinnedHostBuffer>, CudaError> {
        let mut out = {
            let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
            let k = free.len().saturating_sub(n);
            free.split_off(k)
        };
        while out.len() < n {
            out.push(PinnedHostBuffer::new(ctx, self.chunk)?);
        }
        Ok(out)
    }

    /// Returns buffers whose copies have been synchronized.
    pub(crate) fn give(&self, bufs: Vec<PinnedHostBuffer>) {
        let mut free = self.free.lock().unwrap_or_else(|p| p.into_inner());
        for b in bufs {
            if free.len() < KEEP {
                free.push(b);
            }
        }
    }
}
