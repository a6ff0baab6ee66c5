//! Pageable host memory ↔ GPU through pinned bounce buffers, pipelined.
//!
//! The driver's own pageable copy (`cuMemcpyHtoD` from unpinned memory) stages through a small
//! pinned buffer with one CPU thread, so it runs far below the link (docs/gpu.md has the figures).
//! Here the range is cut into chunks of the pool's size, dealt round-robin to `threads` CPU
//! threads; each thread owns two bounce buffers, each with its own stream, so that its `memcpy`
//! into (or out of) one buffer overlaps the DMA of the other, and the threads' DMAs overlap each
//! other on the copy engine. The rate one core reads from pageable memory is what the thread
//! count multiplies (docs/gpu.md, "Pageable staging pipeline"). Below [`DRIVER_BELOW`] the driver's own copy is faster (no threads to start)
//! and is used instead.

use super::devices::Gpus;
use super::pool::StagingPool;
pub(crate) use super::pool::Stop;
use crate::error::Error;
use crate::os::mem::HostMem;
use gdpath_cuda::{CudaError, DeviceBuffer};

/// Pieces each thread should get, for its two buffers to overlap memcpy with DMA.
const PIECES_PER_THREAD: usize = 4;
/// Smallest piece (bytes) worth a copy of its own.
const MIN_PIECE: usize = 256 << 10;
/// Fewest bytes that justify one more thread: starting a thread costs tens of µs, so each
/// thread should get hundreds of µs of one core's pageable `memcpy` (docs/gpu.md, "Pageable
/// staging pipeline").
const MIN_BYTES_PER_THREAD: usize = 4 << 20;
/// Pageable copies below this size (16 MiB) use the driver's own pageable copy, gdpath's
/// pipeline from it: the measured crossover, where the driver's single-threaded staging stops
/// winning (docs/gpu.md, "Pageable staging pipeline": the figures at 1, 4, 16 and 64 MiB).
pub(super) const DRIVER_BELOW: usize = 16 << 20;

/// How a copy of `len` bytes is cut: `(chunk, pieces, threads)`. Threads: at most `threads`, one
/// per [`MIN_BYTES_PER_THREAD`] (a copy below that runs on the calling thread), never more than
/// pieces. Chunk: small enough that every thread gets [`PIECES_PER_THREAD`] pieces, at least
/// [`MIN_PIECE`] (below that the per-copy cost of ~10 µs dominates), at most `buffer` (the
/// pool's bounce buffer size).
fn cut(len: usize, threads: usize, buffer: usize) -> (usize, usize, usize) {
    let want = threads.clamp(1, len.div_ceil(MIN_BYTES_PER_THREAD).max(1));
    let chunk = len
        .div_ceil(want * PIECES_PER_THREAD)
        .next_multiple_of(4096)
        .clamp(MIN_PIECE, buffer.max(MIN_PIECE))
        .min(buffer);
    let n = len.div_ceil(chunk);
    (chunk, n, want.clamp(1, n.max(1)))
}

/// The host side of one copy: registered host memory and the offset of the copy's range in it.
/// The threads of the copy touch disjoint chunks of the range.
#[derive(Clone, Copy)]
pub(crate) struct HostRange<'a> {
    pub(crate) mem: &'a HostMem,
    pub(crate) off: usize,
}

/// Direction of a pageable copy.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Dir {
    HostToDevice,
    DeviceToHost,
}

/// Copies `len` bytes between host memory at `host` and `dev[dev_off..]`. `stop` is asked
/// before every chunk.
#[allow(clippy::too_many_arguments)]
pub(crate) fn copy(
    gpus: &Gpus,
    pool: &StagingPool,
    threads: usize,
    dir: Dir,
    host: HostRange<'_>,
    dev: &DeviceBuffer,
    dev_off: usize,
    len: usize,
    stop: &(dyn Fn() -> Option<Error> + Sync),
) -> Result<(), Stop> {
    gdpath_cuda::check_range("pageable copy", dev.len(), dev_off, len)?;
    if len < DRIVER_BELOW {
        if let Some(e) = stop() {
            return Err(Stop::Engine(e));
        }
        let s = gpus.stream(dev.ordinal())?;
        // The driver's copy is synchronized before it returns, so the slice outlives it.
        return Ok(match dir {
            Dir::HostToDevice => host
                .mem
                .with_slice(host.off, len, |b| s.write_from_slice(dev, dev_off, b))?,
            Dir::DeviceToHost => host
                .mem
                .with_mut_slice(host.off, len, |b| s.read_into_slice(b, dev, dev_off))?,
        }?);
    }
    let (chunk, n, workers) = cut(len, threads, pool.chunk());
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
    crate::backend::workers::fan_out(
        workers,
        |w| job.worker(w),
        || {
            Stop::Cuda(CudaError::InvalidArgument(
                "a staging thread panicked".into(),
            ))
        },
    )
}

struct Job<'a> {
    gpus: &'a Gpus,
    pool: &'a StagingPool,
    dir: Dir,
    host: HostRange<'a>,
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
                    // off + l <= len: inside the caller's range; the chunk is this thread's.
                    self.host.mem.copy_out(self.host.off + off, &mut b[..l])?;
                    streams[s].copy_h2d(self.dev, self.dev_off + off, &*bufs[s], 0, l)?;
                }
                Dir::DeviceToHost => {
                    if let Some((poff, pl)) = pending[s].take() {
                        self.drain(&bufs[s], poff, pl)?;
                    }
                    streams[s].copy_d2h(&mut *bufs[s], 0, self.dev, self.dev_off + off, l)?;
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
        // The buffers go back to the pool after the streams (declared later, dropped first).
        Ok(())
    }

    /// Copies a synchronized bounce buffer out to host memory at `off`.
    fn drain(&self, buf: &gdpath_cuda::PinnedHostBuffer, off: usize, l: usize) -> Result<(), Stop> {
        let b = buf.as_slice()?;
        // Inside the caller's range; the chunk is this thread's.
        self.host.mem.copy_in(self.host.off + off, &b[..l])?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::cut;

    const MIB: usize = 1 << 20;

    #[test]
    fn small_copies_run_on_the_calling_thread() {
        // 1 MiB, 16 threads allowed, 8 MiB buffers: one thread, four 256 KiB pieces.
        assert_eq!(cut(MIB, 16, 8 * MIB), (256 << 10, 4, 1));
        // Below one piece: one piece of the whole (rounded to the minimum piece).
        assert_eq!(cut(4096, 16, 8 * MIB), (256 << 10, 1, 1));
    }

    #[test]
    fn threads_grow_with_the_bytes() {
        // 16 MiB: four threads of 4 MiB, four 1 MiB pieces each.
        assert_eq!(cut(16 * MIB, 16, 8 * MIB), (MIB, 16, 4));
        // 1 GiB: every allowed thread, pieces capped at the buffer.
        let (chunk, n, t) = cut(1 << 30, 16, 8 * MIB);
        assert_eq!((chunk, n, t), (8 * MIB, 128, 16));
    }

    #[test]
    fn pieces_cover_the_range_and_threads_never_exceed_pieces() {
        for len in [1, 4095, MIB + 1, 5 * MIB + 17, 33 * MIB, 300 * MIB] {
            for threads in [0, 1, 3, 16] {
                let (chunk, n, t) = cut(len, threads, 8 * MIB);
                assert!(chunk * n >= len && chunk * (n - 1) < len, "{len} {threads}");
                assert!(
                    (1..=n).contains(&t),
                    "{len} {threads}: {t} threads for {n} pieces"
                );
                assert!(t <= threads.max(1));
            }
        }
    }
}
