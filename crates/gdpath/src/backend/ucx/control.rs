//! The adapter between the transports and the protocol state machine
//! ([`crate::net::protocol`]): it opens connections (the handshake over a TCP connection of
//! gdpath's own, [`UcxBackend::connect`]; a server's side is `listen.rs`), feeds each
//! connection's [`protocol::Conn`] what arrives (control messages as UCX active messages on
//! the endpoints made from the peers' worker addresses, routed by the id at their head; the
//! end of a client's TCP control connection; endpoint failures), and the clock, and performs
//! the actions it returns (sends, flushes, packed writes to apply, events, releases, the end of
//! a connection).
//!
//! Nothing a peer sends is used before [`codec::decode`] accepted it, and the state machine
//! accepts nothing but the handshake before authentication; UCX endpoints are made only from
//! worker addresses a MAC-verified handshake carried, packed rkeys are sent only in the
//! welcome, and the client uses them only after the server's MAC verified.
//!
//! Closing on purpose ([`UcxBackend::close_peer`]: `Peer::close`, the last `Peer` handle
//! dropped, the backend dropped): the client stops new operations, flushes its endpoint (every
//! operation posted before is done at the server), sends `Bye` and waits (bounded) for the
//! server's `Bye` in answer; only then does its endpoint close. The server, on `Bye`, releases
//! the peer's state as for a lost peer, reports [`NetEvent::Left`] and answers; the endpoint
//! failure and the end of the control connection that the client's close then causes at the
//! server are not reported. A peer that dies without a goodbye is still [`NetEvent::Lost`].

use super::conn::{gpu_path_of, rma_transport_name, PeerConn};
use super::listen::nonce;
use super::tcp::{self, FrameReader, ReadError};
use super::{
    ep_failure, lock, next, ucx_err, State, UcxBackend, CTL_CHECK, CTRL_AM, MAX_EARLY,
    MAX_QUEUED_NOTIFICATIONS,
};
use crate::error::{Error, Result};
use crate::net::codec::{self, Message, RefuseCode};
use crate::net::devices::Need;
use crate::net::protocol::{self, Action, Flush, Limits, Role};
#[cfg(doc)]
use crate::net::NetEvent;
use crate::net::{ConnectOptions, Notification};
use gdpath_ucx::{AmMessage, Endpoint, MemType, WorkerAddress};
use std::net::{SocketAddr, TcpStream};
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

/// The routing id at the head of control message `m`: its 8-byte header (messages sent whole),
/// or the first 8 bytes of its payload (packed writes, whose payload is gathered in place).
fn routing_id(m: &AmMessage) -> Option<u64> {
    let id: [u8; 8] = match m.header.len() {
        8 => m.header[..].try_into().ok()?,
        0 => m.data.get(..8)?.try_into().ok()?,
        _ => return None,
    };
    Some(u64::from_le_bytes(id))
}

/// The text a connection's failure carries, from the engine error a UCX call gave.
fn detail_of(e: &Error) -> String {
    match e {
        Error::PeerFailed { detail, .. } => detail.clone(),
        other => other.to_string(),
    }
}

impl UcxBackend {
    /// Encodes and sends a control message over UCX, the peer's routing id at its head; the
    /// request is tracked until it completes.
    fn send_msg(&self, st: &mut State, peer: &Arc<PeerConn>, msg: &Message) -> Result<()> {
        let bytes = codec::encode(msg).map_err(Error::ProtocolLimit)?;
        let req = peer
            .ep
            .am_send(CTRL_AM, &peer.route, &bytes)
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
                        let peer = peer.label();
                        self.log.warn("protocol", || {
                            format!("protocol error from {peer}: {reason}")
                        });
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
                Action::Fail(e) => st.ops.fail_peer(peer.id, &e.into()),
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
                Action::Connect { .. } => {
                    // Only a connection in its handshake connects (`connect`, `listen.rs`).
                    tracing::debug!(peer = %peer.label(), "connect after the handshake ignored");
                }
                Action::End(r) => {
                    let r = r.map_err(Error::from);
                    match &r {
                        Err(e @ Error::Protocol { .. }) => {
                            self.log.warn("protocol", || e.to_string())
                        }
                        Err(e) => tracing::debug!(peer = %peer.label(), "connection ended: {e}"),
                        Ok(()) => tracing::debug!(peer = %peer.label(), "connection closed"),
                    }
                    st.peers.retain(|p| p.id != peer.id);
                    // Nothing on the endpoint is owed to the peer any more: its close, when the
                    // last handle goes (a region made from the peer's may keep it long after),
                    // must not wait for a peer that no longer progresses it, wherever that
                    // handle is dropped (the control thread, under the state lock).
                    peer.ep.retire();
                    // The peer sees the end at once on its control connection.
                    peer.shutdown_control();
                    // A goodbye flush still in flight is kept until UCX ends it.
                    if let Some(f) = lock(&peer.inner).goodbye.take() {
                        st.ops.track_send(peer.clone(), f, false);
                    }
                    // What is still in flight to it fails now, not at the operation bound (an
                    // endpoint without peer error handling may never end it).
                    if let Err(e) = r {
                        st.ops.fail_peer(peer.id, &e);
                        // Without peer error handling an endpoint closes by flushing, which
                        // waits for the peer (up to 5 s): one whose connection failed is left
                        // to the process's end instead.
                        if peer.ep.error_mode() == gdpath_ucx::ErrorMode::None {
                            std::mem::forget(peer.ep.clone());
                        }
                    }
                }
            }
        }
    }

    /// Queues `n` for `take_notifications` / `wait_notification`, then runs the hooks of
    /// `Agent::on_notification` (outside the queue's lock: a hook may take the notification).
    fn queue_notification(&self, n: Notification) {
        let mut q = lock(&self.notifications);
        if q.len() >= MAX_QUEUED_NOTIFICATIONS {
            self.notifications_dropped.fetch_add(1, Ordering::Relaxed);
            return;
        }
        q.push_back(n);
        drop(q);
        let hooks = lock(&self.notification_hooks).clone();
        for h in hooks {
            h();
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

    /// Connects to a serving agent: the handshake over a TCP connection to `addr` (challenge,
    /// mutual authentication, worker addresses and metadata), then a UCX endpoint to the
    /// server's worker, within `opts.timeout` in all (see the module docs). A failure says in
    /// which phase it happened (`TCP connect`, the handshake's step, `UCX wireup`) and, for a
    /// wait, the bound it waited for. Errors: [`Error::Config`] for a zero timeout.
    pub(crate) fn connect(&self, addr: SocketAddr, opts: &ConnectOptions) -> Result<Arc<PeerConn>> {
        let failed = |detail: String| Error::PeerFailed {
            peer: addr.to_string(),
            detail,
        };
        if opts.timeout.is_zero() {
            return Err(Error::Config(format!(
                "connecting to {addr} with a timeout of 0: no time to connect in (give it \
                 seconds: a handshake over loopback takes milliseconds)"
            )));
        }
        let start = Instant::now();
        let deadline = start.checked_add(opts.timeout);
        let mut stream = match deadline {
            Some(d) => TcpStream::connect_timeout(
                &addr,
                d.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(1)),
            ),
            None => TcpStream::connect(addr),
        }
        .map_err(|e| {
            let what = if e.kind() == std::io::ErrorKind::TimedOut {
                format!("no answer within {:?} ({e})", opts.timeout)
            } else {
                e.to_string()
            };
            failed(format!(
                "TCP connect: {what} (is `gdpath serve` listening at {addr}?)"
            ))
        })?;
        let _ = stream.set_nodelay(true);
        // UCX's own port listens only on the interface this connection left from, when the
        // engine chooses: the server's side reaches it as it reached the server.
        let local = stream
            .local_addr()
            .map_err(|e| failed(format!("the connection's local address: {e}")))?;
        self.core_for(&Need::Connect {
            peer: addr,
            local: local.ip(),
        })?;
        // The server may send over UCX as soon as it welcomed: what comes before this side has
        // registered the connection waits under its routing id.
        let session = {
            let mut st = lock(&self.state);
            let s = super::listen::new_session(&st)?;
            st.early.insert(s, Vec::new());
            s
        };
        let shaken = self.handshake(&mut stream, addr, opts, session);
        let (proto, ep) = match shaken {
            Ok(done) => done,
            Err(e) => {
                lock(&self.state).early.remove(&session);
                return Err(e);
            }
        };
        let _ = stream.set_nonblocking(true);
        let peer = Arc::new(PeerConn::new(ep, proto, Some(stream)));
        {
            let mut guard = lock(&self.state);
            let st = &mut *guard;
            st.peers.push(peer.clone());
            for m in st.early.remove(&session).unwrap_or_default() {
                self.dispatch_one(st, &peer, m);
            }
        }
        // The endpoint is usable once UCX connected it (its first flush completes): a server
        // whose worker this side cannot reach fails the connect, not the first transfer.
        let left = deadline.map_or(Duration::MAX, |d| {
            d.saturating_duration_since(Instant::now())
        });
        if let Err(e) = peer.ep.wait_connected(left) {
            let mut st = lock(&self.state);
            let why = match &e {
                gdpath_ucx::UcxError::EndpointFailed { status, .. } => {
                    format!(
                        "cannot reach the server's UCX worker: {}",
                        ep_failure(*status)
                    )
                }
                gdpath_ucx::UcxError::Timeout { .. } if left.is_zero() => format!(
                    "the {:?} connect bound ran out in the handshake ({:?}), before the \
                     connection to the server's UCX worker could complete",
                    opts.timeout,
                    start.elapsed()
                ),
                gdpath_ucx::UcxError::Timeout { .. } => format!(
                    "the connection to the server's UCX worker did not complete within the \
                     {left:?} left of the {:?} connect bound",
                    opts.timeout
                ),
                e => format!("cannot reach the server's UCX worker: {e}"),
            };
            let detail = format!("UCX wireup: {why} ({})", crate::net::wireup_hint(&self.cfg));
            self.abandon(&mut st, &peer, detail.clone());
            return Err(failed(detail));
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
        // put (an `rma_bw` lane) or emulates it over active messages: the target's CPU copies
        // each, and acknowledges each.
        let pack_max = if self.cfg.pack_writes && transport == "tcp" {
            let proto = std::env::var("UCX_PROTO_ENABLE").ok();
            crate::net::pack_limit(self.ucx.version(), proto.as_deref())
        } else {
            0
        };
        peer.set_paths(transport, pack_max, gpu_path_of(&lanes));
        Ok(peer)
    }

    /// The client's side of the handshake on `stream`, driven by its state machine: the
    /// connection's state and the UCX endpoint to the server's worker once the server proved
    /// the token. Bounded by `opts.timeout` (the state machine's handshake bound).
    fn handshake(
        &self,
        stream: &mut TcpStream,
        addr: SocketAddr,
        opts: &ConnectOptions,
        session: u64,
    ) -> Result<(protocol::Conn, Endpoint)> {
        let failed = |detail: String| Error::PeerFailed {
            peer: addr.to_string(),
            detail,
        };
        let mut proto = protocol::Conn::client(
            next(&self.next_peer),
            Some(addr),
            opts.token.clone(),
            nonce()?,
            session,
            Instant::now(),
            Limits {
                handshake: opts.timeout,
                goodbye: self.cfg.connect_timeout,
                ack: self.cfg.op_timeout,
            },
        );
        let mut reader = FrameReader::new(codec::MAX_MESSAGE);
        let mut ep = None;
        loop {
            let frame = tcp::read_frame(stream, &mut reader, proto.next_deadline());
            let now = Instant::now();
            let mut out = Vec::new();
            {
                let mut guard = lock(&self.state);
                let node = &mut guard.node;
                match frame {
                    Ok(f) => match codec::decode_owned(f) {
                        Ok(m) => proto.handle(node, m, now, &mut out),
                        Err(e) => proto.decode_failed(node, e, &mut out),
                    },
                    Err(ReadError::Bad(e)) => proto.decode_failed(node, e, &mut out),
                    Err(ReadError::Closed(how)) => proto.transport_failed(
                        node,
                        format!("the server closed the connection in the handshake ({how})"),
                        &mut out,
                    ),
                    Err(ReadError::Io(e))
                        if matches!(
                            e.kind(),
                            std::io::ErrorKind::TimedOut | std::io::ErrorKind::WouldBlock
                        ) =>
                    {
                        proto.poll(node, now, &mut out)
                    }
                    Err(ReadError::Io(e)) => proto.transport_failed(
                        node,
                        format!("handshake: the control connection failed: {e}"),
                        &mut out,
                    ),
                }
            }
            for a in out {
                match a {
                    Action::Send(m) => {
                        let bytes = codec::encode(&m).map_err(Error::ProtocolLimit)?;
                        tcp::write_frame(stream, &bytes, proto.next_deadline()).map_err(|e| {
                            // The bound passed before the frame could go (the server's came
                            // late), or while it was blocked going.
                            failed(if e.kind() == std::io::ErrorKind::TimedOut {
                                proto.handshake_overdue()
                            } else {
                                format!("handshake: cannot send {:?} to the server: {e}", m.kind())
                            })
                        })?;
                    }
                    Action::Connect { worker_address, .. } => {
                        let made = Endpoint::connect_address_with(
                            &self.made()?.worker,
                            &WorkerAddress(worker_address),
                            self.cfg.failure_mode.ucx(),
                        )
                        .map_err(|e| {
                            failed(format!(
                                "UCX wireup: cannot make an endpoint to the server's worker: {e}"
                            ))
                        })?;
                        ep = Some(made);
                    }
                    Action::End(Err(e)) => return Err(e.into()),
                    Action::End(Ok(())) => {
                        return Err(failed("the connection ended in the handshake".into()))
                    }
                    _ => {}
                }
            }
            if proto.is_ready() {
                let ep = ep.ok_or_else(|| failed("welcomed without a worker address".into()))?;
                return Ok((proto, ep));
            }
        }
    }

    /// Routes queued control messages to their connections' state machines, by the routing
    /// id at their head.
    pub(crate) fn dispatch_messages(&self) -> bool {
        let Some(core) = self.core() else {
            return false;
        };
        let mut any = false;
        while let Some(m) = core.worker.am_try_recv(CTRL_AM) {
            any = true;
            let Some(session) = routing_id(&m) else {
                self.log.warn("unroutable", || {
                    "a control message without a routing id was dropped".into()
                });
                continue;
            };
            let mut guard = lock(&self.state);
            let st = &mut *guard;
            if let Some(peer) = st.peers.iter().find(|p| p.session == session).cloned() {
                self.dispatch_one(st, &peer, m);
            } else if let Some(q) = st.early.get_mut(&session) {
                if q.len() < MAX_EARLY {
                    q.push(m);
                }
            } else {
                tracing::debug!("control message for an unknown or closed connection dropped");
            }
        }
        any
    }

    /// Decodes message `m` for connection `peer` (decoded in place, held in UCX's buffer where
    /// large) and feeds it to its state machine.
    fn dispatch_one(&self, st: &mut State, peer: &Arc<PeerConn>, m: AmMessage) {
        // The routing id is the header, or the payload's first 8 bytes (`routing_id`).
        let decoded = if m.header.is_empty() {
            codec::decode_owned_from(m.data, 8)
        } else {
            codec::decode_owned(m.data)
        };
        let mut out = Vec::new();
        {
            let mut g = lock(&peer.inner);
            match decoded {
                Ok(msg) => g.proto.handle(&mut st.node, msg, Instant::now(), &mut out),
                Err(e) => g.proto.decode_failed(&mut st.node, e, &mut out),
            }
        }
        self.perform(st, peer, out);
    }

    /// Feeds every connection what happened to it: its endpoint failing, its goodbye flush
    /// done (once nothing else is in flight to the peer), the clock (handshake, goodbye and
    /// acknowledgement deadlines); starts the goodbye of a released client connection whose
    /// regions are all gone. Returns whether any connection did something.
    pub(crate) fn reap_peers(&self, st: &mut State) -> bool {
        let now = Instant::now();
        let mut todo: Vec<(Arc<PeerConn>, Vec<Action>)> = Vec::new();
        let read_ctl = st
            .ctl_checked
            .is_none_or(|t| now.duration_since(t) >= CTL_CHECK);
        if read_ctl {
            st.ctl_checked = Some(now);
        }
        let State {
            peers, node, ops, ..
        } = st;
        for p in peers.iter() {
            let mut out = Vec::new();
            // A client reads its control connection (a server's control thread reads its own).
            let ctl = if read_ctl && p.role == Role::Client {
                p.read_control()
            } else {
                Ok(Vec::new())
            };
            let mut g = lock(&p.inner);
            if let Some(s) = p.ep.failure() {
                g.proto.transport_failed(node, ep_failure(s), &mut out);
            } else if let Err(detail) = ctl {
                g.proto.transport_failed(node, detail, &mut out);
            } else {
                for f in ctl.unwrap_or_default() {
                    match codec::decode_owned(f) {
                        Ok(m) => g.proto.handle(node, m, now, &mut out),
                        Err(e) => g.proto.decode_failed(node, e, &mut out),
                    }
                }
                let flushed = match g.goodbye.as_mut().map(|f| f.test()) {
                    None | Some(Ok(false)) => None,
                    // Work posted before the goodbye still running (a batch's own flush, its
                    // notification): the goodbye goes after it, or the server would drop what
                    // follows.
                    Some(Ok(true)) if !g.proto.is_answering() && ops.involves(p.id) => None,
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
                    Some(s) => ep_failure(s),
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
            (_, Some(e)) => Err(e.clone().into()),
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
    /// what it held is released, what it still sends is dropped), and progresses until each
    /// answered (its sends in flight flushed: closing under them can abort UCX 1.13, see
    /// docs/network.md) or `timeout` passes. Returns how many clients were told.
    pub(crate) fn leave_clients(&self, timeout: Duration) -> usize {
        let told = {
            let mut st = lock(&self.state);
            let now = Instant::now();
            self.for_each_client(&mut st, |c, node, out| c.leave(node, now, out))
        };
        let answered = self.progress_until(timeout, || {
            let st = lock(&self.state);
            !told.iter().any(|id| st.peers.iter().any(|p| p.id == *id))
        });
        if !answered {
            tracing::debug!("goodbyes to clients not all answered within {timeout:?}");
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
        self.say_goodbye_on_drop();
        // What is still in flight (transfers cancelled, a peer that went away) gets a short
        // bound to end, then is left to the process's end instead of waited for: a request's
        // own drop waits up to 30 s for UCX, forever for a peer that went away without peer
        // error handling.
        let done = self.progress_until(IN_FLIGHT_WAIT, || lock(&self.state).ops.idle());
        if !done {
            tracing::debug!("operations still in flight at the backend's drop are left behind");
            lock(&self.state).ops.leak_in_flight();
        }
    }
}

/// How long the backend's drop waits for operations still in flight.
const IN_FLIGHT_WAIT: Duration = Duration::from_millis(200);

impl UcxBackend {
    fn say_goodbye_on_drop(&self) {
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
                .filter(|p| {
                    self.begin_goodbye(&mut st, p) || {
                        let g = lock(&p.inner);
                        g.proto.is_closing() || g.proto.is_answering()
                    }
                })
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
