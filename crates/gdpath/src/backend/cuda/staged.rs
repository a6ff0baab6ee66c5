//! Staged GPU → GPU copies for pairs without P2P (or with P2P switched off): source GPU →
//! pinned bounce buffer → destination GPU, chunk by chunk.
//!
//! Pipeline: `S` bounce buffers, one D2H stream on the source GPU and one H2D stream on the
//! destination GPU (one stream per direction keeps each copy engine working on one chunk at a
//! time, in order, so the first chunk is ready as early as possible), and an event per buffer
//! and direction. The whole pipeline is enqueued up front and ordered on the GPUs by stream
//! waits (`cuStreamWaitEvent`), not by the CPU: chunk `i`'s D2H waits for the H2D that last used
//! buffer `i % S`, its H2D waits for its D2H. So the source's D2H engine and the destination's
//! H2D engine run at the same time, and the copy runs at about the slower of the two links
//! instead of their harmonic sum, with no CPU round trip between chunks.

use super::devices::Gpus;
use super::pageable::Stop;
use super::pool::StagingPool;
use crate::error::Error;
use gdpath_cuda::{DeviceBuffer, Event};

#[allow(clippy::too_many_arguments)]
pub(crate) fn copy(
    gpus: &Gpus,
    pool: &StagingPool,
    buffers: usize,
    src: &DeviceBuffer,
    src_off: usize,
    dst: &DeviceBuffer,
    dst_off: usize,
    len: usize,
    stop: &dyn Fn() -> Option<Error>,
) -> Result<(), Stop> {
    gdpath_cuda::check_range("staged source", src.len(), src_off, len)?;
    gdpath_cuda::check_range("staged destination", dst.len(), dst_off, len)?;
    let chunk = pool.chunk();
    let n = len.div_ceil(chunk);
    if n == 0 {
        return Ok(());
    }
    let s_count = buffers.clamp(2, n.max(2));
    let mut bufs = pool.take(src.context(), s_count)?;
    let d2h = gpus.stream(src.ordinal())?;
    let h2d = gpus.stream(dst.ordinal())?;
    let d2h_done = (0..s_count)
        .map(|_| Event::new(src.context(), false))
        .collect::<Result<Vec<_>, _>>()?;
    let h2d_done = (0..s_count)
        .map(|_| Event::new(dst.context(), false))
        .collect::<Result<Vec<_>, _>>()?;
    let piece = |i: usize| (i * chunk, chunk.min(len - i * chunk));
    // On any early return the streams are drained first: enqueued copies still use `bufs`.
    let drain = |e: Stop| -> Stop {
        let _ = d2h.synchronize();
        let _ = h2d.synchronize();
        e
    };
    for i in 0..n {
        if let Some(e) = stop() {
            return Err(drain(Stop::Engine(e)));
        }
        let s = i % s_count;
        let (off, l) = piece(i);
        let mut enqueue = || -> Result<(), gdpath_cuda::CudaError> {
            if i >= s_count {
                d2h.wait_event(&h2d_done[s])?;
            }
            d2h.copy_d2h(&mut *bufs[s], 0, src, src_off + off, l)?;
            d2h_done[s].record(&d2h)?;
            h2d.wait_event(&d2h_done[s])?;
            h2d.copy_h2d(dst, dst_off + off, &*bufs[s], 0, l)?;
            h2d_done[s].record(&h2d)
        };
        enqueue().map_err(|e| drain(e.into()))?;
    }
    d2h.synchronize()?;
    h2d.synchronize()?;
    // The buffers go back to the pool after the streams (declared later, dropped first).
    Ok(())
}
