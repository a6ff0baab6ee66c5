//! The state one transfer's handle and its work items share: outcomes, waiters, completion
//! hooks, the poll-driven backends to progress while waiting.

use super::{PairReport, PlannedPair};
use crate::blocks::BatchReport;
use crate::error::{Error, Result};
use crate::path::DataPath;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

pub(super) struct State {
    pub(super) outcomes: Vec<Option<std::result::Result<PairReport, Error>>>,
    pub(super) remaining: usize,
    pub(super) bytes_done: u64,
    pub(super) finished_at: Option<Instant>,
    /// Threads blocked on `cv`: completion wakes them only if there are any (a notify is a
    /// futex call even with nobody waiting, and most transfers are not waited on by then).
    pub(super) waiters: usize,
    /// Run once when the last pair completes ([`Transfer::on_complete`]).
    pub(super) hooks: Vec<Box<dyn FnOnce() + Send>>,
    /// How a wait ended the transfer before its pairs did (cancelled, or past its bound): what
    /// every later wait returns ([`Transfer::wait_shared`]: the same result each time).
    pub(super) ended: Option<Error>,
}

pub(crate) struct TransferShared {
    pub(super) id: u64,
    pub(super) posted: Instant,
    pub(super) deadline: Option<Instant>,
    pub(super) cancelled: AtomicBool,
    pub(super) plans: Vec<PlannedPair>,
    pub(super) state: Mutex<State>,
    pub(super) cv: Condvar,
    /// The request's notification, for the network backend.
    pub(super) notify: Option<Arc<[u8]>>,
    /// The transfer as a `tracing` span (disabled unless a subscriber wants it): its post,
    /// its pairs' copies and its completion are recorded under it.
    pub(crate) span: tracing::Span,
    /// The transfer as an NVTX range (`GDPATH_NVTX=1`), ended by its last pair.
    nvtx: Mutex<Option<gdpath_cuda::nvtx::Range>>,
}

pub(super) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl TransferShared {
    pub(crate) fn new(
        id: u64,
        deadline: Option<Instant>,
        plans: Vec<PlannedPair>,
        notify: Option<Vec<u8>>,
    ) -> Arc<Self> {
        let n = plans.len();
        if n > 0 {
            crate::metrics::transfer_started();
        }
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
            notify: notify.map(Arc::from),
            span: tracing::debug_span!("transfer", id, pairs = n),
            nvtx: Mutex::new(
                gdpath_cuda::nvtx::get().map(|t| t.start(&format!("gdpath transfer {id}"))),
            ),
        })
    }

    pub(super) fn stop_reason(&self) -> Option<Error> {
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
        taken: Option<DataPath>,
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
        match &outcome {
            Ok(r) => {
                tracing::trace!(parent: &self.span, pair = index, path = %r.path, bytes = r.bytes, elapsed_us = r.elapsed.as_micros(), "copy")
            }
            Err(e) => tracing::debug!(parent: &self.span, pair = index, error = %e, "copy failed"),
        }
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
            crate::metrics::transfer_ended(now.saturating_duration_since(self.posted));
            tracing::debug!(parent: &self.span, bytes = st.bytes_done, elapsed_us = now.saturating_duration_since(self.posted).as_micros(), "completion");
            if let (Some(t), Some(r)) = (gdpath_cuda::nvtx::get(), lock(&self.nvtx).take()) {
                t.end(r);
            }
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
}
