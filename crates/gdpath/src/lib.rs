//! gdpath: the engine for the GPUDirect data paths (P2P, GDR, GDS) and their host-memory
//! fallbacks. See `DESIGN.md` for the layers; this crate sits between the hardware layers
//! (`gdpath-topo`, `gdpath-cuda`, `gdpath-ucx`) and the `gdpath` command.
//!
//! The engine: an [`Agent`] owns [`Backend`]s and registered memory ([`Region`]s). A
//! [`TransferRequest`] pairs local and target [`Descriptor`]s; [`Agent::post`] plans a path per
//! pair (recording the [`FindingId`] when the preferred path was not taken), optionally in strict
//! mode, and returns a [`Transfer`] to poll, wait on, time out or cancel. See `docs/engine.md`.

pub mod agent;
pub mod backend;
pub mod bench;
pub mod config;
pub mod copy;
pub mod error;
pub mod finding;
pub mod memory;
pub mod path;
mod planner;
pub mod region;
pub mod transfer;

pub use agent::{Agent, BackendInfo};
pub use backend::{Backend, Capability, Drive, PlanChoice, Preference, Refusal, SplitItem};
pub use config::{AgentConfig, StorageConfig};
pub use error::{Error, Result, Side};
pub use finding::{Area, Finding, FindingId, Status};
pub use gdpath_topo as topo;
pub use memory::{
    DirectIo, FileAccess, FileSpec, HostBuffer, Memory, MemoryClass, MemoryKind, RemoteMemory,
};
pub use path::Path;
pub use region::{
    BackendHandle, Descriptor, DioAlign, DirectStatus, FileRegion, ForeignMemory, HostView, Region,
    RegionId,
};
pub use transfer::{
    Op, PairOutcome, PairReport, PlannedPair, Transfer, TransferError, TransferReport,
    TransferRequest, TransferStatus, WorkItem,
};
