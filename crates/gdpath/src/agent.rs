//! The agent: owns backends and registered memory, plans and posts transfers.

use crate::backend::network::NetworkBackend;
use crate::backend::{self, Backend, Capability, Drive};
use crate::config::AgentConfig;
use crate::error::{Error, Result, Side};
use crate::memory::{DirectIo, Memory, MemoryClass, MemoryKind};
use crate::os::mem::{HostMem, Keep};
use crate::planner::{plan_pairs, BackendSet};
use crate::region::{Descriptor, FileRegion, Region, RegionId, Storage, UseGuard};
use crate::transfer::{
    group_items, Op, PlannedPair, Pollers, Transfer, TransferRequest, TransferShared, WorkItem,
};
use serde::Serialize;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, RwLock};
use std::time::Instant;

static NEXT_AGENT: AtomicU64 = AtomicU64::new(1);
static NEXT_REGION: AtomicU64 = AtomicU64::new(1);

/// A checked request's plan: the backend set it was planned with, each pair's backend (its
/// position in the set) and each pair's plan.
struct Planned {
    set: Arc<BackendSet>,
    backends: Vec<usize>,
    plans: Vec<PlannedPair>,
}

/// A backend as the agent lists it.
#[derive(Debug, Clone, Serialize)]
pub struct BackendInfo {
    /// The backend's name (`cuda`, `posix-direct`, `ucx`, ...), as plans and reports name it.
    pub name: &'static str,
    /// How its completions happen.
    pub drive: Drive,
    /// The memory-kind pairs it serves, with the path each produces.
    pub capabilities: Vec<Capability>,
}

struct AgentInner {
    id: u64,
    name: String,
    config: AgentConfig,
    /// Replaced whole when a backend is added, so that a transfer takes it with one `Arc` clone.
    backends: RwLock<Arc<BackendSet>>,
    next_transfer: AtomicU64,
    /// Why `Agent::new` could not add the cuda backend (libcuda missing, no GPU), for the error
    /// a GPU registration gets.
    cuda_unavailable: std::sync::OnceLock<String>,
}

/// The engine's entry point. Cheap to clone (`Arc`); shareable between threads, which may post
/// transfers concurrently.
#[derive(Clone)]
pub struct Agent {
    inner: Arc<AgentInner>,
}

impl std::fmt::Debug for Agent {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Agent")
            .field("name", &self.inner.name)
            .field(
                "backends",
                &self.backends().iter().map(|b| b.name).collect::<Vec<_>>(),
            )
            .finish()
    }
}

impl Agent {
    /// An agent with the built-in backends: `host-copy` (host ↔ host), `posix-direct`
    /// (file ↔ host, O_DIRECT + io_uring, preferred), `posix-buffered` (file ↔ host, page
    /// cache, fallback) and, when the CUDA driver loads and sees a GPU, `cuda` (GPU memory,
    /// pinned host memory, P2P / staged / host ↔ GPU paths). A machine without a driver is not an
    /// error: GPU memory is then [`Error::Unsupported`] at registration.
    /// Errors: [`Error::Config`] for invalid settings.
    pub fn new(config: AgentConfig) -> Result<Agent> {
        config.storage.validate()?;
        config.gpu.validate()?;
        config.gds.validate()?;
        let agent = Agent::bare(config);
        let st = agent.inner.config.storage.clone();
        agent.add_backend(Arc::new(backend::host_copy::HostCopy));
        agent.add_backend(Arc::new(backend::posix_direct::PosixDirect::new(&st)));
        agent.add_backend(Arc::new(backend::posix_buffered::PosixBuffered::new(&st)));
        match backend::cuda::CudaBackend::new(agent.inner.config.gpu.clone()) {
            Ok(b) => {
                agent.add_backend(Arc::new(b));
                agent.add_gds_backends()?;
            }
            Err(e) => {
                tracing::debug!(error = %e, "no cuda backend");
                // `CudaBackend::new` says why in `what` ("GPU memory (<loader message>)").
                let why = match e {
                    Error::Unsupported { what, .. } => what,
                    other => format!("GPU memory ({other})"),
                };
                let _ = agent.inner.cuda_unavailable.set(why);
            }
        }
        Ok(agent)
    }

    /// An agent with no backends (add them with [`Agent::add_backend`]).
    pub fn bare(config: AgentConfig) -> Agent {
        let name = if config.name.is_empty() {
            "local".to_owned()
        } else {
            config.name.clone()
        };
        Agent {
            inner: Arc::new(AgentInner {
                id: NEXT_AGENT.fetch_add(1, Ordering::Relaxed),
                name,
                config,
                backends: RwLock::new(Arc::new(BackendSet::default())),
                next_transfer: AtomicU64::new(1),
                cuda_unavailable: std::sync::OnceLock::new(),
            }),
        }
    }

    /// Adds a backend. It is asked to register regions created from now on, and tried by the
    /// planner after backends of the same preference added before it.
    pub fn add_backend(&self, backend: Arc<dyn Backend>) {
        let caps = backend.capabilities();
        let mut set = self
            .inner
            .backends
            .write()
            .unwrap_or_else(|p| p.into_inner());
        *set = Arc::new(set.with(backend, caps));
    }

    pub(crate) fn backend_set(&self) -> Arc<BackendSet> {
        self.inner
            .backends
            .read()
            .unwrap_or_else(|p| p.into_inner())
            .clone()
    }

    /// The backends, in planner order within each preference.
    pub fn backends(&self) -> Vec<BackendInfo> {
        let set = self.backend_set();
        set.list
            .iter()
            .zip(&set.caps)
            .map(|(b, caps)| BackendInfo {
                name: b.name(),
                drive: b.drive(),
                capabilities: caps.clone(),
            })
            .collect()
    }

    /// The first of the agent's backends that reaches peer agents
    /// ([`Backend::network`]), if any.
    pub(crate) fn network(&self) -> Option<Arc<dyn Backend>> {
        self.backend_set()
            .list
            .iter()
            .find(|b| b.network().is_some())
            .cloned()
    }

    /// The network backend, made with `make` and added when the agent has none (under the
    /// backend list's lock, so that two threads cannot both add one).
    pub(crate) fn network_or_add(
        &self,
        make: impl FnOnce(&Agent) -> Result<Arc<dyn Backend>>,
    ) -> Result<Arc<dyn Backend>> {
        let mut set = self
            .inner
            .backends
            .write()
            .unwrap_or_else(|p| p.into_inner());
        if let Some(b) = set.list.iter().find(|b| b.network().is_some()) {
            return Ok(b.clone());
        }
        let b = make(self)?;
        if b.network().is_none() {
            return Err(Error::Config(format!(
                "backend {} reaches no peer agents",
                b.name()
            )));
        }
        let caps = b.capabilities();
        *set = Arc::new(set.with(b.clone(), caps));
        Ok(b)
    }

    /// This agent's id (regions record it).
    pub(crate) fn id(&self) -> u64 {
        self.inner.id
    }

    /// A new transfer id, unique within the agent.
    pub(crate) fn next_transfer_id(&self) -> u64 {
        self.inner.next_transfer.fetch_add(1, Ordering::Relaxed)
    }

    /// [`Agent::post`]'s check of one descriptor (ownership, usability, bounds, file ranges),
    /// without taking the region in use.
    pub(crate) fn check_descriptor(
        &self,
        index: usize,
        side: Side,
        d: &Descriptor,
        is_read: bool,
    ) -> Result<()> {
        self.check_side(index, side, d, is_read, false).map(|_| ())
    }

    /// The agent's name.
    pub fn name(&self) -> &str {
        &self.inner.name
    }

    /// The agent's configuration.
    pub fn config(&self) -> &AgentConfig {
        &self.inner.config
    }

    /// Adds the file ↔ GPU backends, in planning order: `cufile` (GdsNative, preferred),
    /// `file-gpu` (staged: PosixDirect / PosixBuffered into pinned bounce buffers) and
    /// `cufile-compat` (GdsCompat, taken only when asked for). Needs the `cuda` backend.
    ///
    /// The `cufile.json` in force (`$CUFILE_ENV_PATH_JSON`, else `/etc/cufile.json`) is read with
    /// the same parser the doctor uses; a malformed one leaves cuFile's defaults, logged.
    fn add_gds_backends(&self) -> Result<()> {
        let cfg = self.inner.config.gds.clone();
        let live = gdpath_topo::DirView::live();
        let env = std::env::var(crate::gds::CUFILE_ENV).ok();
        let facts = crate::gds::GdsFacts::gather(&live, env.as_deref());
        let (settings, problem) = facts.settings(&live);
        if let Some(problem) = problem {
            tracing::warn!("cufile.json not used: {problem}");
        }
        let (native, compat) = backend::cufile::CufileBackend::pair(cfg.clone(), facts, settings)?;
        self.add_backend(Arc::new(native));
        self.add_backend(backend::file_gpu::FileGpu::new(cfg)?);
        self.add_backend(Arc::new(compat));
        Ok(())
    }

    /// Registers memory and returns its region.
    ///
    /// - Host memory: the region owns the buffer. `pinned: true` ([`Memory::pinned`]) needs the
    ///   CUDA backend, which page-locks the buffer in place; else [`Error::Unsupported`].
    /// - Host memory someone else owns ([`Memory::HostPointer`]): the same, without owning it
    ///   (see [`Agent::register_kept`]); memory its owner already page-locked stays as it is.
    ///   Read-only memory is never written ([`Error::ReadOnlyMemory`] at post).
    /// - Files: opened per [`crate::FileSpec`] (O_DIRECT where the file system allows it and
    ///   the policy asks), or used through the descriptors of a [`crate::OpenFile`] (never
    ///   opened by path); errors: [`Error::Open`], [`Error::NotAFile`], and
    ///   [`Error::Unsupported`] for [`DirectIo::Required`] on a file system that refuses O_DIRECT.
    /// - GPU memory (`Memory::Gpu`, allocated; `Memory::GpuPointer`, someone else's) and remote
    ///   memory: made by the backend that serves them, else [`Error::Unsupported`] naming the
    ///   backend (`cuda`, `ucx`); driver errors (out of memory, bad ordinal) are
    ///   [`Error::Cuda`] (with the driver's error).
    ///
    /// Every backend that serves the region's memory class may then attach its registration
    /// (an error there fails the registration).
    pub fn register(&self, memory: Memory) -> Result<Region> {
        self.register_with(memory, None)
            .map_err(crate::metrics::error)
    }

    /// As [`Agent::register`] for memory someone else owns ([`Memory::HostPointer`],
    /// [`Memory::GpuPointer`]): the region holds `keep` (the owner, or a reference to it: a
    /// Python object, an `Arc` of a framework's allocation) and drops it after its backend
    /// registrations and its memory, when its last handle goes — after every transfer that used
    /// it, since work items hold the region, and, for host memory, after any I/O the kernel has
    /// not completed on it (the memory's [`HostMem`] holds `keep`). That is how a caller keeps
    /// the promise of
    /// [`crate::HostPointer::new`] / [`crate::GpuPointer::new`] for memory whose owner is freed
    /// by a garbage collector. `keep`'s drop may run on any thread (a backend's, after the last
    /// pair completed), so it must not block. Errors: those of [`Agent::register`] (`keep` is
    /// dropped then).
    pub fn register_kept(
        &self,
        memory: Memory,
        keep: impl std::any::Any + Send + Sync,
    ) -> Result<Region> {
        self.register_with(memory, Some(Box::new(keep)))
            .map_err(crate::metrics::error)
    }

    /// [`Agent::register`], with the owner of memory someone else owns.
    fn register_with(&self, memory: Memory, mut keep: Option<Keep>) -> Result<Region> {
        let backends = self.backend_set();
        let kind = memory.kind();
        let read_only = !memory.writable();
        let need_cuda_for_pinned = |pinned: bool| {
            if pinned && backends.serving(MemoryClass::Gpu).next().is_none() {
                return Err(Error::Unsupported {
                    what: "pinned host memory".into(),
                    backend: "cuda",
                });
            }
            Ok(())
        };
        let storage = match memory {
            Memory::Host { buffer, pinned } => {
                need_cuda_for_pinned(pinned)?;
                Storage::Host(HostMem::new(buffer.into_aligned()))
            }
            Memory::HostPointer { memory, pinned } => {
                need_cuda_for_pinned(pinned)?;
                Storage::Host(HostMem::borrowed(memory, keep.take()))
            }
            Memory::File(spec) => {
                let mode = match spec.direct {
                    DirectIo::Auto => self.inner.config.storage.direct,
                    other => other,
                };
                Storage::File(FileRegion::open(&spec.path, spec.access, mode)?)
            }
            Memory::OpenFile(file) => {
                let mode = match file.direct {
                    DirectIo::Auto => self.inner.config.storage.direct,
                    other => other,
                };
                Storage::File(FileRegion::from_open(file, mode)?)
            }
            other => {
                let made = backends.list.iter().find_map(|b| b.materialize(&other));
                match made {
                    Some(m) => Storage::Foreign(m?),
                    None => {
                        let (what, backend) = match &kind {
                            MemoryKind::Gpu { ordinal } => (
                                match self.inner.cuda_unavailable.get() {
                                    Some(why) => why.replacen(
                                        "GPU memory",
                                        &format!("GPU {ordinal} memory"),
                                        1,
                                    ),
                                    None => format!(
                                        "GPU {ordinal} memory (this agent has no cuda backend)"
                                    ),
                                },
                                "cuda",
                            ),
                            _ => ("remote memory".to_owned(), "ucx"),
                        };
                        return Err(Error::Unsupported { what, backend });
                    }
                }
            }
        };
        let class = kind.class();
        let region = Region::new(
            RegionId(NEXT_REGION.fetch_add(1, Ordering::Relaxed)),
            self.inner.id,
            kind,
            storage,
            read_only,
            keep,
        );
        for b in backends.serving(class) {
            if let Some(h) = b.register(&region)? {
                region.push_handle(b.name(), h);
            }
        }
        Ok(region)
    }

    /// Deregisters a region now: later posts using it fail with [`Error::Deregistered`]. The
    /// memory is freed when the last handle is dropped. Errors: [`Error::RegionBusy`] while
    /// transfers use it, [`Error::ForeignRegion`] for another agent's region.
    pub fn deregister(&self, region: &Region) -> Result<()> {
        if region.inner.agent != self.inner.id {
            return Err(Error::ForeignRegion {
                region: region.id(),
            });
        }
        if let Some(net) = self.network() {
            if net.network().is_some_and(|n| n.is_exported(region)) {
                return Err(Error::RegionBusy {
                    region: region.id(),
                    reason: "exported to peer agents: unexport it first".into(),
                });
            }
        }
        region.mark_deregistered()
    }

    /// Checks a request and plans every pair without moving data. Errors: list or pair length
    /// mismatch, foreign / deregistered / busy regions, out of bounds, short file, read-only
    /// file, no path, and (strict mode) [`Error::PathNotAccepted`].
    pub fn plan(&self, request: &TransferRequest) -> Result<Vec<PlannedPair>> {
        Ok(self.check_and_plan(request, None)?.plans)
    }

    /// Checks every pair of `request` and plans it. With `guards`, each pair's two regions are
    /// taken in use as they are checked (what a post needs; the check of a region and the
    /// start of its use are then one step), in pair order.
    fn check_and_plan(
        &self,
        request: &TransferRequest,
        mut guards: Option<&mut Vec<[UseGuard; 2]>>,
    ) -> Result<Planned> {
        let (l, t) = (&request.local, &request.target);
        if l.len() != t.len() {
            return Err(Error::ListLengthMismatch {
                local: l.len(),
                target: t.len(),
            });
        }
        for (i, (ld, td)) in l.iter().zip(t).enumerate() {
            if ld.len != td.len {
                return Err(Error::PairLengthMismatch {
                    index: i,
                    local: ld.len,
                    target: td.len,
                });
            }
        }
        // A notification the wire cannot carry fails here, before any byte moves, rather than
        // after the writes it was to follow.
        if let Some(n) = &request.notify {
            crate::net::codec::notification_fits(n).map_err(Error::ProtocolLimit)?;
        }
        let (local_reads, target_reads) = match request.op {
            Op::Read => (false, true),
            Op::Write => (true, false),
        };
        for (i, (ld, td)) in l.iter().zip(t).enumerate() {
            let take = guards.is_some();
            let lg = self.check_side(i, Side::Local, ld, local_reads, take)?;
            let tg = self.check_side(i, Side::Target, td, target_reads, take)?;
            if let (Some(g), Some(lg), Some(tg)) = (guards.as_deref_mut(), lg, tg) {
                g.push([lg, tg]);
            }
        }
        let set = self.backend_set();
        let (backends, plans) = plan_pairs(
            &set,
            request.op,
            l,
            t,
            request.accept.as_deref(),
            request.preferred_only,
            request.notify.is_some(),
        )?;
        Ok(Planned {
            set,
            backends,
            plans,
        })
    }

    /// Checks one descriptor: ownership, usability, bounds; for files, that a read range exists
    /// (else [`Error::ShortFile`]) and that a written file is writable. With `take`, the region
    /// is taken in use (the usability check and the start of its use are one step) and the
    /// guard returned.
    fn check_side(
        &self,
        index: usize,
        side: Side,
        d: &Descriptor,
        is_read: bool,
        take: bool,
    ) -> Result<Option<UseGuard>> {
        let r = &d.region;
        if r.inner.agent != self.inner.id {
            return Err(Error::ForeignRegion { region: r.id() });
        }
        let guard = if take {
            Some(r.begin_use()?)
        } else {
            r.check_usable()?;
            None
        };
        if !is_read && r.is_read_only() {
            return Err(Error::ReadOnlyMemory {
                region: r.id(),
                detail: format!(
                    "descriptor {index} ({side}) would be written by this {}",
                    if side == Side::Local { "read" } else { "write" }
                ),
            });
        }
        let end = d.offset.checked_add(d.len);
        if let Some(f) = r.file() {
            let size = f.size()?;
            if is_read {
                match end {
                    Some(e) if e <= size => {}
                    _ => {
                        return Err(Error::ShortFile {
                            path: f.path().to_owned(),
                            offset: d.offset,
                            wanted: d.len,
                            available: size.saturating_sub(d.offset),
                        })
                    }
                }
            } else {
                if !f.access().writable() {
                    return Err(Error::ReadOnly {
                        path: f.path().to_owned(),
                    });
                }
                if end.is_none_or(|e| e > i64::MAX as u64) {
                    return Err(Error::OutOfBounds {
                        index,
                        side,
                        region: r.id(),
                        offset: d.offset,
                        len: d.len,
                        region_len: i64::MAX as u64,
                    });
                }
            }
            return Ok(guard);
        }
        let len = r.len()?;
        match end {
            Some(e) if e <= len => Ok(guard),
            _ => Err(Error::OutOfBounds {
                index,
                side,
                region: r.id(),
                offset: d.offset,
                len: d.len,
                region_len: len,
            }),
        }
    }

    /// Plans and starts a transfer; returns once it is started. Backends may finish small work
    /// before returning (host memcpy; GPU copies of at most 256 KiB per post, where handing them
    /// to a thread costs more than the copy). Every check of [`Agent::plan`] happens first, so a
    /// failed post moved no byte.
    pub fn post(&self, request: TransferRequest) -> Result<Transfer> {
        let began = Instant::now();
        let (write, pairs) = (request.op == Op::Write, request.local.len());
        let posted = self.post_checked(request).map_err(crate::metrics::error)?;
        crate::metrics::posted(write, pairs, began.elapsed());
        Ok(posted)
    }

    /// [`Agent::post`] without its metrics: the plan phase, then the post phase under the
    /// transfer's span and NVTX ranges.
    fn post_checked(&self, request: TransferRequest) -> Result<Transfer> {
        let mut guards = Vec::with_capacity(request.local.len());
        let planned = {
            let _span = tracing::trace_span!("plan", pairs = request.local.len()).entered();
            let _nvtx = gdpath_cuda::nvtx::get().map(|t| t.push("gdpath plan"));
            self.check_and_plan(&request, Some(&mut guards))?
        };
        let Planned {
            set,
            backends,
            plans,
        } = planned;
        let mut pollers = Pollers::default();
        for (k, &bi) in backends.iter().enumerate() {
            // Pairs on one backend are the rule: look at each backend once.
            if backends[..k].contains(&bi) {
                continue;
            }
            let b = &set.list[bi];
            if b.drive() == Drive::Poll {
                pollers.push(b.clone());
            }
        }
        let id = self.next_transfer_id();
        let TransferRequest {
            op,
            local,
            target,
            deadline,
            notify,
            ..
        } = request;
        let shared = TransferShared::new(id, deadline, plans, notify);
        let _span = tracing::trace_span!(parent: &shared.span, "post").entered();
        let _nvtx = gdpath_cuda::nvtx::get().map(|t| t.push("gdpath post"));
        let mut items = Vec::with_capacity(local.len());
        let pairs = local.into_iter().zip(target).zip(guards);
        for (i, ((ld, td), pair_guards)) in pairs.enumerate() {
            let item = WorkItem::new(i, op, ld, td, shared.clone(), pair_guards);
            if item.local().len == 0 {
                item.complete(Ok(0));
                continue;
            }
            items.push(item);
        }
        for (bi, v) in group_items(items, |item| backends[item.index()]) {
            set.list[bi].submit(v);
        }
        Ok(Transfer { shared, pollers })
    }
}

/// Remote memory between agents (`crate::net`): the user API, delegating to the agent's
/// network backend ([`Backend::network`]), which the first of these calls adds with
/// [`crate::net::NetConfig::default`] unless [`Agent::enable_net`] came first.
impl Agent {
    /// The network backend, added with `cfg` when the agent has none.
    fn net_with(&self, cfg: &crate::net::NetConfig) -> Result<Arc<dyn Backend>> {
        self.network_or_add(|a| {
            Ok(backend::ucx::UcxBackend::new(a.name(), a.id(), cfg.clone())? as Arc<dyn Backend>)
        })
    }

    /// Runs `f` on the network backend, adding it with the default settings first if needed.
    fn with_net<R>(&self, f: impl FnOnce(&dyn NetworkBackend) -> Result<R>) -> Result<R> {
        let b = self.net_with(&crate::net::NetConfig::default())?;
        f(b.network().expect("found by network()"))
    }

    /// Enables the network backend with `cfg` (otherwise the first network call enables it
    /// with [`crate::net::NetConfig::default`]). Errors: [`Error::Ucx`] when UCX cannot be
    /// loaded or set up; [`Error::Config`] when it is already enabled with another
    /// configuration, or `cfg.devices` names no device UCX has.
    pub fn enable_net(&self, cfg: crate::net::NetConfig) -> Result<()> {
        let b = self.net_with(&cfg)?;
        if b.network().map(|n| n.net_config()) != Some(&cfg) {
            return Err(Error::Config(
                "the network backend is already enabled with another configuration".into(),
            ));
        }
        Ok(())
    }

    /// Connects to a serving agent at `addr` without a token; see [`Agent::connect_with`].
    pub fn connect(&self, addr: std::net::SocketAddr) -> Result<crate::net::Peer> {
        self.connect_with(addr, &crate::net::ConnectOptions::default())
    }

    /// Connects to a serving agent and exchanges metadata: challenge, mutual authentication
    /// with `opts.token`, then the server's regions (id, kind, length, packed rkey). Errors:
    /// [`Error::AuthFailed`] (wrong token either side), [`Error::PeerFailed`] (unreachable, no
    /// answer within `opts.timeout`; its detail names the phase that failed or waited: `TCP
    /// connect`, the handshake's step — `no handshake within …` while waiting for the server's
    /// challenge, or `auth:` for its answer to this side's proof of the token — or `UCX wireup`,
    /// with the bound), [`Error::Config`] for a zero `opts.timeout`, [`Error::Protocol`]
    /// (malformed metadata), [`Error::Ucx`];
    /// [`Error::NetDevices`] when the engine chooses UCX's devices and this agent's UCX context,
    /// made for its first serve or connect, does not cover the interface `addr` needs; errors
    /// of publishing regions exported before the first serve or connect.
    pub fn connect_with(
        &self,
        addr: std::net::SocketAddr,
        opts: &crate::net::ConnectOptions,
    ) -> Result<crate::net::Peer> {
        self.with_net(|n| n.connect(addr, opts))
            .map(crate::net::Peer::new)
            .map_err(crate::metrics::error)
    }

    /// Listens on `listen` and serves peers from a background thread: handshakes, metadata,
    /// withdrawals, notifications, and (over `tcp`) the puts and gets peers post.
    ///
    /// A non-loopback address needs a token ([`crate::net::Token::new`]), else
    /// [`Error::Config`]. One listener per agent. Errors: [`Error::Config`] (address in use),
    /// [`Error::Ucx`]; [`Error::NetDevices`] as for [`Agent::connect_with`] (the listen
    /// address's interface); errors of publishing regions exported before.
    pub fn serve(
        &self,
        listen: std::net::SocketAddr,
        token: crate::net::Token,
    ) -> Result<crate::net::Server> {
        if !listen.ip().is_loopback() && token.is_none() {
            return Err(Error::Config(format!(
                "serving on {listen}, which is not a loopback address, needs a token"
            )));
        }
        self.with_net(|n| n.serve(listen, token))
            .map(crate::net::Server::new)
    }

    /// Exports `region` to peers (host memory, and GPU memory with a CUDA-enabled UCX): it
    /// appears in the metadata they receive, and peers already connected get an update.
    /// Returns the id peers know it by. Regions not exported are never visible to peers.
    /// Read-only memory is refused ([`Error::ReadOnlyMemory`]): a peer's remote key could
    /// write it.
    pub fn export(&self, region: &Region) -> Result<u64> {
        if region.is_read_only() {
            return Err(Error::ReadOnlyMemory {
                region: region.id(),
                detail: "exported memory can be written by peers (a UCX remote key grants writes)"
                    .into(),
            });
        }
        self.with_net(|n| n.export(region))
    }

    /// What peers learn of exported `region` from this agent's metadata: the id they know it
    /// by, its kind and length in bytes, and the same-node shortcuts offered with it (`shm`: a
    /// sealed memfd an agent of this node maps; `cuda_ipc`: a CUDA IPC handle it opens). For a
    /// region exported before the first serve or connect, the entry it will be published with.
    /// Errors: [`Error::Config`] when it is not exported, [`Error::ForeignRegion`].
    pub fn export_info(&self, region: &Region) -> Result<crate::net::RemoteRegionInfo> {
        self.with_net(|n| n.export_info(region))
    }

    /// Withdraws an exported region: peers are told, later posts on their side fail with
    /// [`Error::Deregistered`], and its memory stays alive until every peer acknowledged that
    /// its operations on it completed (or disconnected).
    pub fn unexport(&self, region: &Region) -> Result<()> {
        self.with_net(|n| n.unexport(region))
    }

    /// Notifications received so far, oldest first.
    pub fn take_notifications(&self) -> Vec<crate::net::Notification> {
        self.network()
            .and_then(|b| b.network().map(|n| n.take_notifications()))
            .unwrap_or_default()
    }

    /// Waits up to `timeout` for a notification (progressing the backend when no serving
    /// thread does).
    pub fn wait_notification(
        &self,
        timeout: std::time::Duration,
    ) -> Option<crate::net::Notification> {
        self.network()?.network()?.wait_notification(timeout)
    }

    /// Runs `hook` after each notification is queued, on the thread that progressed the network
    /// backend (the serving thread of [`Agent::serve`], or a waiter); the notification is then
    /// there for [`Agent::take_notifications`] / [`Agent::wait_notification`]. The hook must
    /// not block. For event loops that sleep on a file descriptor (the Python binding's `await
    /// agent.notification()` writes an eventfd). Notifications arrive only while something
    /// progresses the backend: a serving agent's thread does. Enables the network backend with
    /// its defaults if it is not enabled yet (errors: as [`Agent::enable_net`]).
    pub fn on_notification(&self, hook: impl Fn() + Send + Sync + 'static) -> Result<()> {
        self.with_net(|n| {
            n.on_notification(Arc::new(hook));
            Ok(())
        })
    }

    /// Facts about the UCX library the network backend uses (version, transports, CUDA).
    pub fn ucx_facts(&self) -> Result<gdpath_ucx::UcxFacts> {
        self.with_net(|n| n.ucx_facts())
    }
}
