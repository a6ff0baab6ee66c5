//! gdpath: the engine for the GPUDirect data paths (P2P, GDR, GDS) and their host-memory
//! fallbacks. See docs/design.md for the layers; this crate sits between the hardware layers
//! (`gdpath-topo`, `gdpath-cuda`, `gdpath-ucx`) and the crates built on the engine: the doctor
//! (`gdpath-doctor`), the bench harness (`gdpath-bench`) and the `gdpath` command.
//!
//! The engine: an [`Agent`] owns backends and registered memory ([`Region`]s). A
//! [`TransferRequest`] pairs local and target [`Descriptor`]s; [`Agent::post`] plans a path per
//! pair (recording the [`FindingId`] when the preferred path was not taken), optionally in strict
//! mode, and returns a [`Transfer`] to poll, wait on, time out or cancel. See `docs/engine.md`.
//!
//! The crate root is the user API. The interface a backend is written against
//! ([`backend::Backend`], its capabilities, plans and refusals, the [`backend::WorkItem`]s it
//! executes, the handles and foreign memory it keeps on a region) is under [`backend`] only.
//! Also here: the facts behind the GDS decision that the doctor reports too ([`gds`],
//! [`cufile_json`], [`kmod`]), the network ([`net`], whose protocol is the `gdpath-wire` crate),
//! OS calls ([`os`]), safe file creation and replacement ([`file`](mod@file)) and units
//! ([`units`]).
//! Checkpoints (safetensors loads and saves, and the storage chooser that sets loads up) are
//! the `gdpath-checkpoint` crate, built on this one's public API.
//!
//! ```
//! use gdpath::{Agent, AgentConfig, FileSpec, HostBuffer, Memory, DataPath, TransferRequest};
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
//! assert!(p.path == DataPath::PosixDirect || p.finding.is_some());
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
#![forbid(unsafe_code)]

pub mod agent;
pub mod backend;
pub mod blocks;
pub mod config;
pub mod cufile_json;
pub mod error;
pub mod file;
pub mod finding;
pub mod gds;
pub mod kmod;
pub mod memory;
mod memory_kind;
pub mod metrics;
pub mod net;
pub mod os;
pub mod path;
mod planner;
mod ratelimit;
mod region;
mod region_id;
mod transfer;
pub mod units;

pub use agent::{Agent, BackendInfo};
pub use blocks::{
    BatchReport, BlockError, BlockIndex, BlockTransfer, CopyMethod, KvLayout, PreparedBlocks,
};
pub use config::{AgentConfig, GdsConfig, GpuConfig, StorageConfig};
pub use error::{Error, Result, Side};
pub use finding::{Area, Finding, FindingId, Status};
pub use gdpath_topo as topo;
pub use memory::{
    DirectIo, FileAccess, FileSpec, GpuPointer, HostBuffer, HostPointer, Memory, MemoryClass,
    MemoryKind, OpenFile, RemoteMemory,
};
pub use path::DataPath;
pub use region::{Descriptor, DioAlign, DirectStatus, FileRegion, HostView, Region, RegionId};
pub use transfer::{
    Op, PairOutcome, PairReport, PlannedPair, Transfer, TransferError, TransferReport,
    TransferRequest, TransferStatus,
};
