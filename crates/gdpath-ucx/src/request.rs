//! Non-blocking operation handles: test, wait, and release (`ucp_request_*`).

use std::fmt;
use std::os::raw::c_void;
use std::time::Duration;

use crate::endpoint::Endpoint;
use crate::error::{ptr_is_err, ptr_status, Result, Status, UcxError};
use crate::memory::{MemHandle, RemoteKey};
use crate::sys;
use crate::worker::Worker;

/// How long dropping an unfinished request keeps progressing before it gives up and leaks
/// the buffers the operation may still touch (leaking is safe; freeing them would not be).
pub const DROP_WAIT: Duration = Duration::from_secs(30);

/// What an operation's buffers need to stay alive until UCX is done with them.
/// Fields are held, never read: their Drop is what matters.
#[derive(Default)]
#[allow(dead_code)]
pub(crate) struct Pins {
    pub(crate) mem: Option<MemHandle>,
    pub(crate) rkey: Option<RemoteKey>,
    pub(crate) bytes: Vec<Box<[u8]>>,
    pub(crate) ep: Option<Endpoint>,
}

/// A posted operation (put, get, flush, active message). Owns what the operation touches
/// (local memory handle, remote key, copied message bytes), so the memory stays valid
/// however the request ends, even if it is leaked.
///
/// Dropping an unfinished request progresses its worker until the operation ends (at most
/// [`DROP_WAIT`]; UCX fails operations of a failed endpoint, which is always requested with
/// peer error handling), then releases it.
#[must_use = "an operation completes only when waited on or tested until done"]
pub struct Request {
    worker: Worker,
    /// NULL once finished and released.
    raw: *mut c_void,
    op: &'static str,
    result: Option<Result<()>>,
    pins: Pins,
}

// SAFETY: the raw request is only touched under the worker's lock.
unsafe impl Send for Request {}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("op", &self.op)
            .field("pending", &!self.raw.is_null())
            .finish()
    }
}

impl Request {
    /// Wraps what an `*_nbx` call returned: NULL (done), an encoded error, or a request.
    /// Call with the worker lock held or not: it does not lock.
    pub(crate) fn from_ptr(
        worker: Worker,
        pins: Option<Pins>,
        op: &'static str,
        p: *mut c_void,
    ) -> Result<Request> {
        let ep_name = pins
            .as_ref()
            .and_then(|p| p.ep.as_ref())
            .map(|e| e.peer_name());
        if ptr_is_err(p) {
            let status = ptr_status(p);
            return Err(match ep_name {
                Some(peer) if status.is_peer_failure() => UcxError::EndpointFailed { peer, status },
                _ => UcxError::Status { op, status },
            });
        }
        let done = p.is_null();
        Ok(Request {
            worker,
            raw: p,
            op,
            result: done.then_some(Ok(())),
            pins: pins.unwrap_or_default(),
        })
    }

    /// The operation's name (`ucp_put_nbx`, ...).
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// Checks (without progressing) whether the operation finished; once it has, returns
    /// its result every time. `Ok(false)` while in flight.
    pub fn test(&mut self) -> Result<bool> {
        if let Some(r) = &self.result {
            return r.clone().map(|()| true);
        }
        let st = {
            let _g = self.worker.guard();
            // SAFETY: raw is a live request of this worker.
            let st = unsafe { self.worker.api().ucp_request_check_status(self.raw) };
            if st != sys::UCS_INPROGRESS {
                // SAFETY: finished; released exactly once.
                unsafe { self.worker.api().ucp_request_free(self.raw) };
                self.raw = std::ptr::null_mut();
            }
            st
        };
        if st == sys::UCS_INPROGRESS {
            return Ok(false);
        }
        let r = if st == sys::UCS_OK {
            Ok(())
        } else {
            Err(self.error(Status(st)))
        };
        self.result = Some(r.clone());
        r.map(|()| true)
    }

    fn error(&self, status: Status) -> UcxError {
        match &self.pins.ep {
            Some(ep) if status.is_peer_failure() || ep.failure().is_some() => {
                UcxError::EndpointFailed {
                    peer: ep.peer_name(),
                    status: ep.failure().unwrap_or(status),
                }
            }
            _ => UcxError::Status {
                op: self.op,
                status,
            },
        }
    }

    /// Progresses the worker until the operation finishes, up to `timeout`.
    ///
    /// Errors: the operation's status ([`UcxError::EndpointFailed`] when its endpoint
    /// failed), or [`UcxError::Timeout`] (the request stays owned and is finished on drop).
    pub fn wait(mut self, timeout: Duration) -> Result<()> {
        self.wait_mut(timeout)
    }

    /// As [`Request::wait`], keeping the request (to wait again after a timeout).
    pub fn wait_mut(&mut self, timeout: Duration) -> Result<()> {
        let mut res: Option<Result<bool>> = None;
        self.worker.clone().progress_until(timeout, || {
            let r = self.test();
            let finished = !matches!(r, Ok(false));
            res = Some(r);
            finished
        });
        match res {
            Some(Ok(true)) => Ok(()),
            Some(Err(e)) => Err(e),
            _ => Err(UcxError::Timeout {
                op: self.op,
                timeout,
            }),
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let worker = self.worker.clone();
        let finished = worker.progress_until(DROP_WAIT, || !matches!(self.test(), Ok(false)));
        if !finished {
            tracing::warn!(
                op = self.op,
                "UCX operation still pending after {DROP_WAIT:?} at drop; leaking its buffers"
            );
            {
                let _g = worker.guard();
                // SAFETY: UCX releases a pending request when it completes.
                unsafe { worker.api().ucp_request_free(self.raw) };
            }
            std::mem::forget(std::mem::take(&mut self.pins));
        }
    }
}
