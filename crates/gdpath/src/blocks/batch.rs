//! How a backend posted a batch of descriptors ([`CopyMethod`], [`BatchReport`]): values the
//! transfer core reports for a pair, so they sit below it and name nothing else of the crate.

use serde::Serialize;
use std::fmt;

/// How a backend posted a batch of descriptors.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum CopyMethod {
    /// One copy call per (merged) descriptor: `cuMemcpy*Async` on a stream, `memmove` on the
    /// CPU for host ↔ host.
    Copies,
    /// `cuMemcpyBatchAsync` (CUDA 12.8+): one driver call for the list, copy engines move it.
    DriverBatch,
    /// One launch of gdpath's gather/scatter copy kernel over the list.
    Kernel,
}

impl CopyMethod {
    /// Every method, in a fixed order.
    pub const ALL: [CopyMethod; 3] = [
        CopyMethod::Copies,
        CopyMethod::DriverBatch,
        CopyMethod::Kernel,
    ];

    /// The name in reports: `copies`, `driver-batch`, `kernel`.
    pub fn name(self) -> &'static str {
        match self {
            CopyMethod::Copies => "copies",
            CopyMethod::DriverBatch => "driver-batch",
            CopyMethod::Kernel => "kernel",
        }
    }

    /// The method named `s` (as [`CopyMethod::name`]).
    pub fn parse(s: &str) -> Option<CopyMethod> {
        CopyMethod::ALL.into_iter().find(|m| m.name() == s)
    }
}

impl fmt::Display for CopyMethod {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// How the descriptors a pair was posted with moved, for backends that post many descriptors
/// at once (part of the pair's path record, [`crate::PairReport::batch`]). For a block transfer
/// it covers the whole list; for a request whose pairs a backend batched, every pair of the
/// batch carries the same report.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
pub struct BatchReport {
    /// How the backend posted the descriptors.
    pub method: CopyMethod,
    /// Descriptors of the batch as given (a block transfer: ids × layers × K/V planes).
    pub descriptors: u64,
    /// Descriptors after merging those that continue each other.
    pub coalesced: u64,
    /// What the method ran: copy calls, the driver batch's copies, or the kernel's pieces
    /// (long descriptors are split across warps).
    pub posted: u64,
    /// CPU time the backend spent turning the batch into its calls and enqueueing them, ns
    /// (not counting the wait for the copy).
    pub post_ns: u64,
}
