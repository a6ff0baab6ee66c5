//! Descriptor pairs in flight: put/get requests, the flush that makes puts visible at the
//! target, notifications after them, withdraw acknowledgements, and control messages sent.
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

use super::peer::PeerConn;
use super::staging::{self, Stage, Stages};
use super::{ucx_err, RemoteMem, UcxBackend};
use crate::backend::cuda::gpu_buffer;
use crate::error::{Error, Result};
use crate::net::codec::WireKind;
use crate::net::codec::{Message, WritesStatus};
use crate::path::Path;
use crate::region::{Region, RegionId, UseGuard};
use crate::transfer::{group_items, Op, WorkItem};
use gdpath_ucx::{AmPart, MemHandle, MemType, ProtoInfo, Request};
use std::sync::Arc;
use std::time::Instant;

struct Slot {
    item: Option<WorkItem>,
    req: Option<Request>,
    /// The request finished successfully (or completed at post).
    local_done: bool,
    result: Option<Result<u64>>,
    put: bool,
    len: u64,
    /// The pinned staging buffer of a GPU pair when UCX cannot move GPU memory itself.
    stage: Option<Stage>,
    /// The path UCX said it runs the operation on (GPU memory only; see [`observed_path`]).
    taken: Option<Path>,
    /// Packed writes: the acknowledgements still needed (one per piece, [`PACK_PIECE_MAX`]).
    pieces: u32,
}

struct Batch {
    seq: u64,
    peer: Arc<PeerConn>,
    slots: Vec<Slot>,
    flush_done: Option<Result<()>>,
    notify: Option<Arc<[u8]>>,
    notify_req: Option<Request>,
    notify_done: Option<Result<()>>,
    /// An item of the batch failed before it became a slot (stopped, or refused at post): the
    /// transfer fails, so its notification is not sent.
    failed_at_post: bool,
    started: Instant,
    /// Puts complete only after a flush confirmed them (`PutCompletion::Remote`, or a batch
    /// with a notification, which must follow data the peer can read).
    remote: bool,
    /// Packed `Writes` messages of this batch (see [`Ops::submit_packed`]), each with the
    /// slots it carries; their slots complete when the peer acknowledges the message.
    packed: Vec<PackedMsg>,
    /// The seq of `packed[0]`: a batch's messages have consecutive seqs.
    packed_base: u64,
    /// Messages of `packed` not yet acknowledged.
    packed_open: usize,
}

/// One `Writes` message in flight (its seq: [`Batch::packed_base`] + its index).
struct PackedMsg {
    /// The send, until UCX finished it.
    req: Option<Request>,
    /// The local regions the send reads its bytes from in place, held in use as long as `req`:
    /// no host view of them can be taken, and they cannot be deregistered, while UCX may still
    /// read them, whatever became of the pairs.
    sources: Vec<UseGuard>,
    /// The batch's slots it carries.
    slots: std::ops::Range<usize>,
    /// The peer acknowledged it.
    acked: bool,
}

impl PackedMsg {
    /// The send and the regions it reads, if UCX has not finished it: whoever takes them keeps
    /// them until it does (dropping a pending request would wait for it).
    fn pending_send(&mut self) -> Option<(Request, Vec<UseGuard>)> {
        let mut r = self.req.take()?;
        let sources = std::mem::take(&mut self.sources);
        matches!(r.test(), Ok(false)).then_some((r, sources))
    }
}

/// The `Writes` message being filled: its remote region, its writes, where their bytes are,
/// the regions those are in, and the batch slots of its first and last write.
struct Filling {
    region: u64,
    records: Vec<(u64, u32)>,
    /// Where each write's bytes are, read in place when the message is sent.
    parts: Vec<AmPart>,
    /// The local regions the parts are in (each once), held in use.
    sources: Vec<UseGuard>,
    /// The parts' lengths added up.
    bytes: usize,
    /// The batch slots of its first and last write (a long pair's pieces share one slot).
    first: usize,
    last: usize,
}

/// A packed pair longer than this goes in pieces of this many bytes, each in a `Writes` message
/// of its own, and completes when every piece is acknowledged. Pinned loopback tcp, `bench net
/// --qd 64 --batch 16`, a server that keeps freed memory (gdpath serve): 256 KiB pairs
/// 2.40–2.44 GB/s packed against 0.66–0.72 by UCX's put.
const PACK_PIECE_MAX: u64 = 512 << 10;
// A message then carries at most one piece of a pair (all but the last are full).
const _: () = assert!(PACK_PIECE_MAX as usize > PACK_MESSAGE_MAX);
/// Bytes of writes one `Writes` message gathers at most, unless one pair alone is longer.
/// Larger messages of small writes ran slower over loopback tcp (4 KiB writes in messages of
/// 256 KiB: 0.34 GB/s, of 64 KiB: 0.63–1.05 GB/s; measured before servers kept freed memory).
const PACK_MESSAGE_MAX: usize = 64 << 10;

struct Send {
    peer: Arc<PeerConn>,
    req: Request,
    close: bool,
}

struct PendingAck {
    peer: Arc<PeerConn>,
    ids: Vec<u64>,
    flush: Option<Request>,
}

/// Requests that outlived their items (timeout), with the regions they may still touch.
struct Zombie {
    reqs: Vec<Request>,
    _regions: Vec<Region>,
    /// Regions packed sends read in place, still in use.
    _uses: Vec<UseGuard>,
    _stages: Vec<Stage>,
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
    observed: std::collections::HashMap<ObservedKey, Path>,
    /// When batch ages were last checked against the operation bound.
    checked: Option<Instant>,
    next_seq: u64,
    flushers: Vec<Flusher>,
    batches: Vec<Batch>,
    stages: Stages,
    sends: Vec<Send>,
    acks: Vec<PendingAck>,
    zombies: Vec<Zombie>,
    next_writes: u64,
}

fn remote_of(item: &WorkItem) -> Option<&RemoteMem> {
    item.target()
        .region
        .foreign()
        .and_then(|f| f.as_any().downcast_ref::<RemoteMem>())
}

/// Tests a request: `Some(Ok)` finished, `Some(Err)` failed, `None` still in flight. A request
/// that failed on a connection already failed for a known reason (the server said goodbye, a
/// goodbye went unanswered) fails with that reason rather than UCX's transport status.
fn test(req: &mut Request, peer: &PeerConn) -> Option<Result<()>> {
    match req.test() {
        Ok(true) => Some(Ok(())),
        Ok(false) => None,
        Err(e) => Some(Err(peer
            .failed_error()
            .unwrap_or_else(|| ucx_err(&peer.label(), req.op(), e)))),
    }
}

impl Ops {
    pub(crate) fn track_send(&mut self, peer: Arc<PeerConn>, req: Request, close: bool) {
        self.sends.push(Send { peer, req, close });
    }

    /// Flushes `peer`'s endpoint, then acknowledges the withdrawal of `ids`.
    pub(crate) fn ack_after_flush(&mut self, peer: &Arc<PeerConn>, ids: Vec<u64>) {
        let flush = match peer.ep.flush_nb() {
            Ok(r) => Some(r),
            Err(e) => {
                tracing::debug!(peer = %peer.label(), "flush before withdraw ack: {e}");
                None
            }
        };
        self.acks.push(PendingAck {
            peer: peer.clone(),
            ids,
            flush,
        });
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
        if let Some(why) = peer.failure() {
            let label = peer.label();
            for item in items {
                item.complete(Err(Error::PeerFailed {
                    peer: label.clone(),
                    detail: why.clone(),
                }));
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
        // worker while nothing waits on it lowered a bare put loop over loopback tcp from
        // 0.43–0.55 to 0.33–0.48 GB/s (docs/benchmarks.md, "Fourth session"; no gain was
        // measurable for the engine itself). `UcxBackend::submit` still runs a round when
        // none ran for a while, so control messages keep being read.
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
    fn new_batch(
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

    /// Posts `items` (all [`packable`], on `peer`, which packs writes) as one batch of `Writes`
    /// messages: consecutive pairs on the same remote region share a message of up to
    /// [`codec::MAX_WRITES`](crate::net::codec::MAX_WRITES) writes and [`PACK_MESSAGE_MAX`]
    /// bytes, and a pair longer than [`PACK_PIECE_MAX`] goes in pieces of that size, one per
    /// message. The bytes are read in place when UCX sends ([`AmPart`]). The peer checks every
    /// write against its export before copying any, and acknowledges each message; a pair
    /// completes with the acknowledgement of its last piece (remote completion, whatever
    /// `put_completion` says), and its path reads `<tl> (packed writes)`.
    fn submit_packed(
        &mut self,
        b: &UcxBackend,
        peer: Arc<PeerConn>,
        items: Vec<WorkItem>,
        now: Instant,
        transport: &str,
    ) {
        let mut batch = self.new_batch(&peer, &items, now, true);
        let path = Path::Ucx {
            transport: format!("{transport} (packed writes)").into(),
        };
        let mut cache = PostCache::default();
        let mut cur: Option<Filling> = None;
        let send = |ops: &mut Ops, batch: &mut Batch, m: Filling| {
            let Filling {
                region,
                records,
                parts,
                sources,
                bytes,
                first,
                last,
            } = m;
            ops.next_writes += 1;
            let seq = ops.next_writes;
            let slots = first..last + 1;
            let sent = crate::net::codec::encode_writes_head(seq, region, &records, bytes)
                .map_err(|e| Error::Config(e.to_string()))
                .and_then(|head| {
                    peer.ep
                        .am_send_parts(super::CTRL_AM, head, &parts)
                        .map_err(|e| ucx_err(&peer.label(), "writes", e))
                });
            if batch.packed.is_empty() {
                batch.packed_base = seq;
            }
            // Every seq of the batch has its entry, so that an ack's index is `seq - base`.
            debug_assert_eq!(seq, batch.packed_base + batch.packed.len() as u64);
            match sent {
                Ok(req) => {
                    batch.packed_open += 1;
                    batch.packed.push(PackedMsg {
                        req: Some(req),
                        sources,
                        slots,
                        acked: false,
                    })
                }
                Err(e) => {
                    for s in &mut batch.slots[slots.clone()] {
                        s.result = Some(Err(e.clone()));
                    }
                    // Not sent: no acknowledgement is awaited (a stray one finds it done).
                    batch.packed.push(PackedMsg {
                        req: None,
                        sources: Vec::new(),
                        slots,
                        acked: true,
                    })
                }
            }
        };
        for item in items {
            if let Some(e) = item.stop_reason() {
                batch.failed_at_post = true;
                item.complete(Err(e));
                continue;
            }
            let t = item.target();
            let rm = remote_of(&item).expect("packable");
            let (region, at) = (rm.region_id, rm.base_off + t.offset);
            let len = item.local().len;
            let whole = match local_part(b, &item, &mut cache) {
                Ok(p) => p,
                Err(e) => {
                    batch.failed_at_post = true;
                    item.complete(Err(e));
                    continue;
                }
            };
            let source = item.local().region.clone();
            let slot = batch.slots.len();
            let pieces = len.div_ceil(PACK_PIECE_MAX).max(1);
            item.mark_started_at(now);
            batch.slots.push(Slot {
                item: Some(item),
                req: None,
                local_done: false,
                result: None,
                put: true,
                len,
                stage: None,
                taken: Some(path.clone()),
                pieces: pieces.try_into().unwrap_or(u32::MAX),
            });
            for k in 0..pieces {
                let off = k * PACK_PIECE_MAX;
                let n = (len - off).min(PACK_PIECE_MAX);
                let full = cur.as_ref().is_some_and(|m| {
                    m.region != region
                        || m.records.len() >= crate::net::codec::MAX_WRITES
                        || m.bytes + n as usize > PACK_MESSAGE_MAX
                });
                if full {
                    send(self, &mut batch, cur.take().expect("checked"));
                }
                if batch.slots[slot].result.is_some() {
                    // The message with the previous piece failed at send: the pair has failed.
                    break;
                }
                // The message holds each local region it reads in use; taken before the message
                // is started, so that a refusal leaves no empty message behind. It cannot fail
                // while the item holds the region in use itself.
                let held = cur
                    .as_ref()
                    .is_some_and(|m| m.sources.iter().any(|g| g.region().id() == source.id()));
                let guard = if held {
                    None
                } else {
                    match source.begin_use() {
                        Ok(g) => Some(g),
                        Err(e) => {
                            batch.slots[slot].result = Some(Err(e));
                            break;
                        }
                    }
                };
                let m = cur.get_or_insert_with(|| Filling {
                    region,
                    records: Vec::new(),
                    parts: Vec::new(),
                    sources: Vec::new(),
                    bytes: 0,
                    first: slot,
                    last: slot,
                });
                m.sources.extend(guard);
                m.bytes += n as usize;
                m.last = slot;
                // In bounds: `whole` is checked, and the pieces lie inside it.
                m.parts.push(AmPart {
                    offset: whole.offset + off as usize,
                    len: n as usize,
                    mem: whole.mem.clone(),
                });
                m.records.push((at + off, n as u32));
            }
        }
        if let Some(m) = cur.take() {
            send(self, &mut batch, m);
        }
        if batch.slots.is_empty() {
            return;
        }
        if batch.poll(&mut self.stages).0 {
            batch.keep_pending_sends(&mut self.zombies);
        } else {
            self.batches.push(batch);
        }
    }

    /// The peer answered `Writes` message `seq`: its pairs complete, or fail with
    /// [`Error::Deregistered`] (the region was withdrawn before they arrived) or the reason.
    pub(crate) fn writes_acked(&mut self, peer: &PeerConn, seq: u64, status: WritesStatus) {
        let found = self.batches.iter_mut().find_map(|b| {
            if b.peer.id != peer.id || seq < b.packed_base {
                return None;
            }
            let i = usize::try_from(seq - b.packed_base).ok()?;
            b.packed.get(i).is_some_and(|m| !m.acked).then_some((b, i))
        });
        let Some((b, i)) = found else {
            tracing::debug!(peer = %peer.label(), "acknowledgement of unknown writes {seq} dropped");
            return;
        };
        b.packed_open -= 1;
        let m = &mut b.packed[i];
        m.acked = true;
        let label = peer.label();
        for s in &mut b.slots[m.slots.clone()] {
            if s.result.is_none() {
                if status == WritesStatus::Done {
                    // A message carries at most one piece of a pair: the others are full.
                    s.pieces = s.pieces.saturating_sub(1);
                    if s.pieces > 0 {
                        continue;
                    }
                }
                s.result = Some(match &status {
                    WritesStatus::Done => Ok(s.len),
                    WritesStatus::NotExported => Err(Error::Deregistered {
                        region: s
                            .item
                            .as_ref()
                            .map_or(RegionId(0), |i| i.target().region.id()),
                    }),
                    WritesStatus::Refused(why) => Err(Error::Backend {
                        backend: "ucx",
                        detail: format!("{label} refused the writes: {why}"),
                    }),
                });
            }
        }
        // A send UCX has not reported finished keeps its bytes until it does.
        if let Some((r, sources)) = m.pending_send() {
            self.zombies.push(Zombie {
                reqs: vec![r],
                _regions: Vec::new(),
                _uses: sources,
                _stages: Vec::new(),
            });
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
        let mut ready = Vec::new();
        self.acks.retain_mut(|a| {
            let finished = match a.flush.as_mut() {
                None => true,
                Some(f) => test(f, &a.peer).is_some(),
            };
            if finished {
                ready.push((a.peer.clone(), std::mem::take(&mut a.ids)));
            }
            !finished
        });
        for (peer, ids) in ready {
            if let Ok(bytes) = crate::net::codec::encode(&Message::WithdrawAck(ids)) {
                match peer.ep.am_send(super::CTRL_AM, &[], &bytes) {
                    Ok(req) => self.track_send(peer, req, false),
                    Err(e) => tracing::debug!("withdraw ack not sent: {e}"),
                }
            }
        }
        self.zombies.retain_mut(|z| {
            z.reqs.retain_mut(|r| matches!(r.test(), Ok(false)));
            !z.reqs.is_empty()
        });
        done
    }
}

/// Whether `item` may go in packed `Writes` messages: a write of at most `max` bytes from host
/// memory to a peer's host region.
fn packable(item: &WorkItem, max: u64) -> bool {
    item.op() == Op::Write
        && item.local().len <= max
        && gpu_buffer(&item.local().region).is_none()
        && remote_of(item).is_some_and(|r| r.kind == WireKind::Host)
}

/// Where a packed pair's bytes are in its local mapping, checked: the remote region still
/// exported as this side knows it, the range inside the mapping.
fn local_part(b: &UcxBackend, item: &WorkItem, cache: &mut PostCache) -> Result<AmPart> {
    cache.live_remote(item)?;
    let l = item.local();
    let mem = cache.local_mem(b, &l.region)?;
    let end = l.offset.checked_add(l.len);
    if end.is_none_or(|e| e > mem.len() as u64) {
        return Err(Error::Backend {
            backend: "ucx",
            detail: format!(
                "pair at {} of {} bytes beyond the {} bytes mapped",
                l.offset,
                l.len,
                mem.len()
            ),
        });
    }
    // Both fit in usize: inside a mapping of `mem.len()` bytes.
    Ok(AmPart {
        mem,
        offset: l.offset as usize,
        len: l.len as usize,
    })
}

/// What the previous item of a batch looked up, for the next one: the pairs of a transfer
/// usually share their local region and their remote region, and each lookup takes a lock.
#[derive(Default)]
struct PostCache {
    /// The target region last checked, and whether the peer had withdrawn it.
    withdrawn: Option<(RegionId, bool)>,
    /// The local region last used, and its UCX registration.
    local: Option<(RegionId, MemHandle)>,
}

impl PostCache {
    /// `item`'s remote memory, or [`Error::Deregistered`] once the peer withdrew it.
    fn live_remote<'a>(&mut self, item: &'a WorkItem) -> Result<&'a RemoteMem> {
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
    fn local_mem(&mut self, b: &UcxBackend, region: &Region) -> Result<MemHandle> {
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
    observed: &mut std::collections::HashMap<ObservedKey, Path>,
) -> Result<(Option<Request>, Option<Stage>, Option<Path>)> {
    let rm = cache.live_remote(item)?;
    let (l, t) = (item.local(), item.target());
    let len = usize::try_from(l.len).map_err(|_| Error::Config("length above usize".into()))?;
    let loff = usize::try_from(l.offset).map_err(|_| Error::Config("offset above usize".into()))?;
    let staged = match gpu_buffer(&l.region) {
        Some(dev) if !b.cuda => {
            let mut st = stages.take(&b.ctx, dev, len)?;
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
            dev.context().bind().map_err(|e| Error::Backend {
                backend: "ucx",
                detail: format!("binding GPU {} context: {e}", dev.ordinal()),
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
/// - emulated in software (active messages, the target's CPU copying the data; 0.68 GB/s
///   against 394 GB/s for `cuda_ipc` on the H200 pair): `Ucx { "<tl> (software emulation)" }`,
///   never `Gdr`, whatever carries the messages;
/// - an RDMA transport that does RMA (RC/DC/GGA, EFA's SRD) with no `cuda_copy` staging beside
///   it: `Gdr`, the NIC reads or writes GPU memory itself;
/// - otherwise `Ucx` with the transports named (`cuda_ipc` for NVLink/PCIe peer copies between
///   processes; `cuda_copy+rc_mlx5` for a host-staged pipeline).
fn observed_path(info: &ProtoInfo) -> Option<Path> {
    if info.transports.is_empty() {
        return None;
    }
    let joined = info.transports.join("+");
    if info.emulated {
        return Some(Path::Ucx {
            transport: format!("{joined} (software emulation)").into(),
        });
    }
    let staged = info.transports.iter().any(|t| t == "cuda_copy");
    let rma_nic = info
        .transports
        .iter()
        .find(|t| super::RDMA_RMA_TRANSPORTS.contains(&t.as_str()));
    match rma_nic {
        Some(t) if !staged => Some(Path::Gdr {
            transport: t.as_str().into(),
        }),
        _ => Some(Path::Ucx {
            transport: joined.into(),
        }),
    }
}

/// Finishes a staged get: copies the staging buffer to the pair's GPU range.
fn unstage_get(item: &WorkItem, stage: &Stage, len: u64) -> Result<u64> {
    let l = item.local();
    let dev = gpu_buffer(&l.region).ok_or_else(|| Error::Backend {
        backend: "ucx",
        detail: "staged pair lost its GPU memory".into(),
    })?;
    staging::h2d(dev, l.offset as usize, stage, len as usize).map(|()| len)
}

/// Completes `item`; `now` is the poll's clock read, made at its first completion.
fn finish(item: WorkItem, r: Result<u64>, taken: Option<Path>, now: &mut Option<Instant>) {
    item.complete_at(r, taken, *now.get_or_insert_with(Instant::now));
}

impl Batch {
    /// Returns (finished, items completed now).
    fn poll(&mut self, stages: &mut Stages) -> (bool, usize) {
        let mut now = None;
        // Packed writes: a send that failed fails its pairs; a peer that failed fails what
        // still waits for an acknowledgement.
        if self.packed_open > 0 {
            // Only a failed connection: one this agent is closing still delivers the
            // acknowledgements (its goodbye waits for this batch).
            let failure = self.peer.failed_error().or_else(|| {
                self.peer.ep.failure().map(|s| Error::PeerFailed {
                    peer: self.peer.label(),
                    detail: format!("connection failed: {s}"),
                })
            });
            // One endpoint's sends finish mostly in order: testing stops at the first pending
            // one, so a transfer of many pieces is not tested whole in every round. A later
            // send that finished first is seen once the earlier one has (its sources are then
            // held until that or its acknowledgement); a failed connection is seen for all.
            let mut testing = true;
            for m in &mut self.packed {
                if m.acked {
                    continue;
                }
                let tested = if testing {
                    m.req.as_mut().and_then(|r| test(r, &self.peer))
                } else {
                    None
                };
                testing &= m.req.is_none() || tested.is_some();
                let failed = match tested {
                    Some(Ok(())) => {
                        m.req = None;
                        m.sources.clear();
                        None
                    }
                    Some(Err(e)) => Some(e),
                    None => None,
                }
                .or_else(|| failure.clone());
                if let Some(e) = failed {
                    for s in &mut self.slots[m.slots.clone()] {
                        if s.result.is_none() {
                            s.result = Some(Err(e.clone()));
                        }
                    }
                }
            }
        }
        for s in &mut self.slots {
            if s.local_done || s.result.is_some() {
                continue;
            }
            if let Some(req) = s.req.as_mut() {
                match test(req, &self.peer) {
                    Some(Ok(())) => s.local_done = true,
                    Some(Err(e)) => s.result = Some(Err(e)),
                    None => {}
                }
            }
        }
        // Staging buffers: a put's is free once its request completed; a get's once copied to
        // the GPU; a failed pair's once its request ended.
        for s in &mut self.slots {
            if s.stage.is_none() || !(s.local_done || s.result.is_some()) {
                continue;
            }
            let st = s.stage.take().expect("checked");
            if !s.put && s.result.is_none() {
                if let Some(item) = s.item.as_ref() {
                    s.result = Some(unstage_get(item, &st, s.len));
                }
            }
            stages.give(st);
        }
        for s in &mut self.slots {
            if s.result.is_some() || !s.local_done {
                continue;
            }
            if !s.put || !self.remote {
                s.result = Some(Ok(s.len));
            } else if let Some(f) = &self.flush_done {
                s.result = Some(f.clone().map(|()| s.len));
            }
        }
        let mut n = 0;
        if self.notify.is_none() {
            // Complete each item as soon as its result is known.
            for s in &mut self.slots {
                if let Some(r) = &s.result {
                    if let Some(item) = s.item.take() {
                        finish(item, r.clone(), s.taken.take(), &mut now);
                        n += 1;
                    }
                }
            }
            return (self.slots.iter().all(|s| s.item.is_none()), n);
        }
        if !self.slots.iter().all(|s| s.result.is_some()) {
            return (false, 0);
        }
        let all_ok =
            !self.failed_at_post && self.slots.iter().all(|s| matches!(s.result, Some(Ok(_))));
        if all_ok && self.notify_done.is_none() {
            if self.notify_req.is_none() {
                let msg = Message::Notify(self.notify.as_deref().unwrap_or_default().to_vec());
                let sent = crate::net::codec::encode(&msg)
                    .map_err(|e| Error::Config(e.to_string()))
                    .and_then(|bytes| {
                        self.peer
                            .ep
                            .am_send(super::CTRL_AM, &[], &bytes)
                            .map_err(|e| ucx_err(&self.peer.label(), "notify", e))
                    });
                match sent {
                    Ok(r) => self.notify_req = Some(r),
                    Err(e) => self.notify_done = Some(Err(e)),
                }
            }
            if let Some(r) = self.notify_req.as_mut() {
                self.notify_done = test(r, &self.peer);
            }
            if self.notify_done.is_none() {
                return (false, 0);
            }
        }
        let notify_err = match &self.notify_done {
            Some(Err(e)) => Some(e.clone()),
            _ => None,
        };
        for s in &mut self.slots {
            if let Some(item) = s.item.take() {
                let r = match (&notify_err, s.result.take()) {
                    (Some(e), Some(Ok(_))) => Err(e.clone()),
                    (_, Some(r)) => r,
                    (_, None) => Err(Error::Backend {
                        backend: "ucx",
                        detail: "no result".into(),
                    }),
                };
                finish(item, r, s.taken.take(), &mut now);
                n += 1;
            }
        }
        (true, n)
    }

    /// Moves the sends of packed messages UCX has not finished (a batch failed while they were
    /// in flight) to `zombies`: dropping a pending request would wait for it.
    fn keep_pending_sends(&mut self, zombies: &mut Vec<Zombie>) {
        let (reqs, uses) = self.pending_sends();
        if !reqs.is_empty() {
            zombies.push(Zombie {
                reqs,
                _regions: Vec::new(),
                _uses: uses,
                _stages: Vec::new(),
            });
        }
    }

    /// The packed sends UCX has not finished, and the regions they read, in use.
    fn pending_sends(&mut self) -> (Vec<Request>, Vec<UseGuard>) {
        let (mut reqs, mut regions) = (Vec::new(), Vec::new());
        for (r, sources) in self.packed.iter_mut().filter_map(PackedMsg::pending_send) {
            reqs.push(r);
            regions.extend(sources);
        }
        (reqs, regions)
    }

    /// Fails the unfinished items after `timeout`; keeps their requests and regions alive.
    fn abandon(mut self, zombies: &mut Vec<Zombie>, timeout: std::time::Duration) -> usize {
        let label = self.peer.label();
        let mut reqs: Vec<Request> = Vec::new();
        let mut regions: Vec<Region> = Vec::new();
        let mut stages: Vec<Stage> = Vec::new();
        let mut n = 0;
        for s in &mut self.slots {
            if let Some(r) = s.req.take() {
                reqs.push(r);
            }
            stages.extend(s.stage.take());
            if let Some(item) = s.item.take() {
                regions.push(item.local().region.clone());
                regions.push(item.target().region.clone());
                item.complete(Err(Error::PeerFailed {
                    peer: label.clone(),
                    detail: format!(
                        "no completion within {timeout:?} (peer gone or not progressing)"
                    ),
                }));
                n += 1;
            }
        }
        reqs.extend(self.notify_req.take());
        reqs.retain_mut(|r| matches!(r.test(), Ok(false)));
        let (sends, uses) = self.pending_sends();
        reqs.extend(sends);
        if !reqs.is_empty() {
            zombies.push(Zombie {
                reqs,
                _regions: regions,
                _uses: uses,
                _stages: stages,
            });
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(transports: &[&str], emulated: bool) -> Option<Path> {
        observed_path(&ProtoInfo {
            transports: transports.iter().map(|t| (*t).to_owned()).collect(),
            emulated,
        })
    }

    #[test]
    fn observed_paths() {
        let ucx = |t: &str| {
            Some(Path::Ucx {
                transport: t.into(),
            })
        };
        assert_eq!(p(&["cuda_ipc"], false), ucx("cuda_ipc"));
        assert_eq!(p(&["sysv"], true), ucx("sysv (software emulation)"));
        // Emulation over an RDMA NIC is not GPUDirect RDMA: the peer's CPU copies the data.
        assert_eq!(p(&["rc_mlx5"], true), ucx("rc_mlx5 (software emulation)"));
        assert_eq!(
            p(&["rc_mlx5"], false),
            Some(Path::Gdr {
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
