//! One connection's protocol state: the handshake, what each phase accepts, acknowledgements
//! owed, goodbyes and deadlines. See the module docs of [`super`].

use super::{Action, Flush, Limits, Node};
use crate::auth::{binding, Token};
use crate::codec::{self, DecodeError, Message, RefuseCode, RegionMeta, WritesStatus, NONCE_LEN};
use crate::error::Error;
use crate::{NetEvent, Notification};
use gdpath_text::escape;
use std::collections::{HashSet, VecDeque};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

/// Which side of the connection this agent is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Role {
    /// This agent connected to a serving peer (it reads and writes the peer's exports).
    Client,
    /// A peer connected to this serving agent.
    Server,
}

#[derive(Debug, Clone)]
enum Phase {
    /// Client: connected, waiting for the server's nonce.
    AwaitChallenge {
        token: Token,
        client_nonce: [u8; NONCE_LEN],
    },
    /// Client: answered, waiting for the server's proof and metadata.
    AwaitWelcome {
        token: Token,
        server_nonce: [u8; NONCE_LEN],
        client_nonce: [u8; NONCE_LEN],
    },
    /// Server: challenged, waiting for the client's answer.
    AwaitAuth {
        server_nonce: [u8; NONCE_LEN],
    },
    Ready,
    /// Client closing on purpose: no new operations; `Bye` goes once the goodbye flush is
    /// reported ([`Conn::flushed`]), and the server's `Bye` in answer ends the connection.
    Closing {
        since: Instant,
        bye_sent: bool,
    },
    /// Server: the client said goodbye, or this server said it (stopping). What the peer held
    /// is released; the connection only waits to be dropped (the client's `Bye` in answer to
    /// this server's, its transport failing, the peer having closed it, or the goodbye bound
    /// passing).
    Leaving {
        since: Instant,
    },
    /// Client: the server said goodbye first. Operations in flight failed; once the data
    /// channel is flushed (what this side still had on its way is out of its hands) `Bye`
    /// answers, so that the server does not close under sends still in progress, and the
    /// connection ends.
    Answering {
        since: Instant,
    },
    /// Over, cleanly.
    Closed,
    /// Over, for this reason.
    Failed(Error),
}

/// The protocol state of one connection (see [`super`]).
#[derive(Debug, Clone)]
pub struct Conn {
    id: u64,
    role: Role,
    addr: Option<SocketAddr>,
    /// The id the peer puts on the messages it sends this connection over the data channel.
    session: u64,
    /// The id this side puts on what it sends the peer there, once the peer authenticated.
    peer_session: Option<u64>,
    /// `name@address` once authenticated, the address before.
    label: String,
    since: Instant,
    limits: Limits,
    phase: Phase,
    /// Client: the regions the peer exports, as its last metadata listed them.
    metadata: Vec<RegionMeta>,
    /// Client: ids the peer withdrew.
    withdrawn: HashSet<u64>,
    /// Client: packed writes sent and not acknowledged, oldest first, with when they went.
    writes: VecDeque<(u64, Instant)>,
    /// Server: withdrawals sent and not acknowledged, oldest first, with when they went.
    withdrawals: VecDeque<(Vec<u64>, Instant)>,
}

/// `addr` as text, `?` when unknown.
fn addr_text(a: Option<SocketAddr>) -> String {
    a.map_or_else(|| "?".into(), |a| a.to_string())
}

/// `bound` after `since`, or `None` (no deadline) when that is beyond what `Instant` holds.
fn after(since: Instant, bound: Duration) -> Option<Instant> {
    since.checked_add(bound)
}

impl Conn {
    fn new(
        id: u64,
        role: Role,
        addr: Option<SocketAddr>,
        session: u64,
        now: Instant,
        limits: Limits,
        phase: Phase,
    ) -> Conn {
        Conn {
            id,
            role,
            addr,
            session,
            peer_session: None,
            label: addr_text(addr),
            since: now,
            limits,
            phase,
            metadata: Vec::new(),
            withdrawn: HashSet::new(),
            writes: VecDeque::new(),
            withdrawals: VecDeque::new(),
        }
    }

    /// A connection this agent opened to a server at `addr`, proving `token` with
    /// `client_nonce` (32 random bytes); the server is to put `session` (a random id, unique
    /// among this agent's connections) on what it sends this connection. The server speaks
    /// first.
    pub fn client(
        id: u64,
        addr: Option<SocketAddr>,
        token: Token,
        client_nonce: [u8; NONCE_LEN],
        session: u64,
        now: Instant,
        limits: Limits,
    ) -> Conn {
        let phase = Phase::AwaitChallenge {
            token,
            client_nonce,
        };
        Conn::new(id, Role::Client, addr, session, now, limits, phase)
    }

    /// A connection a client opened to this serving agent, to be challenged with
    /// `server_nonce` (32 random bytes); the client is to put `session` on what it sends this
    /// connection: [`Conn::challenge`], or [`Conn::refuse`] it.
    pub fn server(
        id: u64,
        addr: Option<SocketAddr>,
        server_nonce: [u8; NONCE_LEN],
        session: u64,
        now: Instant,
        limits: Limits,
    ) -> Conn {
        let phase = Phase::AwaitAuth { server_nonce };
        Conn::new(id, Role::Server, addr, session, now, limits, phase)
    }

    /// Server: sends the challenge that opens the handshake.
    pub fn challenge(&self, out: &mut Vec<Action>) {
        if let Phase::AwaitAuth { server_nonce } = self.phase {
            out.push(Action::Send(Message::Challenge { server_nonce }));
        }
    }

    /// The caller's id of the connection.
    pub fn id(&self) -> u64 {
        self.id
    }

    /// Which side this agent is.
    pub fn role(&self) -> Role {
        self.role
    }

    /// The id the peer puts on what it sends this connection over the data channel.
    pub fn session(&self) -> u64 {
        self.session
    }

    /// The id to put on what is sent to the peer over the data channel, once it authenticated
    /// ([`Action::Connect`]).
    pub fn peer_session(&self) -> Option<u64> {
        self.peer_session
    }

    /// The peer's socket address, when known.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.addr
    }

    /// `name@address` once authenticated (the name the peer gave, control characters
    /// replaced), the address before.
    pub fn label(&self) -> &str {
        &self.label
    }

    /// Client: the regions the peer exports, as its latest metadata lists them (withdrawn ones
    /// included: [`Conn::is_withdrawn`]).
    pub fn metadata(&self) -> &[RegionMeta] {
        &self.metadata
    }

    /// Client: whether the peer withdrew region `id`.
    pub fn is_withdrawn(&self, id: u64) -> bool {
        self.withdrawn.contains(&id)
    }

    /// Authenticated and open.
    pub fn is_ready(&self) -> bool {
        matches!(self.phase, Phase::Ready)
    }

    /// Still in the handshake.
    pub fn is_handshaking(&self) -> bool {
        matches!(
            self.phase,
            Phase::AwaitChallenge { .. } | Phase::AwaitWelcome { .. } | Phase::AwaitAuth { .. }
        )
    }

    /// Client: closing on purpose, the goodbye under way.
    pub fn is_closing(&self) -> bool {
        matches!(self.phase, Phase::Closing { .. })
    }

    /// Server: past the goodbye, waiting only to be dropped.
    pub fn is_leaving(&self) -> bool {
        matches!(self.phase, Phase::Leaving { .. })
    }

    /// Client: the server said goodbye, and this side's answer waits for its flush.
    pub fn is_answering(&self) -> bool {
        matches!(self.phase, Phase::Answering { .. })
    }

    /// Over ([`Action::End`] was given).
    pub fn is_over(&self) -> bool {
        matches!(self.phase, Phase::Closed | Phase::Failed(_))
    }

    /// Why the connection cannot carry new operations, if it cannot: its failure, or that one
    /// side closed it. `None` while handshaking or ready.
    pub fn failure(&self) -> Option<String> {
        match &self.phase {
            Phase::Failed(e) => Some(e.to_string()),
            Phase::Closing { .. } | Phase::Closed => {
                Some("this agent closed the connection".into())
            }
            Phase::Leaving { .. } | Phase::Answering { .. } => {
                Some("the peer closed the connection".into())
            }
            _ => None,
        }
    }

    /// The error the connection failed with.
    pub fn error(&self) -> Option<&Error> {
        match &self.phase {
            Phase::Failed(e) => Some(e),
            _ => None,
        }
    }

    /// When [`Conn::poll`] next has something to do: a handshake or goodbye bound, an
    /// acknowledgement owed. `None` when nothing waits on time.
    pub fn next_deadline(&self) -> Option<Instant> {
        let hs = self.limits.handshake;
        match &self.phase {
            Phase::AwaitChallenge { .. } | Phase::AwaitWelcome { .. } | Phase::AwaitAuth { .. } => {
                after(self.since, hs)
            }
            Phase::Closing { since, .. } => {
                [after(*since, self.limits.goodbye), self.ack_deadline()]
                    .into_iter()
                    .flatten()
                    .min()
            }
            Phase::Leaving { since } | Phase::Answering { since } => {
                after(*since, self.limits.goodbye)
            }
            Phase::Ready => self.ack_deadline(),
            Phase::Closed | Phase::Failed(_) => None,
        }
    }

    /// When the oldest acknowledgement the peer owes is overdue.
    fn ack_deadline(&self) -> Option<Instant> {
        if self.limits.ack.is_zero() {
            return None;
        }
        let oldest = match self.role {
            Role::Client => self.writes.front().map(|w| w.1),
            Role::Server => self.withdrawals.front().map(|w| w.1),
        };
        oldest.and_then(|t| after(t, self.limits.ack))
    }

    /// A message from the peer (decoded, so well-formed). What a phase does not expect is a
    /// protocol error: the connection is refused (server) or fails (client). After a goodbye,
    /// either side's, what still arrives is dropped; after the end, everything.
    pub fn handle(&mut self, node: &mut Node, msg: Message, now: Instant, out: &mut Vec<Action>) {
        use Message as M;
        let phase = std::mem::replace(&mut self.phase, Phase::Ready);
        match (self.role, phase, msg) {
            (_, p @ (Phase::Closed | Phase::Failed(_)), _) => self.phase = p,
            (
                Role::Client,
                Phase::AwaitChallenge {
                    token,
                    client_nonce,
                },
                M::Challenge { server_nonce },
            ) => {
                let bound = binding(self.session, &node.worker_address);
                let mac = token.client_mac(&server_nonce, &client_nonce, &bound);
                self.phase = Phase::AwaitWelcome {
                    token,
                    server_nonce,
                    client_nonce,
                };
                out.push(Action::Send(M::Auth {
                    client_nonce,
                    mac,
                    name: node.name.chars().take(codec::MAX_NAME / 4).collect(),
                    session: self.session,
                    worker_address: node.worker_address.clone(),
                }));
            }
            (
                Role::Client,
                Phase::AwaitWelcome {
                    token,
                    server_nonce,
                    client_nonce,
                },
                M::Welcome {
                    mac,
                    session,
                    worker_address,
                    metadata,
                },
            ) => {
                let bound = binding(session, &worker_address);
                if !token.verify_server(&client_nonce, &server_nonce, &bound, &mac) {
                    let e = Error::AuthFailed {
                        peer: self.label.clone(),
                        detail: "the server did not prove it holds the same token".into(),
                    };
                    self.finish(node, Err(e), out);
                    return;
                }
                self.label = format!("{}@{}", escape(&metadata.name), addr_text(self.addr));
                self.metadata = metadata.regions;
                self.peer_session = Some(session);
                out.push(Action::Connect {
                    worker_address,
                    session,
                });
            }
            (
                Role::Client,
                Phase::AwaitChallenge { token, .. } | Phase::AwaitWelcome { token, .. },
                M::Refused { code, reason },
            ) => {
                let mut detail = format!("refused ({code:?}): {}", escape(&reason));
                if code == RefuseCode::BadToken && token.is_none() {
                    detail.push_str(" (this side used no token: pass the server's: --token, or token= in Python)");
                }
                let peer = self.label.clone();
                let e = match code {
                    RefuseCode::BadToken => Error::AuthFailed { peer, detail },
                    _ => Error::PeerFailed { peer, detail },
                };
                self.finish(node, Err(e), out);
            }
            (Role::Client, Phase::Ready, M::Metadata(md)) => self.metadata = md.regions,
            (Role::Client, Phase::Ready, M::Withdraw(ids)) => {
                self.withdrawn.extend(ids.iter().copied());
                out.push(Action::Withdrawn(ids.clone()));
                // Acknowledged once every operation posted so far completed.
                out.push(Action::Flush(Flush::WithdrawAck(ids)));
            }
            (_, p @ (Phase::Ready | Phase::Closing { .. }), M::Notify(message)) => {
                // A notification that crossed our goodbye is still the application's.
                self.phase = p;
                out.push(Action::Notification(Notification {
                    from: self.label.clone(),
                    message,
                }));
            }
            (
                Role::Server,
                Phase::AwaitAuth { server_nonce },
                M::Auth {
                    client_nonce,
                    mac,
                    name,
                    session,
                    worker_address,
                },
            ) => {
                let Some(token) = node.token.clone() else {
                    self.phase = Phase::AwaitAuth { server_nonce };
                    self.refuse(
                        node,
                        RefuseCode::Other,
                        "the server is stopping".into(),
                        out,
                    );
                    return;
                };
                let bound = binding(session, &worker_address);
                if !token.verify_client(&server_nonce, &client_nonce, &bound, &mac) {
                    self.phase = Phase::AwaitAuth { server_nonce };
                    // Without a token of its own the server still checks the MAC: a client that
                    // fails it used one (or sent a bad MAC).
                    let reason = if token.is_none() {
                        "the client used a token and this server has none (connect without one, \
                         or start the server with the same token)"
                    } else {
                        "wrong or missing token"
                    };
                    self.refuse(node, RefuseCode::BadToken, reason.into(), out);
                    return;
                }
                self.label = format!("{}@{}", escape(&name), addr_text(self.addr));
                out.push(Action::Event(NetEvent::Connected {
                    peer: self.label.clone(),
                }));
                self.peer_session = Some(session);
                // The data channel exists before the client hears it may use it.
                out.push(Action::Connect {
                    worker_address,
                    session,
                });
                let bound = binding(self.session, &node.worker_address);
                out.push(Action::Send(M::Welcome {
                    mac: token.server_mac(&client_nonce, &server_nonce, &bound),
                    session: self.session,
                    worker_address: node.worker_address.clone(),
                    metadata: node.exports.metadata(&node.name),
                }));
            }
            (
                Role::Server,
                Phase::Ready,
                M::Writes {
                    seq,
                    region,
                    records,
                    data,
                },
            ) => match node.exports.check_writes(region, &records, data.len()) {
                Ok(()) => out.push(Action::ApplyWrites {
                    seq,
                    region,
                    records,
                    data,
                }),
                Err(status) => out.push(Action::Send(M::WritesAck { seq, status })),
            },
            (
                Role::Client,
                p @ (Phase::Ready | Phase::Closing { .. }),
                M::WritesAck { seq, status },
            ) => {
                self.phase = p;
                match self.writes.iter().position(|w| w.0 == seq) {
                    Some(i) => {
                        self.writes.remove(i);
                        out.push(Action::WritesAcked { seq, status });
                    }
                    None => self.protocol_error(
                        node,
                        format!("acknowledgement of packed writes {seq}, which were not sent"),
                        None,
                        out,
                    ),
                }
            }
            (Role::Server, Phase::Ready, M::WithdrawAck(ids)) => {
                match self.withdrawals.iter().position(|w| w.0 == ids) {
                    Some(i) => {
                        self.withdrawals.remove(i);
                        node.exports.acked(self.id, &ids, out);
                    }
                    None => self.protocol_error(
                        node,
                        format!("acknowledgement of a withdrawal of {ids:?}, which was not sent"),
                        None,
                        out,
                    ),
                }
            }
            (Role::Server, Phase::Ready, M::Bye) => {
                // A clean disconnect: its operations were flushed before the goodbye, so
                // nothing of it is in flight; released as a lost peer is released.
                self.leave_now(node, now, out);
                out.push(Action::Event(NetEvent::Left {
                    peer: self.label.clone(),
                }));
                // The answer tells the client it may close its endpoint now.
                out.push(Action::Send(M::Bye));
            }
            (Role::Client, Phase::Closing { .. }, M::Bye) => {
                // The answer, or the server closing at the same time.
                self.finish(node, Ok(()), out);
            }
            (Role::Client, Phase::Ready, M::Bye) => {
                // The server closes the connection on purpose: what is in flight fails now (no
                // answer to it will come), and the goodbye is answered once flushed.
                self.phase = Phase::Answering { since: now };
                self.writes.clear();
                out.push(Action::Fail(self.peer_closed()));
                out.push(Action::Flush(Flush::Goodbye));
            }
            (Role::Server, Phase::Leaving { .. }, M::Bye) => {
                // The client's answer to this server's goodbye: nothing of it is in flight.
                self.finish(node, Ok(()), out);
            }
            // Either side is past the goodbye: what still arrives (metadata, a withdrawal whose
            // acknowledgement the goodbye replaces) is dropped, not a protocol error.
            (
                _,
                p @ (Phase::Closing { .. } | Phase::Leaving { .. } | Phase::Answering { .. }),
                _,
            ) => self.phase = p,
            (_, p, msg) => {
                self.phase = p;
                let detail = format!("unexpected {:?} message", msg.kind());
                self.protocol_error(node, detail, None, out);
            }
        }
    }

    /// Bytes from the peer that [`codec::decode`] refused: a protocol error.
    pub fn decode_failed(&mut self, node: &mut Node, err: DecodeError, out: &mut Vec<Action>) {
        if self.is_over() {
            return;
        }
        self.protocol_error(node, "malformed message".into(), Some(err), out);
    }

    /// The peer broke the protocol: a server refuses it (the refusal names the problem), a
    /// client fails with [`Error::Protocol`].
    fn protocol_error(
        &mut self,
        node: &mut Node,
        detail: String,
        source: Option<DecodeError>,
        out: &mut Vec<Action>,
    ) {
        match self.role {
            Role::Server => {
                let reason = match &source {
                    Some(e) => format!("{detail}: {e}"),
                    None => detail,
                };
                self.refuse(node, RefuseCode::Protocol, reason, out);
            }
            Role::Client => {
                let e = Error::Protocol {
                    peer: self.label.clone(),
                    detail,
                    source,
                };
                self.finish(node, Err(e), out);
            }
        }
    }

    /// Server: refuses the connection (`code`, `reason` on the wire and in the event) and ends
    /// it once the refusal is sent.
    pub fn refuse(
        &mut self,
        node: &mut Node,
        code: RefuseCode,
        reason: String,
        out: &mut Vec<Action>,
    ) {
        if self.is_over() || self.role != Role::Server {
            return;
        }
        out.push(Action::Send(Message::Refused {
            code,
            reason: reason.clone(),
        }));
        out.push(Action::Event(NetEvent::Refused {
            addr: self.addr,
            reason: reason.clone(),
        }));
        let e = Error::AuthFailed {
            peer: addr_text(self.addr),
            detail: reason,
        };
        self.finish(node, Err(e), out);
    }

    /// The error of a connection the server closed on purpose.
    fn peer_closed(&self) -> Error {
        Error::PeerFailed {
            peer: self.label.clone(),
            detail: "the peer closed the connection".into(),
        }
    }

    /// Ends the connection: what the peer held is released (server), and [`Action::End`].
    fn finish(&mut self, node: &mut Node, result: Result<(), Error>, out: &mut Vec<Action>) {
        self.phase = match &result {
            Ok(()) => Phase::Closed,
            Err(e) => Phase::Failed(e.clone()),
        };
        self.writes.clear();
        self.withdrawals.clear();
        if self.role == Role::Server {
            node.exports.conn_gone(self.id, out);
        }
        out.push(Action::End(result));
    }

    /// Server: enters the goodbye (no acknowledgement is owed any more) and releases what the
    /// peer held.
    fn leave_now(&mut self, node: &mut Node, now: Instant, out: &mut Vec<Action>) {
        self.phase = Phase::Leaving { since: now };
        self.withdrawals.clear();
        node.exports.conn_gone(self.id, out);
    }

    /// A connection lost without a goodbye (the server reports it) or a goodbye that cannot
    /// finish: ends it as failed with `detail`.
    fn lost(&mut self, node: &mut Node, detail: String, out: &mut Vec<Action>) {
        match self.phase {
            Phase::Closed | Phase::Failed(_) => {}
            // The goodbye was said: the transport ending now is the expected end.
            Phase::Leaving { .. } => self.finish(node, Ok(()), out),
            // The server that said goodbye closing: the end it announced.
            Phase::Answering { .. } => {
                let e = self.peer_closed();
                self.finish(node, Err(e), out);
            }
            Phase::Closing { .. } => {
                let e = Error::PeerFailed {
                    peer: self.label.clone(),
                    detail,
                };
                self.finish(node, Err(e), out);
            }
            _ => {
                if self.role == Role::Server {
                    out.push(Action::Event(NetEvent::Lost {
                        peer: self.label.clone(),
                        detail: detail.clone(),
                        authenticated: !self.is_handshaking(),
                    }));
                }
                let e = Error::PeerFailed {
                    peer: self.label.clone(),
                    detail,
                };
                self.finish(node, Err(e), out);
            }
        }
    }

    /// The transport under the connection failed (`detail` says how): a connection past its
    /// goodbye ends quietly, any other is lost ([`NetEvent::Lost`] at a server).
    pub fn transport_failed(&mut self, node: &mut Node, detail: String, out: &mut Vec<Action>) {
        self.lost(node, detail, out);
    }

    /// Why a handshake not finished within [`Limits::handshake`] failed: the bound, and the
    /// step it was waiting in (`no handshake within 10s (waiting for the server's
    /// challenge)`).
    pub fn handshake_overdue(&self) -> String {
        let step = match self.phase {
            Phase::AwaitChallenge { .. } => "waiting for the server's challenge",
            Phase::AwaitWelcome { .. } => {
                "auth: waiting for the server to accept this side's proof of the token and \
                 prove its own"
            }
            Phase::AwaitAuth { .. } => "auth: waiting for the client's proof of the token",
            _ => "the handshake was over",
        };
        format!("no handshake within {:?} ({step})", self.limits.handshake)
    }

    /// Checks the deadlines at `now` (exclusive: a deadline at `now` has not passed): a
    /// handshake not finished within [`Limits::handshake`], a goodbye not answered within
    /// [`Limits::goodbye`], an acknowledgement not given within [`Limits::ack`] (the connection
    /// fails); a connection leaving after its goodbye is dropped after [`Limits::goodbye`].
    pub fn poll(&mut self, node: &mut Node, now: Instant, out: &mut Vec<Action>) {
        let passed = |d: Option<Instant>| d.is_some_and(|d| now > d);
        let hs = self.limits.handshake;
        match self.phase {
            Phase::Closed | Phase::Failed(_) => {}
            _ if self.is_handshaking() => {
                if passed(after(self.since, hs)) {
                    let detail = self.handshake_overdue();
                    self.lost(node, detail, out);
                }
            }
            Phase::Leaving { since } => {
                if passed(after(since, self.limits.goodbye)) {
                    self.finish(node, Ok(()), out);
                }
            }
            Phase::Answering { since } => {
                if passed(after(since, self.limits.goodbye)) {
                    let e = self.peer_closed();
                    self.finish(node, Err(e), out);
                }
            }
            Phase::Closing { since, .. } if passed(after(since, self.limits.goodbye)) => {
                let bound = self.limits.goodbye;
                self.lost(
                    node,
                    format!("no answer to the goodbye within {bound:?}"),
                    out,
                );
            }
            _ => {
                if passed(self.ack_deadline()) {
                    let ack = self.limits.ack;
                    let detail = match self.role {
                        Role::Client => format!(
                            "packed writes {} not acknowledged within {ack:?}",
                            self.writes.front().map_or(0, |w| w.0)
                        ),
                        Role::Server => format!(
                            "the withdrawal of region(s) {:?} not acknowledged within {ack:?}",
                            self.withdrawals.front().map(|w| &w.0)
                        ),
                    };
                    self.lost(node, detail, out);
                }
            }
        }
    }

    /// Client: starts closing on purpose ([`Action::Flush`] of [`Flush::Goodbye`]; new
    /// operations are refused from now on). Returns false, doing nothing, unless ready.
    pub fn close(&mut self, now: Instant, out: &mut Vec<Action>) -> bool {
        if self.role != Role::Client || !self.is_ready() {
            return false;
        }
        self.phase = Phase::Closing {
            since: now,
            bye_sent: false,
        };
        out.push(Action::Flush(Flush::Goodbye));
        true
    }

    /// Ends the connection without a goodbye (there is nobody to say it to, or nobody
    /// answered in time): failed with `detail`; an earlier failure is kept.
    pub fn abandon(&mut self, node: &mut Node, detail: String, out: &mut Vec<Action>) {
        if self.is_over() {
            return;
        }
        let e = Error::PeerFailed {
            peer: self.label.clone(),
            detail,
        };
        self.finish(node, Err(e), out);
    }

    /// The flush [`Action::Flush`] asked for finished (`result`: its error's text if it failed):
    /// a withdrawal is acknowledged (a failed flush means a failing connection, whose peer
    /// releases what it held anyway); the goodbye goes, or a goodbye whose flush failed ends
    /// the connection as failed.
    pub fn flushed(
        &mut self,
        node: &mut Node,
        what: Flush,
        result: Result<(), String>,
        out: &mut Vec<Action>,
    ) {
        match (what, &mut self.phase) {
            (Flush::WithdrawAck(ids), Phase::Ready | Phase::Closing { .. }) => {
                out.push(Action::Send(Message::WithdrawAck(ids)));
            }
            (Flush::Goodbye, Phase::Closing { bye_sent, .. }) if !*bye_sent => match result {
                Ok(()) => {
                    *bye_sent = true;
                    out.push(Action::Send(Message::Bye));
                }
                Err(e) => self.lost(node, format!("flush before the goodbye failed: {e}"), out),
            },
            (Flush::Goodbye, Phase::Answering { .. }) => {
                if result.is_ok() {
                    out.push(Action::Send(Message::Bye));
                }
                let e = self.peer_closed();
                self.finish(node, Err(e), out);
            }
            _ => {}
        }
    }

    /// Server stopping: tells the client goodbye (it then fails its connection with "the peer
    /// closed the connection") and releases what it held. Returns false unless ready.
    pub fn leave(&mut self, node: &mut Node, now: Instant, out: &mut Vec<Action>) -> bool {
        if self.role != Role::Server || !self.is_ready() {
            return false;
        }
        out.push(Action::Send(Message::Bye));
        self.leave_now(node, now, out);
        true
    }

    /// Server: tells the client regions `ids` are withdrawn; the acknowledgement is owed
    /// within [`Limits::ack`]. Returns false (nothing sent) unless ready.
    pub fn withdraw(&mut self, ids: Vec<u64>, now: Instant, out: &mut Vec<Action>) -> bool {
        if self.role != Role::Server || !self.is_ready() {
            return false;
        }
        out.push(Action::Send(Message::Withdraw(ids.clone())));
        self.withdrawals.push_back((ids, now));
        true
    }

    /// Server: sends updated metadata. Returns false unless ready.
    pub fn send_metadata(&self, md: codec::Metadata, out: &mut Vec<Action>) -> bool {
        if self.role != Role::Server || !self.is_ready() {
            return false;
        }
        out.push(Action::Send(Message::Metadata(md)));
        true
    }

    /// Client: packed writes `seq` were sent at `now`; their acknowledgement is owed within
    /// [`Limits::ack`].
    pub fn writes_sent(&mut self, seq: u64, now: Instant) {
        if self.role == Role::Client && (self.is_ready() || self.is_closing()) {
            self.writes.push_back((seq, now));
        }
    }

    /// Whether packed writes sent on this connection wait for their acknowledgement.
    pub fn writes_pending(&self) -> bool {
        !self.writes.is_empty()
    }

    /// Server: the writes of [`Action::ApplyWrites`] `seq` were made (or why not): the answer.
    pub fn writes_applied(&self, seq: u64, status: WritesStatus, out: &mut Vec<Action>) {
        if self.role == Role::Server && self.is_ready() {
            out.push(Action::Send(Message::WritesAck { seq, status }));
        }
    }
}
