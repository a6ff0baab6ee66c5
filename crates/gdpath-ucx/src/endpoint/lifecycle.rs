//! Endpoint lifecycle: creation (connect, accept), close, and the failure status UCX's error
//! callback records.

use std::net::SocketAddr;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, AtomicI8, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Endpoint;
use crate::error::{check, ptr_is_err, Result, Status, UcxError};
use crate::sockaddr::CSockAddr;
use crate::sys;
use crate::worker::{Worker, WorkerAddress};

/// How long dropping an endpoint flushes its outstanding operations before force-closing it.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

/// Shared with UCX's error callback: 0 while healthy, else the failure status.
struct EpState {
    failure: AtomicI8,
}

pub(crate) struct EpInner {
    pub(super) worker: Worker,
    pub(super) raw: sys::ucp_ep_h,
    /// Box handed to UCX as the error-callback argument; freed after the close completes.
    state: *mut EpState,
    pub(super) peer: Option<SocketAddr>,
    pub(super) err_mode: ErrorMode,
    /// Set when an operation is posted, cleared when a flush completes: a clean endpoint is
    /// force-closed at drop without flushing (which would wait on a peer that may be gone).
    pub(super) dirty: AtomicBool,
    /// Nothing posted needs to reach the peer any more ([`Endpoint::retire`]): the close at
    /// drop neither flushes nor waits.
    retired: AtomicBool,
}

// SAFETY: UCX calls on `raw` happen under the worker lock; `state` is only read atomically.
unsafe impl Send for EpInner {}
unsafe impl Sync for EpInner {}

impl EpInner {
    pub(super) fn failure(&self) -> Option<Status> {
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

    /// Starts closing the UCP endpoint without waiting: force close with peer error handling
    /// (local, the peer need not answer), a flush close without (the peer's worker finishes
    /// it); the worker's progress (or its drop) finishes what UCX does not finish at once.
    fn close_retired(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let worker = self.worker.clone();
        let api = worker.api();
        let _g = worker.guard();
        // SAFETY: zeroed params; FLAGS known since 1.10.
        let mut p: sys::ucp_request_param_t = unsafe { std::mem::zeroed() };
        if self.err_mode == ErrorMode::Peer {
            p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
            p.flags = sys::UCP_EP_CLOSE_FLAG_FORCE;
        }
        // SAFETY: live endpoint; after this call it must not be used again.
        let req = unsafe { api.ucp_ep_close_nbx(self.raw, &p) };
        self.raw = std::ptr::null_mut();
        if req.is_null() || ptr_is_err(req) {
            // Done already (or refused, and then UCX keeps nothing of it).
            self.free_state();
            return;
        }
        // A raw pointer is not `Send`; the box is freed once, by whoever runs `release`.
        let state = std::mem::replace(&mut self.state, std::ptr::null_mut()) as usize;
        worker.inner.defer_close(crate::worker::PendingClose {
            req,
            release: Box::new(move || {
                // SAFETY: from Box::into_raw in `create`; UCX finished the close.
                drop(unsafe { Box::from_raw(state as *mut EpState) });
            }),
        });
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
        if self.retired.load(Ordering::Acquire) {
            self.close_retired();
        } else {
            let _ = self.close_raw(false, CLOSE_WAIT);
        }
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
                retired: AtomicBool::new(false),
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

    /// Declares that nothing posted on this endpoint needs to reach the peer any more (the
    /// connection over it is over: said goodbye, or failed): when its last handle goes, it is
    /// closed without a flush and without waiting for the peer (force close with peer error
    /// handling; a flush close without it, which the peer's progress finishes), and the
    /// worker's later [`Worker::progress`] calls, or its drop, finish the close. The drop of a
    /// retired endpoint thus never blocks on a peer that does not progress (one that went
    /// quiet, or an idle process that still holds a remote key made on it), where a plain drop
    /// flushes for up to [`CLOSE_WAIT`].
    pub fn retire(&self) {
        self.inner.retired.store(true, Ordering::Release);
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
