//! The gather/scatter copy kernel: `src/ptx/copy_blocks.ptx` (built from `copy_blocks.cu` by
//! `scripts/gen-kv-ptx.sh`), loaded once per context with `cuModuleLoadData`, and the staging
//! that gets a descriptor list to it with one upload and one launch.
//!
//! Per call: descriptors longer than the piece size are split (so that no warp gets far more
//! bytes than the others), written into a pinned staging buffer, copied to a device buffer with
//! one `cuMemcpyHtoDAsync` on the caller's stream, and the kernel is launched on that stream.
//! Staging and device buffers belong to a slot; two slots alternate, and a slot is written again
//! only after the event recorded behind its last launch has completed, so consecutive calls
//! overlap their host work with the previous launch and nothing is allocated per call (buffers
//! grow to the largest list seen, in powers of two).

use std::ffi::c_int;

use super::descriptor_list::BlockCopy;
use crate::context::Context;
use crate::driver::call;
use crate::driver::sys::CUfunction;
use crate::error::CudaError;
use crate::memory::{DeviceBuffer, PinnedHost, PinnedHostBuffer};
use crate::module::{self, Kernel};
use crate::stream::{Event, Stream};

/// Launch shape and work split of the copy kernel. The defaults are the fastest configuration
/// measured (docs/gpu.md, "Block-list copies"; the reasons are in the module documentation of
/// [`crate::blocks`]); change them only to measure.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct KernelTuning {
    /// Threads per CTA: a multiple of 32 from 32 to 1024. Default 256 (8 warps).
    pub threads_per_block: u32,
    /// CTAs per SM in the grid, at most as many as fit; 0 asks the driver how many fit
    /// (`cuOccupancyMaxActiveBlocksPerMultiprocessor`). Default 2: that already keeps enough
    /// loads in flight per SM to saturate HBM and PCIe, and fewer concurrent streams keep DRAM
    /// pages and the IOMMU's translations warmer (docs/gpu.md, "Block-list copies").
    pub blocks_per_sm: u32,
    /// Descriptors longer than the piece size are split into pieces; the piece size is
    /// the list's bytes over twice the grid's warps, rounded up to 4 KiB and at least this many
    /// bytes. Default 64 KiB: below that the per-piece cost shows, above it one large
    /// descriptor can keep one warp busy while the others idle.
    pub min_piece_bytes: u64,
}

impl Default for KernelTuning {
    fn default() -> KernelTuning {
        KernelTuning {
            threads_per_block: 256,
            blocks_per_sm: 2,
            min_piece_bytes: 64 << 10,
        }
    }
}

impl KernelTuning {
    pub(crate) fn check(&self) -> Result<(), CudaError> {
        let t = self.threads_per_block;
        if t == 0 || t > 1024 || t % 32 != 0 {
            return Err(CudaError::InvalidArgument(format!(
                "copy kernel threads per block {t}: need a multiple of 32 from 32 to 1024"
            )));
        }
        if self.min_piece_bytes == 0 || self.min_piece_bytes % 4096 != 0 {
            return Err(CudaError::InvalidArgument(format!(
                "copy kernel minimum piece {} bytes: need a positive multiple of 4096",
                self.min_piece_bytes
            )));
        }
        Ok(())
    }
}

/// The copy kernel of one context and what its launch is sized by.
#[derive(Clone, Copy)]
pub(crate) struct CopyKernel {
    func: CUfunction,
    sms: u32,
}

impl CopyKernel {
    /// CTAs of `threads` threads that fit on one SM at once.
    fn occupancy(&self, ctx: &Context, threads: u32) -> Result<u32, CudaError> {
        // SAFETY: a function of a module loaded in `ctx`, which keeps it loaded.
        let n = unsafe {
            call::occupancy_max_active_blocks_per_multiprocessor(
                ctx.api(),
                self.func,
                threads as c_int,
            )
        }?;
        Ok(n.max(1) as u32)
    }
}

/// The copy kernel of `ctx`, its module loaded on first use and kept with the context.
///
/// Errors: the module's load error; the SM count's query error.
pub(crate) fn copy_kernel(ctx: &Context) -> Result<CopyKernel, CudaError> {
    Ok(CopyKernel {
        func: ctx.kernel(Kernel::CopyBlocks)?,
        sms: ctx.multiprocessors()?,
    })
}

/// Piece size for a list of `total` bytes over `warps` warps (see [`KernelTuning`]).
pub(crate) fn piece_size(total: u64, warps: u64, min_piece: u64) -> u64 {
    let target = total.div_ceil(2 * warps.max(1)).max(min_piece);
    target.div_ceil(4096).saturating_mul(4096)
}

/// Number of pieces `list` splits into at `piece` bytes.
pub(crate) fn piece_count(list: &[BlockCopy], piece: u64) -> usize {
    list.iter().map(|b| b.len.div_ceil(piece) as usize).sum()
}

/// Write the pieces of `list` into `out` (exactly [`piece_count`] entries). Pieces start at
/// multiples of `piece` (a multiple of 4096) into their descriptor, so each keeps the
/// descriptor's alignment and the kernel's access width.
pub(crate) fn write_pieces(list: &[BlockCopy], piece: u64, out: &mut [BlockCopy]) {
    let mut k = 0;
    for b in list {
        let mut off = 0;
        while off < b.len {
            let len = piece.min(b.len - off);
            out[k] = BlockCopy::new(b.dst + off, b.src + off, len);
            k += 1;
            off += len;
        }
    }
    debug_assert_eq!(k, out.len());
}

/// One staging slot: pinned descriptors, their device copy, and the event behind its last use.
struct Slot {
    host: PinnedHostBuffer,
    dev: DeviceBuffer,
    done: Event,
    pending: bool,
}

impl Slot {
    fn new(ctx: &Context, bytes: usize) -> Result<Slot, CudaError> {
        Ok(Slot {
            host: PinnedHostBuffer::new(ctx, bytes)?,
            dev: DeviceBuffer::new(ctx, bytes)?,
            done: Event::new(ctx, false)?,
            pending: false,
        })
    }

    /// Wait until the GPU no longer reads this slot.
    fn wait(&mut self) -> Result<(), CudaError> {
        if self.pending {
            self.done.synchronize()?;
            self.pending = false;
        }
        Ok(())
    }
}

/// What a launch used, for the report.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct Launch {
    pub pieces: usize,
    pub grid: u32,
    pub threads: u32,
}

/// The staging ring of one [`super::BlockCopier`].
pub(crate) struct Staging {
    slots: [Option<Slot>; 2],
    next: usize,
    /// The slot [`Staging::prepare`] handed out, to be launched.
    current: Option<usize>,
    /// (threads per block, CTAs per SM) from the last occupancy query.
    occupancy: Option<(u32, u32)>,
    /// Descriptors being split into pieces (only for lists with long descriptors).
    scratch: Vec<BlockCopy>,
}

/// Smallest staging buffer, in bytes: small lists share one size instead of growing it often.
const MIN_STAGING: usize = 64 << 10;

impl Staging {
    pub(crate) fn new() -> Staging {
        Staging {
            slots: [None, None],
            next: 0,
            current: None,
            occupancy: None,
            scratch: Vec::new(),
        }
    }

    /// The next slot, idle (its last launch waited for) and holding at least `n` descriptors,
    /// as the pinned slice the caller writes the (coalesced) list into.
    pub(crate) fn prepare(
        &mut self,
        ctx: &Context,
        n: usize,
    ) -> Result<&mut [BlockCopy], CudaError> {
        let i = self.next;
        if self.slots[i ^ 1].is_none() {
            // Both slots on first use, so that the second call does not pay for an allocation.
            self.slot(ctx, i ^ 1, n)?;
        }
        let slot = self.slot(ctx, i, n)?;
        // SAFETY: the slot's pinned memory holds at least `n` descriptors, is page aligned, and
        // no GPU work reads it (idle); BlockCopy is plain data, any bit pattern valid.
        let host =
            unsafe { std::slice::from_raw_parts_mut(slot.host.host_ptr() as *mut BlockCopy, n) };
        self.current = Some(i);
        Ok(host)
    }

    /// Slot `i`, idle and with room for `n` descriptors (grown in powers of two).
    fn slot(&mut self, ctx: &Context, i: usize, n: usize) -> Result<&mut Slot, CudaError> {
        let bytes = n * std::mem::size_of::<BlockCopy>();
        if let Some(s) = &mut self.slots[i] {
            s.wait()?;
        }
        if self.slots[i].as_ref().is_none_or(|s| s.host.len() < bytes) {
            // The old slot (if any) is idle: dropping it frees nothing in use.
            self.slots[i] = None;
            self.slots[i] = Some(Slot::new(ctx, bytes.next_power_of_two().max(MIN_STAGING))?);
        }
        Ok(self.slots[i].as_mut().expect("slot allocated above"))
    }

    /// Launch the kernel on `stream` over the `runs` descriptors written into the prepared
    /// slot (`bytes` in all, the longest `max_len`), splitting long ones into pieces first.
    pub(crate) fn launch(
        &mut self,
        ctx: &Context,
        stream: &Stream,
        runs: usize,
        bytes: u64,
        max_len: u64,
        tuning: &KernelTuning,
    ) -> Result<Launch, CudaError> {
        let i = self
            .current
            .take()
            .ok_or_else(|| CudaError::InvalidArgument("copy kernel launched unprepared".into()))?;
        tuning.check()?;
        let k = copy_kernel(ctx)?;
        ctx.bind()?;
        let threads = tuning.threads_per_block;
        let fit = match self.occupancy {
            Some((t, n)) if t == threads => n,
            _ => {
                let n = k.occupancy(ctx, threads)?;
                self.occupancy = Some((threads, n));
                n
            }
        };
        let per_sm = match tuning.blocks_per_sm {
            0 => fit,
            n => n.min(fit),
        };
        let grid_max = k.sms.saturating_mul(per_sm).max(1);
        let warps_max = grid_max as u64 * (threads / 32) as u64;
        let piece = piece_size(bytes, warps_max, tuning.min_piece_bytes);
        let mut pieces = runs;
        if max_len > piece {
            // Rare (descriptors longer than the piece size): copy the runs out, split them back in.
            let staged = self.slots[i].as_ref().expect("prepared slot");
            // SAFETY: the first `runs` descriptors of the prepared slot were written by the caller.
            let written = unsafe {
                std::slice::from_raw_parts(staged.host.host_ptr() as *const BlockCopy, runs)
            };
            self.scratch.clear();
            self.scratch.extend_from_slice(written);
            pieces = piece_count(&self.scratch, piece);
            let slot = self.slot(ctx, i, pieces)?;
            // SAFETY: as in `prepare`, for `pieces` descriptors.
            let out = unsafe {
                std::slice::from_raw_parts_mut(slot.host.host_ptr() as *mut BlockCopy, pieces)
            };
            write_pieces(&self.scratch, piece, out);
        }
        self.next = i ^ 1;
        let slot = self.slots[i].as_mut().expect("prepared slot");
        let upload = pieces * std::mem::size_of::<BlockCopy>();
        let api = ctx.api();
        // SAFETY: both buffers hold `upload` bytes; the slot outlives the copy (Drop waits).
        unsafe {
            call::memcpy_htod_async(
                api,
                slot.dev.device_ptr(),
                slot.host.host_ptr().cast(),
                upload,
                stream.raw(),
            )
        }?;
        let per_block = (threads / 32) as u64;
        let grid = (pieces as u64)
            .div_ceil(per_block)
            .min(grid_max as u64)
            .max(1) as u32;
        let params = [slot.dev.device_ptr(), pieces as u64];
        // SAFETY: the kernel's two parameters are the uploaded descriptors and their count; the
        // descriptors' ranges were checked (or vouched for) by the copier's caller.
        let launched =
            unsafe { module::launch(api, k.func, (grid, threads), stream.raw(), &params) };
        // Recorded even when the launch failed: the upload is in flight either way.
        let recorded = slot.done.record(stream);
        slot.pending = recorded.is_ok();
        launched?;
        if let Err(e) = recorded {
            // Without the event the slot cannot be reused safely: drain the stream now.
            stream.synchronize()?;
            return Err(e);
        }
        Ok(Launch {
            pieces,
            grid,
            threads,
        })
    }
}

impl Drop for Staging {
    fn drop(&mut self) {
        for s in self.slots.iter_mut().flatten() {
            if let Err(e) = s.wait() {
                crate::error::log_teardown(
                    "waiting for a block-copy launch before freeing its staging",
                    None,
                    &e,
                );
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pieces_cover_every_byte_once_and_keep_alignment() {
        let list = [
            BlockCopy::new(0x1000_0003, 0x9000_0003, 300_001),
            BlockCopy::new(0x2000_0000, 0xa000_0000, 65536),
            BlockCopy::new(0x3000_0000, 0xb000_0000, 1),
        ];
        let piece = 65536;
        let n = piece_count(&list, piece);
        assert_eq!(n, 5 + 1 + 1);
        let mut out = vec![BlockCopy::default(); n];
        write_pieces(&list, piece, &mut out);
        assert_eq!(out[0], BlockCopy::new(0x1000_0003, 0x9000_0003, 65536));
        assert_eq!(
            out[4],
            BlockCopy::new(
                0x1000_0003 + 4 * 65536,
                0x9000_0003 + 4 * 65536,
                300_001 - 4 * 65536
            )
        );
        assert!(out[..5].iter().all(|p| p.dst % 16 == 3 && p.src % 16 == 3));
        assert_eq!(out[5], list[1]);
        assert_eq!(out[6], list[2]);
        assert_eq!(
            out.iter().map(|p| p.len).sum::<u64>(),
            list.iter().map(|p| p.len).sum::<u64>()
        );
    }

    #[test]
    fn piece_size_spreads_large_lists_and_keeps_small_blocks_whole() {
        // A device of 132 SMs with the default tuning (2 CTAs of 8 warps per SM).
        let warps = 132 * 2 * 8;
        // 40,000 blocks of 64 KiB: pieces above 64 KiB, so no block is split.
        assert!(piece_size(40_000 * 65536, warps, 65536) >= 65536);
        // One 1 GiB descriptor: split into about 2 pieces per warp.
        let p = piece_size(1 << 30, warps, 65536);
        assert_eq!(p % 4096, 0);
        let pieces = (1u64 << 30).div_ceil(p);
        assert!(pieces >= warps && pieces <= 2 * warps, "{pieces}");
        // Tiny lists: the minimum.
        assert_eq!(piece_size(100, warps, 65536), 65536);
        assert_eq!(piece_size(0, 0, 4096), 4096);
    }

    #[test]
    fn tuning_is_checked() {
        KernelTuning::default().check().unwrap();
        for t in [0, 31, 1056, 100] {
            let k = KernelTuning {
                threads_per_block: t,
                ..Default::default()
            };
            assert!(
                matches!(k.check(), Err(CudaError::InvalidArgument(_))),
                "{t}"
            );
        }
        let k = KernelTuning {
            min_piece_bytes: 1000,
            ..Default::default()
        };
        assert!(matches!(k.check(), Err(CudaError::InvalidArgument(_))));
    }
}
