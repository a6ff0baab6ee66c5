//! Transfer requests, in-flight transfers and their reports.
//!
//! - `request`: [`TransferRequest`], [`Op`], [`PlannedPair`] (the user's side, before posting);
//! - `report`: [`TransferReport`], [`PairReport`], [`TransferError`], [`TransferStatus`];
//! - `shared`: the state a [`Transfer`] and its work items share;
//! - `work_item`: [`WorkItem`], what backends receive (re-exported under `gdpath::backend`).

mod report;
mod request;
mod shared;
mod work_item;

pub use report::{PairOutcome, PairReport, TransferError, TransferReport, TransferStatus};
pub use request::{Op, PlannedPair, TransferRequest};
use shared::lock;
pub(crate) use shared::TransferShared;
pub use work_item::WorkItem;
pub(crate) use work_item::{group_items, BlockSource};

use crate::backend::Backend;
use crate::error::Error;
use std::fmt;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// A posted transfer. Dropping it without waiting lets it run to completion in the background
/// (its regions stay alive until the backends are done with them).
pub struct Transfer {
    pub(crate) shared: Arc<TransferShared>,
    /// Poll-driven backends this transfer uses: waiting progresses them.
    pub(crate) pollers: Pollers,
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

    /// Progresses each backend once; returns how many completions they reported.
    pub(crate) fn progress(&self) -> usize {
        match self {
            Pollers::None => 0,
            Pollers::One(b) => b.progress(),
            Pollers::Many(v) => v.iter().map(|b| b.progress()).sum(),
        }
    }
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
        self.pollers.progress();
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
        !matches!(self.pollers, Pollers::None)
    }

    /// Waits for every pair, or until the request's deadline (then the transfer is cancelled and
    /// the error is [`Error::DeadlineExceeded`] with the pairs that completed).
    // The error carries every pair's outcome; it is returned once per transfer, so its size
    // does not matter.
    #[allow(clippy::result_large_err)]
    pub fn wait(self) -> std::result::Result<TransferReport, TransferError> {
        self.wait_until(None, None, true, None)
            .and_then(|r| self.unpaused(r))
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
        self.wait_until(Some(timeout), None, true, None)
            .and_then(|r| self.unpaused(r))
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
        self.wait_until(Some(timeout), Some(stop), true, None)
            .and_then(|r| self.unpaused(r))
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
        self.wait_until(timeout, None, false, None)
            .and_then(|r| self.unpaused(r))
    }

    /// As [`Transfer::wait_shared`] without a timeout, returning `Ok(None)` when the transfer
    /// is still running after `pause`. Unlike a timeout, a pause that passes ends nothing: a
    /// waiter that must look up now and then (the Python binding, for Ctrl-C) waits in such
    /// slices. The request's deadline still ends the transfer with [`Error::DeadlineExceeded`].
    // The error carries every pair's outcome, as for `wait`.
    #[allow(clippy::result_large_err)]
    pub fn wait_shared_for(
        &self,
        pause: Duration,
    ) -> std::result::Result<Option<TransferReport>, TransferError> {
        self.wait_until(None, None, false, Instant::now().checked_add(pause))
    }

    /// The report of a wait given no pause (which never returns `Ok(None)`).
    #[allow(clippy::result_large_err)]
    fn unpaused(
        &self,
        r: Option<TransferReport>,
    ) -> std::result::Result<TransferReport, TransferError> {
        r.ok_or_else(|| {
            self.failure(Error::Backend {
                backend: "engine",
                detail: "a wait without a pause paused".into(),
            })
        })
    }

    /// The wait of [`Transfer::wait`], [`Transfer::wait_timeout`] and [`Transfer::wait_unless`]
    /// (`take`: the outcomes are moved out, the transfer being consumed) and of
    /// [`Transfer::wait_shared`] (they are cloned); `stop`, when set, cancels the transfer;
    /// `Ok(None)` once `pause` passes with the transfer still running, which goes on.
    // The error carries every pair's outcome; it is returned once per transfer, so its size
    // does not matter.
    #[allow(clippy::result_large_err)]
    fn wait_until(
        &self,
        timeout: Option<Duration>,
        stop: Option<&AtomicBool>,
        take: bool,
        pause: Option<Instant>,
    ) -> std::result::Result<Option<TransferReport>, TransferError> {
        let sh = &self.shared;
        // The bound is the request's deadline or `timeout` from now, whichever is earlier. It
        // is computed when the transfer is first found unfinished: most waits in a stream of
        // small transfers find it done, and need no clock read.
        let mut bound: Option<Option<Instant>> = None;
        // Poll-driven backends need the waiter to progress them: wake often.
        let tick = if matches!(self.pollers, Pollers::None) {
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
            if pause.is_some_and(|p| now >= p) {
                return Ok(None);
            }
            if !matches!(self.pollers, Pollers::None) {
                drop(st);
                let n = self.pollers.progress();
                st = lock(&sh.state);
                if n > 0 {
                    continue;
                }
            }
            let wait = until
                .into_iter()
                .chain(pause)
                .map(|u| u.saturating_duration_since(now))
                .fold(tick, Duration::min);
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
        Ok(Some(TransferReport {
            pairs,
            bytes,
            elapsed: finished.duration_since(sh.posted),
        }))
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
