//! Pageable host memory ↔ GPU through pinned bounce buffers, pipelined.
//!
//! The driver's own pageable copy (`cuMemcpyHtoD` from unpinned memory) stages through a small
//! pinned buffer with one CPU thread, so it runs far below the link (gdpath-cuda's probe saw
//! 8 GB/s against 55 GB/s pinned on an H200). Here the range is cut into chunks of the pool's
//! size, dealt round-robin to `threads` CPU threads; each thread owns two bounce buffers, each
//! with its own stream, so that its `memcpy` into (or out of) one buffer overlaps the DMA of the
//! other, and the threads' DMAs overlap each other on the copy engine. Pageable memory bandwidth
//! of one core (~10 GB/s) is what the thread count multiplies.

use super::devices::Gpus;
use super::pool::StagingPool;
use crate::error::Error;
use gdpath_cuda::{CudaError, DeviceBuffer};

/// Pieces each thread should get, for its two buffers to overlap memcpy with DMA.
const PIECES_PER_THREAD: usize = 4;
/// Smallest piece (bytes) worth a copy of its own.
const MIN_PIECE: usize = 256 << 10;

/// Host memory the threads of one copy touch in disjoint chunks.
#[derive(Clone, Copy)]
pub(crate) struct HostPtr(pub(crate) *mut u8);
// SAFETY: each thread touches only its own chunks of the range, which the caller keeps alive and
// unaliased for the duration of the copy (the work item holds the region).
unsafe impl Send for HostPtr {}
// SAFETY: as above.
unsafe impl Sync for HostPtr {}

/// Why a pipelined copy stopped.
#[derive(Debug)]
pub(crate) enum Stop {
    Cuda(CudaError),
    /// Cancelled or past its deadline between chunks.
    Engine(Error),
}

impl From<CudaError> for Stop {
    fn from(e: CudaError) -> Self {
        Stop::Cuda(e)
    }
}

/// Direction of a pageable copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    HostToDevice,
    DeviceToHost,
}

/// Copies `len` bytes between host memory at `host` and `dev[dev_off..]`. `stop` is asked
/// before every chunk.
///
/// # Safety
/// `host .. host + len` must be valid host memory, not accessed by anyone else during the call.
#[allow(clippy::too_many_arguments)]
pub(crate) unsafe fn copy(
    gpus: &Gpus,
    pool: &StagingPool,
    threads: usize,
    dir: Dir,
    host: HostPtr,
    dev: &DeviceBuffer,
    dev_off: usize,
    len: usize,
    stop: &(dyn Fn() -> Option<Error> + Sync),
) -> Result<(), Stop> {
    gdpath_cuda::check_range("pageable copy", dev.len(), dev_off, len)?;
    // Pieces small enough that every thread gets several (so its memcpy overlaps its own DMA),
    // at least 256 KiB (below that the per-copy cost of ~10 µs dominates), at most a buffer.
    let chunk = len
        .div_ceil(threads.max(1) * PIECES_PER_THREAD)
        .next_multiple_of(4096)
        .clamp(MIN_PIECE, pool.chunk().max(MIN_PIECE))
        .min(pool.chunk());
    let n = len.div_ceil(chunk);
    let workers = threads.clamp(1, n.max(1));
    let job = Job {
        gpus,
        pool,
        dir,
        host,
        dev,
        dev_off,
        len,
        chunk,
        n,
        workers,
        stop,
    };
    if workers == 1 {
        return job.worker(0);
    }
    std::thread::scope(|s| {
        let handles: Vec<_> = (0..workers)
            .map(|w| {
                let job = &job;
                s.spawn(move || job.worker(w))
            })
            .collect();
        // Join all before reporting, so no thread still touches the memory.
        let results: Vec<Result<(), Stop>> = handles
            .into_iter()
            .map(|h| {
                h.join().unwrap_or_else(|_| {
                    Err(Stop::Cuda(CudaError::InvalidArgument(
                        "a staging thread panicked".into(),
                    )))
                })
            })
            .collect();
        results
            .into_iter()
            .collect::<Result<Vec<()>, Stop>>()
            .map(|_| ())
    })
}

struct Job<'a> {
    gpus: &'a Gpus,
    pool: &'a StagingPool,
    dir: Dir,
    host: HostPtr,
    dev: &'a DeviceBuffer,
    dev_off: usize,
    len: usize,
    chunk: usize,
    n: usize,
    workers: usize,
    stop: &'a (dyn Fn() -> Option<Error> + Sync),
}

impl Job<'_> {
    /// Chunks `w, w + workers, ...` through two bounce buffers on two streams.
    fn worker(&self, w: usize) -> Result<(), Stop> {
        let ctx = self.dev.context();
        let mut bufs = self.pool.take(ctx, 2)?;
        let streams = [
            self.gpus.stream(self.dev.ordinal())?,
            self.gpus.stream(self.dev.ordinal())?,
        ];
        // D2H: the chunk each buffer holds, still to be copied out to host memory.
        let mut pending: [Option<(usize, usize)>; 2] = [None, None];
        for (k, c) in (w..self.n).step_by(self.workers).enumerate() {
            if let Some(e) = (self.stop)() {
                return Err(Stop::Engine(e));
            }
            let s = k % 2;
            let off = c * self.chunk;
            let l = self.chunk.min(self.len - off);
            streams[s].synchronize()?;
            match self.dir {
                Dir::HostToDevice => {
                    let b = bufs[s].as_mut_slice()?;
                    // SAFETY: off + l <= len: inside the caller's range; the chunk is ours.
                    unsafe {
                        std::ptr::copy_nonoverlapping(self.host.0.add(off), b.as_mut_ptr(), l)
                    };
                    streams[s].copy_h2d(self.dev, self.dev_off + off, &bufs[s], 0, l)?;
                }
                Dir::DeviceToHost => {
                    if let Some((poff, pl)) = pending[s].take() {
                        self.drain(&bufs[s], poff, pl)?;
                    }
                    streams[s].copy_d2h(&mut bufs[s], 0, self.dev, self.dev_off + off, l)?;
                    pending[s] = Some((off, l));
                }
            }
        }
        for s in [0, 1] {
            streams[s].synchronize()?;
            if let Some((poff, pl)) = pending[s].take() {
                self.drain(&bufs[s], poff, pl)?;
            }
        }
        drop(streams);
        self.pool.give(std::mem::take(&mut bufs));
        Ok(())
    }

    /// Copies a synchronized bounce buffer out to host memory at `off`.
    fn drain(&self, buf: &gdpath_cuda::PinnedHostBuffer, off: usize, l: usize) -> Result<(), Stop> {
        let b = buf.as_slice()?;
        // SAFETY: inside the caller's range; the chunk is this thread's.
        unsafe { std::ptr::copy_nonoverlapping(b.as_ptr(), self.host.0.add(off), l) };
        Ok(())
    }
}
