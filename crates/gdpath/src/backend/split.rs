//! A work item split into parts (chunks) that complete independently.

use crate::error::{Error, Result};
use crate::transfer::WorkItem;
use std::sync::atomic::{AtomicU64, AtomicUsize, Ordering};
use std::sync::{Arc, Mutex};

/// Completes its [`WorkItem`] when the last of `parts` parts is done: with the sum of the parts'
/// byte counts, or with the first error reported (by time). Cheap to share between the threads
/// that run the parts.
pub struct SplitItem {
    item: Mutex<Option<WorkItem>>,
    remaining: AtomicUsize,
    bytes: AtomicU64,
    error: Mutex<Option<Error>>,
}

impl SplitItem {
    /// Wraps `item`, which will be done in `parts` parts (`parts` = 0 completes it at once with
    /// 0 bytes).
    pub fn new(item: WorkItem, parts: usize) -> Arc<Self> {
        let s = Arc::new(SplitItem {
            item: Mutex::new(Some(item)),
            remaining: AtomicUsize::new(parts),
            bytes: AtomicU64::new(0),
            error: Mutex::new(None),
        });
        if parts == 0 {
            s.finish();
        }
        s
    }

    /// Runs `f` on the item while it has not completed.
    pub fn with_item<R>(&self, f: impl FnOnce(&WorkItem) -> R) -> Option<R> {
        self.item
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .as_ref()
            .map(f)
    }

    /// True once an error was reported: later parts need not start.
    pub fn failed(&self) -> bool {
        self.error
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
    }

    /// Reports one part.
    pub fn part_done(&self, result: Result<u64>) {
        match result {
            Ok(n) => {
                self.bytes.fetch_add(n, Ordering::Relaxed);
            }
            Err(e) => {
                self.error
                    .lock()
                    .unwrap_or_else(|p| p.into_inner())
                    .get_or_insert(e);
            }
        }
        if self.remaining.fetch_sub(1, Ordering::AcqRel) == 1 {
            self.finish();
        }
    }

    fn finish(&self) {
        let item = self.item.lock().unwrap_or_else(|p| p.into_inner()).take();
        if let Some(item) = item {
            let err = self.error.lock().unwrap_or_else(|p| p.into_inner()).take();
            item.complete(match err {
                Some(e) => Err(e),
                None => Ok(self.bytes.load(Ordering::Relaxed)),
            });
        }
    }
}
