//! Endpoints: connect (socket address or worker address), accept, close, error state,
//! RMA (put/get), flush, active messages, and which transports an endpoint uses.

use std::fmt;
use std::net::SocketAddr;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicI8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use crate::capture::capture;
use crate::context::{Features, MemType};
use crate::error::{check, ptr_is_err, Result, Status, UcxError};
use crate::memory::{MemHandle, RemoteRegion};
use crate::request::{IovPin, Pins, Request};
use crate::sockaddr::CSockAddr;
use crate::sys;
use crate::worker::{EpId, Worker, WorkerAddress, AM_MAX_MESSAGE};

/// Largest message (bytes) [`Endpoint::am_send_parts`] copies into one buffer rather than
/// sends as UCX IOV: on loopback tcp, 16 writes of 8 B packed into a message ran at 0.0023 GB/s
/// as IOV against 0.0038–0.0044 copied (IOV sends are never UCX's short protocol).
pub const AM_GATHER_COPY_MAX: usize = 8 * 1024;

/// Parts at least this long (bytes) of a message above [`AM_GATHER_COPY_MAX`] are sent in
/// place; shorter ones are copied into runs. UCX's IOV costs per entry: on loopback tcp, 16
/// writes of 4 KiB per message ran at 0.94–1.19 GB/s in place against 1.24–1.37 copied, and 16
/// writes of 512 B at 0.17–0.19 against 0.33–0.36; one of 64 KiB ran at 1.8–2.2 in place
/// against 0.90–0.94 copied into a fresh buffer per message.
pub const AM_IN_PLACE_MIN: usize = 16 * 1024;

/// A piece of an [`Endpoint::am_send_parts`] payload: a run of copied bytes (by index) or a
/// part's bytes in place.
enum Seg {
    Copied(usize),
    InPlace(*mut u8, usize),
}

/// One piece of an active message's payload for [`Endpoint::am_send_parts`]: `len` bytes at
/// `offset` in a host memory mapping.
#[derive(Debug, Clone)]
pub struct AmPart {
    /// The registered host memory the bytes are in.
    pub mem: MemHandle,
    /// Offset of the first byte in `mem`, bytes.
    pub offset: usize,
    /// Length, bytes.
    pub len: usize,
}

/// How long dropping an endpoint flushes its outstanding operations before force-closing it.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Shared with UCX's error callback: 0 while healthy, else the failure status.
struct EpState {
    failure: AtomicI8,
}

pub(crate) struct EpInner {
    worker: Worker,
    raw: sys::ucp_ep_h,
    /// Box handed to UCX as the error-callback argument; freed after the close completes.
    state: *mut EpState,
    peer: Option<SocketAddr>,
    err_mode: ErrorMode,
    /// Set when an operation is posted, cleared when a flush completes: a clean endpoint is
    /// force-closed at drop without flushing (which would wait on a peer that may be gone).
    dirty: AtomicBool,
}

// SAFETY: UCX calls on `raw` happen under the worker lock; `state` is only read atomically.
unsafe impl Send for EpInner {}
unsafe impl Sync for EpInner {}

impl EpInner {
    fn failure(&self) -> Option<Status> {
        // SAFETY: state lives until after the endpoint is closed.
        let s = unsafe { &*self.state }.failure.load(Ordering::Acquire);
        (s != 0).then_some(Status(s))
    }

    /// Polls a request of this worker until it finishes or `timeout` passes; releases it.
    /// Returns its final status, or `None` on timeout (UCX then frees it on completion).
    fn poll_raw(&self, req: *mut c_void, timeout: Duration) -> Option<sys::ucs_status_t> {
        if req.is_null() {
            return Some(sys::UCS_OK);
        }
        if ptr_is_err(req) {
            return Some(crate::error::ptr_status(req).0);
        }
        let api = self.worker.api();
        let mut status = sys::UCS_INPROGRESS;
        let done = self.worker.progress_until(timeout, || {
            let _g = self.worker.guard();
            // SAFETY: live request of this worker.
            status = unsafe { api.ucp_request_check_status(req) };
            status != sys::UCS_INPROGRESS
        });
        let _g = self.worker.guard();
        // SAFETY: released once; if still pending, UCX frees it on completion.
        unsafe { api.ucp_request_free(req) };
        done.then_some(status)
    }

    /// Closes the UCP endpoint and waits up to `timeout`.
    ///
    /// `graceful`: flush close (`ucp_ep_close_nbx` without flags), which completes only when
    /// the peer's worker progresses too. Otherwise: flush outstanding operations for at most
    /// `timeout`, then force close (`UCP_EP_CLOSE_FLAG_FORCE`, allowed because every endpoint
    /// uses peer error handling), which does not wait for the peer. A failed endpoint is
    /// always force-closed. If UCX does not finish, the error-callback state is leaked
    /// (never freed while UCX may call back).
    fn close_raw(&mut self, graceful: bool, timeout: Duration) -> Result<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        let start = Instant::now();
        let api = self.worker.api();
        // Force close is only defined with peer error handling.
        let force = self.err_mode == ErrorMode::Peer && (!graceful || self.failure().is_some());
        if force && self.failure().is_none() && self.dirty.load(Ordering::Acquire) {
            let flush = {
                let _g = self.worker.guard();
                // SAFETY: zeroed params are valid.
                let p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
                // SAFETY: live endpoint.
                unsafe { api.ucp_ep_flush_nbx(self.raw, &p) }
            };
            if self.poll_raw(flush, timeout) != Some(sys::UCS_OK) {
                tracing::debug!(peer = ?self.peer, "flush before force close did not complete");
            }
        }
        let req = {
            let _g = self.worker.guard();
            // SAFETY: zeroed params; FLAGS known since 1.10.
            let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
            if force {
                p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
                p.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
            }
            // SAFETY: live endpoint; after this call it must not be used again.
            unsafe { api.ucp_ep_close_nbx(self.raw, &p) }
        };
        self.raw = std::ptr::null_mut();
        match self.poll_raw(req, timeout.saturating_sub(start.elapsed())) {
            Some(st) => {
                self.free_state();
                if st == sys::UCS_OK || st == sys::UCS_ERR_CANCELED || Status(st).is_peer_failure()
                {
                    Ok(())
                } else {
                    check("ucp_ep_close_nbx", st)
                }
            }
            None => {
                tracing::warn!(peer = ?self.peer, "endpoint close did not finish within {timeout:?}");
                Err(UcxError::Timeout {
                    op: "ucp_ep_close_nbx",
                    timeout,
                })
            }
        }
    }

    fn free_state(&mut self) {
        if !self.state.is_null() {
            // SAFETY: from Box::into_raw in `create`; UCX no longer calls back.
            drop(unsafe { Box::from_raw(self.state) });
            self.state = std::ptr::null_mut();
        }
    }
}

impl Drop for EpInner {
    fn drop(&mut self) {
        let _ = self.close_raw(false, CLOSE_WAIT);
    }
}

/// UCX calls this (from progress) when the endpoint fails: peer gone, connection refused,
/// keepalive timeout. It only records the status; operations then fail with
/// [`UcxError::EndpointFailed`].
unsafe extern "C" fn ep_error_cb(arg: *mut c_void, _ep: sys::ucp_ep_h, status: sys::ucs_status_t) {
    // SAFETY: arg is the EpState box of this endpoint, alive until close completes.
    let state = &*(arg as *const EpState);
    let s = if status == sys::UCS_OK {
        sys::UCS_ERR_IO_ERROR
    } else {
        status
    };
    let _ = state
        .failure
        .compare_exchange(0, s, Ordering::AcqRel, Ordering::Acquire);
}

/// A connection to a peer worker (`ucp_ep_h`), created with peer error handling
/// (`UCP_ERR_HANDLING_MODE_PEER`) so that a dead peer surfaces as
/// [`UcxError::EndpointFailed`] instead of a hang. Cheap to clone; closed when the last clone,
/// remote key and request using it are gone: outstanding operations are flushed (at most
/// [`CLOSE_WAIT`]) and the endpoint is force-closed, which the peer sees as an endpoint
/// failure. [`Endpoint::close`] closes gracefully instead.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<EpInner>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("peer", &self.inner.peer)
            .field("failure", &self.failure())
            .finish()
    }
}

/// How an endpoint learns that its peer failed (`ucp_err_handling_mode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ErrorMode {
    /// `UCP_ERR_HANDLING_MODE_PEER`: a dead or unreachable peer fails the endpoint
    /// ([`UcxError::EndpointFailed`]) instead of hanging its operations, and endpoints can be
    /// force-closed. UCX then uses only transports that detect peer failure: in UCX 1.13
    /// through 1.22 that excludes the shared-memory transports (posix, sysv, cma), so two
    /// processes of one host talk over `tcp` (measured: UCX 1.13.1 and 1.22.0, `docs/ucx.md`).
    #[default]
    Peer,
    /// `UCP_ERR_HANDLING_MODE_NONE`: every transport is eligible (shared memory included), but
    /// a dead peer can leave operations pending: only this crate's time bounds end the wait
    /// ([`UcxError::Timeout`]). Endpoints are closed with a flush close.
    None,
}

/// Where an endpoint is created from.
enum Target<'a> {
    Sock(&'a CSockAddr),
    Address(&'a WorkerAddress),
    Conn(sys::ucp_conn_request_h),
}

impl Endpoint {
    fn create(
        worker: &Worker,
        target: Target<'_>,
        peer: Option<SocketAddr>,
        err_mode: ErrorMode,
    ) -> Result<Endpoint> {
        let state = Box::into_raw(Box::new(EpState {
            failure: AtomicI8::new(0),
        }));
        // SAFETY: zeroed params; every field flagged exists since UCX 1.13.
        let mut p: sys::ucp_ep_params_t = unsafe { std::mem::zeroed() };
        p.field_mask = (sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
            | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64;
        p.err_mode = match err_mode {
            ErrorMode::Peer => sys::UCP_ERR_HANDLING_MODE_PEER,
            ErrorMode::None => sys::UCP_ERR_HANDLING_MODE_NONE,
        };
        p.err_handler = sys::ucp_err_handler_t {
            cb: Some(ep_error_cb),
            arg: state.cast(),
        };
        match target {
            Target::Sock(sa) => {
                p.field_mask |=
                    (sys::UCP_EP_PARAM_FIELD_SOCK_ADDR | sys::UCP_EP_PARAM_FIELD_FLAGS) as u64;
                p.flags = sys::UCP_EP_PARAMS_FLAGS_CLIENT_SERVER;
                p.sockaddr = sa.as_ucs();
            }
            Target::Address(a) => {
                p.field_mask |= sys::UCP_EP_PARAM_FIELD_REMOTE_ADDRESS as u64;
                p.address = a.0.as_ptr().cast();
            }
            Target::Conn(c) => {
                p.field_mask |= sys::UCP_EP_PARAM_FIELD_CONN_REQUEST as u64;
                p.conn_request = c;
            }
        }
        let mut raw: sys::ucp_ep_h = std::ptr::null_mut();
        let st = {
            let _g = worker.guard();
            // SAFETY: live worker; params (and the address bytes they point to) valid for
            // the call; `state` outlives the endpoint.
            unsafe { worker.api().ucp_ep_create(worker.inner.raw, &p, &mut raw) }
        };
        if st != sys::UCS_OK {
            // SAFETY: UCX did not keep the callback argument.
            drop(unsafe { Box::from_raw(state) });
            return check("ucp_ep_create", st).map(|()| unreachable!());
        }
        Ok(Endpoint {
            inner: Arc::new(EpInner {
                worker: worker.clone(),
                raw,
                state,
                peer,
                err_mode,
                dirty: AtomicBool::new(false),
            }),
        })
    }

    /// Starts connecting to a listener at `addr` (client-server mode,
    /// `UCP_EP_PARAMS_FLAGS_CLIENT_SERVER`) and returns at once, like UCX: the connection
    /// completes once the listening side accepts it, while both workers progress. Operations
    /// posted meanwhile are queued. Use [`Endpoint::wait_connected`] to wait for it.
    ///
    /// Errors: `ucp_ep_create`'s status. A peer that is not listening shows up later, as
    /// [`UcxError::EndpointFailed`] from the first operation or from `wait_connected`.
    pub fn connect(worker: &Worker, addr: SocketAddr) -> Result<Endpoint> {
        Self::connect_with(worker, addr, ErrorMode::Peer)
    }

    /// As [`Endpoint::connect`], with the error handling mode given.
    pub fn connect_with(worker: &Worker, addr: SocketAddr, mode: ErrorMode) -> Result<Endpoint> {
        let sa = CSockAddr::new(&addr);
        Self::create(worker, Target::Sock(&sa), Some(addr), mode)
    }

    /// Waits, progressing this endpoint's worker, until the connection is usable (an endpoint
    /// flush completes) or `timeout` passes. The peer must accept and progress meanwhile.
    ///
    /// Errors: [`UcxError::EndpointFailed`] (nobody listens: `UCS_ERR_UNREACHABLE`, or
    /// `UCS_ERR_CONNECTION_RESET`/`UCS_ERR_NOT_CONNECTED` depending on the UCX version;
    /// rejected: `UCS_ERR_REJECTED`), [`UcxError::Timeout`] with op `connect`.
    pub fn wait_connected(&self, timeout: Duration) -> Result<()> {
        self.flush(timeout).map_err(|e| match e {
            UcxError::Timeout { timeout, .. } => UcxError::Timeout {
                op: "connect",
                timeout,
            },
            e => e,
        })
    }

    /// Creates an endpoint to a worker whose [`Worker::address`] was exchanged out of band.
    /// Returns at once; the first operation completes the connection.
    pub fn connect_address(worker: &Worker, addr: &WorkerAddress) -> Result<Endpoint> {
        Self::connect_address_with(worker, addr, ErrorMode::Peer)
    }

    /// As [`Endpoint::connect_address`], with the error handling mode given.
    pub fn connect_address_with(
        worker: &Worker,
        addr: &WorkerAddress,
        mode: ErrorMode,
    ) -> Result<Endpoint> {
        if addr.0.is_empty() {
            return Err(UcxError::InvalidArgument("empty worker address".into()));
        }
        Self::create(worker, Target::Address(addr), None, mode)
    }

    pub(crate) fn accept(
        worker: &Worker,
        conn: sys::ucp_conn_request_h,
        peer: Option<SocketAddr>,
        mode: ErrorMode,
    ) -> Result<Endpoint> {
        Self::create(worker, Target::Conn(conn), peer, mode)
    }

    /// The error handling mode the endpoint was created with.
    pub fn error_mode(&self) -> ErrorMode {
        self.inner.err_mode
    }

    pub(crate) fn raw(&self) -> sys::ucp_ep_h {
        self.inner.raw
    }

    /// The worker this endpoint belongs to.
    pub fn worker(&self) -> &Worker {
        &self.inner.worker
    }

    /// This endpoint's identity, as [`crate::AmMessage::reply_ep`] reports it.
    pub fn id(&self) -> EpId {
        EpId(self.inner.raw as usize)
    }

    /// The peer's socket address, when connected through one.
    pub fn peer(&self) -> Option<SocketAddr> {
        self.inner.peer
    }

    pub(crate) fn peer_name(&self) -> String {
        self.inner
            .peer
            .map_or_else(|| "?".to_string(), |a| a.to_string())
    }

    /// The status UCX reported through the error callback, once the endpoint failed.
    pub fn failure(&self) -> Option<Status> {
        self.inner.failure()
    }

    /// `Ok` while the endpoint is healthy, else [`UcxError::EndpointFailed`].
    pub fn ensure_ok(&self) -> Result<()> {
        match self.failure() {
            None => Ok(()),
            Some(status) => Err(UcxError::EndpointFailed {
                peer: self.peer_name(),
                status,
            }),
        }
    }

    fn pins(&self) -> Pins {
        Pins {
            ep: Some(self.clone()),
            ..Pins::default()
        }
    }

    /// Completes every operation posted on this endpoint (`ucp_ep_flush_nbx`): after it,
    /// puts are visible in the target's memory. Progresses up to `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        // Operations posted after the flush was posted are not covered by it.
        self.inner.dirty.store(false, Ordering::Release);
        let r = self.flush_nb().and_then(|r| r.wait(timeout));
        if r.is_err() {
            self.inner.dirty.store(true, Ordering::Release);
        }
        r
    }

    /// Posts an endpoint flush and returns its request.
    pub fn flush_nb(&self) -> Result<Request> {
        self.ensure_ok()?;
        let w = self.worker();
        let _g = w.guard();
        // SAFETY: zeroed params are valid (no callback: completion is polled).
        let p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        // SAFETY: live endpoint.
        let r = unsafe { w.api().ucp_ep_flush_nbx(self.inner.raw, &p) };
        Request::from_ptr(w.clone(), Some(self.pins()), "ucp_ep_flush_nbx", r)
    }

    /// Local memory must be registered with this endpoint's context.
    fn check_same_context(&self, mem: &MemHandle) -> Result<()> {
        if Arc::ptr_eq(&mem.inner.ctx.inner, &self.worker().context().inner) {
            Ok(())
        } else {
            Err(UcxError::InvalidArgument(
                "local memory is registered with another context".into(),
            ))
        }
    }

    fn rma(
        &self,
        get: bool,
        local: &MemHandle,
        local_off: usize,
        remote: &RemoteRegion,
        remote_off: u64,
        len: usize,
    ) -> Result<Request> {
        self.worker().context().require(Features::RMA, "RMA")?;
        if !Arc::ptr_eq(&remote.rkey.inner.ep.inner, &self.inner) {
            return Err(UcxError::InvalidArgument(
                "remote key was unpacked on another endpoint".into(),
            ));
        }
        self.check_same_context(local)?;
        let laddr = local.range(local_off, len)?;
        let raddr = remote.check(remote_off, len as u64)?;
        self.ensure_ok()?;
        let w = self.worker();
        let _g = w.guard();
        // SAFETY: zeroed params; MEMORY_TYPE and MEMH are known since UCX 1.13.
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_MEMORY_TYPE | sys::UCP_OP_ATTR_FIELD_MEMH;
        p.memory_type = local.mem_type().raw();
        p.memh = local.inner.raw;
        let (op, r) = if get {
            // SAFETY: local range is inside a live mapping pinned by the request; the remote
            // range was checked against the peer's region; key is live on this endpoint.
            ("ucp_get_nbx", unsafe {
                w.api().ucp_get_nbx(
                    self.inner.raw,
                    laddr.cast(),
                    len,
                    raddr,
                    remote.rkey.inner.raw,
                    &p,
                )
            })
        } else {
            // SAFETY: as above.
            ("ucp_put_nbx", unsafe {
                w.api().ucp_put_nbx(
                    self.inner.raw,
                    laddr.cast(),
                    len,
                    raddr,
                    remote.rkey.inner.raw,
                    &p,
                )
            })
        };
        self.inner.dirty.store(true, Ordering::Release);
        // An operation UCX finished at post (a small put copied out, the common case) touches
        // nothing afterwards: only a pending one pins what it uses. An error keeps the
        // endpoint, to name the peer.
        let pins = (!r.is_null()).then(|| Pins {
            mem: Some(local.clone()),
            rkey: Some(remote.rkey.clone()),
            ..self.pins()
        });
        Request::from_ptr(w.clone(), pins, op, r)
    }

    /// Writes `len` bytes from `local[local_off..]` to `remote[remote_off..]`
    /// (`ucp_put_nbx`). Both ranges are bounds-checked first. Completion of the request
    /// means the local buffer may be reused; visibility at the target needs
    /// [`Endpoint::flush`].
    ///
    /// Errors: [`UcxError::LocalOutOfBounds`], [`UcxError::RemoteOutOfBounds`],
    /// [`UcxError::EndpointFailed`], [`UcxError::InvalidArgument`] (key from another endpoint,
    /// memory from another context), [`UcxError::FeatureMissing`] without RMA.
    pub fn put(
        &self,
        local: &MemHandle,
        local_off: usize,
        remote: &RemoteRegion,
        remote_off: u64,
        len: usize,
    ) -> Result<Request> {
        self.rma(false, local, local_off, remote, remote_off, len)
    }

    /// Reads `len` bytes from `remote[remote_off..]` into `local[local_off..]`
    /// (`ucp_get_nbx`); the data is in place when the request completes. Errors as
    /// [`Endpoint::put`].
    pub fn get(
        &self,
        local: &MemHandle,
        local_off: usize,
        remote: &RemoteRegion,
        remote_off: u64,
        len: usize,
    ) -> Result<Request> {
        self.rma(true, local, local_off, remote, remote_off, len)
    }

    /// Sends an active message to `id` on the peer (`ucp_am_send_nbx`, eager protocol, reply
    /// endpoint attached). Header and payload are copied, so the slices may be reused at once.
    ///
    /// Errors: [`UcxError::MessageTooLarge`] beyond [`AM_MAX_MESSAGE`] bytes in all,
    /// [`UcxError::EndpointFailed`], [`UcxError::FeatureMissing`] without AM.
    pub fn am_send(&self, id: u16, header: &[u8], data: &[u8]) -> Result<Request> {
        self.am_check(header.len().saturating_add(data.len()))?;
        self.am_send_contig(id, header.into(), data.into())
    }

    /// What every active message needs: the AM feature, and at most [`AM_MAX_MESSAGE`] bytes.
    fn am_check(&self, total: usize) -> Result<()> {
        self.worker().context().require(Features::AM, "AM")?;
        if total > AM_MAX_MESSAGE {
            return Err(UcxError::MessageTooLarge {
                len: total,
                max: AM_MAX_MESSAGE,
            });
        }
        Ok(())
    }

    /// Posts an active message of one header and one contiguous payload, both checked.
    fn am_send_contig(&self, id: u16, h: Box<[u8]>, d: Box<[u8]>) -> Result<Request> {
        let header = (h.as_ptr(), h.len());
        let (data, len) = (d.as_ptr().cast(), d.len());
        let pins = Pins {
            bytes: vec![h, d],
            ..self.pins()
        };
        // SAFETY: both boxes move into the request's pins; their heap bytes stay where they are.
        unsafe { self.am_post(id, header, data, len, false, pins) }
    }

    /// Posts `ucp_am_send_nbx` (eager, reply endpoint attached) of the header `(ptr, len)` and
    /// `count` payload elements at `data`: bytes, or with `iov`, the entries of that IOV array.
    /// `pins` is what the request keeps alive until it completes.
    ///
    /// # Safety
    /// The header, `data` and what IOV entries point to are held by `pins`.
    unsafe fn am_post(
        &self,
        id: u16,
        header: (*const u8, usize),
        data: *const c_void,
        count: usize,
        iov: bool,
        pins: Pins,
    ) -> Result<Request> {
        self.ensure_ok()?;
        let w = self.worker();
        let _g = w.guard();
        // SAFETY: zeroed params; FLAGS and DATATYPE known since 1.10.
        let mut prm: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        prm.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = sys::UCP_AM_SEND_FLAG_REPLY | sys::UCP_AM_SEND_FLAG_EAGER;
        if iov {
            prm.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_DATATYPE;
            prm.datatype = sys::UCP_DATATYPE_IOV as sys::ucp_datatype_t;
        }
        // SAFETY: live endpoint; what the operation reads is held by `pins` (the caller's
        // contract), which the request keeps until it completes.
        let r = unsafe {
            w.api().ucp_am_send_nbx(
                self.inner.raw,
                id as u32,
                header.0.cast(),
                header.1,
                data,
                count,
                &prm,
            )
        };
        self.inner.dirty.store(true, Ordering::Release);
        Request::from_ptr(w.clone(), Some(pins), "ucp_am_send_nbx", r)
    }

    /// Sends an active message to `id` whose payload is `head` followed by the bytes of each
    /// of `parts`, from their registered host memory (`ucp_am_send_nbx`, eager protocol,
    /// reply endpoint attached). Parts of at least [`AM_IN_PLACE_MIN`] bytes are read in place
    /// (UCX's IOV datatype: UCX packs them into its send buffers or sends them zero-copy, and
    /// no staging buffer is allocated per message); shorter ones are copied into runs between
    /// them, since UCX's IOV costs per entry. A message of at most [`AM_GATHER_COPY_MAX`] bytes
    /// is copied whole and sent as [`Endpoint::am_send`] sends, which lets UCX take its short
    /// protocol (often finished at post, with no request). The receiver sees one contiguous
    /// payload either way.
    ///
    /// The parts' bytes must not change until the request completes (as a put's source); the
    /// request holds their mappings and `head` until then.
    ///
    /// Errors: [`UcxError::MessageTooLarge`] beyond [`AM_MAX_MESSAGE`] bytes in all,
    /// [`UcxError::LocalOutOfBounds`] for a part outside its mapping,
    /// [`UcxError::InvalidArgument`] for a part in GPU memory or registered with another
    /// context, [`UcxError::EndpointFailed`], [`UcxError::FeatureMissing`] without AM.
    pub fn am_send_parts(&self, id: u16, head: Vec<u8>, parts: &[AmPart]) -> Result<Request> {
        let total = parts
            .iter()
            .fold(head.len(), |t, p| t.saturating_add(p.len));
        self.am_check(total)?;
        let mut checked = Vec::with_capacity(parts.len());
        for p in parts {
            if p.mem.mem_type() != MemType::Host {
                return Err(UcxError::InvalidArgument(format!(
                    "an active message's parts must be host memory, not {}",
                    p.mem.mem_type()
                )));
            }
            self.check_same_context(&p.mem)?;
            checked.push(p.mem.range(p.offset, p.len)?);
        }
        // The payload as runs of copied bytes (the head, small parts) and large parts in place.
        let mut copied: Vec<Vec<u8>> = vec![head];
        let mut segs: Vec<Seg> = vec![Seg::Copied(0)];
        let mut mems: Vec<MemHandle> = Vec::new();
        for (p, addr) in parts.iter().zip(checked) {
            if total > AM_GATHER_COPY_MAX && p.len >= AM_IN_PLACE_MIN {
                segs.push(Seg::InPlace(addr, p.len));
                if !mems
                    .last()
                    .is_some_and(|m| Arc::ptr_eq(&m.inner, &p.mem.inner))
                {
                    mems.push(p.mem.clone());
                }
                continue;
            }
            if !matches!(segs.last(), Some(Seg::Copied(_))) {
                segs.push(Seg::Copied(copied.len()));
                copied.push(Vec::new());
            }
            let run = copied.last_mut().expect("a copied run was just ensured");
            run.reserve(p.len);
            // SAFETY: inside the part's live mapping (checked above); read without forming a
            // reference, as a peer may write the same memory meanwhile (as for a put); `p.len`
            // bytes are reserved past the run's length and initialised by the copy.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    addr as *const u8,
                    run.as_mut_ptr().add(run.len()),
                    p.len,
                );
                run.set_len(run.len() + p.len);
            }
        }
        if segs.len() == 1 {
            let d = copied.pop().expect("the head's run").into_boxed_slice();
            return self.am_send_contig(id, Box::default(), d);
        }
        let copied: Vec<Box<[u8]>> = copied.into_iter().map(Vec::into_boxed_slice).collect();
        let iov: Vec<sys::ucp_dt_iov_t> = segs
            .iter()
            // An empty run (no head) is left out rather than handed over as a dangling pointer.
            .filter(|s| !matches!(**s, Seg::Copied(i) if copied[i].is_empty()))
            .map(|s| match *s {
                Seg::Copied(i) => sys::ucp_dt_iov_t {
                    buffer: copied[i].as_ptr() as *mut c_void,
                    length: copied[i].len(),
                },
                Seg::InPlace(addr, len) => sys::ucp_dt_iov_t {
                    buffer: addr.cast(),
                    length: len,
                },
            })
            .collect();
        let iov = iov.into_boxed_slice();
        let (data, count) = (iov.as_ptr().cast(), iov.len());
        let pins = Pins {
            mems,
            bytes: copied,
            iov: Some(IovPin(iov)),
            ..self.pins()
        };
        // SAFETY: the iov array, the copied runs and every mapping an entry points into
        // (bounds checked above) move into the request's pins.
        unsafe { self.am_post(id, (std::ptr::null(), 0), data, count, true, pins) }
    }

    /// UCX's description of the endpoint's configuration (`ucp_ep_print_info`): lanes,
    /// transports, devices and protocol thresholds.
    pub fn print_info(&self) -> Result<String> {
        self.ensure_ok()?;
        let w = self.worker();
        let _g = w.guard();
        // SAFETY: live endpoint; writes to the memstream only.
        unsafe { capture(|f| w.api().ucp_ep_print_info(self.inner.raw, f)) }
    }

    /// The transports and devices this endpoint moves data with. UCX >= 1.14: `ucp_ep_query`
    /// with `UCP_EP_ATTR_FIELD_TRANSPORTS` (lanes without usage); UCX 1.13: the lane lines of
    /// [`Endpoint::print_info`], with their usage (`am`, `rma_bw#0`, ...). The
    /// connection-manager lane of a client-server endpoint is left out. Wait until connected
    /// ([`Endpoint::wait_connected`]): lanes are chosen during wire-up.
    pub fn transports(&self) -> Result<EpTransports> {
        if self.worker().context().ucx().has_ep_transport_query() {
            self.query_transports()
        } else {
            Ok(EpTransports {
                source: TransportSource::PrintInfo,
                lanes: parse_lanes(&self.print_info()?),
            })
        }
    }

    fn query_transports(&self) -> Result<EpTransports> {
        self.ensure_ok()?;
        const MAX: usize = 64;
        let mut entries = [crate::sys_ext::ucp_transport_entry_t {
            transport_name: std::ptr::null(),
            device_name: std::ptr::null(),
        }; MAX];
        // SAFETY: zeroed attr of the 1.14+ layout; only TRANSPORTS is requested, and the
        // caller checked the loaded UCX is >= 1.14.
        let mut attr: crate::sys_ext::ucp_ep_attr_v114 = unsafe { std::mem::zeroed() };
        attr.field_mask = crate::sys_ext::UCP_EP_ATTR_FIELD_TRANSPORTS;
        attr.transports.entries = entries.as_mut_ptr();
        attr.transports.num_entries = MAX as u32;
        attr.transports.entry_size = std::mem::size_of::<crate::sys_ext::ucp_transport_entry_t>();
        let w = self.worker();
        let _g = w.guard();
        // SAFETY: live endpoint; attr is the 1.14 layout; entries has MAX slots.
        check("ucp_ep_query", unsafe {
            w.api().ucp_ep_query(
                self.inner.raw,
                (&mut attr as *mut crate::sys_ext::ucp_ep_attr_v114).cast(),
            )
        })?;
        let n = (attr.transports.num_entries as usize).min(MAX);
        let lanes = entries[..n]
            .iter()
            .map(|e| Lane {
                // SAFETY: strings valid until the endpoint closes; copied now.
                transport: unsafe { crate::loader::cstr(e.transport_name) },
                device: unsafe { crate::loader::cstr(e.device_name) },
                usage: Vec::new(),
            })
            // The connection-manager lane of a client-server endpoint (e.g. `tcp` with no
            // device in UCX 1.22) carries no data; print_info parsing skips it too.
            .filter(|l| !l.device.is_empty())
            .collect();
        Ok(EpTransports {
            source: TransportSource::EpQuery,
            lanes,
        })
    }

    /// Which transports carry put/get of `mem` memory on this endpoint, as far as UCX tells.
    ///
    /// Host memory: the lanes `ucp_ep_print_info` marks for RMA (`rma`, `rma_bw`), or, when
    /// there are none (as over `tcp`), the active-message lanes that UCX emulates put/get with.
    /// Other memory types: the context must support the type; UCX picks their protocol per
    /// operation and reports it nowhere in its API, so the answer is [`RmaBasis::Unknown`]
    /// with the endpoint's lanes.
    ///
    /// Errors: [`UcxError::MemTypeUnsupported`] when the context cannot move `mem`.
    pub fn rma_transports(&self, mem: MemType) -> Result<RmaTransports> {
        let ctx = self.worker().context();
        if !ctx.supports(mem)? {
            let have: Vec<String> = ctx.memory_types()?.iter().map(|m| m.to_string()).collect();
            return Err(UcxError::MemTypeUnsupported(mem, have.join(",")));
        }
        let lanes = parse_lanes(&self.print_info()?);
        if mem != MemType::Host {
            return Ok(RmaTransports {
                mem_type: mem,
                basis: RmaBasis::Unknown(format!(
                    "UCX selects the protocol for {mem} memory per operation and does not report it"
                )),
                lanes,
            });
        }
        let has = |l: &Lane, p: &str| {
            l.usage
                .iter()
                .any(|u| u == p || u.starts_with(&format!("{p}#")))
        };
        let rma: Vec<Lane> = lanes
            .iter()
            .filter(|l| has(l, "rma") || has(l, "rma_bw"))
            .cloned()
            .collect();
        if !rma.is_empty() {
            return Ok(RmaTransports {
                mem_type: mem,
                basis: RmaBasis::RmaLanes,
                lanes: rma,
            });
        }
        let am: Vec<Lane> = lanes
            .iter()
            .filter(|l| has(l, "am") || has(l, "am_bw"))
            .cloned()
            .collect();
        Ok(RmaTransports {
            mem_type: mem,
            basis: RmaBasis::AmEmulation,
            lanes: am,
        })
    }

    /// Closes the endpoint gracefully now (flush close, `ucp_ep_close_nbx` without flags;
    /// force close if it failed), waiting up to `timeout`, when this is the last handle to it.
    /// The peer's worker must progress meanwhile. Otherwise (clones, keys or requests still
    /// hold it) the endpoint closes when the last of them is dropped, and this returns `Ok`.
    ///
    /// Errors: [`UcxError::Timeout`], or the close status.
    pub fn close(self, timeout: Duration) -> Result<()> {
        match Arc::try_unwrap(self.inner) {
            Ok(mut inner) => {
                let r = inner.close_raw(true, timeout);
                drop(inner);
                r
            }
            Err(_) => Ok(()),
        }
    }
}

/// One lane of an endpoint: a transport on a device, and what UCX uses it for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    /// Transport (`tcp`, `posix`, `cma`, `self`, `rc_mlx5`, `cuda_ipc`, ...).
    pub transport: String,
    /// Device (`lo`, `memory`, `mlx5_0:1`, ...).
    pub device: String,
    /// Uses as `ucp_ep_print_info` lists them (`am`, `am_bw#0`, `rma_bw#0`, `wireup`,
    /// `rkey_ptr`); empty when the lanes came from `ucp_ep_query`.
    pub usage: Vec<String>,
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.transport, self.device)
    }
}

/// Where [`EpTransports`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportSource {
    /// `ucp_ep_query(UCP_EP_ATTR_FIELD_TRANSPORTS)` (UCX >= 1.14).
    EpQuery,
    /// Parsed from `ucp_ep_print_info` (UCX 1.13).
    PrintInfo,
}

/// The transports of an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpTransports {
    /// How they were found.
    pub source: TransportSource,
    /// One entry per lane.
    pub lanes: Vec<Lane>,
}

/// How [`RmaTransports::lanes`] were decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RmaBasis {
    /// Lanes that UCX assigned to RMA.
    RmaLanes,
    /// No RMA lane: UCX emulates put/get with active messages on these lanes (e.g. `tcp`);
    /// the target's worker must progress for them to complete.
    AmEmulation,
    /// UCX does not say; the lanes are all of the endpoint's.
    Unknown(String),
}

/// Answer of [`Endpoint::rma_transports`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RmaTransports {
    /// The memory type asked about.
    pub mem_type: MemType,
    /// How the lanes were decided.
    pub basis: RmaBasis,
    /// The lanes.
    pub lanes: Vec<Lane>,
}

/// Parses `lane[N]:  IDX:tl/dev.PATH md[M] -> md[M]/tl/sysdev[S] usage...` lines of
/// `ucp_ep_print_info` (UCX 1.13 through 1.22). Lanes that `put[N]:`/`get[N]:` threshold
/// lines refer to (UCX 1.13's short/bcopy RMA protocols, by lane index) get usage `rma`.
pub(crate) fn parse_lanes(text: &str) -> Vec<Lane> {
    let mut lanes: Vec<(usize, Lane)> = Vec::new();
    let mut rma_idx: Vec<usize> = Vec::new();
    for line in text.lines() {
        let line = line.trim_start_matches('#').trim();
        let index_of = |prefix: &str| -> Option<(usize, &str)> {
            let rest = line.strip_prefix(prefix)?;
            let (n, rest) = rest.split_once("]:")?;
            Some((n.trim().parse().ok()?, rest))
        };
        if let Some((i, _)) = index_of("put[").or_else(|| index_of("get[")) {
            rma_idx.push(i);
            continue;
        }
        let Some((idx, rest)) = index_of("lane[") else {
            continue;
        };
        let mut toks = rest.split_whitespace();
        let Some(rsc) = toks.next() else { continue };
        let name = rsc.split_once(':').map_or(rsc, |(_, n)| n);
        let Some((tl, dev)) = name.split_once('/') else {
            continue; // e.g. "lane[0]: cm rdmacm": the connection manager, not a transport
        };
        // Drop the ".<path index>" suffix UCX appends to the device.
        let dev = match dev.rsplit_once('.') {
            Some((d, i)) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => d,
            _ => dev,
        };
        let after_arrow: Vec<&str> = rest
            .split_once("->")
            .map(|(_, a)| a.split_whitespace().skip(1).collect())
            .unwrap_or_default();
        let mut usage = Vec::new();
        let mut it = after_arrow.into_iter();
        while let Some(t) = it.next() {
            if t == "seg" {
                it.next(); // segment size
                continue;
            }
            usage.push(t.to_string());
        }
        lanes.push((
            idx,
            Lane {
                transport: tl.to_string(),
                device: dev.to_string(),
                usage,
            },
        ));
    }
    for (idx, lane) in &mut lanes {
        if rma_idx.contains(idx) && !lane.usage.iter().any(|u| u == "rma") {
            lane.usage.push("rma".into());
        }
    }
    lanes.into_iter().map(|(_, l)| l).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lanes_of_1_13_and_1_22() {
        // As printed by UCX 1.13.1 (tcp; shared memory) and 1.22.0 (shared memory).
        let text = "#\n# UCP endpoint \n#\n#               peer: <no debug data>\n\
            #                 lane[0]:  0:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] am am_bw#0 wireup\n\
            #                 lane[1]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255]\n\
            #                 lane[2]:  0:self/memory0.0 md[0]          -> md[0]/self/sysdev[255] am am_bw#0\n\
            #                 lane[3]:  5:cma/memory.0 md[4]            -> md[4]/cma/sysdev[255] seg 4294967295 rma_bw#0\n\
            #                 lane[4]: cm rdmacm\n\
            #                  put[1]: 0..<short>..4294967296..<bcopy>..(inf)\n\
            #                  get[1]: 0..<bcopy>..(inf)\n\
            #                  rma_bw: mds #\n";
        let l = parse_lanes(text);
        assert_eq!(l.len(), 4);
        assert_eq!(
            (l[0].transport.as_str(), l[0].device.as_str()),
            ("tcp", "lo")
        );
        assert_eq!(l[0].usage, ["am", "am_bw#0", "wireup"]);
        assert_eq!(l[1].to_string(), "sysv/memory");
        assert_eq!(l[1].usage, ["rma"]);
        assert_eq!(l[2].device, "memory0");
        assert_eq!(l[3].usage, ["rma_bw#0"]);
    }
}
