//! The network backend: remote memory of peer agents, read and written through UCX (`put`/`get`
//! on packed remote keys), with the agent-to-agent control protocol (`crate::net::codec`): the
//! handshake on a TCP connection of its own (`listen`, `tcp`), the rest as active messages on
//! the UCX endpoints made from the worker addresses the handshake exchanged. It is a [`Backend`] like the others and answers
//! [`Backend::network`] ([`crate::backend::network::NetworkBackend`]: connect, serve, exports,
//! notifications), to which the agent's network calls delegate.
//!
//! Modules: [`control`] (the adapter feeding the protocol state machine,
//! [`crate::net::protocol`], and performing its actions: handshake, control messages,
//! goodbyes), [`conn`] (one connection: endpoint and protocol state), [`link`] (the
//! `NetworkBackend` side: `Peer` and `Server` links, the serving thread), [`remote`] (a peer's
//! region materialised as [`Memory::Remote`]), [`ops`] and [`batch`] (descriptor pairs in
//! flight, flushes, notifications), [`packed`] (packed writes, both sides), [`export`] (regions
//! this agent exposes, held until the protocol releases them).
//!
//! Progress: UCX moves data only while workers progress; over `tcp` the *target* worker serves
//! put and get. The backend is [`Drive::Poll`]: `Transfer::wait`/`poll` call
//! [`Backend::progress`]; a serving agent (`crate::net::Server`) runs a thread that does the
//! same, so it serves its peers while the application does other things, and blocks on UCX's
//! event fd when idle ([`wake`]).

mod batch;
pub(crate) mod conn;
mod control;
mod export;
mod link;
mod listen;
mod malloc;
mod ops;
mod packed;
mod ratelog;
pub(crate) mod remote;
mod staging;
mod tcp;
pub(crate) mod wake;

use crate::backend::{Backend, Capability, Drive, PlanChoice, Preference, Refusal};
use crate::error::{Error, Result};
use crate::finding::ids;
use crate::memory::{Memory, MemoryClass};
pub(crate) use crate::net::devices::RDMA_TRANSPORTS;
use crate::net::devices::{self, Need, Plan};
use crate::net::protocol::Node;
use crate::net::{NetConfig, NetEvent, Notification};
use crate::path::DataPath;
use crate::region::{BackendHandle, Descriptor, ForeignMemory, Region};
use crate::transfer::{Op, WorkItem};
use gdpath_ucx::{
    AmMessage, Context, Features, MemHandle, MemType, Resource, Ucx, UcxCfg, UcxError, UcxFacts,
    Worker,
};
use std::collections::{BTreeMap, BTreeSet, HashMap, VecDeque};
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Condvar, Mutex, MutexGuard, OnceLock, Weak};

pub(crate) use conn::PeerConn;
pub(crate) use remote::{ipc_import, shm_import, RemoteMem};

/// Settings of UCX's CUDA transports gdpath prefers, unless the environment sets them
/// (`UCX_<name>`); applied only where UCX supports CUDA memory.
///
/// `CUDA_IPC_ENABLE_GET_ZCOPY=y`: UCX's default (`auto`) turns cuda_ipc's get off on a GPU
/// without an active NVLink (openucx/ucx PR #7566: concurrent PCIe reads were slower than
/// writes in OSU all-to-all runs), and UCX then emulates a GPU → GPU get between processes in
/// software, through host memory and the CPU (`ucx:sysv (software emulation)` with
/// `--fast-local`, `ucx:tcp (software emulation)` with peer error handling), far slower than a
/// peer-to-peer read even over PCIe (docs/benchmarks.md, "Measurements behind the defaults",
/// `UCX_CUDA_IPC_ENABLE_GET_ZCOPY`); NVIDIA's NIXL enables the same setting for the same
/// reason (ai-dynamo/nixl PR #2208).
const UCX_CUDA_DEFAULTS: &[(&str, &str)] = &[("CUDA_IPC_ENABLE_GET_ZCOPY", "y")];

/// Settings gdpath needs before UCX 1.16 where the network is tcp alone (no RDMA transport in
/// the context), unless the environment sets them (`UCX_<name>`).
///
/// `ZCOPY_THRESH=inf` keeps host-memory messages off zero-copy sends. UCX 1.13's
/// `uct_tcp_ep_sendv` completes a zero-copy send twice when the socket fails under it (once in
/// the endpoint's purge, once on return), and its assertion (`uct_iface.h:884 'comp->count >
/// 0'`) aborts the process: a client whose server is killed while a large active message is on
/// the wire dies with it (docs/network.md, "Known UCX defects"). Copied sends complete once.
/// The setting is UCP-wide (UCX 1.13 takes no per-transport one that only tcp reads), so a
/// context with an RDMA transport, whose eager zero-copy it would slow, keeps UCX's own.
const UCX_TCP_DEFAULTS_BEFORE_1_16: &[(&str, &str)] = &[("ZCOPY_THRESH", "inf")];

/// Active-message id of the control protocol.
pub(crate) const CTRL_AM: u16 = crate::net::codec::AM_ID;
// The protocol's largest message is what one UCX active message of this backend carries; the
// protocol crate cannot see UCX, so the two are held equal here.
const _: () = assert!(crate::net::codec::MAX_MESSAGE == gdpath_ucx::AM_MAX_MESSAGE);
/// Notifications kept until the application takes them; more are dropped and counted.
pub(crate) const MAX_QUEUED_NOTIFICATIONS: usize = 4096;

/// Those of [`RDMA_TRANSPORTS`] that do one-sided RMA (UD is datagrams only, so an operation
/// UCX runs on it is emulated): the ones an observed protocol counts as GPUDirect RDMA.
pub(crate) const RDMA_RMA_TRANSPORTS: &[&str] =
    &["rc_mlx5", "dc_mlx5", "gga_mlx5", "rc_verbs", "srd"];

/// Events kept for `Server::next_event`; more are dropped.
const MAX_QUEUED_EVENTS: usize = 1024;

/// How long a posting thread lets the backend go without a progress round. Work UCX finishes at
/// post completes without one (`ops`), so a client that only posts would otherwise never read
/// what its peers send (withdrawals, metadata, goodbyes): it reads them within this bound (a
/// client that waits for anything reads them then). Rounds amid a stream of small puts slowed
/// it, so the bound is long (docs/benchmarks.md, "Measurements behind the defaults",
/// `STALE_ROUND`).
const STALE_ROUND: std::time::Duration = std::time::Duration::from_millis(50);

/// The registration of a local region with UCX (`ucp_mem_map`), kept as the region's backend
/// handle and dropped (unmapped) before the region's memory is freed.
pub(crate) struct LocalMem(pub(crate) MemHandle);

pub(crate) fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// What a failed endpoint means, for a connection's failure: a status of UCX's peer-failure
/// kinds (reset, unreachable, endpoint timeout, ...) is the peer going away (killed, its host or
/// network gone), whatever UCX calls it; another one is named as UCX names it.
pub(crate) fn ep_failure(status: gdpath_ucx::Status) -> String {
    if status.is_peer_failure() {
        format!("the peer went away ({status})")
    } else {
        format!("connection failed: {status}")
    }
}

/// Maps a UCX error of an operation with `peer` to the engine's error.
pub(crate) fn ucx_err(peer: &str, op: &'static str, e: UcxError) -> Error {
    match e {
        UcxError::EndpointFailed { status, .. } => Error::PeerFailed {
            peer: peer.to_owned(),
            detail: ep_failure(status),
        },
        UcxError::Timeout { op, timeout } => Error::PeerFailed {
            peer: peer.to_owned(),
            detail: format!("{op} did not complete within {timeout:?}"),
        },
        source => Error::Ucx { op, source },
    }
}

/// Everything guarded by the backend's state lock. Lock order: state, then a peer's own lock.
pub(crate) struct State {
    pub(crate) peers: Vec<Arc<PeerConn>>,
    /// The protocol's per-agent state: name, the token while serving, the export table.
    pub(crate) node: Node,
    /// The regions behind the export table, until the protocol releases them.
    pub(crate) held: BTreeMap<u64, export::Held>,
    pub(crate) ops: ops::Ops,
    /// Messages that arrived over UCX for client connections still in their handshake (the
    /// server may send as soon as it welcomed), by routing id: handled once the connection is
    /// registered. At most [`MAX_EARLY`] each.
    pub(crate) early: HashMap<u64, Vec<AmMessage>>,
    /// When clients' control connections were last read ([`CTL_CHECK`]).
    pub(crate) ctl_checked: Option<std::time::Instant>,
    /// Regions exported before the UCX context was made, by id: published (mapped, their
    /// rkeys packed) when it is ([`UcxBackend::core_for`]).
    pub(crate) pending_exports: BTreeMap<u64, (Region, crate::net::codec::WireKind)>,
}

/// Messages kept for a connection in its handshake ([`State::early`]); more are dropped.
pub(crate) const MAX_EARLY: usize = 256;

/// How often progress rounds read clients' control connections for the server's end: a server
/// that died is seen within this (a read that would block costs a system call).
pub(crate) const CTL_CHECK: std::time::Duration = std::time::Duration::from_millis(2);

/// The UCX context and worker of a backend, made by its first serve or connect
/// ([`UcxBackend::core_for`]): the worker's tcp transport listens on every network device of
/// the context, and which devices the agent needs is known only then
/// ([`crate::net::devices`]).
pub(crate) struct Core {
    pub(crate) ctx: Context,
    pub(crate) worker: Worker,
    /// The tcp devices the context was restricted to; `None`: not restricted.
    allowed: Option<BTreeSet<String>>,
    /// What the context was made for (`listening on ADDR`, `connecting to ADDR`), for errors.
    made_for: String,
}

/// The UCX backend of one agent: a UCX context and worker, its peers, its exports and the
/// operations in flight.
pub struct UcxBackend {
    /// This backend, for the links and the serving thread it hands out.
    me: Weak<UcxBackend>,
    pub(crate) cfg: NetConfig,
    pub(crate) agent_name: String,
    pub(crate) agent_id: u64,
    /// The UCX library loaded.
    pub(crate) ucx: Arc<Ucx>,
    /// The settings the context is made with (gdpath's defaults that apply, `cfg`'s).
    ucfg: UcxCfg,
    /// The resources of a context made with `ucfg`: the devices to choose from.
    resources: Vec<Resource>,
    /// Whether the engine chooses the network devices (neither `cfg.devices` nor the
    /// environment's `UCX_NET_DEVICES` names them).
    choose_devices: bool,
    /// The context made with `ucfg` at the start, for facts, until [`UcxBackend::core_for`]
    /// takes it (to use, or to drop for one restricted to fewer devices).
    probe: Mutex<Option<Context>>,
    /// Context and worker, once made ([`UcxBackend::core_for`]).
    core: OnceLock<Core>,
    /// Held while the core is made.
    core_init: Mutex<()>,
    /// Serializes the mapping of regions registered before the core existed
    /// ([`UcxBackend::local_mem`]).
    map_lock: Mutex<()>,
    pub(crate) cuda: bool,
    pub(crate) state: Mutex<State>,
    /// The control plane (TCP listener and its thread), while serving.
    pub(crate) control: Mutex<Option<listen::ControlPlane>>,
    /// Warnings that may repeat, rate-limited.
    pub(crate) log: ratelog::RateLog,
    progress_lock: Mutex<()>,
    /// When the last progress round started, in ns since `epoch`.
    last_round: AtomicU64,
    /// The serving thread's idle sleep; posts from other threads wake it.
    pub(crate) wake: wake::Wakeup,
    epoch: std::time::Instant,
    events: Mutex<VecDeque<NetEvent>>,
    /// Signalled when an event is queued.
    event_cv: Condvar,
    pub(crate) notifications: Mutex<VecDeque<Notification>>,
    pub(crate) notifications_dropped: AtomicU64,
    /// Called after a notification is queued (`Agent::on_notification`).
    pub(crate) notification_hooks: Mutex<Vec<crate::backend::network::NotificationHook>>,
    pub(crate) next_peer: AtomicU64,
    /// A retained CUDA primary context made current before UCX unpacks a remote key of GPU
    /// memory (see [`UcxBackend::bind_cuda`]); `None` inside when CUDA cannot be loaded.
    cuda_ctx: std::sync::OnceLock<Option<gdpath_cuda::Context>>,
}

impl std::fmt::Debug for UcxBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("UcxBackend")
            .field("agent", &self.agent_name)
            .field("cfg", &self.cfg)
            .finish()
    }
}

impl UcxBackend {
    /// Loads UCX and creates a context (RMA, active messages, and wakeup for a serving
    /// thread's idle waits) with gdpath's settings, which tells what UCX has here (CUDA
    /// support, transports, devices) and checks `cfg.devices`. The context that moves data,
    /// and its worker, come with the first serve or connect ([`UcxBackend::core_for`]).
    /// Errors: [`Error::Ucx`] (UCX missing or refusing the settings), [`Error::Config`] (a
    /// device of `cfg.devices` no transport uses).
    pub(crate) fn new(agent_name: &str, agent_id: u64, cfg: NetConfig) -> Result<Arc<Self>> {
        let ucx_err = |source| Error::Ucx {
            op: "context",
            source,
        };
        let ucx = gdpath_ucx::Ucx::load().map_err(ucx_err)?;
        // A setting the environment already makes is the user's (and UCX's to warn about).
        let unset = |list: &[(&str, &str)]| -> Vec<(String, String)> {
            list.iter()
                .filter(|(k, _)| std::env::var_os(format!("UCX_{k}")).is_none())
                .map(|&(k, v)| (k.to_owned(), v.to_owned()))
                .collect()
        };
        let cuda_defaults = unset(UCX_CUDA_DEFAULTS);
        let v = ucx.version();
        let tcp_defaults = if (v.major, v.minor) < (1, 16) {
            unset(UCX_TCP_DEFAULTS_BEFORE_1_16)
        } else {
            Vec::new()
        };
        let mut ucfg = UcxCfg {
            // WAKEUP (for the serving thread's idle waits) leaves lane selection alone without
            // TAG (UCX's wireup), and UCX raises its event fd for tcp and shared memory alike
            // (docs/benchmarks.md, "Measurements behind the defaults", `UCP_FEATURE_WAKEUP`);
            // a transport that raised no event would wait for the sleep's 100 ms bound.
            features: Features::RMA | Features::AM | Features::WAKEUP,
            transports: cfg.transports.clone(),
            devices: cfg.devices.clone(),
            defaults: [cuda_defaults.clone(), tcp_defaults.clone()].concat(),
            ..UcxCfg::default()
        };
        // The transports' settings go in from the start, so that where UCX has those
        // transports (what they are for) one context serves. Which transports UCX has is known
        // only once a context exists, and UCX warns about a setting none of them used
        // ("invalid configuration", when the worker is created): there the context is made
        // again without those (cheap: docs/benchmarks.md, "Measurements behind the defaults",
        // one UCX context). Should that fail, the first context serves; should UCX refuse the
        // first at `ucp_init`, one without the settings is tried before giving up (a missing
        // library or a setting UCX refuses fails both alike, so it is not tried again).
        let mut ctx = match Context::with_ucx(ucx.clone(), &ucfg) {
            Ok(c) => c,
            Err(
                e @ gdpath_ucx::UcxError::Status {
                    op: "ucp_init_version",
                    ..
                },
            ) if !ucfg.defaults.is_empty() => {
                tracing::debug!("UCX context with gdpath's transport defaults: {e}");
                ucfg.defaults.clear();
                Context::with_ucx(ucx.clone(), &ucfg).map_err(ucx_err)?
            }
            Err(e) => return Err(ucx_err(e)),
        };
        let cuda = ctx.supports(MemType::Cuda).unwrap_or(false);
        let tcp_alone = ctx.resources().is_ok_and(|rs| {
            rs.iter().any(|r| r.transport == "tcp")
                && !rs
                    .iter()
                    .any(|r| RDMA_TRANSPORTS.contains(&r.transport.as_str()))
        });
        let wanted: Vec<(String, String)> = ucfg
            .defaults
            .iter()
            .filter(|d| {
                (cuda || !cuda_defaults.contains(d)) && (tcp_alone || !tcp_defaults.contains(d))
            })
            .cloned()
            .collect();
        if wanted.len() != ucfg.defaults.len() {
            ucfg.defaults = wanted;
            match Context::with_ucx(ucx, &ucfg) {
                Ok(c) => ctx = c,
                Err(e) => tracing::debug!("UCX context without the unused defaults: {e}"),
            }
        }
        if let Some(devices) = &cfg.devices {
            check_devices(&ctx, devices, &ucfg)?;
        }
        let resources = ctx.resources().map_err(|source| Error::Ucx {
            op: "resources",
            source,
        })?;
        let choose_devices = cfg.devices.is_none() && std::env::var_os("UCX_NET_DEVICES").is_none();
        Ok(Arc::new_cyclic(|me| UcxBackend {
            me: me.clone(),
            cfg,
            agent_name: agent_name.to_owned(),
            agent_id,
            ucx: ctx.ucx().clone(),
            ucfg,
            resources,
            choose_devices,
            probe: Mutex::new(Some(ctx)),
            core: OnceLock::new(),
            core_init: Mutex::new(()),
            map_lock: Mutex::new(()),
            cuda,
            state: Mutex::new(State {
                peers: Vec::new(),
                node: Node::new(agent_name),
                held: BTreeMap::new(),
                ops: ops::Ops::default(),
                early: HashMap::new(),
                ctl_checked: None,
                pending_exports: BTreeMap::new(),
            }),
            control: Mutex::new(None),
            log: ratelog::RateLog::default(),
            progress_lock: Mutex::new(()),
            last_round: AtomicU64::new(0),
            wake: wake::Wakeup::default(),
            epoch: std::time::Instant::now(),
            events: Mutex::new(VecDeque::new()),
            event_cv: Condvar::new(),
            notifications: Mutex::new(VecDeque::new()),
            notifications_dropped: AtomicU64::new(0),
            notification_hooks: Mutex::new(Vec::new()),
            next_peer: AtomicU64::new(1),
            cuda_ctx: std::sync::OnceLock::new(),
        }))
    }

    /// Makes a CUDA context current on the calling thread unless one already is, for UCX calls
    /// that touch CUDA state without a buffer of ours to bind (unpacking a peer's remote key of
    /// GPU memory: UCX's `cuda_ipc` checks there whether it can reach the peer's GPU, in the
    /// current context). NVIDIA's NIXL does the same around its UCX calls. A context already
    /// current (an application that chose its GPU, e.g. `torch.cuda.set_device`) is left as it
    /// is; otherwise the primary context of the first visible GPU is made current and retained
    /// for the backend's life (field `cuda_ctx`, declared last so it is released after the
    /// peers and requests that may use it). The thread keeps that context current afterwards,
    /// as every gdpath-cuda call does (`docs/gpu.md`). No-op when UCX has no CUDA support or no
    /// CUDA driver loads.
    pub(crate) fn bind_cuda(&self) {
        if !self.cuda {
            return;
        }
        let Ok(cuda) = gdpath_cuda::Cuda::load() else {
            return;
        };
        if cuda.has_current_context() {
            return;
        }
        let ctx = self.cuda_ctx.get_or_init(|| {
            gdpath_cuda::Context::new(&cuda, 0)
                .map_err(|e| tracing::debug!("no CUDA context for UCX: {e}"))
                .ok()
        });
        // Binding again after Context::new (which binds) is a harmless cuCtxSetCurrent.
        if let Some(Err(e)) = ctx.as_ref().map(|c| c.bind()) {
            tracing::debug!("binding a CUDA context for UCX: {e}");
        }
    }

    /// The context and worker, once the first serve or connect made them.
    pub(crate) fn core(&self) -> Option<&Core> {
        self.core.get()
    }

    /// [`UcxBackend::core`], or [`Error::Backend`] before the first serve or connect (nothing
    /// that needs it comes before them).
    pub(crate) fn made(&self) -> Result<&Core> {
        self.core().ok_or_else(|| Error::Backend {
            backend: "ucx",
            detail: "no UCX worker yet: the first serve or connect makes it".into(),
        })
    }

    /// The context and worker, made now if this is the first serve or connect, for the
    /// interfaces `need` needs: when the engine chooses the devices, UCX's tcp transport gets
    /// only those (docs/network.md, "UCX's own port"). A core already made must cover them.
    /// Exports made before are published here. Errors: [`Error::NetDevices`] (interfaces not
    /// found, no tcp device on them, outside the first's), [`Error::Ucx`] (context, worker),
    /// and those of publishing an export.
    pub(crate) fn core_for(&self, need: &Need) -> Result<&Core> {
        let core = match self.core() {
            Some(c) => c,
            None => self.make_core(need)?,
        };
        // Also when made now: a thread that waited for another's making gets that core, made
        // for the other's need (the need a core was made for passes its own check).
        if core.allowed.is_some() {
            devices::check_covered(
                &need.reach().map_err(Error::from)?,
                core.allowed.as_ref(),
                &devices::tcp_devices(&self.resources),
                &core.made_for,
                &need.to_string(),
            )
            .map_err(Error::from)?;
        }
        self.publish_pending()?;
        Ok(core)
    }

    fn make_core(&self, need: &Need) -> Result<&Core> {
        let _making = lock(&self.core_init);
        if let Some(c) = self.core() {
            return Ok(c);
        }
        let plan = if self.choose_devices {
            let reach = need.reach().map_err(Error::from)?;
            devices::plan(&reach, &self.resources, need.addr()).map_err(Error::from)?
        } else {
            Plan::ALL
        };
        let ucx_err = |op| move |source| Error::Ucx { op, source };
        let probe = lock(&self.probe).clone();
        let ctx = match (&plan.devices, probe) {
            (None, Some(c)) => c,
            (None, None) => {
                Context::with_ucx(self.ucx.clone(), &self.ucfg).map_err(ucx_err("context"))?
            }
            (Some(d), _) => {
                tracing::debug!("UCX network devices for {need}: {d}");
                let cfg = UcxCfg {
                    devices: Some(d.clone()),
                    ..self.ucfg.clone()
                };
                Context::with_ucx(self.ucx.clone(), &cfg).map_err(ucx_err("context"))?
            }
        };
        let worker = Worker::new(&ctx).map_err(ucx_err("worker"))?;
        worker
            .am_register(CTRL_AM)
            .map_err(ucx_err("am_register"))?;
        let worker_address = worker.address().map_err(ucx_err("worker address"))?;
        lock(&self.state).node.worker_address = worker_address.0;
        let core = self.core.get_or_init(|| Core {
            ctx,
            worker,
            allowed: plan.allowed,
            made_for: need.to_string(),
        });
        // From now on facts describe the core's context.
        lock(&self.probe).take();
        Ok(core)
    }

    /// Facts of the context that moves data, or before the first serve or connect, of the
    /// context made at the start.
    pub(crate) fn facts(&self) -> Result<UcxFacts> {
        let ucx_err = |source| Error::Ucx {
            op: "facts",
            source,
        };
        if let Some(c) = self.core() {
            return c.ctx.facts().map_err(ucx_err);
        }
        // Made meanwhile: the probe is gone once the core is there.
        let probe = lock(&self.probe).clone();
        match probe {
            Some(p) => p.facts().map_err(ucx_err),
            None => self.made()?.ctx.facts().map_err(ucx_err),
        }
    }

    pub(crate) fn push_event(&self, e: NetEvent) {
        tracing::debug!(event = ?e, "net event");
        let mut q = lock(&self.events);
        if q.len() < MAX_QUEUED_EVENTS {
            q.push_back(e);
            self.event_cv.notify_all();
        }
    }

    /// The oldest queued event, waiting up to `timeout` for one (events are pushed by whichever
    /// thread progresses the backend: a serving agent's progress thread).
    pub(crate) fn wait_event(&self, timeout: std::time::Duration) -> Option<NetEvent> {
        let q = lock(&self.events);
        let (mut q, _) = self
            .event_cv
            .wait_timeout_while(q, timeout, |q| q.is_empty())
            .unwrap_or_else(|p| p.into_inner());
        q.pop_front()
    }

    /// The region's UCX registration, made now if the region predates the backend.
    pub(crate) fn local_mem(&self, region: &Region) -> Result<MemHandle> {
        let found = || {
            region.with_backend_handle(self.name(), |h| {
                h.and_then(|h| h.downcast_ref::<LocalMem>())
                    .map(|m| m.0.clone())
            })
        };
        if let Some(m) = found() {
            return Ok(m);
        }
        // One mapping per region, whichever thread gets here first.
        let _mapping = lock(&self.map_lock);
        if let Some(m) = found() {
            return Ok(m);
        }
        let m = self.map_region(region)?.ok_or_else(|| Error::Unsupported {
            what: format!("{} memory over the network", region.kind()),
            backend: "ucx",
        })?;
        let handle = m.clone();
        region.push_handle(self.name(), Box::new(LocalMem(m)));
        Ok(handle)
    }

    /// `ucp_mem_map` of a host region, or of a GPU region when UCX supports CUDA; `None` for
    /// kinds this backend does not map (GPU memory then goes through staging buffers).
    fn map_region(&self, region: &Region) -> Result<Option<MemHandle>> {
        // A region registered before the first serve or connect is mapped when it is first
        // used ([`UcxBackend::local_mem`]).
        let Some(core) = self.core() else {
            return Ok(None);
        };
        if let Some(dev) = crate::backend::cuda::gpu_buffer(region) {
            if !self.cuda || dev.is_empty() {
                return Ok(None);
            }
            dev.context().bind().map_err(|e| Error::Cuda {
                backend: "ucx",
                what: format!("binding GPU {} context", dev.ordinal()),
                source: e,
            })?;
            // The handle is the region's backend handle, dropped before the region's memory,
            // and requests using it hold the region (work items).
            let m =
                crate::os::mem::ucx_map_device(&core.ctx, dev).map_err(|source| Error::Ucx {
                    op: "ucp_mem_map (CUDA)",
                    source,
                })?;
            return Ok(Some(m));
        }
        let Some(mem) = region.host_mem() else {
            return Ok(None);
        };
        if mem.is_empty() {
            return Ok(None);
        }
        // The handle is stored as the region's backend handle, which is dropped before the
        // region's memory (field order of RegionInner), and every request using it also holds
        // the region (work items).
        let m = crate::os::mem::ucx_map_host(&core.ctx, mem).map_err(|source| Error::Ucx {
            op: "ucp_mem_map",
            source,
        })?;
        Ok(Some(m))
    }

    /// Records work posted outside the serving thread's progress rounds and wakes that thread
    /// if it sleeps on the event fd ([`wake::Wakeup::kick`]).
    pub(crate) fn kick(&self) {
        if let Some(c) = self.core() {
            self.wake.kick(&c.worker);
        }
    }

    /// Whether packed writes to peer `id` wait for their acknowledgement.
    pub(crate) fn packed_in_flight(&self, id: u64) -> bool {
        lock(&self.state).ops.packed_in_flight(id)
    }

    /// Runs progress rounds until `done()` or `timeout` passes (a timeout too long to
    /// represent is no bound), sleeping 50 µs after a round that found nothing to do. Returns
    /// whether `done()` held; it is checked before every round.
    pub(crate) fn progress_until(
        &self,
        timeout: std::time::Duration,
        mut done: impl FnMut() -> bool,
    ) -> bool {
        let end = std::time::Instant::now().checked_add(timeout);
        loop {
            if done() {
                return true;
            }
            if end.is_some_and(|e| std::time::Instant::now() >= e) {
                return false;
            }
            if !self.progress_round().1 {
                std::thread::sleep(std::time::Duration::from_micros(50));
            }
        }
    }

    /// One progress round: UCX progress, new connections, control messages, completions,
    /// failed peers. Returns (work items completed, whether anything happened). Only one thread
    /// runs it at a time; others return at once.
    pub(crate) fn progress_round(&self) -> (usize, bool) {
        self.try_progress_round().unwrap_or((0, false))
    }

    /// [`UcxBackend::progress_round`], or `None` when another thread is running one (its
    /// caller must not conclude that nothing is pending: UCX wants a progress call that found
    /// nothing before `ucp_worker_arm`) or there is no worker yet (nothing to progress before
    /// the first serve or connect).
    pub(crate) fn try_progress_round(&self) -> Option<(usize, bool)> {
        let Ok(_g) = self.progress_lock.try_lock() else {
            return None;
        };
        // Before the first serve or connect there is no worker, and nothing to progress.
        let core = self.core()?;
        self.last_round
            .store(self.epoch.elapsed().as_nanos() as u64, Ordering::Relaxed);
        let mut events = 0u32;
        for _ in 0..8 {
            let n = core.worker.progress();
            events += n;
            if n == 0 {
                break;
            }
        }
        let mut activity = events > 0;
        activity |= self.dispatch_messages();
        let done = {
            let mut st = lock(&self.state);
            let done = st.ops.poll(self);
            self.withdraw_flushes_done(&mut st);
            activity |= self.reap_peers(&mut st);
            done
        };
        Some((done, activity || done > 0))
    }
}

impl Backend for UcxBackend {
    fn name(&self) -> &'static str {
        "ucx"
    }

    fn capabilities(&self) -> Vec<Capability> {
        let any = || DataPath::Ucx {
            transport: "any".into(),
        };
        vec![
            Capability::both(
                MemoryClass::Host,
                MemoryClass::Remote,
                any(),
                Preference::Preferred,
            ),
            Capability::both(
                MemoryClass::Gpu,
                MemoryClass::Remote,
                any(),
                Preference::Preferred,
            ),
        ]
    }

    fn drive(&self) -> Drive {
        Drive::Poll
    }

    fn materialize(&self, memory: &Memory) -> Option<Result<Box<dyn ForeignMemory>>> {
        match memory {
            Memory::Remote(r) => Some(self.materialize_remote(r)),
            _ => None,
        }
    }

    fn register(&self, region: &Region) -> Result<Option<BackendHandle>> {
        if let Some(rm) = region
            .foreign()
            .and_then(|f| f.as_any().downcast_ref::<RemoteMem>())
        {
            rm.track(region);
            return Ok(None);
        }
        Ok(self
            .map_region(region)?
            .map(|m| Box::new(LocalMem(m)) as BackendHandle))
    }

    fn plan(
        &self,
        _op: Op,
        local: &Descriptor,
        target: &Descriptor,
    ) -> std::result::Result<PlanChoice, Refusal> {
        let Some(rm) = target
            .region
            .foreign()
            .and_then(|f| f.as_any().downcast_ref::<RemoteMem>())
        else {
            return Err(Refusal::unexplained(
                "target is not a remote region of this agent's network backend",
            ));
        };
        let host = local.region.host_ptr().is_some();
        let path = match rm.peer.planned_path(!host && self.cuda) {
            Ok(p) => p,
            Err(why) => {
                return Err(Refusal::because(
                    ids::NET_PEER_FAILED,
                    // The failure's own text usually names the peer already.
                    if why.contains(&rm.peer.label()) {
                        why
                    } else {
                        format!("peer {}: {why}", rm.peer.label())
                    },
                ));
            }
        };
        if host {
            return Ok(PlanChoice::on(path));
        }
        if crate::backend::cuda::gpu_buffer(&local.region).is_none() {
            return Err(Refusal::unexplained(format!(
                "local {} memory is not served",
                local.region.kind()
            )));
        }
        if self.cuda {
            return Ok(PlanChoice::on(path));
        }
        Ok(PlanChoice {
            path,
            finding: Some(ids::GDR_UCX_NO_CUDA.into()),
            detail: Some(format!(
                "UCX {} has no CUDA support: GPU memory goes through pinned staging buffers",
                self.ucx.version_string()
            )),
        })
    }

    fn plan_per_region(&self) -> bool {
        // The local region's memory and the target's peer decide it, never the ranges.
        true
    }

    fn submit(&self, items: Vec<WorkItem>) {
        // Before posting, so that a withdrawal that already arrived fails these items. The
        // clock is read once: for this check and as the items' start.
        let mut now = std::time::Instant::now();
        let since = (now.saturating_duration_since(self.epoch).as_nanos() as u64)
            .saturating_sub(self.last_round.load(Ordering::Relaxed));
        if since >= STALE_ROUND.as_nanos() as u64 {
            self.progress_round();
            now = std::time::Instant::now();
        }
        let mut st = lock(&self.state);
        st.ops.submit(self, items, now);
        drop(st);
        self.kick();
    }

    fn network(&self) -> Option<&dyn crate::backend::network::NetworkBackend> {
        Some(self)
    }

    fn progress(&self) -> usize {
        // Spin while operations are in flight (NetConfig::poll_spin): a round trip over
        // loopback takes tens of µs, and the waiter otherwise sleeps between calls.
        let start = std::time::Instant::now();
        loop {
            let (done, _) = self.progress_round();
            if done > 0 || start.elapsed() >= self.cfg.poll_spin || !lock(&self.state).ops.busy() {
                return done;
            }
            // Yield rather than spin: on a loaded host (or with the peer on the same cores)
            // a pure spin starves the thread that would answer.
            std::thread::yield_now();
        }
    }
}

/// Refuses a `devices` list (`UCX_NET_DEVICES`, comma-separated) naming a device no transport of
/// `ctx` uses: UCX itself starts without complaint and then has no network transport (a typo,
/// an interface of another namespace), which would show only as failing connections. The
/// error lists the devices UCX does see (a context made without the list, only then).
fn check_devices(ctx: &Context, devices: &str, cfg: &UcxCfg) -> Result<()> {
    let have = ctx.resources().map_err(|source| Error::Ucx {
        op: "resources",
        source,
    })?;
    let missing: Vec<&str> = devices
        .split(',')
        .map(str::trim)
        .filter(|d| !d.is_empty() && *d != "all")
        .filter(|d| !have.iter().any(|r| r.device == *d))
        .collect();
    if missing.is_empty() {
        return Ok(());
    }
    let all = Context::new(&UcxCfg {
        devices: None,
        ..cfg.clone()
    })
    .and_then(|c| c.resources())
    .map(|rs| {
        let mut names: Vec<String> = rs
            .into_iter()
            .filter(|r| !r.device.starts_with("memory"))
            .map(|r| r.device)
            .collect();
        names.sort();
        names.dedup();
        names.join(", ")
    })
    .unwrap_or_else(|e| format!("unknown: {e}"));
    Err(Error::Config(format!(
        "UCX has no transport on device {} (network devices UCX sees here: {all}; `ucx_info -d` \
         lists them)",
        missing.join(", ")
    )))
}

/// A counter of the backend's ids (peers).
pub(crate) fn next(c: &AtomicU64) -> u64 {
    c.fetch_add(1, Ordering::Relaxed)
}
