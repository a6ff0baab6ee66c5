//! Endpoint lifecycle: creation (connect, accept), close, and the failure status UCX's error
//! callback records.

use std::net::SocketAddr;
use std::os::raw::c_void;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

use super::Endpoint;
use crate::call::{self, Posted};
use crate::error::{Result, Status, UcxError};
use crate::peer::Peer;
use crate::sockaddr::CSockAddr;
use crate::sys;
use crate::worker::{PendingClose, Worker, WorkerAddress};

/// How long dropping an endpoint flushes its outstanding operations before force-closing it.
pub const CLOSE_WAIT: Duration = Duration::from_secs(5);

pub(crate) struct EpInner {
    pub(super) worker: Worker,
    pub(super) raw: sys::ucp_ep_h,
    /// The peer, whose failure UCX's error callback records.
    pub(super) peer: Arc<Peer>,
    /// The reference to `peer` handed to UCX as the error-callback argument; given back after
    /// the close completes (NULL then).
    cb_arg: *const Peer,
    pub(super) err_mode: ErrorMode,
    /// Set when an operation is posted, cleared when a flush completes: a clean endpoint is
    /// force-closed at drop without flushing (which would wait on a peer that may be gone).
    pub(super) dirty: AtomicBool,
    /// Nothing posted needs to reach the peer any more ([`Endpoint::retire`]): the close at
    /// drop neither flushes nor waits.
    retired: AtomicBool,
}

// SAFETY: UCX calls on `raw` happen under the worker lock; the peer's state is atomic.
unsafe impl Send for EpInner {}
// SAFETY: as for Send.
unsafe impl Sync for EpInner {}

impl EpInner {
    /// Polls a close or flush until it finishes or `timeout` passes, and releases its request.
    /// Returns the operation's final status (its error at post included), or `None` on
    /// timeout (UCX then frees the request on completion).
    fn poll_raw(&self, posted: Posted, timeout: Duration) -> Option<Status> {
        let req = posted.req;
        if req.is_null() {
            return Some(Status(sys::UCS_OK));
        }
        let api = self.worker.api();
        let mut status = Status(sys::UCS_INPROGRESS);
        let done = self.worker.progress_until(timeout, || {
            let _g = self.worker.guard();
            // SAFETY: live request of this worker, serialised.
            status = unsafe { call::request_check_status(api, req) };
            status.0 != sys::UCS_INPROGRESS
        });
        let _g = self.worker.guard();
        // SAFETY: released once; if still pending, UCX frees it on completion.
        unsafe { call::request_free(api, req) };
        done.then_some(status)
    }

    /// Closes the UCP endpoint and waits up to `timeout`.
    ///
    /// `graceful`: flush close (`ucp_ep_close_nbx` without flags), which completes only when
    /// the peer's worker progresses too. Otherwise: flush outstanding operations for at most
    /// `timeout`, then force close (`UCP_EP_CLOSE_FLAG_FORCE`, allowed because every endpoint
    /// uses peer error handling), which does not wait for the peer. A failed endpoint is
    /// always force-closed. If UCX does not finish, the error callback's reference to the peer
    /// is leaked (never given back while UCX may call back).
    fn close_raw(&mut self, graceful: bool, timeout: Duration) -> Result<()> {
        if self.raw.is_null() {
            return Ok(());
        }
        let start = Instant::now();
        let api = self.worker.api();
        // Force close is only defined with peer error handling.
        let failed = self.peer.failure().is_some();
        let force = self.err_mode == ErrorMode::Peer && (!graceful || failed);
        if force && !failed && self.dirty.load(Ordering::Acquire) {
            let flush = {
                let _g = self.worker.guard();
                // SAFETY: live endpoint, serialised.
                unsafe { call::ep_flush_nbx(api, self.raw) }
            };
            let flushed = flush.is_ok_and(|f| self.poll_raw(f, timeout).is_some_and(Status::is_ok));
            if !flushed {
                tracing::debug!(peer = ?self.peer.addr(), "flush before force close did not complete");
            }
        }
        let flags = if force {
            sys::UCP_EP_CLOSE_FLAG_FORCE
        } else {
            0
        };
        let close = {
            let _g = self.worker.guard();
            // SAFETY: live endpoint, serialised; it is not used after this call; a force
            // close only with peer error handling.
            unsafe { call::ep_close_nbx(api, self.raw, flags) }
        };
        self.raw = std::ptr::null_mut();
        let (op, status) = match close {
            Ok(c) => (
                c.op,
                self.poll_raw(c, timeout.saturating_sub(start.elapsed())),
            ),
            Err(UcxError::Status { op, status }) => (op, Some(status)),
            // The call layer fails a post with a status only; anything else leaves the
            // callback's reference where it is.
            Err(e) => return Err(e),
        };
        let Some(st) = status else {
            tracing::warn!(peer = ?self.peer.addr(), "endpoint close did not finish within {timeout:?}");
            return Err(UcxError::Timeout { op, timeout });
        };
        self.release_cb_arg();
        if st.is_ok() || st.0 == sys::UCS_ERR_CANCELED || st.is_peer_failure() {
            Ok(())
        } else {
            Err(UcxError::Status { op, status: st })
        }
    }

    /// Starts closing the UCP endpoint without waiting: force close with peer error handling
    /// (local, the peer need not answer), a flush close without (the peer's worker finishes
    /// it); the worker's progress (or its drop) finishes what UCX does not finish at once, and
    /// only then gives back the error callback's reference to the peer.
    fn close_retired(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let worker = self.worker.clone();
        let _g = worker.guard();
        let flags = if self.err_mode == ErrorMode::Peer {
            sys::UCP_EP_CLOSE_FLAG_FORCE
        } else {
            0
        };
        // SAFETY: live endpoint, serialised; it is not used after this call; a force close
        // only with peer error handling.
        let close = unsafe { call::ep_close_nbx(worker.api(), self.raw, flags) };
        self.raw = std::ptr::null_mut();
        match close {
            Ok(Posted { req, .. }) if !req.is_null() => {
                // UCX may still call back with `cb_arg` until the close ends: the reference
                // it stands for moves into the pending close, which drops it after that.
                let cb_arg = std::mem::replace(&mut self.cb_arg, std::ptr::null());
                // SAFETY: from Arc::into_raw in `create`, taken back once (NULL after).
                let peer = (!cb_arg.is_null()).then(|| unsafe { Arc::from_raw(cb_arg) });
                worker.inner.defer_close(PendingClose {
                    req,
                    release: Box::new(move || drop(peer)),
                });
            }
            // Done at post, or refused (UCX then keeps nothing of the endpoint).
            Ok(_) | Err(UcxError::Status { .. }) => self.release_cb_arg(),
            // The call layer fails a post with a status only; anything else leaves the
            // callback's reference where it is.
            Err(_) => {}
        }
    }

    /// Gives back the error callback's reference to the peer, once UCX no longer calls back.
    fn release_cb_arg(&mut self) {
        if !self.cb_arg.is_null() {
            // SAFETY: from Arc::into_raw in `create`, given back once; UCX no longer calls back.
            drop(unsafe { Arc::from_raw(self.cb_arg) });
            self.cb_arg = std::ptr::null();
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
    // SAFETY: arg is this endpoint's reference to its peer, given back only after the close
    // completes.
    let peer = unsafe { &*(arg as *const Peer) };
    peer.record_failure(status);
}

/// How an endpoint learns that its peer failed (`ucp_err_handling_mode_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Default)]
pub enum ErrorMode {
    /// `UCP_ERR_HANDLING_MODE_PEER`: a dead or unreachable peer fails the endpoint
    /// ([`UcxError::EndpointFailed`]) instead of hanging its operations, and endpoints can be
    /// force-closed. UCX then uses only transports that detect peer failure: in UCX 1.13
    /// through 1.22 that excludes the shared-memory transports (posix, sysv, cma), so two
    /// processes of one host talk over `tcp` (`docs/ucx.md`, "Errors and peers that die").
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
        let peer = Arc::new(Peer::new(peer));
        let cb_arg = Arc::into_raw(peer.clone());
        let mut p: sys::ucp_ep_params_t = call::unset();
        p.field_mask = (sys::UCP_EP_PARAM_FIELD_ERR_HANDLING_MODE
            | sys::UCP_EP_PARAM_FIELD_ERR_HANDLER) as u64;
        p.err_mode = match err_mode {
            ErrorMode::Peer => sys::UCP_ERR_HANDLING_MODE_PEER,
            ErrorMode::None => sys::UCP_ERR_HANDLING_MODE_NONE,
        };
        p.err_handler = sys::ucp_err_handler_t {
            cb: Some(ep_error_cb),
            arg: cb_arg.cast_mut().cast(),
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
        let created = {
            let _g = worker.guard();
            // SAFETY: live worker, serialised; the flagged fields exist since UCX 1.13; params
            // (and the address bytes they point to) are valid for the call; `cb_arg` outlives
            // the endpoint.
            unsafe { call::ep_create(worker.api(), worker.inner.raw, &p) }
        };
        let raw = match created {
            Ok(raw) => raw,
            Err(e) => {
                // SAFETY: UCX did not keep the callback argument.
                drop(unsafe { Arc::from_raw(cb_arg) });
                return Err(e);
            }
        };
        Ok(Endpoint {
            inner: Arc::new(EpInner {
                worker: worker.clone(),
                raw,
                peer,
                cb_arg,
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
