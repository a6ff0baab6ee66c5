//! Connections to peer agents: the handshake (challenge, mutual HMAC authentication, metadata),
//! control messages after it, and failure handling.
//!
//! Every connection is one UCX endpoint; control messages are active messages on it
//! ([`super::CTRL_AM`]), routed to their connection by the endpoint they arrived on. Nothing a
//! peer sends is used before [`codec::decode`] accepted it, and nothing but the handshake is
//! accepted before authentication; packed rkeys are sent only in the welcome, after the
//! client's MAC verified, and the client uses them only after the server's MAC verified.
//!
//! Closing on purpose ([`UcxBackend::close_peer`]: `Peer::close`, the last `Peer` handle
//! dropped, the backend dropped): the client stops new operations, flushes its endpoint (every
//! operation posted before is done at the server), sends `Bye` and waits (bounded) for the
//! server's `Bye` in answer; only then does its endpoint close. The server, on `Bye`, releases
//! the peer's state as for a lost peer, reports [`NetEvent::Left`] and answers; the endpoint
//! failure that the client's close then causes at the server is not reported. A peer that dies
//! without a goodbye is still [`NetEvent::Lost`].

use super::{lock, next, State, UcxBackend, CTRL_AM, MAX_QUEUED_NOTIFICATIONS};
use crate::error::{Error, Result};
use crate::net::auth::{nonce, Token};
use crate::net::codec::{self, Message, RefuseCode, RegionMeta, NONCE_LEN};
use crate::net::{ConnectOptions, NetEvent, Notification};
use crate::path::Path;
use crate::region::{Region, RegionInner};
use gdpath_ucx::{Endpoint, Listener, MemType, Request};
use std::collections::HashSet;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};
use std::time::{Duration, Instant};

/// Which side of the connection this agent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Role {
    /// This agent connected to a serving peer (it reads and writes the peer's exports).
    Client,
    /// A peer connected to this serving agent.
    Server,
}

enum Phase {
    AwaitChallenge {
        token: Token,
    },
    AwaitWelcome {
        token: Token,
        server_nonce: [u8; NONCE_LEN],
        client_nonce: [u8; NONCE_LEN],
    },
    AwaitAuth {
        server_nonce: [u8; NONCE_LEN],
    },
    Ready,
    /// Client closing on purpose: no new operations. `flush`, posted when closing began,
    /// covers every operation posted before; once it completed `Bye` is sent (`flush` is then
    /// `None`) and the server's answering `Bye` ends the connection ([`Phase::Closed`]).
    Closing {
        since: Instant,
        flush: Option<Request>,
    },
    /// Server: the client said goodbye. Its state is released and [`NetEvent::Left`] reported;
    /// the connection is dropped without an event once its endpoint fails (the client closed
    /// it) or after `connect_timeout`.
    Leaving {
        since: Instant,
    },
    /// Client: closed on purpose, the goodbye answered.
    Closed,
    Failed(Error),
}

struct PeerInner {
    phase: Phase,
    label: String,
    /// The regions the peer exports (client role), as its last metadata listed them.
    metadata: Vec<RegionMeta>,
    withdrawn: HashSet<u64>,
    /// This agent's regions made from the peer's regions, to mark when they are withdrawn.
    tracked: Vec<(u64, Weak<RegionInner>)>,
    transport: Arc<str>,
    /// Host memory moves over tcp, where every UCX put is a message with an acknowledgement:
    /// host writes of at most this many bytes go as this agent's own packed `Writes` messages
    /// instead (`ops`, [`crate::net::pack_limit`]); 0: none.
    pack_max: u64,
    /// The planned path of GPU memory ([`PeerConn::planned_path`]), from the endpoint's lanes.
    gpu_path: Path,
}

/// How long a goodbye may take when the backend is dropped with client connections left.
pub(crate) const GOODBYE_WAIT: Duration = Duration::from_secs(2);

/// How long dropping the last `Peer` waits for its goodbye (flush, `Bye`, the answer): a
/// responsive server finishes it within a few round trips (µs over loopback, ms across a
/// datacenter) plus the time to deliver puts still buffered (the flush covers them); a goodbye
/// not finished by then finishes in later progress rounds or when the agent is dropped.
const DROP_WAIT: Duration = Duration::from_millis(100);

/// One connection to a peer agent.
pub(crate) struct PeerConn {
    pub(crate) id: u64,
    pub(crate) ep: Endpoint,
    pub(crate) role: Role,
    pub(crate) addr: Option<SocketAddr>,
    since: Instant,
    /// Client: the last `Peer` handle was dropped while regions made from the peer's were
    /// still alive; the goodbye is said once they are gone ([`UcxBackend::reap_peers`]).
    released: AtomicBool,
    inner: Mutex<PeerInner>,
}

impl std::fmt::Debug for PeerConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerConn")
            .field("id", &self.id)
            .field("label", &self.label())
            .field("role", &self.role)
            .finish()
    }
}

/// Printable form of a name a peer chose: control characters become `?`.
fn sanitize(s: &str) -> String {
    s.chars()
        .map(|c| if c.is_control() { '?' } else { c })
        .collect()
}

/// The GPU path of [`PeerConn::planned_path`] for an endpoint whose lanes use `lanes`
/// (transport names, all memory types).
fn gpu_path_of(lanes: &[String]) -> Path {
    if let Some(t) = super::RDMA_TRANSPORTS
        .iter()
        .find(|t| lanes.iter().any(|l| l == *t))
    {
        return Path::Gdr {
            transport: (*t).into(),
        };
    }
    let mut names: Vec<&str> = lanes.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    Path::Ucx {
        transport: if names.is_empty() {
            "unknown".into()
        } else {
            names.join("+").into()
        },
    }
}

fn addr_text(a: Option<SocketAddr>) -> String {
    a.map_or_else(|| "?".into(), |a| a.to_string())
}

impl PeerConn {
    /// When this connection, in `phase`, is dropped for taking too long: `timeout` after a
    /// goodbye started (either side) or, before the handshake finished, after the connection
    /// was made. `None` in phases that wait on nothing.
    fn deadline(&self, phase: &Phase, timeout: Duration) -> Option<Instant> {
        match phase {
            Phase::Closing { since, .. } | Phase::Leaving { since } => after(*since, timeout),
            Phase::Ready | Phase::Failed(_) | Phase::Closed => None,
            Phase::AwaitChallenge { .. } | Phase::AwaitWelcome { .. } | Phase::AwaitAuth { .. } => {
                after(self.since, timeout)
            }
        }
    }

    fn new(id: u64, ep: Endpoint, role: Role, addr: Option<SocketAddr>, phase: Phase) -> Self {
        PeerConn {
            id,
            ep,
            role,
            addr,
            since: Instant::now(),
            released: AtomicBool::new(false),
            inner: Mutex::new(PeerInner {
                phase,
                label: addr_text(addr),
                metadata: Vec::new(),
                withdrawn: HashSet::new(),
                tracked: Vec::new(),
                transport: "unknown".into(),
                pack_max: 0,
                gpu_path: gpu_path_of(&[]),
            }),
        }
    }

    /// `name@address` once authenticated, the address before.
    pub(crate) fn label(&self) -> String {
        lock(&self.inner).label.clone()
    }

    /// Why the connection is unusable, if it is.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure_in(&lock(&self.inner))
    }

    /// The planned path of a pair between local memory and this peer, or why the connection is
    /// unusable ([`PeerConn::failure`]); one lock for both answers, as the planner asks for
    /// every pair.
    ///
    /// - Host memory (`gpu` false; also GPU memory staged through host buffers): `Ucx` with
    ///   the endpoint's transport.
    /// - GPU memory UCX moves itself (CUDA-enabled UCX), before UCX has chosen a protocol:
    ///   `Gdr { transport }` when the endpoint has an RDMA lane (the NIC would read or write
    ///   GPU memory), else `Ucx` with every transport of the endpoint's lanes joined with `+`
    ///   (e.g. `cma+cuda_ipc+posix+sysv`): the candidates, not a claim. Once an operation runs,
    ///   `ops` replaces it with what UCX says it chose (`ucp_request_query`;
    ///   `docs/network.md`).
    pub(crate) fn planned_path(&self, gpu: bool) -> std::result::Result<Path, String> {
        let inner = lock(&self.inner);
        if let Some(why) = self.failure_in(&inner) {
            return Err(why);
        }
        Ok(if gpu {
            inner.gpu_path.clone()
        } else {
            Path::Ucx {
                transport: inner.transport.clone(),
            }
        })
    }

    fn failure_in(&self, inner: &PeerInner) -> Option<String> {
        match &inner.phase {
            Phase::Failed(e) => return Some(e.to_string()),
            Phase::Closing { .. } | Phase::Closed => {
                return Some("this agent closed the connection".into())
            }
            Phase::Leaving { .. } => return Some("the peer closed the connection".into()),
            _ => {}
        }
        self.ep.failure().map(|s| format!("connection failed: {s}"))
    }

    /// Whether host writes to this peer go as packed `Writes` messages: the longest pair that
    /// does, and the transport name their path reports.
    pub(crate) fn packed_writes(&self) -> Option<(u64, Arc<str>)> {
        let g = lock(&self.inner);
        (g.pack_max > 0).then(|| (g.pack_max, g.transport.clone()))
    }

    pub(crate) fn is_ready(&self) -> bool {
        matches!(lock(&self.inner).phase, Phase::Ready) && self.ep.failure().is_none()
    }

    /// Server: the client said goodbye (the connection only waits to be dropped).
    fn is_leaving(&self) -> bool {
        matches!(lock(&self.inner).phase, Phase::Leaving { .. })
    }

    /// True while a local region made from one of the peer's regions is alive (a transfer in
    /// flight on the connection holds its regions).
    fn has_live_regions(&self) -> bool {
        lock(&self.inner)
            .tracked
            .iter()
            .any(|(_, w)| w.strong_count() > 0)
    }

    /// The UCX transport(s) of put/get on host memory, as `Path::Ucx { transport }` names them.
    pub(crate) fn transport(&self) -> Arc<str> {
        lock(&self.inner).transport.clone()
    }

    pub(crate) fn metadata(&self) -> Vec<RegionMeta> {
        lock(&self.inner).metadata.clone()
    }

    pub(crate) fn is_withdrawn(&self, id: u64) -> bool {
        lock(&self.inner).withdrawn.contains(&id)
    }

    /// Remembers a local region made from the peer's region `id` (marked deregistered when the
    /// peer withdraws it; at once if it already did).
    pub(crate) fn track(&self, id: u64, region: &Region) {
        let mut g = lock(&self.inner);
        if g.withdrawn.contains(&id) {
            region.mark_withdrawn();
        }
        g.tracked.retain(|(_, w)| w.strong_count() > 0);
        g.tracked.push((id, region.downgrade()));
    }

    fn fail(&self, e: Error) {
        lock(&self.inner).phase = Phase::Failed(e);
    }

    pub(crate) fn failed_error(&self) -> Option<Error> {
        match &lock(&self.inner).phase {
            Phase::Failed(e) => Some(e.clone()),
            _ => None,
        }
    }
}

/// A listening socket and the token connecting peers must prove.
pub(crate) struct ListenState {
    pub(crate) listener: Listener,
    pub(crate) token: Token,
}

impl UcxBackend {
    /// Encodes and sends a control message; the request is tracked until it completes, then
    /// the connection is closed if `close`.
    pub(crate) fn send(
        &self,
        st: &mut State,
        peer: &Arc<PeerConn>,
        msg: &Message,
        close: bool,
    ) -> Result<()> {
        let bytes = codec::encode(msg).map_err(|e| Error::Config(e.to_string()))?;
        let req = peer
            .ep
            .am_send(CTRL_AM, &[], &bytes)
            .map_err(|e| super::ucx_err(&peer.label(), "am_send", e))?;
        st.ops.track_send(peer.clone(), req, close);
        self.kick();
        Ok(())
    }

    /// Connects to a serving agent and runs the handshake (see the module docs).
    pub(crate) fn connect(&self, addr: SocketAddr, opts: &ConnectOptions) -> Result<Arc<PeerConn>> {
        let ep = Endpoint::connect_with(&self.worker, addr, self.cfg.failure_mode.ucx())
            .map_err(|e| super::ucx_err(&addr.to_string(), "connect", e))?;
        let peer = Arc::new(PeerConn::new(
            next(&self.next_peer),
            ep,
            Role::Client,
            Some(addr),
            Phase::AwaitChallenge {
                token: opts.token.clone(),
            },
        ));
        lock(&self.state).peers.push(peer.clone());
        // A timeout too long to represent is no bound.
        let deadline = Instant::now().checked_add(opts.timeout);
        let outcome = loop {
            let (_, busy) = self.progress_round();
            if peer.is_ready() {
                break Ok(());
            }
            if let Some(e) = peer.failed_error() {
                break Err(e);
            }
            if let Some(s) = peer.ep.failure() {
                break Err(Error::PeerFailed {
                    peer: addr.to_string(),
                    detail: format!(
                        "connection failed: {s} (is an agent serving there? both sides must use \
                         the same failure mode: --fast-local on both or on neither)"
                    ),
                });
            }
            if deadline.is_some_and(|d| Instant::now() >= d) {
                break Err(Error::PeerFailed {
                    peer: addr.to_string(),
                    detail: format!("no handshake within {:?}", opts.timeout),
                });
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
        let mut g = lock(&peer.inner);
        g.transport = transport.into();
        g.pack_max = pack_max;
        g.gpu_path = gpu_path_of(&lanes);
        drop(g);
        Ok(peer)
    }

    /// Accepts queued connection requests and challenges each new peer.
    pub(crate) fn accept_connections(&self) -> bool {
        let mut any = false;
        loop {
            let accepted = {
                let l = lock(&self.listener);
                match l.as_ref() {
                    None => return any,
                    Some(ls) => ls.listener.try_accept(),
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
            let addr = ep.peer();
            let mut st = lock(&self.state);
            let server_nonce = match nonce() {
                Ok(n) => n,
                Err(e) => {
                    tracing::warn!("{e}");
                    continue;
                }
            };
            let peer = Arc::new(PeerConn::new(
                next(&self.next_peer),
                ep,
                Role::Server,
                addr,
                Phase::AwaitAuth { server_nonce },
            ));
            let serving = st
                .peers
                .iter()
                .filter(|p| p.role == Role::Server && !p.is_leaving())
                .count();
            if serving >= self.cfg.max_peers {
                let reason = format!("server has its maximum of {} peers", self.cfg.max_peers);
                self.refuse(&mut st, &peer, RefuseCode::Busy, reason);
                continue;
            }
            st.peers.push(peer.clone());
            if let Err(e) = self.send(&mut st, &peer, &Message::Challenge { server_nonce }, false) {
                tracing::warn!("challenge to {} failed: {e}", addr_text(addr));
                st.peers.retain(|p| p.id != peer.id);
            }
        }
    }

    /// Routes queued control messages to their connections.
    pub(crate) fn dispatch_messages(&self) -> bool {
        let mut any = false;
        while let Some(m) = self.worker.am_try_recv(CTRL_AM) {
            any = true;
            let mut st = lock(&self.state);
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
            match decoded {
                Ok(msg) => self.handle(&mut st, &peer, msg),
                Err(e) => self.protocol_error(&mut st, &peer, e.to_string()),
            }
        }
        any
    }

    fn handle(&self, st: &mut State, peer: &Arc<PeerConn>, msg: Message) {
        let mut g = lock(&peer.inner);
        let phase = std::mem::replace(&mut g.phase, Phase::Ready);
        match (peer.role, phase, msg) {
            (
                Role::Client,
                Phase::AwaitChallenge { token },
                Message::Challenge { server_nonce },
            ) => {
                let client_nonce = match nonce() {
                    Ok(n) => n,
                    Err(e) => {
                        g.phase = Phase::Failed(e);
                        return;
                    }
                };
                let mac = token.client_mac(&server_nonce, &client_nonce);
                g.phase = Phase::AwaitWelcome {
                    token,
                    server_nonce,
                    client_nonce,
                };
                drop(g);
                let auth = Message::Auth {
                    client_nonce,
                    mac,
                    name: self.agent_name.chars().take(codec::MAX_NAME / 4).collect(),
                };
                if let Err(e) = self.send(st, peer, &auth, false) {
                    peer.fail(e);
                }
            }
            (
                Role::Client,
                Phase::AwaitWelcome {
                    token,
                    server_nonce,
                    client_nonce,
                },
                Message::Welcome { mac, metadata },
            ) => {
                if !token.verify_server(&client_nonce, &server_nonce, &mac) {
                    g.phase = Phase::Failed(Error::AuthFailed {
                        peer: g.label.clone(),
                        detail: "the server did not prove it holds the same token".into(),
                    });
                    return;
                }
                g.label = format!("{}@{}", sanitize(&metadata.name), addr_text(peer.addr));
                g.metadata = metadata.regions;
                g.phase = Phase::Ready;
            }
            (
                Role::Client,
                phase @ (Phase::AwaitChallenge { .. } | Phase::AwaitWelcome { .. }),
                Message::Refused { code, reason },
            ) => {
                let mut detail = format!("refused ({code:?}): {}", sanitize(&reason));
                let no_token = match &phase {
                    Phase::AwaitChallenge { token } | Phase::AwaitWelcome { token, .. } => {
                        token.is_none()
                    }
                    _ => false,
                };
                if code == RefuseCode::BadToken && no_token {
                    detail.push_str(" (this side used no token: pass the server's with --token)");
                }
                let peer_name = g.label.clone();
                g.phase = Phase::Failed(match code {
                    RefuseCode::BadToken => Error::AuthFailed {
                        peer: peer_name,
                        detail,
                    },
                    _ => Error::PeerFailed {
                        peer: peer_name,
                        detail,
                    },
                });
            }
            (Role::Client, Phase::Ready, Message::Metadata(md)) => {
                g.metadata = md.regions;
            }
            (Role::Client, Phase::Ready, Message::Withdraw(ids)) => {
                for id in &ids {
                    g.withdrawn.insert(*id);
                }
                for (id, w) in &g.tracked {
                    if ids.contains(id) {
                        if let Some(r) = Region::upgrade(w) {
                            r.mark_withdrawn();
                        }
                    }
                }
                drop(g);
                // Acknowledge once every operation posted so far has completed: posts on
                // these regions fail from now on (checked under the state lock we hold).
                st.ops.ack_after_flush(peer, ids);
            }
            (_, phase @ (Phase::Ready | Phase::Closing { .. }), Message::Notify(message)) => {
                // A notification that crossed our goodbye is still the application's.
                g.phase = phase;
                let from = g.label.clone();
                drop(g);
                let mut q = lock(&self.notifications);
                if q.len() >= MAX_QUEUED_NOTIFICATIONS {
                    self.notifications_dropped.fetch_add(1, Ordering::Relaxed);
                } else {
                    q.push_back(Notification { from, message });
                    drop(q);
                    let hooks = lock(&self.notification_hooks).clone();
                    for h in hooks {
                        h();
                    }
                }
            }
            (
                Role::Server,
                Phase::AwaitAuth { server_nonce },
                Message::Auth {
                    client_nonce,
                    mac,
                    name,
                },
            ) => {
                let token = match lock(&self.listener).as_ref() {
                    Some(l) => l.token.clone(),
                    None => {
                        // The listener is gone: the server is stopping (`Server::stop`).
                        drop(g);
                        let reason = "the server is stopping".into();
                        self.refuse(st, peer, RefuseCode::Other, reason);
                        return;
                    }
                };
                if !token.verify_client(&server_nonce, &client_nonce, &mac) {
                    drop(g);
                    // Without a token of its own the server still checks the MAC: a client
                    // that fails it used one (or sent a bad MAC).
                    let reason = if token.is_none() {
                        "the client used a token and this server has none (connect without \
                         one, or start the server with the same token)"
                    } else {
                        "wrong or missing token"
                    };
                    self.refuse(st, peer, RefuseCode::BadToken, reason.into());
                    return;
                }
                g.label = format!("{}@{}", sanitize(&name), addr_text(peer.addr));
                let label = g.label.clone();
                drop(g);
                let welcome = Message::Welcome {
                    mac: token.server_mac(&client_nonce, &server_nonce),
                    metadata: st.exports.metadata(&self.agent_name),
                };
                match self.send(st, peer, &welcome, false) {
                    Ok(()) => self.push_event(NetEvent::Connected { peer: label }),
                    Err(e) => {
                        peer.fail(e.clone());
                        st.peers.retain(|p| p.id != peer.id);
                        self.push_event(NetEvent::Lost {
                            peer: label,
                            detail: e.to_string(),
                        });
                    }
                }
            }
            (
                Role::Server,
                Phase::Ready,
                Message::Writes {
                    seq,
                    region,
                    records,
                    data,
                },
            ) => {
                drop(g);
                let status = st.exports.apply_writes(region, &records, &data);
                if status != codec::WritesStatus::Done {
                    tracing::debug!(peer = %peer.label(), "writes {seq} not made: {status:?}");
                }
                if let Err(e) = self.send(st, peer, &Message::WritesAck { seq, status }, false) {
                    // The writer would wait for it until its operation bound: the connection is
                    // unusable, say so.
                    tracing::debug!(peer = %peer.label(), "writes acknowledgement not sent: {e}");
                    peer.fail(e);
                }
            }
            (
                Role::Client,
                phase @ (Phase::Ready | Phase::Closing { .. }),
                Message::WritesAck { seq, status },
            ) => {
                g.phase = phase;
                drop(g);
                st.ops.writes_acked(peer, seq, status);
            }
            (Role::Server, Phase::Ready, Message::WithdrawAck(ids)) => {
                drop(g);
                st.exports.acked(peer.id, &ids);
            }
            (Role::Server, Phase::Ready, Message::Bye) => {
                // A clean disconnect: its operations were flushed before the goodbye, so
                // nothing of it is in flight; release it as a lost peer is released.
                g.phase = Phase::Leaving {
                    since: Instant::now(),
                };
                let label = g.label.clone();
                drop(g);
                st.exports.peer_gone(peer.id);
                self.push_event(NetEvent::Left { peer: label });
                // The answer tells the client it may close its endpoint now.
                if let Err(e) = self.send(st, peer, &Message::Bye, false) {
                    tracing::debug!(peer = %peer.label(), "goodbye answer not sent: {e}");
                }
            }
            (Role::Client, Phase::Closing { flush, .. }, Message::Bye) => {
                // The answer (or the server closing at the same time, before our flush
                // completed: its request is kept until UCX ends it, as dropping it would wait).
                g.phase = Phase::Closed;
                drop(g);
                st.peers.retain(|p| p.id != peer.id);
                if let Some(f) = flush {
                    st.ops.track_send(peer.clone(), f, false);
                }
            }
            (Role::Client, Phase::Ready, Message::Bye) => {
                // The server closes the connection on purpose.
                g.phase = Phase::Failed(Error::PeerFailed {
                    peer: g.label.clone(),
                    detail: "the peer closed the connection".into(),
                });
                drop(g);
                st.peers.retain(|p| p.id != peer.id);
            }
            (role, phase @ (Phase::Closing { .. } | Phase::Leaving { .. }), msg) => {
                // Either side is past the goodbye: what still arrives (metadata, a withdraw
                // whose acknowledgement the goodbye replaces) is dropped, not a protocol error.
                g.phase = phase;
                drop(g);
                tracing::debug!(peer = %peer.label(), ?role, "{:?} after goodbye dropped", msg.kind());
            }
            (_, phase, msg) => {
                g.phase = phase;
                drop(g);
                self.protocol_error(st, peer, format!("unexpected {:?} message", msg.kind()));
            }
        }
    }

    /// Sends a refusal, drops the connection from the routing table and closes it once the
    /// refusal is sent.
    fn refuse(&self, st: &mut State, peer: &Arc<PeerConn>, code: RefuseCode, reason: String) {
        let addr = peer.addr;
        peer.fail(Error::AuthFailed {
            peer: addr_text(addr),
            detail: reason.clone(),
        });
        st.peers.retain(|p| p.id != peer.id);
        let _ = self.send(
            st,
            peer,
            &Message::Refused {
                code,
                reason: reason.clone(),
            },
            true,
        );
        self.push_event(NetEvent::Refused { addr, reason });
    }

    fn protocol_error(&self, st: &mut State, peer: &Arc<PeerConn>, detail: String) {
        tracing::warn!(peer = %peer.label(), "protocol error: {detail}");
        match peer.role {
            Role::Server => self.refuse(st, peer, RefuseCode::Protocol, detail),
            Role::Client => {
                peer.fail(Error::Protocol {
                    peer: peer.label(),
                    detail,
                });
                st.peers.retain(|p| p.id != peer.id);
            }
        }
    }

    /// Drops connections that failed or did not finish the handshake in time ([`NetEvent::Lost`]),
    /// and those past a goodbye whose endpoint failed or that waited `connect_timeout` (no
    /// event). Advances goodbyes: sends `Bye` once a closing connection's flush completed, and
    /// starts one for a released client connection whose regions are all gone. Returns whether
    /// any connection changed.
    pub(crate) fn reap_peers(&self, st: &mut State) -> bool {
        let timeout = self.cfg.connect_timeout;
        let now = Instant::now();
        let mut gone: Vec<(Arc<PeerConn>, String)> = Vec::new();
        let mut quiet: Vec<(Arc<PeerConn>, Option<String>)> = Vec::new();
        let mut bye: Vec<Arc<PeerConn>> = Vec::new();
        let mut release: Vec<Arc<PeerConn>> = Vec::new();
        for p in &st.peers {
            let failed = p.ep.failure();
            let mut g = lock(&p.inner);
            match &mut g.phase {
                Phase::Closing { since, flush } => {
                    if let Some(s) = failed {
                        quiet.push((p.clone(), Some(format!("connection failed: {s}"))));
                    } else if after(*since, timeout).is_some_and(|d| now > d) {
                        quiet.push((
                            p.clone(),
                            Some(format!("no answer to the goodbye within {timeout:?}")),
                        ));
                    } else if let Some(f) = flush {
                        match f.test() {
                            Ok(false) => {}
                            // Work posted before the goodbye still running (a batch's own
                            // flush, its notification): the goodbye goes after it, or the
                            // server would drop what follows.
                            Ok(true) if st.ops.involves(p.id) => {}
                            Ok(true) => {
                                *flush = None;
                                bye.push(p.clone());
                            }
                            Err(e) => quiet.push((
                                p.clone(),
                                Some(format!("flush before the goodbye failed: {e}")),
                            )),
                        }
                    }
                }
                Phase::Leaving { since } => {
                    if failed.is_some() || after(*since, timeout).is_some_and(|d| now > d) {
                        quiet.push((p.clone(), None));
                    }
                }
                phase => {
                    if let Some(s) = failed {
                        gone.push((p.clone(), format!("connection failed: {s}")));
                    } else if p.deadline(phase, timeout).is_some_and(|d| now > d) {
                        gone.push((p.clone(), format!("no handshake within {timeout:?}")));
                    } else if matches!(phase, Phase::Ready)
                        && p.role == Role::Client
                        && p.released.load(Ordering::Acquire)
                    {
                        release.push(p.clone());
                    }
                }
            }
        }
        let mut changed = !gone.is_empty() || !quiet.is_empty() || !bye.is_empty();
        for (p, detail) in &gone {
            st.peers.retain(|x| x.id != p.id);
            if p.role == Role::Server {
                st.exports.peer_gone(p.id);
            }
            let label = p.label();
            if p.failed_error().is_none() {
                p.fail(Error::PeerFailed {
                    peer: label.clone(),
                    detail: detail.clone(),
                });
            }
            self.push_event(NetEvent::Lost {
                peer: label,
                detail: detail.clone(),
            });
        }
        for (p, why) in quiet {
            match why {
                // A goodbye that did not finish: the close reports why.
                Some(detail) => end_unanswered(st, &p, detail),
                None => st.peers.retain(|x| x.id != p.id),
            }
        }
        for p in bye {
            if let Err(e) = self.send(st, &p, &Message::Bye, false) {
                tracing::debug!(peer = %p.label(), "goodbye not sent: {e}");
                st.peers.retain(|x| x.id != p.id);
                p.fail(e);
            }
        }
        for p in release {
            if !p.has_live_regions() {
                changed |= self.begin_goodbye(st, &p);
            }
        }
        changed
    }

    /// The earliest instant at which [`UcxBackend::reap_peers`] may drop a connection for
    /// taking too long (a handshake, a goodbye), or `None` when no connection is waiting on a
    /// deadline. A sleeping serving thread wakes by then, so that these deadlines are kept to
    /// within its wake-up latency rather than its longest sleep.
    pub(crate) fn next_reap_deadline(&self, st: &State) -> Option<Instant> {
        let timeout = self.cfg.connect_timeout;
        st.peers
            .iter()
            .filter_map(|p| p.deadline(&lock(&p.inner).phase, timeout))
            .min()
    }

    /// Starts closing client connection `peer` on purpose: phase [`Phase::Closing`] (new
    /// operations are refused), and an endpoint flush, after which `Bye` goes out
    /// ([`UcxBackend::reap_peers`]). Returns false, doing nothing, unless `peer` is a ready
    /// client connection; one whose flush cannot be posted (a failed endpoint) is dropped.
    fn begin_goodbye(&self, st: &mut State, peer: &Arc<PeerConn>) -> bool {
        if peer.role != Role::Client || !peer.is_ready() {
            return false;
        }
        match peer.ep.flush_nb() {
            Ok(flush) => {
                lock(&peer.inner).phase = Phase::Closing {
                    since: Instant::now(),
                    flush: Some(flush),
                };
            }
            Err(e) => {
                st.peers.retain(|p| p.id != peer.id);
                peer.fail(super::ucx_err(&peer.label(), "flush", e));
            }
        }
        true
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
                && !matches!(lock(&conn.inner).phase, Phase::Closing { .. })
            {
                // Failed (or never ready): there is nobody to say goodbye to. Its phase may
                // still say ready when the endpoint failed under a direct wait (a flush) that no
                // reap has seen yet: record why it is closed, as the answer below reads it.
                let detail = match conn.ep.failure() {
                    Some(s) => format!("connection failed: {s}"),
                    None => "closed before the connection was ready".into(),
                };
                end_unanswered(&mut st, conn, detail);
            }
        }
        if !self.progress_until(timeout, || !listed(&lock(&self.state))) {
            if on_timeout == OnTimeout::LeaveUnderWay {
                return Ok(());
            }
            let mut st = lock(&self.state);
            if listed(&st) {
                let detail = format!("no answer to the goodbye within {timeout:?}");
                end_unanswered(&mut st, conn, detail);
            }
        }
        // One guard for the answer: `conn.label()` would take the same lock again.
        let g = lock(&conn.inner);
        match &g.phase {
            Phase::Closed => Ok(()),
            Phase::Failed(e) => Err(e.clone()),
            _ => Err(Error::PeerFailed {
                peer: g.label.clone(),
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
        if conn.has_live_regions() {
            conn.released.store(true, Ordering::Release);
            // `reap_peers` starts the goodbye once the regions are gone: a round should see it.
            self.kick();
            return;
        }
        if let Err(e) = self.close_peer(conn, DROP_WAIT, OnTimeout::LeaveUnderWay) {
            tracing::debug!(peer = %conn.label(), "closing a dropped peer: {e}");
        }
    }

    /// A serving agent stopping: sends `Bye` to every authenticated client (each then fails
    /// its connection with "the peer closed the connection" instead of a transport error),
    /// marks them as leaving (what they still send is dropped), and progresses until the
    /// goodbyes are sent or `timeout` passes. Returns how many clients were told.
    pub(crate) fn leave_clients(&self, timeout: Duration) -> usize {
        let told = {
            let mut st = lock(&self.state);
            let told = self.broadcast(&mut st, &Message::Bye);
            let now = Instant::now();
            let leaving: Vec<Arc<PeerConn>> = st
                .peers
                .iter()
                .filter(|p| told.contains(&p.id))
                .cloned()
                .collect();
            for p in leaving {
                lock(&p.inner).phase = Phase::Leaving { since: now };
                // What it held (withdrawals waiting for its acknowledgement) is released, as
                // for a client that said goodbye.
                st.exports.peer_gone(p.id);
            }
            told
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

    /// Sends `msg` to every authenticated peer; returns the ids of those it was posted to.
    pub(crate) fn broadcast(&self, st: &mut State, msg: &Message) -> Vec<u64> {
        let ready: Vec<Arc<PeerConn>> = st
            .peers
            .iter()
            .filter(|p| p.role == Role::Server && p.is_ready())
            .cloned()
            .collect();
        let mut reached = Vec::new();
        for p in ready {
            match self.send(st, &p, msg, false) {
                Ok(()) => reached.push(p.id),
                Err(e) => tracing::warn!(peer = %p.label(), "control message not sent: {e}"),
            }
        }
        reached
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
            let ready: Vec<Arc<PeerConn>> = st
                .peers
                .iter()
                .filter(|p| p.role == Role::Client && p.is_ready())
                .cloned()
                .collect();
            // Goodbyes already under way (a dropped `Peer` leaves its own under way after
            // `DROP_WAIT`) are waited for as well.
            let under_way: Vec<Arc<PeerConn>> = st
                .peers
                .iter()
                .filter(|p| {
                    p.role == Role::Client && matches!(lock(&p.inner).phase, Phase::Closing { .. })
                })
                .cloned()
                .collect();
            ready
                .into_iter()
                .filter(|p| self.begin_goodbye(&mut st, p))
                .chain(under_way)
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

/// The transport(s) UCX uses for put/get of `mem` on `ep`, for `Path::Ucx { transport }`:
/// distinct transport names of the RMA lanes (or of the active-message lanes UCX emulates RMA
/// with, as over `tcp`), joined with `+`; `unknown` if UCX does not say.
pub(crate) fn rma_transport_name(ep: &Endpoint, mem: MemType) -> String {
    match ep.rma_transports(mem) {
        Ok(t) => {
            let mut names: Vec<String> = Vec::new();
            for l in t.lanes {
                if !names.contains(&l.transport) {
                    names.push(l.transport);
                }
            }
            if names.is_empty() {
                "unknown".into()
            } else {
                names.join("+")
            }
        }
        Err(e) => {
            tracing::debug!("rma transports: {e}");
            "unknown".into()
        }
    }
}

/// `timeout` after `since`, or `None` (no deadline) when that is beyond what `Instant` holds:
/// a `connect_timeout` of `Duration::MAX` means no bound.
fn after(since: Instant, timeout: Duration) -> Option<Instant> {
    since.checked_add(timeout)
}

/// What [`UcxBackend::close_peer`] does with a goodbye not finished in time.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum OnTimeout {
    /// End the connection as failed and say why (`Peer::close`, whose result reports it).
    Fail,
    /// Leave it under way for later progress rounds and the backend's drop (a dropped `Peer`:
    /// nobody reads its result).
    LeaveUnderWay,
}

/// Ends a client connection whose goodbye cannot finish (failed, or not answered in time):
/// drops it from the peers and marks it failed with `detail`, which is what `Peer::close`
/// answers (an earlier failure is kept). A goodbye flush still in flight is kept until UCX
/// ends it: dropping a request UCX may still complete would wait for it.
fn end_unanswered(st: &mut State, p: &Arc<PeerConn>, detail: String) {
    st.peers.retain(|x| x.id != p.id);
    let old = {
        let mut g = lock(&p.inner);
        if matches!(g.phase, Phase::Failed(_)) {
            return;
        }
        let failed = Phase::Failed(Error::PeerFailed {
            peer: g.label.clone(),
            detail,
        });
        std::mem::replace(&mut g.phase, failed)
    };
    if let Phase::Closing { flush: Some(f), .. } = old {
        st.ops.track_send(p.clone(), f, false);
    }
}
