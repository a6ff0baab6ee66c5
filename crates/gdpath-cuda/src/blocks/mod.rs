//! Block-list copies: N (dst, src, len) descriptors enqueued on a stream with one driver call
//! or one kernel launch, for KV-cache blocks (many thousands of small blocks per request, where
//! one copy call per block spends the time posting, not copying).
//!
//! Shapes: a [`BlockCopier`] (per context; owns reusable staging) takes the destination and
//! source [`BlockRegion`]s (device memory of this GPU, of a peer GPU, another process's memory
//! opened from its [`crate::IpcMemHandle`], pinned host memory) and a slice of [`BlockCopy`]
//! descriptors with absolute addresses inside them. It checks every descriptor against the
//! regions (O(N log R)), merges descriptors that continue each other ([`coalesce`]), and posts
//! the list by the [`BlockMethod`] the caller picks:
//!
//! - [`BlockMethod::DriverBatch`]: `cuMemcpyBatchAsync` (CUDA 12.8+, see `batch.rs` for the ABI
//!   choice). Copy engines move the data and no SM is used, but the driver prepares each copy
//!   on the CPU, whatever the count: for lists of few, large copies.
//! - [`BlockMethod::Kernel`]: one launch of a gather/scatter kernel (`src/ptx/copy_blocks.cu`)
//!   over descriptors uploaded from pinned staging: for many small copies, within a GPU, to a
//!   peer, and to or from pinned host memory.
//!
//! Why the kernel's defaults are what they are (the device figures and the measurements behind
//! them are in docs/gpu.md, "Block-list copies"):
//! - one warp per descriptor, so every warp streams its own block with no CTA-wide barrier;
//!   256-thread CTAs, 2 per SM ([`KernelTuning`]);
//! - per step each lane loads four 16-byte vectors before storing them, so each SM keeps about
//!   HBM's bandwidth-latency product per SM in flight (far above what PCIe reads need): the
//!   copy is bandwidth-bound, not latency-bound;
//! - every warp access is 512 contiguous bytes (four full 128-byte lines): whole L2 sectors
//!   for HBM, and full-line posted writes that PCIe write combining turns into large TLPs when
//!   the destination is pinned host memory;
//! - descriptors longer than the list's bytes over twice the grid's warps (and at least
//!   64 KiB) are split, so a coalesced run cannot leave one warp working alone, while small
//!   blocks stay whole;
//! - the next descriptor is loaded while the current one is copied, hiding its latency;
//! - the host side is one pass per list (check, coalesce and write into pinned staging
//!   together) and one upload, so posting costs little next to moving the bytes over PCIe.
//!
//! On the driver batch: copies within a batch run in no particular order and may overlap each
//! other in time; the batch as a whole is stream-ordered. Descriptors whose destinations
//! overlap give undefined bytes with either method (the engine's layout check rules them out).
//!
//! Units: bytes; addresses are 64-bit virtual addresses of the unified address space.

mod batch;
mod descriptor_list;
mod kernel;

use std::fmt;
use std::marker::PhantomData;
use std::sync::atomic::Ordering;
use std::sync::Arc;

pub use crate::error::blocks::{BlockListError, BlockMethod, Side, Unavailable};
pub use batch::{BatchAbi, MemLocation};
pub use descriptor_list::{check_list, coalesce, BlockCopy, MAX_BLOCKS_PER_CALL};
pub use kernel::KernelTuning;

use crate::context::{enable_peer_access, Context};
use crate::driver::call;
use crate::driver::sys::{
    BatchFn, CU_MEMCPY_FLAG_DEFAULT, CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE,
};
use crate::error::CudaError;
use crate::memory::{DevMem, DeviceBuffer, HostKeep, PinnedHost};
use crate::stream::{Held, Stream};
use batch::BatchArrays;
use descriptor_list::RegionIndex;

/// What a block-list copy enqueued.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BlockCopyReport {
    /// The method used.
    pub method: BlockMethod,
    /// Descriptors given.
    pub descriptors: usize,
    /// Descriptors after coalescing.
    pub coalesced: usize,
    /// Copies the driver was given (batch) or pieces the kernel ran over (after splitting).
    pub posted: usize,
    /// Bytes moved.
    pub bytes: u64,
    /// The `cuMemcpyBatchAsync` ABI, for [`BlockMethod::DriverBatch`].
    pub batch_abi: Option<BatchAbi>,
    /// (CTAs, threads per CTA) of the launch, for [`BlockMethod::Kernel`].
    pub grid: Option<(u32, u32)>,
}

enum Keep {
    Device(Arc<DevMem>),
    Host(Arc<dyn HostKeep>),
}

/// Memory a block list may read or write, borrowed for the call: its address range, where it
/// is, and what the stream must keep alive until it is synchronized.
pub struct BlockRegion<'a> {
    addr: u64,
    len: u64,
    location: MemLocation,
    writable: bool,
    keep: Keep,
    /// The context of device memory on another GPU, for enabling peer access.
    peer: Option<Context>,
    _borrow: PhantomData<&'a ()>,
}

impl fmt::Debug for BlockRegion<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockRegion")
            .field("addr", &format_args!("{:#x}", self.addr))
            .field("len", &self.len)
            .field("location", &self.location)
            .field("writable", &self.writable)
            .finish()
    }
}

impl<'a> BlockRegion<'a> {
    /// Device memory: of any GPU, or another process's memory opened with
    /// [`crate::IpcMemHandle::open`]. Readable and writable.
    pub fn device(buf: &'a DeviceBuffer) -> BlockRegion<'a> {
        BlockRegion {
            addr: buf.device_ptr(),
            len: buf.len() as u64,
            location: MemLocation::Device(buf.ordinal()),
            writable: true,
            keep: Keep::Device(buf.inner.clone()),
            peer: Some(buf.context().clone()),
            _borrow: PhantomData,
        }
    }

    /// Pinned or registered host memory as a source (read only). Its address is the host
    /// pointer: with unified addressing the copy engines and kernels use the same value.
    pub fn host<H: PinnedHost>(buf: &'a H) -> BlockRegion<'a> {
        Self::host_region(buf, false)
    }

    /// Pinned or registered host memory as a destination. The `&mut` borrow ends with the
    /// region, but the CPU cannot read the memory until the stream has been synchronized
    /// ([`CudaError::BufferBusy`] until then), as after [`Stream::copy_d2h`].
    pub fn host_mut<H: PinnedHost>(buf: &'a mut H) -> BlockRegion<'a> {
        Self::host_region(&*buf, true)
    }

    fn host_region<H: PinnedHost>(buf: &H, writable: bool) -> BlockRegion<'a> {
        let region = buf.region();
        BlockRegion {
            addr: region.ptr as u64,
            len: buf.len() as u64,
            location: MemLocation::Host,
            writable,
            keep: Keep::Host(region.keep),
            peer: None,
            _borrow: PhantomData,
        }
    }

    /// Start address (device pointer, or host pointer for host memory).
    pub fn address(&self) -> u64 {
        self.addr
    }

    /// Length in bytes.
    pub fn len(&self) -> u64 {
        self.len
    }

    /// Always false: buffers of this crate are never empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// Where the memory is.
    pub fn location(&self) -> MemLocation {
        self.location
    }

    /// Address of byte `offset` of the region.
    ///
    /// Errors: [`CudaError::InvalidArgument`] when `offset` is past the end.
    pub fn at(&self, offset: u64) -> Result<u64, CudaError> {
        if offset >= self.len {
            return Err(CudaError::InvalidArgument(format!(
                "offset {offset} is past the region's {} bytes",
                self.len
            )));
        }
        Ok(self.addr + offset)
    }

    fn held(&self, write: bool) -> Held {
        match &self.keep {
            Keep::Device(d) => Held::Device(d.clone()),
            Keep::Host(k) if write => {
                // Counted before the copy can start, so that no `as_slice` races with it.
                k.writers().fetch_add(1, Ordering::AcqRel);
                Held::HostWrite(k.clone())
            }
            Keep::Host(k) => Held::HostRead(k.clone()),
        }
    }
}

/// Posts block lists for one context. Keeps what makes a call cheap between calls: the
/// kernel's pinned and device staging (two slots, grown to the largest list), the batch's host
/// arrays, and scratch vectors, so a steady stream of lists allocates nothing.
///
/// `Send + Sync`; calls take `&mut self`: share it behind a mutex, or keep one per thread.
pub struct BlockCopier {
    ctx: Context,
    tuning: KernelTuning,
    batch_flags: u32,
    staging: kernel::Staging,
    arrays: BatchArrays,
    peers: Vec<u32>,
}

impl fmt::Debug for BlockCopier {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("BlockCopier")
            .field("ordinal", &self.ctx.ordinal())
            .field("tuning", &self.tuning)
            .finish()
    }
}

impl BlockCopier {
    /// A copier for streams of `ctx`. Allocates nothing until the first copy.
    pub fn new(ctx: &Context) -> BlockCopier {
        BlockCopier {
            ctx: ctx.clone(),
            tuning: KernelTuning::default(),
            batch_flags: CU_MEMCPY_FLAG_DEFAULT,
            staging: kernel::Staging::new(),
            arrays: BatchArrays::default(),
            peers: Vec::new(),
        }
    }

    /// The context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Whether `method` can run: the batch entry point resolves, or the kernel's PTX loads
    /// (which this call does, once per context).
    ///
    /// Errors: [`CudaError::MethodUnavailable`] with the [`Unavailable`] reason.
    pub fn available(&self, method: BlockMethod) -> Result<(), CudaError> {
        match method {
            BlockMethod::DriverBatch => self.batch_fn().map(|_| ()),
            BlockMethod::Kernel => kernel::copy_kernel(&self.ctx).map(|_| ()).map_err(|e| {
                CudaError::MethodUnavailable {
                    method,
                    reason: Unavailable::KernelLoad {
                        message: e.to_string(),
                    },
                }
            }),
        }
    }

    /// The `cuMemcpyBatchAsync` ABI this driver gets (see `batch.rs`).
    ///
    /// Errors: [`CudaError::MethodUnavailable`].
    pub fn batch_abi(&self) -> Result<BatchAbi, CudaError> {
        self.batch_fn().map(batch::abi)
    }

    fn batch_fn(&self) -> Result<BatchFn, CudaError> {
        batch::resolve(self.ctx.api()).map_err(|reason| CudaError::MethodUnavailable {
            method: BlockMethod::DriverBatch,
            reason,
        })
    }

    /// Set the kernel's launch shape and split. Checked at the next launch.
    pub fn set_kernel_tuning(&mut self, tuning: KernelTuning) {
        self.tuning = tuning;
    }

    /// Ask the driver batch to leave SMs to compute (`CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE`)
    /// rather than use its default (flags 0, the default here).
    pub fn set_batch_prefer_overlap(&mut self, on: bool) {
        self.batch_flags = if on {
            CU_MEMCPY_FLAG_PREFER_OVERLAP_WITH_COMPUTE
        } else {
            CU_MEMCPY_FLAG_DEFAULT
        };
    }

    /// Check `blocks` against the regions, coalesce, and enqueue every copy on `stream` with
    /// `method`: one `cuMemcpyBatchAsync`, or one descriptor upload and one kernel launch. The
    /// stream keeps every region alive until [`Stream::synchronize`]; host destinations stay
    /// unreadable ([`CudaError::BufferBusy`]) until then. Device regions of another GPU get
    /// peer access enabled from the stream's context first.
    ///
    /// Errors, all before anything is enqueued: [`CudaError::BlockList`] (empty list, zero
    /// length, overflow, more than [`MAX_BLOCKS_PER_CALL`], a range outside every region of its
    /// side, overlapping regions, a read-only destination, a descriptor overlapping itself);
    /// [`CudaError::InvalidArgument`] for a stream of another GPU than the copier's;
    /// [`CudaError::MethodUnavailable`]; the driver's error for peer access the kernel needs.
    /// After that, the driver's errors of the upload, launch or batch call.
    pub fn copy(
        &mut self,
        stream: &Stream,
        dst: &[BlockRegion<'_>],
        src: &[BlockRegion<'_>],
        blocks: &[BlockCopy],
        method: BlockMethod,
    ) -> Result<BlockCopyReport, CudaError> {
        self.check_stream(stream)?;
        if let Some(index) = dst.iter().position(|r| !r.writable) {
            return Err(BlockListError::ReadOnlyDestination { index }.into());
        }
        let dst_index = RegionIndex::new(Side::Dst, dst.iter().map(|r| (r.addr, r.len)))?;
        let src_index = RegionIndex::new(Side::Src, src.iter().map(|r| (r.addr, r.len)))?;
        let planned = self.stage(method, blocks, Some((&dst_index, &src_index)), &|d, s| {
            (dst[d].location, src[s].location)
        })?;
        self.prepare_peers(stream, dst.iter().chain(src), method)?;
        if method == BlockMethod::Kernel {
            self.check_host_mappings(dst.iter().chain(src))?;
        }
        // Taken before the copy can start (host writers are counted), dropped if it does not.
        let mut held: Vec<Held> = Vec::with_capacity(dst.len() + src.len());
        held.extend(dst.iter().map(|r| r.held(true)));
        held.extend(src.iter().map(|r| r.held(false)));
        let report = self.enqueue(stream, method, blocks.len(), planned)?;
        stream.hold(held);
        Ok(report)
    }

    /// [`BlockCopier::copy`] without regions, for lists the caller has checked already (the
    /// engine's prepared transfers): the list checks of [`check_list`] run (O(N), no region
    /// lookup), then coalescing and the post. Nothing is kept alive and no peer access is
    /// enabled here.
    ///
    /// Errors: as [`BlockCopier::copy`], less the region checks.
    ///
    /// # Safety
    /// Every `[dst, dst + len)` and `[src, src + len)` must be memory the stream's context can
    /// access (its device memory, peer memory with peer access enabled, IPC mappings opened in
    /// it, pinned host memory; for the kernel method, host memory the device maps at its host
    /// pointer), the destinations writable and not read by the CPU, and all of it
    /// must stay allocated until the stream has passed this work (synchronize before freeing).
    /// `dst_location` and `src_location` are hints for the driver batch.
    pub unsafe fn copy_unchecked(
        &mut self,
        stream: &Stream,
        blocks: &[BlockCopy],
        dst_location: MemLocation,
        src_location: MemLocation,
        method: BlockMethod,
    ) -> Result<BlockCopyReport, CudaError> {
        self.check_stream(stream)?;
        let planned = self.stage(method, blocks, None, &|_, _| (dst_location, src_location))?;
        self.enqueue(stream, method, blocks.len(), planned)
    }

    /// Check and coalesce `blocks` straight into what `method` posts: the kernel's pinned
    /// staging, or the batch's host arrays (with each run's location hints from
    /// `locate(dst_region, src_region)`). Nothing is enqueued yet.
    fn stage(
        &mut self,
        method: BlockMethod,
        blocks: &[BlockCopy],
        regions: Option<(&RegionIndex, &RegionIndex)>,
        locate: &dyn Fn(usize, usize) -> (MemLocation, MemLocation),
    ) -> Result<descriptor_list::Planned, CudaError> {
        match method {
            BlockMethod::DriverBatch => {
                self.batch_fn()?;
                let (arrays, flags) = (&mut self.arrays, self.batch_flags);
                arrays.clear();
                Ok(descriptor_list::plan(blocks, regions, |c, d, s| {
                    let (dl, sl) = locate(d, s);
                    arrays.push(c.dst, c.src, c.len, batch::attributes(dl, sl, flags));
                })?)
            }
            BlockMethod::Kernel => {
                self.available(BlockMethod::Kernel)?;
                // Coalescing only shrinks the list: room for every descriptor is enough.
                descriptor_list::check_count(blocks)?;
                let staged = self.staging.prepare(&self.ctx, blocks.len())?;
                Ok(descriptor_list::plan_into(blocks, regions, staged)?)
            }
        }
    }

    /// Enqueue what [`BlockCopier::stage`] staged.
    fn enqueue(
        &mut self,
        stream: &Stream,
        method: BlockMethod,
        given: usize,
        planned: descriptor_list::Planned,
    ) -> Result<BlockCopyReport, CudaError> {
        let mut report = BlockCopyReport {
            method,
            descriptors: given,
            coalesced: planned.runs,
            posted: planned.runs,
            bytes: planned.bytes,
            batch_abi: None,
            grid: None,
        };
        match method {
            BlockMethod::DriverBatch => {
                let f = self.batch_fn()?;
                stream.context().bind()?;
                // SAFETY: every copy was checked against its regions (which the caller keeps
                // alive through the stream) or vouched for by `copy_unchecked`'s caller; the
                // stream is live and its context current.
                unsafe { self.arrays.post(self.ctx.api(), f, stream.raw()) }?;
                report.batch_abi = Some(batch::abi(f));
            }
            BlockMethod::Kernel => {
                let l = self.staging.launch(
                    &self.ctx,
                    stream,
                    planned.runs,
                    planned.bytes,
                    planned.max_len,
                    &self.tuning,
                )?;
                report.posted = l.pieces;
                report.grid = Some((l.grid, l.threads));
            }
        }
        Ok(report)
    }

    fn check_stream(&self, stream: &Stream) -> Result<(), CudaError> {
        if !stream.context().same_device(&self.ctx) {
            return Err(CudaError::InvalidArgument(format!(
                "block copier of GPU {} given a stream of GPU {}",
                self.ctx.ordinal(),
                stream.context().ordinal()
            )));
        }
        Ok(())
    }

    /// Enable peer access from the stream's context to device regions of other GPUs. The kernel
    /// needs it; the batch works without (the driver then stages through host memory), so
    /// there a refusal is not an error.
    fn prepare_peers<'r>(
        &mut self,
        stream: &Stream,
        regions: impl Iterator<Item = &'r BlockRegion<'r>>,
        method: BlockMethod,
    ) -> Result<(), CudaError> {
        for r in regions {
            let Some(peer) = &r.peer else { continue };
            if peer.same_device(stream.context()) || self.peers.contains(&peer.ordinal()) {
                continue;
            }
            match enable_peer_access(stream.context(), peer) {
                Ok(_) => self.peers.push(peer.ordinal()),
                Err(e) if method == BlockMethod::Kernel => return Err(e),
                Err(e) => tracing::debug!(error = %e, "no peer access; the driver batch stages"),
            }
        }
        Ok(())
    }

    /// The kernel dereferences host regions by their host pointer: check the driver maps them
    /// there (`cuMemHostGetDevicePointer_v2`; equal on every platform with unified addressing
    /// and `CAN_USE_HOST_POINTER_FOR_REGISTERED_MEM`, i.e. 64-bit Linux on Pascal and later).
    fn check_host_mappings<'r>(
        &self,
        regions: impl Iterator<Item = &'r BlockRegion<'r>>,
    ) -> Result<(), CudaError> {
        let api = self.ctx.api();
        self.ctx.bind()?;
        for r in regions.filter(|r| r.location == MemLocation::Host) {
            let dev = call::mem_host_get_device_pointer(api, r.addr as *mut std::ffi::c_void)?;
            if dev != r.addr {
                return Err(BlockListError::HostMappedElsewhere {
                    host: r.addr,
                    device: dev,
                }
                .into());
            }
        }
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_copier_can_move_between_threads() {
        fn send_sync<T: Send + Sync>() {}
        send_sync::<super::BlockCopier>();
    }
}
