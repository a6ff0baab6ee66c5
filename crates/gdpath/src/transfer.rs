//! Transfer requests, in-flight transfers and their reports.

use crate::backend::Backend;
use crate::blocks::{BatchReport, BlockJob, BlockList, CopyMethod};
use crate::error::{Error, Result};
use crate::finding::FindingId;
use crate::path::Path;
use crate::region::{Descriptor, UseGuard};
use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock};
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
    pub op: Op,
    pub local: Vec<Descriptor>,
    pub target: Vec<Descriptor>,
    /// Strict mode: when set, every pair must use one of these paths, or the request fails at
    /// post, before any byte moves, with [`Error::PathNotAccepted`].
    pub accept: Option<Vec<Path>>,
    /// Strict mode without naming paths: every pair must take its preferred path, planned
    /// without a finding (no fallback, nothing degraded such as pageable host memory), or the
    /// request fails at post with [`Error::PathNotAccepted`] (its `accepted` list empty,
    /// `planned` and `finding` saying what would have happened).
    pub preferred_only: bool,
    /// After this instant no new work starts and `wait` returns [`Error::DeadlineExceeded`].
    pub deadline: Option<Instant>,
    /// A notification (at most 64 KiB) that the network backend delivers to each peer agent
    /// whose remote memory the transfer touched, once all of that peer's pairs completed and
    /// their writes are visible there (NIXL's "notification"). Ignored by local backends.
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
    pub fn accept(mut self, paths: impl IntoIterator<Item = Path>) -> Self {
        self.accept = Some(paths.into_iter().collect());
        self
    }
    /// Accept only each pair's preferred path (see [`TransferRequest::preferred_only`]).
    pub fn preferred_only(mut self) -> Self {
        self.preferred_only = true;
        self
    }
    /// Fail with [`Error::DeadlineExceeded`] when not done by `at`.
    pub fn deadline(mut self, at: Instant) -> Self {
        self.deadline = Some(at);
        self
    }
    /// Deliver `message` to the peer agent(s) after the remote pairs complete (network
    /// backend); see [`TransferRequest::notify`].
    pub fn notify(mut self, message: impl Into<Vec<u8>>) -> Self {
        self.notify = Some(message.into());
        self
    }
    /// Fail with [`Error::DeadlineExceeded`] when not done `within` from now.
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
    pub index: usize,
    /// The backend that will move the pair.
    pub backend: &'static str,
    pub path: Path,
    /// Set when the preferred path was not taken (or the path is degraded): the finding that
    /// says why, as `gdpath doctor` reports it.
    pub finding: Option<FindingId>,
    /// The refusal or note text behind `finding`.
    pub detail: Option<String>,
}

/// One completed descriptor pair.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct PairReport {
    pub index: usize,
    /// Bytes moved (the pair's length).
    pub bytes: u64,
    pub path: Path,
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
    Done(PairReport),
    Failed {
        index: usize,
        error: Error,
    },
    /// Still in flight (or never started) when the transfer ended.
    NotDone {
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
    pub fn paths(&self) -> Vec<Path> {
        let mut out: Vec<Path> = Vec::new();
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
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TransferStatus {
    pub pairs_done: usize,
    pub pairs: usize,
    /// Bytes of completed pairs.
    pub bytes_done: u64,
    /// All pairs have completed (successfully or not), or the transfer was cancelled.
    pub finished: bool,
}

struct State {
    outcomes: Vec<Option<std::result::Result<PairReport, Error>>>,
    remaining: usize,
    bytes_done: u64,
    finished_at: Option<Instant>,
    /// Threads blocked on `cv`: completion wakes them only if there are any (a notify is a
    /// futex call even with nobody waiting, and most transfers are not waited on by then).
    waiters: usize,
    /// Run once when the last pair completes ([`Transfer::on_complete`]).
    hooks: Vec<Box<dyn FnOnce() + Send>>,
    /// How a wait ended the transfer before its pairs did (cancelled, or past its bound): what
    /// every later wait returns ([`Transfer::wait_shared`]: the same result each time).
    ended: Option<Error>,
}

/// The poll-driven backends a transfer uses: none or one nearly always, held without an
/// allocation.
#[derive(Default)]
pub(crate) enum Pollers {
    #[default]
    None,
    One(Arc<dyn Backend>),
    Many(Vec<Arc<dyn Backend>>),
}

impl Pollers {
    /// Adds `b` (the caller adds each backend once).
    pub(crate) fn push(&mut self, b: Arc<dyn Backend>) {
        *self = match std::mem::take(self) {
            Pollers::None => Pollers::One(b),
            Pollers::One(a) => Pollers::Many(vec![a, b]),
            Pollers::Many(mut v) => {
                v.push(b);
                Pollers::Many(v)
            }
        };
    }
}

pub(crate) struct TransferShared {
    id: u64,
    posted: Instant,
    deadline: Option<Instant>,
    cancelled: AtomicBool,
    plans: Vec<PlannedPair>,
    state: Mutex<State>,
    cv: Condvar,
    /// Poll-driven backends this transfer uses: waiting progresses them.
    pollers: Pollers,
    /// The request's notification, for the network backend.
    notify: Option<Arc<[u8]>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TransferShared {
    pub(crate) fn new(
        id: u64,
        deadline: Option<Instant>,
        plans: Vec<PlannedPair>,
        pollers: Pollers,
        notify: Option<Vec<u8>>,
    ) -> Arc<Self> {
        let n = plans.len();
        Arc::new(TransferShared {
            id,
            posted: Instant::now(),
            deadline,
            cancelled: AtomicBool::new(false),
            plans,
            state: Mutex::new(State {
                outcomes: vec![None; n],
                remaining: n,
                bytes_done: 0,
                finished_at: if n == 0 { Some(Instant::now()) } else { None },
                waiters: 0,
                hooks: Vec::new(),
                ended: None,
            }),
            cv: Condvar::new(),
            pollers,
            notify: notify.map(Arc::from),
        })
    }

    fn stop_reason(&self) -> Option<Error> {
        if self.cancelled.load(Ordering::Acquire) {
            return Some(Error::Cancelled);
        }
        match self.deadline {
            Some(d) if Instant::now() >= d => Some(Error::DeadlineExceeded),
            _ => None,
        }
    }

    /// Records pair `index`'s outcome; `now` (read once by the caller) ends the transfer when it
    /// is the last pair.
    pub(crate) fn complete(
        &self,
        index: usize,
        result: Result<u64>,
        elapsed: Duration,
        taken: Option<Path>,
        batch: Option<BatchReport>,
        now: Instant,
    ) {
        let plan = &self.plans[index];
        let outcome = result.map(|bytes| PairReport {
            index,
            bytes,
            path: taken.unwrap_or_else(|| plan.path.clone()),
            finding: plan.finding.clone(),
            elapsed,
            batch,
        });
        let mut st = lock(&self.state);
        if !matches!(st.outcomes.get(index), Some(None)) {
            return; // a backend bug must not corrupt the count
        }
        if let Ok(r) = &outcome {
            st.bytes_done += r.bytes;
        }
        st.outcomes[index] = Some(outcome);
        st.remaining -= 1;
        if st.remaining == 0 {
            st.finished_at = Some(now);
            if st.waiters > 0 {
                self.cv.notify_all();
            }
            if !st.hooks.is_empty() {
                let hooks = std::mem::take(&mut st.hooks);
                drop(st);
                for h in hooks {
                    h();
                }
            }
        }
    }

    fn progress_pollers(&self) -> usize {
        match &self.pollers {
            Pollers::None => 0,
            Pollers::One(b) => b.progress(),
            Pollers::Many(v) => v.iter().map(|b| b.progress()).sum(),
        }
    }
}

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
    blocks: Option<BlockJob>,
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
        job: BlockJob,
    ) -> Self {
        let mut item = WorkItem::new(0, op, local, target, shared, guards);
        item.blocks = Some(job);
        item
    }

    /// The block list, for an item of a block transfer (only backends that declare
    /// [`Backend::block_lists`] get such items). Its offsets are relative to the regions of
    /// [`WorkItem::local`] and [`WorkItem::target`]; it moves [`BlockList::bytes`] bytes
    /// (`local().len` is the layout's extent, not that).
    pub fn blocks(&self) -> Option<BlockList<'_>> {
        self.blocks.as_ref().map(BlockJob::list)
    }

    /// The method the block transfer asked for ([`crate::BlockTransfer::method`]), if any.
    pub fn forced_method(&self) -> Option<CopyMethod> {
        self.blocks.as_ref().and_then(BlockJob::method)
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
    pub fn path(&self) -> &Path {
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
    pub fn notification(&self) -> Option<Arc<[u8]>> {
        self.shared.notify.clone()
    }

    /// The id of the transfer this item belongs to (unique within its agent).
    pub fn transfer_id(&self) -> u64 {
        self.shared.id
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
    pub fn complete_on(mut self, result: Result<u64>, taken: Path) {
        self.report(result, Some(taken));
    }

    /// As [`WorkItem::complete`] / [`WorkItem::complete_on`], with the completion instant read
    /// by the caller: a backend completing many pairs at once reads the clock once.
    pub(crate) fn complete_at(mut self, result: Result<u64>, taken: Option<Path>, now: Instant) {
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

    fn report(&mut self, result: Result<u64>, taken: Option<Path>) {
        // One clock read serves the pair's elapsed time and, for the last pair, the
        // transfer's end.
        self.report_at(result, taken, Instant::now());
    }

    fn report_at(&mut self, result: Result<u64>, taken: Option<Path>, now: Instant) {
        self.report_batch_at(result, taken, None, now);
    }

    fn report_batch_at(
        &mut self,
        result: Result<u64>,
        taken: Option<Path>,
        batch: Option<BatchReport>,
        now: Instant,
    ) {
        if let Some(pair) = self.pair.take() {
            drop(pair); // release the regions first
            self.blocks = None; // and give the ids back
            let start = self.started.get().copied().unwrap_or(self.shared.posted);
            self.shared.complete(
                self.index,
                result,
                now.saturating_duration_since(start),
                taken,
                batch,
                now,
            );
        }
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

/// A posted transfer. Dropping it without waiting lets it run to completion in the background
/// (its regions stay alive until the backends are done with them).
pub struct Transfer {
    pub(crate) shared: Arc<TransferShared>,
}

impl fmt::Debug for Transfer {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Transfer")
            .field("id", &self.shared.id)
            .field("status", &self.poll())
            .finish()
    }
}

impl Transfer {
    /// The transfer's id, unique within the agent.
    pub fn id(&self) -> u64 {
        self.shared.id
    }

    /// The path chosen for each pair.
    pub fn plan(&self) -> &[PlannedPair] {
        &self.shared.plans
    }

    /// Non-blocking status; also progresses poll-driven backends once.
    pub fn poll(&self) -> TransferStatus {
        self.shared.progress_pollers();
        let st = lock(&self.shared.state);
        TransferStatus {
            pairs_done: st.outcomes.len() - st.remaining,
            pairs: st.outcomes.len(),
            bytes_done: st.bytes_done,
            finished: st.remaining == 0,
        }
    }

    /// Asks the backends to start no more I/O for this transfer. Pairs not yet started end with
    /// [`Error::Cancelled`]; I/O already in the kernel completes (its memory stays alive).
    pub fn cancel(&self) {
        self.shared.cancelled.store(true, Ordering::Release);
    }

    /// Runs `hook` once every pair has completed (successfully or not; a cancelled transfer's
    /// pairs complete too, as their backends stop): at once on this thread when that has
    /// happened already, else on the thread that completes the last pair — a backend's thread,
    /// or a waiter progressing a poll-driven backend — after the transfer's result is final, so
    /// [`Transfer::wait`] then returns without blocking. The hook must not block (it holds up
    /// that thread's other completions); each hook runs once, in the order they were added.
    ///
    /// For event loops that sleep on a file descriptor: the Python binding's hook writes an
    /// eventfd that asyncio watches (`await transfer`). A transfer on a poll-driven backend
    /// ([`Transfer::needs_progress`]) completes only while something progresses that backend.
    pub fn on_complete(&self, hook: impl FnOnce() + Send + 'static) {
        let mut st = lock(&self.shared.state);
        if st.remaining == 0 {
            drop(st);
            hook();
        } else {
            st.hooks.push(Box::new(hook));
        }
    }

    /// True when the transfer uses a poll-driven backend (the network backend, `ucx`): its
    /// pairs complete only while something progresses that backend — [`Transfer::wait`] and
    /// [`Transfer::poll`] do, and so does a serving agent's thread (`Agent::serve`). A caller
    /// that waits through [`Transfer::on_complete`] alone must then progress it (e.g. with
    /// [`Transfer::wait_shared`] on a thread of its own).
    pub fn needs_progress(&self) -> bool {
        !matches!(self.shared.pollers, Pollers::None)
    }

    /// Waits for every pair, or until the request's deadline (then the transfer is cancelled and
    /// the error is [`Error::DeadlineExceeded`] with the pairs that completed).
    // The error carries every pair's outcome; it is returned once per transfer, so its size
    // does not matter.
    #[allow(clippy::result_large_err)]
    pub fn wait(self) -> std::result::Result<TransferReport, TransferError> {
        self.wait_until(None, None, true)
    }

    /// As [`Transfer::wait`], giving up after `timeout` (or the request's deadline, if earlier)
    /// with [`Error::DeadlineExceeded`].
    // The error carries every pair's outcome; it is returned once per transfer, so its size
    // does not matter.
    #[allow(clippy::result_large_err)]
    pub fn wait_timeout(
        self,
        timeout: Duration,
    ) -> std::result::Result<TransferReport, TransferError> {
        self.wait_until(Some(timeout), None, true)
    }

    /// As [`Transfer::wait_timeout`], and once `stop` is set (by another thread: a signal
    /// handler, a supervisor) the transfer is cancelled ([`Transfer::cancel`]) and the error is
    /// [`Error::Cancelled`]. `stop` is read as often as the wait wakes (every 50 µs while a
    /// poll-driven backend has work, every 100 ms otherwise).
    // The error carries every pair's outcome; it is returned once per transfer, so its size
    // does not matter.
    #[allow(clippy::result_large_err)]
    pub fn wait_unless(
        self,
        stop: &AtomicBool,
        timeout: Duration,
    ) -> std::result::Result<TransferReport, TransferError> {
        self.wait_until(Some(timeout), Some(stop), true)
    }

    /// As [`Transfer::wait`] (`timeout: None`) or [`Transfer::wait_timeout`], without consuming
    /// the transfer: for a transfer shared between threads, one waiting while another may
    /// cancel it (the Python binding's `Transfer`). It may be called again, and after the
    /// transfer ended it returns the same result at once (a transfer a wait ended, cancelled or
    /// past its bound, gives that wait's error every time); the report is cloned.
    // The error carries every pair's outcome, as for `wait`.
    #[allow(clippy::result_large_err)]
    pub fn wait_shared(
        &self,
        timeout: Option<Duration>,
    ) -> std::result::Result<TransferReport, TransferError> {
        self.wait_until(timeout, None, false)
    }

    /// The wait of [`Transfer::wait`], [`Transfer::wait_timeout`] and [`Transfer::wait_unless`]
    /// (`take`: the outcomes are moved out, the transfer being consumed) and of
    /// [`Transfer::wait_shared`] (they are cloned); `stop`, when set, cancels the transfer.
    // The error carries every pair's outcome; it is returned once per transfer, so its size
    // does not matter.
    #[allow(clippy::result_large_err)]
    fn wait_until(
        &self,
        timeout: Option<Duration>,
        stop: Option<&AtomicBool>,
        take: bool,
    ) -> std::result::Result<TransferReport, TransferError> {
        let sh = &self.shared;
        // The bound is the request's deadline or `timeout` from now, whichever is earlier. It
        // is computed when the transfer is first found unfinished: most waits in a stream of
        // small transfers find it done, and need no clock read.
        let mut bound: Option<Option<Instant>> = None;
        // Poll-driven backends need the waiter to progress them: wake often.
        let tick = if matches!(sh.pollers, Pollers::None) {
            Duration::from_millis(100)
        } else {
            Duration::from_micros(50)
        };
        let mut st = lock(&sh.state);
        loop {
            if let Some(e) = st.ended.clone() {
                drop(st);
                return Err(self.failure(e));
            }
            if st.remaining == 0 {
                break;
            }
            if stop.is_some_and(|f| f.load(Ordering::Relaxed)) {
                sh.cancelled.store(true, Ordering::Release);
            }
            if sh.cancelled.load(Ordering::Acquire) {
                st.ended = Some(Error::Cancelled);
                drop(st);
                return Err(self.failure(Error::Cancelled));
            }
            let now = Instant::now();
            let until = *bound.get_or_insert_with(|| {
                // A timeout too far to represent is no bound.
                match (sh.deadline, timeout.and_then(|t| now.checked_add(t))) {
                    (Some(d), Some(t)) => Some(d.min(t)),
                    (d, t) => d.or(t),
                }
            });
            if let Some(u) = until {
                if now >= u {
                    st.ended = Some(Error::DeadlineExceeded);
                    drop(st);
                    self.cancel();
                    return Err(self.failure(Error::DeadlineExceeded));
                }
            }
            if !matches!(sh.pollers, Pollers::None) {
                drop(st);
                let n = sh.progress_pollers();
                st = lock(&sh.state);
                if n > 0 {
                    continue;
                }
            }
            let wait = until.map_or(tick, |u| u.saturating_duration_since(now).min(tick));
            st.waiters += 1;
            st = sh
                .cv
                .wait_timeout(st, wait)
                .unwrap_or_else(|p| p.into_inner())
                .0;
            st.waiters -= 1;
        }
        let finished = st.finished_at.unwrap_or_else(Instant::now);
        let first_err = st.outcomes.iter().find_map(|o| match o {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        });
        if let Some(e) = first_err {
            drop(st);
            return Err(self.failure(e));
        }
        // `wait` consumes the transfer and every pair has reported: the outcomes are no longer
        // read, so they are moved out rather than cloned (`wait_shared` clones them).
        let pairs: Vec<PairReport> = if take {
            std::mem::take(&mut st.outcomes)
                .into_iter()
                .flatten()
                .filter_map(std::result::Result::ok)
                .collect()
        } else {
            st.outcomes
                .iter()
                .flatten()
                .filter_map(|o| o.as_ref().ok().cloned())
                .collect()
        };
        drop(st);
        let bytes = pairs.iter().map(|p| p.bytes).sum();
        Ok(TransferReport {
            pairs,
            bytes,
            elapsed: finished.duration_since(sh.posted),
        })
    }

    fn failure(&self, error: Error) -> TransferError {
        let st = lock(&self.shared.state);
        let outcomes = st
            .outcomes
            .iter()
            .enumerate()
            .map(|(index, o)| match o {
                Some(Ok(r)) => PairOutcome::Done(r.clone()),
                Some(Err(e)) => PairOutcome::Failed {
                    index,
                    error: e.clone(),
                },
                None => PairOutcome::NotDone { index },
            })
            .collect();
        TransferError { error, outcomes }
    }
}
