//! Streams, events and the copies enqueued on them.
//!
//! Every method checks its ranges with [`check_range`] before the driver sees them, makes the
//! stream's context current, and (for asynchronous operations) keeps the buffers it touches
//! alive until [`Stream::synchronize`]. Zero-length operations are accepted and do nothing.

use std::sync::atomic::Ordering;
use std::sync::{Arc, Mutex};

use crate::context::Context;
use crate::error::CudaError;
use crate::ffi::{self, CUevent, CUstream};
#[allow(unused_imports)]
use crate::memory::Sealed as _;
use crate::memory::{check_range, DevMem, DeviceBuffer, HostKeep, PinnedHost};

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
        let api = self.ctx.api();
        // SAFETY: our stream, idle now.
        let r = unsafe { (api.cuStreamDestroy)(self.raw) };
        if let Err(e) = api.check("cuStreamDestroy_v2", r) {
            crate::error::log_teardown("destroying stream", None, &e);
        }
    }
}

impl Stream {
    /// Create a stream on `ctx`.
    pub fn new(ctx: &Context) -> Result<Stream, CudaError> {
        ctx.bind()?;
        let mut raw: CUstream = std::ptr::null_mut();
        // SAFETY: context current; out-pointer live.
        ctx.api().check("cuStreamCreate", unsafe {
            (ctx.api().cuStreamCreate)(&mut raw, ffi::CU_STREAM_NON_BLOCKING)
        })?;
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
        // SAFETY: our stream and a live event; flags 0 is the only defined value.
        self.ctx.api().check("cuStreamWaitEvent", unsafe {
            (self.ctx.api().cuStreamWaitEvent)(self.raw, event.raw, 0)
        })
    }

    /// Wait until all work enqueued so far has finished, then release the buffers it held.
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx.bind()?;
        // Take the list first: what is enqueued after this point is not covered by this wait.
        let held = std::mem::take(&mut *self.held.lock().unwrap_or_else(|p| p.into_inner()));
        // SAFETY: our stream.
        let r = unsafe { (self.ctx.api().cuStreamSynchronize)(self.raw) };
        match self.ctx.api().check("cuStreamSynchronize", r) {
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
        check_range("H2D destination", dst.len(), dst_off, len)?;
        check_range("H2D source", src.len(), src_off, len)?;
        if len == 0 {
            return Ok(());
        }
        let region = src.region();
        self.ctx.bind()?;
        // SAFETY: ranges checked; both buffers are kept alive by `hold` until synchronize.
        let r = unsafe {
            (self.ctx.api().cuMemcpyHtoDAsync)(
                dst.inner.ptr + dst_off as u64,
                region.ptr.add(src_off) as *const _,
                len,
                self.raw,
            )
        };
        self.ctx.api().check("cuMemcpyHtoDAsync_v2", r)?;
        self.hold([Held::Device(dst.inner.clone()), Held::HostRead(region.keep)]);
        Ok(())
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
        check_range("D2H destination", dst.len(), dst_off, len)?;
        check_range("D2H source", src.len(), src_off, len)?;
        if len == 0 {
            return Ok(());
        }
        let region = dst.region();
        self.ctx.bind()?;
        // Count the writer before the DMA can start, so that no `as_slice` can race with it.
        region.keep.writers().fetch_add(1, Ordering::AcqRel);
        let writer = Held::HostWrite(region.keep);
        // SAFETY: ranges checked; both buffers are kept alive by `hold` until synchronize.
        let r = unsafe {
            (self.ctx.api().cuMemcpyDtoHAsync)(
                region.ptr.add(dst_off) as *mut _,
                src.inner.ptr + src_off as u64,
                len,
                self.raw,
            )
        };
        if let Err(e) = self.ctx.api().check("cuMemcpyDtoHAsync_v2", r) {
            drop(writer);
            return Err(e);
        }
        self.hold([Held::Device(src.inner.clone()), writer]);
        Ok(())
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
        check_range("D2D destination", dst.len(), dst_off, len)?;
        check_range("D2D source", src.len(), src_off, len)?;
        if dst.ordinal() != src.ordinal() || dst.ordinal() != self.ctx.ordinal() {
            return Err(CudaError::InvalidArgument(format!(
                "D2D copy from GPU {} to GPU {} on a stream of GPU {}: use copy_peer across GPUs",
                src.ordinal(),
                dst.ordinal(),
                self.ctx.ordinal()
            )));
        }
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: ranges checked; buffers held until synchronize.
        let r = unsafe {
            (self.ctx.api().cuMemcpyDtoDAsync)(
                dst.inner.ptr + dst_off as u64,
                src.inner.ptr + src_off as u64,
                len,
                self.raw,
            )
        };
        self.ctx.api().check("cuMemcpyDtoDAsync_v2", r)?;
        self.hold([
            Held::Device(dst.inner.clone()),
            Held::Device(src.inner.clone()),
        ]);
        Ok(())
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
        check_range("peer destination", dst.len(), dst_off, len)?;
        check_range("peer source", src.len(), src_off, len)?;
        if len == 0 {
            return Ok(());
        }
        self.ctx.bind()?;
        // SAFETY: ranges checked; both contexts retained by the buffers; buffers held.
        let r = unsafe {
            (self.ctx.api().cuMemcpyPeerAsync)(
                dst.inner.ptr + dst_off as u64,
                dst.inner.ctx.inner.raw,
                src.inner.ptr + src_off as u64,
                src.inner.ctx.inner.raw,
                len,
                self.raw,
            )
        };
        self.ctx.api().check("cuMemcpyPeerAsync", r)?;
        self.hold([
            Held::Device(dst.inner.clone()),
            Held::Device(src.inner.clone()),
        ]);
        Ok(())
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
        self.ctx.bind()?;
        // SAFETY: range checked; buffer held.
        let r = unsafe {
            (self.ctx.api().cuMemsetD8Async)(dst.inner.ptr + off as u64, value, len, self.raw)
        };
        self.ctx.api().check("cuMemsetD8Async", r)?;
        self.hold([Held::Device(dst.inner.clone())]);
        Ok(())
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
        self.ctx.bind()?;
        // SAFETY: range checked; `src` is borrowed until after the synchronize below.
        let r = unsafe {
            (self.ctx.api().cuMemcpyHtoDAsync)(
                dst.inner.ptr + dst_off as u64,
                src.as_ptr() as *const _,
                src.len(),
                self.raw,
            )
        };
        self.ctx.api().check("cuMemcpyHtoDAsync_v2", r)?;
        self.hold([Held::Device(dst.inner.clone())]);
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
        self.ctx.bind()?;
        // SAFETY: range checked; `dst` is borrowed mutably until after the synchronize below.
        let r = unsafe {
            (self.ctx.api().cuMemcpyDtoHAsync)(
                dst.as_mut_ptr() as *mut _,
                src.inner.ptr + src_off as u64,
                dst.len(),
                self.raw,
            )
        };
        self.ctx.api().check("cuMemcpyDtoHAsync_v2", r)?;
        self.hold([Held::Device(src.inner.clone())]);
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
        let api = self.ctx.api();
        let r = self
            .ctx
            .bind()
            // SAFETY: our event.
            .and_then(|()| {
                api.check("cuEventDestroy_v2", unsafe {
                    (api.cuEventDestroy)(self.raw)
                })
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
            ffi::CU_EVENT_DEFAULT
        } else {
            ffi::CU_EVENT_DISABLE_TIMING
        };
        let mut raw: CUevent = std::ptr::null_mut();
        // SAFETY: context current; out-pointer live.
        ctx.api().check("cuEventCreate", unsafe {
            (ctx.api().cuEventCreate)(&mut raw, flags)
        })?;
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
        // SAFETY: our event and a stream of the same context.
        self.ctx.api().check("cuEventRecord", unsafe {
            (self.ctx.api().cuEventRecord)(self.raw, stream.raw())
        })
    }

    /// Wait until the work before the last `record` has finished (`cuEventSynchronize`).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.ctx.bind()?;
        // SAFETY: our event.
        self.ctx.api().check("cuEventSynchronize", unsafe {
            (self.ctx.api().cuEventSynchronize)(self.raw)
        })
    }

    /// Milliseconds of GPU time between `self` (start) and `end`, both recorded and completed
    /// (`cuEventElapsedTime_v2`; resolution about 0.5 µs per the CUDA documentation).
    pub fn elapsed_ms(&self, end: &Event) -> Result<f32, CudaError> {
        if !self.timing || !end.timing {
            return Err(CudaError::InvalidArgument(
                "elapsed_ms needs two events created with timing enabled".into(),
            ));
        }
        self.ctx.bind()?;
        let mut ms = 0f32;
        // SAFETY: two timing events; out-pointer live.
        self.ctx.api().check("cuEventElapsedTime_v2", unsafe {
            (self.ctx.api().cuEventElapsedTime)(&mut ms, self.raw, end.raw)
        })?;
        Ok(ms)
    }
}
