//! The `gdpath.bench/1` document ([`BENCH_SCHEMA`]) every `gdpath bench … --json` prints and
//! `gdpath report --from` reads: the fields every bench has (command line, start time, units,
//! findings, notes), the bench's own fields, and its rows.

use crate::BENCH_SCHEMA;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::time::SystemTime;

/// A bench result document with rows of type `R` ([`crate::BenchRow`] for most benches).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct BenchDocument<R> {
    /// [`BENCH_SCHEMA`].
    pub schema: String,
    /// The bench: `bench storage`, `bench p2p`, `bench net`, ...
    pub command: String,
    /// The command line that made it, program name first (empty when not recorded).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub argv: Vec<String>,
    /// When the bench started, seconds since the Unix epoch.
    pub started_unix_s: u64,
    /// The unit of each measured field (`gbps`: `1e9 bytes/s`, `latency`: `us`, ...).
    pub units: BTreeMap<String, String>,
    /// Finding ids the bench met (a fallback path, a refused O_DIRECT, ...).
    #[serde(default)]
    pub findings: Vec<String>,
    /// Sentences the bench adds to its rows (sizes skipped, settings adjusted).
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub notes: Vec<String>,
    /// What only this bench says (`file`, `peer`, `chosen`, `skipped`, ...).
    #[serde(flatten)]
    pub extra: serde_json::Map<String, serde_json::Value>,
    /// The measured rows, one per configuration.
    pub rows: Vec<R>,
}

impl<R> BenchDocument<R> {
    /// A document of `rows` from the bench `command`, started at `started`, made by the
    /// command line `argv`, with the units every bench uses (GB/s = 1e9 B/s, µs, bytes).
    pub fn new(command: &str, argv: Vec<String>, started: SystemTime, rows: Vec<R>) -> Self {
        let units = [
            ("gbps", "1e9 bytes/s"),
            ("latency", "us"),
            ("bytes", "bytes"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_owned(), v.to_owned()))
        .collect();
        BenchDocument {
            schema: BENCH_SCHEMA.to_owned(),
            command: command.to_owned(),
            argv,
            started_unix_s: started
                .duration_since(SystemTime::UNIX_EPOCH)
                .map_or(0, |d| d.as_secs()),
            units,
            findings: Vec::new(),
            notes: Vec::new(),
            extra: serde_json::Map::new(),
            rows,
        }
    }

    /// The unit of the field `key` (replacing any given before).
    pub fn unit(mut self, key: &str, unit: &str) -> Self {
        self.units.insert(key.to_owned(), unit.to_owned());
        self
    }

    /// The finding ids the bench met, as they print.
    pub fn findings<T: ToString>(mut self, findings: &[T]) -> Self {
        self.findings = findings.iter().map(ToString::to_string).collect();
        self
    }

    /// The bench's notes.
    pub fn notes(mut self, notes: &[String]) -> Self {
        self.notes = notes.to_vec();
        self
    }

    /// A field of this bench's own. Errors: `value` does not serialize.
    pub fn with(mut self, key: &str, value: impl Serialize) -> serde_json::Result<Self> {
        self.extra
            .insert(key.to_owned(), serde_json::to_value(value)?);
        Ok(self)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_document_round_trips_with_its_own_fields_beside_the_common_ones() {
        let t = SystemTime::UNIX_EPOCH + std::time::Duration::from_secs(1_796_000_000);
        let d = BenchDocument::new("bench storage", vec!["gdpath".into()], t, vec![1u32, 2])
            .unit("qd", "threads")
            .findings(&["storage.odirect-disabled"])
            .with("file", "/tmp/f")
            .unwrap();
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["schema"], BENCH_SCHEMA);
        assert_eq!(v["file"], "/tmp/f");
        assert_eq!(v["units"]["gbps"], "1e9 bytes/s");
        assert_eq!(v["units"]["qd"], "threads");
        assert_eq!(v["started_unix_s"], 1_796_000_000u64);
        assert!(v.get("notes").is_none(), "empty notes are left out: {v}");
        let back: BenchDocument<u32> = serde_json::from_value(v).unwrap();
        assert_eq!(back, d);
    }
}
