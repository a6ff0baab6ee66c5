//! Packed writes (docs/network.md, "Packed writes over tcp"): where a peer's host memory moves
//! over tcp, this agent's host → remote-host writes go as its own `Writes` messages instead of
//! UCX puts, and the peer copies them into its export and acknowledges each message.
//!
//! Writer side ([`Ops::submit_packed`], [`Ops::writes_acked`]): consecutive pairs on one remote
//! region share a message of up to [`codec::MAX_WRITES`] writes and [`PACK_MESSAGE_MAX`] bytes,
//! a pair longer than [`PACK_PIECE_MAX`] goes in pieces of that size, one per message; the
//! bytes are read in place when UCX sends ([`AmPart`]), and the local regions stay in use until
//! UCX is done with them. A pair completes with the acknowledgement of its last piece; the
//! protocol state machine ([`crate::net::protocol::Conn::writes_sent`]) holds the connection to
//! an answer for every message within `NetConfig::op_timeout`.
//!
//! Target side ([`apply`]): the protocol checked the writes against the live export; they are
//! copied into the export's mapping as a UCX put would write it.

use super::batch::{Batch, PackedMsg, Slot, Zombie};
use super::conn::PeerConn;
use super::ops::{remote_of, Ops, PostCache};
use super::{lock, ucx_err, State, UcxBackend};
use crate::error::{Error, Result};
use crate::net::codec::{self, WritesStatus};
use crate::path::DataPath;
use crate::region::{RegionId, UseGuard};
use crate::transfer::WorkItem;
use gdpath_ucx::AmPart;
use std::sync::Arc;
use std::time::Instant;

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
/// of its own, and completes when every piece is acknowledged: long host writes packed one per
/// message beat UCX 1.13's tcp put (docs/benchmarks.md, "Measurements behind the defaults",
/// `PACK_PIECE_MAX`).
const PACK_PIECE_MAX: u64 = 512 << 10;
// A message then carries at most one piece of a pair (all but the last are full).
const _: () = assert!(PACK_PIECE_MAX as usize > PACK_MESSAGE_MAX);
/// Bytes of writes one `Writes` message gathers at most, unless one pair alone is longer:
/// larger messages of small writes ran slower over loopback tcp (docs/benchmarks.md,
/// "Measurements behind the defaults", `PACK_MESSAGE_MAX`).
const PACK_MESSAGE_MAX: usize = 64 << 10;

impl Ops {
    /// Posts `items` (all [`packable`](super::ops::packable), on `peer`, which packs writes) as one batch of `Writes`
    /// messages (see the module docs); their path reads `<tl> (packed writes)`.
    pub(super) fn submit_packed(
        &mut self,
        b: &UcxBackend,
        peer: Arc<PeerConn>,
        items: Vec<WorkItem>,
        now: Instant,
        transport: &str,
    ) {
        let mut batch = self.new_batch(&peer, &items, now, true);
        let path = DataPath::Ucx {
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
            // The routing id goes first, in the same buffer as the frame's head.
            let sent =
                codec::encode_writes_head_after(peer.route.to_vec(), seq, region, &records, bytes)
                    .map_err(Error::ProtocolLimit)
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
                        || m.records.len() >= codec::MAX_WRITES
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
        // The protocol holds the connection to an answer for every message sent (none can be
        // answered before this: answers are read under the state lock the caller holds).
        if batch.packed_open > 0 {
            let mut g = lock(&peer.inner);
            for (i, m) in batch.packed.iter().enumerate() {
                if !m.acked {
                    g.proto.writes_sent(batch.packed_base + i as u64, now);
                }
            }
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

/// Copies a peer's packed writes into live export `region`, which the protocol checked them
/// against (host memory, every write inside the region, the bytes the writes add up to). Like a
/// UCX put into the region, the copy takes no local guard beyond the region's use: an exported
/// region is there to be written by peers. The answer: done; the region not exported (released
/// meanwhile); refused with the reason (a write outside the mapping, which the protocol's
/// check excludes; the owner holding a host view of it).
pub(crate) fn apply(st: &State, region: u64, records: &[(u64, u32)], data: &[u8]) -> WritesStatus {
    let Some(e) = st.held.get(&region) else {
        return WritesStatus::NotExported;
    };
    // The copy below relies on these bounds: checked again against the mapping itself.
    let total: u64 = records.iter().map(|&(_, l)| u64::from(l)).sum();
    if total != data.len() as u64
        || records
            .iter()
            .any(|&(off, len)| off.checked_add(len.into()).is_none_or(|end| end > e.len))
    {
        return WritesStatus::Refused(format!("writes outside region {region}"));
    }
    // The owner may hold a host view of the region (`&mut [u8]`): no copy under it.
    let _in_use = match e.region.begin_use() {
        Ok(g) => g,
        Err(err) => return WritesStatus::Refused(format!("region {region} is busy here: {err}")),
    };
    let mut at = 0usize;
    for &(off, len) in records {
        let len = len as usize;
        let src = &data[at..at + len];
        // Into the export's host mapping, alive while it is held (it holds the region and its
        // UCX registration; releasing takes the state lock this runs under); bounds checked
        // above and again by the mapping; no host view is out (the use guard above). Peers' UCX
        // puts may write the same bytes meanwhile, as they may into any export.
        if let Err(err) = e.mem.write(off as usize, src) {
            return WritesStatus::Refused(format!("region {region}: {err}"));
        }
        at += len;
    }
    WritesStatus::Done
}
