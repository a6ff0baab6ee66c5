//! Many descriptors in one call: block lists ([`crate::blocks`]) and the pairs of one request
//! between the same two regions, posted through `gdpath_cuda`'s [`BlockCopier`] (one kernel
//! launch or one `cuMemcpyBatchAsync`) or, for one or two descriptors, plain async copies.
//!
//! The list is built in the copier's own vector (merged as it is built, so its length is the
//! coalesced count), the method chosen by [`choose_method`], posted on one pooled stream, and
//! waited for once. Per list: one copier lease, one stream lease, one lock of a pinned region;
//! nothing per descriptor.

use super::memory::{cuda_err, PinnedHandle};
use super::pageable::{self, Dir, HostRange, Stop};
use super::{with_pinned, Shared, NAME};
use crate::blocks::{BatchReport, CopyMethod};
use crate::error::{Error, Result};
use crate::memory::MemoryKind;
use crate::os::mem::HostMem;
use crate::path::DataPath;
use crate::region::{Descriptor, Region};
use crate::transfer::WorkItem;
use gdpath_cuda::{
    blocks::MAX_BLOCKS_PER_CALL, BlockCopy, BlockMethod, BlockRegion, CudaError, DeviceBuffer,
};
use std::sync::Arc;
use std::time::Instant;

/// Lists of at most this many (merged) descriptors go as plain copies: one or two copy calls
/// cost less than a kernel launch's upload or a batch call.
pub(crate) const COPIES_MAX: usize = 2;
/// Pairs of one request between the same regions that are batched into one list (fewer go
/// one by one, as before).
pub(crate) const BATCH_MIN_PAIRS: usize = 3;
/// The driver batch is chosen for at most this many copies: its CPU cost per copy does not
/// fall with the count, so this bounds a batch's posting time (docs/benchmarks.md,
/// "Measurements behind the defaults", block lists).
pub(crate) const BATCH_MAX_COPIES: usize = 1024;
/// Mean copy size from which the driver batch beats the kernel between host and GPU: from
/// there a copy takes long enough over PCIe to hide the batch's per-copy cost, and its copy
/// engines reach the contiguous rate where the kernel falls short of it (docs/benchmarks.md,
/// block lists).
pub(crate) const BATCH_MIN_MEAN_HOST: u64 = 1 << 20;
/// The same between GPU memory, where a copy engine is so fast that a copy must be far larger
/// to hide the batch's per-copy cost; below it the kernel is ahead (docs/benchmarks.md, block
/// lists).
pub(crate) const BATCH_MIN_MEAN_DEVICE: u64 = 64 << 20;

/// What [`choose_method`] looks at.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct ListShape {
    /// Descriptors after merging.
    pub runs: usize,
    pub bytes: u64,
    /// One side is host memory.
    pub host: bool,
    /// The kernel's PTX loads, and host memory (if any) is mapped at its host address.
    pub kernel: bool,
    /// `cuMemcpyBatchAsync` resolves.
    pub batch: bool,
    /// The path is one the copy engines or kernel can take directly (not pageable memory, not
    /// GPU pairs without P2P).
    pub direct: bool,
}

/// The method for a list: plain copies for one or two descriptors (and for pageable memory,
/// which goes through the staging pipeline per descriptor); the driver batch for up to
/// [`BATCH_MAX_COPIES`] copies averaging [`BATCH_MIN_MEAN_HOST`] (host ↔ GPU) or
/// [`BATCH_MIN_MEAN_DEVICE`] (GPU ↔ GPU); otherwise the kernel, or the batch where the kernel
/// cannot run. GPU pairs without P2P take the batch (the driver stages) or plain staged copies.
pub(crate) fn choose_method(s: ListShape) -> CopyMethod {
    if s.runs <= COPIES_MAX || (!s.direct && !s.batch) {
        return CopyMethod::Copies;
    }
    if !s.direct {
        return CopyMethod::DriverBatch;
    }
    let min_mean = if s.host {
        BATCH_MIN_MEAN_HOST
    } else {
        BATCH_MIN_MEAN_DEVICE
    };
    let mean = s.bytes / s.runs as u64;
    if s.batch && (s.runs <= BATCH_MAX_COPIES && mean >= min_mean || !s.kernel) {
        return CopyMethod::DriverBatch;
    }
    if s.kernel {
        CopyMethod::Kernel
    } else {
        CopyMethod::Copies
    }
}

/// Device memory of a side: the region's own buffer, or a CUDA IPC mapping shared with the
/// import.
pub(crate) enum DevBuf<'a> {
    Borrowed(&'a DeviceBuffer),
    Shared(Arc<DeviceBuffer>),
}

impl std::ops::Deref for DevBuf<'_> {
    type Target = DeviceBuffer;
    fn deref(&self) -> &DeviceBuffer {
        match self {
            DevBuf::Borrowed(b) => b,
            DevBuf::Shared(b) => b,
        }
    }
}

/// One end of a list, resolved.
pub(crate) enum End<'a> {
    /// GPU memory; the region starts `off` bytes into `buf`.
    Dev { buf: DevBuf<'a>, off: u64 },
    /// Pinned host memory (its registration is reached under the region's handle lock).
    Pinned { region: &'a Region, ptr: u64 },
    /// A peer's shared host memory mapped here, with its registration.
    Mapped { handle: Arc<PinnedHandle>, ptr: u64 },
    /// Pageable host memory.
    Pageable { mem: &'a HostMem },
}

impl End<'_> {
    /// The address of the region's byte 0 in the copy's address space (0 for pageable memory,
    /// whose runs are offsets).
    fn base(&self) -> u64 {
        match self {
            End::Dev { buf, off } => buf.device_ptr() + off,
            End::Pinned { ptr, .. } | End::Mapped { ptr, .. } => *ptr,
            End::Pageable { .. } => 0,
        }
    }

    /// Runs `f` on the registration of a pinned or mapped end.
    pub(crate) fn with_host<R>(
        &self,
        f: impl FnOnce(&PinnedHandle) -> std::result::Result<R, CudaError>,
    ) -> std::result::Result<R, CudaError> {
        match self {
            End::Pinned { region, .. } => with_pinned(region, f),
            End::Mapped { handle, .. } => f(handle),
            _ => Err(CudaError::InvalidArgument(
                "a page-locked host end was expected".into(),
            )),
        }
    }

    fn device(&self) -> Option<&DeviceBuffer> {
        match self {
            End::Dev { buf, .. } => Some(buf),
            _ => None,
        }
    }

    /// Offset into the device buffer of address `addr` (for a `Dev` end).
    fn buf_off(&self, addr: u64) -> usize {
        match self {
            End::Dev { buf, .. } => (addr - buf.device_ptr()) as usize,
            other => (addr - other.base()) as usize,
        }
    }
}

/// Appends a copy to `list`, merged into the last one when it continues it on both sides.
#[inline]
pub(crate) fn push_merged(list: &mut Vec<BlockCopy>, dst: u64, src: u64, len: u64) {
    if let Some(last) = list.last_mut() {
        if last.dst + last.len == dst && last.src + last.len == src {
            last.len += len;
            return;
        }
    }
    list.push(BlockCopy::new(dst, src, len));
}

fn backend_err(detail: String) -> Error {
    Error::Backend {
        backend: NAME,
        detail,
    }
}

impl Shared {
    /// The end of a pair's descriptor `d`; `gpu` is the pair's local GPU, in whose context a
    /// remote region's IPC mapping is opened.
    pub(crate) fn end<'a>(&self, d: &'a Descriptor, gpu: Option<u32>) -> Result<End<'a>> {
        if let Some(buf) = super::gpu_buffer(&d.region) {
            return Ok(End::Dev {
                buf: DevBuf::Borrowed(buf),
                off: 0,
            });
        }
        if let Some(imp) = crate::backend::ucx::ipc_import(&d.region) {
            let gpu = gpu.ok_or_else(|| backend_err("an IPC region needs a local GPU".into()))?;
            let (buf, off) = imp.mapping(&self.gpus, gpu).map_err(backend_err)?;
            return Ok(End::Dev {
                buf: DevBuf::Shared(buf),
                off,
            });
        }
        if let Some(imp) = crate::backend::ucx::shm_import(&d.region) {
            let imp = imp?;
            let handle = self.shm_pinned(imp).map_err(backend_err)?;
            let ptr = imp.mem().map_err(backend_err)?.as_ptr() as u64;
            return Ok(End::Mapped { handle, ptr });
        }
        let mem = d.region.host_mem().ok_or_else(|| {
            backend_err(format!(
                "region {} is neither GPU nor host memory",
                d.region.id()
            ))
        })?;
        Ok(if super::is_pinned(&d.region) {
            End::Pinned {
                region: &d.region,
                ptr: mem.as_ptr() as u64,
            }
        } else {
            End::Pageable { mem }
        })
    }

    /// Moves a block list item (see [`crate::blocks`]).
    pub(crate) fn execute_blocks(&self, item: &WorkItem) -> Result<(u64, BatchReport)> {
        if let Some(stop) = item.stop_reason() {
            return Err(stop);
        }
        let list = item.blocks().expect("a block item");
        item.mark_started();
        let t0 = Instant::now();
        let (src, dst) = super::ends(item.op(), item.local(), item.target());
        let gpu = local_gpu(item.local());
        let (se, de) = (self.end(src, gpu)?, self.end(dst, gpu)?);
        let rep = self.run_list(
            &se,
            &de,
            item.path(),
            item.forced_method(),
            list.descriptors(),
            t0,
            &|| item.stop_reason(),
            &mut |out, sb, db, range| {
                list.for_each_run_in(range, |s, d, len| push_merged(out, db + d, sb + s, len));
            },
        )?;
        Ok((list.bytes(), rep))
    }

    /// Moves `items`, consecutive pairs of one request between the same two regions on one
    /// direct path, as one list; completes each with the batch's report.
    pub(crate) fn execute_batch(&self, items: Vec<WorkItem>) {
        let now = Instant::now();
        for i in &items {
            i.mark_started_at(now);
        }
        let r = (|| {
            if let Some(stop) = items[0].stop_reason() {
                return Err(stop);
            }
            let first = &items[0];
            let (src, dst) = super::ends(first.op(), first.local(), first.target());
            let gpu = local_gpu(first.local());
            let (se, de) = (self.end(src, gpu)?, self.end(dst, gpu)?);
            self.run_list(
                &se,
                &de,
                first.path(),
                None,
                items.len() as u64,
                now,
                &|| first.stop_reason(),
                &mut |out, sb, db, range| {
                    let (a, b) = (
                        range.start as usize,
                        range.end.min(items.len() as u64) as usize,
                    );
                    for i in &items[a.min(b)..b] {
                        let (s, d) = super::ends(i.op(), i.local(), i.target());
                        push_merged(out, db + d.offset, sb + s.offset, s.len);
                    }
                },
            )
        })();
        let done = Instant::now();
        for i in items {
            let len = i.local().len;
            match &r {
                Ok(rep) => i.complete_batch_at(Ok(len), *rep, done),
                Err(e) => i.complete(Err(e.clone())),
            }
        }
    }

    /// Builds the list with `fill(list, src_base, dst_base, range)` (descriptors `range` of
    /// `descriptors`, appended merged), chooses the method (or takes `forced`), posts it on one
    /// stream of the driving GPU and waits. A long scattered list that goes to the kernel is
    /// posted in two parts ([`HEAD_DIV`]): the GPU starts on the head while the rest is
    /// expanded. `t0`: when the caller started, for the report's posting time.
    #[allow(clippy::too_many_arguments)]
    fn run_list(
        &self,
        src: &End<'_>,
        dst: &End<'_>,
        path: &DataPath,
        forced: Option<CopyMethod>,
        descriptors: u64,
        t0: Instant,
        stop: &(dyn Fn() -> Option<Error> + Sync),
        fill: &mut Fill<'_>,
    ) -> Result<BatchReport> {
        let what = format!("block list on {path}");
        let fail = |e: CudaError| cuda_err(&what, e);
        let drive = src
            .device()
            .or(dst.device())
            .ok_or_else(|| backend_err("a block list needs GPU memory on one side".into()))?;
        let ordinal = drive.ordinal();
        let mut lease = self.gpus.copier(ordinal).map_err(fail)?;
        let slot = &mut *lease;
        let (pageable, staged) = (
            matches!(src, End::Pageable { .. }) || matches!(dst, End::Pageable { .. }),
            *path == DataPath::Staged,
        );
        if let (Some(s), Some(d)) = (src.device(), dst.device()) {
            if s.ordinal() != d.ordinal() && !staged {
                self.gpus
                    .ensure_peer_access(s.ordinal(), d.ordinal())
                    .map_err(fail)?;
            }
        }
        let (sb, db) = (src.base(), dst.base());
        slot.list.clear();
        let kernel_ok = !pageable && !staged && slot.copier.available(BlockMethod::Kernel).is_ok();
        if kernel_ok
            && forced.is_none_or(|m| m == CopyMethod::Kernel)
            && descriptors >= PIPELINE_MIN as u64
        {
            let head = descriptors / HEAD_DIV;
            fill(&mut slot.list, sb, db, 0..head);
            // More runs in the head than the driver batch takes: whatever the rest merges to,
            // the list goes to the kernel (`choose_method`).
            if slot.list.len() > BATCH_MAX_COPIES {
                let stream = self.gpus.stream(ordinal).map_err(fail)?;
                let m = BlockMethod::Kernel;
                match post_list(&mut slot.copier, &stream, src, dst, &slot.list, m, false) {
                    Ok(first) => {
                        let head_runs = slot.list.len() as u64;
                        slot.list.clear();
                        fill(&mut slot.list, sb, db, head..descriptors);
                        let rest =
                            post_list(&mut slot.copier, &stream, src, dst, &slot.list, m, false);
                        // The head is in flight: drain the stream before any error returns.
                        let post_ns = t0.elapsed().as_nanos() as u64;
                        let synced = stream.synchronize();
                        let rest = rest.map_err(fail)?;
                        synced.map_err(fail)?;
                        return Ok(BatchReport {
                            method: CopyMethod::Kernel,
                            descriptors,
                            coalesced: head_runs + slot.list.len() as u64,
                            posted: first + rest,
                            post_ns,
                        });
                    }
                    // Nothing posted (a device that maps host memory elsewhere): the whole
                    // list takes the general path below.
                    Err(CudaError::BlockList(
                        gdpath_cuda::BlockListError::HostMappedElsewhere { .. },
                    )) => {}
                    Err(e) => return Err(fail(e)),
                }
            }
            fill(&mut slot.list, sb, db, head..descriptors);
        } else {
            fill(&mut slot.list, sb, db, 0..descriptors);
        }
        let runs = slot.list.len();
        let bytes: u64 = slot.list.iter().map(|c| c.len).sum();
        let host = matches!(src, End::Pinned { .. } | End::Mapped { .. })
            || matches!(dst, End::Pinned { .. } | End::Mapped { .. });
        let batch_ok = !pageable && slot.copier.available(BlockMethod::DriverBatch).is_ok();
        let method = match forced {
            Some(m) => m,
            None => choose_method(ListShape {
                runs,
                bytes,
                host,
                kernel: kernel_ok,
                batch: batch_ok,
                direct: !pageable && !staged,
            }),
        };
        if pageable && method != CopyMethod::Copies {
            return Err(Error::Unsupported {
                what: format!("the {method} method with pageable host memory (pin it)"),
                backend: NAME,
            });
        }
        let stream = self.gpus.stream(ordinal).map_err(fail)?;
        let mut posted = runs as u64;
        let mut method = method;
        match method {
            CopyMethod::Copies => {
                if pageable || staged {
                    drop(stream);
                    let r = self.copies_pipelined(src, dst, &slot.list, stop);
                    return r.map(|()| BatchReport {
                        method,
                        descriptors,
                        coalesced: runs as u64,
                        posted,
                        post_ns: t0.elapsed().as_nanos() as u64,
                    });
                }
                copies(&stream, src, dst, &slot.list).map_err(fail)?;
            }
            CopyMethod::Kernel | CopyMethod::DriverBatch => {
                let m = |c| match c {
                    CopyMethod::Kernel => BlockMethod::Kernel,
                    _ => BlockMethod::DriverBatch,
                };
                let list = &slot.list;
                let post = |copier: &mut gdpath_cuda::BlockCopier, m| {
                    post_list(copier, &stream, src, dst, list, m, true)
                };
                posted = match post(&mut slot.copier, m(method)) {
                    Ok(p) => p,
                    // A device that maps host memory elsewhere: the batch takes host pointers.
                    Err(CudaError::BlockList(
                        gdpath_cuda::BlockListError::HostMappedElsewhere { .. },
                    )) if forced.is_none() && batch_ok => {
                        method = CopyMethod::DriverBatch;
                        post(&mut slot.copier, m(method)).map_err(fail)?
                    }
                    Err(e) => return Err(fail(e)),
                };
            }
        }
        let post_ns = t0.elapsed().as_nanos() as u64;
        stream.synchronize().map_err(fail)?;
        Ok(BatchReport {
            method,
            descriptors,
            coalesced: runs as u64,
            posted,
            post_ns,
        })
    }

    /// Plain copies through gdpath's pipelines, one run at a time: pageable host memory
    /// (staging threads) and GPU pairs without P2P (bounce buffers).
    fn copies_pipelined(
        &self,
        src: &End<'_>,
        dst: &End<'_>,
        list: &[BlockCopy],
        stop: &(dyn Fn() -> Option<Error> + Sync),
    ) -> Result<()> {
        let stopped = |e: Stop| match e {
            Stop::Cuda(e) => cuda_err("block list copy", e),
            Stop::Engine(e) => e,
        };
        for c in list {
            if let Some(e) = stop() {
                return Err(e);
            }
            let (so, dof, len) = (src.buf_off(c.src), dst.buf_off(c.dst), c.len as usize);
            match (src, dst) {
                (End::Dev { buf: s, .. }, End::Dev { buf: d, .. }) => {
                    self.staged(s, so, d, dof, len, stop)
                }
                (End::Pageable { mem }, End::Dev { buf, .. })
                | (End::Dev { buf, .. }, End::Pageable { mem }) => {
                    let (dir, hoff, goff) = if matches!(src, End::Pageable { .. }) {
                        (Dir::HostToDevice, so, dof)
                    } else {
                        (Dir::DeviceToHost, dof, so)
                    };
                    pageable::copy(
                        &self.gpus,
                        &self.pool,
                        self.cfg.copy_threads,
                        dir,
                        HostRange { mem, off: hoff },
                        buf,
                        goff,
                        len,
                        stop,
                    )
                }
                _ => Err(Stop::Engine(backend_err(
                    "a pipelined block copy needs GPU memory on one side".into(),
                ))),
            }
            .map_err(stopped)?;
        }
        Ok(())
    }
}

/// The GPU of a pair's local descriptor, if it is GPU memory.
fn local_gpu(local: &Descriptor) -> Option<u32> {
    match local.region.kind() {
        MemoryKind::Gpu { ordinal } => Some(*ordinal),
        _ => None,
    }
}

/// One async copy per run on `stream` (not waited for).
fn copies(
    stream: &gdpath_cuda::Stream,
    src: &End<'_>,
    dst: &End<'_>,
    list: &[BlockCopy],
) -> std::result::Result<(), CudaError> {
    let offs = |c: &BlockCopy| (src.buf_off(c.src), dst.buf_off(c.dst), c.len as usize);
    match (src, dst) {
        (End::Dev { buf: s, .. }, End::Dev { buf: d, .. }) => {
            for c in list {
                let (so, dof, len) = offs(c);
                if s.ordinal() == d.ordinal() {
                    stream.copy_d2d(d, dof, s, so, len)?;
                } else {
                    stream.copy_peer(d, dof, s, so, len)?;
                }
            }
            Ok(())
        }
        (End::Dev { buf: s, .. }, host @ (End::Pinned { .. } | End::Mapped { .. })) => host
            .with_host(|h| {
                let mut h = h.lock();
                for c in list {
                    let (so, dof, len) = offs(c);
                    stream.copy_d2h(&mut *h, dof, s, so, len)?;
                }
                Ok(())
            }),
        (host @ (End::Pinned { .. } | End::Mapped { .. }), End::Dev { buf: d, .. }) => host
            .with_host(|h| {
                let h = h.lock();
                for c in list {
                    let (so, dof, len) = offs(c);
                    stream.copy_h2d(d, dof, &*h, so, len)?;
                }
                Ok(())
            }),
        _ => Err(CudaError::InvalidArgument(
            "plain block copies need GPU memory on one side and no pageable memory".into(),
        )),
    }
}

/// Lists of at least this many descriptors are posted in two calls, the first a quarter of
/// the list: the GPU starts on it while the CPU stages the rest. The block copier alternates
/// two staging slots, so the second call never waits for the first launch; posting 100,000
/// descriptors costs ~1 ms of CPU (`gdpath_cuda::blocks`), against ~1.3 ms for the GPU to
/// move 40,000 × 64 KiB within an H200, so three quarters of it are hidden that way.
pub(crate) const PIPELINE_MIN: usize = 8192;

/// Appends descriptors `range` of a list, merged, to the copier's vector, given the two ends'
/// base addresses: `fill(list, src_base, dst_base, range)`.
type Fill<'a> = dyn FnMut(&mut Vec<BlockCopy>, u64, u64, std::ops::Range<u64>) + 'a;

/// A kernel list of at least [`PIPELINE_MIN`] descriptors is expanded and posted in two parts,
/// the first `1 / HEAD_DIV` of it, one call each: the GPU starts on the head while the CPU
/// expands and stages the rest, which otherwise all precedes the first launch.
pub(crate) const HEAD_DIV: u64 = 16;

/// Where [`post_list`] cuts a list of `n` descriptors: the first call's length (all of it
/// below [`PIPELINE_MIN`]).
pub(crate) fn first_call(n: usize) -> usize {
    if n >= PIPELINE_MIN {
        n / 4
    } else {
        n
    }
}

/// The list through the block copier: with `split`, two calls for long lists
/// ([`first_call`]), each cut into calls of at most [`MAX_BLOCKS_PER_CALL`]; returns what the
/// method ran (pieces or copies). Without `split` (a part of a list posted in two parts, whose
/// GPU work already overlaps the CPU's) one call: a third call in flight would wait for the
/// first's staging slot.
#[allow(clippy::too_many_arguments)]
fn post_list(
    copier: &mut gdpath_cuda::BlockCopier,
    stream: &gdpath_cuda::Stream,
    src: &End<'_>,
    dst: &End<'_>,
    list: &[BlockCopy],
    method: BlockMethod,
    split: bool,
) -> std::result::Result<u64, CudaError> {
    let mut run = |s: BlockRegion<'_>, d: BlockRegion<'_>| {
        let mut posted = 0u64;
        let cut = if split {
            first_call(list.len())
        } else {
            list.len()
        };
        let (head, tail) = list.split_at(cut);
        for chunk in head
            .chunks(MAX_BLOCKS_PER_CALL)
            .chain(tail.chunks(MAX_BLOCKS_PER_CALL))
        {
            let r = copier.copy(
                stream,
                std::slice::from_ref(&d),
                std::slice::from_ref(&s),
                chunk,
                method,
            )?;
            posted += r.posted as u64;
        }
        Ok(posted)
    };
    match (src, dst) {
        (End::Dev { buf: s, .. }, End::Dev { buf: d, .. }) => {
            run(BlockRegion::device(s), BlockRegion::device(d))
        }
        (End::Dev { buf: s, .. }, host @ (End::Pinned { .. } | End::Mapped { .. })) => host
            .with_host(|h| {
                let mut h = h.lock();
                run(BlockRegion::device(s), BlockRegion::host_mut(&mut *h))
            }),
        (host @ (End::Pinned { .. } | End::Mapped { .. }), End::Dev { buf: d, .. }) => host
            .with_host(|h| {
                let h = h.lock();
                run(BlockRegion::host(&*h), BlockRegion::device(d))
            }),
        _ => Err(CudaError::InvalidArgument(
            "a block copy needs GPU memory on one side and no pageable memory".into(),
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn shape(runs: usize, mean: u64, host: bool) -> ListShape {
        ListShape {
            runs,
            bytes: runs as u64 * mean,
            host,
            kernel: true,
            batch: true,
            direct: true,
        }
    }

    #[test]
    fn methods_follow_count_and_size() {
        // One or two descriptors: plain copies.
        for runs in [1, 2] {
            assert_eq!(
                choose_method(shape(runs, 1 << 30, true)),
                CopyMethod::Copies
            );
        }
        // Many small blocks: the kernel, to host and within the GPU.
        assert_eq!(
            choose_method(shape(100_000, 16 << 10, true)),
            CopyMethod::Kernel
        );
        assert_eq!(
            choose_method(shape(40_000, 64 << 10, false)),
            CopyMethod::Kernel
        );
        // Few large copies: the driver batch (host from 1 MiB, device from 64 MiB).
        assert_eq!(
            choose_method(shape(64, 16 << 20, true)),
            CopyMethod::DriverBatch
        );
        assert_eq!(
            choose_method(shape(64, 16 << 20, false)),
            CopyMethod::Kernel
        );
        assert_eq!(
            choose_method(shape(8, 128 << 20, false)),
            CopyMethod::DriverBatch
        );
        assert_eq!(
            choose_method(shape(BATCH_MAX_COPIES + 1, 16 << 20, true)),
            CopyMethod::Kernel
        );
        // What cannot run is not chosen.
        let no_kernel = ListShape {
            kernel: false,
            ..shape(100_000, 16 << 10, true)
        };
        assert_eq!(choose_method(no_kernel), CopyMethod::DriverBatch);
        let neither = ListShape {
            batch: false,
            ..no_kernel
        };
        assert_eq!(choose_method(neither), CopyMethod::Copies);
        let no_batch = ListShape {
            batch: false,
            ..shape(64, 16 << 20, true)
        };
        assert_eq!(choose_method(no_batch), CopyMethod::Kernel);
        // No P2P: the driver batch stages; without it, plain staged copies.
        let staged = ListShape {
            direct: false,
            kernel: false,
            ..shape(1000, 64 << 10, false)
        };
        assert_eq!(choose_method(staged), CopyMethod::DriverBatch);
        assert_eq!(
            choose_method(ListShape {
                batch: false,
                ..staged
            }),
            CopyMethod::Copies
        );
    }

    #[test]
    fn long_lists_start_with_a_quarter() {
        assert_eq!(first_call(100), 100);
        assert_eq!(first_call(PIPELINE_MIN - 1), PIPELINE_MIN - 1);
        assert_eq!(first_call(100_000), 25_000);
    }

    #[test]
    fn merging_follows_both_sides() {
        let mut v = Vec::new();
        push_merged(&mut v, 100, 1000, 10);
        push_merged(&mut v, 110, 1010, 10);
        push_merged(&mut v, 120, 2000, 10);
        push_merged(&mut v, 0, 2010, 10);
        assert_eq!(
            v,
            [
                BlockCopy::new(100, 1000, 20),
                BlockCopy::new(120, 2000, 10),
                BlockCopy::new(0, 2010, 10)
            ]
        );
    }
}
