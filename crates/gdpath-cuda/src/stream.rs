//! Streams, events and the copies enqueued on them.
//!
//! Every method checks its ranges with [`check_range`] before the driver sees them, makes the
//! stream's context current, and (for asynchronous operations) keeps the buffers it touches
//! alive until [`Stream::synchronize`]. Zero-length operations are accepted and do nothing.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::context::Context;
use crate::driver::call;
use crate::driver::sys::{
    CUdeviceptr, CUevent, CUstream, DriverApi, CU_EVENT_DEFAULT, CU_EVENT_DISABLE_TIMING,
    CU_STREAM_NON_BLOCKING,
};
use crate::error::CudaError;
#[allow(unused_imports)]
use crate::memory::Sealed as _;
use crate::memory::{check_range, DevMem, DeviceBuffer, HostKeep, HostRegion, PinnedHost};

/// What a stream keeps alive until it is synchronized.
pub(crate) enum Held {
    Device(#[allow(dead_code)] Arc<DevMem>),
    HostRead(#[allow(dead_code)] Arc<dyn HostKeep>),
    HostWrite(Arc<dyn HostKeep>),
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Held::HostWrite(k) = self {
            k.writers().fetch_sub(1, Ordering::AcqRel);
        }
    }
}

/// A non-blocking CUDA stream (`cuStreamCreate` with `CU_STREAM_NON_BLOCKING`) on one context.
/// Dropping it waits for its work (`cuStreamSynchronize`) and then destroys it. `Send + Sync`:
/// operations may be enqueued from several threads; the driver orders them in call order.
pub struct Stream {
    ctx: Context,
    raw: CUstream,
    held: Mutex<Vec<Held>>,
}

// SAFETY: a CUstream is a driver handle usable from any thread with its context current, which
// every method ensures; `held` is behind a Mutex.
unsafe impl Send for Stream {}
// SAFETY: as above.
unsafe impl Sync for Stream {}

impl std::fmt::Debug for Stream {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Stream")
            .field("ordinal", &self.ctx.ordinal())
            .finish()
    }
}

impl Drop for Stream {
    fn drop(&mut self) {
        if let Err(e) = self.synchronize() {
            crate::error::log_teardown("synchronizing a stream being dropped", None, &e);
        }
        // SAFETY: our stream, idle now, destroyed once.
        if let Err(e) = unsafe { call::stream_destroy(self.ctx.api(), self.raw) } {
            crate::error::log_teardown("destroying stream", None, &e);
        }
    }
}

impl Stream {
    /// Create a stream on `ctx`.
    pub fn new(ctx: &Context) -> Result<Stream, CudaError> {
        ctx.bind()?;
        let raw = call::stream_create(ctx.api(), CU_STREAM_NON_BLOCKING)?;
        Ok(Stream {
            ctx: ctx.clone(),
            raw,
            held: Mutex::new(Vec::new()),
        })
    }

    /// The stream's context.
    pub fn context(&self) -> &Context {
        &self.ctx
    }

    /// Make work enqueued on this stream after this call wait until the work before `event`'s
    /// last `record` has finished (`cuStreamWaitEvent`), without blocking the CPU. The event may
    /// belong to another device's context (CUDA driver API reference, cuStreamWaitEvent).
    pub fn wait_event(&self, event: &Event) -> Result<(), CudaError> {
        self.ctx.bind()?;
        // SAFETY: our stream and a live event.
        unsafe { call::stream_wait_event(self.ctx.api(), self.raw, event.raw) }
    }

    /// Wait until all work enqueued so far has finished, then release the buffers it held.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx.bind()?;
        // Take the list first: what is enqueued after this point is not covered by this wait.
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()));
        // SAFETY: our stream.
        match unsafe { call::stream_synchronize(self.ctx.api(), self.raw) } {
            Ok(()) => {
                drop(held);
                Ok(())
            }
            Err(e) => {
                // The work may still be running after an error: keep the buffers held.
                self.held
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .extend(held);
                Err(e)
            }
        }
    }

    pub(crate) fn hold(&self, items: impl IntoIterator<Item = Held>) {
        self.held
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .extend(items);
    }

    pub(crate) fn raw(&self) -> CUstream {
        self.raw
    }

    /// Binds the context, posts one operation with `post` (given the driver and this stream),
    /// and keeps `held` until the next synchronize. When the post fails, `held` is dropped,
    /// which also uncounts a host buffer's writer.
    fn enqueue(
        &self,
        held: impl IntoIterator<Item = Held>,
        post: impl FnOnce(&DriverApi, CUstream) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        self.ctx.bind()?;
        post(self.ctx.api(), self.raw)?;
        self.hold(held);
        Ok(())
    }

    /// Checks a copy's destination and source ranges (`what`: their names in errors, each range
    /// as (buffer length, offset)): `Ok(false)` when there is nothing to copy.
    fn ranges(
        what: [&str; 2],
        (dst_len, dst_off): (usize, usize),
        (src_len, src_off): (usize, usize),
        len: usize,
    ) -> Result<bool, CudaError> {
        check_range(what[0], dst_len, dst_off, len)?;
        check_range(what[1], src_len, src_off, len)?;
        Ok(len > 0)
    }

    /// The host side of a copy between pinned host memory `host` and a device buffer: checks
    /// both ranges as [`Stream::ranges`] and returns what keeps `host` alive with the address
    /// `host_off` bytes into it, or `None` when `len` is 0.
    fn pinned_side<H: PinnedHost>(
        what: [&str; 2],
        dst: (usize, usize),
        src: (usize, usize),
        len: usize,
        (host, host_off): (&H, usize),
    ) -> Result<Option<(HostRegion, *mut u8)>, CudaError> {
        if !Self::ranges(what, dst, src, len)? {
            return Ok(None);
        }
        let region = host.region();
        let at = region.ptr.wrapping_add(host_off);
        Ok(Some((region, at)))
    }

    /// Host → device of `len` bytes from host address `src` into `dst[dst_off..]`, ranges
    /// checked by the caller; `src_keep` is what keeps the source alive, if the stream must.
    ///
    /// # Safety
    /// `[src, src + len)` is readable host memory that stays so until the copy is done: held by
    /// `src_keep`, or borrowed by the caller across a synchronize.
    unsafe fn post_h2d(
        &self,
        dst: &DeviceBuffer,
        dst_off: usize,
        src: *const u8,
        len: usize,
        src_keep: Option<Held>,
    ) -> Result<(), CudaError> {
        let held = [Some(Held::Device(dst.inner.clone())), src_keep];
        self.enqueue(held.into_iter().flatten(), |api, s| {
            // SAFETY: the caller's contract for the source; `dst` is held until synchronize.
            unsafe { call::memcpy_htod_async(api, dst.at(dst_off), src.cast(), len, s) }
        })
    }

    /// Device → host of `len` bytes from `src[src_off..]` to host address `dst`, ranges checked
    /// by the caller; `dst_keep` is what keeps the destination alive, if the stream must.
    ///
    /// # Safety
    /// `[dst, dst + len)` is writable host memory that nothing else touches until the copy is
    /// done: held (and counted as written) by `dst_keep`, or borrowed mutably by the caller
    /// across a synchronize.
    unsafe fn post_d2h(
        &self,
        dst: *mut u8,
        src: &DeviceBuffer,
        src_off: usize,
        len: usize,
        dst_keep: Option<Held>,
    ) -> Result<(), CudaError> {
        let held = [dst_keep, Some(Held::Device(src.inner.clone()))];
        self.enqueue(held.into_iter().flatten(), |api, s| {
            // SAFETY: the caller's contract for the destination; `src` is held until
            // synchronize.
            unsafe { call::memcpy_dtoh_async(api, dst.cast(), src.at(src_off), len, s) }
        })
    }

    /// A device → device copy of `len` bytes: checks both ranges (`what`: their names in
    /// errors), then `check`, then posts with `post` given the two addresses, both buffers held
    /// until synchronize.
    fn post_d2d(
        &self,
        what: [&str; 2],
        (dst, dst_off): (&DeviceBuffer, usize),
        (src, src_off): (&DeviceBuffer, usize),
        len: usize,
        check: impl FnOnce() -> Result<(), CudaError>,
        post: impl FnOnce(&DriverApi, CUdeviceptr, CUdeviceptr, CUstream) -> Result<(), CudaError>,
    ) -> Result<(), CudaError> {
        let any = Self::ranges(what, (dst.len(), dst_off), (src.len(), src_off), len)?;
        check()?;
        if !any {
            return Ok(());
        }
        let held = [
            Held::Device(dst.inner.clone()),
            Held::Device(src.inner.clone()),
        ];
        self.enqueue(held, |api, s| {
            post(api, dst.at(dst_off), src.at(src_off), s)
        })
    }

    /// Host → device, asynchronous: `len` bytes from `src[src_off..]` (pinned or registered
    /// host memory) to `dst[dst_off..]` (`cuMemcpyHtoDAsync_v2`).
    pub fn copy_h2d<H: PinnedHost>(
        &self,
        dst: &DeviceBuffer,
        dst_off: usize,
        src: &H,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let what = ["H2D destination", "H2D source"];
        let dst_range = (dst.len(), dst_off);
        let Some((region, from)) =
            Self::pinned_side(what, dst_range, (src.len(), src_off), len, (src, src_off))?
        else {
            return Ok(());
        };
        // SAFETY: the range is inside `src` (checked), which the stream holds until synchronize.
        unsafe { self.post_h2d(dst, dst_off, from, len, Some(Held::HostRead(region.keep))) }
    }

    /// Device → host, asynchronous: `len` bytes from `src[src_off..]` into `dst[dst_off..]`
    /// (`cuMemcpyDtoHAsync_v2`). `dst` cannot be read on the CPU until [`Stream::synchronize`].
    pub fn copy_d2h<H: PinnedHost>(
        &self,
        dst: &mut H,
        dst_off: usize,
        src: &DeviceBuffer,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let what = ["D2H destination", "D2H source"];
        let src_range = (src.len(), src_off);
        let Some((region, to)) =
            Self::pinned_side(what, (dst.len(), dst_off), src_range, len, (&*dst, dst_off))?
        else {
            return Ok(());
        };
        // Count the writer before the DMA can start, so that no `as_slice` can race with it.
        region.keep.writers().fetch_add(1, Ordering::AcqRel);
        let writer = Held::HostWrite(region.keep);
        // SAFETY: the range is inside `dst` (checked), which the stream holds, counted as being
        // written, until synchronize.
        unsafe { self.post_d2h(to, src, src_off, len, Some(writer)) }
    }

    /// Device → device on one GPU, asynchronous (`cuMemcpyDtoDAsync_v2`). Both buffers must be
    /// on the stream's device; use [`Stream::copy_peer`] between GPUs.
    pub fn copy_d2d(
        &self,
        dst: &DeviceBuffer,
        dst_off: usize,
        src: &DeviceBuffer,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let one_gpu = || {
            if dst.ordinal() != src.ordinal() || dst.ordinal() != self.ctx.ordinal() {
                return Err(CudaError::InvalidArgument(format!(
                    "D2D copy from GPU {} to GPU {} on a stream of GPU {}: use copy_peer across \
                     GPUs",
                    src.ordinal(),
                    dst.ordinal(),
                    self.ctx.ordinal()
                )));
            }
            Ok(())
        };
        self.post_d2d(
            ["D2D destination", "D2D source"],
            (dst, dst_off),
            (src, src_off),
            len,
            one_gpu,
            // SAFETY: ranges checked, on the stream's device; both buffers held.
            |api, d, s, stream| unsafe { call::memcpy_dtod_async(api, d, s, len, stream) },
        )
    }

    /// GPU → GPU, asynchronous (`cuMemcpyPeerAsync`). With peer access enabled
    /// ([`crate::enable_peer_access`]) the copy goes directly over NVLink or PCIe; without it the
    /// driver stages through host memory. Works for one GPU too (then it is a D2D copy).
    pub fn copy_peer(
        &self,
        dst: &DeviceBuffer,
        dst_off: usize,
        src: &DeviceBuffer,
        src_off: usize,
        len: usize,
    ) -> Result<(), CudaError> {
        let (dst_ctx, src_ctx) = (dst.inner.ctx.inner.raw, src.inner.ctx.inner.raw);
        self.post_d2d(
            ["peer destination", "peer source"],
            (dst, dst_off),
            (src, src_off),
            len,
            || Ok(()),
            // SAFETY: ranges checked; both contexts retained by the buffers, which are held.
            |api, d, s, stream| unsafe {
                call::memcpy_peer_async(api, (d, dst_ctx), (s, src_ctx), len, stream)
            },
        )
    }

    /// Set `len` bytes of `dst` from `off` to `value`, asynchronous (`cuMemsetD8Async`).
    pub fn memset(
        &self,
        dst: &DeviceBuffer,
        off: usize,
        len: usize,
        value: u8,
    ) -> Result<(), CudaError> {
        check_range("memset", dst.len(), off, len)?;
        if len == 0 {
            return Ok(());
        }
        self.enqueue([Held::Device(dst.inner.clone())], |api, s| {
            // SAFETY: range checked; the buffer is held until synchronize.
            unsafe { call::memset_d8_async(api, dst.at(off), value, len, s) }
        })
    }

    /// Host → device from ordinary (pageable) memory, blocking: returns when the bytes are on
    /// the device (the stream is synchronized). The driver stages pageable memory through its
    /// own pinned buffers, so this is the "pageable H2D" path.
    pub fn write_from_slice(
        &self,
        dst: &DeviceBuffer,
        dst_off: usize,
        src: &[u8],
    ) -> Result<(), CudaError> {
        check_range("H2D destination", dst.len(), dst_off, src.len())?;
        if src.is_empty() {
            return Ok(());
        }
        // SAFETY: range checked; `src` is borrowed until after the synchronize below.
        unsafe { self.post_h2d(dst, dst_off, src.as_ptr(), src.len(), None) }?;
        self.synchronize()
    }

    /// Device → host into ordinary (pageable) memory, blocking.
    pub fn read_into_slice(
        &self,
        dst: &mut [u8],
        src: &DeviceBuffer,
        src_off: usize,
    ) -> Result<(), CudaError> {
        check_range("D2H source", src.len(), src_off, dst.len())?;
        if dst.is_empty() {
            return Ok(());
        }
        // SAFETY: range checked; `dst` is borrowed mutably until after the synchronize below.
        unsafe { self.post_d2h(dst.as_mut_ptr(), src, src_off, dst.len(), None) }?;
        self.synchronize()
    }

    pub(crate) fn hold_device(&self, bufs: &[&DeviceBuffer]) {
        self.hold(bufs.iter().map(|b| Held::Device(b.inner.clone())));
    }
}

/// A CUDA event (`cuEventCreate`), for ordering and timing work on streams.
pub struct Event {
    ctx: Context,
    raw: CUevent,
    timing: bool,
}

// SAFETY: an event handle is usable from any thread with its context current.
unsafe impl Send for Event {}
// SAFETY: as above; the driver synchronizes access.
unsafe impl Sync for Event {}

impl Drop for Event {
    fn drop(&mut self) {
        let r = self.ctx.bind().and_then(|()| {
            // SAFETY: our event, destroyed once.
            unsafe { call::event_destroy(self.ctx.api(), self.raw) }
        });
        if let Err(e) = r {
            crate::error::log_teardown("destroying event", None, &e);
        }
    }
}

impl std::fmt::Debug for Event {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Event")
            .field("ordinal", &self.ctx.ordinal())
            .field("timing", &self.timing)
            .finish()
    }
}

impl Event {
    /// Create an event; `timing` enables [`Event::elapsed_ms`] (slightly costlier to record).
    pub fn new(ctx: &Context, timing: bool) -> Result<Event, CudaError> {
        ctx.bind()?;
        let flags = if timing {
            CU_EVENT_DEFAULT
        } else {
            CU_EVENT_DISABLE_TIMING
        };
        let raw = call::event_create(ctx.api(), flags)?;
        Ok(Event {
            ctx: ctx.clone(),
            raw,
            timing,
        })
    }

    /// Record the event at the current end of `stream` (`cuEventRecord`).
    pub fn record(&self, stream: &Stream) -> Result<(), CudaError> {
        if !self.ctx.same_device(stream.context()) {
            return Err(CudaError::InvalidArgument(format!(
                "event of GPU {} recorded on a stream of GPU {}",
                self.ctx.ordinal(),
                stream.context().ordinal()
            )));
        }
        self.ctx.bind()?;
        // SAFETY: our event and a live stream of the same context.
        unsafe { call::event_record(self.ctx.api(), self.raw, stream.raw()) }
    }

    /// Wait until the work before the last `record` has finished (`cuEventSynchronize`).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx.bind()?;
        // SAFETY: our event.
        unsafe { call::event_synchronize(self.ctx.api(), self.raw) }
    }

    /// Milliseconds of GPU time between `self` (start) and `end`, both recorded and completed
    /// (`cuEventElapsedTime_v2`, or `cuEventElapsedTime` on drivers before CUDA 12.8; resolution
    /// about 0.5 µs per the CUDA documentation).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, CudaError> {
        if !self.timing || !end.timing {
            return Err(CudaError::InvalidArgument(
                "elapsed_ms needs two events created with timing enabled".into(),
            ));
        }
        self.ctx.bind()?;
        // SAFETY: two live events.
        unsafe { call::event_elapsed_time(self.ctx.api(), self.raw, end.raw) }
    }
}
