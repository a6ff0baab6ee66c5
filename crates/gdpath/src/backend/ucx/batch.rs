//! One batch of descriptor pairs on one peer (the items of one `submit`), and how it advances:
//! its requests tested, its staging buffers given back, its puts completed by the flush that
//! covers them, its packed writes by their acknowledgements, its notification sent once every
//! pair succeeded, and its items failed after `NetConfig::op_timeout` (their requests and
//! regions kept until UCX ends them). See [`super::ops`] for how batches are made.

use super::conn::PeerConn;
use super::staging::{self, Stage, Stages};
use super::ucx_err;
use crate::backend::cuda::gpu_buffer;
use crate::error::{Error, Result};
use crate::net::codec::Message;
use crate::path::DataPath;
use crate::region::{Region, UseGuard};
use crate::transfer::WorkItem;
use gdpath_ucx::Request;
use std::sync::Arc;
use std::time::Instant;

/// Requests that outlived their items (timeout), with the regions they may still touch.
pub(super) struct Zombie {
    pub(super) reqs: Vec<Request>,
    pub(super) _regions: Vec<Region>,
    /// Regions packed sends read in place, still in use.
    pub(super) _uses: Vec<UseGuard>,
    pub(super) _stages: Vec<Stage>,
}

/// One `Writes` message in flight (its seq: [`Batch::packed_base`] + its index).
pub(super) struct PackedMsg {
    /// The send, until UCX finished it.
    pub(super) req: Option<Request>,
    /// The local regions the send reads its bytes from in place, held in use as long as `req`:
    /// no host view of them can be taken, and they cannot be deregistered, while UCX may still
    /// read them, whatever became of the pairs.
    pub(super) sources: Vec<UseGuard>,
    /// The batch's slots it carries.
    pub(super) slots: std::ops::Range<usize>,
    /// The peer acknowledged it.
    pub(super) acked: bool,
}

impl PackedMsg {
    /// The send and the regions it reads, if UCX has not finished it: whoever takes them keeps
    /// them until it does (dropping a pending request would wait for it).
    pub(super) fn pending_send(&mut self) -> Option<(Request, Vec<UseGuard>)> {
        let mut r = self.req.take()?;
        let sources = std::mem::take(&mut self.sources);
        matches!(r.test(), Ok(false)).then_some((r, sources))
    }
}

/// Tests a request: `Some(Ok)` finished, `Some(Err)` failed, `None` still in flight. A request
/// that failed on a connection already failed for a known reason (the server said goodbye, a
/// goodbye went unanswered) fails with that reason rather than UCX's transport status.
pub(super) fn test(req: &mut Request, peer: &PeerConn) -> Option<Result<()>> {
    match req.test() {
        Ok(true) => Some(Ok(())),
        Ok(false) => None,
        Err(e) => Some(Err(peer
            .failed_error()
            .unwrap_or_else(|| ucx_err(&peer.label(), req.op(), e)))),
    }
}

pub(super) struct Slot {
    pub(super) item: Option<WorkItem>,
    pub(super) req: Option<Request>,
    /// The request finished successfully (or completed at post).
    pub(super) local_done: bool,
    pub(super) result: Option<Result<u64>>,
    pub(super) put: bool,
    pub(super) len: u64,
    /// The pinned staging buffer of a GPU pair when UCX cannot move GPU memory itself.
    pub(super) stage: Option<Stage>,
    /// The path UCX said it runs the operation on (GPU memory only; see [`observed_path`]).
    pub(super) taken: Option<DataPath>,
    /// Packed writes: the acknowledgements still needed (one per piece, [`PACK_PIECE_MAX`]).
    pub(super) pieces: u32,
}

pub(super) struct Batch {
    pub(super) seq: u64,
    pub(super) peer: Arc<PeerConn>,
    pub(super) slots: Vec<Slot>,
    pub(super) flush_done: Option<Result<()>>,
    pub(super) notify: Option<Arc<[u8]>>,
    pub(super) notify_req: Option<Request>,
    pub(super) notify_done: Option<Result<()>>,
    /// An item of the batch failed before it became a slot (stopped, or refused at post): the
    /// transfer fails, so its notification is not sent.
    pub(super) failed_at_post: bool,
    pub(super) started: Instant,
    /// Puts complete only after a flush confirmed them (`PutCompletion::Remote`, or a batch
    /// with a notification, which must follow data the peer can read).
    pub(super) remote: bool,
    /// Packed `Writes` messages of this batch (see [`Ops::submit_packed`]), each with the
    /// slots it carries; their slots complete when the peer acknowledges the message.
    pub(super) packed: Vec<PackedMsg>,
    /// The seq of `packed[0]`: a batch's messages have consecutive seqs.
    pub(super) packed_base: u64,
    /// Messages of `packed` not yet acknowledged.
    pub(super) packed_open: usize,
}

/// Completes `item`; `now` is the poll's clock read, made at its first completion.
fn finish(item: WorkItem, r: Result<u64>, taken: Option<DataPath>, now: &mut Option<Instant>) {
    item.complete_at(r, taken, *now.get_or_insert_with(Instant::now));
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

impl Batch {
    /// Returns (finished, items completed now).
    pub(super) fn poll(&mut self, stages: &mut Stages) -> (bool, usize) {
        let mut now = None;
        // Packed writes: a send that failed fails its pairs; a peer that failed fails what
        // still waits for an acknowledgement.
        if self.packed_open > 0 {
            // Only a failed connection: one this agent is closing still delivers the
            // acknowledgements (its goodbye waits for this batch).
            let failure = self.peer.failed_error().or_else(|| {
                self.peer.ep.failure().map(|s| Error::PeerFailed {
                    peer: self.peer.label(),
                    detail: super::ep_failure(s),
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
                    .map_err(Error::ProtocolLimit)
                    .and_then(|bytes| {
                        self.peer
                            .ep
                            .am_send(super::CTRL_AM, &self.peer.route, &bytes)
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
    pub(super) fn keep_pending_sends(&mut self, zombies: &mut Vec<Zombie>) {
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

    /// Fails the unfinished items after `timeout` (see [`Batch::fail`]).
    pub(super) fn abandon(self, zombies: &mut Vec<Zombie>, timeout: std::time::Duration) -> usize {
        let e = Error::PeerFailed {
            peer: self.peer.label(),
            detail: format!("no completion within {timeout:?} (peer gone or not progressing)"),
        };
        self.fail(zombies, &e)
    }

    /// Fails the unfinished items with `e` (their connection failed); keeps their requests and
    /// regions alive until UCX ends them.
    pub(super) fn fail(mut self, zombies: &mut Vec<Zombie>, e: &Error) -> usize {
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
                item.complete(Err(e.clone()));
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
