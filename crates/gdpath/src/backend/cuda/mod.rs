//! `cuda`: GPU memory regions and the GPU data paths.
//!
//! Memory ([`memory`]): `Memory::Gpu` (allocated here), `Memory::GpuPointer` (someone else's
//! device memory) and pinned host memory (`Memory::pinned`, page-locked in place).
//!
//! Paths, chosen per descriptor pair by [`CudaBackend::plan`]:
//!
//! | pair | path | how |
//! | --- | --- | --- |
//! | GPU a ↔ GPU b, P2P possible ([`gpu_pair_path`]) | `P2pNvlink` (NVLink count > 0 in the driver facts) or `P2pPcie` | `cuMemcpyPeerAsync` with peer access on ([`direct`]) |
//! | GPU a ↔ GPU b, P2P impossible or off | `Staged` + `p2p.unsupported` / `p2p.disabled` | pinned bounce buffers, pipelined ([`staged`]) |
//! | GPU a ↔ GPU a | `DeviceLocal` | `cuMemcpyDtoDAsync` |
//! | pinned host ↔ GPU | `HostToDevice`/`DeviceToHost { pinned: true }` | one async copy ([`direct`]) |
//! | pageable host ↔ GPU | `… { pinned: false }` + `system.host-pageable` | threads + bounce buffers ([`pageable`]); the driver's own copy below 16 MiB |
//! | GPU ↔ a peer agent's GPU region on this node, opened through CUDA IPC ([`ipc`]) | `DeviceLocal` (the same GPU) or `P2pNvlink`/`P2pPcie` | as between local GPU memory, on the mapping |
//! | GPU ↔ a peer agent's shared host region on this node ([`crate::backend::shm`]) | `HostToDevice`/`DeviceToHost { pinned: true }` | as with pinned host memory, on the mapping (page-locked here once) |
//!
//! Many descriptors at once ([`lists`]): a block list ([`crate::blocks`]), and three or more
//! consecutive pairs of one request between the same two regions on a direct path, are one list
//! posted through `gdpath_cuda`'s block copier (one kernel launch or one `cuMemcpyBatchAsync`)
//! or, for one or two merged descriptors, plain copies; the method is chosen by count and size
//! ([`lists::choose_method`]) and reported in the pairs' [`crate::PairReport::batch`].
//!
//! Execution: [`Backend::submit`] queues work (an item, or a batch of items) to
//! `GpuConfig::workers` threads; each runs it on pooled streams, waits for them, and completes
//! the items from that thread. A submission of at most [`INLINE_MAX`] bytes runs on the posting
//! thread instead.

mod devices;
mod direct;
mod ipc;
mod lists;
pub mod memory;
mod pageable;
mod pair;
mod pool;
mod staged;

pub(crate) use ipc::export_meta as ipc_export_meta;
pub use ipc::IpcImport;
pub use memory::{gpu_buffer, is_pinned, GpuMemory};
pub use pair::{gpu_pair_path, gpu_pair_path_from_facts};

use super::{Backend, Capability, PlanChoice, Preference, Refusal};
use crate::config::GpuConfig;
use crate::error::{Error, Result};
use crate::finding::ids;
use crate::memory::{Memory, MemoryClass, MemoryKind};
use crate::path::DataPath;
use crate::region::{BackendHandle, Descriptor, ForeignMemory, Region};
use crate::transfer::{Op, WorkItem};
use devices::{Gpus, PeerLink};
use gdpath_cuda::CudaError;
use lists::BATCH_MIN_PAIRS;
use memory::{cuda_err, PinnedHandle};
use pageable::{Dir, HostRange, Stop};
use pool::StagingPool;
use std::sync::Arc;

/// Backend name.
pub const NAME: &str = "cuda";

struct Shared {
    gpus: Gpus,
    cfg: GpuConfig,
    pool: StagingPool,
}

/// The CUDA backend. Made by [`CudaBackend::new`]; [`crate::Agent::new`] adds it when the
/// driver loads and sees at least one GPU.
pub struct CudaBackend {
    shared: Arc<Shared>,
    tx: crossbeam_channel::Sender<Job>,
}

/// Work for the worker threads.
enum Job {
    /// One item: a pair on its own, or a block list.
    One(WorkItem),
    /// Consecutive pairs of one request between the same regions, moved as one list.
    Batch(Vec<WorkItem>),
}

impl Job {
    fn bytes(&self) -> u64 {
        let item = |i: &WorkItem| i.blocks().map_or(i.local().len, |l| l.bytes());
        match self {
            Job::One(i) => item(i),
            Job::Batch(v) => v.iter().map(item).sum(),
        }
    }
}

impl std::fmt::Debug for CudaBackend {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("CudaBackend")
            .field("gpus", &self.shared.gpus.count())
            .field("config", &self.shared.cfg)
            .finish()
    }
}

/// A submission of at most this many bytes (all its pairs together) is copied on the posting
/// thread, so `Agent::post` returns with it done; larger ones go to the worker threads: below
/// it the hand-off to a worker costs more than the copy (docs/benchmarks.md, "Measurements
/// behind the defaults").
const INLINE_MAX: u64 = 1 << 20;

impl CudaBackend {
    /// Loads the CUDA driver and starts `cfg.workers` threads.
    ///
    /// Errors: [`Error::Config`] for invalid settings; [`Error::Unsupported`] when libcuda
    /// cannot be loaded (the loader's message, naming the library and what installs it, is in
    /// `what`) or the driver sees no GPU.
    pub fn new(cfg: GpuConfig) -> Result<CudaBackend> {
        cfg.validate()?;
        let gpus = Gpus::load().map_err(|e| Error::Unsupported {
            what: format!("GPU memory ({e})"),
            backend: NAME,
        })?;
        if gpus.count() == 0 {
            return Err(Error::Unsupported {
                what: "GPU memory (the CUDA driver sees no GPU)".into(),
                backend: NAME,
            });
        }
        let shared = Arc::new(Shared {
            gpus,
            pool: StagingPool::new(&cfg),
            cfg,
        });
        let (tx, rx) = crossbeam_channel::unbounded::<Job>();
        for i in 0..shared.cfg.workers {
            let (rx, sh) = (rx.clone(), shared.clone());
            std::thread::Builder::new()
                .name(format!("gdpath-cuda-{i}"))
                .spawn(move || {
                    // Ends when the backend (the only sender) is dropped.
                    for job in rx {
                        sh.run(job);
                    }
                })
                .map_err(|e| Error::Backend {
                    backend: NAME,
                    detail: format!("starting worker threads: {e}"),
                })?;
        }
        Ok(CudaBackend { shared, tx })
    }

    /// Number of GPUs the backend drives.
    pub fn gpu_count(&self) -> u32 {
        self.shared.gpus.count()
    }

    /// The settings.
    pub fn config(&self) -> &GpuConfig {
        &self.shared.cfg
    }
}

/// Source and destination of a pair (Write: local → target; Read: target → local).
fn ends<'a>(
    op: Op,
    local: &'a Descriptor,
    target: &'a Descriptor,
) -> (&'a Descriptor, &'a Descriptor) {
    match op {
        Op::Write => (local, target),
        Op::Read => (target, local),
    }
}

impl Shared {
    /// The path for moving `src` to `dst`.
    fn choose(
        &self,
        src: &Descriptor,
        dst: &Descriptor,
    ) -> std::result::Result<PlanChoice, Refusal> {
        match (src.region.kind(), dst.region.kind()) {
            (MemoryKind::Gpu { ordinal: a }, MemoryKind::Gpu { ordinal: b }) => {
                if a == b {
                    return Ok(PlanChoice::on(DataPath::DeviceLocal));
                }
                let staged = |finding: &str, detail: String| PlanChoice {
                    path: DataPath::Staged,
                    finding: Some(finding.into()),
                    detail: Some(detail),
                };
                match self.gpus.peer_link(*a, *b) {
                    PeerLink::Impossible(why) => Ok(staged(ids::P2P_UNSUPPORTED, why)),
                    PeerLink::Possible(_) if !self.cfg.p2p => Ok(staged(
                        ids::P2P_DISABLED,
                        "P2P switched off in the agent's configuration (GpuConfig::p2p)".into(),
                    )),
                    PeerLink::Possible(path) => Ok(PlanChoice::on(path)),
                }
            }
            (MemoryKind::Host { .. }, MemoryKind::Gpu { .. }) => {
                Ok(host_choice(DataPath::HostToDevice {
                    pinned: is_pinned(&src.region),
                }))
            }
            (MemoryKind::Gpu { .. }, MemoryKind::Host { .. }) => {
                Ok(host_choice(DataPath::DeviceToHost {
                    pinned: is_pinned(&dst.region),
                }))
            }
            (MemoryKind::Gpu { ordinal }, MemoryKind::Remote { .. }) => {
                match crate::backend::ucx::shm_import(&dst.region) {
                    Some(Ok(imp)) => self.shm_choice(imp, DataPath::DeviceToHost { pinned: true }),
                    Some(Err(e)) => Err(e.to_string()),
                    None => self.ipc_choice(*ordinal, &dst.region),
                }
                .map_err(Refusal::unexplained)
            }
            (MemoryKind::Remote { .. }, MemoryKind::Gpu { ordinal }) => {
                match crate::backend::ucx::shm_import(&src.region) {
                    Some(Ok(imp)) => self.shm_choice(imp, DataPath::HostToDevice { pinned: true }),
                    Some(Err(e)) => Err(e.to_string()),
                    None => self.ipc_choice(*ordinal, &src.region),
                }
                .map_err(Refusal::unexplained)
            }
            (s, d) => Err(Refusal::unexplained(format!(
                "{NAME} does not move {s} to {d}"
            ))),
        }
    }

    /// The path between local GPU `gpu` and a peer's region on this node opened through CUDA
    /// IPC (opening the mapping here, once): `DeviceLocal` when the exporter's GPU is `gpu`,
    /// else the P2P path of the two GPUs. Refused (the network backend then takes the pair)
    /// when the region has no IPC handle of this node, the handle does not open (the exporter's
    /// own process), its GPU is not visible here, P2P is impossible or switched off, or
    /// `GpuConfig::ipc` is off.
    fn ipc_choice(&self, gpu: u32, remote: &Region) -> std::result::Result<PlanChoice, String> {
        if !self.cfg.ipc {
            return Err(
                "CUDA IPC switched off in the agent's configuration (GpuConfig::ipc)".into(),
            );
        }
        let imp = crate::backend::ucx::ipc_import(remote).ok_or_else(|| {
            format!(
                "remote region {} has no CUDA IPC handle of this node (another host, or host \
                 memory)",
                remote.id()
            )
        })?;
        let theirs = self.gpus.ordinal_of_pci(imp.pci()).ok_or_else(|| {
            format!(
                "the exporter's GPU {} is not visible to this process",
                imp.pci()
            )
        })?;
        imp.mapping(&self.gpus, gpu)?;
        if theirs == gpu {
            return Ok(PlanChoice::on(DataPath::DeviceLocal));
        }
        match self.gpus.peer_link(gpu, theirs) {
            PeerLink::Possible(_) if !self.cfg.p2p => {
                Err("P2P switched off in the agent's configuration (GpuConfig::p2p)".into())
            }
            PeerLink::Possible(path) => Ok(PlanChoice::on(path)),
            PeerLink::Impossible(why) => Err(why),
        }
    }

    /// `path` (pinned host ↔ GPU) for a peer's shared host region on this node, once its
    /// mapping is made and page-locked here. Refused (UCX then takes the pair) when it cannot
    /// be mapped or locked.
    fn shm_choice(
        &self,
        imp: &crate::backend::shm::ShmImport,
        path: DataPath,
    ) -> std::result::Result<PlanChoice, String> {
        self.shm_pinned(imp)?;
        Ok(PlanChoice::on(path))
    }

    /// The page-locked mapping of a peer's shared host region (locked on first use, kept with
    /// the import; a failure is kept too).
    pub(crate) fn shm_pinned(
        &self,
        imp: &crate::backend::shm::ShmImport,
    ) -> std::result::Result<Arc<PinnedHandle>, String> {
        imp.pinned
            .get_or_init(|| {
                let mem = imp.mem()?.clone();
                let ctx = self.gpus.context(0).map_err(|e| e.to_string())?;
                let reg = crate::os::mem::pin_host_memory(&ctx, &mem)
                    .map_err(|e| format!("page-locking the peer's shared host memory: {e}"))?;
                Ok(Arc::new(PinnedHandle::new(reg)))
            })
            .clone()
    }

    /// GPU → GPU through pinned bounce buffers ([`staged`]), with the backend's settings.
    fn staged(
        &self,
        s: &gdpath_cuda::DeviceBuffer,
        so: usize,
        d: &gdpath_cuda::DeviceBuffer,
        dof: usize,
        len: usize,
        stop: &dyn Fn() -> Option<Error>,
    ) -> std::result::Result<(), Stop> {
        let n = self.cfg.staging_buffers;
        staged::copy(&self.gpus, &self.pool, n, s, so, d, dof, len, stop)
    }

    /// Runs a job on this thread and completes its items.
    fn run(&self, job: Job) {
        match job {
            Job::One(item) if item.blocks().is_some() => match self.execute_blocks(&item) {
                Ok((bytes, rep)) => item.complete_batch(Ok(bytes), rep),
                Err(e) => item.complete(Err(e)),
            },
            Job::One(item) => {
                let r = self.execute(&item);
                item.complete(r);
            }
            Job::Batch(items) => self.execute_batch(items),
        }
    }

    fn execute(&self, item: &WorkItem) -> Result<u64> {
        if let Some(stop) = item.stop_reason() {
            return Err(stop);
        }
        item.mark_started();
        let (src, dst) = ends(item.op(), item.local(), item.target());
        let len = src.len as usize;
        let (so, dof) = (src.offset as usize, dst.offset as usize);
        let stop = || item.stop_reason();
        let what = format!("{} of {len} bytes", item.path());
        let fail = |e: CudaError| cuda_err(&what, e);
        let stopped = |e: Stop| match e {
            Stop::Cuda(e) => cuda_err(&what, e),
            Stop::Engine(e) => e,
        };
        match item.path() {
            DataPath::P2pNvlink | DataPath::P2pPcie | DataPath::DeviceLocal => {
                let gpu = match item.local().region.kind() {
                    MemoryKind::Gpu { ordinal } => Some(*ordinal),
                    _ => None,
                };
                let (se, de) = (self.end(src, gpu)?, self.end(dst, gpu)?);
                let (lists::End::Dev { buf: s, off: sb }, lists::End::Dev { buf: d, off: db }) =
                    (&se, &de)
                else {
                    return Err(Error::Backend {
                        backend: NAME,
                        detail: format!("{} needs GPU memory on both sides", item.path()),
                    });
                };
                if s.ordinal() != d.ordinal() {
                    self.gpus
                        .ensure_peer_access(s.ordinal(), d.ordinal())
                        .map_err(&fail)?;
                }
                let (so, dof) = (so + *sb as usize, dof + *db as usize);
                direct::peer(&self.gpus, s, so, d, dof, len).map_err(&fail)?;
            }
            DataPath::Staged => {
                let (s, d) = (dev(src)?, dev(dst)?);
                self.staged(s, so, d, dof, len, &stop).map_err(stopped)?;
            }
            DataPath::HostToDevice { pinned: true } => {
                let d = dev(dst)?;
                self.end(src, None)?
                    .with_host(|h| direct::h2d_pinned(&self.gpus, h, so, d, dof, len))
                    .map_err(&fail)?;
            }
            DataPath::DeviceToHost { pinned: true } => {
                let s = dev(src)?;
                self.end(dst, None)?
                    .with_host(|h| direct::d2h_pinned(&self.gpus, s, so, h, dof, len))
                    .map_err(&fail)?;
            }
            DataPath::HostToDevice { pinned: false } | DataPath::DeviceToHost { pinned: false } => {
                let (host, gpu, hoff, goff, dir) = match item.path() {
                    DataPath::HostToDevice { .. } => (src, dst, so, dof, Dir::HostToDevice),
                    _ => (dst, src, dof, so, Dir::DeviceToHost),
                };
                let g = dev(gpu)?;
                let mem = host.region.host_mem().ok_or_else(|| Error::Backend {
                    backend: NAME,
                    detail: format!("region {} is not host memory", host.region.id()),
                })?;
                // The work item holds the region in use (so no host view aliases it) until
                // completion.
                pageable::copy(
                    &self.gpus,
                    &self.pool,
                    self.cfg.copy_threads,
                    dir,
                    HostRange { mem, off: hoff },
                    g,
                    goff,
                    len,
                    &stop,
                )
                .map_err(stopped)?;
            }
            other => {
                return Err(Error::Backend {
                    backend: NAME,
                    detail: format!("{other} is not a {NAME} path"),
                })
            }
        }
        Ok(len as u64)
    }
}

/// The device buffer of a descriptor's region.
fn dev(d: &Descriptor) -> Result<&gdpath_cuda::DeviceBuffer> {
    gpu_buffer(&d.region).ok_or_else(|| Error::Backend {
        backend: NAME,
        detail: format!("region {} is not GPU memory", d.region.id()),
    })
}

/// Pinned paths when the host side is page-locked, else the staging path with its finding.
fn host_choice(path: DataPath) -> PlanChoice {
    match path {
        DataPath::HostToDevice { pinned: false } | DataPath::DeviceToHost { pinned: false } => {
            PlanChoice {
                path,
                finding: Some(ids::HOST_PAGEABLE.into()),
                detail: Some(format!(
                    "host memory is pageable: copied through pinned bounce buffers (gdpath's \
                 pipeline from {} MiB, the driver's own below)",
                    pageable::DRIVER_BELOW >> 20
                )),
            }
        }
        p => PlanChoice::on(p),
    }
}

fn with_pinned<R>(
    region: &Region,
    f: impl FnOnce(&PinnedHandle) -> std::result::Result<R, CudaError>,
) -> std::result::Result<R, CudaError> {
    region.with_backend_handle(NAME, |h| {
        match h.and_then(|h| h.downcast_ref::<PinnedHandle>()) {
            Some(p) => f(p),
            None => Err(CudaError::InvalidArgument(format!(
                "region {} is not pinned by the {NAME} backend",
                region.id()
            ))),
        }
    })
}

impl Backend for CudaBackend {
    fn name(&self) -> &'static str {
        NAME
    }

    fn capabilities(&self) -> Vec<Capability> {
        use MemoryClass::{Gpu, Host, Remote};
        let one = |local, target, op, path, preference| Capability {
            local,
            target,
            ops: vec![op],
            path,
            preference,
        };
        vec![
            Capability::both(Gpu, Gpu, DataPath::P2pNvlink, Preference::Preferred),
            Capability::both(Gpu, Gpu, DataPath::P2pPcie, Preference::Preferred),
            Capability::both(Gpu, Gpu, DataPath::DeviceLocal, Preference::Preferred),
            Capability::both(Gpu, Gpu, DataPath::Staged, Preference::Fallback),
            // A peer's GPU memory on this node, through CUDA IPC (refused otherwise: the
            // network backend takes the pair).
            Capability::both(Gpu, Remote, DataPath::DeviceLocal, Preference::Preferred),
            Capability::both(Gpu, Remote, DataPath::P2pNvlink, Preference::Preferred),
            Capability::both(Gpu, Remote, DataPath::P2pPcie, Preference::Preferred),
            // A peer's shared host memory on this node (refused otherwise, as above).
            one(
                Gpu,
                Remote,
                Op::Write,
                DataPath::DeviceToHost { pinned: true },
                Preference::Preferred,
            ),
            one(
                Gpu,
                Remote,
                Op::Read,
                DataPath::HostToDevice { pinned: true },
                Preference::Preferred,
            ),
            one(
                Host,
                Gpu,
                Op::Write,
                DataPath::HostToDevice { pinned: true },
                Preference::Preferred,
            ),
            one(
                Host,
                Gpu,
                Op::Write,
                DataPath::HostToDevice { pinned: false },
                Preference::Fallback,
            ),
            one(
                Host,
                Gpu,
                Op::Read,
                DataPath::DeviceToHost { pinned: true },
                Preference::Preferred,
            ),
            one(
                Host,
                Gpu,
                Op::Read,
                DataPath::DeviceToHost { pinned: false },
                Preference::Fallback,
            ),
            one(
                Gpu,
                Host,
                Op::Write,
                DataPath::DeviceToHost { pinned: true },
                Preference::Preferred,
            ),
            one(
                Gpu,
                Host,
                Op::Write,
                DataPath::DeviceToHost { pinned: false },
                Preference::Fallback,
            ),
            one(
                Gpu,
                Host,
                Op::Read,
                DataPath::HostToDevice { pinned: true },
                Preference::Preferred,
            ),
            one(
                Gpu,
                Host,
                Op::Read,
                DataPath::HostToDevice { pinned: false },
                Preference::Fallback,
            ),
        ]
    }

    fn materialize(&self, memory: &Memory) -> Option<Result<Box<dyn ForeignMemory>>> {
        memory::materialize(&self.shared.gpus, memory)
    }

    fn register(&self, region: &Region) -> Result<Option<BackendHandle>> {
        memory::register(&self.shared.gpus, region)
    }

    fn plan(
        &self,
        op: Op,
        local: &Descriptor,
        target: &Descriptor,
    ) -> std::result::Result<PlanChoice, Refusal> {
        let (src, dst) = ends(op, local, target);
        self.shared.choose(src, dst)
    }

    fn plan_per_region(&self) -> bool {
        // `choose` looks at the two regions only (kinds, pinning, the GPU pair, IPC imports).
        true
    }

    fn block_lists(&self) -> bool {
        true
    }

    fn submit(&self, items: Vec<WorkItem>) {
        let jobs = jobs(items);
        // Small work runs on the posting thread: handing it to a worker and waking the waiter
        // costs more than the copy (see INLINE_MAX).
        if jobs.iter().map(Job::bytes).sum::<u64>() <= INLINE_MAX {
            for job in jobs {
                self.shared.run(job);
            }
            return;
        }
        for job in jobs {
            if let Err(crossbeam_channel::SendError(job)) = self.tx.send(job) {
                let gone = || Error::Backend {
                    backend: NAME,
                    detail: "worker threads are gone".into(),
                };
                match job {
                    Job::One(i) => i.complete(Err(gone())),
                    Job::Batch(v) => v.into_iter().for_each(|i| i.complete(Err(gone()))),
                }
            }
        }
    }
}

/// Whether a path is one copy engines or the copy kernel take directly, so that pairs on it
/// can be batched into one list.
fn batchable(path: &DataPath) -> bool {
    matches!(
        path,
        DataPath::P2pNvlink
            | DataPath::P2pPcie
            | DataPath::DeviceLocal
            | DataPath::HostToDevice { pinned: true }
            | DataPath::DeviceToHost { pinned: true }
    )
}

/// Groups a submission: block-list items alone; runs of at least [`BATCH_MIN_PAIRS`]
/// consecutive pairs between the same two regions on one batchable path as one batch; other
/// pairs alone. Order within a run is kept.
fn jobs(items: Vec<WorkItem>) -> Vec<Job> {
    let key = |i: &WorkItem| {
        (i.blocks().is_none() && batchable(i.path())).then(|| {
            (
                i.local().region.id(),
                i.target().region.id(),
                i.path().clone(),
            )
        })
    };
    let mut out = Vec::new();
    let mut run: Vec<WorkItem> = Vec::new();
    let flush = |run: &mut Vec<WorkItem>, out: &mut Vec<Job>| {
        if run.len() >= BATCH_MIN_PAIRS {
            out.push(Job::Batch(std::mem::take(run)));
        } else {
            out.extend(run.drain(..).map(Job::One));
        }
    };
    for item in items {
        let k = key(&item);
        if k.is_none() || run.first().map(key) != Some(k.clone()) {
            flush(&mut run, &mut out);
        }
        match k {
            Some(_) => run.push(item),
            None => out.push(Job::One(item)),
        }
    }
    flush(&mut run, &mut out);
    out
}
