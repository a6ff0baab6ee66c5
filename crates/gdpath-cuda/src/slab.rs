//! A pinned buffer that several threads fill at once, each its own part, and that is then sent
//! to the GPU with one copy: fewer, larger H2D copies than one per thread (the staged file → GPU
//! path gathers its threads' reads this way).
//!
//! The rules are checked at run time, under one lock: parts being written never overlap; no
//! part is handed out while a copy from the slab may still be running (the copies are tracked
//! by an event, [`PinnedSlab::wait_copied`]); no copy starts while a part is out.

use crate::context::Context;
use crate::error::CudaError;
use crate::memory::{check_range, DeviceBuffer, PinnedHost, PinnedHostBuffer};
use crate::stream::{Event, Stream};
use std::ops::{Deref, DerefMut, Range};
use std::sync::{Mutex, MutexGuard};

/// A slab over a pinned buffer `B` (the buffer itself, or a handle that owns it, such as a
/// pool's). `Send + Sync`: parts may be written from several threads at once.
pub struct PinnedSlab<B: Deref<Target = PinnedHostBuffer>> {
    buf: B,
    /// Start of the buffer's memory: parts are written through it, never through `buf`.
    ptr: *mut u8,
    event: Event,
    state: Mutex<State>,
}

struct State {
    /// Ranges of the parts out now.
    parts: Vec<Range<usize>>,
    /// Copies posted from the slab, and how many of them are known to be done.
    copies: u64,
    done: u64,
}

// SAFETY: the buffer's memory is written only through parts, which the lock keeps disjoint and
// keeps apart from running copies; everything else is behind the lock or is a driver handle.
unsafe impl<B: Deref<Target = PinnedHostBuffer> + Send> Send for PinnedSlab<B> {}
// SAFETY: as above.
unsafe impl<B: Deref<Target = PinnedHostBuffer> + Send + Sync> Sync for PinnedSlab<B> {}

impl<B: Deref<Target = PinnedHostBuffer> + DerefMut> PinnedSlab<B> {
    /// A slab over `buf`, on `ctx` (the context its copies and event use).
    ///
    /// Errors: [`CudaError::BufferBusy`] while a stream still holds the buffer; the event's
    /// creation error.
    pub fn new(ctx: &Context, mut buf: B) -> Result<PinnedSlab<B>, CudaError> {
        // Proves that nothing else uses the buffer now.
        buf.as_mut_slice()?;
        let ptr = buf.host_ptr() as *mut u8;
        Ok(PinnedSlab {
            buf,
            ptr,
            event: Event::new(ctx, false)?,
            state: Mutex::new(State {
                parts: Vec::new(),
                copies: 0,
                done: 0,
            }),
        })
    }
}

impl<B: Deref<Target = PinnedHostBuffer>> PinnedSlab<B> {
    /// Length in bytes.
    pub fn len(&self) -> usize {
        self.buf.len()
    }

    /// Never true: pinned buffers are not empty.
    pub fn is_empty(&self) -> bool {
        self.buf.is_empty()
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
    pub fn part(&self, range: Range<usize>) -> Result<SlabPart<'_, B>, CudaError> {
        check_range(
            "slab part",
            self.len(),
            range.start,
            range.end.saturating_sub(range.start),
        )?;
        let mut st = self.lock();
        if st.done < st.copies {
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
    /// on `stream`, tracked so that no part is handed out until it is done.
    ///
    /// Errors: [`CudaError::BufferBusy`] while a part is out; range and driver errors of
    /// [`Stream::copy_h2d`] and [`Event::record`]. When the copy was posted but could not be
    /// tracked, the stream is synchronized before the error returns; if that fails too, the
    /// slab stays busy (parts are refused) for good.
    pub fn copy_h2d(
        &self,
        stream: &Stream,
        dst: &DeviceBuffer,
        dst_off: usize,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let mut st = self.lock();
        if !st.parts.is_empty() {
            return Err(CudaError::BufferBusy);
        }
        stream.copy_h2d(dst, dst_off, &*self.buf, src_off, len)?;
        st.copies += 1;
        if let Err(e) = self.event.record(stream) {
            if stream.synchronize().is_ok() {
                st.done = st.copies;
            }
            return Err(e);
        }
        Ok(())
    }

    /// Waits until every copy posted from the slab so far is done. Errors: the driver's.
    pub fn wait_copied(&self) -> Result<(), CudaError> {
        let posted = {
            let st = self.lock();
            if st.done == st.copies {
                return Ok(());
            }
            st.copies
        };
        // Waits for the last copy recorded when it is called: at least the `posted`-th.
        self.event.synchronize()?;
        let mut st = self.lock();
        st.done = st.done.max(posted);
        Ok(())
    }

    /// The buffer back. A copy still running keeps its memory alive (the stream holds it).
    pub fn into_inner(self) -> B {
        self.buf
    }
}

/// A part of a [`PinnedSlab`] being written: derefs to its bytes.
pub struct SlabPart<'s, B: Deref<Target = PinnedHostBuffer>> {
    slab: &'s PinnedSlab<B>,
    range: Range<usize>,
}

impl<B: Deref<Target = PinnedHostBuffer>> Deref for SlabPart<'_, B> {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        // SAFETY: inside the slab (checked in `part`), and no other part or copy touches these
        // bytes while this part is out.
        unsafe { std::slice::from_raw_parts(self.slab.ptr.add(self.range.start), self.range.len()) }
    }
}

impl<B: Deref<Target = PinnedHostBuffer>> DerefMut for SlabPart<'_, B> {
    fn deref_mut(&mut self) -> &mut [u8] {
        // SAFETY: as in `deref`; this part is the only way to these bytes while it is out.
        unsafe {
            std::slice::from_raw_parts_mut(self.slab.ptr.add(self.range.start), self.range.len())
        }
    }
}

impl<B: Deref<Target = PinnedHostBuffer>> Drop for SlabPart<'_, B> {
    fn drop(&mut self) {
        let mut st = self.slab.lock();
        if let Some(i) = st.parts.iter().position(|p| *p == self.range) {
            st.parts.swap_remove(i);
        }
    }
}
