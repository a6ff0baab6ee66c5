//! The one way this crate takes a lock.

use std::sync::{Mutex, MutexGuard};

/// Locks `m`, also after a thread panicked while holding it: a panic cannot leave UCX's state,
/// or the queues and lists this crate guards (each changed by one push, pop or swap),
/// half-changed from Rust's view.
pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}
