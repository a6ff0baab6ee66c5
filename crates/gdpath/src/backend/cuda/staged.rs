//! Staged GPU → GPU copies for pairs without P2P (or with P2P switched off): source GPU →
//! pinned bounce buffer → destination GPU, chunk by chunk.
//!
//! Pipeline: `S` bounce buffers, each with a D2H stream on the source GPU and an H2D stream on
//! the destination GPU. Up to `S` chunks are in flight: chunk `i`'s D2H is enqueued once buffer
//! `i % S` is free (its previous H2D finished); its H2D is enqueued once its D2H finished. So the
//! source's D2H engine and the destination's H2D engine run at the same time, and the copy runs
//! at about the slower of the two links instead of their harmonic sum.

use super::devices::Gpus;
use super::pageable::Stop;
use super::pool::StagingPool;
use crate::error::Error;
use gdpath_cuda::DeviceBuffer;

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
    let d2h = (0..s_count)
        .map(|_| gpus.stream(src.ordinal()))
        .collect::<Result<Vec<_>, _>>()?;
    let h2d = (0..s_count)
        .map(|_| gpus.stream(dst.ordinal()))
        .collect::<Result<Vec<_>, _>>()?;
    let piece = |i: usize| (i * chunk, chunk.min(len - i * chunk));
    let (mut issued, mut done) = (0usize, 0usize);
    while done < n {
        while issued < n && issued - done < s_count {
            if let Some(e) = stop() {
                return Err(Stop::Engine(e));
            }
            let s = issued % s_count;
            h2d[s].synchronize()?;
            let (off, l) = piece(issued);
            d2h[s].copy_d2h(&mut bufs[s], 0, src, src_off + off, l)?;
            issued += 1;
        }
        let s = done % s_count;
        d2h[s].synchronize()?;
        let (off, l) = piece(done);
        h2d[s].copy_h2d(dst, dst_off + off, &bufs[s], 0, l)?;
        done += 1;
    }
    for s in &h2d {
        s.synchronize()?;
    }
    drop((d2h, h2d));
    pool.give(bufs);
    Ok(())
}
