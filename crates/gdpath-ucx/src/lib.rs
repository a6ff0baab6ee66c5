//! UCX (`libucp`) loaded at run time, wrapped in safe RAII types for gdpath's network path.
//!
//! - [`Ucx`]: the library, opened with `dlopen` (`libucp.so.0`, or `GDPATH_UCX_LIB`); its
//!   absence is [`UcxError::LibraryMissing`], never a build failure or a panic.
//! - [`Context`] (features, `UCX_TLS`), [`Worker`] (progress, wait, active messages),
//!   [`Listener`] and [`Endpoint`] (connect/accept over a socket address, peer error
//!   handling), [`MemHandle`] (`ucp_mem_map` of host or CUDA memory), [`PackedRkey`],
//!   [`RemoteKey`] and [`RemoteRegion`] (bounds-checked put/get), [`Request`].
//! - Facts: [`Context::facts`] (version, transports and devices, memory types, CUDA),
//!   [`Endpoint::transports`] and [`Endpoint::rma_transports`].
//!
//! Ownership: every handle keeps what it depends on alive (a pending request pins its memory
//! handle, remote key and endpoint; an endpoint its worker; a worker its context), so nothing
//! is released while UCX may still use it, in whatever order Rust drops them. A request UCX
//! finished at post pins nothing: UCX no longer touches its memory.
//!
//! Raw bindings are in [`sys`] (generated once by `gen-bindings.sh` from UCX 1.13 headers,
//! bindgen's dynamic-loading mode); see `docs/ucx.md` for versions and transports.

#![warn(missing_docs)]

mod capture;
mod context;
mod endpoint;
mod error;
mod listener;
mod loader;
mod memory;
mod request;
mod sockaddr;
pub mod sys;
mod sys_ext;
mod worker;

pub use context::{Context, Features, MemType, Resource, UcxCfg, UcxFacts};
pub use endpoint::{
    AmPart, Endpoint, EpTransports, ErrorMode, Lane, RmaBasis, RmaTransports, TransportSource,
    AM_GATHER_COPY_MAX, AM_IN_PLACE_MIN, CLOSE_WAIT,
};
pub use error::{Result, Status, UcxError};
pub use listener::Listener;
pub use loader::{Ucx, UcxVersion, ENV_LIB, LIBUCP_SONAME, LOG_FILE_ENV, MIN_VERSION};
pub use memory::{MemHandle, PackedRkey, RegionDesc, RemoteKey, RemoteRegion, MAX_PACKED_RKEY};
pub use request::{ProtoInfo, Request, DROP_WAIT};
pub use worker::{
    am_held_live, AmData, AmMessage, EpId, Worker, WorkerAddress, AM_HOLD_MIN, AM_MAX_MESSAGE,
    AM_MAX_QUEUED,
};
