//! Warnings that can repeat (a failing accept, a flood of garbage, refused connections) logged
//! once per [`EVERY`] and kind, with how many were left out since: a peer, or a limit the
//! process hit, cannot make the log grow without bound (a server at its file-descriptor limit
//! fails `accept` in a tight loop and can write gigabytes of "accept() failed" in a minute).

use super::lock;
use std::collections::HashMap;
use std::sync::Mutex;
use std::time::{Duration, Instant};

/// Shortest time between two lines of one kind.
pub(crate) const EVERY: Duration = Duration::from_secs(10);

/// Per kind: when its last line was written, and how many were left out since.
#[derive(Debug, Default)]
pub(crate) struct RateLog {
    kinds: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

impl RateLog {
    /// Logs `message()` as a warning of `kind`, unless one of that kind was logged within
    /// [`EVERY`]; it is then counted, and the next line says how many were left out.
    pub(crate) fn warn(&self, kind: &'static str, message: impl FnOnce() -> String) {
        if let Some(left_out) = self.admit(kind, Instant::now()) {
            let m = message();
            if left_out > 0 {
                tracing::warn!("{m} ({left_out} more like it left out in the last {EVERY:?})");
            } else {
                tracing::warn!("{m}");
            }
        }
    }

    /// Whether a line of `kind` may be written at `now`, and how many were left out before it.
    fn admit(&self, kind: &'static str, now: Instant) -> Option<u64> {
        let mut k = lock(&self.kinds);
        match k.get_mut(kind) {
            Some((last, n)) if now.duration_since(*last) < EVERY => {
                *n += 1;
                None
            }
            Some((last, n)) => {
                *last = now;
                Some(std::mem::take(n))
            }
            None => {
                k.insert(kind, (now, 0));
                Some(0)
            }
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeating_kind_is_written_once_per_period_with_a_count() {
        let r = RateLog::default();
        let t0 = Instant::now();
        assert_eq!(r.admit("accept", t0), Some(0));
        for i in 1..=1000 {
            assert_eq!(r.admit("accept", t0 + Duration::from_millis(i)), None);
        }
        // Another kind is not held back by the first.
        assert_eq!(r.admit("garbage", t0), Some(0));
        assert_eq!(r.admit("accept", t0 + EVERY), Some(1000));
        assert_eq!(
            r.admit("accept", t0 + EVERY + Duration::from_millis(1)),
            None
        );
    }
}
