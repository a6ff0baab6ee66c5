//! `file-gpu`: file ↔ GPU memory through pinned bounce buffers, pipelined (the staged GDS
//! fallback, reported as `PosixDirect`, or `PosixBuffered` where O_DIRECT is refused).
//!
//! A pair is cut into `chunk`-byte pieces whose interior boundaries are aligned in the file, and
//! dealt round-robin to `threads` threads. Each thread owns two pinned bounce buffers on two
//! streams: for a read it `pread`s chunk k+1 into one buffer while the H2D copy of chunk k runs
//! from the other; for a write the D2H copy of chunk k+1 runs while chunk k is `pwrite`n. The
//! threads' requests are the queue depth (several reads in flight, as KvikIO's thread pool).
//! With `GdsConfig::slabs` set, a buffered read into GPU memory gathers the threads' chunks into
//! a few shared slabs and copies each slab at once instead ([`slabs`]).
//! Threads rather than io_uring: from the page cache (tmpfs, warm files) an O_DIRECT or buffered
//! read is a `memcpy` done by the thread that issues it (io_uring hands such requests to io-wq
//! workers anyway), so CPU parallelism is what buys bandwidth; on a disk the same requests give
//! it its queue depth.
//!
//! O_DIRECT: a read of file bytes `[s, e)` reads the aligned superset `[⌊s⌋, ⌈e⌉)` into the
//! buffer (page-aligned, pinned) and copies `[s-⌊s⌋, e-⌊s⌋)` of it to the GPU; a write places the
//! chunk at buffer offset `s-⌊s⌋`, writes the aligned middle through the O_DIRECT descriptor and
//! the unaligned head and tail (each under one page-cache block, `FileRegion::cache_block`)
//! through the buffered one, so no block is written both ways at once.

use super::bounce::{BouncePool, Pooled, Wait};
use super::cuda::gpu_buffer;
use super::fileio::{pread_at_least, pwrite_all};
use super::{Backend, Capability, PlanChoice, Preference, Refusal};
use crate::config::GdsConfig;
use crate::error::{Error, Result};
use crate::finding::ids;
use crate::memory::MemoryClass;
use crate::path::DataPath;
use crate::region::{Descriptor, DirectStatus, FileRegion};
use crate::transfer::{Op, WorkItem};
use gdpath_cuda::{Context, CudaError, DeviceBuffer, PinnedHostBuffer, Stream};
use std::fs::File;
use std::time::Duration;

mod slabs;

/// Backend name.
pub const NAME: &str = "file-gpu";

/// Largest cut unit (bytes): `FileRegion::cache_block` is at most 64 KiB.
const MAX_ALIGN: usize = 64 << 10;

/// Extra bytes per bounce buffer for realignment (two cut units).
const SLACK: usize = 2 * MAX_ALIGN;

/// Dispatcher threads: items run one after another per dispatcher, each with its own team of
/// threads; four let independent pairs (several tensors' files) overlap.
const DISPATCHERS: usize = 4;

/// How long a pair's thread waits for bounce buffers when the budget is out: they come back as
/// other pairs' threads finish (a few chunks' I/O), so a wait this long means I/O is stuck.
const WAIT: Duration = Duration::from_secs(10);

/// The staged file ↔ GPU backend. Needs the `cuda` backend for GPU memory.
pub struct FileGpu {
    cfg: GdsConfig,
    pool: BouncePool<PinnedHostBuffer>,
    tx: crossbeam_channel::Sender<WorkItem>,
}

impl std::fmt::Debug for FileGpu {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("FileGpu").field("cfg", &self.cfg).finish()
    }
}

impl FileGpu {
    /// Starts the backend's dispatcher threads. Errors: [`Error::Config`].
    pub fn new(cfg: GdsConfig) -> Result<std::sync::Arc<FileGpu>> {
        cfg.validate()?;
        let (tx, rx) = crossbeam_channel::unbounded::<WorkItem>();
        // Every dispatcher's pair at once: `threads` threads with two buffers each, or `slabs`
        // slabs of `threads` chunks.
        let size = cfg.chunk as usize + SLACK;
        let slab = (cfg.threads * cfg.chunk as usize).max(size);
        let per_pair = (cfg.threads * 2 * size).max(cfg.slabs * slab);
        let budget = (DISPATCHERS * per_pair) as u64;
        let me = std::sync::Arc::new(FileGpu {
            // Slabs and per-thread buffers share the pool: a per-thread request must not take
            // a slab.
            pool: BouncePool::new(NAME, size, budget, 2 * cfg.threads).oversize(2),
            cfg,
            tx,
        });
        for i in 0..DISPATCHERS {
            let rx = rx.clone();
            let weak = std::sync::Arc::downgrade(&me);
            std::thread::Builder::new()
                .name(format!("gdpath-file-gpu-{i}"))
                .spawn(move || {
                    for item in rx {
                        let r = match weak.upgrade() {
                            Some(b) => b.execute(&item),
                            None => Err(Error::Backend {
                                backend: NAME,
                                detail: "backend dropped".into(),
                            }),
                        };
                        item.complete(r);
                    }
                })
                .map_err(|e| Error::Backend {
                    backend: NAME,
                    detail: format!("starting threads: {e}"),
                })?;
        }
        Ok(me)
    }

    /// `n` pinned bounce buffers of `chunk + SLACK` bytes allocated in `ctx`, back to the pool
    /// when dropped. Errors: `Error::BounceExhausted`, or the allocation's error as `what`.
    fn take(&self, ctx: &Context, n: usize, what: &str) -> Result<Vec<Pooled<PinnedHostBuffer>>> {
        self.take_len(ctx, n, self.cfg.chunk as usize + SLACK, what)
    }

    /// [`FileGpu::take`] of buffers of at least `len` bytes (slabs).
    fn take_len(
        &self,
        ctx: &Context,
        n: usize,
        len: usize,
        what: &str,
    ) -> Result<Vec<Pooled<PinnedHostBuffer>>> {
        self.pool.take(n, len, Wait::For(WAIT), |len| {
            PinnedHostBuffer::new(ctx, len)
                .map_err(|e| crate::backend::cuda::memory::cuda_err(what, e))
        })
    }

    fn execute(&self, item: &WorkItem) -> Result<u64> {
        if let Some(stop) = item.stop_reason() {
            return Err(stop);
        }
        item.mark_started();
        let (gpu_d, file_d) = match (item.local().region.kind().class(), item.op()) {
            (MemoryClass::Gpu, _) => (item.local(), item.target()),
            _ => (item.target(), item.local()),
        };
        // File → GPU is a read of the file whichever side is local.
        let to_gpu = (gpu_d.region.id() == item.local().region.id()) == (item.op() == Op::Read);
        let dev = gpu_buffer(&gpu_d.region).ok_or_else(|| Error::Backend {
            backend: NAME,
            detail: format!("region {} is not GPU memory", gpu_d.region.id()),
        })?;
        let file = file_d.region.file().ok_or_else(|| Error::Backend {
            backend: NAME,
            detail: format!("region {} is not a file", file_d.region.id()),
        })?;
        let direct = match item.path() {
            DataPath::PosixDirect => file.direct_file(),
            _ => None,
        };
        let job = Job {
            be: self,
            file,
            direct,
            // Cut at the page-cache block, not only at the O_DIRECT alignment (512 B on ext4):
            // a block written through the page cache (a head or tail) and through O_DIRECT at
            // the same time by two transfers loses data — the race fixed in `posix_direct`.
            align: file
                .align()
                .offset
                .max(file.align().memory)
                .max(file.cache_block())
                .clamp(512, MAX_ALIGN as u64) as usize,
            dev,
            dev_off: gpu_d.offset as usize,
            file_off: file_d.offset,
            len: file_d.len as usize,
            chunk: self.cfg.chunk as usize,
            stop: &|| item.stop_reason(),
        };
        // Slabs for buffered reads only: a group of chunks waits for its slowest read.
        let slabs = (to_gpu && job.direct.is_none()).then_some(self.cfg.slabs);
        run(&job, to_gpu, self.cfg.threads, slabs.unwrap_or(0))?;
        Ok(file_d.len)
    }
}

/// One pair's copy.
struct Job<'a> {
    be: &'a FileGpu,
    file: &'a FileRegion,
    direct: Option<&'a File>,
    /// Cut unit, bytes: the O_DIRECT alignment (file offset, length and memory) raised to the
    /// page-cache block.
    align: usize,
    dev: &'a DeviceBuffer,
    dev_off: usize,
    file_off: u64,
    len: usize,
    chunk: usize,
    stop: &'a (dyn Fn() -> Option<Error> + Sync),
}

impl Job<'_> {
    /// Chunk `i`: (offset in the pair, length). Interior boundaries are multiples of `chunk` in
    /// the file, so only the first and last chunk can be unaligned.
    fn chunk_at(&self, i: usize) -> (usize, usize) {
        let lead = (self.file_off % self.chunk as u64) as usize;
        let start = if i == 0 { 0 } else { i * self.chunk - lead };
        let end = ((i + 1) * self.chunk - lead).min(self.len);
        (start, end - start)
    }

    fn chunks(&self) -> usize {
        if self.len == 0 {
            return 0;
        }
        let lead = (self.file_off % self.chunk as u64) as usize;
        (lead + self.len).div_ceil(self.chunk)
    }

    fn io_err(&self, op: &'static str, off: u64, e: std::io::Error) -> Error {
        Error::io(op, self.file.path(), off, e)
    }

    /// Reads file bytes `[s, s + l)` into `buf`; returns where they start in it.
    fn read_chunk(&self, buf: &mut [u8], s: u64, l: usize) -> Result<usize> {
        let a = self.align as u64;
        if let Some(fd) = self.direct {
            let lo = s / a * a;
            let hi = (s + l as u64).div_ceil(a) * a;
            let need = (s + l as u64 - lo) as usize;
            match pread_at_least(fd, &mut buf[..(hi - lo) as usize], lo, need).map_err(|(_, e)| e) {
                Ok(got) if got >= need => return Ok((s - lo) as usize),
                Ok(got) => {
                    return Err(Error::ShortFile {
                        path: self.file.path().to_owned(),
                        offset: s,
                        wanted: l as u64,
                        available: (got as u64).saturating_sub(s - lo),
                    })
                }
                // A file system may refuse one request it cannot align: do it buffered.
                Err(e) if e.raw_os_error() == Some(libc::EINVAL) => {}
                Err(e) => return Err(self.io_err("read", lo, e)),
            }
        }
        let got = pread_at_least(self.file.buffered_file(), &mut buf[..l], s, l)
            .map_err(|(_, e)| self.io_err("read", s, e))?;
        if got < l {
            return Err(Error::ShortFile {
                path: self.file.path().to_owned(),
                offset: s,
                wanted: l as u64,
                available: got as u64,
            });
        }
        Ok(0)
    }

    /// Where a chunk starting at file offset `s` sits in its bounce buffer for a write.
    fn write_lead(&self, s: u64) -> usize {
        if self.direct.is_some() {
            (s % self.align as u64) as usize
        } else {
            0
        }
    }

    /// Writes `buf[lead .. lead + l]` to file bytes `[s, s + l)`.
    fn write_chunk(&self, buf: &[u8], lead: usize, s: u64, l: usize) -> Result<()> {
        let a = self.align as u64;
        let e = s + l as u64;
        let bfd = self.file.buffered_file();
        let at = |f: u64| lead + (f - s) as usize;
        if let Some(fd) = self.direct {
            let (mid_lo, mid_hi) = (s.div_ceil(a) * a, e / a * a);
            if mid_lo < mid_hi {
                if s < mid_lo {
                    pwrite(bfd, &buf[at(s)..at(mid_lo)], s)
                        .map_err(|er| self.io_err("write", s, er))?;
                }
                match pwrite(fd, &buf[at(mid_lo)..at(mid_hi)], mid_lo) {
                    Ok(()) => {}
                    Err(er) if er.raw_os_error() == Some(libc::EINVAL) => {
                        pwrite(bfd, &buf[at(mid_lo)..at(mid_hi)], mid_lo)
                            .map_err(|er| self.io_err("write", mid_lo, er))?
                    }
                    Err(er) => return Err(self.io_err("write", mid_lo, er)),
                }
                if mid_hi < e {
                    pwrite(bfd, &buf[at(mid_hi)..at(e)], mid_hi)
                        .map_err(|er| self.io_err("write", mid_hi, er))?;
                }
                return Ok(());
            }
        }
        pwrite(bfd, &buf[at(s)..at(e)], s).map_err(|er| self.io_err("write", s, er))
    }

    /// Chunks `w, w + workers, ...` of the pair, file → GPU.
    fn reader(&self, w: usize, workers: usize) -> Result<()> {
        let ctx = self.dev.context();
        let what = "file → GPU copy";
        let cuda = |e: CudaError| crate::backend::cuda::memory::cuda_err(what, e);
        // One buffer to start with, the second once the first chunk's copy is posted: from a cold
        // pool the driver pins one buffer at a time (milliseconds each), so every thread starts
        // after one allocation (docs/benchmarks.md, "Measurements behind the defaults").
        let mut bufs = self.be.take(ctx, 1, what)?;
        let streams = [
            Stream::new(ctx).map_err(cuda)?,
            Stream::new(ctx).map_err(cuda)?,
        ];
        let mut result = Ok(());
        for (k, c) in (w..self.chunks()).step_by(workers).enumerate() {
            if let Some(e) = (self.stop)() {
                result = Err(e);
                break;
            }
            let s = k % 2;
            if s == bufs.len() {
                match self.be.take(ctx, 1, what) {
                    Ok(b) => bufs.extend(b),
                    Err(e) => {
                        result = Err(e);
                        break;
                    }
                }
            }
            let (off, l) = self.chunk_at(c);
            // The buffer's previous H2D must be done before it is overwritten.
            if let Err(e) = streams[s].synchronize() {
                result = Err(cuda(e));
                break;
            }
            let r = bufs[s]
                .as_mut_slice()
                .map_err(cuda)
                .and_then(|b| self.read_chunk(b, self.file_off + off as u64, l))
                .and_then(|at| {
                    streams[s]
                        .copy_h2d(self.dev, self.dev_off + off, &*bufs[s], at, l)
                        .map_err(cuda)
                });
            if let Err(e) = r {
                result = Err(e);
                break;
            }
        }
        for st in &streams {
            if let Err(e) = st.synchronize() {
                result = result.and(Err(cuda(e)));
            }
        }
        // The buffers go back to the pool after the streams (declared later, dropped first).
        drop(streams);
        drop(bufs);
        result
    }

    /// Chunks `w, w + workers, ...` of the pair, GPU → file.
    fn writer(&self, w: usize, workers: usize) -> Result<()> {
        let ctx = self.dev.context();
        let what = "GPU → file copy";
        let cuda = |e: CudaError| crate::backend::cuda::memory::cuda_err(what, e);
        let mut bufs = self.be.take(ctx, 2, what)?;
        let streams = [
            Stream::new(ctx).map_err(cuda)?,
            Stream::new(ctx).map_err(cuda)?,
        ];
        // The chunk each buffer holds (in flight from the GPU), still to be written.
        let mut pending: [Option<(usize, usize)>; 2] = [None, None];
        let mut result = Ok(());
        let flush = |bufs: &[Pooled<PinnedHostBuffer>],
                     pending: &mut [Option<(usize, usize)>; 2],
                     s: usize|
         -> Result<()> {
            if let Some((off, l)) = pending[s].take() {
                streams[s].synchronize().map_err(cuda)?;
                let f = self.file_off + off as u64;
                let b = bufs[s].as_slice().map_err(cuda)?;
                self.write_chunk(b, self.write_lead(f), f, l)?;
            }
            Ok(())
        };
        for (k, c) in (w..self.chunks()).step_by(workers).enumerate() {
            if let Some(e) = (self.stop)() {
                result = Err(e);
                break;
            }
            let s = k % 2;
            // Buffer s held chunk k-2: written already when chunk k-1 was enqueued.
            let (off, l) = self.chunk_at(c);
            let lead = self.write_lead(self.file_off + off as u64);
            if let Err(e) =
                streams[s].copy_d2h(&mut *bufs[s], lead, self.dev, self.dev_off + off, l)
            {
                result = Err(cuda(e));
                break;
            }
            pending[s] = Some((off, l));
            // Write chunk k-1 while chunk k comes from the GPU.
            if let Err(e) = flush(&bufs, &mut pending, 1 - s) {
                result = Err(e);
                break;
            }
        }
        for s in [0, 1] {
            let r = if result.is_ok() {
                flush(&bufs, &mut pending, s)
            } else {
                streams[s].synchronize().map_err(cuda)
            };
            result = result.and(r);
        }
        drop(streams);
        drop(bufs);
        result
    }
}

/// Runs the job on up to `threads` threads (inline for a single chunk), a read through `slabs`
/// slabs when there are at least two (and two groups of chunks to fill them).
fn run(job: &Job<'_>, to_gpu: bool, threads: usize, slabs: usize) -> Result<()> {
    let n = job.chunks();
    let workers = threads.clamp(1, n.max(1));
    if to_gpu && slabs >= 2 && n > workers {
        return slabs::read(job, workers, slabs);
    }
    let one = |w: usize| {
        if to_gpu {
            job.reader(w, workers)
        } else {
            job.writer(w, workers)
        }
    };
    super::workers::fan_out(workers, one, || Error::Backend {
        backend: NAME,
        detail: "a copy thread panicked".into(),
    })
}

/// [`pwrite_all`] with the plain `io::Error` (the callers check for `EINVAL` to fall back).
fn pwrite(f: &File, buf: &[u8], off: u64) -> std::io::Result<()> {
    pwrite_all(f, buf, off).map_err(|(_, e)| e)
}

/// The staged path for a file region: O_DIRECT when its descriptor is open, else buffered with
/// the finding that says why.
pub(crate) fn staged_choice(file: &FileRegion) -> PlanChoice {
    match file.direct_status() {
        DirectStatus::Enabled => PlanChoice::on(DataPath::PosixDirect),
        DirectStatus::Refused => PlanChoice {
            path: DataPath::PosixBuffered,
            finding: Some(ids::STORAGE_ODIRECT_UNSUPPORTED.into()),
            detail: Some(format!(
                "{}: the file system refused O_DIRECT at open",
                file.path().display()
            )),
        },
        DirectStatus::Disabled => PlanChoice {
            path: DataPath::PosixBuffered,
            finding: Some(ids::STORAGE_ODIRECT_DISABLED.into()),
            detail: Some(format!("{}: O_DIRECT switched off", file.path().display())),
        },
    }
}

/// The (GPU, file) descriptors of a pair for `backend`'s plan, the GPU one holding a device
/// buffer. Errors: a refusal without a finding for any other pair.
pub(crate) fn plan_gpu_and_file<'a>(
    backend: &str,
    local: &'a Descriptor,
    target: &'a Descriptor,
) -> std::result::Result<(&'a Descriptor, &'a Descriptor), Refusal> {
    let (g, f) = gpu_and_file(local, target).ok_or_else(|| {
        Refusal::unexplained(format!(
            "{backend} moves data between files and GPU memory only"
        ))
    })?;
    if gpu_buffer(&g.region).is_none() {
        return Err(Refusal::unexplained(format!(
            "region {} has no device buffer",
            g.region.id()
        )));
    }
    Ok((g, f))
}

/// The (GPU, file) descriptors of a pair, in either order.
pub(crate) fn gpu_and_file<'a>(
    local: &'a Descriptor,
    target: &'a Descriptor,
) -> Option<(&'a Descriptor, &'a Descriptor)> {
    match (local.region.kind().class(), target.region.kind().class()) {
        (MemoryClass::Gpu, MemoryClass::File) => Some((local, target)),
        (MemoryClass::File, MemoryClass::Gpu) => Some((target, local)),
        _ => None,
    }
}

impl Backend for FileGpu {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Vec<Capability> {
        use MemoryClass::{File, Gpu};
        let mut v = Vec::new();
        for (l, t) in [(Gpu, File), (File, Gpu)] {
            v.push(Capability::both(
                l,
                t,
                DataPath::PosixDirect,
                Preference::Fallback,
            ));
            v.push(Capability::both(
                l,
                t,
                DataPath::PosixBuffered,
                Preference::Fallback,
            ));
        }
        v
    }

    fn plan(
        &self,
        _op: Op,
        local: &Descriptor,
        target: &Descriptor,
    ) -> std::result::Result<PlanChoice, Refusal> {
        let (_, f) = plan_gpu_and_file(NAME, local, target)?;
        let file = f.region.file().ok_or_else(|| {
            Refusal::unexplained(format!("region {} is not a file", f.region.id()))
        })?;
        Ok(staged_choice(file))
    }

    fn submit(&self, items: Vec<WorkItem>) {
        for item in items {
            if let Err(crossbeam_channel::SendError(item)) = self.tx.send(item) {
                item.complete(Err(Error::Backend {
                    backend: NAME,
                    detail: "dispatcher threads are gone".into(),
                }));
            }
        }
    }
}
