//! Endpoints: a connection to a peer worker (`ucp_ep_h`), in five parts:
//! - [`lifecycle`]: create (connect to a socket address or a worker address, accept), close,
//!   and the failure UCX's error callback records;
//! - [`rkey`]: a peer's remote keys unpacked on an endpoint, and the regions they open;
//! - [`rma`]: put, get and flush;
//! - [`am`]: active messages, contiguous and gathered from registered memory;
//! - [`lanes`]: which transports an endpoint uses, from `ucp_ep_query` or parsed from
//!   `ucp_ep_print_info`.

use std::fmt;
use std::sync::Arc;

use crate::error::{Result, Status, UcxError};
use crate::memory::MemHandle;
use crate::request::{EpPin, Pins};
use crate::sys;
use crate::worker::{EpId, Worker};

mod am;
mod lanes;
mod lifecycle;
mod rkey;
mod rma;

pub use am::{AmPart, AM_GATHER_COPY_MAX, AM_IN_PLACE_MIN};
pub use lanes::{EpTransports, Lane, RmaBasis, RmaTransports, TransportSource};
use lifecycle::EpInner;
pub use lifecycle::{ErrorMode, CLOSE_WAIT};
pub use rkey::{RemoteKey, RemoteRegion, MAX_PACKED_RKEY};

/// A connection to a peer worker (`ucp_ep_h`), created with peer error handling
/// (`UCP_ERR_HANDLING_MODE_PEER`) so that a dead peer surfaces as
/// [`UcxError::EndpointFailed`] instead of a hang. Cheap to clone; closed when the last clone,
/// remote key and request using it are gone: outstanding operations are flushed (at most
/// [`CLOSE_WAIT`]) and the endpoint is force-closed, which the peer sees as an endpoint
/// failure. [`Endpoint::close`] closes gracefully instead; a [retired](Endpoint::retire)
/// endpoint closes without flushing or waiting.
#[derive(Clone)]
pub struct Endpoint {
    inner: Arc<EpInner>,
}

impl fmt::Debug for Endpoint {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Endpoint")
            .field("peer", &self.inner.peer.addr())
            .field("failure", &self.failure())
            .finish()
    }
}

impl Endpoint {
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

    /// The status UCX reported through the error callback, once the endpoint failed.
    pub fn failure(&self) -> Option<Status> {
        self.inner.peer.failure()
    }

    /// `Ok` while the endpoint is healthy, else [`UcxError::EndpointFailed`].
    pub fn ensure_ok(&self) -> Result<()> {
        self.inner.peer.ensure_ok()
    }

    /// What every request posted on this endpoint holds: the endpoint, and its peer to name
    /// when the operation fails.
    fn pins(&self) -> Pins {
        Pins {
            ep: Some(EpPin {
                hold: self.inner.clone(),
                peer: self.inner.peer.clone(),
            }),
            ..Pins::default()
        }
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
}
