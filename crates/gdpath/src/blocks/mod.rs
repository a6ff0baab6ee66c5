//! Block lists: KV-cache transfers of thousands of blocks described by two layouts and two id
//! arrays instead of one [`crate::Descriptor`] per block, because inference servers move tens
//! of thousands of small blocks per request (docs/gpu.md, "Block-list copies").
//!
//! ```
//! use gdpath::{Agent, AgentConfig, BlockTransfer, HostBuffer, KvLayout, Memory};
//!
//! let agent = Agent::new(AgentConfig::default())?;
//! let (n, bs) = (1000u64, 4096u64);
//! let a = agent.register(Memory::host(HostBuffer::zeroed((n * bs) as usize)))?;
//! let b = agent.register(Memory::host(HostBuffer::zeroed((n * bs) as usize)))?;
//! let layout = KvLayout::new(bs, n);
//! // Validate the layouts once ...
//! let prepared = agent.prepare_blocks(BlockTransfer::new(&a, layout, &b, layout))?;
//! // ... and post as often as needed with new ids (NumPy / torch arrays: u32, i64, ...).
//! let report = prepared.post(&[3u32, 4, 5, 900], &[0u32, 1, 2, 7])?.wait()?;
//! assert_eq!(report.bytes, 4 * bs);
//! let batch = report.pairs[0].batch.expect("a block transfer reports its batch");
//! assert_eq!((batch.descriptors, batch.coalesced), (4, 2)); // ids 3,4,5 → 0,1,2 merged
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! - [`Agent::prepare_blocks`] checks the two [`KvLayout`]s against their regions once (counts,
//!   overflow, bounds, disjoint destination slots, the same shape on both sides: typed
//!   [`BlockError`]s naming the first bad block) and plans the region pair once: a backend
//!   that moves block lists in one call ([`crate::backend::Backend::block_lists`]: `cuda` for
//!   GPU ↔ GPU, GPU ↔ pinned host and GPU memory of another process opened through CUDA IPC;
//!   `host-copy` for host ↔ host), else the pairs are expanded into descriptors and posted as
//!   an ordinary request (a file tier, a peer on another host).
//! - [`PreparedBlocks::post`] checks only the ids, in one pass and without allocating (range,
//!   a destination block given twice, a block both read and written on one region) and hands
//!   one work item to the backend; the transfer reports one pair (index 0) whose
//!   [`crate::PairReport::batch`] names the [`CopyMethod`], the descriptor counts and the CPU
//!   time the backend spent posting.
//!
//! Units: bytes, ns.

mod batch;
mod coalesce;
mod error;
mod ids;
mod layout;

pub use batch::{BatchReport, CopyMethod};
pub use coalesce::BlockList;
pub use error::{BlockError, BlockSide, LayoutDim};
pub use ids::BlockIndex;
pub use layout::KvLayout;

use crate::agent::Agent;
use crate::backend::Backend;
use crate::error::{Error, Result};
use crate::region::{Descriptor, Region};
use crate::transfer::{
    BlockSource, Op, PlannedPair, Pollers, Transfer, TransferRequest, TransferShared, WorkItem,
};
use ids::{IdBuf, IdLimits};
use std::fmt;
use std::sync::{Arc, Mutex, MutexGuard};
use std::time::Instant;

/// Most block slots a layout may have: 2^32, so that every id fits in 32 bits (the engine keeps
/// ids as `u32`: 400 KB for 100,000 of them).
pub const MAX_LAYOUT_BLOCKS: u64 = 1 << 32;

/// Most descriptors (ids × layers × K/V planes) one post may expand to: 2^32.
pub const MAX_DESCRIPTORS: u64 = 1 << 32;

/// What to prepare: `src` blocks in `src_layout` are copied to `dst` blocks in `dst_layout`.
/// Either region may be remote memory of a peer agent (then the other is local); the two may
/// be one region (with one layout).
#[derive(Debug, Clone)]
pub struct BlockTransfer {
    /// The region blocks are read from.
    pub src: Region,
    /// Where each source block, layer and K/V plane lies in `src`.
    pub src_layout: KvLayout,
    /// The region blocks are written to.
    pub dst: Region,
    /// Where each destination block, layer and K/V plane lies in `dst`.
    pub dst_layout: KvLayout,
    /// Post every list with this method instead of the backend's choice (measurements,
    /// tests). A backend that cannot run it fails the transfer with [`Error::Unsupported`];
    /// a route that expands to descriptor pairs ignores it.
    pub method: Option<CopyMethod>,
}

impl BlockTransfer {
    /// Blocks of `src` (in `src_layout`) to `dst` (in `dst_layout`), method chosen by the
    /// backend.
    pub fn new(src: &Region, src_layout: KvLayout, dst: &Region, dst_layout: KvLayout) -> Self {
        BlockTransfer {
            src: src.clone(),
            src_layout,
            dst: dst.clone(),
            dst_layout,
            method: None,
        }
    }

    /// Force `method` (see [`BlockTransfer::method`]).
    pub fn method(mut self, method: CopyMethod) -> Self {
        self.method = Some(method);
        self
    }
}

/// How a prepared transfer's posts are executed.
enum Route {
    /// One work item per post, to a backend that moves block lists.
    Lists {
        backend: Arc<dyn Backend>,
        plan: PlannedPair,
    },
    /// No backend moves block lists between these regions: each post expands into one
    /// descriptor pair per merged run and goes through [`Agent::post`].
    Pairs { plan: PlannedPair },
}

/// The checked, planned part of a block transfer, shared by its posts and their work items.
pub(crate) struct Prepared {
    src_layout: KvLayout,
    dst_layout: KvLayout,
    op: Op,
    /// The layouts' extents as descriptors (the local and the target side): what the work item
    /// holds in use.
    local: Descriptor,
    target: Descriptor,
    route: Route,
    method: Option<CopyMethod>,
    limits: IdLimits,
    pool: Mutex<Vec<IdBuf>>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

/// Most id buffers a prepared transfer keeps for reuse (one per post in flight at once).
const POOL_KEEP: usize = 8;

/// The block list of a work item: the prepared transfer and the ids of its post. The ids go
/// back to the prepared transfer's pool when the item is done with them.
pub(crate) struct BlockJob {
    prepared: Arc<Prepared>,
    ids: Option<IdBuf>,
}

impl BlockSource for BlockJob {
    fn list(&self) -> BlockList<'_> {
        let ids = self.ids.as_ref().expect("present until drop");
        BlockList {
            src: &self.prepared.src_layout,
            dst: &self.prepared.dst_layout,
            src_ids: &ids.src,
            dst_ids: &ids.dst,
        }
    }

    fn method(&self) -> Option<CopyMethod> {
        self.prepared.method
    }
}

impl Drop for BlockJob {
    fn drop(&mut self) {
        if let Some(ids) = self.ids.take() {
            let mut pool = lock(&self.prepared.pool);
            if pool.len() < POOL_KEEP {
                pool.push(ids);
            }
        }
    }
}

/// A block transfer whose layouts are checked and whose path is planned: post it with new
/// block ids as often as needed (NIXL's prepared descriptor lists). `Clone + Send + Sync`:
/// posts may come from several threads at once.
#[derive(Clone)]
pub struct PreparedBlocks {
    agent: Agent,
    inner: Arc<Prepared>,
}

impl fmt::Debug for PreparedBlocks {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("PreparedBlocks")
            .field("src", &self.inner.src_layout)
            .field("dst", &self.inner.dst_layout)
            .field("plan", &self.plan())
            .finish()
    }
}

impl PreparedBlocks {
    /// The plan every post follows: backend, path, and the finding when the preferred path
    /// was not possible. A route that expands to pairs names the path of its pairs.
    pub fn plan(&self) -> &PlannedPair {
        match &self.inner.route {
            Route::Lists { plan, .. } | Route::Pairs { plan } => plan,
        }
    }

    /// Whether posts go to a backend as one block list (`true`), or are expanded into one
    /// descriptor pair per merged run (`false`: no backend moves block lists between these
    /// regions, e.g. a file or a peer on another host).
    pub fn is_block_list(&self) -> bool {
        matches!(self.inner.route, Route::Lists { .. })
    }

    /// The source and destination layouts.
    pub fn layouts(&self) -> (&KvLayout, &KvLayout) {
        (&self.inner.src_layout, &self.inner.dst_layout)
    }

    /// Copies block `src_ids[i]` to block `dst_ids[i]` in every layer and plane, for every
    /// `i`. Checks the ids only (the layouts were checked by [`Agent::prepare_blocks`]), in one
    /// pass, into a pooled buffer; then the regions are taken in use and one work item goes to
    /// the backend. Returns once it is started; small lists may be done by then.
    ///
    /// Errors, before any byte moves: [`Error::Blocks`] ([`BlockError::Empty`],
    /// [`BlockError::IdCountMismatch`], [`BlockError::NegativeId`], [`BlockError::IdOutOfRange`],
    /// [`BlockError::DuplicateDestination`], [`BlockError::SourceIsDestination`],
    /// [`BlockError::TooManyDescriptors`]); [`Error::Deregistered`] or [`Error::RegionBusy`]
    /// for a region deregistered or viewed since; an expanded route's [`Agent::post`] errors.
    pub fn post<I: BlockIndex>(&self, src_ids: &[I], dst_ids: &[I]) -> Result<Transfer> {
        self.post_until(src_ids, dst_ids, None)
    }

    /// [`PreparedBlocks::post`] with a deadline: after it, no new work starts and `wait`
    /// returns [`Error::DeadlineExceeded`].
    pub fn post_until<I: BlockIndex>(
        &self,
        src_ids: &[I],
        dst_ids: &[I],
        deadline: Option<Instant>,
    ) -> Result<Transfer> {
        let began = Instant::now();
        let posted = self.post_ids(src_ids, dst_ids, deadline)?;
        // An expanded list went through `Agent::post`, which counted its post.
        if !self.is_block_list() {
            return Ok(posted);
        }
        let descriptors = self.inner.src_layout.descriptors_per_block() as usize * src_ids.len();
        crate::metrics::posted(self.inner.op == Op::Write, descriptors, began.elapsed());
        Ok(posted)
    }

    /// [`PreparedBlocks::post_until`] without its posting cost; its errors are counted where
    /// they are made (an expanded list's by `Agent::post`).
    fn post_ids<I: BlockIndex>(
        &self,
        src_ids: &[I],
        dst_ids: &[I],
        deadline: Option<Instant>,
    ) -> Result<Transfer> {
        let p = &self.inner;
        let mut ids = lock(&p.pool).pop().unwrap_or_default();
        let checked = ids.fill(src_ids, dst_ids, p.limits).and_then(|()| {
            let descriptors =
                (ids.src.len() as u64).saturating_mul(p.src_layout.descriptors_per_block());
            if descriptors > MAX_DESCRIPTORS {
                return Err(BlockError::TooManyDescriptors {
                    descriptors,
                    max: MAX_DESCRIPTORS,
                });
            }
            Ok(())
        });
        let job = BlockJob {
            prepared: p.clone(),
            ids: Some(ids),
        };
        checked.map_err(|e| crate::metrics::error(e.into()))?;
        match &p.route {
            Route::Lists { backend, plan } => {
                let lg = p.local.region.begin_use().map_err(crate::metrics::error)?;
                let tg = p.target.region.begin_use().map_err(crate::metrics::error)?;
                let mut pollers = Pollers::default();
                if backend.drive() == crate::backend::Drive::Poll {
                    pollers.push(backend.clone());
                }
                let id = self.agent.next_transfer_id();
                let shared = TransferShared::new(id, deadline, vec![plan.clone()], None);
                let item = WorkItem::new_blocks(
                    p.op,
                    p.local.clone(),
                    p.target.clone(),
                    shared.clone(),
                    [lg, tg],
                    job,
                );
                backend.submit(vec![item]);
                Ok(Transfer { shared, pollers })
            }
            Route::Pairs { .. } => {
                let list = job.list();
                let n = list.descriptors() as usize;
                let (mut local, mut target) = (Vec::with_capacity(n), Vec::with_capacity(n));
                let (lr, tr) = (&p.local.region, &p.target.region);
                list.for_each_run(|s, d, len| {
                    let (lo, to) = match p.op {
                        Op::Write => (s, d),
                        Op::Read => (d, s),
                    };
                    local.push(lr.desc(lo, len));
                    target.push(tr.desc(to, len));
                });
                drop(job);
                let mut req = TransferRequest::new(p.op, local, target);
                req.deadline = deadline;
                self.agent.post(req)
            }
        }
    }
}

impl From<BlockError> for Error {
    fn from(e: BlockError) -> Error {
        Error::Blocks(e)
    }
}

impl Agent {
    /// Checks a block transfer's layouts against its regions and plans its path once; see
    /// the module documentation of [`crate::blocks`].
    ///
    /// Errors, before any byte moves: [`Error::ForeignRegion`], [`Error::Deregistered`],
    /// [`Error::RegionBusy`] (a host view is out); [`Error::Blocks`] for the layouts
    /// ([`BlockError::ZeroBlockSize`], [`BlockError::ZeroCount`], [`BlockError::TooManyBlocks`],
    /// [`BlockError::Overflow`], [`BlockError::Overlap`] of destination slots,
    /// [`BlockError::OutOfBounds`] naming the first block that does not fit,
    /// [`BlockError::Mismatch`], [`BlockError::SharedRegionLayouts`]); for a file region the
    /// checks of [`Agent::post`] on the layout's extent ([`Error::ShortFile`],
    /// [`Error::ReadOnly`]); [`Error::NoPath`] / [`Error::Refused`] when no backend serves the
    /// pair; [`Error::Unsupported`] for two remote regions.
    pub fn prepare_blocks(&self, t: BlockTransfer) -> Result<PreparedBlocks> {
        let BlockTransfer {
            src,
            src_layout,
            dst,
            dst_layout,
            method,
        } = t;
        for r in [&src, &dst] {
            if r.inner.agent != self.id() {
                return Err(Error::ForeignRegion { region: r.id() });
            }
            r.check_usable()?;
        }
        layout::check_pairing(&src_layout, &dst_layout)?;
        let same_region = src.id() == dst.id();
        if same_region && src_layout != dst_layout {
            return Err(BlockError::SharedRegionLayouts { region: src.id() }.into());
        }
        let src_span = src_layout.check(BlockSide::Src, false)?;
        let dst_span = dst_layout.check(BlockSide::Dst, true)?;
        let src_ext = self.extent(&src, &src_layout, src_span, BlockSide::Src)?;
        let dst_ext = self.extent(&dst, &dst_layout, dst_span, BlockSide::Dst)?;
        let remote = |r: &Region| r.kind().class() == crate::memory::MemoryClass::Remote;
        let (op, local, target) = match (remote(&src), remote(&dst)) {
            (false, _) => (Op::Write, src_ext, dst_ext),
            (true, false) => (Op::Read, dst_ext, src_ext),
            (true, true) => {
                return Err(Error::Unsupported {
                    what: "a block transfer between two remote regions".into(),
                    backend: "cuda",
                })
            }
        };
        let set = self.backend_set();
        let route = match crate::planner::plan_block_list(&set, op, &local, &target) {
            Some((bi, plan)) => Route::Lists {
                backend: set.list[bi].clone(),
                plan,
            },
            None => Route::Pairs {
                plan: crate::planner::plan_one(&set, op, &local, &target)?.1,
            },
        };
        Ok(PreparedBlocks {
            agent: self.clone(),
            inner: Arc::new(Prepared {
                limits: IdLimits {
                    src_blocks: src_layout.blocks,
                    dst_blocks: dst_layout.blocks,
                    same_region,
                },
                src_layout,
                dst_layout,
                op,
                local,
                target,
                route,
                method,
                pool: Mutex::new(Vec::new()),
            }),
        })
    }

    /// [`Agent::prepare_blocks`] then [`PreparedBlocks::post`], for a one-off transfer.
    pub fn transfer_blocks<I: BlockIndex>(
        &self,
        t: BlockTransfer,
        src_ids: &[I],
        dst_ids: &[I],
    ) -> Result<Transfer> {
        self.prepare_blocks(t)?.post(src_ids, dst_ids)
    }

    /// The descriptor of `layout`'s extent in `region` (`offset .. offset + span`), checked
    /// against the region: memory by length, files as [`Agent::post`] checks a file range; a
    /// destination in read-only memory is [`Error::ReadOnlyMemory`].
    fn extent(
        &self,
        region: &Region,
        layout: &KvLayout,
        span: u64,
        side: BlockSide,
    ) -> Result<Descriptor> {
        if side == BlockSide::Dst && region.is_read_only() {
            return Err(Error::ReadOnlyMemory {
                region: region.id(),
                detail: "it is the destination of this block transfer".into(),
            });
        }
        let d = region.desc(layout.offset, span);
        if region.file().is_some() {
            let (s, reads) = match side {
                BlockSide::Src => (crate::error::Side::Local, true),
                BlockSide::Dst => (crate::error::Side::Target, false),
            };
            self.check_descriptor(0, s, &d, reads)?;
        } else {
            layout.check_bounds(side, region.id(), span, region.len()?)?;
        }
        Ok(d)
    }
}
