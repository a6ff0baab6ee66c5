//! gdpath: the engine for the GPUDirect data paths (P2P, GDR, GDS) and their host-memory
//! fallbacks. See `DESIGN.md` for the layers; this crate sits between the hardware layers
//! (`gdpath-topo`, `gdpath-cuda`, `gdpath-ucx`) and the `gdpath` command.
//!
//! The engine: an [`Agent`] owns [`Backend`]s and registered memory ([`Region`]s). A
//! [`TransferRequest`] pairs local and target [`Descriptor`]s; [`Agent::post`] plans a path per
//! pair (recording the [`FindingId`] when the preferred path was not taken), optionally in strict
//! mode, and returns a [`Transfer`] to poll, wait on, time out or cancel. See `docs/engine.md`.
//!
//! ```
//! use gdpath::{Agent, AgentConfig, FileSpec, HostBuffer, Memory, Path, TransferRequest};
//!
//! let dir = tempfile::tempdir()?;
//! let agent = Agent::new(AgentConfig::default())?;
//! let src = agent.register(Memory::host(HostBuffer::from_slice(&[7u8; 10_000])))?;
//! let file = agent.register(Memory::File(FileSpec::write(dir.path().join("x"))))?;
//! let report = agent
//!     .post(TransferRequest::write(vec![src.desc(0, 10_000)], vec![file.desc(0, 10_000)]))?
//!     .wait()?;
//! assert_eq!(report.bytes, 10_000);
//! // O_DIRECT where the file system allows it, else the buffered path with the reason.
//! let p = &report.pairs[0];
//! assert!(p.path == Path::PosixDirect || p.finding.is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![deny(unsafe_code)]

pub mod agent;
pub mod backend;
// The doctor and bench modules still call libc directly; their unsafe moves to `os` separately.
#[allow(unsafe_code)]
pub mod bench;
pub mod checkpoint;
pub mod config;
pub mod copy;
pub mod cufile_json;
#[allow(unsafe_code)]
pub mod doctor;
pub mod error;
pub mod finding;
pub mod gds;
pub mod gpu_copy;
pub(crate) mod kmod;
pub mod machine;
pub mod memory;
pub mod net;
#[allow(unsafe_code)]
mod os;
pub mod path;
mod planner;
pub mod region;
pub mod transfer;

pub use agent::{Agent, BackendInfo};
pub use backend::{Backend, Capability, Drive, PlanChoice, Preference, Refusal, SplitItem};
pub use config::{AgentConfig, GdsConfig, GpuConfig, StorageConfig};
pub use error::{Error, Result, Side};
pub use finding::{Area, Finding, FindingId, Status};
pub use gdpath_topo as topo;
pub use memory::{
    DirectIo, FileAccess, FileSpec, GpuPointer, HostBuffer, Memory, MemoryClass, MemoryKind,
    RemoteMemory,
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
