//! Backends: the code that moves bytes for a pair of memory kinds.
//!
//! A backend declares [`Capability`]s (memory-kind pairs it serves, the [`DataPath`] it produces,
//! whether that path is the preferred one or a fallback), accepts or refuses each descriptor pair
//! at planning time ([`Backend::plan`], a refusal names a finding id), and executes planned
//! [`WorkItem`]s ([`Backend::submit`]). Completion is reported per item with
//! [`WorkItem::complete`], from any thread: backends that run their own threads (io_uring, thread
//! pools, CUDA host callbacks) complete from there; poll-driven backends (a UCX worker) declare
//! [`Drive::Poll`] and complete from [`Backend::progress`], which waiters call.

pub(crate) mod bounce;
pub mod cuda;
pub mod cufile;
pub mod file_gpu;
mod fileio;
pub mod host_copy;
pub mod network;
pub mod posix_buffered;
pub mod posix_direct;
pub(crate) mod shm;
mod split;
pub mod ucx;
mod workers;

pub use crate::region::{BackendHandle, ForeignMemory};
pub use crate::transfer::WorkItem;
pub use split::SplitItem;

use crate::error::Result;
use crate::finding::FindingId;
use crate::memory::{Memory, MemoryClass};
use crate::path::DataPath;
use crate::region::{Descriptor, Region};
use crate::transfer::Op;
pub use network::{NetworkBackend, NotificationHook};
use serde::Serialize;

/// The error for a host range outside its memory: a bug in the engine (the planner checks every
/// descriptor against its region before a backend sees it), reported rather than panicking.
pub(crate) fn range_err(backend: &'static str, e: crate::os::mem::RangeError) -> crate::Error {
    crate::Error::Backend {
        backend,
        detail: e.to_string(),
    }
}

/// Whether a capability's path is the one to use when possible, or the one used when the
/// preferred path refuses. The planner tries preferred capabilities first.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Preference {
    /// The path to use whenever the backend accepts the pair.
    Preferred,
    /// A path tried only after every preferred capability for the pair refused it.
    Fallback,
}

/// How a backend's completions happen.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Drive {
    /// The backend's own threads (or the kernel) complete work items.
    Threads,
    /// Work completes only when someone calls [`Backend::progress`]; `Transfer::wait` and
    /// `Transfer::poll` do.
    Poll,
}

/// One memory-kind pair a backend serves, for both [`Op`]s unless `ops` says otherwise.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Capability {
    /// Class of the local descriptor's region.
    pub local: MemoryClass,
    /// Class of the target descriptor's region.
    pub target: MemoryClass,
    /// Operations served.
    pub ops: Vec<Op>,
    /// The path this capability produces.
    pub path: DataPath,
    /// Whether the planner tries it first or after the preferred ones.
    pub preference: Preference,
}

impl Capability {
    /// A capability for both reads and writes.
    pub fn both(
        local: MemoryClass,
        target: MemoryClass,
        path: DataPath,
        preference: Preference,
    ) -> Self {
        Capability {
            local,
            target,
            ops: vec![Op::Read, Op::Write],
            path,
            preference,
        }
    }
}

/// A backend's acceptance of a pair: the path it will take, and, when that path is degraded,
/// the finding that says why (e.g. `system.host-pageable` for staged pageable memory).
#[derive(Debug, Clone, PartialEq)]
pub struct PlanChoice {
    /// The path the backend will take.
    pub path: DataPath,
    /// The finding that says why the path is degraded; `None` when it is not.
    pub finding: Option<FindingId>,
    /// The evidence behind `finding` (e.g. why P2P is impossible between two GPUs).
    pub detail: Option<String>,
}

impl PlanChoice {
    /// The path, not degraded.
    pub fn on(path: DataPath) -> Self {
        PlanChoice {
            path,
            finding: None,
            detail: None,
        }
    }
}

/// A backend's refusal of a pair: the finding id that explains it and the evidence.
#[derive(Debug, Clone, PartialEq)]
pub struct Refusal {
    /// The doctor finding that explains the refusal, when one does.
    pub finding: Option<FindingId>,
    /// The evidence: what the backend saw that made it refuse.
    pub detail: String,
}

impl Refusal {
    /// A refusal explained by `finding`.
    pub fn because(finding: &str, detail: impl Into<String>) -> Self {
        Refusal {
            finding: Some(FindingId::from(finding)),
            detail: detail.into(),
        }
    }

    /// A refusal no finding explains: the pair is not one this backend serves.
    pub fn unexplained(detail: impl Into<String>) -> Self {
        Refusal {
            finding: None,
            detail: detail.into(),
        }
    }
}

/// The file of a host ↔ file pair, for the storage backends' plans. Errors: a refusal without
/// a finding when `local` is not host memory or `target` is not a file.
pub(crate) fn host_and_file<'a>(
    local: &Descriptor,
    target: &'a Descriptor,
) -> std::result::Result<&'a crate::region::FileRegion, Refusal> {
    if local.region.host_ptr().is_none() {
        return Err(Refusal::unexplained("local memory is not host memory"));
    }
    target
        .region
        .file()
        .ok_or_else(|| Refusal::unexplained("target is not a file"))
}

/// A data path implementation. Implementations are shared between threads (`Arc<dyn Backend>`).
pub trait Backend: Send + Sync + 'static {
    /// A short stable name (`posix-direct`, `cuda`, `cufile`, `ucx`).
    fn name(&self) -> &'static str;

    /// The memory-kind pairs served. Asked once, when the backend is added to an agent: they
    /// must not change afterwards.
    fn capabilities(&self) -> Vec<Capability>;

    /// How completions happen; default [`Drive::Threads`].
    fn drive(&self) -> Drive {
        Drive::Threads
    }

    /// Creates memory of a kind gdpath does not store itself (GPU memory, a peer's region), or
    /// `None` when this backend does not make memory of `memory`'s kind.
    fn materialize(&self, memory: &Memory) -> Option<Result<Box<dyn ForeignMemory>>> {
        let _ = memory;
        None
    }

    /// Called for every new region of a kind this backend serves: pin it, open a cuFile handle,
    /// map it with UCX. The returned handle is dropped when the region is freed. An error fails
    /// the registration.
    fn register(&self, region: &Region) -> Result<Option<BackendHandle>> {
        let _ = region;
        Ok(None)
    }

    /// Accepts or refuses one descriptor pair (bounds are already checked). Must not move data.
    fn plan(
        &self,
        op: Op,
        local: &Descriptor,
        target: &Descriptor,
    ) -> std::result::Result<PlanChoice, Refusal>;

    /// Whether [`Backend::plan`]'s whole answer (acceptance, path, finding and detail, or the
    /// refusal and its text) depends only on the operation and the two regions of a pair, not
    /// on its offsets and lengths. The planner then plans a run of consecutive pairs of one
    /// request on the same two regions once, when every candidate backend for them says so;
    /// state that changes with time (a peer's connection) is then read once per run. Asked
    /// once, when the backend is added to an agent. Default `false` (O_DIRECT's alignment, for
    /// one, depends on offsets).
    fn plan_per_region(&self) -> bool {
        false
    }

    /// Whether this backend moves block lists ([`crate::blocks`]): [`Backend::submit`] may then
    /// receive items whose [`WorkItem::blocks`] is set, planned by [`Backend::plan`] on
    /// descriptors of the two layouts' extents (whose lengths differ), and must move every
    /// descriptor of the list and complete the item once, with
    /// [`WorkItem::complete_batch`]. Asked when a block transfer is prepared. Default `false`:
    /// block transfers between regions only such backends serve are expanded into descriptor
    /// pairs.
    fn block_lists(&self) -> bool {
        false
    }

    /// Starts the items (all planned on this backend). Must not block on their I/O; must
    /// complete every item exactly once (an item dropped unreported completes with an error).
    fn submit(&self, items: Vec<WorkItem>);

    /// Drives a poll-driven backend; returns how many completions it reported. Default: 0.
    fn progress(&self) -> usize {
        0
    }

    /// This backend as a network backend, when it reaches peer agents (connect, serve,
    /// exports, notifications: [`network::NetworkBackend`]); the agent delegates its network
    /// calls to the first backend that answers. Default: `None`.
    fn network(&self) -> Option<&dyn network::NetworkBackend> {
        None
    }
}
