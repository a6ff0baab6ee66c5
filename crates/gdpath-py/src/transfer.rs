//! Posted transfers and their reports. `Transfer` shares the engine's transfer between the
//! Python object, waiters (which release the GIL) and the asyncio machinery: completion is
//! signalled through [`crate::waker::Waker`] from the engine's completion hook
//! ([`gdpath::Transfer::on_complete`]), so `await transfer` never polls.

use crate::error::{details_of, finding_of, raise};
use crate::waker::{Inner as WakerInner, Waker};
use gdpath::{PairOutcome, TransferError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyList};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// One descriptor pair's result: `index`, `bytes`, the `path` that moved it (`posix-direct`,
/// `h2d-pinned`, `ucx:tcp`, ...), the `finding` id that says why it was not the preferred path
/// (`None` when it was), `elapsed` seconds from its first I/O to its last completion, and
/// `batch`: how a backend that posts many descriptors at once moved them (a block transfer's
/// one pair: a `gdpath.BatchReport` naming the copy method), `None` for a pair moved alone.
#[pyclass(module = "gdpath._native", name = "PairReport", frozen, get_all)]
pub struct PairReport {
    pub index: usize,
    pub bytes: u64,
    pub path: String,
    pub finding: Option<String>,
    pub elapsed: f64,
    pub batch: Option<BatchReport>,
}

impl From<&gdpath::PairReport> for PairReport {
    fn from(p: &gdpath::PairReport) -> Self {
        PairReport {
            index: p.index,
            bytes: p.bytes,
            path: p.path.name(),
            finding: p.finding.as_ref().map(|f| f.as_str().to_owned()),
            elapsed: p.elapsed.as_secs_f64(),
            batch: p.batch.as_ref().map(BatchReport::from),
        }
    }
}

#[pymethods]
impl PairReport {
    fn __repr__(&self) -> String {
        format!(
            "PairReport(index={}, bytes={}, path={:?}, finding={}, elapsed={:.6}{})",
            self.index,
            self.bytes,
            self.path,
            crate::error::opt_repr(self.finding.as_deref()),
            self.elapsed,
            match &self.batch {
                Some(b) => format!(", method={:?}", b.method),
                None => String::new(),
            }
        )
    }
}

/// How a backend posted a batch of descriptors (a block transfer's one pair,
/// `report.pairs[0].batch`): `method` (`"copies"`: one copy call per merged descriptor,
/// `"driver-batch"`: `cuMemcpyBatchAsync`, `"kernel"`: one launch of gdpath's gather/scatter
/// kernel), `descriptors` as given (ids × layers × K/V planes), `coalesced` after merging
/// descriptors that continue each other, `posted` (the calls, driver copies or kernel pieces
/// the method ran), `post_ns` (CPU time spent posting, ns, not counting the copy).
#[pyclass(
    module = "gdpath._native",
    name = "BatchReport",
    frozen,
    get_all,
    from_py_object
)]
#[derive(Clone)]
pub struct BatchReport {
    pub method: String,
    pub descriptors: u64,
    pub coalesced: u64,
    pub posted: u64,
    pub post_ns: u64,
}

impl From<&gdpath::BatchReport> for BatchReport {
    fn from(b: &gdpath::BatchReport) -> Self {
        BatchReport {
            method: b.method.name().to_owned(),
            descriptors: b.descriptors,
            coalesced: b.coalesced,
            posted: b.posted,
            post_ns: b.post_ns,
        }
    }
}

#[pymethods]
impl BatchReport {
    /// CPU posting time per descriptor as given, µs (`post_ns / descriptors / 1000`).
    #[getter]
    fn post_us_per_descriptor(&self) -> f64 {
        self.post_ns as f64 / self.descriptors.max(1) as f64 / 1e3
    }

    fn __repr__(&self) -> String {
        format!(
            "BatchReport(method={:?}, descriptors={}, coalesced={}, posted={}, post_ns={})",
            self.method, self.descriptors, self.coalesced, self.posted, self.post_ns
        )
    }
}

/// A completed transfer: `bytes` moved, `elapsed` seconds from post to the last completion,
/// `pairs` (one [`PairReport`] per descriptor pair, in request order), `paths` (the distinct
/// paths in first-use order) and `gbps` (bytes / elapsed in GB/s, 1e9 B/s).
#[pyclass(module = "gdpath._native", name = "TransferReport", frozen, get_all)]
pub struct TransferReport {
    pub bytes: u64,
    pub elapsed: f64,
    pub gbps: f64,
    pub pairs: Vec<Py<PairReport>>,
    pub paths: Vec<String>,
}

impl TransferReport {
    pub fn new(py: Python<'_>, r: &gdpath::TransferReport) -> PyResult<TransferReport> {
        Ok(TransferReport {
            bytes: r.bytes,
            elapsed: r.elapsed.as_secs_f64(),
            gbps: r.gbps(),
            pairs: r
                .pairs
                .iter()
                .map(|p| Py::new(py, PairReport::from(p)))
                .collect::<PyResult<_>>()?,
            paths: r.paths().iter().map(gdpath::DataPath::name).collect(),
        })
    }
}

#[pymethods]
impl TransferReport {
    fn __repr__(&self) -> String {
        format!(
            "TransferReport(bytes={}, elapsed={:.6}, gbps={:.3}, paths={:?})",
            self.bytes, self.elapsed, self.gbps, self.paths
        )
    }
}

/// The planner's choice for one pair, before any byte moves: `index`, `backend`, `path`,
/// `finding` (why not the preferred path) and `detail` (the evidence).
#[pyclass(module = "gdpath._native", name = "PlannedPair", frozen, get_all)]
pub struct PlannedPair {
    pub index: usize,
    pub backend: String,
    pub path: String,
    pub finding: Option<String>,
    pub detail: Option<String>,
}

impl From<&gdpath::PlannedPair> for PlannedPair {
    fn from(p: &gdpath::PlannedPair) -> Self {
        PlannedPair {
            index: p.index,
            backend: p.backend.to_owned(),
            path: p.path.name(),
            finding: p.finding.as_ref().map(|f| f.as_str().to_owned()),
            detail: p.detail.clone(),
        }
    }
}

#[pymethods]
impl PlannedPair {
    fn __repr__(&self) -> String {
        format!(
            "PlannedPair(index={}, backend={:?}, path={:?}, finding={})",
            self.index,
            self.backend,
            self.path,
            crate::error::opt_repr(self.finding.as_deref())
        )
    }
}

/// How long a blocking wait (`Transfer.wait`, `wait_notification`, `next_event`,
/// `wait_for_region`) waits without the GIL before it lets Python's signal handlers run
/// (Ctrl-C): short against a person's patience, long against a wait's own cost.
const SIGNAL_SLICE: Duration = Duration::from_millis(100);

/// Calls `wait(slice)` without the GIL in slices of at most [`SIGNAL_SLICE`] until it returns
/// something or `total` has passed (`Ok(None)`; a `total` too far to represent is no bound),
/// running Python's signal handlers between slices: for waits whose slices end nothing but
/// the wait. Errors: what a signal handler raises (`KeyboardInterrupt`).
pub(crate) fn in_slices<T: Send>(
    py: Python<'_>,
    total: Duration,
    mut wait: impl FnMut(Duration) -> Option<T> + Send,
) -> PyResult<Option<T>> {
    let end = Instant::now().checked_add(total);
    loop {
        let left = end.map(|e| e.saturating_duration_since(Instant::now()));
        let slice = left.map_or(SIGNAL_SLICE, |l| l.min(SIGNAL_SLICE));
        if let Some(v) = py.detach(|| wait(slice)) {
            return Ok(Some(v));
        }
        if left.is_some_and(|l| l <= SIGNAL_SLICE) {
            return Ok(None);
        }
        py.check_signals()?;
    }
}

/// A posted transfer. `wait(timeout=None)` blocks (without the GIL) and returns the
/// [`TransferReport`] or raises; `done()` says whether every pair has completed; `cancel()`
/// starts no more I/O; `report` is the report once done (`None` before; raises if it failed);
/// `await transfer` waits in asyncio without blocking the loop. Dropping it lets it finish in
/// the background (its regions stay alive until then).
#[pyclass(module = "gdpath._native", name = "Transfer", frozen)]
pub struct Transfer {
    pub(crate) inner: Arc<gdpath::Transfer>,
    /// When the request's deadline passes, if it has one (asyncio's wake-up for it).
    deadline: Option<Instant>,
    cancelled: Mutex<bool>,
    /// The event loops awaiting it (`_notify`), woken by `cancel` too.
    awaiting: Mutex<Vec<(Arc<WakerInner>, u64)>>,
}

impl Transfer {
    pub fn new(t: gdpath::Transfer, deadline: Option<Instant>) -> Transfer {
        Transfer {
            inner: Arc::new(t),
            deadline,
            cancelled: Mutex::new(false),
            awaiting: Mutex::new(Vec::new()),
        }
    }

    /// Waits as `wait(timeout)` does, in slices ([`in_slices`]) between which Python's signal
    /// handlers run: Ctrl-C raises `KeyboardInterrupt` within a slice and the transfer goes on
    /// (`cancel()` stops it).
    // The engine's error carries every pair's outcome (once per wait).
    #[allow(clippy::result_large_err)]
    fn result(&self, py: Python<'_>, timeout: Option<Duration>) -> PyResult<TransferReport> {
        let t = &self.inner;
        let total = timeout.unwrap_or(Duration::MAX);
        let r = match in_slices(py, total, |s| t.wait_shared_for(s).transpose())? {
            Some(r) => r,
            // The timeout passed: a wait of zero ends the transfer past its bound, as the
            // engine's own timeout does, or returns it if it has just completed.
            None => py.detach(|| t.wait_shared(Some(Duration::ZERO))),
        };
        match r {
            Ok(rep) => TransferReport::new(py, &rep),
            Err(e) => Err(transfer(py, &e)),
        }
    }
}

#[pymethods]
impl Transfer {
    /// Waits for every pair (the GIL released) up to `timeout` seconds (`None`: up to the
    /// request's deadline, else until done) and returns the report. Raises the engine's error
    /// as a `gdpath.TransferError` (with `.kind`, `.finding`, `.outcomes`): the first pair's
    /// failure, `cancelled`, or `deadline_exceeded` — a timeout cancels the transfer, as the
    /// engine's `wait_timeout` does. After the end it returns (or raises) the same at once.
    /// Ctrl-C (any signal handler that raises) interrupts the wait within 0.1 s with its
    /// exception (`KeyboardInterrupt`); the transfer goes on unless `cancel()` is called.
    #[pyo3(signature = (timeout=None))]
    fn wait(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<TransferReport> {
        let timeout = timeout.map(|t| seconds("timeout", t)).transpose()?;
        self.result(py, timeout)
    }

    /// True once every pair has completed (successfully or not). Progresses a poll-driven
    /// backend (the network's) once.
    fn done(&self, py: Python<'_>) -> bool {
        let t = self.inner.clone();
        py.detach(move || t.poll().finished)
    }

    /// Starts no more I/O: pairs not started end as `cancelled`; I/O in the kernel completes.
    /// An `await` of the transfer returns at once (raising `gdpath.Cancelled`).
    fn cancel(&self) {
        self.inner.cancel();
        *self.cancelled.lock().unwrap_or_else(|p| p.into_inner()) = true;
        for (w, token) in self
            .awaiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .iter()
        {
            w.signal(*token);
        }
    }

    /// Whether `cancel()` was called.
    #[getter]
    fn cancelled(&self) -> bool {
        *self.cancelled.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The report once every pair has completed, else `None`; raises the transfer's error if
    /// it failed.
    #[getter]
    fn report(&self, py: Python<'_>) -> PyResult<Option<TransferReport>> {
        if !self.done(py) {
            return Ok(None);
        }
        self.result(py, Some(Duration::ZERO)).map(Some)
    }

    /// The planner's choice per pair (made at post).
    #[getter]
    fn plan(&self) -> Vec<PlannedPair> {
        self.inner.plan().iter().map(PlannedPair::from).collect()
    }

    /// The transfer's id, unique within its agent.
    #[getter]
    fn id(&self) -> u64 {
        self.inner.id()
    }

    /// Seconds until the request's deadline (negative once passed); `None` without one.
    #[getter]
    fn deadline_in(&self) -> Option<f64> {
        self.deadline.map(|d| {
            let now = Instant::now();
            if d >= now {
                (d - now).as_secs_f64()
            } else {
                -(now - d).as_secs_f64()
            }
        })
    }

    /// Whether completion needs something to progress a poll-driven backend (the network
    /// backend): `await` then waits on a thread of its own.
    #[getter]
    fn needs_progress(&self) -> bool {
        self.inner.needs_progress()
    }

    /// Asks `waker` to be signalled with `token` when every pair has completed (at once if
    /// they have). For the asyncio machinery (`gdpath._aio`); a transfer that needs progress
    /// also gets a thread that waits on it (the GIL released) until it ends.
    fn _notify(&self, waker: &Waker, token: u64) -> PyResult<()> {
        let w = waker.handle();
        self.awaiting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push((w.clone(), token));
        self.inner.on_complete(move || w.signal(token));
        if self.inner.needs_progress() {
            let t = self.inner.clone();
            // Nothing else progresses the network backend of a client: this thread's wait
            // does, and the hook above runs inside it. It ends when the transfer does (bounded
            // by its deadline and the backend's operation timeout), or at once if cancelled.
            std::thread::Builder::new()
                .name("gdpath-await".into())
                .spawn(move || {
                    let _ = t.wait_shared(None);
                })
                .map_err(|e| {
                    pyo3::exceptions::PyOSError::new_err(format!(
                        "cannot start the thread that progresses the transfer: {e}"
                    ))
                })?;
        }
        Ok(())
    }

    /// `await transfer`: the report, or the transfer's error (see `gdpath._aio`).
    fn __await__<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let py = slf.py();
        py.import("gdpath._aio")?
            .call_method1("wait_transfer", (slf,))?
            .call_method0("__await__")
    }

    fn __repr__(&self) -> String {
        let s = self.inner.poll();
        format!(
            "gdpath.Transfer(id={}, pairs_done={}/{}, bytes_done={}, finished={})",
            self.inner.id(),
            s.pairs_done,
            s.pairs,
            s.bytes_done,
            s.finished
        )
    }
}

/// `s` seconds as a duration (`what`: the argument's name, for messages). Errors:
/// `ValueError` for a negative or not-finite number, or one longer than a `Duration` holds
/// (about 1.8e19 s), each naming `what` and the number as Python would print it.
pub fn seconds(what: &str, s: f64) -> PyResult<Duration> {
    if !s.is_finite() || s < 0.0 {
        return Err(pyo3::exceptions::PyValueError::new_err(format!(
            "{what} {} is not a number of seconds (finite and not negative)",
            short(s)
        )));
    }
    Duration::try_from_secs_f64(s).map_err(|_| {
        pyo3::exceptions::PyValueError::new_err(format!(
            "{what} {} s is longer than the most this accepts ({} s)",
            short(s),
            short(Duration::MAX.as_secs_f64())
        ))
    })
}

/// `x` in few digits: a large or tiny number in exponent form (`1e300`, not its 301 digits).
fn short(x: f64) -> String {
    if x.is_finite() && x != 0.0 && !(1e-4..1e15).contains(&x.abs()) {
        format!("{x:e}")
    } else {
        format!("{x}")
    }
}

/// A failed, cancelled or timed-out transfer: the cause's kind and finding, and `outcomes` (one
/// `(index, "done" | "failed" | "not_done", detail)` per pair: the pair's report, its error's
/// message, or `None`).
pub fn transfer(py: Python<'_>, e: &TransferError) -> PyErr {
    let build = || -> PyResult<Bound<'_, PyDict>> {
        let outcomes = PyList::empty(py);
        for o in &e.outcomes {
            let item = match o {
                PairOutcome::Done(r) => (
                    r.index,
                    "done",
                    Bound::new(py, PairReport::from(r))?.into_any(),
                ),
                PairOutcome::Failed { index, error } => (
                    *index,
                    "failed",
                    error.to_string().into_pyobject(py)?.into_any(),
                ),
                PairOutcome::NotDone { index } => (*index, "not_done", py.None().into_bound(py)),
            };
            outcomes.append(item)?;
        }
        let d = details_of(py, &e.error)?.unwrap_or_else(|| PyDict::new(py));
        d.set_item("outcomes", outcomes)?;
        d.set_item("transfer_failed", true)?;
        Ok(d)
    };
    match build() {
        Ok(d) => raise(
            py,
            e.error.kind(),
            &e.to_string(),
            finding_of(&e.error).as_deref(),
            Some(d),
        ),
        Err(err) => err,
    }
}
