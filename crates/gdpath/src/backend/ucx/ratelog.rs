//! Warnings of the UCX backend that can repeat (a failing accept, a flood of garbage, refused
//! connections), logged through [`crate::ratelimit`]: once per kind and
//! [`crate::ratelimit::EVERY`], with how many were left out since.

use crate::ratelimit::{RateLimit, EVERY};
use std::time::Instant;

/// The backend's rate-limited warnings.
#[derive(Debug, Default)]
pub(crate) struct RateLog {
    limit: RateLimit,
}

impl RateLog {
    /// Logs `message()` as a warning of `kind`, unless one of that kind was logged within
    /// [`EVERY`]; it is then counted, and the next line says how many were left out.
    pub(crate) fn warn(&self, kind: &'static str, message: impl FnOnce() -> String) {
        if let Some(left_out) = self.limit.admit(kind, Instant::now()) {
            let m = message();
            if left_out > 0 {
                tracing::warn!("{m} ({left_out} more like it left out in the last {EVERY:?})");
            } else {
                tracing::warn!("{m}");
            }
        }
    }
}
