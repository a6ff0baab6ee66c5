//! The network: `Agent.serve` → `Server`, `Agent.connect` → `Peer` (its exported regions,
//! their memory to register, notifications, close), `Notification`. Thin over
//! `gdpath::net` (`docs/network.md`): every rule (tokens, bounds, withdrawal) is the engine's.

use crate::error::IntoPy;
use crate::region::Region;
use crate::transfer::seconds;
use gdpath::net::codec::WireKind;
use gdpath::net::{FailureMode, NetConfig, NetEvent, Token};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyByteArray, PyBytes, PyMemoryView, PyString};
use std::net::{SocketAddr, ToSocketAddrs};
use std::sync::{Arc, Mutex};

/// `"host:port"` (a name resolves to its first address).
pub fn address(addr: &str) -> PyResult<SocketAddr> {
    addr.to_socket_addrs()
        .map_err(|e| PyValueError::new_err(format!("address {addr:?}: {e}")))?
        .next()
        .ok_or_else(|| PyValueError::new_err(format!("address {addr:?} resolves to nothing")))
}

/// A token argument: `str` (its UTF-8 bytes) or `bytes`.
pub struct TokenArg(pub Vec<u8>);

impl<'a, 'py> FromPyObject<'a, 'py> for TokenArg {
    type Error = PyErr;

    fn extract(ob: pyo3::Borrowed<'a, 'py, PyAny>) -> PyResult<Self> {
        if let Ok(s) = ob.extract::<String>() {
            return Ok(TokenArg(s.into_bytes()));
        }
        if let Ok(b) = ob.cast::<pyo3::types::PyBytes>() {
            return Ok(TokenArg(b.as_bytes().to_vec()));
        }
        Err(pyo3::exceptions::PyTypeError::new_err(
            "a token is str or bytes",
        ))
    }
}

/// A token from `str` or `bytes` (at least 16 bytes), or none. Errors: `config` for a token
/// too short.
pub fn token(py: Python<'_>, t: Option<TokenArg>) -> PyResult<Token> {
    match t {
        None => Ok(Token::none()),
        Some(TokenArg(b)) => Token::new(b).map_err(gdpath::Error::from).py_err(py),
    }
}

/// The token and the bound of a connection (`connect`, a cluster's `peer`): `token` as
/// [`token`], `timeout` in seconds. Errors: `config` for a token too short, `ValueError` for a
/// timeout that is not a number of seconds.
pub fn connect_options(
    py: Python<'_>,
    token: Option<TokenArg>,
    timeout: f64,
) -> PyResult<gdpath::net::ConnectOptions> {
    Ok(gdpath::net::ConnectOptions {
        token: self::token(py, token)?,
        timeout: seconds("timeout", timeout)?,
    })
}

/// The network backend's settings (`NetConfig`): `fast_local` UCX shared memory between agents
/// of one host (a dead peer then noticed only by `op_timeout`), `transports` (`UCX_TLS`),
/// `devices` (`UCX_NET_DEVICES`, e.g. `"lo"`; `None`: the engine chooses, docs/network.md),
/// `connect_timeout` and `op_timeout` seconds, `shared_memory` (`NetConfig::shared_memory`).
pub fn config(
    fast_local: bool,
    transports: Option<String>,
    devices: Option<String>,
    connect_timeout: f64,
    op_timeout: f64,
    shared_memory: bool,
) -> PyResult<NetConfig> {
    Ok(NetConfig {
        failure_mode: if fast_local {
            FailureMode::FastLocal
        } else {
            FailureMode::Detect
        },
        transports,
        devices,
        connect_timeout: seconds("connect_timeout", connect_timeout)?,
        op_timeout: seconds("op_timeout", op_timeout)?,
        shared_memory,
        ..NetConfig::default()
    })
}

/// A serving agent's listener and progress thread; `close()` (or dropping it) stops both.
#[pyclass(module = "gdpath._native", name = "Server", frozen)]
pub struct Server {
    // Shared with a `next_event` in progress (which waits without the GIL), never locked
    // across a wait: a lock held there would deadlock against a `close` holding the GIL.
    inner: Mutex<Option<Arc<gdpath::net::Server>>>,
    addr: SocketAddr,
}

impl Server {
    pub fn new(s: gdpath::net::Server) -> Server {
        Server {
            addr: s.local_addr(),
            inner: Mutex::new(Some(Arc::new(s))),
        }
    }

    fn get(&self) -> Option<Arc<gdpath::net::Server>> {
        self.inner.lock().unwrap_or_else(|p| p.into_inner()).clone()
    }
}

#[pymethods]
impl Server {
    /// The bound address, `"ip:port"` (the port chosen for port 0).
    #[getter]
    fn address(&self) -> String {
        self.addr.to_string()
    }

    /// Authenticated peers connected now (0 once closed).
    #[getter]
    fn peers(&self) -> usize {
        self.get().map_or(0, |s| s.peers())
    }

    /// The next connection event, waiting up to `timeout` seconds (the GIL released; Ctrl-C
    /// interrupts the wait within 0.1 s):
    /// `("connected", peer)`, `("refused", reason)`, `("left", peer)`, `("lost", detail)`,
    /// or `None`.
    #[pyo3(signature = (timeout=0.0))]
    fn next_event(&self, py: Python<'_>, timeout: f64) -> PyResult<Option<(String, String)>> {
        let t = seconds("timeout", timeout)?;
        let Some(s) = self.get() else {
            return Ok(None);
        };
        let ev = crate::transfer::in_slices(py, t, |slice| s.next_event(slice))?;
        Ok(ev.map(|e| match e {
            NetEvent::Connected { peer } => ("connected".into(), peer),
            NetEvent::Refused { reason, .. } => ("refused".into(), reason),
            NetEvent::Left { peer } => ("left".into(), peer),
            NetEvent::Lost { peer, detail, .. } => ("lost".into(), format!("{peer}: {detail}")),
        }))
    }

    /// Stops serving: with `timeout` (seconds) every connected client is told goodbye first
    /// (their transfers then fail with `peer_failed`, "the peer closed the connection") and
    /// the number told is returned; without, the listener just stops (so does a close while
    /// another thread is in `next_event`). Closing twice is fine.
    #[pyo3(signature = (timeout=None))]
    fn close(&self, py: Python<'_>, timeout: Option<f64>) -> PyResult<usize> {
        let t = timeout.map(|t| seconds("timeout", t)).transpose()?;
        let s = self.inner.lock().unwrap_or_else(|p| p.into_inner()).take();
        Ok(py.detach(move || match (s.map(Arc::try_unwrap), t) {
            (Some(Ok(s)), Some(t)) => s.stop(t),
            _ => 0,
        }))
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py, None).map(|_| ())
    }

    fn __repr__(&self) -> String {
        format!("gdpath.Server(address={:?})", self.addr.to_string())
    }
}

/// A region a peer exports: `id`, `kind` (`"host"` or `"gpu:N"`), `len` bytes.
#[pyclass(module = "gdpath._native", name = "RemoteRegion", frozen, get_all)]
pub struct RemoteRegion {
    pub id: u64,
    pub kind: String,
    pub len: u64,
}

#[pymethods]
impl RemoteRegion {
    fn __repr__(&self) -> String {
        format!(
            "RemoteRegion(id={}, kind={:?}, len={})",
            self.id, self.kind, self.len
        )
    }
}

/// A notification from a peer: `sender` (`name@address`) and `message` (bytes).
#[pyclass(module = "gdpath._native", name = "Notification", frozen, get_all)]
pub struct Notification {
    pub sender: String,
    pub message: Vec<u8>,
}

impl From<gdpath::net::Notification> for Notification {
    fn from(n: gdpath::net::Notification) -> Self {
        Notification {
            sender: n.from,
            message: n.message,
        }
    }
}

#[pymethods]
impl Notification {
    fn __repr__(&self) -> String {
        format!(
            "Notification(sender={:?}, message={} bytes)",
            self.sender,
            self.message.len()
        )
    }
}

/// A connection to a serving agent (`Agent.connect`). `regions()` lists what it exports;
/// `memory(id)` registers one (or `offset`/`length` of it) as remote memory on this agent, to
/// read and write with `post`; `notify(message)` sends a notification; `close()` says goodbye
/// (the server sees `left`, not `lost`); so does dropping the last reference.
#[pyclass(module = "gdpath._native", name = "Peer", frozen)]
pub struct Peer {
    peer: Mutex<Option<gdpath::net::Peer>>,
    agent: gdpath::Agent,
    name: String,
}

impl Peer {
    pub fn new(peer: gdpath::net::Peer, agent: gdpath::Agent) -> Peer {
        Peer {
            name: peer.name(),
            peer: Mutex::new(Some(peer)),
            agent,
        }
    }

    /// A handle of the connection (a clone: the lock is never held across a wait, which
    /// would deadlock against a `close` holding the GIL). Errors: `peer_failed` once closed.
    fn handle(&self, py: Python<'_>) -> PyResult<gdpath::net::Peer> {
        let g = self.peer.lock().unwrap_or_else(|p| p.into_inner());
        g.clone().ok_or_else(|| {
            crate::error::raise(
                py,
                "peer_failed",
                &format!("peer {}: this agent closed the connection", self.name),
                None,
                None,
            )
        })
    }

    fn with<R>(&self, py: Python<'_>, f: impl FnOnce(&gdpath::net::Peer) -> R) -> PyResult<R> {
        Ok(f(&self.handle(py)?))
    }
}

#[pymethods]
impl Peer {
    /// `name@address`, as remote regions' kind names it.
    #[getter]
    fn name(&self) -> &str {
        &self.name
    }

    /// The regions the peer exports now (withdrawn ones left out).
    fn regions(&self, py: Python<'_>) -> PyResult<Vec<RemoteRegion>> {
        self.with(py, |p| {
            p.regions()
                .into_iter()
                .map(|r| RemoteRegion {
                    id: r.id,
                    kind: match r.kind {
                        WireKind::Host => "host".into(),
                        WireKind::Gpu(n) => format!("gpu:{n}"),
                    },
                    len: r.len,
                })
                .collect()
        })
    }

    /// Registers exported region `id` (all of it, or `length` bytes at `offset`) as remote
    /// memory of this agent and returns the `Region`, used as it is (`post` takes it or its
    /// descriptors; `register` refuses it). It outlives `close()`, after which posts on it
    /// raise `PeerError`; it holds up no later `connect`. Errors: `config` for an id the peer
    /// does not export or a range outside it.
    #[pyo3(signature = (id, offset=0, length=None))]
    fn memory(
        &self,
        py: Python<'_>,
        id: u64,
        offset: u64,
        length: Option<u64>,
    ) -> PyResult<Region> {
        let m = self
            .with(py, |p| {
                p.memory_range(id, offset, length.unwrap_or(u64::MAX))
            })?
            .py_err(py)?;
        let agent = self.agent.clone();
        let r = py.detach(move || agent.register(m)).py_err(py)?;
        Ok(Region::made(r, "remote"))
    }

    /// The UCX transport(s) that move host memory to and from this peer (`tcp`, `sysv+cma`).
    #[getter]
    fn transport(&self, py: Python<'_>) -> PyResult<String> {
        self.with(py, |p| p.transport())
    }

    /// Why the connection is unusable, if it is.
    #[getter]
    fn failure(&self, py: Python<'_>) -> PyResult<Option<String>> {
        self.with(py, |p| p.failure())
    }

    /// Sends `message` (at most 64 KiB) after every write posted to the peer so far has
    /// completed there; waits up to `timeout` seconds (the GIL released).
    #[pyo3(signature = (message, timeout=10.0))]
    fn notify(&self, py: Python<'_>, message: Bound<'_, PyAny>, timeout: f64) -> PyResult<()> {
        let message = message_bytes(&message, "message")?;
        let t = seconds("timeout", timeout)?;
        let p = self.handle(py)?;
        py.detach(move || p.notify(&message, t)).py_err(py)
    }

    /// Waits until every put posted to the peer so far is in its memory.
    #[pyo3(signature = (timeout=10.0))]
    fn flush(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = seconds("timeout", timeout)?;
        let p = self.handle(py)?;
        py.detach(move || p.flush(t)).py_err(py)
    }

    /// Progresses the connection until the peer exports region `id` or `timeout` seconds pass
    /// (metadata updates arrive while the backend progresses); returns whether it does. Ctrl-C
    /// interrupts the wait within 0.1 s.
    #[pyo3(signature = (id, timeout=10.0))]
    fn wait_for_region(&self, py: Python<'_>, id: u64, timeout: f64) -> PyResult<bool> {
        let t = seconds("timeout", timeout)?;
        let p = self.handle(py)?;
        let found = crate::transfer::in_slices(py, t, |slice| {
            p.wait_until(slice, |p| p.regions().iter().any(|r| r.id == id))
                .then_some(())
        })?;
        Ok(found.is_some())
    }

    /// Closes the connection cleanly: in-flight transfers complete, then a goodbye, waiting up
    /// to `timeout` seconds. Closing a closed peer is fine. Regions from `memory` stay objects
    /// whose posts raise `PeerError`; a new `connect` to the same server does not wait for
    /// them. Errors: `peer_failed`.
    #[pyo3(signature = (timeout=10.0))]
    fn close(&self, py: Python<'_>, timeout: f64) -> PyResult<()> {
        let t = seconds("timeout", timeout)?;
        let p = self.peer.lock().unwrap_or_else(|p| p.into_inner()).take();
        match p {
            Some(p) => py.detach(move || p.close(t)).py_err(py),
            None => Ok(()),
        }
    }

    fn __enter__(slf: Py<Self>) -> Py<Self> {
        slf
    }

    #[pyo3(signature = (*_exc))]
    fn __exit__(&self, py: Python<'_>, _exc: &Bound<'_, pyo3::types::PyTuple>) -> PyResult<()> {
        self.close(py, 10.0)
    }

    fn __repr__(&self) -> String {
        format!("gdpath.Peer({:?})", self.name)
    }
}

/// A notification's bytes from `bytes`, `bytearray` or anything with the buffer protocol of
/// bytes. Errors: `TypeError` naming `what` for anything else; a `str` is refused, its encoding
/// being the caller's to choose.
pub(crate) fn message_bytes(obj: &Bound<'_, PyAny>, what: &str) -> PyResult<Vec<u8>> {
    if obj.is_instance_of::<PyString>() {
        return Err(PyTypeError::new_err(format!(
            "{what}: bytes, not str (encode it, e.g. message.encode())"
        )));
    }
    if let Ok(b) = obj.cast::<PyBytes>() {
        return Ok(b.as_bytes().to_vec());
    }
    if let Ok(b) = obj.cast::<PyByteArray>() {
        return Ok(b.to_vec());
    }
    // Any other buffer (a memoryview, a NumPy array) through a memoryview's copy of its bytes;
    // object references are pointers, not a message.
    let view = match PyMemoryView::from(obj) {
        Ok(v) => v,
        Err(e) if !e.is_instance_of::<PyTypeError>(obj.py()) => return Err(e),
        Err(_) => return Err(not_bytes(obj, what)),
    };
    let format: String = view.getattr("format")?.extract()?;
    if crate::buffer::holds_objects(format.as_bytes(), obj)? {
        return Err(PyTypeError::new_err(format!(
            "{what}: the buffer holds Python object references (format {format:?}), not bytes"
        )));
    }
    view.call_method0("tobytes")?
        .cast::<PyBytes>()
        .map(|b| b.as_bytes().to_vec())
        .map_err(|_| not_bytes(obj, what))
}

/// The `TypeError` for a notification that is not bytes.
fn not_bytes(obj: &Bound<'_, PyAny>, what: &str) -> PyErr {
    PyTypeError::new_err(format!(
        "{what}: bytes, bytearray or memoryview, not {}",
        crate::error::type_name(obj)
    ))
}
