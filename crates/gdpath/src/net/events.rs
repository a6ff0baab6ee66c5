//! A serving agent's [`NetEvent`]s as log lines at a bounded rate: what `gdpath serve` prints.
//!
//! Anyone who reaches a server's port can make it refuse connections, or lose them in their
//! handshake, as fast as it can connect (docs/network.md, "What keeps an unauthenticated client
//! from the server"), so a log that wrote a line per event would grow without bound.
//! [`EventLog`] lets through one line per [`EventKind`] of those and per interval, and counts
//! the rest; events only an authenticated peer causes (connected, left) always pass.

use super::{EventKind, NetEvent};
use crate::ratelimit::{RateLimit, EVERY};
use std::time::{Duration, Instant};

/// Decides which of a serving agent's events a log writes: every event of a kind that is not
/// rate-limited ([`EventKind::is_rate_limited`]), and of the others one per kind and
/// [`EventLog::interval`], counting those left out. Thread-safe.
///
/// ```
/// use gdpath::net::{EventLog, NetEvent};
/// let log = EventLog::default();
/// let refused = NetEvent::Refused { addr: None, reason: "bad magic".into() };
/// assert_eq!(log.admit(&refused), Some(0)); // written
/// assert_eq!(log.admit(&refused), None); // left out and counted
/// // At the end (or, with `overdue`, once the interval is over): one line with the count.
/// assert_eq!(log.left_out(), vec![(refused.kind(), 1)]);
/// ```
#[derive(Debug, Default)]
pub struct EventLog {
    limit: RateLimit,
}

impl EventLog {
    /// The shortest time between two lines of one rate-limited kind.
    pub fn interval(&self) -> Duration {
        EVERY
    }

    /// Whether to write `e` now: `Some(n)`, `n` being how many events of its kind were left
    /// out since the last one written (write it with that count when `n > 0`), or `None`: an
    /// event of its kind was written less than [`EventLog::interval`] ago, and this one is
    /// counted instead.
    pub fn admit(&self, e: &NetEvent) -> Option<u64> {
        self.admit_at(e.kind(), Instant::now())
    }

    fn admit_at(&self, kind: EventKind, now: Instant) -> Option<u64> {
        if !kind.is_rate_limited() {
            return Some(0);
        }
        self.limit.admit(kind.as_str(), now)
    }

    /// The kinds with events left out whose last line is at least [`EventLog::interval`] old,
    /// each with its count: write one line each now (it counts as the kind's line), so that
    /// a count is told within about an interval even when the flood has stopped. Call it
    /// regularly (`gdpath serve` does at least every 100 ms).
    pub fn overdue(&self) -> Vec<(EventKind, u64)> {
        kinds(self.limit.overdue(Instant::now()))
    }

    /// Every kind with events left out, with its count, whatever their age: for the end of
    /// the log.
    pub fn left_out(&self) -> Vec<(EventKind, u64)> {
        kinds(self.limit.left_out())
    }
}

fn kinds(counts: Vec<(&'static str, u64)>) -> Vec<(EventKind, u64)> {
    let mut out: Vec<(EventKind, u64)> = counts
        .into_iter()
        .filter_map(|(k, n)| Some((EventKind::from_name(k)?, n)))
        .collect();
    out.sort_unstable();
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_flood_of_refusals_and_losses_is_one_line_per_kind_and_authenticated_events_all_pass() {
        let log = EventLog::default();
        let refused = NetEvent::Refused {
            addr: None,
            reason: "bad magic".into(),
        };
        let connected = NetEvent::Connected { peer: "a@b".into() };
        let t0 = Instant::now();
        for i in 0..1000 {
            let at = t0 + Duration::from_millis(i);
            let first = i == 0;
            assert_eq!(log.admit_at(refused.kind(), at).is_some(), first);
            assert_eq!(
                log.admit_at(EventKind::LostInHandshake, at).is_some(),
                first
            );
            assert_eq!(log.admit_at(connected.kind(), at), Some(0));
        }
        // An authenticated peer lost is a kind of its own (`NetEvent::kind`): the flood does not
        // hide it.
        assert_eq!(log.admit_at(EventKind::Lost, t0), Some(0));
        assert_eq!(
            log.admit_at(EventKind::Refused, t0 + EVERY),
            Some(999),
            "the next line says how many were left out"
        );
        assert_eq!(log.left_out(), vec![(EventKind::LostInHandshake, 999)]);
    }
}
