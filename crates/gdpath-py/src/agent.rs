//! `gdpath.Agent`: registration and posts, bound to the engine's `Agent` and `TransferRequest`;
//! the regions and descriptors it makes and takes are [`crate::region`]'s.

use crate::error::IntoPy;
use crate::memory::{resolve, Options};
use crate::region::{Descriptor, Region};
use crate::transfer::{seconds, PlannedPair, Transfer};
use crate::waker::{Inner as WakerInner, Waker};
use gdpath::{AgentConfig, Op, TransferRequest};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use std::sync::{Arc, Mutex};
use std::time::Instant;

/// The token `agent.notification()` waiters are signalled with (transfer tokens count up from
/// 1 and never reach it).
pub const NOTIFICATION_TOKEN: u64 = u64::MAX;

/// The engine's agent: owns backends and registered memory, plans and posts transfers.
///
/// `Agent(name=None, strict=False)`: `name` is what peers see (`name@address`; default
/// `"local"`); `strict=True` posts every request in the engine's strict mode unless it names
/// its own `accept=` paths: a pair that would not take its preferred path (a fallback, or a
/// degraded path such as pageable host memory) fails at post with `PathNotAccepted`, before
/// any byte moves. Creating an agent loads the CUDA driver where there is one (GPU memory and
/// pinned host memory need it); none is not an error.
#[pyclass(module = "gdpath._native", name = "Agent", frozen)]
pub struct Agent {
    pub(crate) agent: gdpath::Agent,
    strict: bool,
    /// Event loops waiting for notifications (`agent.notification()`), signalled by the
    /// engine's notification hook once it is installed.
    notify_wakers: Arc<Mutex<Vec<Arc<WakerInner>>>>,
    hooked: Mutex<bool>,
    /// With `cluster=`: the record published at `serve` (docs/cluster.md).
    cluster: Option<crate::cluster::Publish>,
}

impl Agent {
    /// An agent with the engine's defaults and `name`.
    pub fn create(py: Python<'_>, name: Option<String>, strict: bool) -> PyResult<Agent> {
        let cfg = AgentConfig {
            name: name.unwrap_or_default(),
            ..AgentConfig::default()
        };
        let agent = py.detach(move || gdpath::Agent::new(cfg)).py_err(py)?;
        Ok(Agent {
            agent,
            strict,
            notify_wakers: Arc::new(Mutex::new(Vec::new())),
            hooked: Mutex::new(false),
            cluster: None,
        })
    }

    fn cluster(&self) -> PyResult<&crate::cluster::Publish> {
        self.cluster
            .as_ref()
            .ok_or_else(|| PyValueError::new_err("this agent was made without cluster=URL"))
    }
}

/// Descriptors from what `post` accepts on one side: a `Region` (all of it), a `Descriptor`, or
/// a sequence of them (pair `i` of the request is element `i` of both sides).
fn descriptors(py: Python<'_>, side: &Bound<'_, PyAny>) -> PyResult<Vec<gdpath::Descriptor>> {
    let one = |o: &Bound<'_, PyAny>| -> PyResult<Option<gdpath::Descriptor>> {
        if let Ok(d) = o.cast::<Descriptor>() {
            return Ok(Some(d.get().engine(py)?));
        }
        if let Ok(r) = o.cast::<Region>() {
            let r = r.get();
            r.check(py)?;
            let r = &r.region;
            return Ok(Some(r.desc(0, r.len().py_err(py)?)));
        }
        Ok(None)
    };
    if let Some(d) = one(side)? {
        return Ok(vec![d]);
    }
    if side.is_instance_of::<pyo3::types::PyString>()
        || side.is_instance_of::<pyo3::types::PyBytes>()
    {
        return Err(PyTypeError::new_err(
            "a side of a transfer is a Region, a Descriptor or a list of them",
        ));
    }
    let mut out = Vec::new();
    for item in side.try_iter().map_err(|_| {
        PyTypeError::new_err(format!(
            "a side of a transfer is a Region, a Descriptor or a list of them, not {}",
            crate::error::type_name(side)
        ))
    })? {
        let item = item?;
        match one(&item)? {
            Some(d) => out.push(d),
            None => {
                return Err(PyTypeError::new_err(format!(
                    "a descriptor list holds Regions and Descriptors, not {}",
                    item.get_type().name()?
                )))
            }
        }
    }
    Ok(out)
}

fn op_of(op: &str) -> PyResult<Op> {
    match op {
        "read" => Ok(Op::Read),
        "write" => Ok(Op::Write),
        other => Err(PyValueError::new_err(format!(
            "op {other:?}: \"read\" (remote → local) or \"write\" (local → remote)"
        ))),
    }
}

#[pymethods]
impl Agent {
    /// `cluster="etcd://HOST:PORT/NAMESPACE"` (with `name`): the agent publishes itself under
    /// `name` when it serves, on a lease of `lease_ttl` seconds (docs/cluster.md); its engine
    /// name is then `NAME#INCARNATION`. Errors: `cluster_url`, `usage` (a name outside
    /// 1..=31 of `A-Z a-z 0-9 . _ -`), `cluster_unreachable`, `cluster_denied`.
    #[new]
    #[pyo3(signature = (name=None, strict=false, *, cluster=None, lease_ttl=10.0))]
    fn new(
        py: Python<'_>,
        name: Option<String>,
        strict: bool,
        cluster: Option<String>,
        lease_ttl: f64,
    ) -> PyResult<Agent> {
        let Some(url) = cluster else {
            return Agent::create(py, name, strict);
        };
        let name = name.ok_or_else(|| PyValueError::new_err("cluster= needs name="))?;
        let publish = crate::cluster::Publish::new(py, &url, &name, lease_ttl)?;
        let mut a = Agent::create(py, Some(publish.engine_name()), strict)?;
        a.cluster = Some(publish);
        Ok(a)
    }

    /// Connects to the agent named `name` in this agent's cluster, waiting up to `timeout`
    /// seconds for its record, and checks that the agent answering is the record's
    /// incarnation. Returns a `gdpath.ClusterPeer` (`.peer`, `.gone`, `.check()`). Errors:
    /// `not_found`, `incarnation_mismatch`, `auth_failed`, `peer_failed`; `ValueError` for an
    /// agent made without `cluster=`.
    #[pyo3(signature = (name, *, token=None, timeout=10.0))]
    fn peer(
        &self,
        py: Python<'_>,
        name: &str,
        token: Option<crate::net::TokenArg>,
        timeout: f64,
    ) -> PyResult<crate::cluster::ClusterPeer> {
        let o = crate::net::connect_options(py, token, timeout)?;
        self.cluster()?
            .peer(py, &self.agent, name, o.token, o.timeout)
    }

    /// `async for event in agent.cluster_events()`: the agents present (`joined`), then every
    /// join, update and leave of the cluster (dicts; see `gdpath.ClusterWatch`).
    fn cluster_events<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        let w = slf.get().cluster()?.watch(slf.py())?;
        slf.py()
            .import("gdpath._aio")?
            .call_method1("cluster_events", (w,))
    }

    /// Publishes this agent's record (address of the last `serve`, regions exported so far) if
    /// it is not published now: after `serve(publish=False)` or `cluster_leave()`. Returns
    /// whether it published. Errors: `usage` before any `serve`, `name_taken`,
    /// `cluster_unreachable`, `cluster_denied`; `ValueError` without `cluster=`.
    fn cluster_publish(&self, py: Python<'_>) -> PyResult<bool> {
        self.cluster()?.republish(py)
    }

    /// Withdraws this agent's record (its lease revoked; peers see it gone at once) while it
    /// keeps serving the connections it has. Returns whether a record was published. Errors:
    /// etcd's when it could not be told (the record then goes within the lease TTL);
    /// `ValueError` without `cluster=`.
    fn cluster_leave(&self, py: Python<'_>) -> PyResult<bool> {
        self.cluster()?.leave(py)
    }

    /// A blocking watch of the cluster (`watch.next(timeout)`).
    fn cluster_watch(&self, py: Python<'_>) -> PyResult<crate::cluster::ClusterWatch> {
        self.cluster()?.watch(py)
    }

    /// The agent's name.
    #[getter]
    fn name(&self) -> &str {
        self.agent.name()
    }

    /// Whether posts default to the engine's strict mode (see the class).
    #[getter]
    fn strict(&self) -> bool {
        self.strict
    }

    /// The backends, in planner order within each preference (`host-copy`, `posix-direct`,
    /// `posix-buffered`, `cuda`, `cufile`, ..., `ucx`).
    #[getter]
    fn backends(&self) -> Vec<&'static str> {
        self.agent.backends().iter().map(|b| b.name).collect()
    }

    /// Registers `obj` and returns its `Region`, zero-copy: the region aliases the object's
    /// memory and keeps the object alive until the region and every transfer on it are gone.
    ///
    /// Accepted: `gdpath.File`; objects with the buffer protocol (`bytearray`, `bytes`,
    /// `memoryview`, NumPy arrays, `mmap`); DLPack (`__dlpack__`: PyTorch tensors, CuPy
    /// arrays; host or GPU memory); `__cuda_array_interface__`. Memory must be one contiguous
    /// span. `pinned`: `None` uses page-locked memory where the object says it is
    /// (`tensor.is_pinned()`, DLPack `kDLCUDAHost`), `True` page-locks host memory now
    /// (`cuMemHostRegister`; needs the CUDA driver), `False` registers it pageable.
    /// `read_only=True` registers writable memory read-only; read-only objects (`bytes`) are
    /// always read-only: a transfer that would write them fails with `read_only_memory`.
    /// `gpu`: the CUDA ordinal of a `__cuda_array_interface__` object that does not name its
    /// device (`ValueError` for other objects, which say where their memory is). Memory that
    /// holds Python object references (a NumPy array of dtype `object`) is refused with
    /// `TypeError`: bytes moved over them would crash the interpreter. Buffer-protocol memory
    /// stays in place for the registration's life: the region holds a buffer export (a
    /// `bytearray`, `array.array` or `mmap` refuses to resize) and a weakref to each NumPy
    /// array the memory lies in (NumPy refuses `resize`, even with `refcheck=False`); a
    /// `ctypes.resize` or an array's `__setstate__`, which nothing refuses, fails the next
    /// post on the region with `memory_moved`.
    ///
    /// Errors: `TypeError` / `ValueError` for what cannot be registered; the engine's as
    /// `gdpath.GdpathError` (`unsupported` for GPU or pinned memory without a CUDA driver,
    /// `open` / `not_a_file` for files, ...).
    #[pyo3(signature = (obj, *, pinned=None, read_only=false, gpu=None))]
    fn register(
        &self,
        py: Python<'_>,
        obj: Bound<'_, PyAny>,
        pinned: Option<bool>,
        read_only: bool,
        gpu: Option<i64>,
    ) -> PyResult<Region> {
        let r = resolve(
            &obj,
            &Options {
                pinned,
                read_only,
                gpu: crate::error::ordinal("gpu", gpu)?,
            },
        )?;
        self.register_resolved(py, obj, r)
    }

    /// Deregisters `region` now: later posts on it fail with `deregistered`. Its memory (and
    /// the object it keeps) is released when the last handle goes. Errors: `region_busy`
    /// while transfers use it or it is exported, `foreign_region` for another agent's.
    fn deregister(&self, py: Python<'_>, region: &Region) -> PyResult<()> {
        self.agent.deregister(&region.region).py_err(py)
    }

    /// Posts a transfer: `op` is `"read"` (remote → local) or `"write"` (local → remote);
    /// `local` and `remote` are a `Region`, a `Descriptor` or equal-length lists of them (pair
    /// `i` is `local[i]` with `remote[i]`, of equal lengths). Every check happens before any
    /// byte moves (lengths, bounds, regions, short files, read-only memory, a path for each
    /// pair). `accept`: strict mode, the path name or names every pair must take
    /// (`"posix-direct"`, `"gds-native"`, `"h2d-pinned"`, `"ucx:tcp"`, ...; an empty list is a
    /// `ValueError`). `timeout`: seconds until the
    /// request's deadline (then `deadline_exceeded`). `notify`: bytes (at most 64 KiB)
    /// delivered to each peer whose memory the transfer wrote, after the writes are visible
    /// there. Returns a `Transfer`; the GIL is released while posting (small host copies run
    /// on this thread).
    #[pyo3(signature = (op, local, remote, *, accept=None, timeout=None, notify=None))]
    // The arguments are the Python signature's.
    #[allow(clippy::too_many_arguments)]
    fn post(
        &self,
        py: Python<'_>,
        op: &str,
        local: Bound<'_, PyAny>,
        remote: Bound<'_, PyAny>,
        accept: Option<Bound<'_, PyAny>>,
        timeout: Option<f64>,
        notify: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Transfer> {
        let req = self.request(py, op, &local, &remote, accept, timeout, notify)?;
        let deadline = req.deadline;
        let agent = self.agent.clone();
        let t = py.detach(move || agent.post(req)).py_err(py)?;
        Ok(Transfer::new(t, deadline))
    }

    /// The planner's choice for each pair of the same request, without moving data (the same
    /// checks as `post`).
    #[pyo3(signature = (op, local, remote, *, accept=None))]
    fn plan(
        &self,
        py: Python<'_>,
        op: &str,
        local: Bound<'_, PyAny>,
        remote: Bound<'_, PyAny>,
        accept: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Vec<PlannedPair>> {
        let req = self.request(py, op, &local, &remote, accept, None, None)?;
        let agent = self.agent.clone();
        let plans = py.detach(move || agent.plan(&req)).py_err(py)?;
        Ok(plans.iter().map(PlannedPair::from).collect())
    }

    /// Enables the network backend with these settings (else the first network call enables
    /// it with the defaults): `fast_local` lets UCX use shared memory between agents of one
    /// host (a dead peer is then noticed only by `op_timeout`); `transports` is `UCX_TLS`
    /// (`"tcp"`), `devices` `UCX_NET_DEVICES` (`"lo"`; by default the engine gives UCX's tcp
    /// the interface the first serve or connect needs); timeouts in seconds; `shared_memory`:
    /// a peer's shared host memory on this node (what `gdpath serve --export host:SIZE`
    /// exports) is written and read in place, without UCX (docs/network.md, "Host memory of
    /// another process"). Errors: `ucx` when UCX cannot be loaded, `config` when already
    /// enabled otherwise.
    #[pyo3(signature = (*, fast_local=false, transports=None, devices=None, connect_timeout=10.0, op_timeout=60.0, shared_memory=true))]
    #[allow(clippy::too_many_arguments)]
    fn enable_net(
        &self,
        py: Python<'_>,
        fast_local: bool,
        transports: Option<String>,
        devices: Option<String>,
        connect_timeout: f64,
        op_timeout: f64,
        shared_memory: bool,
    ) -> PyResult<()> {
        let cfg = crate::net::config(
            fast_local,
            transports,
            devices,
            connect_timeout,
            op_timeout,
            shared_memory,
        )?;
        let agent = self.agent.clone();
        py.detach(move || agent.enable_net(cfg)).py_err(py)
    }

    /// Listens on `addr` (`"127.0.0.1:18515"`; port 0 picks one: `server.address`) and serves
    /// peers from a thread of the engine: handshakes, metadata, withdrawals, notifications.
    /// A non-loopback address needs a `token` (`str` or `bytes`, at least 16 bytes).
    /// Errors: `config` (no token off loopback, address in use), `ucx`. An agent made with
    /// `cluster=` publishes its record here too (`name_taken`, `cluster_unreachable`), unless
    /// `publish=False` (then `cluster_publish()` does it later).
    #[pyo3(signature = (addr, *, token=None, publish=true))]
    fn serve(
        &self,
        py: Python<'_>,
        addr: &str,
        token: Option<crate::net::TokenArg>,
        publish: bool,
    ) -> PyResult<crate::net::Server> {
        let addr = crate::net::address(addr)?;
        let token = crate::net::token(py, token)?;
        let agent = self.agent.clone();
        let s = py.detach(move || agent.serve(addr, token)).py_err(py)?;
        match &self.cluster {
            Some(c) if publish => c.publish(py, s.local_addr())?,
            Some(c) => c.set_addr(s.local_addr()),
            None => {}
        }
        Ok(crate::net::Server::new(s))
    }

    /// Connects to a serving agent at `addr` with `token` (the server's), waiting up to
    /// `timeout` seconds in all (TCP connect, handshake, UCX wireup). Errors: `auth_failed`
    /// (wrong token either side), `peer_failed` (unreachable, no answer; the message names the
    /// phase, `TCP connect:`, `no handshake within … (step)` or `UCX wireup:`, and the bound),
    /// `config` (`timeout=0`), `protocol`, `ucx`.
    #[pyo3(signature = (addr, *, token=None, timeout=10.0))]
    fn connect(
        &self,
        py: Python<'_>,
        addr: &str,
        token: Option<crate::net::TokenArg>,
        timeout: f64,
    ) -> PyResult<crate::net::Peer> {
        let addr = crate::net::address(addr)?;
        let opts = crate::net::connect_options(py, token, timeout)?;
        let agent = self.agent.clone();
        let p = py
            .detach(move || agent.connect_with(addr, &opts))
            .py_err(py)?;
        Ok(crate::net::Peer::new(p, self.agent.clone()))
    }

    /// Exports `region` to peers (host memory; GPU memory where UCX supports CUDA) and
    /// returns the id they know it by. Errors: `read_only_memory` (a peer could write it).
    fn export(&self, py: Python<'_>, region: &Region) -> PyResult<u64> {
        region.check(py)?;
        let (agent, r) = (self.agent.clone(), region.region.clone());
        let id = py.detach(move || agent.export(&r)).py_err(py)?;
        if let Some(c) = &self.cluster {
            c.add_region(py, &self.agent, &region.region)?;
        }
        Ok(id)
    }

    /// Withdraws an exported region: peers' later posts on it fail with `deregistered`; its
    /// memory stays alive until every peer acknowledged.
    fn unexport(&self, py: Python<'_>, region: &Region) -> PyResult<()> {
        let (agent, r) = (self.agent.clone(), region.region.clone());
        py.detach(move || agent.unexport(&r)).py_err(py)
    }

    /// Notifications received so far, oldest first (and removed).
    fn take_notifications(&self) -> Vec<crate::net::Notification> {
        self.agent
            .take_notifications()
            .into_iter()
            .map(Into::into)
            .collect()
    }

    /// The next notification, waiting up to `timeout` seconds (the GIL released; `0` does not
    /// wait; Ctrl-C interrupts the wait within 0.1 s), or `None`. `await agent.notification()`
    /// waits without blocking.
    #[pyo3(signature = (timeout=0.0))]
    fn wait_notification(
        &self,
        py: Python<'_>,
        timeout: f64,
    ) -> PyResult<Option<crate::net::Notification>> {
        let t = seconds("timeout", timeout)?;
        let agent = self.agent.clone();
        Ok(crate::transfer::in_slices(py, t, |s| agent.wait_notification(s))?.map(Into::into))
    }

    /// `await agent.notification()`: the next notification, waiting in asyncio without
    /// blocking the loop (the engine's notification hook wakes it through an eventfd). The
    /// agent must be progressed by its serving thread (`serve`) for notifications to arrive.
    fn notification<'py>(slf: Bound<'py, Self>) -> PyResult<Bound<'py, PyAny>> {
        slf.py()
            .import("gdpath._aio")?
            .call_method1("wait_notification", (slf,))
    }

    /// Installs the engine's notification hook (once) and adds `waker` to those it signals
    /// (with token `2**64 - 1`). For `gdpath._aio`.
    fn _notify_notifications(&self, py: Python<'_>, waker: &Waker) -> PyResult<()> {
        {
            let mut w = self.notify_wakers.lock().unwrap_or_else(|p| p.into_inner());
            let h = waker.handle();
            if !w.iter().any(|x| Arc::ptr_eq(x, &h)) {
                w.push(h);
            }
        }
        let mut hooked = self.hooked.lock().unwrap_or_else(|p| p.into_inner());
        if !*hooked {
            let wakers = self.notify_wakers.clone();
            let agent = self.agent.clone();
            py.detach(move || {
                agent.on_notification(move || {
                    for w in wakers.lock().unwrap_or_else(|p| p.into_inner()).iter() {
                        w.signal(NOTIFICATION_TOKEN);
                    }
                })
            })
            .py_err(py)?;
            *hooked = true;
        }
        Ok(())
    }

    /// Checks a block transfer once and plans its path: `src` blocks (a `gdpath.KvLayout`)
    /// are copied to `dst` blocks (another `KvLayout`; either may lie in a peer's memory).
    /// `src_ids` / `dst_ids` (optional, equal-length int arrays: NumPy, torch CPU tensors,
    /// lists) are kept as the ids `prepared.transfer()` posts when given none. `method`:
    /// `None` (the backend's choice), `"copies"`, `"driver-batch"` or `"kernel"`. Returns a
    /// `gdpath.PreparedBlocks`; see `gdpath.PreparedBlocks.transfer`. Errors, before any byte
    /// moves: `gdpath.BlockError` (kind `blocks`, `.reason` such as `out_of_bounds`,
    /// `overlap`, `mismatch`), `ReadOnlyMemoryError` for a read-only destination,
    /// `DescriptorError` (`foreign_region`), `UnsupportedError` (`no_path`, two remote sides).
    #[pyo3(signature = (src, dst, src_ids=None, dst_ids=None, *, method=None))]
    fn prepare_blocks(
        slf: &Bound<'_, Self>,
        src: Bound<'_, crate::blocks::KvLayout>,
        dst: Bound<'_, crate::blocks::KvLayout>,
        src_ids: Option<Bound<'_, PyAny>>,
        dst_ids: Option<Bound<'_, PyAny>>,
        method: Option<&str>,
    ) -> PyResult<crate::blocks::PreparedBlocks> {
        crate::blocks::prepare(&slf.get().agent, &src, &dst, src_ids, dst_ids, method)
    }

    /// `prepare_blocks(src, dst, method=method).transfer(src_ids, dst_ids, timeout=timeout)`:
    /// a one-off block transfer; returns the `Transfer` (`wait()`, `await`). Its report has
    /// one pair whose `batch` names the copy method and the descriptor counts.
    #[pyo3(signature = (src, dst, src_ids, dst_ids, *, method=None, timeout=None))]
    // The arguments are the Python signature's.
    #[allow(clippy::too_many_arguments)]
    fn transfer_blocks(
        slf: &Bound<'_, Self>,
        src: Bound<'_, crate::blocks::KvLayout>,
        dst: Bound<'_, crate::blocks::KvLayout>,
        src_ids: Bound<'_, PyAny>,
        dst_ids: Bound<'_, PyAny>,
        method: Option<&str>,
        timeout: Option<f64>,
    ) -> PyResult<Transfer> {
        crate::blocks::prepare(&slf.get().agent, &src, &dst, None, None, method)?.post(
            slf.py(),
            Some(&src_ids),
            Some(&dst_ids),
            timeout,
        )
    }

    /// Posts one request of descriptor pairs given as columns, built here without a Python
    /// object per pair (NIXL's prepared lists that do not form block runs): pair `i` is
    /// `local_regions[local_which[i]]` at byte `local_offsets[i]` with
    /// `remote_regions[remote_which[i]]` at byte `remote_offsets[i]`, both `lengths[i]` bytes.
    /// Columns are 1-D int arrays (NumPy, torch CPU tensors; read in place) or sequences of
    /// ints, all of one length. `op`, `timeout` and `notify` as `post`; every check of `post`
    /// happens before any byte moves. Errors: `ValueError` for columns of different lengths or
    /// none; `IndexError` for a `which` entry past its region list; `TypeError` for a column
    /// that holds no ints; `post`'s errors (bounds, regions, paths).
    #[pyo3(signature = (op, local_regions, local_which, local_offsets, remote_regions, remote_which, remote_offsets, lengths, *, timeout=None, notify=None))]
    // The arguments are the Python signature's.
    #[allow(clippy::too_many_arguments)]
    fn post_columns(
        &self,
        py: Python<'_>,
        op: &str,
        local_regions: Vec<PyRef<'_, Region>>,
        local_which: Bound<'_, PyAny>,
        local_offsets: Bound<'_, PyAny>,
        remote_regions: Vec<PyRef<'_, Region>>,
        remote_which: Bound<'_, PyAny>,
        remote_offsets: Bound<'_, PyAny>,
        lengths: Bound<'_, PyAny>,
        timeout: Option<f64>,
        notify: Option<Bound<'_, PyAny>>,
    ) -> PyResult<Transfer> {
        use crate::blocks::u64_column;
        let lw = u64_column(&local_which, "local_which")?;
        let lo = u64_column(&local_offsets, "local_offsets")?;
        let rw = u64_column(&remote_which, "remote_which")?;
        let ro = u64_column(&remote_offsets, "remote_offsets")?;
        let len = u64_column(&lengths, "lengths")?;
        let n = len.len();
        if n == 0
            || [lw.len(), lo.len(), rw.len(), ro.len()]
                .iter()
                .any(|&k| k != n)
        {
            return Err(PyValueError::new_err(format!(
                "post_columns: the five columns must hold one entry per pair, at least one \
                 (lengths {n}, local_which {}, local_offsets {}, remote_which {}, \
                 remote_offsets {})",
                lw.len(),
                lo.len(),
                rw.len(),
                ro.len()
            )));
        }
        for r in local_regions.iter().chain(remote_regions.iter()) {
            r.check(py)?;
        }
        let lr: Vec<&gdpath::Region> = local_regions.iter().map(|r| &r.region).collect();
        let rr: Vec<&gdpath::Region> = remote_regions.iter().map(|r| &r.region).collect();
        let side = |regions: &[&gdpath::Region], which: &[u64], off: &[u64], name: &str| {
            which
                .iter()
                .zip(off)
                .zip(&len)
                .enumerate()
                .map(|(i, ((&w, &o), &l))| {
                    let r = usize::try_from(w)
                        .ok()
                        .and_then(|w| regions.get(w))
                        .ok_or_else(|| {
                            pyo3::exceptions::PyIndexError::new_err(format!(
                                "{name}[{i}] is {w}: there are {} regions",
                                regions.len()
                            ))
                        })?;
                    Ok(r.desc(o, l))
                })
                .collect::<PyResult<Vec<gdpath::Descriptor>>>()
        };
        let mut req = TransferRequest::new(
            op_of(op)?,
            side(&lr, &lw, &lo, "local_which")?,
            side(&rr, &rw, &ro, "remote_which")?,
        );
        if self.strict {
            req = req.preferred_only();
        }
        if let Some(t) = timeout {
            let d = seconds("timeout", t)?;
            if let Some(at) = Instant::now().checked_add(d) {
                req = req.deadline(at);
            }
        }
        if let Some(m) = notify {
            req = req.notify(crate::net::message_bytes(&m, "notify")?);
        }
        let deadline = req.deadline;
        let agent = self.agent.clone();
        let t = py.detach(move || agent.post(req)).py_err(py)?;
        Ok(Transfer::new(t, deadline))
    }

    fn __repr__(&self) -> String {
        format!(
            "gdpath.Agent(name={:?}, strict={}, backends={:?})",
            self.agent.name(),
            if self.strict { "True" } else { "False" },
            self.backends()
        )
    }
}

impl Agent {
    /// Registers what [`resolve`] made of `obj` (the body of `register`, shared with
    /// `gdpath.KvLayout.from_tensor`).
    pub(crate) fn register_resolved(
        &self,
        py: Python<'_>,
        obj: Bound<'_, PyAny>,
        r: crate::memory::Resolved,
    ) -> PyResult<Region> {
        let agent = self.agent.clone();
        let (memory, keep, guard) = (r.memory, r.keep, r.guard);
        let region = py
            .detach(move || match keep {
                Some(k) => agent.register_kept(memory, k),
                None => agent.register(memory),
            })
            .py_err(py)?;
        Ok(Region {
            region,
            obj: (r.via != "file").then(|| obj.unbind()),
            via: r.via,
            guard,
        })
    }

    // The arguments are `post`'s.
    #[allow(clippy::too_many_arguments)]
    fn request(
        &self,
        py: Python<'_>,
        op: &str,
        local: &Bound<'_, PyAny>,
        remote: &Bound<'_, PyAny>,
        accept: Option<Bound<'_, PyAny>>,
        timeout: Option<f64>,
        notify: Option<Bound<'_, PyAny>>,
    ) -> PyResult<TransferRequest> {
        let mut req = TransferRequest::new(
            op_of(op)?,
            descriptors(py, local)?,
            descriptors(py, remote)?,
        );
        match accept.as_ref().map(accept_names).transpose()? {
            Some(names) => {
                let paths = names
                    .iter()
                    .map(|n| n.parse::<gdpath::DataPath>().map_err(gdpath::Error::from))
                    .collect::<Result<Vec<_>, _>>()
                    .py_err(py)?;
                req = req.accept(paths);
            }
            None if self.strict => req = req.preferred_only(),
            None => {}
        }
        if let Some(t) = timeout {
            let d = seconds("timeout", t)?;
            req = match Instant::now().checked_add(d) {
                Some(at) => req.deadline(at),
                None => req,
            };
        }
        if let Some(n) = notify {
            req = req.notify(crate::net::message_bytes(&n, "notify")?);
        }
        Ok(req)
    }
}

/// `accept=`'s path names: one name (`"posix-direct"`) or a list of them. Errors: `TypeError`
/// for anything else, `ValueError` for an empty list (it would accept no path).
fn accept_names(obj: &Bound<'_, PyAny>) -> PyResult<Vec<String>> {
    if let Ok(name) = obj.extract::<String>() {
        return Ok(vec![name]);
    }
    let wrong = |what: &Bound<'_, PyAny>| {
        PyTypeError::new_err(format!(
            "accept: a path name (\"posix-direct\") or a list of path names (each a str), not {}",
            crate::error::type_name(what)
        ))
    };
    // A list's items are checked one by one, so that the message names the item that is wrong
    // (`accept=[1]`: "not int"), not the list.
    // PyO3 would take bytes as a list of ints; a bytes name is refused as bytes.
    if obj.is_instance_of::<pyo3::types::PyBytes>() {
        return Err(wrong(obj));
    }
    let items: Vec<Bound<'_, PyAny>> = obj.extract().map_err(|_| wrong(obj))?;
    let names = items
        .iter()
        .map(|item| item.extract::<String>().map_err(|_| wrong(item)))
        .collect::<PyResult<Vec<String>>>()?;
    if names.is_empty() {
        return Err(PyValueError::new_err(
            "accept=[] would accept no path: name at least one, or pass None for any path",
        ));
    }
    Ok(names)
}
