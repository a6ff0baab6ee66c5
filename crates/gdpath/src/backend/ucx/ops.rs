//! Descriptor pairs in flight: put/get requests, the flush that makes puts visible at the
//! target, notifications after them, the flushes before withdrawal acknowledgements, and
//! control messages sent. Batches themselves are in [`super::batch`], packed writes in
//! [`super::packed`].
//!
//! The items of one `submit` for one peer form a batch. Gets complete when their request does.
//! Puts complete when an endpoint flush posted after them completes (UCX: a put's own request
//! only means the local buffer may be reused; the flush means the data is in the target's
//! memory). Flushes are coalesced per peer: one is in flight at a time and covers every batch
//! whose puts were posted before it; batches submitted meanwhile wait for the next one. A lone
//! transfer is flushed at once (latency); many in flight share one round trip (throughput). With
//! a notification, the batch's items complete only after the notification was sent, so that
//! `Transfer::wait` returning means the peer has (or will get) it; no notification is sent for
//! a batch of which an item failed, at post or later.
//!
//! Where a peer's host memory moves over tcp ([`PeerConn::packed_writes`]), a batch of host →
//! remote-host writes no longer than that connection packs ([`crate::net::pack_limit`]) goes
//! as `Writes` messages instead of UCX puts ([`Ops::submit_packed`]; docs/network.md, "Packed
//! writes over tcp"): its items complete when the peer acknowledges their messages.
//!
//! A batch is polled once right after posting: what is already finished then (gets and
//! locally completing puts that UCX finished at post, with their notification if it was sent
//! at once) completes before `submit` returns, without a progress round.
//!
//! A pair's reported time (`PairReport::elapsed`) counts from its batch's submission (one clock
//! read for the batch), so it includes posting the pairs before it in the batch; a staged put
//! counts from its copy out of the GPU.
//!
//! A batch that does not finish within `NetConfig::op_timeout` fails its items with
//! [`Error::PeerFailed`]; its UCX requests and both regions of each pair are kept alive until
//! UCX finishes them (a request UCX may still touch is never released with its memory).

use super::batch::{test, Batch, Slot, Zombie};
use super::conn::PeerConn;
use super::staging::{self, Stage, Stages};
use super::{ucx_err, RemoteMem, UcxBackend};
use crate::backend::cuda::gpu_buffer;
use crate::error::{Error, Result};
use crate::net::codec::WireKind;
use crate::path::DataPath;
use crate::region::{Region, RegionId};
use crate::transfer::{group_items, Op, WorkItem};
use gdpath_ucx::{MemHandle, MemType, ProtoInfo, Request};
use std::sync::Arc;
use std::time::Instant;

struct Send {
    peer: Arc<PeerConn>,
    req: Request,
    close: bool,
}

/// A withdrawal's flush that finished: the connection, the region ids, the flush's error text.
pub(crate) type AckFlushed = (Arc<PeerConn>, Vec<u64>, std::result::Result<(), String>);

/// The flush before a withdrawal's acknowledgement.
struct PendingAck {
    peer: Arc<PeerConn>,
    ids: Vec<u64>,
    flush: Request,
}

/// The flush state of one peer's endpoint.
struct Flusher {
    peer: Arc<PeerConn>,
    /// The flush in flight and the batches it covers.
    inflight: Option<(Request, Vec<u64>)>,
    /// Batches whose puts were posted after the flush in flight.
    waiting: Vec<u64>,
}

/// What decides UCX's protocol choice for an operation on GPU memory, as far as the engine can
/// tell: peer, put or get, local memory type, remote GPU memory, length. UCX's selection for
/// equal parameters is the same, so one answer serves them all.
type ObservedKey = (u64, bool, MemType, bool, usize);

/// Bound on remembered protocol answers; the map is cleared when it fills.
const MAX_OBSERVED: usize = 1024;

#[derive(Default)]
pub(crate) struct Ops {
    /// The path UCX reported for earlier operations with the same [`ObservedKey`]: asked once
    /// (building UCX's description costs about a microsecond), and given to operations that
    /// finished at post, which have no request left to ask.
    observed: std::collections::HashMap<ObservedKey, DataPath>,
    /// When batch ages were last checked against the operation bound.
    checked: Option<Instant>,
    next_seq: u64,
    flushers: Vec<Flusher>,
    pub(super) batches: Vec<Batch>,
    pub(super) stages: Stages,
    sends: Vec<Send>,
    acks: Vec<PendingAck>,
    /// Withdrawal flushes finished, for the protocol ([`Ops::take_acks`]).
    acks_done: Vec<AckFlushed>,
    pub(super) zombies: Vec<Zombie>,
    /// The seq of the last `Writes` message (packed writes).
    pub(super) next_writes: u64,
}

pub(super) fn remote_of(item: &WorkItem) -> Option<&RemoteMem> {
    item.target()
        .region
        .foreign()
        .and_then(|f| f.as_any().downcast_ref::<RemoteMem>())
}

/// Whether `item` may go in packed `Writes` messages: a write of at most `max` bytes from host
/// memory to a peer's host region.
pub(super) fn packable(item: &WorkItem, max: u64) -> bool {
    item.op() == Op::Write
        && item.local().len <= max
        && gpu_buffer(&item.local().region).is_none()
        && remote_of(item).is_some_and(|r| r.kind == WireKind::Host)
}

impl Ops {
    pub(crate) fn track_send(&mut self, peer: Arc<PeerConn>, req: Request, close: bool) {
        self.sends.push(Send { peer, req, close });
    }

    /// The withdrawal of `ids` is acknowledged once `flush` (of `peer`'s endpoint) finished.
    pub(crate) fn ack_after(&mut self, peer: &Arc<PeerConn>, ids: Vec<u64>, flush: Request) {
        self.acks.push(PendingAck {
            peer: peer.clone(),
            ids,
            flush,
        });
    }

    /// The withdrawal flushes finished since the last call, with their results.
    pub(crate) fn take_acks(&mut self) -> Vec<AckFlushed> {
        std::mem::take(&mut self.acks_done)
    }

    /// Posts every item (see the module docs). Items that cannot start complete at once.
    /// `now`: the caller's clock read, the start of the items' I/O.
    pub(crate) fn submit(&mut self, b: &UcxBackend, items: Vec<WorkItem>, now: Instant) {
        // Keyed by the peer connection's address; 0 (no connection) for a target that is not
        // a remote region.
        let peer_of = |i: &WorkItem| remote_of(i).map_or(0, |r| Arc::as_ptr(&r.peer) as usize);
        for (_, items) in group_items(items, peer_of) {
            match items.first().and_then(remote_of).map(|r| r.peer.clone()) {
                Some(peer) => self.submit_to(b, peer, items, now),
                _ => {
                    for item in items {
                        item.complete(Err(Error::Backend {
                            backend: "ucx",
                            detail: "target is not a remote region".into(),
                        }));
                    }
                }
            }
        }
    }

    /// Posts `items`, all on `peer`'s memory, as one batch.
    fn submit_to(
        &mut self,
        b: &UcxBackend,
        peer: Arc<PeerConn>,
        items: Vec<WorkItem>,
        now: Instant,
    ) {
        // Planned while the connection was open, posted after it closed (a goodbye begun,
        // a failure seen) in between: nothing may follow the goodbye's flush.
        if let Some(e) = peer.unusable() {
            for item in items {
                item.complete(Err(e.clone()));
            }
            return;
        }
        if let Some((max, transport)) = peer.packed_writes() {
            if items.iter().all(|i| packable(i, max)) {
                self.submit_packed(b, peer, items, now, &transport);
                return;
            }
        }
        let remote = items.first().and_then(|i| i.notification()).is_some()
            || b.cfg.put_completion == crate::net::PutCompletion::Remote;
        let mut batch = self.new_batch(&peer, &items, now, remote);
        let mut puts = false;
        let mut cache = PostCache::default();
        for item in items {
            if let Some(e) = item.stop_reason() {
                batch.failed_at_post = true;
                item.complete(Err(e));
                continue;
            }
            match post(
                b,
                &item,
                now,
                &mut cache,
                &mut self.stages,
                &mut self.observed,
            ) {
                Ok((req, stage, taken)) => {
                    let put = item.op() == Op::Write;
                    puts |= put;
                    let len = item.local().len;
                    batch.slots.push(Slot {
                        local_done: req.is_none(),
                        req,
                        item: Some(item),
                        result: None,
                        put,
                        len,
                        stage,
                        taken,
                        pieces: 0,
                    });
                }
                Err(e) => {
                    batch.failed_at_post = true;
                    item.complete(Err(e));
                }
            }
        }
        if batch.slots.is_empty() {
            return;
        }
        // Complete what UCX finished at post now, not in a progress round: progressing the
        // worker while nothing waits on it slows a stream of puts (docs/benchmarks.md,
        // "Measurements behind the defaults", completing at post). `UcxBackend::submit` still
        // runs a round when none ran for a while, so control messages keep being read.
        if batch.poll(&mut self.stages).0 {
            return;
        }
        let seq = batch.seq;
        self.batches.push(batch);
        if puts && remote {
            let f = match self
                .flushers
                .iter()
                .position(|f| Arc::ptr_eq(&f.peer, &peer))
            {
                Some(i) => i,
                None => {
                    self.flushers.push(Flusher {
                        peer: peer.clone(),
                        inflight: None,
                        waiting: Vec::new(),
                    });
                    self.flushers.len() - 1
                }
            };
            self.flushers[f].waiting.push(seq);
            self.kick(f);
        }
    }

    /// An empty batch for `items` on `peer`, numbered, with the notification of the request.
    pub(super) fn new_batch(
        &mut self,
        peer: &Arc<PeerConn>,
        items: &[WorkItem],
        now: Instant,
        remote: bool,
    ) -> Batch {
        self.next_seq += 1;
        Batch {
            seq: self.next_seq,
            peer: peer.clone(),
            slots: Vec::with_capacity(items.len()),
            flush_done: None,
            notify: items.first().and_then(|i| i.notification()),
            notify_req: None,
            notify_done: None,
            failed_at_post: false,
            started: now,
            remote,
            packed: Vec::new(),
            packed_base: 0,
            packed_open: 0,
        }
    }

    /// Posts flusher `f`'s next flush if none is in flight and batches wait for one.
    fn kick(&mut self, f: usize) {
        let fl = &mut self.flushers[f];
        if fl.inflight.is_some() || fl.waiting.is_empty() {
            return;
        }
        let covers = std::mem::take(&mut fl.waiting);
        match fl.peer.ep.flush_nb() {
            Ok(r) => fl.inflight = Some((r, covers)),
            Err(e) => {
                let e = ucx_err(&fl.peer.label(), "flush", e);
                self.flush_finished(&covers, Err(e));
            }
        }
    }

    fn flush_finished(&mut self, covers: &[u64], r: Result<()>) {
        for b in &mut self.batches {
            if covers.contains(&b.seq) {
                b.flush_done = Some(r.clone());
            }
        }
    }

    /// Tests the flushes in flight; posts the next ones.
    fn poll_flushes(&mut self) {
        for f in 0..self.flushers.len() {
            let fl = &mut self.flushers[f];
            let finished = match fl.inflight.as_mut() {
                Some((req, _)) => test(req, &fl.peer),
                None => None,
            };
            if let Some(r) = finished {
                let (_, covers) = self.flushers[f].inflight.take().expect("in flight");
                self.flush_finished(&covers, r);
            }
            self.kick(f);
        }
        // Forget idle flushers of peers that failed.
        self.flushers.retain(|f| {
            f.inflight.is_some() || !f.waiting.is_empty() || f.peer.failure().is_none()
        });
    }

    /// Whether packed writes to peer `id` wait for their acknowledgement.
    pub(crate) fn packed_in_flight(&self, id: u64) -> bool {
        self.batches
            .iter()
            .any(|b| b.peer.id == id && b.packed_open > 0)
    }

    /// Connection `id` failed with `e`: its batches fail now (their requests and regions kept
    /// until UCX ends them), rather than at the operation bound, which an endpoint without peer
    /// error handling would otherwise wait for.
    pub(crate) fn fail_peer(&mut self, id: u64, e: &Error) {
        let mut i = 0;
        while i < self.batches.len() {
            if self.batches[i].peer.id != id {
                i += 1;
                continue;
            }
            let batch = self.batches.swap_remove(i);
            let seq = batch.seq;
            for f in &mut self.flushers {
                f.waiting.retain(|s| *s != seq);
            }
            batch.fail(&mut self.zombies, e);
        }
    }

    /// Nothing in flight: no batch, no control message, flush or request UCX still holds.
    pub(crate) fn idle(&self) -> bool {
        self.batches.is_empty()
            && self.sends.is_empty()
            && self.acks.is_empty()
            && self.zombies.is_empty()
            && self.flushers.iter().all(|f| f.inflight.is_none())
    }

    /// Leaves what is still in flight to the process's end: its requests, buffers and regions
    /// are never released (dropping a request UCX has not ended waits for it, which for a peer
    /// that went away without peer error handling is never). For the backend's drop only.
    pub(crate) fn leak_in_flight(&mut self) {
        std::mem::forget(std::mem::take(&mut self.batches));
        std::mem::forget(std::mem::take(&mut self.sends));
        std::mem::forget(std::mem::take(&mut self.acks));
        std::mem::forget(std::mem::take(&mut self.zombies));
        std::mem::forget(std::mem::take(&mut self.flushers));
    }

    /// Batches in flight.
    pub(crate) fn busy(&self) -> bool {
        !self.batches.is_empty()
    }

    /// Whether batches, flushes or control messages in flight still involve peer `id` (a
    /// goodbye to it waits until they are done).
    pub(crate) fn involves(&self, id: u64) -> bool {
        self.batches.iter().any(|b| b.peer.id == id)
            || self
                .flushers
                .iter()
                .any(|f| f.peer.id == id && (f.inflight.is_some() || !f.waiting.is_empty()))
            || self.sends.iter().any(|s| s.peer.id == id)
    }

    /// Tests everything in flight; completes finished items. Returns how many completed.
    pub(crate) fn poll(&mut self, b: &UcxBackend) -> usize {
        self.poll_flushes();
        let mut done = 0;
        let timeout = b.cfg.op_timeout;
        // Ages are checked every few milliseconds, not on every (spinning) poll.
        let now = Instant::now();
        let check = !timeout.is_zero()
            && self
                .checked
                .is_none_or(|t| now.duration_since(t) >= std::time::Duration::from_millis(5));
        if check {
            self.checked = Some(now);
        }
        let mut i = 0;
        while i < self.batches.len() {
            let (finished, n) = self.batches[i].poll(&mut self.stages);
            done += n;
            if finished {
                let mut batch = self.batches.swap_remove(i);
                batch.keep_pending_sends(&mut self.zombies);
            } else if check && now.duration_since(self.batches[i].started) > timeout {
                let batch = self.batches.swap_remove(i);
                let seq = batch.seq;
                for f in &mut self.flushers {
                    f.waiting.retain(|s| *s != seq);
                }
                done += batch.abandon(&mut self.zombies, timeout);
            } else {
                i += 1;
            }
        }
        self.sends.retain_mut(|s| match test(&mut s.req, &s.peer) {
            None => true,
            Some(r) => {
                if let Err(e) = r {
                    tracing::debug!(peer = %s.peer.label(), "control message: {e}");
                }
                if s.close {
                    tracing::debug!(peer = %s.peer.label(), "closing refused connection");
                }
                false
            }
        });
        let acks_done = &mut self.acks_done;
        self.acks.retain_mut(|a| match test(&mut a.flush, &a.peer) {
            None => true,
            Some(r) => {
                let r = r.map_err(|e| e.to_string());
                acks_done.push((a.peer.clone(), std::mem::take(&mut a.ids), r));
                false
            }
        });
        self.zombies.retain_mut(|z| {
            z.reqs.retain_mut(|r| matches!(r.test(), Ok(false)));
            !z.reqs.is_empty()
        });
        done
    }
}

/// What the previous item of a batch looked up, for the next one: the pairs of a transfer
/// usually share their local region and their remote region, and each lookup takes a lock.
#[derive(Default)]
pub(super) struct PostCache {
    /// The target region last checked, and whether the peer had withdrawn it.
    withdrawn: Option<(RegionId, bool)>,
    /// The local region last used, and its UCX registration.
    local: Option<(RegionId, MemHandle)>,
}

impl PostCache {
    /// `item`'s remote memory, or [`Error::Deregistered`] once the peer withdrew it.
    pub(super) fn live_remote<'a>(&mut self, item: &'a WorkItem) -> Result<&'a RemoteMem> {
        let rm = remote_of(item).expect("grouped by remote target");
        let tid = item.target().region.id();
        let withdrawn = match self.withdrawn {
            Some((id, w)) if id == tid => w,
            _ => {
                let w = rm.withdrawn();
                self.withdrawn = Some((tid, w));
                w
            }
        };
        if withdrawn {
            return Err(Error::Deregistered { region: tid });
        }
        Ok(rm)
    }

    /// The UCX registration of local `region`.
    pub(super) fn local_mem(&mut self, b: &UcxBackend, region: &Region) -> Result<MemHandle> {
        let id = region.id();
        match &self.local {
            Some((cached, m)) if *cached == id => Ok(m.clone()),
            _ => {
                let m = b.local_mem(region)?;
                self.local = Some((id, m.clone()));
                Ok(m)
            }
        }
    }
}

/// Posts one item's put or get: `(None, _)` when UCX completed it at once; a staging buffer
/// when the local memory is GPU memory that this UCX build cannot move itself.
fn post(
    b: &UcxBackend,
    item: &WorkItem,
    started: Instant,
    cache: &mut PostCache,
    stages: &mut Stages,
    observed: &mut std::collections::HashMap<ObservedKey, DataPath>,
) -> Result<(Option<Request>, Option<Stage>, Option<DataPath>)> {
    let rm = cache.live_remote(item)?;
    let (l, t) = (item.local(), item.target());
    let len = usize::try_from(l.len).map_err(|_| Error::Config("length above usize".into()))?;
    let loff = usize::try_from(l.offset).map_err(|_| Error::Config("offset above usize".into()))?;
    let staged = match gpu_buffer(&l.region) {
        Some(dev) if !b.cuda => {
            let mut st = stages.take(&b.made()?.ctx, dev, len)?;
            if item.op() == Op::Write {
                item.mark_started();
                if let Err(e) = staging::d2h(dev, loff, &mut st, len) {
                    stages.give(st);
                    return Err(e);
                }
            }
            Some(st)
        }
        Some(dev) => {
            // UCX's CUDA transports (cuda_ipc, cuda_copy) issue their copies in the context
            // current on the posting thread; the thread that submits may never have touched
            // this GPU (a server's progress thread, an application thread).
            dev.context().bind().map_err(|source| Error::Cuda {
                backend: "ucx",
                what: format!("binding GPU {} context", dev.ordinal()),
                source,
            })?;
            None
        }
        None => None,
    };
    let (local, off) = match &staged {
        Some(st) => (st.mem.clone(), 0),
        None => (cache.local_mem(b, &l.region)?, loff),
    };
    // A staged put started with its copy out of the GPU (marked above); otherwise the pair
    // starts now, with its batch.
    item.mark_started_at(started);
    let r = match item.op() {
        Op::Write => rm.peer.ep.put(&local, off, &rm.remote, t.offset, len),
        Op::Read => rm.peer.ep.get(&local, off, &rm.remote, t.offset, len),
    };
    let mut req = match r {
        Ok(r) => r,
        Err(e) => {
            if let Some(st) = staged {
                stages.give(st);
            }
            return Err(ucx_err(&rm.peer.label(), "put/get", e));
        }
    };
    // GPU memory UCX moves itself: ask UCX which protocol it chose, once per kind of
    // operation (a pending request only; one finished at post has nothing left to ask and takes
    // the answer of an earlier equal operation, if any).
    let gpu = staged.is_none() && (local.mem_type() != MemType::Host || rm.kind != WireKind::Host);
    let taken = if gpu {
        let key = (
            rm.peer.id,
            item.op() == Op::Write,
            local.mem_type(),
            rm.kind != WireKind::Host,
            len,
        );
        match observed.get(&key) {
            Some(p) => Some(p.clone()),
            None => {
                let p = req
                    .info()
                    .and_then(|i| observed_path(&ProtoInfo::parse(&i)));
                if let Some(p) = &p {
                    if observed.len() >= MAX_OBSERVED {
                        observed.clear();
                    }
                    observed.insert(key, p.clone());
                }
                p
            }
        }
    } else {
        None
    };
    match req.test() {
        Ok(true) => Ok((None, staged, taken)),
        Ok(false) => Ok((Some(req), staged, taken)),
        Err(e) => {
            // The request ended (failed): UCX no longer uses the staging buffer.
            if let Some(st) = staged {
                stages.give(st);
            }
            Err(ucx_err(&rm.peer.label(), req.op(), e))
        }
    }
}

/// The path of an operation on GPU memory from UCX's description of its protocol, `None` when
/// the description names no transport gdpath knows (the planned path then stands).
/// - emulated in software (active messages, the target's CPU copying the data):
///   `Ucx { "<tl> (software emulation)" }`, never `Gdr`, whatever carries the messages;
/// - an RDMA transport that does RMA (RC/DC/GGA, EFA's SRD) with no `cuda_copy` staging beside
///   it: `Gdr`, the NIC reads or writes GPU memory itself;
/// - otherwise `Ucx` with the transports named (`cuda_ipc` for NVLink/PCIe peer copies between
///   processes; `cuda_copy+rc_mlx5` for a host-staged pipeline).
fn observed_path(info: &ProtoInfo) -> Option<DataPath> {
    if info.transports.is_empty() {
        return None;
    }
    let joined = info.transports.join("+");
    if info.emulated {
        return Some(DataPath::Ucx {
            transport: format!("{joined} (software emulation)").into(),
        });
    }
    let staged = info.transports.iter().any(|t| t == "cuda_copy");
    let rma_nic = info
        .transports
        .iter()
        .find(|t| super::RDMA_RMA_TRANSPORTS.contains(&t.as_str()));
    match rma_nic {
        Some(t) if !staged => Some(DataPath::Gdr {
            transport: t.as_str().into(),
        }),
        _ => Some(DataPath::Ucx {
            transport: joined.into(),
        }),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(transports: &[&str], emulated: bool) -> Option<DataPath> {
        observed_path(&ProtoInfo {
            transports: transports.iter().map(|t| (*t).to_owned()).collect(),
            emulated,
        })
    }

    #[test]
    fn observed_paths() {
        let ucx = |t: &str| {
            Some(DataPath::Ucx {
                transport: t.into(),
            })
        };
        assert_eq!(p(&["cuda_ipc"], false), ucx("cuda_ipc"));
        assert_eq!(p(&["sysv"], true), ucx("sysv (software emulation)"));
        // Emulation over an RDMA NIC is not GPUDirect RDMA: the peer's CPU copies the data.
        assert_eq!(p(&["rc_mlx5"], true), ucx("rc_mlx5 (software emulation)"));
        assert_eq!(
            p(&["rc_mlx5"], false),
            Some(DataPath::Gdr {
                transport: "rc_mlx5".into()
            })
        );
        // A host-staged pipeline names cuda_copy beside the NIC: not GDR.
        assert_eq!(
            p(&["cuda_copy", "rc_mlx5"], false),
            ucx("cuda_copy+rc_mlx5")
        );
        // UD cannot do RMA: never GDR.
        assert_eq!(p(&["ud_mlx5"], false), ucx("ud_mlx5"));
        assert_eq!(p(&[], false), None);
    }
}
