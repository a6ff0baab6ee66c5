//! The cluster from Python (docs/cluster.md): an `Agent(name=…, cluster=URL)` publishes itself
//! in etcd once it serves, `agent.peer(name)` connects to an agent found by name (its
//! incarnation checked in the handshake), and `agent.cluster_events()` iterates over joins,
//! updates and leaves. The rules are `gdpath-cluster`'s; this module only binds them.

use gdpath_cluster::{
    AgentRecord, Cluster, ClusterError, ClusterEvent, ClusterPeer as Inner, ClusterUrl, Membership,
    RegionRecord, Watch,
};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::sync::{Arc, Mutex};
use std::time::Duration;

/// A cluster error as a `gdpath.GdpathError` of its kind (`peer_gone`, `name_taken`,
/// `not_found`, `incarnation_mismatch`, ...); an engine error as the engine's.
pub fn err(py: Python<'_>, e: ClusterError) -> PyErr {
    match e {
        ClusterError::Engine(e) => crate::error::engine(py, &e),
        e => crate::error::raise(py, e.kind(), &e.to_string(), None, None),
    }
}

/// What an agent made with `cluster=` publishes, and its membership once it serves.
pub struct Publish {
    cluster: Cluster,
    record: Mutex<AgentRecord>,
    ttl: Duration,
    member: Mutex<Option<Membership>>,
    /// The serving address of the last `serve`, so that a withdrawn record can be published
    /// again without serving again.
    addr: Mutex<Option<std::net::SocketAddr>>,
}

impl Publish {
    /// Connects to `url` and prepares the record of agent `name` (a fresh incarnation).
    pub fn new(py: Python<'_>, url: &str, name: &str, ttl: f64) -> PyResult<Publish> {
        let ttl = crate::transfer::seconds("lease_ttl", ttl)?;
        let url: ClusterUrl = url.parse().map_err(|e| err(py, e))?;
        let mut record = AgentRecord::new(name, "0.0.0.0:0".parse().expect("an address"))
            .map_err(|e| err(py, e))?;
        record.topology = gdpath_cluster::TopologySummary::of_this_machine();
        let cluster = py
            .detach(move || Cluster::connect(&url))
            .map_err(|e| err(py, e))?;
        Ok(Publish {
            cluster,
            record: Mutex::new(record),
            ttl,
            member: Mutex::new(None),
            addr: Mutex::new(None),
        })
    }

    /// The engine's agent name, `NAME#INCARNATION`, which peers check in the handshake.
    pub fn engine_name(&self) -> String {
        self.record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .engine_name()
    }

    /// Adds `region`, exported by `agent`, to the record published at the next serve, as the
    /// engine describes it to peers. Errors: the engine's (`config`: not exported).
    pub fn add_region(
        &self,
        py: Python<'_>,
        agent: &gdpath::Agent,
        region: &gdpath::Region,
    ) -> PyResult<()> {
        let rec = RegionRecord::exported(agent, region).map_err(|e| err(py, e))?;
        self.record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .regions
            .push(rec);
        Ok(())
    }

    /// Publishes the record with the serving address `addr` (claiming the name), then its
    /// doctor verdicts once the doctor answered in the background. Errors:
    /// `name_taken`, `cluster_unreachable`, `cluster_denied`.
    pub fn publish(&self, py: Python<'_>, addr: std::net::SocketAddr) -> PyResult<()> {
        *self.addr.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
        let mut record = self
            .record
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .clone();
        record.addr = addr.to_string();
        let (cluster, ttl) = (self.cluster.clone(), self.ttl);
        let m = py
            .detach(move || Membership::join(&cluster, record, ttl))
            .map_err(|e| err(py, e))?;
        m.publish_verdicts(gdpath_cluster::VERDICTS_BOUND, || {
            gdpath_doctor::examine::path_statuses_here().map_err(|e| e.to_string())
        })
        .map_err(|e| err(py, e))?;
        *self.member.lock().unwrap_or_else(|p| p.into_inner()) = Some(m);
        Ok(())
    }

    /// Remembers the serving address `addr` without publishing (`serve(publish=False)`).
    pub fn set_addr(&self, addr: std::net::SocketAddr) {
        *self.addr.lock().unwrap_or_else(|p| p.into_inner()) = Some(addr);
    }

    /// Publishes the record again (with the regions exported since) if it is not published
    /// now; false when it already is. Errors: `usage` before any `serve`, and `publish`'s.
    pub fn republish(&self, py: Python<'_>) -> PyResult<bool> {
        if self
            .member
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .is_some()
        {
            return Ok(false);
        }
        let addr = *self.addr.lock().unwrap_or_else(|p| p.into_inner());
        let addr = addr.ok_or_else(|| {
            crate::error::raise(
                py,
                "usage",
                "the record has no address yet: serve first",
                None,
                None,
            )
        })?;
        self.publish(py, addr)?;
        Ok(true)
    }

    /// Withdraws the record (its lease revoked: watchers see the agent leave at once); false
    /// when it was not published. Errors: etcd's, when it could not be told (the record then
    /// goes when its lease expires).
    pub fn leave(&self, py: Python<'_>) -> PyResult<bool> {
        let m = self.member.lock().unwrap_or_else(|p| p.into_inner()).take();
        match m {
            None => Ok(false),
            Some(m) => {
                py.detach(move || m.leave()).map_err(|e| err(py, e))?;
                Ok(true)
            }
        }
    }

    /// Connects to agent `name`, waiting up to `wait` for its record.
    pub fn peer(
        &self,
        py: Python<'_>,
        agent: &gdpath::Agent,
        name: &str,
        token: gdpath::net::Token,
        wait: Duration,
    ) -> PyResult<ClusterPeer> {
        let (cluster, a, n) = (self.cluster.clone(), agent.clone(), name.to_owned());
        let inner = py
            .detach(move || Inner::connect(&cluster, &a, &n, token, wait))
            .map_err(|e| err(py, e))?;
        let peer = Py::new(
            py,
            crate::net::Peer::new(inner.peer().clone(), agent.clone()),
        )?;
        Ok(ClusterPeer {
            inner: Arc::new(inner),
            peer,
        })
    }

    /// A watch of the namespace.
    pub fn watch(&self, py: Python<'_>) -> PyResult<ClusterWatch> {
        let cluster = self.cluster.clone();
        let w = py.detach(move || cluster.watch()).map_err(|e| err(py, e))?;
        Ok(ClusterWatch {
            watch: Mutex::new(w),
        })
    }
}

/// An agent found by name: `peer` is the connection (register its regions with
/// `agent.register(peer.peer.region(id))`), `incarnation` the start of it that answered.
/// `gone` turns to `(since, reason)` (seconds after the epoch, why) once its record went
/// (lease expired: a crash or a partition; or it left, or another incarnation replaced it);
/// `check()` then raises `GdpathError` of kind `peer_gone`.
#[pyclass(module = "gdpath._native", name = "ClusterPeer", frozen)]
pub struct ClusterPeer {
    inner: Arc<Inner>,
    peer: Py<crate::net::Peer>,
}

#[pymethods]
impl ClusterPeer {
    /// The connection (a `gdpath.Peer`).
    #[getter]
    fn peer(&self, py: Python<'_>) -> Py<crate::net::Peer> {
        self.peer.clone_ref(py)
    }

    /// The agent's name in the cluster.
    #[getter]
    fn name(&self) -> String {
        self.inner.record().name.clone()
    }

    /// Its incarnation (32 hex digits).
    #[getter]
    fn incarnation(&self) -> String {
        self.inner.record().incarnation.to_string()
    }

    /// `(since, reason)` once its record went (since: seconds after the Unix epoch), else
    /// `None`.
    #[getter]
    fn gone(&self) -> Option<(f64, String)> {
        self.inner.gone().map(|g| {
            let since = g
                .since
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs_f64())
                .unwrap_or(0.0);
            (since, g.reason)
        })
    }

    /// Raises `GdpathError` (kind `peer_gone`) once the peer is gone; call before posting.
    fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.inner.check().map_err(|e| err(py, e))
    }

    /// Waits for `transfer` (posted to this peer) up to `timeout` seconds (`None`: no bound)
    /// and returns its report. When the peer's record goes meanwhile, the transfer is
    /// cancelled and `GdpathError` of kind `peer_gone` is raised; a transfer that failed on
    /// the network waits up to the peer's lease TTL for etcd's verdict, so that a crash reads
    /// as gone. Other failures raise as `transfer.wait()` does. Ctrl-C interrupts within 0.05 s.
    #[pyo3(signature = (transfer, timeout=None))]
    fn wait<'py>(
        &self,
        py: Python<'py>,
        transfer: &Bound<'py, crate::transfer::Transfer>,
        timeout: Option<f64>,
    ) -> PyResult<Bound<'py, PyAny>> {
        let end = timeout
            .map(|t| crate::transfer::seconds("timeout", t))
            .transpose()?
            .map(|d| std::time::Instant::now() + d);
        let t = transfer.get().inner.clone();
        loop {
            if let Err(e) = self.inner.check() {
                transfer.call_method0("cancel")?;
                return Err(err(py, e));
            }
            let slice = Duration::from_millis(50);
            let left = end.map(|e| e.saturating_duration_since(std::time::Instant::now()));
            if left.is_some_and(|l| l.is_zero()) {
                // The transfer's own wait with a zero bound cancels it and raises
                // deadline_exceeded.
                return transfer.call_method1("wait", (0.0,));
            }
            let t2 = t.clone();
            // Ended (true), still running (false), or failed: on the network (true) or not.
            let waited = py.detach(move || {
                t2.wait_shared_for(slice)
                    .map(|r| r.is_some())
                    .map_err(|e| matches!(e.error, gdpath::Error::PeerFailed { .. }))
            });
            match waited {
                Ok(true) => return transfer.call_method0("wait"),
                Ok(false) => py.check_signals()?,
                Err(network) => {
                    if network {
                        let inner = self.inner.clone();
                        let max = left.unwrap_or(Duration::MAX);
                        if py.detach(move || inner.confirm_gone(max)).is_some() {
                            if let Err(e) = self.inner.check() {
                                return Err(err(py, e));
                            }
                        }
                    }
                    return transfer.call_method0("wait");
                }
            }
        }
    }

    fn __repr__(&self) -> String {
        format!(
            "gdpath.ClusterPeer(name={:?}, incarnation={:?}, gone={})",
            self.inner.record().name,
            self.inner.record().incarnation.to_string(),
            self.inner.gone().is_some()
        )
    }
}

/// The cluster's events, one dict each: `{"event": "joined"|"updated", "record": {...}}`,
/// `{"event": "left", "name", "incarnation", "at"}`, `{"event": "invalid", "key", "detail"}`,
/// `{"event": "reconnected", "detail"}`. `async for e in agent.cluster_events()` waits
/// without blocking the loop.
#[pyclass(module = "gdpath._native", name = "ClusterWatch", frozen)]
pub struct ClusterWatch {
    watch: Mutex<Watch>,
}

#[pymethods]
impl ClusterWatch {
    /// The next event, waiting up to `timeout` seconds (the GIL released), or `None`.
    #[pyo3(signature = (timeout=0.0))]
    fn next<'py>(&self, py: Python<'py>, timeout: f64) -> PyResult<Option<Bound<'py, PyDict>>> {
        let t = crate::transfer::seconds("timeout", timeout)?;
        let e = py.detach(|| self.watch.lock().unwrap_or_else(|p| p.into_inner()).next(t));
        let Some(e) = e else { return Ok(None) };
        let d = PyDict::new(py);
        let json = |r: &AgentRecord| {
            py.import("json")?.call_method1(
                "loads",
                (String::from_utf8_lossy(&r.to_json()).into_owned(),),
            )
        };
        match e {
            ClusterEvent::Joined(r) => {
                d.set_item("event", "joined")?;
                d.set_item("record", json(&r)?)?;
            }
            ClusterEvent::Updated(r) => {
                d.set_item("event", "updated")?;
                d.set_item("record", json(&r)?)?;
            }
            ClusterEvent::Left {
                name,
                incarnation,
                at,
            } => {
                d.set_item("event", "left")?;
                d.set_item("name", name)?;
                d.set_item("incarnation", incarnation)?;
                let at = at
                    .duration_since(std::time::UNIX_EPOCH)
                    .map(|d| d.as_secs_f64())
                    .unwrap_or(0.0);
                d.set_item("at", at)?;
            }
            ClusterEvent::Invalid { key, detail } => {
                d.set_item("event", "invalid")?;
                d.set_item("key", key)?;
                d.set_item("detail", detail)?;
            }
            ClusterEvent::Reconnected { detail } => {
                d.set_item("event", "reconnected")?;
                d.set_item("detail", detail)?;
            }
        }
        Ok(Some(d))
    }
}
