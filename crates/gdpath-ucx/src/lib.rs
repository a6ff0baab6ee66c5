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
//! Three layers, each module using only those listed before it:
//! 1. the symbols: `sys` (bindgen output of UCX 1.13's headers, `gen-bindings.sh`) and
//!    `sys_ext` (later ABI, declared by hand);
//! 2. the checked calls: `call`, one function per libucp function, returning [`UcxError`]
//!    naming the symbol; beside it the vocabulary every layer uses (`mem_type`, `error`,
//!    `sync`, `capture`);
//! 3. the safe types: `loader`, `context`, `worker`, `memory`, `peer`, `request`, `endpoint`
//!    (its remote keys included), `listener`, calling UCX only through `call`.
//!
//! Ownership: every handle keeps what it depends on alive (a pending request pins its memory
//! handle, remote key and endpoint; an endpoint its worker; a worker its context), so nothing
//! is released while UCX may still use it, in whatever order Rust drops them. A request UCX
//! finished at post pins nothing: UCX no longer touches its memory. See `docs/ucx.md` for
//! versions and transports.

mod sys;
mod sys_ext;

mod call;
mod capture;
mod error;
mod mem_type;
mod sync;

mod context;
mod endpoint;
mod listener;
mod loader;
mod memory;
mod peer;
mod request;
mod sockaddr;
mod worker;

pub use context::{Context, Features, Resource, UcxCfg, UcxFacts};
pub use endpoint::{
    AmPart, Endpoint, EpTransports, ErrorMode, Lane, RemoteKey, RemoteRegion, RmaBasis,
    RmaTransports, TransportSource, AM_GATHER_COPY_MAX, AM_IN_PLACE_MIN, CLOSE_WAIT,
    MAX_PACKED_RKEY,
};
pub use error::{Result, Status, UcxError};
pub use listener::Listener;
pub use loader::{Ucx, UcxVersion, ENV_LIB, LIBUCP_SONAME, LOG_FILE_ENV, MIN_VERSION};
pub use mem_type::MemType;
pub use memory::{MemHandle, PackedRkey, RegionDesc};
pub use request::{ProtoInfo, Request, DROP_WAIT};
pub use worker::{
    am_held_live, AmData, AmMessage, EpId, Worker, WorkerAddress, AM_HOLD_MIN, AM_MAX_MESSAGE,
    AM_MAX_QUEUED,
};
