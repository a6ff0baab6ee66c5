//! An endpoint's peer as the requests posted on it see it: its address, and the failure UCX's
//! error callback recorded. Requests sit below endpoints, so they hold this rather than the
//! endpoint, to name the peer when an operation fails.

use std::net::SocketAddr;
use std::sync::atomic::{AtomicI8, Ordering};

use crate::error::{Result, Status, UcxError};
use crate::sys;

/// The peer of one endpoint; shared by the endpoint, UCX's error callback and its requests.
#[derive(Debug)]
pub(crate) struct Peer {
    addr: Option<SocketAddr>,
    /// 0 while healthy, else the status UCX's error callback passed.
    failure: AtomicI8,
}

impl Peer {
    pub(crate) fn new(addr: Option<SocketAddr>) -> Peer {
        Peer {
            addr,
            failure: AtomicI8::new(0),
        }
    }

    /// The peer's socket address, when connected through one.
    pub(crate) fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// The status UCX reported through the error callback, once the endpoint failed.
    pub(crate) fn failure(&self) -> Option<Status> {
        let s = self.failure.load(Ordering::Acquire);
        (s != 0).then_some(Status(s))
    }

    /// Records the endpoint's failure; the first one stays. `UCS_OK`, which UCX should never
    /// pass here, is recorded as `UCS_ERR_IO_ERROR` so that the endpoint still counts as failed.
    pub(crate) fn record_failure(&self, status: sys::ucs_status_t) {
        let s = if status == sys::UCS_OK {
            sys::UCS_ERR_IO_ERROR
        } else {
            status
        };
        let _ = self
            .failure
            .compare_exchange(0, s, Ordering::AcqRel, Ordering::Acquire);
    }

    /// [`UcxError::EndpointFailed`] naming this peer (`?` for an endpoint made from a worker
    /// address) with `status`.
    pub(crate) fn failed(&self, status: Status) -> UcxError {
        UcxError::EndpointFailed {
            peer: self.addr.map_or_else(|| "?".to_string(), |a| a.to_string()),
            status,
        }
    }

    /// `Ok` while the endpoint is healthy, else [`UcxError::EndpointFailed`].
    pub(crate) fn ensure_ok(&self) -> Result<()> {
        match self.failure() {
            None => Ok(()),
            Some(status) => Err(self.failed(status)),
        }
    }
}
