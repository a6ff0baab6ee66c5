//! The adapter between UCX and the protocol state machine ([`crate::net::protocol`]): it opens
//! and accepts connections, feeds each connection's [`protocol::Conn`] what arrives (control
//! messages as active messages on the connection's endpoint, routed by the endpoint they came
//! on), what failed (the endpoint) and the clock, and performs the actions it returns (sends,
//! flushes, packed writes to apply, events, releases, the end of a connection).
//!
//! Nothing a peer sends is used before [`codec::decode`] accepted it, and the state machine
//! accepts nothing but the handshake before authentication; packed rkeys are sent only in the
//! welcome, after the client's MAC verified, and the client uses them only after the server's
//! MAC verified.
//!
//! Closing on purpose ([`UcxBackend::close_peer`]: `Peer::close`, the last `Peer` handle
//! dropped, the backend dropped): the client stops new operations, flushes its endpoint (every
//! operation posted before is done at the server), sends `Bye` and waits (bounded) for the
//! server's `Bye` in answer; only then does its endpoint close. The server, on `Bye`, releases
//! the peer's state as for a lost peer, reports [`NetEvent::Left`] and answers; the endpoint
//! failure that the client's close then causes at the server is not reported. A peer that dies
//! without a goodbye is still [`NetEvent::Lost`].

use super::conn::{gpu_path_of, rma_transport_name, PeerConn};
use super::{lock, next, ucx_err, State, UcxBackend, CTRL_AM, MAX_QUEUED_NOTIFICATIONS};
use crate::error::{Error, Result};
use crate::net::auth::nonce;
use crate::net::codec::{self, Message, RefuseCode};
use crate::net::protocol::{self, Action, Flush, Limits, Role};
#[cfg(doc)]
use crate::net::NetEvent;
use crate::net::{ConnectOptions, Notification};
use gdpath_ucx::{Endpoint, MemType};
use std::net::SocketAddr;
use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::{Duration, Instant};

/// How long a goodbye may take when the backend is dropped with client connections left.
pub(crate) const GOODBYE_WAIT: Duration = Duration::from_secs(2);

/// How long dropping the last `Peer` waits for its goodbye (flush, `Bye`, the answer): a
/// responsive server finishes it within a few round trips (µs over loopback, ms across a
/// datacenter) plus the time to deliver puts still buffered (the flush covers them); a goodbye
/// not finished by then finishes in later progress rounds or when the agent is dropped.
const DROP_WAIT: Duration = Duration::from_millis(100);

/// What [`UcxBackend::close_peer`] does with a goodbye not finished in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnTimeout {
    /// End the connection as failed and say why (`Peer::close`, whose result reports it).
    Fail,
    /// Leave it under way for later progress rounds and the backend's drop (a dropped `Peer`:
    /// nobody reads its result).
    LeaveUnderWay,
}

/// The text a connection's failure carries, from the engine error a UCX call gave.
fn detail_of(e: &Error) -> String {
    match e {
        Error::PeerFailed { detail, .. } => detail.clone(),
        other => other.to_string(),
    }
}

impl UcxBackend {
    /// The time bounds of this backend's server-side connections.
    fn server_limits(&self) -> Limits {
        Limits {
            handshake: self.cfg.connect_timeout,
            goodbye: self.cfg.connect_timeout,
            ack: self.cfg.op_timeout,
        }
    }

    /// Encodes and sends a control message; the request is tracked until it completes.
    fn send_msg(&self, st: &mut State, peer: &Arc<PeerConn>, msg: &Message) -> Result<()> {
        let bytes = codec::encode(msg).map_err(|e| Error::Config(e.to_string()))?;
        let req = peer
            .ep
            .am_send(CTRL_AM, &[], &bytes)
            .map_err(|e| ucx_err(&peer.label(), "am_send", e))?;
        st.ops.track_send(peer.clone(), req, false);
        self.kick();
        Ok(())
    }

    /// Performs, in order, what the protocol asked for connection `peer`.
    pub(crate) fn perform(&self, st: &mut State, peer: &Arc<PeerConn>, out: Vec<Action>) {
        for a in out {
            match a {
                Action::Send(m) => {
                    if let Message::Refused {
                        code: RefuseCode::Protocol,
                        reason,
                    } = &m
                    {
                        tracing::warn!(peer = %peer.label(), "protocol error: {reason}");
                    }
                    if let Err(e) = self.send_msg(st, peer, &m) {
                        tracing::debug!(peer = %peer.label(), "{:?} not sent: {e}", m.kind());
                        let mut more = Vec::new();
                        lock(&peer.inner).proto.transport_failed(
                            &mut st.node,
                            detail_of(&e),
                            &mut more,
                        );
                        self.perform(st, peer, more);
                    }
                }
                Action::Flush(f) => self.flush_for(st, peer, f),
                Action::Withdrawn(ids) => peer.mark_withdrawn(&ids),
                Action::ApplyWrites {
                    seq,
                    region,
                    records,
                    data,
                } => {
                    let status = super::packed::apply(st, region, &records, &data);
                    if status != codec::WritesStatus::Done {
                        tracing::debug!(peer = %peer.label(), "writes {seq} not made: {status:?}");
                    }
                    let mut more = Vec::new();
                    lock(&peer.inner)
                        .proto
                        .writes_applied(seq, status, &mut more);
                    self.perform(st, peer, more);
                }
                Action::WritesAcked { seq, status } => st.ops.writes_acked(peer, seq, status),
                Action::Notification(n) => self.queue_notification(n),
                Action::Event(e) => self.push_event(e),
                Action::Release(id) => super::export::release(st, id),
                Action::End(r) => {
                    match &r {
                        Err(e @ Error::Protocol { .. }) => tracing::warn!("{e}"),
                        Err(e) => tracing::debug!(peer = %peer.label(), "connection ended: {e}"),
                        Ok(()) => tracing::debug!(peer = %peer.label(), "connection closed"),
                    }
                    st.peers.retain(|p| p.id != peer.id);
                    // A goodbye flush still in flight is kept until UCX ends it.
                    if let Some(f) = lock(&peer.inner).goodbye.take() {
                        st.ops.track_send(peer.clone(), f, false);
                    }
                }
            }
        }
    }

    fn queue_notification(&self, n: Notification) {
        let mut q = lock(&self.notifications);
        if q.len() >= MAX_QUEUED_NOTIFICATIONS {
            self.notifications_dropped.fetch_add(1, Ordering::Relaxed);
        } else {
            q.push_back(n);
        }
    }

    /// Posts the flush the protocol asked for; one that cannot be posted is reported failed
    /// at once.
    fn flush_for(&self, st: &mut State, peer: &Arc<PeerConn>, f: Flush) {
        match peer.ep.flush_nb() {
            Ok(req) => match f {
                Flush::Goodbye => lock(&peer.inner).goodbye = Some(req),
                Flush::WithdrawAck(ids) => st.ops.ack_after(peer, ids, req),
            },
            Err(e) => {
                tracing::debug!(peer = %peer.label(), "flush for {f:?}: {e}");
                let mut out = Vec::new();
                lock(&peer.inner)
                    .proto
                    .flushed(&mut st.node, f, Err(e.to_string()), &mut out);
                self.perform(st, peer, out);
            }
        }
    }

    /// Withdrawal flushes that finished (`Ops::poll`): their acknowledgements go.
    pub(crate) fn withdraw_flushes_done(&self, st: &mut State) {
        for (peer, ids, r) in st.ops.take_acks() {
            let mut out = Vec::new();
            lock(&peer.inner)
                .proto
                .flushed(&mut st.node, Flush::WithdrawAck(ids), r, &mut out);
            self.perform(st, &peer, out);
        }
    }

    /// Connects to a serving agent and runs the handshake (see the module docs).
    pub(crate) fn connect(&self, addr: SocketAddr, opts: &ConnectOptions) -> Result<Arc<PeerConn>> {
        let ep = Endpoint::connect_with(&self.worker, addr, self.cfg.failure_mode.ucx())
            .map_err(|e| ucx_err(&addr.to_string(), "connect", e))?;
        let proto = protocol::Conn::client(
            next(&self.next_peer),
            Some(addr),
            opts.token.clone(),
            nonce()?,
            Instant::now(),
            Limits {
                handshake: opts.timeout,
                goodbye: self.cfg.connect_timeout,
                ack: self.cfg.op_timeout,
            },
        );
        let peer = Arc::new(PeerConn::new(ep, proto));
        lock(&self.state).peers.push(peer.clone());
        // The protocol bounds the handshake by `opts.timeout` (checked in every round).
        let outcome = loop {
            let (_, busy) = self.progress_round();
            if peer.is_ready() {
                break Ok(());
            }
            if let Some(e) = peer.failed_error() {
                break Err(e);
            }
            if !busy {
                std::thread::sleep(Duration::from_micros(20));
            }
        };
        if let Err(e) = outcome {
            lock(&self.state).peers.retain(|p| p.id != peer.id);
            // Let the control messages still in flight on it finish, so that the endpoint
            // closes now (the peer sees it) rather than at some later progress round.
            let end = Instant::now() + Duration::from_secs(1);
            while Arc::strong_count(&peer) > 1 && Instant::now() < end {
                if !self.progress_round().1 {
                    std::thread::sleep(Duration::from_micros(50));
                }
            }
            return Err(e);
        }
        let transport = rma_transport_name(&peer.ep, MemType::Host);
        let lanes: Vec<String> = match peer.ep.transports() {
            Ok(t) => t.lanes.into_iter().map(|l| l.transport).collect(),
            Err(e) => {
                tracing::debug!("endpoint transports: {e}");
                Vec::new()
            }
        };
        // Over tcp every UCX put is a message the target answers, whether UCX runs tcp's own
        // put (a client-server endpoint's `rma_bw` lane) or emulates it over active messages
        // (UCX 1.13 without a listener): the target's CPU copies each, and acknowledges each.
        let pack_max = if self.cfg.pack_writes && transport == "tcp" {
            let proto = std::env::var("UCX_PROTO_ENABLE").ok();
            crate::net::pack_limit(self.ctx.ucx().version(), proto.as_deref())
        } else {
            0
        };
        peer.set_paths(transport, pack_max, gpu_path_of(&lanes));
        Ok(peer)
    }

    /// Accepts queued connection requests and challenges each new peer (or refuses it when
    /// this agent serves as many peers as it accepts).
    pub(crate) fn accept_connections(&self) -> bool {
        let mut any = false;
        loop {
            let accepted = {
                let l = lock(&self.listener);
                match l.as_ref() {
                    None => return any,
                    Some(listener) => listener.try_accept(),
                }
            };
            let ep = match accepted {
                Ok(Some(ep)) => ep,
                Ok(None) => return any,
                Err(e) => {
                    tracing::warn!("accepting a connection failed: {e}");
                    return any;
                }
            };
            any = true;
            let server_nonce = match nonce() {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!("{e}");
                    continue;
                }
            };
            let addr = ep.peer();
            let proto = protocol::Conn::server(
                next(&self.next_peer),
                addr,
                server_nonce,
                Instant::now(),
                self.server_limits(),
            );
            let peer = Arc::new(PeerConn::new(ep, proto));
            let mut guard = lock(&self.state);
            let st = &mut *guard;
            let serving = st
                .peers
                .iter()
                .filter(|p| p.role == Role::Server && !lock(&p.inner).proto.is_leaving())
                .count();
            let mut out = Vec::new();
            if serving >= self.cfg.max_peers {
                let reason = format!("server has its maximum of {} peers", self.cfg.max_peers);
                lock(&peer.inner)
                    .proto
                    .refuse(&mut st.node, RefuseCode::Busy, reason, &mut out);
            } else {
                st.peers.push(peer.clone());
                lock(&peer.inner).proto.challenge(&mut out);
            }
            self.perform(st, &peer, out);
        }
    }

    /// Routes queued control messages to their connections' state machines.
    pub(crate) fn dispatch_messages(&self) -> bool {
        let mut any = false;
        while let Some(m) = self.worker.am_try_recv(CTRL_AM) {
            any = true;
            let mut guard = lock(&self.state);
            let st = &mut *guard;
            let peer = m
                .reply_ep
                .and_then(|id| st.peers.iter().find(|p| p.ep.id() == id).cloned());
            let Some(peer) = peer else {
                tracing::debug!("control message from an unknown or closed connection dropped");
                continue;
            };
            // Our senders put the whole message in the payload (decoded in place, held in UCX's
            // buffer where large); a header is taken as its start.
            let decoded = if m.header.is_empty() {
                codec::decode_owned(m.data)
            } else {
                let mut b = m.header;
                b.extend_from_slice(&m.data);
                codec::decode_owned(b)
            };
            let mut out = Vec::new();
            {
                let mut g = lock(&peer.inner);
                match decoded {
                    Ok(msg) => g.proto.handle(&mut st.node, msg, Instant::now(), &mut out),
                    Err(e) => g.proto.decode_failed(&mut st.node, e, &mut out),
                }
            }
            self.perform(st, &peer, out);
        }
        any
    }

    /// Feeds every connection what happened to it: its endpoint failing, its goodbye flush
    /// done (once nothing else is in flight to the peer), the clock (handshake, goodbye and
    /// acknowledgement deadlines); starts the goodbye of a released client connection whose
    /// regions are all gone. Returns whether any connection did something.
    pub(crate) fn reap_peers(&self, st: &mut State) -> bool {
        let now = Instant::now();
        let mut todo: Vec<(Arc<PeerConn>, Vec<Action>)> = Vec::new();
        let State {
            peers, node, ops, ..
        } = st;
        for p in peers.iter() {
            let mut out = Vec::new();
            let mut g = lock(&p.inner);
            if let Some(s) = p.ep.failure() {
                g.proto
                    .transport_failed(node, format!("connection failed: {s}"), &mut out);
            } else {
                let flushed = match g.goodbye.as_mut().map(|f| f.test()) {
                    None | Some(Ok(false)) => None,
                    // Work posted before the goodbye still running (a batch's own flush, its
                    // notification): the goodbye goes after it, or the server would drop what
                    // follows.
                    Some(Ok(true)) if ops.involves(p.id) => None,
                    Some(Ok(true)) => Some(Ok(())),
                    Some(Err(e)) => Some(Err(e.to_string())),
                };
                if let Some(r) = flushed {
                    g.goodbye = None;
                    g.proto.flushed(node, Flush::Goodbye, r, &mut out);
                }
                g.proto.poll(node, now, &mut out);
                if p.role == Role::Client
                    && g.proto.is_ready()
                    && p.is_released()
                    && !g.has_live_regions()
                {
                    g.proto.close(now, &mut out);
                }
            }
            drop(g);
            if !out.is_empty() {
                todo.push((p.clone(), out));
            }
        }
        let changed = !todo.is_empty();
        for (p, out) in todo {
            self.perform(st, &p, out);
        }
        changed
    }

    /// The earliest instant at which a connection's state machine has something to do on
    /// time (a handshake, goodbye or acknowledgement bound), or `None`. A sleeping serving
    /// thread wakes by then, so that these deadlines are kept to within its wake-up latency
    /// rather than its longest sleep.
    pub(crate) fn next_reap_deadline(&self, st: &State) -> Option<Instant> {
        st.peers
            .iter()
            .filter_map(|p| lock(&p.inner).proto.next_deadline())
            .min()
    }

    /// Starts closing client connection `peer` on purpose (its state machine's goodbye).
    /// Returns false, doing nothing, unless `peer` is a ready client connection.
    fn begin_goodbye(&self, st: &mut State, peer: &Arc<PeerConn>) -> bool {
        if peer.role != Role::Client || !peer.is_ready() {
            return false;
        }
        let mut out = Vec::new();
        let began = lock(&peer.inner).proto.close(Instant::now(), &mut out);
        self.perform(st, peer, out);
        began
    }

    /// Ends client connection `peer` without a goodbye, failed with `detail` (an earlier
    /// failure is kept).
    fn abandon(&self, st: &mut State, peer: &Arc<PeerConn>, detail: String) {
        let mut out = Vec::new();
        lock(&peer.inner)
            .proto
            .abandon(&mut st.node, detail, &mut out);
        self.perform(st, peer, out);
    }

    /// Closes client connection `conn` on purpose: no new operations, an endpoint flush (every
    /// operation posted before completes at the peer), `Bye`, and the server's `Bye` in
    /// answer, waiting up to `timeout` in all. The server then reports [`NetEvent::Left`], not
    /// [`NetEvent::Lost`]. The endpoint itself closes when the last handle on it (a `Peer`, a
    /// region made from the peer's) is gone. Closing again, or a connection that already
    /// failed, does nothing more.
    ///
    /// With [`OnTimeout::LeaveUnderWay`], a goodbye not finished within `timeout` is not
    /// failed but left to later progress rounds ([`UcxBackend::reap_peers`] sends `Bye` once
    /// the flush completed and ends the connection after `connect_timeout`; the answer ends it
    /// when it arrives) and to the backend's drop, which waits for it; the call then returns
    /// `Ok`.
    ///
    /// Errors: [`Error::PeerFailed`] when the connection had failed, failed while closing, or
    /// (with [`OnTimeout::Fail`]) no answer came within `timeout` (the server may then report
    /// the peer lost).
    pub(crate) fn close_peer(
        &self,
        conn: &Arc<PeerConn>,
        timeout: Duration,
        on_timeout: OnTimeout,
    ) -> Result<()> {
        let listed = |st: &State| st.peers.iter().any(|p| p.id == conn.id);
        {
            let mut st = lock(&self.state);
            if listed(&st)
                && !self.begin_goodbye(&mut st, conn)
                && !lock(&conn.inner).proto.is_closing()
            {
                // Failed (or never ready): there is nobody to say goodbye to. Its state may
                // still say ready when the endpoint failed under a direct wait (a flush) that
                // no round has seen yet: record why it is closed, as the answer below reads it.
                let detail = match conn.ep.failure() {
                    Some(s) => format!("connection failed: {s}"),
                    None => "closed before the connection was ready".into(),
                };
                self.abandon(&mut st, conn, detail);
            }
        }
        if !self.progress_until(timeout, || !listed(&lock(&self.state))) {
            if on_timeout == OnTimeout::LeaveUnderWay {
                return Ok(());
            }
            let mut st = lock(&self.state);
            if listed(&st) {
                let detail = format!("no answer to the goodbye within {timeout:?}");
                self.abandon(&mut st, conn, detail);
            }
        }
        // One guard for the answer: `conn.label()` would take the same lock again.
        let g = lock(&conn.inner);
        match (g.proto.is_over(), g.proto.error()) {
            (true, None) => Ok(()),
            (_, Some(e)) => Err(e.clone()),
            (false, None) => Err(Error::PeerFailed {
                peer: g.proto.label().to_owned(),
                detail: "the connection is not open".into(),
            }),
        }
    }

    /// The last `Peer` handle of client connection `conn` is gone: says goodbye now, waiting
    /// up to [`DROP_WAIT`] for it to finish, so that a server that stopped answering holds up
    /// the drop for no longer than that (the goodbye then stays under way); or, while regions
    /// made from the peer's are alive (they may still be used), once they are gone
    /// ([`UcxBackend::reap_peers`]) or the backend is dropped.
    pub(crate) fn release_peer(&self, conn: &Arc<PeerConn>) {
        if conn.role != Role::Client {
            return;
        }
        if lock(&conn.inner).has_live_regions() {
            conn.mark_released();
            // `reap_peers` starts the goodbye once the regions are gone: a round should see it.
            self.kick();
            return;
        }
        if let Err(e) = self.close_peer(conn, DROP_WAIT, OnTimeout::LeaveUnderWay) {
            tracing::debug!(peer = %conn.label(), "closing a dropped peer: {e}");
        }
    }

    /// Runs `f` on the protocol state of every ready connection of a serving agent (server
    /// role) and performs what it asks; returns the ids of those for which `f` said it acted.
    pub(crate) fn for_each_client(
        &self,
        st: &mut State,
        mut f: impl FnMut(&mut protocol::Conn, &mut protocol::Node, &mut Vec<Action>) -> bool,
    ) -> Vec<u64> {
        let clients: Vec<Arc<PeerConn>> = st
            .peers
            .iter()
            .filter(|p| p.role == Role::Server && p.is_ready())
            .cloned()
            .collect();
        let mut reached = Vec::new();
        for p in clients {
            let mut out = Vec::new();
            if f(&mut lock(&p.inner).proto, &mut st.node, &mut out) {
                reached.push(p.id);
            }
            self.perform(st, &p, out);
            // A send that failed ended the connection: it was not reached.
            if !st.peers.iter().any(|x| x.id == p.id) {
                reached.retain(|id| *id != p.id);
            }
        }
        reached
    }

    /// A serving agent stopping: says goodbye to every authenticated client (each then fails
    /// its connection with "the peer closed the connection" instead of a transport error;
    /// what it held is released, what it still sends is dropped), and progresses until the
    /// goodbyes are sent or `timeout` passes. Returns how many clients were told.
    pub(crate) fn leave_clients(&self, timeout: Duration) -> usize {
        let told = {
            let mut st = lock(&self.state);
            let now = Instant::now();
            self.for_each_client(&mut st, |c, node, out| c.leave(node, now, out))
        };
        let sent = self.progress_until(timeout, || {
            let st = lock(&self.state);
            !told.iter().any(|id| st.ops.involves(*id))
        });
        if !sent {
            tracing::debug!("goodbyes to clients not all sent within {timeout:?}");
        }
        told.len()
    }
}

/// An agent going away (its last handle dropped) says goodbye to the peers it is still
/// connected to, so that they report a clean disconnect: every ready client connection at
/// once, then waiting up to [`GOODBYE_WAIT`] for the answers (to those goodbyes and to any
/// already under way).
impl Drop for UcxBackend {
    fn drop(&mut self) {
        let closing: Vec<Arc<PeerConn>> = {
            let mut st = lock(&self.state);
            let clients: Vec<Arc<PeerConn>> = st
                .peers
                .iter()
                .filter(|p| p.role == Role::Client)
                .cloned()
                .collect();
            clients
                .into_iter()
                .filter(|p| self.begin_goodbye(&mut st, p) || lock(&p.inner).proto.is_closing())
                .collect()
        };
        if closing.is_empty() {
            return;
        }
        let answered = self.progress_until(GOODBYE_WAIT, || {
            let st = lock(&self.state);
            !closing
                .iter()
                .any(|c| st.peers.iter().any(|p| p.id == c.id))
        });
        if !answered {
            tracing::debug!("goodbyes not answered within {GOODBYE_WAIT:?}");
        }
    }
}
