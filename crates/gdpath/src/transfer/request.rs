//! What a caller asks for: the operation, the descriptor pairs, strict mode, a deadline and a
//! notification; and the planner's choice per pair.

use crate::finding::FindingId;
use crate::path::DataPath;
use crate::region::Descriptor;
use serde::{Deserialize, Serialize};
use std::fmt;
use std::time::{Duration, Instant};

/// The direction of a transfer, seen from the local descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Op {
    /// Target → local (e.g. file → host memory).
    Read,
    /// Local → target (e.g. host memory → file).
    Write,
}

impl fmt::Display for Op {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Op::Read => "read",
            Op::Write => "write",
        })
    }
}

/// A transfer to post: an operation, local descriptors and the matching target descriptors
/// (pair `i` is `local[i]` with `target[i]`; both have the same length in bytes).
#[derive(Debug, Clone)]
pub struct TransferRequest {
    /// Read (target → local) or write (local → target).
    pub op: Op,
    /// The local descriptors, one per pair.
    pub local: Vec<Descriptor>,
    /// The target descriptors, one per pair, each as long as its local descriptor.
    pub target: Vec<Descriptor>,
    /// Strict mode: when set, every pair must use one of these paths, or the request fails at
    /// post, before any byte moves, with [`Error::PathNotAccepted`].
    ///
    /// [`Error::PathNotAccepted`]: crate::Error::PathNotAccepted
    pub accept: Option<Vec<DataPath>>,
    /// Strict mode without naming paths: every pair must take its preferred path, planned
    /// without a finding (no fallback, nothing degraded such as pageable host memory), or the
    /// request fails at post with [`Error::PathNotAccepted`] (its `accepted` list empty,
    /// `planned` and `finding` saying what would have happened).
    ///
    /// [`Error::PathNotAccepted`]: crate::Error::PathNotAccepted
    pub preferred_only: bool,
    /// After this instant no new work starts and `wait` returns [`Error::DeadlineExceeded`].
    ///
    /// [`Error::DeadlineExceeded`]: crate::Error::DeadlineExceeded
    pub deadline: Option<Instant>,
    /// A notification (at most 64 KiB) that the network backend delivers to each peer agent
    /// whose remote memory the transfer touched, once all of that peer's pairs completed and
    /// their writes are visible there (NIXL's "notification"). A request that carries one
    /// moves its pairs with peers' memory through the network backend, which delivers it: the
    /// local paths to a peer on this node (CUDA IPC, shared host memory) send nothing, so for
    /// them post without it, wait, then `Peer::notify` (docs/network.md).
    pub notify: Option<Vec<u8>>,
}

impl TransferRequest {
    /// A request with no path restriction and no deadline.
    pub fn new(op: Op, local: Vec<Descriptor>, target: Vec<Descriptor>) -> Self {
        TransferRequest {
            op,
            local,
            target,
            accept: None,
            preferred_only: false,
            deadline: None,
            notify: None,
        }
    }
    /// Read `target` into `local`.
    pub fn read(local: Vec<Descriptor>, target: Vec<Descriptor>) -> Self {
        Self::new(Op::Read, local, target)
    }
    /// Write `local` to `target`.
    pub fn write(local: Vec<Descriptor>, target: Vec<Descriptor>) -> Self {
        Self::new(Op::Write, local, target)
    }
    /// Accept only these paths (strict mode).
    pub fn accept(mut self, paths: impl IntoIterator<Item = DataPath>) -> Self {
        self.accept = Some(paths.into_iter().collect());
        self
    }
    /// Accept only each pair's preferred path (see [`TransferRequest::preferred_only`]).
    pub fn preferred_only(mut self) -> Self {
        self.preferred_only = true;
        self
    }
    /// Fail with [`Error::DeadlineExceeded`] when not done by `at`.
    ///
    /// [`Error::DeadlineExceeded`]: crate::Error::DeadlineExceeded
    pub fn deadline(mut self, at: Instant) -> Self {
        self.deadline = Some(at);
        self
    }
    /// Deliver `message` to the peer agent(s) after the remote pairs complete: the field
    /// `notify` of this type says how, and that it keeps those pairs on the network backend
    /// (UCX) rather than a local path to a peer on this node. At most
    /// [`crate::net::codec::MAX_NOTIFY`] bytes: a longer one fails the post with
    /// [`crate::Error::ProtocolLimit`] before any byte moves.
    pub fn notify(mut self, message: impl Into<Vec<u8>>) -> Self {
        self.notify = Some(message.into());
        self
    }
    /// Fail with [`Error::DeadlineExceeded`] when not done `within` from now.
    ///
    /// [`Error::DeadlineExceeded`]: crate::Error::DeadlineExceeded
    pub fn timeout(self, within: Duration) -> Self {
        // A bound too far to represent is no bound (as in `Transfer::wait_timeout`).
        match Instant::now().checked_add(within) {
            Some(at) => self.deadline(at),
            None => self,
        }
    }
    /// Total bytes of the local side.
    pub fn total_bytes(&self) -> u64 {
        self.local.iter().map(|d| d.len).sum()
    }
}

/// The planner's choice for one descriptor pair, made before any byte moves.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PlannedPair {
    /// Position of the pair in the request's lists (0-based).
    pub index: usize,
    /// The backend that will move the pair.
    pub backend: &'static str,
    /// The path it will take.
    pub path: DataPath,
    /// Set when the preferred path was not taken (or the path is degraded): the finding that
    /// says why, as `gdpath doctor` reports it.
    pub finding: Option<FindingId>,
    /// The refusal or note text behind `finding`.
    pub detail: Option<String>,
}
