//! The engine's metrics ([`gdpath::metrics`]) in the Prometheus text format, and a small HTTP
//! endpoint that serves them (`gdpath serve --metrics ADDR`).
//!
//! The engine keeps its metrics in atomics and knows no exposition format, so that its build
//! stays lean; this crate encodes a [`gdpath::metrics::snapshot`] with `prometheus-client` (the
//! Prometheus project's Rust client) as a [`Collector`], which a program with a
//! `prometheus-client` registry of its own can register beside its metrics
//! ([`EngineCollector`]). docs/metrics.md names every metric, its labels and units.

#![forbid(unsafe_code)]

mod http;

pub use http::{MetricsServer, MAX_CONNECTIONS, MAX_REQUEST_BYTES, REQUEST_TIMEOUT};

use gdpath::metrics::{snapshot, Kind, Value};
use prometheus_client::collector::Collector;
use prometheus_client::encoding::{DescriptorEncoder, NoLabelSet};
use prometheus_client::metrics::MetricType;
use prometheus_client::registry::Registry;

/// The media type of [`text`]: the Prometheus text exposition format 0.0.4.
pub const CONTENT_TYPE: &str = "text/plain; version=0.0.4; charset=utf-8";

/// Why metrics could not be exposed.
#[derive(Debug, thiserror::Error)]
pub enum MetricsError {
    /// The endpoint's address could not be bound (in use, not this host's, no permission).
    #[error("cannot listen for metrics on {addr}: {source}")]
    Bind {
        /// The address asked for.
        addr: std::net::SocketAddr,
        /// The system's error.
        source: std::io::Error,
    },
    /// The encoder failed (it writes into a `String`; a failure is a bug of the encoder).
    #[error("encoding the metrics failed")]
    Encode,
}

/// The engine's metrics as a `prometheus-client` collector: every scrape takes a fresh
/// snapshot.
#[derive(Debug, Default, Clone, Copy)]
pub struct EngineCollector;

impl Collector for EngineCollector {
    fn encode(&self, mut encoder: DescriptorEncoder) -> Result<(), std::fmt::Error> {
        for family in snapshot() {
            let ty = match family.kind {
                Kind::Counter => MetricType::Counter,
                Kind::Gauge => MetricType::Gauge,
                Kind::Histogram => MetricType::Histogram,
            };
            let mut metric = encoder.encode_descriptor(family.name, family.help, None, ty)?;
            for sample in &family.samples {
                let labels: Vec<(&str, &str)> = sample
                    .labels
                    .iter()
                    .map(|(k, v)| (*k, v.as_str()))
                    .collect();
                let mut series = metric.encode_family(&labels)?;
                match &sample.value {
                    Value::Counter(v) => series.encode_counter::<NoLabelSet, _, u64>(v, None)?,
                    Value::Gauge(v) => series.encode_gauge(v)?,
                    Value::Histogram {
                        sum,
                        count,
                        buckets,
                    } => series.encode_histogram::<NoLabelSet>(*sum, *count, buckets, None)?,
                }
            }
        }
        Ok(())
    }
}

/// A registry holding the engine's collector alone.
pub fn registry() -> Registry {
    let mut r = Registry::default();
    r.register_collector(Box::new(EngineCollector));
    r
}

/// The engine's metrics now, in the Prometheus text format 0.0.4 ([`CONTENT_TYPE`]); empty when
/// `GDPATH_METRICS=0` turned them off. Errors:
/// [`MetricsError::Encode`].
pub fn text() -> Result<String, MetricsError> {
    let mut out = String::new();
    prometheus_client::encoding::prometheus_text::encode(&mut out, &registry())
        .map_err(|_| MetricsError::Encode)?;
    Ok(out)
}
