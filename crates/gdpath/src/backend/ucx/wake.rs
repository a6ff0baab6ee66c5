//! Blocking idle waits of a serving agent's progress thread on UCX's event fd
//! (`ucp_worker_arm` + `poll` on `ucp_worker_get_efd`, context feature `UCP_FEATURE_WAKEUP`).
//!
//! A serving thread that polls while idle costs CPU for nothing (docs/benchmarks.md,
//! "Measurements behind the defaults", `UCP_FEATURE_WAKEUP`). UCX raises the fd for network
//! events (data, connection requests, endpoint errors: it signals it itself from its async
//! paths), but not for work that *this* process posts from another thread (a control message
//! sent by `unexport`, a put posted by an application thread of the same agent): such posts
//! [`Wakeup::kick`] the sleeper. The race between a post and the sleeper's decision to block
//! is closed by a post counter read before the last progress round (Dekker-style: the poster
//! publishes the post and then reads `sleeping`; the sleeper publishes `sleeping` and then
//! re-reads the counter; one of them sees the other).

use gdpath_ucx::Worker;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::time::Duration;

/// Shared between the serving thread (the only sleeper) and the threads that post work.
#[derive(Debug, Default)]
pub(crate) struct Wakeup {
    /// True while the serving thread is blocked (or about to block) on the event fd.
    sleeping: AtomicBool,
    /// Posts so far.
    posted: AtomicU64,
}

impl Wakeup {
    /// The post counter, read by the sleeper *before* its last progress round.
    pub(crate) fn seen(&self) -> u64 {
        self.posted.load(Ordering::SeqCst)
    }

    /// Records a post and wakes the sleeper if there is one (`ucp_worker_signal`: a write to
    /// UCX's internal eventfd, ≈ 1 µs; only paid while the serving thread sleeps).
    pub(crate) fn kick(&self, worker: &Worker) {
        self.posted.fetch_add(1, Ordering::SeqCst);
        if self.sleeping.load(Ordering::SeqCst) {
            if let Err(e) = worker.signal() {
                tracing::debug!("ucp_worker_signal failed: {e}");
            }
        }
    }

    /// Blocks until UCX has an event for `worker`, something was posted since `seen`, or
    /// `timeout` passes. Call only after a progress round that found nothing to do. Returns
    /// false when blocking is not possible (the context lacks `UCP_FEATURE_WAKEUP`, or UCX
    /// refused to arm): the caller then sleeps briefly instead.
    pub(crate) fn sleep(&self, worker: &Worker, seen: u64, timeout: Duration) -> bool {
        self.sleeping.store(true, Ordering::SeqCst);
        let ok = if self.posted.load(Ordering::SeqCst) != seen {
            true // work was posted meanwhile: progress again at once
        } else {
            match worker.wait(timeout) {
                Ok(_) => true,
                Err(e) => {
                    tracing::debug!("cannot block on the UCX worker: {e}");
                    false
                }
            }
        };
        self.sleeping.store(false, Ordering::SeqCst);
        ok
    }
}
