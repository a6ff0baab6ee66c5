//! Lines that can repeat without bound (a failing accept, a flood of garbage connections, a
//! peer dying in a loop) written once per interval and kind, with how many were left out
//! since: a peer, or a limit the process hit, cannot make a log grow without bound (a server
//! at its file-descriptor limit fails `accept` in a tight loop and can write gigabytes of
//! "accept() failed" in a minute; a local client looping on garbage connections made `gdpath
//! serve` write one line each).

use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// Shortest time between two lines of one kind.
pub(crate) const EVERY: Duration = Duration::from_secs(10);

/// Per kind: when its last line was written, and how many were left out since.
#[derive(Debug, Default)]
pub(crate) struct RateLimit {
    kinds: Mutex<HashMap<&'static str, (Instant, u64)>>,
}

impl RateLimit {
    fn kinds(&self) -> MutexGuard<'_, HashMap<&'static str, (Instant, u64)>> {
        // The map is changed by single inserts and counter updates: a panic elsewhere leaves
        // it whole.
        self.kinds.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Whether a line of `kind` may be written at `now`: `Some(n)`, `n` being how many lines
    /// of that kind were left out since the last one written, or `None` when one was written
    /// less than [`EVERY`] ago (this one is then counted).
    pub(crate) fn admit(&self, kind: &'static str, now: Instant) -> Option<u64> {
        let mut k = self.kinds();
        match k.get_mut(kind) {
            Some((last, n)) if now.saturating_duration_since(*last) < EVERY => {
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

    /// The kinds with lines left out whose last line is at least [`EVERY`] old at `now`, each
    /// with its count (in kind order): a line saying so, written now, counts as the kind's
    /// line, so that a count is told within about [`EVERY`] even when no line of its kind
    /// follows.
    pub(crate) fn overdue(&self, now: Instant) -> Vec<(&'static str, u64)> {
        self.take(|last| now.saturating_duration_since(last) >= EVERY, now)
    }

    /// Every kind with lines left out, with its count (in kind order), whatever their age: for
    /// the end of the log.
    pub(crate) fn left_out(&self) -> Vec<(&'static str, u64)> {
        self.take(|_| true, Instant::now())
    }

    fn take(&self, due: impl Fn(Instant) -> bool, now: Instant) -> Vec<(&'static str, u64)> {
        let mut out: Vec<(&'static str, u64)> = self
            .kinds()
            .iter_mut()
            .filter(|(_, (last, n))| *n > 0 && due(*last))
            .map(|(kind, (last, n))| {
                *last = now;
                (*kind, std::mem::take(n))
            })
            .collect();
        out.sort_unstable();
        out
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_repeating_kind_is_written_once_per_period_with_a_count() {
        let r = RateLimit::default();
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

    #[test]
    fn counts_left_out_are_told_once_their_period_is_over() {
        let r = RateLimit::default();
        let t0 = Instant::now();
        assert_eq!(r.admit("refused", t0), Some(0));
        assert_eq!(r.admit("lost", t0), Some(0));
        for i in 1..=5 {
            assert_eq!(r.admit("refused", t0 + Duration::from_millis(i)), None);
        }
        // Nothing is due before the period is over, and a kind with nothing left out never is.
        assert!(r.overdue(t0 + EVERY - Duration::from_millis(1)).is_empty());
        assert_eq!(r.overdue(t0 + EVERY), vec![("refused", 5)]);
        // The summary counts as the kind's line: the next one waits a period again.
        assert!(r.overdue(t0 + EVERY * 3).is_empty());
        assert_eq!(
            r.admit("refused", t0 + EVERY + Duration::from_secs(1)),
            None
        );
        assert_eq!(r.left_out(), vec![("refused", 1)]);
        assert!(r.left_out().is_empty());
    }
}
