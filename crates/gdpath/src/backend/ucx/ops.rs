//! Descriptor pairs in flight: put/get requests, the flush that makes puts visible at the
//! target, notifications after them, withdraw acknowledgements, and control messages sent.
//!
//! The items of one `submit` for one peer form a batch. Gets complete when their request does.
//! Puts complete when an endpoint flush posted after them completes (UCX: a put's own request
//! only means the local buffer may be reused; the flush means the data is in the target's
//! memory). With a notification, the batch's items complete only after the notification was
//! sent, so that `Transfer::wait` returning means the peer has (or will get) it.
//!
//! A batch that does not finish within `NetConfig::op_timeout` fails its items with
//! [`Error::PeerFailed`]; its UCX requests and both regions of each pair are kept alive until
//! UCX finishes them (a request UCX may still touch is never released with its memory).

use super::peer::PeerConn;
use super::{ucx_err, RemoteMem, UcxBackend};
use crate::error::{Error, Result};
use crate::net::codec::Message;
use crate::region::Region;
use crate::transfer::{Op, WorkItem};
use gdpath_ucx::Request;
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
}

struct Batch {
    peer: Arc<PeerConn>,
    slots: Vec<Slot>,
    flush: Option<Request>,
    flush_done: Option<Result<()>>,
    notify: Option<Arc<[u8]>>,
    notify_req: Option<Request>,
    notify_done: Option<Result<()>>,
    started: Instant,
}

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
}

#[derive(Default)]
pub(crate) struct Ops {
    batches: Vec<Batch>,
    sends: Vec<Send>,
    acks: Vec<PendingAck>,
    zombies: Vec<Zombie>,
}

fn remote_of(item: &WorkItem) -> Option<&RemoteMem> {
    item.target()
        .region
        .foreign()
        .and_then(|f| f.as_any().downcast_ref::<RemoteMem>())
}

/// Tests a request: `Some(Ok)` finished, `Some(Err)` failed, `None` still in flight.
fn test(req: &mut Request, label: &str) -> Option<Result<()>> {
    match req.test() {
        Ok(true) => Some(Ok(())),
        Ok(false) => None,
        Err(e) => Some(Err(ucx_err(label, req.op(), e))),
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
    pub(crate) fn submit(&mut self, b: &UcxBackend, items: Vec<WorkItem>) {
        let mut groups: Vec<(Arc<PeerConn>, Vec<WorkItem>)> = Vec::new();
        for item in items {
            let Some(peer) = remote_of(&item).map(|r| r.peer.clone()) else {
                item.complete(Err(Error::Backend {
                    backend: "ucx",
                    detail: "target is not a remote region".into(),
                }));
                continue;
            };
            match groups.iter_mut().find(|(p, _)| Arc::ptr_eq(p, &peer)) {
                Some((_, v)) => v.push(item),
                None => groups.push((peer, vec![item])),
            }
        }
        for (peer, items) in groups {
            let label = peer.label();
            let notify = items.first().and_then(|i| i.notification());
            let mut batch = Batch {
                peer: peer.clone(),
                slots: Vec::with_capacity(items.len()),
                flush: None,
                flush_done: None,
                notify,
                notify_req: None,
                notify_done: None,
                started: Instant::now(),
            };
            let mut puts = false;
            for item in items {
                if let Some(e) = item.stop_reason() {
                    item.complete(Err(e));
                    continue;
                }
                match post(b, &item, &label) {
                    Ok(req) => {
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
                        });
                    }
                    Err(e) => item.complete(Err(e)),
                }
            }
            if batch.slots.is_empty() {
                continue;
            }
            if puts {
                match peer.ep.flush_nb() {
                    Ok(r) => batch.flush = Some(r),
                    Err(e) => batch.flush_done = Some(Err(ucx_err(&label, "flush", e))),
                }
            }
            self.batches.push(batch);
        }
    }

    /// Tests everything in flight; completes finished items. Returns how many completed.
    pub(crate) fn poll(&mut self, b: &UcxBackend) -> usize {
        let mut done = 0;
        let timeout = b.cfg.op_timeout;
        let mut i = 0;
        while i < self.batches.len() {
            let (finished, n) = self.batches[i].poll();
            done += n;
            if finished {
                self.batches.swap_remove(i);
            } else if !timeout.is_zero() && self.batches[i].started.elapsed() > timeout {
                let batch = self.batches.swap_remove(i);
                done += batch.abandon(&mut self.zombies, timeout);
            } else {
                i += 1;
            }
        }
        self.sends.retain_mut(|s| {
            let label = s.peer.label();
            match test(&mut s.req, &label) {
                None => true,
                Some(r) => {
                    if let Err(e) = r {
                        tracing::debug!(peer = %label, "control message: {e}");
                    }
                    if s.close {
                        tracing::debug!(peer = %label, "closing refused connection");
                    }
                    false
                }
            }
        });
        let mut ready = Vec::new();
        self.acks.retain_mut(|a| {
            let finished = match a.flush.as_mut() {
                None => true,
                Some(f) => test(f, &a.peer.label()).is_some(),
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

/// Posts one item's put or get. `Ok(None)` when UCX completed it at once.
fn post(b: &UcxBackend, item: &WorkItem, label: &str) -> Result<Option<Request>> {
    let rm = remote_of(item).expect("grouped by remote target");
    if rm.withdrawn() {
        return Err(Error::Deregistered {
            region: item.target().region.id(),
        });
    }
    let local = b.local_mem(&item.local().region)?;
    let (l, t) = (item.local(), item.target());
    let len = usize::try_from(l.len).map_err(|_| Error::Config("length above usize".into()))?;
    let loff =
        usize::try_from(l.offset).map_err(|_| Error::Config("offset above usize".into()))?;
    item.mark_started();
    let r = match item.op() {
        Op::Write => rm.peer.ep.put(&local, loff, &rm.remote, t.offset, len),
        Op::Read => rm.peer.ep.get(&local, loff, &rm.remote, t.offset, len),
    };
    let mut req = r.map_err(|e| ucx_err(label, "put/get", e))?;
    match req.test() {
        Ok(true) => Ok(None),
        Ok(false) => Ok(Some(req)),
        Err(e) => Err(ucx_err(label, req.op(), e)),
    }
}

impl Batch {
    /// Returns (finished, items completed now).
    fn poll(&mut self) -> (bool, usize) {
        let label = self.peer.label();
        for s in &mut self.slots {
            if s.local_done || s.result.is_some() {
                continue;
            }
            if let Some(req) = s.req.as_mut() {
                match test(req, &label) {
                    Some(Ok(())) => s.local_done = true,
                    Some(Err(e)) => s.result = Some(Err(e)),
                    None => {}
                }
            }
        }
        if self.flush_done.is_none() {
            if let Some(f) = self.flush.as_mut() {
                self.flush_done = test(f, &label);
            }
        }
        for s in &mut self.slots {
            if s.result.is_some() || !s.local_done {
                continue;
            }
            if !s.put {
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
                        item.complete(r.clone());
                        n += 1;
                    }
                }
            }
            return (self.slots.iter().all(|s| s.item.is_none()), n);
        }
        if !self.slots.iter().all(|s| s.result.is_some()) {
            return (false, 0);
        }
        let all_ok = self.slots.iter().all(|s| matches!(s.result, Some(Ok(_))));
        if all_ok && self.notify_done.is_none() {
            if self.notify_req.is_none() {
                let msg = Message::Notify(self.notify.as_deref().unwrap_or_default().to_vec());
                let sent = crate::net::codec::encode(&msg)
                    .map_err(|e| Error::Config(e.to_string()))
                    .and_then(|bytes| {
                        self.peer
                            .ep
                            .am_send(super::CTRL_AM, &[], &bytes)
                            .map_err(|e| ucx_err(&label, "notify", e))
                    });
                match sent {
                    Ok(r) => self.notify_req = Some(r),
                    Err(e) => self.notify_done = Some(Err(e)),
                }
            }
            if let Some(r) = self.notify_req.as_mut() {
                self.notify_done = test(r, &label);
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
                item.complete(r);
                n += 1;
            }
        }
        (true, n)
    }

    /// Fails the unfinished items after `timeout`; keeps their requests and regions alive.
    fn abandon(mut self, zombies: &mut Vec<Zombie>, timeout: std::time::Duration) -> usize {
        let label = self.peer.label();
        let mut reqs: Vec<Request> = Vec::new();
        let mut regions: Vec<Region> = Vec::new();
        let mut n = 0;
        for s in &mut self.slots {
            if let Some(r) = s.req.take() {
                reqs.push(r);
            }
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
        reqs.extend(self.flush.take());
        reqs.extend(self.notify_req.take());
        reqs.retain_mut(|r| matches!(r.test(), Ok(false)));
        if !reqs.is_empty() {
            zombies.push(Zombie {
                reqs,
                _regions: regions,
            });
        }
        n
    }
}
