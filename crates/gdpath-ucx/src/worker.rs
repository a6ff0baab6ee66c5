//! The UCP worker: progress, blocking waits, worker addresses and active-message queues.

use std::collections::{HashMap, VecDeque};
use std::fmt;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::{Arc, Mutex, MutexGuard, Weak};
use std::time::{Duration, Instant};

use crate::call;
use crate::context::{Context, Features};
use crate::error::{Result, UcxError};
use crate::sync::lock;
use crate::sys;

/// Largest control message (header + payload, bytes) this crate sends or queues. Larger
/// incoming messages are dropped and counted ([`Worker::am_dropped`]): a peer cannot make
/// the receiver allocate more than this per message.
pub const AM_MAX_MESSAGE: usize = 1 << 20;
/// Most messages queued per active-message id before new ones are dropped and counted.
pub const AM_MAX_QUEUED: usize = 4096;
/// Payloads at least this long (bytes) that UCX lets the receiver keep
/// (`UCP_AM_RECV_ATTR_FLAG_DATA`, such as a message assembled from several fragments) are held
/// in UCX's buffer instead of copied ([`AmData`]): a fresh allocation per message makes the
/// allocator return and re-fault its pages each time (docs/benchmarks.md, "Measurements behind
/// the defaults", `AM_HOLD_MIN`).
pub const AM_HOLD_MIN: usize = 8 * 1024;

/// Opaque identity of an endpoint (its `ucp_ep_h` as an integer): compare
/// [`AmMessage::reply_ep`] with [`crate::Endpoint::id`] to find who sent a message.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct EpId(pub(crate) usize);

/// A received active message: the header copied, the payload copied or held in UCX's buffer
/// ([`AmData`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct AmMessage {
    /// The active-message id it was sent to.
    pub id: u16,
    /// The user header bytes.
    pub header: Vec<u8>,
    /// The payload bytes.
    pub data: AmData,
    /// The endpoint it arrived on, when the sender asked for replies (this crate always does).
    pub reply_ep: Option<EpId>,
}

/// A received message's payload: its own copy, or (from [`AM_HOLD_MIN`] bytes, where UCX allows
/// it) UCX's receive buffer itself, released to UCX (`ucp_am_data_release`) when dropped.
/// Read it as a byte slice. A held payload taken from the queue keeps its worker alive until it
/// is dropped (UCX's buffer may belong to the worker's transports); one still queued when the
/// worker goes is given back first.
pub struct AmData(Repr);

enum Repr {
    Owned(Vec<u8>),
    Held(Held),
}

/// Payloads held in UCX's buffers and not yet given back, process-wide ([`am_held_live`]).
static HELD_LIVE: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);

/// How many received payloads this process holds in UCX's buffers ([`AmData`]) and has not
/// given back to UCX: a diagnostic, and what tests check for leaks.
pub fn am_held_live() -> usize {
    HELD_LIVE.load(std::sync::atomic::Ordering::Relaxed)
}

/// A payload UCX let us keep.
struct Held {
    ptr: *mut c_void,
    len: usize,
    /// While queued (the queue belongs to the worker: a strong reference would be a cycle).
    /// Empty once released by the worker's drop.
    queued: Weak<WorkerInner>,
    /// Once taken from the queue.
    taken: Option<Arc<WorkerInner>>,
}

// SAFETY: the bytes are immutable while held, and only released under the worker's lock.
unsafe impl Send for Held {}
// SAFETY: as for Send: shared access only reads the bytes.
unsafe impl Sync for Held {}

impl Held {
    /// Gives the buffer back to UCX; the caller holds the worker's lock.
    ///
    /// # Safety
    /// `w` is the live worker the buffer came from, locked by the caller.
    unsafe fn release_locked(&mut self, w: &WorkerInner) {
        // SAFETY: the caller's contract; `ptr` is released once, as `queued` is emptied and
        // `taken` was taken.
        unsafe { call::am_data_release(w.ctx.api(), w.raw, self.ptr) };
        self.queued = Weak::new();
        HELD_LIVE.fetch_sub(1, std::sync::atomic::Ordering::Relaxed);
    }
}

impl Drop for Held {
    fn drop(&mut self) {
        if let Some(w) = self.taken.take().or_else(|| self.queued.upgrade()) {
            {
                let _g = lock(&w.lock);
                // SAFETY: the worker is alive (upgraded) and locked.
                unsafe { self.release_locked(&w) };
            }
            // The lock is released before `w`, which may be the worker's last reference.
            drop(w);
        }
    }
}

impl std::ops::Deref for AmData {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.0 {
            Repr::Owned(v) => v,
            // SAFETY: UCX keeps `len` bytes at `ptr` until released, which only drop does.
            Repr::Held(h) => unsafe { std::slice::from_raw_parts(h.ptr as *const u8, h.len) },
        }
    }
}

impl AsRef<[u8]> for AmData {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl From<Vec<u8>> for AmData {
    fn from(v: Vec<u8>) -> Self {
        AmData(Repr::Owned(v))
    }
}

impl AmData {
    /// Whether the bytes are UCX's buffer rather than a copy.
    pub fn is_held(&self) -> bool {
        matches!(self.0, Repr::Held(_))
    }
}

impl Clone for AmData {
    /// A copy of the bytes (a held buffer stays with this value).
    fn clone(&self) -> Self {
        self.to_vec().into()
    }
}

impl PartialEq for AmData {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}
impl Eq for AmData {}

impl fmt::Debug for AmData {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let how = if self.is_held() { "held" } else { "copied" };
        write!(f, "{} bytes ({how})", self.len())
    }
}

#[derive(Default)]
pub(crate) struct AmQueues {
    queues: HashMap<u16, VecDeque<AmMessage>>,
    dropped: u64,
}

/// What the AM callback receives as its `arg`: the queue and the id it was registered for.
struct AmHandlerArg {
    id: u16,
    queues: Arc<Mutex<AmQueues>>,
    /// For payloads held in UCX's buffers, to release them.
    worker: Weak<WorkerInner>,
}

pub(crate) struct WorkerInner {
    pub(crate) ctx: Context,
    pub(crate) raw: sys::ucp_worker_h,
    pub(crate) lock: Arc<Mutex<()>>,
    am: Arc<Mutex<AmQueues>>,
    /// Callback args handed to UCX; freed after the worker is destroyed.
    am_args: Mutex<Vec<*mut AmHandlerArg>>,
    /// Endpoint closes started without waiting ([`crate::Endpoint::retire`]) that UCX has not
    /// finished: [`Worker::progress`] finishes them, the worker's drop whatever is left.
    closing: Mutex<Vec<PendingClose>>,
    /// `closing.len()`, read without the lock: progress looks at the list only when it holds
    /// something.
    closing_n: AtomicUsize,
}

/// An endpoint close UCX has not finished: its request, and what to free once UCX no longer
/// calls back into it.
pub(crate) struct PendingClose {
    pub(crate) req: *mut c_void,
    pub(crate) release: Box<dyn FnOnce() + Send>,
}

impl WorkerInner {
    /// Keeps `close` until UCX finished it; the caller holds the worker's lock.
    pub(crate) fn defer_close(&self, close: PendingClose) {
        let mut c = lock(&self.closing);
        c.push(close);
        self.closing_n.store(c.len(), Ordering::Release);
    }

    /// Releases the closes UCX finished; the caller holds the worker's lock.
    fn finish_closes_locked(&self) {
        let mut c = lock(&self.closing);
        let api = self.ctx.api();
        let mut i = 0;
        while i < c.len() {
            // SAFETY: a live request of this worker, which the caller holds locked.
            let st = unsafe { call::request_check_status(api, c[i].req) };
            if st.0 == sys::UCS_INPROGRESS {
                i += 1;
                continue;
            }
            let done = c.swap_remove(i);
            // SAFETY: completed; released once.
            unsafe { call::request_free(api, done.req) };
            (done.release)();
        }
        self.closing_n.store(c.len(), Ordering::Release);
    }
}

// SAFETY: all calls on `raw` are made under `lock` (the worker is created in
// UCS_THREAD_MODE_SERIALIZED); the raw callback args are only freed in Drop.
unsafe impl Send for WorkerInner {}
// SAFETY: as for Send: shared access goes through `lock` or the queues' mutex.
unsafe impl Sync for WorkerInner {}

impl Drop for WorkerInner {
    fn drop(&mut self) {
        let closing: Vec<PendingClose> = {
            let _g = lock(&self.lock);
            // Payloads still queued in UCX's buffers go back before the worker does.
            let mut q = lock(&self.am);
            for m in q.queues.values_mut().flat_map(|q| q.iter_mut()) {
                if let Repr::Held(h) = &mut m.data.0 {
                    // SAFETY: the worker is alive until destroyed below, and locked.
                    unsafe { h.release_locked(self) };
                }
            }
            drop(q);
            // Closes still under way are UCX's to end with the worker: their requests are
            // given back now, what they hold is freed once the worker is gone.
            let closing: Vec<PendingClose> = lock(&self.closing).drain(..).collect();
            for c in &closing {
                // SAFETY: a pending request of this live worker, released once; UCX frees it
                // when it ends.
                unsafe { call::request_free(self.ctx.api(), c.req) };
            }
            // SAFETY: last reference: endpoints, listeners, keys and requests hold a Worker.
            unsafe { call::worker_destroy(self.ctx.api(), self.raw) };
            closing
        };
        for c in closing {
            // UCX no longer calls back into what the endpoints handed it.
            (c.release)();
        }
        for arg in self
            .am_args
            .get_mut()
            .unwrap_or_else(|p| p.into_inner())
            .drain(..)
        {
            // SAFETY: created by Box::into_raw in am_register; UCX no longer calls back.
            drop(unsafe { Box::from_raw(arg) });
        }
    }
}

/// A UCP worker (`ucp_worker_h`): the progress engine that endpoints, listeners and requests
/// belong to. Cheap to clone; `Send + Sync`.
///
/// Thread safety: the worker is created in `UCS_THREAD_MODE_SERIALIZED` and every UCX call
/// on it or its endpoints takes the worker's lock, so any thread may use it; calls from
/// several threads are serialised, not parallel. For parallelism, use one worker per thread.
///
/// Progress: UCX moves data only while someone calls [`Worker::progress`] (the `wait`
/// helpers do). Over `tcp`, put and get are emulated in software by the *target* worker:
/// the target must keep progressing for remote operations on it to complete.
#[derive(Clone)]
pub struct Worker {
    pub(crate) inner: Arc<WorkerInner>,
}

impl fmt::Debug for Worker {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Worker")
            .field("raw", &self.inner.raw)
            .finish()
    }
}

impl Worker {
    /// Creates a worker on `ctx`.
    pub fn new(ctx: &Context) -> Result<Worker> {
        let mut params: sys::ucp_worker_params_t = call::unset();
        params.field_mask = sys::UCP_WORKER_PARAM_FIELD_THREAD_MODE as u64;
        params.thread_mode = sys::UCS_THREAD_MODE_SERIALIZED;
        let lock_ = ctx.worker_lock();
        let raw = {
            let _g = lock(&ctx.inner.lock);
            // SAFETY: live context, calls serialised; THREAD_MODE exists since UCX 1.13.
            unsafe { call::worker_create(ctx.api(), ctx.inner.raw, &params) }?
        };
        Ok(Worker {
            inner: Arc::new(WorkerInner {
                ctx: ctx.clone(),
                raw,
                lock: lock_,
                am: Arc::new(Mutex::new(AmQueues::default())),
                am_args: Mutex::new(Vec::new()),
                closing: Mutex::new(Vec::new()),
                closing_n: AtomicUsize::new(0),
            }),
        })
    }

    /// The context this worker belongs to.
    pub fn context(&self) -> &Context {
        &self.inner.ctx
    }

    pub(crate) fn api(&self) -> &sys::Ucp {
        self.inner.ctx.api()
    }

    pub(crate) fn guard(&self) -> MutexGuard<'_, ()> {
        lock(&self.inner.lock)
    }

    /// Runs UCX's progress once (`ucp_worker_progress`); returns the number of events
    /// processed (0 when idle).
    ///
    /// Endpoint closes started without waiting ([`crate::Endpoint::retire`]) that UCX
    /// finished meanwhile are released here.
    pub fn progress(&self) -> u32 {
        let _g = self.guard();
        // SAFETY: live worker, serialised.
        let n = unsafe { call::worker_progress(self.api(), self.inner.raw) };
        if self.inner.closing_n.load(Ordering::Acquire) > 0 {
            self.inner.finish_closes_locked();
        }
        n
    }

    /// Endpoint closes started without waiting ([`crate::Endpoint::retire`]) and not
    /// finished yet: a diagnostic, and what tests check.
    pub fn closes_pending(&self) -> usize {
        self.inner.closing_n.load(Ordering::Acquire)
    }

    /// Progresses until `done()` is true or `timeout` passes. Returns whether `done()` became
    /// true. Yields the CPU between idle rounds so that a peer thread can run.
    pub fn progress_until(&self, timeout: Duration, mut done: impl FnMut() -> bool) -> bool {
        let start = Instant::now();
        loop {
            if done() {
                return true;
            }
            if start.elapsed() >= timeout {
                return done();
            }
            if self.progress() == 0 {
                std::thread::yield_now();
            }
        }
    }

    /// Blocks until UCX has events for this worker or `timeout` passes (`ucp_worker_arm` +
    /// `poll` on `ucp_worker_get_efd`). Needs [`Features::WAKEUP`]. Returns true if woken by
    /// an event, false on timeout; the caller then calls [`Worker::progress`].
    pub fn wait(&self, timeout: Duration) -> Result<bool> {
        self.inner.ctx.require(Features::WAKEUP, "WAKEUP")?;
        let fd = {
            let _g = self.guard();
            // SAFETY: live worker, serialised.
            let fd = unsafe { call::worker_get_efd(self.api(), self.inner.raw) }?;
            // SAFETY: live worker, serialised.
            if !unsafe { call::worker_arm(self.api(), self.inner.raw) }? {
                return Ok(true); // events already pending: progress first
            }
            fd
        };
        let mut pfd = libc::pollfd {
            fd,
            events: libc::POLLIN,
            revents: 0,
        };
        let ms = timeout.as_millis().min(i32::MAX as u128) as libc::c_int;
        // SAFETY: one valid pollfd.
        let rc = unsafe { libc::poll(&mut pfd, 1, ms) };
        if rc < 0 {
            let e = std::io::Error::last_os_error();
            if e.kind() == std::io::ErrorKind::Interrupted {
                return Ok(false);
            }
            return Err(UcxError::Os {
                op: "poll(ucp worker efd)",
                source: std::sync::Arc::new(e),
            });
        }
        Ok(rc > 0)
    }

    /// Wakes a thread blocked in [`Worker::wait`] (`ucp_worker_signal`).
    pub fn signal(&self) -> Result<()> {
        let _g = self.guard();
        // SAFETY: live worker, serialised.
        unsafe { call::worker_signal(self.api(), self.inner.raw) }
    }

    /// This worker's address (`ucp_worker_get_address`), to send to a peer that connects
    /// with [`crate::Endpoint::connect_address`].
    pub fn address(&self) -> Result<WorkerAddress> {
        let _g = self.guard();
        // SAFETY: live worker, serialised.
        let (addr, len) = unsafe { call::worker_get_address(self.api(), self.inner.raw) }?;
        // SAFETY: UCX returned `len` readable bytes at `addr`; released right after copying.
        let bytes = unsafe { std::slice::from_raw_parts(addr as *const u8, len) }.to_vec();
        // SAFETY: releases what get_address allocated, once.
        unsafe { call::worker_release_address(self.api(), self.inner.raw, addr) };
        Ok(WorkerAddress(bytes))
    }

    /// Starts queueing active messages sent to `id` (`ucp_worker_set_am_recv_handler`).
    /// Each message's header is copied into the queue, and its payload too unless UCX lets it
    /// be held ([`AmData`], [`AM_HOLD_MIN`]); read them with
    /// [`Worker::am_try_recv`] or [`Worker::am_recv`]. Needs [`Features::AM`].
    pub fn am_register(&self, id: u16) -> Result<()> {
        self.inner.ctx.require(Features::AM, "AM")?;
        let arg = Box::into_raw(Box::new(AmHandlerArg {
            id,
            queues: self.inner.am.clone(),
            worker: Arc::downgrade(&self.inner),
        }));
        let mut p: sys::ucp_am_handler_param_t = call::unset();
        p.field_mask = (sys::UCP_AM_HANDLER_PARAM_FIELD_ID
            | sys::UCP_AM_HANDLER_PARAM_FIELD_FLAGS
            | sys::UCP_AM_HANDLER_PARAM_FIELD_CB
            | sys::UCP_AM_HANDLER_PARAM_FIELD_ARG) as u64;
        p.id = id as u32;
        p.flags = sys::UCP_AM_FLAG_WHOLE_MSG;
        p.cb = Some(am_recv_cb);
        p.arg = arg.cast();
        let set = {
            let _g = self.guard();
            // SAFETY: live worker, serialised; the flagged fields exist since UCX 1.11; `arg`
            // outlives the worker (freed in WorkerInner::drop).
            unsafe { call::worker_set_am_recv_handler(self.api(), self.inner.raw, &p) }
        };
        if let Err(e) = set {
            // SAFETY: UCX did not take the arg.
            drop(unsafe { Box::from_raw(arg) });
            return Err(e);
        }
        lock(&self.inner.am_args).push(arg);
        Ok(())
    }

    /// Pops the oldest queued message for `id` without progressing.
    pub fn am_try_recv(&self, id: u16) -> Option<AmMessage> {
        let mut q = lock(&self.inner.am);
        let mut m = q.queues.get_mut(&id).and_then(|q| q.pop_front())?;
        if let Repr::Held(h) = &mut m.data.0 {
            h.taken = Some(self.inner.clone());
        }
        Some(m)
    }

    /// How many messages for `id` are queued.
    pub fn am_queued(&self, id: u16) -> usize {
        let q = lock(&self.inner.am);
        q.queues.get(&id).map_or(0, VecDeque::len)
    }

    /// Progresses until a message for `id` is queued, up to `timeout`.
    ///
    /// Errors: [`UcxError::Timeout`].
    pub fn am_recv(&self, id: u16, timeout: Duration) -> Result<AmMessage> {
        let mut got = None;
        self.progress_until(timeout, || {
            got = got.take().or_else(|| self.am_try_recv(id));
            got.is_some()
        });
        got.ok_or(UcxError::Timeout {
            op: "am_recv",
            timeout,
        })
    }

    /// Messages dropped because they exceeded [`AM_MAX_MESSAGE`], [`AM_MAX_QUEUED`], or came
    /// with the rendezvous protocol (which this crate's senders never use).
    pub fn am_dropped(&self) -> u64 {
        lock(&self.inner.am).dropped
    }
}

/// UCX calls this from `ucp_worker_progress` for each active message to a registered id.
unsafe extern "C" fn am_recv_cb(
    arg: *mut c_void,
    header: *const c_void,
    header_length: usize,
    data: *mut c_void,
    length: usize,
    param: *const sys::ucp_am_recv_param_t,
) -> sys::ucs_status_t {
    // SAFETY: arg is the AmHandlerArg registered with this id; it outlives the worker.
    let arg = unsafe { &*(arg as *const AmHandlerArg) };
    // SAFETY: UCX passes a valid parameter struct for the duration of the callback.
    let param = unsafe { &*param };
    let mut q = lock(&arg.queues);
    // Eager data is readable now (FLAG_DATA only says UCX would let us keep it); rendezvous
    // data would need ucp_am_recv_data_nbx, which this crate's senders never require.
    let rndv = param.recv_attr & sys::UCP_AM_RECV_ATTR_FLAG_RNDV as u64 != 0;
    let too_big = header_length.saturating_add(length) > AM_MAX_MESSAGE;
    let queue_len = q.queues.get(&arg.id).map_or(0, |v| v.len());
    if rndv || too_big || queue_len >= AM_MAX_QUEUED {
        // Rendezvous data left unreceived is dropped by UCX when we return UCS_OK.
        q.dropped += 1;
        return sys::UCS_OK;
    }
    let copy = |p: *const c_void, n: usize| -> Vec<u8> {
        if n == 0 || p.is_null() {
            Vec::new()
        } else {
            // SAFETY: UCX guarantees n readable bytes at p for the duration of the callback.
            unsafe { std::slice::from_raw_parts(p as *const u8, n) }.to_vec()
        }
    };
    let reply_ep = (param.recv_attr & sys::UCP_AM_RECV_ATTR_FIELD_REPLY_EP as u64 != 0
        && !param.reply_ep.is_null())
    .then_some(EpId(param.reply_ep as usize));
    // Keeping a large payload in UCX's buffer spares a copy and, above all, an allocation per
    // message (see AM_HOLD_MIN).
    let keep = param.recv_attr & sys::UCP_AM_RECV_ATTR_FLAG_DATA as u64 != 0
        && length >= AM_HOLD_MIN
        && !data.is_null();
    let (payload, status) = if keep {
        let held = Held {
            ptr: data,
            len: length,
            queued: arg.worker.clone(),
            taken: None,
        };
        HELD_LIVE.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        (AmData(Repr::Held(held)), sys::UCS_INPROGRESS)
    } else {
        (copy(data, length).into(), sys::UCS_OK)
    };
    let msg = AmMessage {
        id: arg.id,
        header: copy(header, header_length),
        data: payload,
        reply_ep,
    };
    q.queues.entry(arg.id).or_default().push_back(msg);
    status
}

/// A worker's address as bytes (opaque, UCX-encoded), to exchange out of band.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct WorkerAddress(pub Vec<u8>);
