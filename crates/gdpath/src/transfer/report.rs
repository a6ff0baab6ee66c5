//! What a transfer reports: per pair (path, bytes, time, finding), for the whole transfer, and
//! how it failed.

use crate::blocks::BatchReport;
use crate::error::Error;
use crate::finding::FindingId;
use crate::path::DataPath;
use serde::Serialize;
use std::time::Duration;

/// One completed descriptor pair.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairReport {
    /// Position of the pair in the request's lists (0-based).
    pub index: usize,
    /// Bytes moved (the pair's length).
    pub bytes: u64,
    /// The path that moved the bytes.
    pub path: DataPath,
    /// Why the preferred path was not used, when it was not.
    pub finding: Option<FindingId>,
    /// From the backend starting the pair's first I/O to its last completion.
    pub elapsed: Duration,
    /// How the backend posted the descriptors it moved this pair with, when it posts many at
    /// once (block transfers; the `cuda` backend's batched requests): the method, the
    /// descriptor counts and the posting CPU time. `None` for a pair moved on its own.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub batch: Option<BatchReport>,
}

/// What happened to one descriptor pair of a transfer that failed or timed out.
#[derive(Debug, Clone)]
pub enum PairOutcome {
    /// The pair completed; its report.
    Done(PairReport),
    /// The pair failed.
    Failed {
        /// Position of the pair in the request's lists (0-based).
        index: usize,
        /// Why it failed.
        error: Error,
    },
    /// Still in flight (or never started) when the transfer ended.
    NotDone {
        /// Position of the pair in the request's lists (0-based).
        index: usize,
    },
}

impl PairOutcome {
    /// The pair's index.
    pub fn index(&self) -> usize {
        match self {
            PairOutcome::Done(r) => r.index,
            PairOutcome::Failed { index, .. } | PairOutcome::NotDone { index } => *index,
        }
    }
}

/// A successful transfer.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct TransferReport {
    /// One report per descriptor pair, in request order.
    pub pairs: Vec<PairReport>,
    /// Total bytes moved.
    pub bytes: u64,
    /// From post to the last completion.
    pub elapsed: Duration,
}

impl TransferReport {
    /// Throughput in GB/s (1e9 bytes per second).
    pub fn gbps(&self) -> f64 {
        crate::units::gbps(self.bytes, self.elapsed)
    }
    /// The distinct paths taken, in first-use order.
    pub fn paths(&self) -> Vec<DataPath> {
        let mut out: Vec<DataPath> = Vec::new();
        for p in &self.pairs {
            if !out.contains(&p.path) {
                out.push(p.path.clone());
            }
        }
        out
    }
}

/// A transfer that failed, was cancelled or ran past its deadline: the cause and what happened
/// to every descriptor pair (so the caller knows which completed).
#[derive(Debug, Clone, thiserror::Error)]
#[error("transfer failed: {error} ({} of {} descriptor pairs completed)", self.completed().len(), self.outcomes.len())]
pub struct TransferError {
    /// The first failure in pair order, or [`Error::Cancelled`] / [`Error::DeadlineExceeded`].
    pub error: Error,
    /// One outcome per pair, in request order.
    pub outcomes: Vec<PairOutcome>,
}

impl TransferError {
    /// Indices of the pairs that completed.
    pub fn completed(&self) -> Vec<usize> {
        self.outcomes
            .iter()
            .filter_map(|o| match o {
                PairOutcome::Done(r) => Some(r.index),
                _ => None,
            })
            .collect()
    }
}

/// Progress of an in-flight transfer, from [`Transfer::poll`].
///
/// [`Transfer::poll`]: crate::Transfer::poll
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferStatus {
    /// Pairs completed, successfully or not.
    pub pairs_done: usize,
    /// Pairs in the transfer.
    pub pairs: usize,
    /// Bytes of completed pairs.
    pub bytes_done: u64,
    /// All pairs have completed (successfully or not), or the transfer was cancelled.
    pub finished: bool,
}
