//! A listener on a socket address that turns incoming connection requests into endpoints.

use std::collections::VecDeque;
use std::fmt;
use std::net::SocketAddr;
use std::os::raw::c_void;
use std::sync::Mutex;
use std::time::Duration;

use crate::call;
use crate::endpoint::{Endpoint, ErrorMode};
use crate::error::{Result, UcxError};
use crate::sockaddr::{from_storage, CSockAddr};
use crate::sync::lock;
use crate::sys;
use crate::worker::Worker;

/// Connection requests queued by UCX's callback until accepted (raw `ucp_conn_request_h`).
type ConnQueue = Mutex<VecDeque<usize>>;

/// A UCP listener (`ucp_listener_h`) bound to a socket address. Connection requests are
/// queued while the worker progresses; [`Listener::accept`] turns one into an [`Endpoint`].
/// Dropping the listener rejects requests not yet accepted.
pub struct Listener {
    worker: Worker,
    raw: sys::ucp_listener_h,
    queue: *mut ConnQueue,
    mode: ErrorMode,
}

// SAFETY: UCX calls on `raw` happen under the worker lock; the queue is a Mutex.
unsafe impl Send for Listener {}
// SAFETY: as for Send.
unsafe impl Sync for Listener {}

impl fmt::Debug for Listener {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Listener")
            .field("addr", &self.local_addr().ok())
            .finish()
    }
}

unsafe extern "C" fn conn_cb(conn: sys::ucp_conn_request_h, arg: *mut c_void) {
    // SAFETY: arg is this listener's queue, alive until after ucp_listener_destroy.
    let q = unsafe { &*(arg as *const ConnQueue) };
    lock(q).push_back(conn as usize);
}

impl Listener {
    /// Listens on `addr` (port 0 picks a free port; see [`Listener::local_addr`]).
    /// Only bind loopback or addresses you own.
    ///
    /// Errors: [`UcxError::Status`] from `ucp_listener_create` (e.g. `UCS_ERR_BUSY` when the
    /// port is taken, `UCS_ERR_UNSUPPORTED` without a sockaddr-capable transport).
    pub fn bind(worker: &Worker, addr: SocketAddr) -> Result<Listener> {
        Self::bind_with(worker, addr, ErrorMode::Peer)
    }

    /// As [`Listener::bind`]; accepted endpoints use error handling `mode`.
    pub fn bind_with(worker: &Worker, addr: SocketAddr, mode: ErrorMode) -> Result<Listener> {
        let queue: *mut ConnQueue = Box::into_raw(Box::new(Mutex::new(VecDeque::new())));
        let sa = CSockAddr::new(&addr);
        let mut p: sys::ucp_listener_params_t = call::unset();
        p.field_mask = (sys::UCP_LISTENER_PARAM_FIELD_SOCK_ADDR
            | sys::UCP_LISTENER_PARAM_FIELD_CONN_HANDLER) as u64;
        p.sockaddr = sa.as_ucs();
        p.conn_handler = sys::ucp_listener_conn_handler_t {
            cb: Some(conn_cb),
            arg: queue.cast(),
        };
        let created = {
            let _g = worker.guard();
            // SAFETY: live worker, serialised; the flagged fields exist since UCX 1.10; the
            // socket address lives through the call and the queue outlives the listener.
            unsafe { call::listener_create(worker.api(), worker.inner.raw, &p) }
        };
        let raw = match created {
            Ok(raw) => raw,
            Err(e) => {
                // SAFETY: UCX did not keep the queue.
                drop(unsafe { Box::from_raw(queue) });
                return Err(e);
            }
        };
        Ok(Listener {
            worker: worker.clone(),
            raw,
            queue,
            mode,
        })
    }

    /// The bound address, with the port UCX chose.
    pub fn local_addr(&self) -> Result<SocketAddr> {
        let attr = {
            let _g = self.worker.guard();
            // SAFETY: live listener, serialised; SOCKADDR exists since UCX 1.10.
            unsafe {
                call::listener_query(
                    self.worker.api(),
                    self.raw,
                    sys::UCP_LISTENER_ATTR_FIELD_SOCKADDR as u64,
                )
            }?
        };
        // SAFETY: UCX filled a sockaddr_storage (same layout as libc's).
        unsafe { from_storage((&attr.sockaddr as *const sys::sockaddr_storage).cast()) }
            .ok_or_else(|| UcxError::InvalidArgument("listener address family".into()))
    }

    fn pop(&self) -> Option<sys::ucp_conn_request_h> {
        // SAFETY: queue alive while self is.
        let q = unsafe { &*self.queue };
        lock(q).pop_front().map(|c| c as sys::ucp_conn_request_h)
    }

    /// Accepts a queued connection request without progressing; `Ok(None)` if none.
    pub fn try_accept(&self) -> Result<Option<Endpoint>> {
        let Some(conn) = self.pop() else {
            return Ok(None);
        };
        let queried = {
            let _g = self.worker.guard();
            // SAFETY: a live, unconsumed connection request, serialised; CLIENT_ADDR exists
            // since UCX 1.10.
            unsafe {
                call::conn_request_query(
                    self.worker.api(),
                    conn,
                    sys::UCP_CONN_REQUEST_ATTR_FIELD_CLIENT_ADDR as u64,
                )
            }
        };
        // A peer whose address UCX cannot tell is still accepted, as `?`.
        let peer = queried.ok().and_then(|attr| {
            // SAFETY: UCX filled the client address, a sockaddr_storage (libc's layout).
            unsafe { from_storage((&attr.client_address as *const sys::sockaddr_storage).cast()) }
        });
        Endpoint::accept(&self.worker, conn, peer, self.mode).map(Some)
    }

    /// Progresses the worker until a client connects, up to `timeout`, and returns its
    /// endpoint. Errors: [`UcxError::Timeout`], or `ucp_ep_create`'s status.
    pub fn accept(&self, timeout: Duration) -> Result<Endpoint> {
        // SAFETY: queue alive while self is.
        let q = unsafe { &*self.queue };
        let ready = self.worker.progress_until(timeout, || !lock(q).is_empty());
        if !ready {
            return Err(UcxError::Timeout {
                op: "accept",
                timeout,
            });
        }
        self.try_accept()?.ok_or(UcxError::Timeout {
            op: "accept",
            timeout,
        })
    }
}

impl Drop for Listener {
    fn drop(&mut self) {
        let _g = self.worker.guard();
        let api = self.worker.api();
        // SAFETY: queue alive; each pending request is rejected once.
        let pending: Vec<usize> = lock(unsafe { &*self.queue }).drain(..).collect();
        for c in pending {
            // SAFETY: an unconsumed request of this listener, serialised. A request UCX cannot
            // reject (its client gone) leaves nothing to undo.
            let _ = unsafe { call::listener_reject(api, self.raw, c as sys::ucp_conn_request_h) };
        }
        // SAFETY: live listener, serialised; no callbacks after this returns.
        unsafe { call::listener_destroy(api, self.raw) };
        // SAFETY: from Box::into_raw in bind.
        drop(unsafe { Box::from_raw(self.queue) });
    }
}
