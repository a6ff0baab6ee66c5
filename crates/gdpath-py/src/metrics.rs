//! `gdpath.metrics.text()`: the engine's metrics in the Prometheus text format, from the
//! encoder `gdpath serve --metrics` serves (`gdpath_metrics::text`), so the two agree.

use pyo3::exceptions::PyRuntimeError;
use pyo3::prelude::*;

/// The engine's metrics of this process in the Prometheus text exposition format 0.0.4 (names,
/// labels and units: docs/metrics.md). Errors: `RuntimeError` if the encoder fails (a bug).
#[pyfunction]
pub fn metrics_text(py: Python<'_>) -> PyResult<String> {
    py.detach(gdpath_metrics::text)
        .map_err(|e| PyRuntimeError::new_err(e.to_string()))
}
