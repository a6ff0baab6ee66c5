//! File → GPU through slabs: the pair's chunks are read by the job's threads round-robin, as in
//! the per-thread pipeline, but into `n` shared pinned slabs of `workers × chunk` bytes, where
//! chunk `c` sits at its offset from the first chunk of its group `c / workers`; whichever thread
//! reads a group's last chunk posts one H2D copy of the whole slab. A thread may run `n - 1`
//! groups ahead of the slowest: before it writes a slab again it waits until the slab's previous
//! group was posted and its copy is done.
//!
//! Why: the CPU's reads out of the page cache run faster in smaller pieces, while the copy engine
//! loses its rate to per-copy cost on small copies; slabs give both small reads and large copies
//! (figures: docs/benchmarks.md, "Measurements behind the defaults"). Only buffered reads take
//! this path (the chooser picks it for files in memory): a group waits for its slowest read,
//! which a disk would stall.

use super::Job;
use crate::backend::bounce::BouncePool;
use crate::error::{Error, Result};
use gdpath_cuda::{CudaError, PinnedHostBuffer, PinnedSlab, Stream};
use std::sync::atomic::{AtomicBool, AtomicUsize, Ordering};
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

/// How long a thread waits for a slab's previous group before it calls the read stuck: the
/// wait is on other threads' reads of one chunk each, so this long means I/O made no progress
/// (a slow read only delays the group, as it would delay its own thread's pipeline). The waiting
/// threads then stop; the transfer fails when the stuck read returns.
const STALL: Duration = Duration::from_secs(120);

/// How long a waiting thread spins before it sleeps until a post wakes it: about one chunk's
/// copy out of the page cache, the usual wait.
const SPIN: Duration = Duration::from_micros(50);

/// A slab over a bounce buffer out of the backend's pool, given back when it drops (a panic
/// included).
struct Slab {
    slab: Option<PinnedSlab>,
    pool: BouncePool<PinnedHostBuffer>,
}

impl std::ops::Deref for Slab {
    type Target = PinnedSlab;
    fn deref(&self) -> &PinnedSlab {
        self.slab.as_ref().expect("present until dropped")
    }
}

impl Drop for Slab {
    fn drop(&mut self) {
        if let Some(s) = self.slab.take() {
            // A buffer a stream still holds is freed by the pool, not kept.
            self.pool.give(s.into_inner());
        }
    }
}

/// The state the job's threads share.
struct Slabs<'j, 'a> {
    job: &'j Job<'a>,
    workers: usize,
    /// Taken from the pool by the first thread that needs each (the driver pins one buffer at a
    /// time, so a cold pool lets the first group start after one allocation).
    slabs: Vec<OnceLock<std::result::Result<Slab, Error>>>,
    streams: Vec<Stream>,
    /// Per group: chunks still to be read into it.
    left: Vec<AtomicUsize>,
    /// Per slab: the number of the last group whose copy was posted from it, plus one.
    posted: Vec<AtomicUsize>,
    /// Set by a thread that failed (or panicked): the others stop at their next chunk or wait.
    failed: AtomicBool,
    /// Wakes waiting threads when a group is posted or a thread fails.
    gate: Mutex<()>,
    woken: Condvar,
}

/// Marks the job failed when its thread ends in an error or a panic, and wakes the waiters.
struct FailGuard<'s, 'j, 'a> {
    s: &'s Slabs<'j, 'a>,
    ok: bool,
}

impl Drop for FailGuard<'_, '_, '_> {
    fn drop(&mut self) {
        if !self.ok {
            self.s.failed.store(true, Ordering::Release);
            self.s.wake();
        }
    }
}

/// Reads `job` (file → GPU) with `workers` threads through `n` slabs (at least 2). Errors: the
/// read's, the copy's, a bounce-buffer allocation's, the job's stop reason, and
/// `Error::Backend` when a slab's previous group is not posted within [`STALL`].
pub(super) fn read(job: &Job<'_>, workers: usize, n: usize) -> Result<()> {
    let ctx = job.dev.context();
    let chunks = job.chunks();
    let groups = chunks.div_ceil(workers);
    let streams = (0..n.min(groups.max(1)))
        .map(|_| Stream::new(ctx).map_err(cuda))
        .collect::<Result<Vec<_>>>()?;
    let s = Slabs {
        job,
        workers,
        slabs: (0..streams.len()).map(|_| OnceLock::new()).collect(),
        left: (0..groups)
            .map(|g| AtomicUsize::new(workers.min(chunks - g * workers)))
            .collect(),
        posted: (0..streams.len()).map(|_| AtomicUsize::new(0)).collect(),
        streams,
        failed: AtomicBool::new(false),
        gate: Mutex::new(()),
        woken: Condvar::new(),
    };
    let ran = super::super::workers::fan_out(
        workers,
        |w| {
            let mut guard = FailGuard { s: &s, ok: false };
            let r = s.thread(w);
            guard.ok = r.is_ok();
            r
        },
        || Error::Backend {
            backend: super::NAME,
            detail: "a copy thread panicked".into(),
        },
    );
    // Every posted copy done before the slabs go back to the pool, and the slabs back before
    // the streams drop: after a failed wait a stream still holds its slab's buffer, which the
    // pool then frees rather than keeps.
    let synced = s
        .streams
        .iter()
        .try_for_each(|st| st.synchronize().map_err(cuda));
    let Slabs { streams, slabs, .. } = s;
    drop(slabs);
    drop(streams);
    ran.and(synced)
}

fn cuda(e: CudaError) -> Error {
    crate::backend::cuda::memory::cuda_err("file → GPU copy", e)
}

impl Slabs<'_, '_> {
    /// Thread `w`: chunks `w, w + workers, ...`, chunk `g · workers + w` of group `g`.
    fn thread(&self, w: usize) -> Result<()> {
        let n = self.slabs.len();
        for g in 0..self.left.len() {
            let c = g * self.workers + w;
            if c >= self.job.chunks() {
                break;
            }
            if let Some(e) = (self.job.stop)() {
                return Err(e);
            }
            if self.failed.load(Ordering::Acquire) {
                return Ok(()); // another thread failed and reports why
            }
            let j = g % n;
            if g >= n && !self.wait_posted(j, g - n + 1)? {
                return Ok(()); // another thread failed and reports why
            }
            let slab = match self.slabs[j].get_or_init(|| self.take()) {
                Ok(s) => s,
                Err(e) => return Err(e.clone()),
            };
            // The slab's previous copy must be done before it is overwritten.
            slab.wait_copied().map_err(cuda)?;
            self.piece(slab, g, c)?;
            if self.left[g].fetch_sub(1, Ordering::AcqRel) == 1 {
                self.post(slab, g, j)?;
            }
        }
        Ok(())
    }

    /// A slab from the pool: `workers` chunks (a group spans at most that many bytes).
    fn take(&self) -> std::result::Result<Slab, Error> {
        let len = self.workers * self.job.chunk;
        let mut got = self
            .job
            .be
            .take_len(self.job.dev.context(), 1, len, "file → GPU copy")?;
        let buf = got.pop().expect("one buffer taken").into_inner();
        let pool = self.job.be.pool.clone();
        match PinnedSlab::new(self.job.dev.context(), buf) {
            Ok(slab) => Ok(Slab {
                slab: Some(slab),
                pool,
            }),
            Err((e, buf)) => {
                pool.give(buf);
                Err(cuda(e))
            }
        }
    }

    /// Pair offset of group `g`'s first byte.
    fn group_start(&self, g: usize) -> usize {
        self.job.chunk_at(g * self.workers).0
    }

    /// Reads chunk `c` of group `g` into its place in `slab`.
    fn piece(&self, slab: &Slab, g: usize, c: usize) -> Result<()> {
        let (off, l) = self.job.chunk_at(c);
        let at = off - self.group_start(g);
        // A group spans at most `workers` chunks of at most `chunk` bytes: the slab's length.
        let mut part = slab.part(at..at + l).map_err(cuda)?;
        let lead = self
            .job
            .read_chunk(&mut part, self.job.file_off + off as u64, l)?;
        debug_assert_eq!(lead, 0, "slabs take buffered reads only");
        Ok(())
    }

    /// Posts group `g`'s copy from slab `j` (every chunk of it read).
    fn post(&self, slab: &Slab, g: usize, j: usize) -> Result<()> {
        let start = self.group_start(g);
        let last = ((g + 1) * self.workers).min(self.job.chunks()) - 1;
        let (o, l) = self.job.chunk_at(last);
        slab.copy_h2d(
            &self.streams[j],
            self.job.dev,
            self.job.dev_off + start,
            0,
            o + l - start,
        )
        .map_err(cuda)?;
        self.posted[j].store(g + 1, Ordering::Release);
        self.wake();
        Ok(())
    }

    /// Wakes every waiting thread (after `posted` or `failed` changed).
    fn wake(&self) {
        // Taking the lock orders this wake after a waiter's check of the counters.
        drop(self.gate.lock().unwrap_or_else(|p| p.into_inner()));
        self.woken.notify_all();
    }

    /// Waits until slab `j`'s group `want - 1` is posted: `Ok(true)`; `Ok(false)` when another
    /// thread failed meanwhile. Spins for [`SPIN`], then sleeps until a post or a failure wakes
    /// it. Errors: the job's stop reason; `Error::Backend` after [`STALL`].
    fn wait_posted(&self, j: usize, want: usize) -> Result<bool> {
        let ready = || self.posted[j].load(Ordering::Acquire) >= want;
        let failed = || self.failed.load(Ordering::Acquire);
        let t0 = Instant::now();
        while t0.elapsed() < SPIN {
            for _ in 0..64 {
                if ready() {
                    return Ok(true);
                }
                std::hint::spin_loop();
            }
            if failed() {
                return Ok(false);
            }
        }
        let mut gate = self.gate.lock().unwrap_or_else(|p| p.into_inner());
        loop {
            if ready() {
                return Ok(true);
            }
            if failed() {
                return Ok(false);
            }
            if let Some(e) = (self.job.stop)() {
                return Err(e);
            }
            if t0.elapsed() > STALL {
                return Err(Error::Backend {
                    backend: super::NAME,
                    detail: format!(
                        "a slab's previous group was not posted within {} s: a read is stuck",
                        STALL.as_secs()
                    ),
                });
            }
            // Woken by a post or a failure; the timeout is for the job's stop reason.
            gate = self
                .woken
                .wait_timeout(gate, Duration::from_millis(10))
                .unwrap_or_else(|p| p.into_inner())
                .0;
        }
    }
}
