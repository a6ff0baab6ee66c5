//! A pinned buffer that several threads fill at once, each its own part, and that is then sent
//! to the GPU with one copy: fewer, larger H2D copies than one per thread (the staged file → GPU
//! path gathers its threads' reads this way).
//!
//! The rules are checked at run time, under one lock: parts being written never overlap; no
//! part is handed out while a copy from the slab may still be running (the copies are tracked
//! by one event, each new copy ordered after the previous one); no copy starts while a part is
//! out.

use crate::context::Context;
use crate::error::CudaError;
use crate::memory::{check_range, DeviceBuffer, PinnedHost, PinnedHostBuffer};
use crate::stream::{Event, Stream};
use std::ops::{Deref, DerefMut, Range};
use std::sync::{Mutex, MutexGuard};

/// A slab over a pinned buffer it owns. `Send + Sync`: parts may be written from several
/// threads at once.
pub struct PinnedSlab {
    buf: PinnedHostBuffer,
    /// Start and length of the buffer's memory: parts are written through them, never through
    /// `buf`.
    ptr: *mut u8,
    len: usize,
    ctx: Context,
    event: Event,
    state: Mutex<State>,
}

struct State {
    /// Ranges of the parts out now.
    parts: Vec<Range<usize>>,
    /// Copies posted from the slab, and how many of them are known to be done.
    copies: u64,
    done: u64,
    /// A copy was posted that the event does not cover and the stream could not be waited for:
    /// the slab stays busy for good.
    lost: bool,
}

// SAFETY: the buffer's memory is written only through parts, which the lock keeps disjoint and
// keeps apart from running copies; everything else is behind the lock or is a driver handle.
unsafe impl Send for PinnedSlab {}
// SAFETY: as above.
unsafe impl Sync for PinnedSlab {}

impl PinnedSlab {
    /// A slab over `buf`, its copies on streams of `ctx`.
    ///
    /// Errors, with the buffer given back: [`CudaError::BufferBusy`] while a stream still holds
    /// it; the event's creation error.
    pub fn new(
        ctx: &Context,
        mut buf: PinnedHostBuffer,
    ) -> Result<PinnedSlab, (CudaError, PinnedHostBuffer)> {
        // Proves that nothing else uses the buffer now.
        let len = match buf.as_mut_slice() {
            Ok(b) => b.len(),
            Err(e) => return Err((e, buf)),
        };
        let ptr = buf.host_ptr() as *mut u8;
        let event = match Event::new(ctx, false) {
            Ok(e) => e,
            Err(e) => return Err((e, buf)),
        };
        Ok(PinnedSlab {
            buf,
            ptr,
            len,
            ctx: ctx.clone(),
            event,
            state: Mutex::new(State {
                parts: Vec::new(),
                copies: 0,
                done: 0,
                lost: false,
            }),
        })
    }

    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.len
    }

    /// Never true: pinned buffers are not empty.
    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    fn lock(&self) -> MutexGuard<'_, State> {
        // The state is plain counters and ranges; a panic elsewhere leaves them sound.
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Bytes `range` of the slab to write, until the part drops.
    ///
    /// Errors: [`CudaError::InvalidArgument`] for a range outside the slab or overlapping a
    /// part that is out; [`CudaError::BufferBusy`] while a copy posted from the slab is not known
    /// to be done (call [`PinnedSlab::wait_copied`]).
    pub fn part(&self, range: Range<usize>) -> Result<SlabPart<'_>, CudaError> {
        check_range(
            "slab part",
            self.len,
            range.start,
            range.end.saturating_sub(range.start),
        )?;
        let mut st = self.lock();
        if st.lost || st.done < st.copies {
            return Err(CudaError::BufferBusy);
        }
        if let Some(o) = st
            .parts
            .iter()
            .find(|p| p.start < range.end && range.start < p.end)
        {
            return Err(CudaError::InvalidArgument(format!(
                "slab part {}..{} overlaps the part {}..{} being written",
                range.start, range.end, o.start, o.end
            )));
        }
        st.parts.push(range.clone());
        Ok(SlabPart { slab: self, range })
    }

    /// Host → device, asynchronous: slab bytes `[src_off, src_off + len)` to `dst[dst_off..]`
    /// on `stream` (of the slab's GPU), ordered after the slab's previous copy, tracked so that
    /// no part is handed out until it is done.
    ///
    /// Errors: [`CudaError::InvalidArgument`] for a stream of another GPU; [`CudaError::BufferBusy`]
    /// while a part is out; range and driver errors of [`Stream::copy_h2d`]. When the copy was
    /// posted but could not be tracked, the stream is synchronized before the error returns; if
    /// that fails too, the slab stays busy (parts are refused) for good.
    pub fn copy_h2d(
        &self,
        stream: &Stream,
        dst: &DeviceBuffer,
        dst_off: usize,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        if !self.ctx.same_device(stream.context()) {
            return Err(CudaError::InvalidArgument(format!(
                "slab of GPU {} copied on a stream of GPU {}",
                self.ctx.ordinal(),
                stream.context().ordinal()
            )));
        }
        let mut st = self.lock();
        if !st.parts.is_empty() {
            return Err(CudaError::BufferBusy);
        }
        if st.done < st.copies {
            // The event then covers this copy and every earlier one, whatever their streams.
            stream.wait_event(&self.event)?;
        }
        stream.copy_h2d(dst, dst_off, &self.buf, src_off, len)?;
        st.copies += 1;
        if let Err(e) = self.event.record(stream) {
            match stream.synchronize() {
                Ok(()) => st.done = st.copies,
                Err(_) => st.lost = true,
            }
            return Err(e);
        }
        Ok(())
    }

    /// Waits until every copy posted from the slab so far is done. Errors: the driver's;
    /// [`CudaError::BufferBusy`] when a copy could not be tracked ([`PinnedSlab::copy_h2d`]).
    pub fn wait_copied(&self) -> Result<(), CudaError> {
        let posted = {
            let st = self.lock();
            if st.lost {
                return Err(CudaError::BufferBusy);
            }
            if st.done == st.copies {
                return Ok(());
            }
            st.copies
        };
        // Waits for the last copy recorded when it is called, which each copy is ordered after:
        // at least the `posted`-th.
        self.event.synchronize()?;
        let mut st = self.lock();
        st.done = st.done.max(posted);
        Ok(())
    }

    /// The buffer back. A copy still running keeps its memory alive (the stream holds it).
    pub fn into_inner(self) -> PinnedHostBuffer {
        self.buf
    }
}

/// A part of a [`PinnedSlab`] being written: derefs to its bytes.
pub struct SlabPart<'s> {
    slab: &'s PinnedSlab,
    range: Range<usize>,
}

impl Deref for SlabPart<'_> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: inside the slab's memory (checked against its length in `part`), which the
        // slab owns; no other part or copy touches these bytes while this part is out.
        unsafe { std::slice::from_raw_parts(self.slab.ptr.add(self.range.start), self.range.len()) }
    }
}

impl DerefMut for SlabPart<'_> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; this part is the only way to these bytes while it is out.
        unsafe {
            std::slice::from_raw_parts_mut(self.slab.ptr.add(self.range.start), self.range.len())
        }
    }
}

impl Drop for SlabPart<'_> {
    fn drop(&mut self) {
        let mut st = self.slab.lock();
        if let Some(i) = st.parts.iter().position(|p| *p == self.range) {
            st.parts.swap_remove(i);
        }
    }
}
