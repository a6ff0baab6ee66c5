//! The backend-author side of a transfer: one descriptor pair handed to a backend, reported
//! back exactly once.

use super::{Op, TransferShared};
use crate::blocks::{BatchReport, BlockList, CopyMethod};
use crate::error::{Error, Result};
use crate::path::DataPath;
use crate::region::{Descriptor, UseGuard};
use std::fmt;
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

/// A unit of work handed to a backend: one descriptor pair of a transfer, planned on a path.
/// The item keeps both regions alive and counted in use until it completes; the backend reports
/// its result with [`WorkItem::complete`] (an item dropped unreported completes with
/// [`Error::Backend`], so no transfer hangs). The regions are released *before* the transfer
/// sees the completion, so after `wait` returns the caller's memory is free to use.
pub struct WorkItem {
    index: usize,
    op: Op,
    pair: Option<ItemPair>,
    started: OnceLock<Instant>,
    shared: Arc<TransferShared>,
    /// The block list of a block transfer's item (its descriptors span the layouts).
    blocks: Option<Box<dyn BlockSource>>,
}

/// The block list a block transfer's work item carries, held until the item completes (then
/// dropped: its ids go back to their pool). The block transfer API, above the agent,
/// implements it; the transfer core knows the list and nothing of how it was prepared.
pub(crate) trait BlockSource: Send + Sync {
    /// The list of this item's post.
    fn list(&self) -> BlockList<'_>;
    /// The method the block transfer asked for, if any.
    fn method(&self) -> Option<CopyMethod>;
}

struct ItemPair {
    local: Descriptor,
    target: Descriptor,
    _guards: [UseGuard; 2],
}

/// Splits `items` by `key` (a backend's position, a peer's address), keeping each key's items
/// in order. When every item has the same key (one transfer on one backend and one peer, the
/// rule) the input vector is passed on as it is.
pub(crate) fn group_items(
    items: Vec<WorkItem>,
    key: impl Fn(&WorkItem) -> usize,
) -> Vec<(usize, Vec<WorkItem>)> {
    let Some(first) = items.first().map(&key) else {
        return Vec::new();
    };
    if items.iter().all(|i| key(i) == first) {
        return vec![(first, items)];
    }
    let mut groups: Vec<(usize, Vec<WorkItem>)> = Vec::new();
    for item in items {
        let k = key(&item);
        match groups.iter_mut().find(|(g, _)| *g == k) {
            Some((_, v)) => v.push(item),
            None => groups.push((k, vec![item])),
        }
    }
    groups
}

impl fmt::Debug for WorkItem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("WorkItem")
            .field("transfer", &self.shared.id)
            .field("index", &self.index)
            .field("op", &self.op)
            .field("path", self.path())
            .finish()
    }
}

impl WorkItem {
    pub(crate) fn new(
        index: usize,
        op: Op,
        local: Descriptor,
        target: Descriptor,
        shared: Arc<TransferShared>,
        guards: [UseGuard; 2],
    ) -> Self {
        WorkItem {
            index,
            op,
            pair: Some(ItemPair {
                local,
                target,
                _guards: guards,
            }),
            started: OnceLock::new(),
            shared,
            blocks: None,
        }
    }

    /// The one item of a block transfer's post (index 0): `local` and `target` span the two
    /// layouts, `job` holds the list.
    pub(crate) fn new_blocks(
        op: Op,
        local: Descriptor,
        target: Descriptor,
        shared: Arc<TransferShared>,
        guards: [UseGuard; 2],
        job: impl BlockSource + 'static,
    ) -> Self {
        let mut item = WorkItem::new(0, op, local, target, shared, guards);
        item.blocks = Some(Box::new(job));
        item
    }

    /// The block list, for an item of a block transfer (only backends that declare
    /// [`Backend::block_lists`] get such items). Its offsets are relative to the regions of
    /// [`WorkItem::local`] and [`WorkItem::target`]; it moves [`BlockList::bytes`] bytes
    /// (`local().len` is the layout's extent, not that).
    ///
    /// [`Backend::block_lists`]: crate::backend::Backend::block_lists
    pub fn blocks(&self) -> Option<BlockList<'_>> {
        self.blocks.as_ref().map(|j| j.list())
    }

    /// The method the block transfer asked for ([`crate::BlockTransfer::method`]), if any.
    pub fn forced_method(&self) -> Option<CopyMethod> {
        self.blocks.as_ref().and_then(|j| j.method())
    }

    /// The pair's index in its request.
    pub fn index(&self) -> usize {
        self.index
    }
    /// The operation.
    pub fn op(&self) -> Op {
        self.op
    }
    /// The planned path (kept once, in the transfer's plan).
    pub fn path(&self) -> &DataPath {
        &self.shared.plans[self.index].path
    }
    /// The local descriptor (bounds already checked against its region).
    pub fn local(&self) -> &Descriptor {
        &self.pair.as_ref().expect("present until completion").local
    }
    /// The target descriptor (bounds already checked; a file read range exists).
    pub fn target(&self) -> &Descriptor {
        &self.pair.as_ref().expect("present until completion").target
    }

    /// `Some(Cancelled)` or `Some(DeadlineExceeded)` when the backend should not start more I/O
    /// for this item. Backends check it before each chunk.
    pub fn stop_reason(&self) -> Option<Error> {
        self.shared.stop_reason()
    }

    /// The request's deadline.
    pub fn deadline(&self) -> Option<Instant> {
        self.shared.deadline
    }

    /// The request's notification ([`TransferRequest::notify`]), shared by its items.
    ///
    /// [`TransferRequest::notify`]: crate::TransferRequest::notify
    pub fn notification(&self) -> Option<Arc<[u8]>> {
        self.shared.notify.clone()
    }

    /// Records that the first I/O of this pair was issued (for latency reporting). Idempotent.
    pub fn mark_started(&self) {
        self.mark_started_at(Instant::now());
    }

    /// As [`WorkItem::mark_started`], with the instant read by the caller: a backend posting
    /// many pairs at once reads the clock once for all of them.
    pub(crate) fn mark_started_at(&self, at: Instant) {
        let _ = self.started.set(at);
    }

    /// Reports the pair's result: `Ok(bytes moved)` or the error. The backend must not touch
    /// the pair's memory afterwards.
    pub fn complete(mut self, result: Result<u64>) {
        self.report(result, None);
    }

    /// As [`WorkItem::complete`], with the path the backend observed the bytes take when it
    /// is more precise than the planned one (the network backend learns UCX's protocol only
    /// once the operation runs). The pair's report carries `taken`; the plan keeps its path.
    pub fn complete_on(mut self, result: Result<u64>, taken: DataPath) {
        self.report(result, Some(taken));
    }

    /// As [`WorkItem::complete`] / [`WorkItem::complete_on`], with the completion instant read
    /// by the caller: a backend completing many pairs at once reads the clock once.
    pub(crate) fn complete_at(
        mut self,
        result: Result<u64>,
        taken: Option<DataPath>,
        now: Instant,
    ) {
        self.report_at(result, taken, now);
    }

    /// As [`WorkItem::complete`], for a pair moved as part of a batch of descriptors (a block
    /// list, or pairs of one request posted together): the pair's report carries `batch`.
    pub fn complete_batch(mut self, result: Result<u64>, batch: BatchReport) {
        self.report_batch_at(result, None, Some(batch), Instant::now());
    }

    /// As [`WorkItem::complete_batch`] with the completion instant read by the caller.
    pub(crate) fn complete_batch_at(
        mut self,
        result: Result<u64>,
        batch: BatchReport,
        now: Instant,
    ) {
        self.report_batch_at(result, None, Some(batch), now);
    }

    fn report(&mut self, result: Result<u64>, taken: Option<DataPath>) {
        // One clock read serves the pair's elapsed time and, for the last pair, the
        // transfer's end.
        self.report_at(result, taken, Instant::now());
    }

    fn report_at(&mut self, result: Result<u64>, taken: Option<DataPath>, now: Instant) {
        self.report_batch_at(result, taken, None, now);
    }

    fn report_batch_at(
        &mut self,
        result: Result<u64>,
        taken: Option<DataPath>,
        batch: Option<BatchReport>,
        now: Instant,
    ) {
        if let Some(pair) = self.pair.take() {
            let start = self.started.get().copied().unwrap_or(self.shared.posted);
            let elapsed = now.saturating_duration_since(start);
            let result = result.map_err(crate::metrics::error);
            self.count(&pair, result.is_ok(), taken.as_ref(), elapsed);
            drop(pair); // release the regions first
            self.blocks = None; // and give the ids back
            self.shared
                .complete(self.index, result, elapsed, taken, batch, now);
        }
    }

    /// Adds the pair to the engine's metrics: its length (a block list's bytes), the path it
    /// took, the peer agent whose memory it used, the finding that made it a fallback.
    fn count(
        &self,
        pair: &ItemPair,
        ok: bool,
        taken: Option<&crate::path::DataPath>,
        elapsed: Duration,
    ) {
        let len = self.blocks().map_or(pair.local.len, |b| b.bytes());
        let peer = [&pair.target, &pair.local]
            .into_iter()
            .find_map(|d| match d.region.kind() {
                crate::memory::MemoryKind::Remote { agent } => Some(agent.as_str()),
                _ => None,
            });
        let plan = &self.shared.plans[self.index];
        let path = taken.unwrap_or(&plan.path);
        let write = self.op == Op::Write;
        crate::metrics::pair_done(write, path, peer, plan.finding.as_ref(), ok, len, elapsed);
    }
}

impl Drop for WorkItem {
    fn drop(&mut self) {
        if self.pair.is_some() {
            let detail = format!(
                "backend for {} dropped descriptor pair {} without completing it",
                self.path(),
                self.index
            );
            self.report(
                Err(Error::Backend {
                    backend: "engine",
                    detail,
                }),
                None,
            );
        }
    }
}
