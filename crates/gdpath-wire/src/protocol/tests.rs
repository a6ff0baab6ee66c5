//! The protocol state machine in memory: a client and a server [`Conn`] wired together through
//! the codec (every message encoded and decoded on its way), no UCX.

use super::*;
use crate::codec::{self, DecodeError, Metadata, RefuseCode, RegionMeta, WireKind};
use std::collections::VecDeque;
use std::net::SocketAddr;
use std::time::Instant;

const LIMITS: Limits = Limits {
    handshake: Duration::from_secs(10),
    goodbye: Duration::from_secs(10),
    ack: Duration::from_secs(60),
};

fn addr(port: u16) -> Option<SocketAddr> {
    Some(SocketAddr::from(([127, 0, 0, 1], port)))
}

fn region(id: u64, len: u64) -> RegionMeta {
    RegionMeta {
        id,
        kind: WireKind::Host,
        addr: 0x10_0000,
        len,
        rkey: vec![1, 2, 3],
        ipc: None,
        shm: None,
    }
}

fn token(s: &str) -> Token {
    Token::new(s).unwrap()
}

/// One end: its connection, its agent's node, what was sent to it, and every action it gave
/// that is not a message to the other end.
struct End {
    conn: Conn,
    node: Node,
    inbox: VecDeque<Message>,
    log: Vec<Action>,
}

/// A client and a server connection, and the clock.
struct Wire {
    c: End,
    s: End,
    now: Instant,
}

impl End {
    /// What `pick` takes out of each logged action, in order.
    fn pick<T>(&self, pick: impl Fn(&Action) -> Option<T>) -> Vec<T> {
        self.log.iter().filter_map(pick).collect()
    }
    fn ended(&self) -> Option<&Result<(), Error>> {
        self.log.iter().find_map(|a| match a {
            Action::End(r) => Some(r),
            _ => None,
        })
    }
    fn events(&self) -> Vec<&NetEvent> {
        self.log
            .iter()
            .filter_map(|a| match a {
                Action::Event(e) => Some(e),
                _ => None,
            })
            .collect()
    }
    fn released(&self) -> Vec<u64> {
        self.pick(|a| match a {
            Action::Release(id) => Some(*id),
            _ => None,
        })
    }
    fn flushes(&self) -> Vec<Flush> {
        self.pick(|a| match a {
            Action::Flush(f) => Some(f.clone()),
            _ => None,
        })
    }
}

impl Wire {
    /// A server exporting region 1 (4 KiB of host memory) with `server_token`, and a client
    /// with `client_token`, not yet talking.
    fn new(client_token: Token, server_token: Token) -> Wire {
        let now = Instant::now();
        let mut snode = Node::new("srv");
        snode.token = Some(server_token);
        snode.worker_address = b"server worker".to_vec();
        snode.exports.add(region(1, 4096)).unwrap();
        let mut cnode = Node::new("cli");
        cnode.worker_address = b"client worker".to_vec();
        let s = Conn::server(1, addr(40000), [5; 32], 0x5e, now, LIMITS);
        let c = Conn::client(9, addr(18515), client_token, [7; 32], 0xc1, now, LIMITS);
        Wire {
            c: End {
                conn: c,
                node: cnode,
                inbox: VecDeque::new(),
                log: Vec::new(),
            },
            s: End {
                conn: s,
                node: snode,
                inbox: VecDeque::new(),
                log: Vec::new(),
            },
            now,
        }
    }

    /// The handshake run to its end.
    fn connected() -> Wire {
        let mut w = Wire::new(Token::none(), Token::none());
        w.start();
        w.pump();
        assert!(w.c.conn.is_ready() && w.s.conn.is_ready(), "{:?}", w.c.log);
        w.c.log.clear();
        w.s.log.clear();
        w
    }

    fn start(&mut self) {
        let mut out = Vec::new();
        self.s.conn.challenge(&mut out);
        self.route(out, false);
    }

    /// Routes `out`, given by the client (`from_client`) or the server: messages through the
    /// codec to the other end's inbox, everything else to its own log.
    fn route(&mut self, out: Vec<Action>, from_client: bool) {
        let (me, other) = if from_client {
            (&mut self.c, &mut self.s)
        } else {
            (&mut self.s, &mut self.c)
        };
        for a in out {
            match a {
                Action::Send(m) => {
                    let bytes = codec::encode(&m).expect("the protocol sends what encodes");
                    other.inbox.push_back(codec::decode(&bytes).unwrap());
                }
                a => me.log.push(a),
            }
        }
    }

    /// Delivers queued messages until both inboxes are empty.
    fn pump(&mut self) {
        loop {
            if let Some(m) = self.s.inbox.pop_front() {
                let mut out = Vec::new();
                self.s.conn.handle(&mut self.s.node, m, self.now, &mut out);
                self.route(out, false);
            } else if let Some(m) = self.c.inbox.pop_front() {
                let mut out = Vec::new();
                self.c.conn.handle(&mut self.c.node, m, self.now, &mut out);
                self.route(out, true);
            } else {
                return;
            }
        }
    }

    fn poll_both(&mut self, at: Instant) {
        let mut out = Vec::new();
        self.c.conn.poll(&mut self.c.node, at, &mut out);
        self.route(out, true);
        let mut out = Vec::new();
        self.s.conn.poll(&mut self.s.node, at, &mut out);
        self.route(out, false);
    }

    /// The server withdraws region `id` from its client.
    fn withdraw(&mut self, id: u64) {
        let mut out = Vec::new();
        let told = self
            .s
            .conn
            .withdraw(vec![id], self.now, &mut out)
            .then_some(self.s.conn.id());
        assert!(self.s.node.exports.withdraw(id, told, &mut out));
        self.route(out, false);
    }

    /// The client reports the flushes it was asked for as done.
    fn client_flushes_done(&mut self) {
        for f in self.c.flushes() {
            let mut out = Vec::new();
            self.c.conn.flushed(&mut self.c.node, f, Ok(()), &mut out);
            self.route(out, true);
        }
        self.c.log.retain(|a| !matches!(a, Action::Flush(_)));
    }
}

#[test]
fn the_handshake_authenticates_both_sides_and_lists_the_exports() {
    let mut w = Wire::new(
        token("a shared secret of some length"),
        token("a shared secret of some length"),
    );
    assert!(w.c.conn.is_handshaking() && w.s.conn.is_handshaking());
    w.start();
    w.pump();
    assert!(w.c.conn.is_ready() && w.s.conn.is_ready());
    assert_eq!(w.c.conn.label(), "srv@127.0.0.1:18515");
    assert_eq!(w.s.conn.label(), "cli@127.0.0.1:40000");
    assert_eq!(w.c.conn.metadata(), &[region(1, 4096)]);
    assert!(
        matches!(w.s.events()[..], [NetEvent::Connected { peer }] if peer == "cli@127.0.0.1:40000")
    );
    assert!(w.c.ended().is_none() && w.s.ended().is_none());
    // Each side connects its data channel to the other's worker, addressed with the other's id.
    let connects = |e: &End| {
        e.pick(|a| match a {
            Action::Connect {
                worker_address,
                session,
            } => Some((worker_address.clone(), *session)),
            _ => None,
        })
    };
    assert_eq!(connects(&w.s), [(b"client worker".to_vec(), 0xc1)]);
    assert_eq!(connects(&w.c), [(b"server worker".to_vec(), 0x5e)]);
    assert_eq!(
        (w.c.conn.peer_session(), w.s.conn.peer_session()),
        (Some(0x5e), Some(0xc1))
    );
    // Nothing waits on time once ready.
    assert_eq!(w.c.conn.next_deadline(), None);
    assert_eq!(w.s.conn.next_deadline(), None);
}

#[test]
fn a_wrong_token_on_either_side_is_refused_and_named() {
    // The client's token is not the server's.
    let mut w = Wire::new(
        token("the client's secret, long"),
        token("the server's secret, long"),
    );
    w.start();
    w.pump();
    assert!(
        matches!(w.c.ended(), Some(Err(Error::AuthFailed { detail, .. })) if detail.contains("wrong or missing token"))
    );
    assert!(matches!(w.s.ended(), Some(Err(Error::AuthFailed { .. }))));
    assert!(
        matches!(w.s.events()[..], [NetEvent::Refused { reason, .. }] if reason.contains("wrong or missing"))
    );
    // A client without a token against a server with one: told to pass it.
    let mut w = Wire::new(Token::none(), token("the server's secret, long"));
    w.start();
    w.pump();
    assert!(
        matches!(w.c.ended(), Some(Err(Error::AuthFailed { detail, .. })) if detail.contains("this side used no token"))
    );
    // A client with a token against a server without one: the server says it has none.
    let mut w = Wire::new(token("the client's secret, long"), Token::none());
    w.start();
    w.pump();
    assert!(
        matches!(w.s.events()[..], [NetEvent::Refused { reason, .. }] if reason.contains("this server has none"))
    );
    // A server that cannot prove the token (a forged welcome): the client refuses it.
    let mut w = Wire::new(
        token("the client's secret, long"),
        token("the client's secret, long"),
    );
    w.start();
    let Some(Message::Challenge { .. }) = w.c.inbox.front() else {
        panic!("challenge first")
    };
    let m = w.c.inbox.pop_front().unwrap();
    let mut out = Vec::new();
    w.c.conn.handle(&mut w.c.node, m, w.now, &mut out);
    let forged = Message::Welcome {
        mac: [0; 32],
        session: 1,
        worker_address: vec![1],
        metadata: Metadata::default(),
    };
    out.clear();
    w.c.conn.handle(&mut w.c.node, forged, w.now, &mut out);
    assert!(
        matches!(&out[..], [Action::End(Err(Error::AuthFailed { detail, .. }))] if detail.contains("did not prove"))
    );
    assert!(
        w.c.conn.metadata().is_empty(),
        "no metadata kept from an unproven server"
    );
    // A welcome whose worker address was swapped on the way (a relay) fails the proof too.
    let mut w = Wire::new(
        token("the client's secret, long"),
        token("the client's secret, long"),
    );
    w.start();
    let m = w.c.inbox.pop_front().unwrap();
    let mut out = Vec::new();
    w.c.conn.handle(&mut w.c.node, m, w.now, &mut out);
    w.route(out, true);
    let auth = w.s.inbox.pop_front().unwrap();
    let mut out = Vec::new();
    w.s.conn.handle(&mut w.s.node, auth, w.now, &mut out);
    let welcome = out.into_iter().find_map(|a| match a {
        Action::Send(m @ Message::Welcome { .. }) => Some(m),
        _ => None,
    });
    let Some(Message::Welcome {
        mac,
        session,
        metadata,
        ..
    }) = welcome
    else {
        panic!("welcomed")
    };
    let swapped = Message::Welcome {
        mac,
        session,
        worker_address: b"an attacker's worker".to_vec(),
        metadata,
    };
    let mut out = Vec::new();
    w.c.conn.handle(&mut w.c.node, swapped, w.now, &mut out);
    assert!(
        matches!(&out[..], [Action::End(Err(Error::AuthFailed { .. }))]),
        "{out:?}"
    );
}

#[test]
fn a_server_that_is_stopping_refuses_the_answer() {
    let mut w = Wire::new(Token::none(), Token::none());
    w.s.node.token = None;
    w.start();
    w.pump();
    assert!(
        matches!(w.c.ended(), Some(Err(Error::PeerFailed { detail, .. })) if detail.contains("stopping"))
    );
}

#[test]
fn a_withdrawal_racing_a_packed_write_fails_the_write_and_holds_the_region_until_acked() {
    let mut w = Wire::connected();
    // The client sends packed writes into region 1 ...
    w.c.conn.writes_sent(1, w.now);
    w.s.inbox.push_back(Message::Writes {
        seq: 1,
        region: 1,
        records: vec![(0, 4)],
        data: b"abcd".to_vec().into(),
    });
    // ... while the server withdraws it: the messages cross.
    w.withdraw(1);
    assert!(
        w.s.released().is_empty(),
        "held until the client acknowledged"
    );
    assert_eq!(w.s.node.exports.retiring(), 1);
    w.pump();
    // The writes arrived after the withdrawal: refused whole as not exported.
    assert!(!w
        .s
        .log
        .iter()
        .any(|a| matches!(a, Action::ApplyWrites { .. })));
    assert!(w.c.log.iter().any(|a| matches!(
        a,
        Action::WritesAcked {
            seq: 1,
            status: WritesStatus::NotExported
        }
    )));
    // The client marked the region, and acknowledges once its flush is done.
    assert!(w.c.conn.is_withdrawn(1));
    assert!(w
        .c
        .log
        .iter()
        .any(|a| matches!(a, Action::Withdrawn(ids) if ids == &[1])));
    assert_eq!(w.c.flushes(), [Flush::WithdrawAck(vec![1])]);
    assert!(
        w.s.released().is_empty(),
        "no release before the flushed acknowledgement"
    );
    w.client_flushes_done();
    w.pump();
    assert_eq!(w.s.released(), [1]);
    assert_eq!(w.s.node.exports.retiring(), 0);
    assert!(w.c.ended().is_none() && w.s.ended().is_none());
    assert!(!w.c.conn.writes_pending());
}

#[test]
fn packed_writes_inside_an_export_are_applied_and_acknowledged() {
    let mut w = Wire::connected();
    w.c.conn.writes_sent(4, w.now);
    w.s.inbox.push_back(Message::Writes {
        seq: 4,
        region: 1,
        records: vec![(0, 2), (4094, 2)],
        data: b"abyz".to_vec().into(),
    });
    w.pump();
    let Some(Action::ApplyWrites {
        seq: 4,
        region: 1,
        records,
        data,
    }) = w.s.log.first()
    else {
        panic!("{:?}", w.s.log)
    };
    assert_eq!(
        (records.as_slice(), &data[..]),
        (&[(0, 2), (4094, 2)][..], &b"abyz"[..])
    );
    let mut out = Vec::new();
    w.s.conn.writes_applied(4, WritesStatus::Done, &mut out);
    w.route(out, false);
    w.pump();
    assert!(matches!(
        w.c.log[..],
        [Action::WritesAcked {
            seq: 4,
            status: WritesStatus::Done
        }]
    ));
    // One write past the end refuses the whole message: nothing to apply.
    w.s.log.clear();
    w.c.conn.writes_sent(5, w.now);
    w.s.inbox.push_back(Message::Writes {
        seq: 5,
        region: 1,
        records: vec![(0, 1), (4095, 2)],
        data: b"xyz".to_vec().into(),
    });
    w.pump();
    assert!(w.s.log.is_empty(), "{:?}", w.s.log);
    assert!(
        matches!(&w.c.log[1], Action::WritesAcked { seq: 5, status: WritesStatus::Refused(why) } if why.contains("past the end"))
    );
}

#[test]
fn a_lost_writes_acknowledgement_fails_the_connection_at_its_bound() {
    let mut w = Wire::connected();
    let t0 = w.now;
    w.c.conn.writes_sent(3, t0);
    assert_eq!(w.c.conn.next_deadline(), Some(t0 + LIMITS.ack));
    // The message (or its answer) is lost: nothing until the bound has passed.
    w.poll_both(t0 + LIMITS.ack);
    assert!(w.c.ended().is_none());
    w.poll_both(t0 + LIMITS.ack + Duration::from_millis(1));
    assert!(
        matches!(w.c.ended(), Some(Err(Error::PeerFailed { detail, .. })) if detail.contains("packed writes 3 not acknowledged"))
    );
    assert!(w.c.conn.failure().is_some());
    // An answer that comes after the end is ignored.
    let mut out = Vec::new();
    w.c.conn.handle(
        &mut w.c.node,
        Message::WritesAck {
            seq: 3,
            status: WritesStatus::Done,
        },
        w.now,
        &mut out,
    );
    assert!(out.is_empty());
}

#[test]
fn a_lost_withdrawal_acknowledgement_drops_the_peer_and_releases_the_region() {
    let mut w = Wire::connected();
    let t0 = w.now;
    w.withdraw(1);
    // The client's acknowledgement never arrives (the withdrawal is dropped on the way).
    w.c.inbox.clear();
    w.poll_both(t0 + LIMITS.ack);
    assert!(w.s.released().is_empty());
    w.poll_both(t0 + LIMITS.ack + Duration::from_millis(1));
    assert!(
        matches!(w.s.events()[..], [NetEvent::Lost { detail, .. }] if detail.contains("not acknowledged"))
    );
    assert_eq!(w.s.released(), [1]);
    assert!(matches!(w.s.ended(), Some(Err(Error::PeerFailed { .. }))));
}

#[test]
fn a_silent_peer_is_dropped_at_the_handshake_deadline() {
    // A client that never answers the challenge.
    let mut w = Wire::new(Token::none(), Token::none());
    let t0 = w.now;
    w.start();
    assert_eq!(w.s.conn.next_deadline(), Some(t0 + LIMITS.handshake));
    w.poll_both(t0 + LIMITS.handshake);
    assert!(w.s.ended().is_none(), "not before the deadline");
    w.poll_both(t0 + LIMITS.handshake + Duration::from_millis(1));
    assert!(
        matches!(w.s.events()[..], [NetEvent::Lost { detail, .. }] if detail.contains("no handshake within"))
    );
    assert!(matches!(w.s.ended(), Some(Err(Error::PeerFailed { .. }))));
    // ... and a client whose server never challenges it.
    assert!(
        matches!(w.c.ended(), Some(Err(Error::PeerFailed { detail, .. })) if detail.contains("no handshake within"))
    );
    // An unbounded handshake has no deadline.
    let mut c = Conn::client(
        1,
        None,
        Token::none(),
        [1; 32],
        1,
        t0,
        Limits {
            handshake: Duration::MAX,
            goodbye: Duration::MAX,
            ack: Duration::ZERO,
        },
    );
    assert_eq!(c.next_deadline(), None);
    let mut out = Vec::new();
    c.poll(
        &mut Node::new("x"),
        t0 + Duration::from_secs(1 << 40),
        &mut out,
    );
    assert!(out.is_empty());
}

#[test]
fn a_peer_that_says_goodbye_is_left_not_lost_and_releases_what_it_held() {
    let mut w = Wire::connected();
    // A withdrawal the client has not acknowledged yet: its goodbye releases it.
    w.withdraw(1);
    w.c.inbox.clear();
    let mut out = Vec::new();
    assert!(w.c.conn.close(w.now, &mut out));
    assert_eq!(
        w.c.conn.failure().as_deref(),
        Some("this agent closed the connection")
    );
    w.route(out, true);
    assert_eq!(w.c.flushes(), [Flush::Goodbye]);
    // No Bye before the flush is reported.
    assert!(w.s.inbox.is_empty());
    w.client_flushes_done();
    w.pump();
    assert!(matches!(w.s.events()[..], [NetEvent::Left { peer }] if peer == "cli@127.0.0.1:40000"));
    assert_eq!(w.s.released(), [1]);
    assert!(w.s.conn.is_leaving());
    assert!(matches!(w.c.ended(), Some(Ok(()))));
    // The client's endpoint closing afterwards is the expected end, not a loss.
    let mut out = Vec::new();
    w.s.conn
        .transport_failed(&mut w.s.node, "connection reset".into(), &mut out);
    assert!(matches!(&out[..], [Action::End(Ok(()))]), "{out:?}");
}

#[test]
fn a_goodbye_nobody_answers_ends_failed_at_its_bound() {
    let mut w = Wire::connected();
    let t0 = w.now;
    let mut out = Vec::new();
    w.c.conn.close(t0, &mut out);
    w.route(out, true);
    w.client_flushes_done();
    w.s.inbox.clear(); // the server is gone
    w.poll_both(t0 + LIMITS.goodbye + Duration::from_millis(1));
    assert!(
        matches!(w.c.ended(), Some(Err(Error::PeerFailed { detail, .. })) if detail.contains("no answer to the goodbye"))
    );
    // A goodbye whose flush failed ends at once.
    let mut w = Wire::connected();
    let mut out = Vec::new();
    w.c.conn.close(w.now, &mut out);
    out.clear();
    w.c.conn.flushed(
        &mut w.c.node,
        Flush::Goodbye,
        Err("endpoint timeout".into()),
        &mut out,
    );
    assert!(
        matches!(&out[..], [Action::End(Err(Error::PeerFailed { detail, .. }))] if detail.contains("flush before the goodbye failed"))
    );
}

#[test]
fn a_server_that_stops_tells_its_client_goodbye_and_waits_for_the_answer() {
    let mut w = Wire::connected();
    w.c.conn.writes_sent(8, w.now);
    let mut out = Vec::new();
    assert!(w.s.conn.leave(&mut w.s.node, w.now, &mut out));
    w.route(out, false);
    w.pump();
    // The client fails what is in flight at once, and answers once its flush is done.
    assert!(w.c.conn.is_answering());
    assert_eq!(
        w.c.conn.failure().as_deref(),
        Some("the peer closed the connection")
    );
    assert!(w.c.log.iter().any(
        |a| matches!(a, Action::Fail(Error::PeerFailed { detail, .. }) if detail == "the peer closed the connection")
    ));
    assert!(w.c.ended().is_none() && w.s.ended().is_none());
    // What the client still sends before its answer is dropped.
    let mut out = Vec::new();
    w.s.conn.handle(
        &mut w.s.node,
        Message::Notify(b"late".to_vec()),
        w.now,
        &mut out,
    );
    assert!(out.is_empty());
    w.client_flushes_done();
    w.pump();
    assert!(
        matches!(w.c.ended(), Some(Err(Error::PeerFailed { detail, .. })) if detail == "the peer closed the connection")
    );
    // The answer ends the server's side quietly.
    assert!(matches!(w.s.ended(), Some(Ok(()))));
    assert!(w.s.events().is_empty());
    // A client that never answers: the server drops it quietly at the goodbye bound.
    let mut w = Wire::connected();
    let mut out = Vec::new();
    w.s.conn.leave(&mut w.s.node, w.now, &mut out);
    w.poll_both(w.now + LIMITS.goodbye + Duration::from_millis(1));
    assert!(matches!(w.s.ended(), Some(Ok(()))));
    assert!(w.s.events().is_empty());
}

#[test]
fn a_transport_failure_loses_the_peer() {
    let mut w = Wire::connected();
    let mut out = Vec::new();
    w.s.conn
        .transport_failed(&mut w.s.node, "the peer went away".into(), &mut out);
    assert!(
        matches!(&out[..], [Action::Event(NetEvent::Lost { detail, .. }), Action::End(Err(_))] if detail == "the peer went away")
    );
    let mut out = Vec::new();
    w.c.conn
        .transport_failed(&mut w.c.node, "the peer went away".into(), &mut out);
    assert!(matches!(
        &out[..],
        [Action::End(Err(Error::PeerFailed { .. }))]
    ));
    assert_eq!(
        w.c.conn.failure().as_deref(),
        Some("peer srv@127.0.0.1:18515: the peer went away")
    );
}

/// Every kind of message, as a peer might send it.
fn every_message() -> Vec<Message> {
    vec![
        Message::Challenge {
            server_nonce: [3; 32],
        },
        Message::Auth {
            client_nonce: [4; 32],
            mac: [5; 32],
            name: "x".into(),
            session: 3,
            worker_address: vec![1],
        },
        Message::Welcome {
            mac: [6; 32],
            session: 4,
            worker_address: vec![2],
            metadata: Metadata::default(),
        },
        Message::Refused {
            code: RefuseCode::Other,
            reason: "no".into(),
        },
        Message::Metadata(Metadata::default()),
        Message::Withdraw(vec![1]),
        Message::WithdrawAck(vec![1]),
        Message::Notify(b"n".to_vec()),
        Message::Bye,
        Message::Writes {
            seq: 77,
            region: 1,
            records: vec![(0, 1)],
            data: b"w".to_vec().into(),
        },
        Message::WritesAck {
            seq: 77,
            status: WritesStatus::Done,
        },
    ]
}

/// A connection of `role` in each phase it can be in, by name.
fn in_every_phase() -> Vec<(&'static str, Conn, Node)> {
    let mut v = Vec::new();
    let fresh = Wire::new(Token::none(), Token::none());
    v.push((
        "client awaiting the challenge",
        fresh.c.conn.clone(),
        fresh.c.node.clone(),
    ));
    let mut w = Wire::new(Token::none(), Token::none());
    w.start();
    v.push((
        "server awaiting the answer",
        w.s.conn.clone(),
        w.s.node.clone(),
    ));
    let m = w.c.inbox.pop_front().unwrap();
    let mut out = Vec::new();
    w.c.conn.handle(&mut w.c.node, m, w.now, &mut out);
    v.push((
        "client awaiting the welcome",
        w.c.conn.clone(),
        w.c.node.clone(),
    ));
    let w = Wire::connected();
    v.push(("client ready", w.c.conn.clone(), w.c.node.clone()));
    v.push(("server ready", w.s.conn.clone(), w.s.node.clone()));
    let mut w = Wire::connected();
    w.c.conn.close(w.now, &mut Vec::new());
    v.push(("client closing", w.c.conn.clone(), w.c.node.clone()));
    let mut w = Wire::connected();
    w.s.conn.leave(&mut w.s.node, w.now, &mut Vec::new());
    v.push(("server leaving", w.s.conn.clone(), w.s.node.clone()));
    let mut w = Wire::connected();
    let mut out = Vec::new();
    w.s.conn.leave(&mut w.s.node, w.now, &mut out);
    w.route(out, false);
    w.pump();
    v.push((
        "client answering the server's goodbye",
        w.c.conn.clone(),
        w.c.node.clone(),
    ));
    v
}

/// What a phase does with a message: take it, drop it, or call it a protocol error.
#[derive(Debug, PartialEq)]
enum Outcome {
    Taken,
    Dropped,
    ProtocolError,
}

fn outcome(role: Role, out: &[Action], before: &Conn, after: &Conn) -> Outcome {
    let ended_with_protocol_error = match role {
        Role::Server => {
            out.iter().any(|a| {
                matches!(
                    a,
                    Action::Send(Message::Refused {
                        code: RefuseCode::Protocol,
                        ..
                    })
                )
            }) && matches!(out.last(), Some(Action::End(Err(_))))
        }
        Role::Client => matches!(out.last(), Some(Action::End(Err(Error::Protocol { .. })))),
    };
    if ended_with_protocol_error {
        Outcome::ProtocolError
    } else if out.is_empty() && format!("{:?}", before) == format!("{:?}", after) {
        Outcome::Dropped
    } else {
        Outcome::Taken
    }
}

#[test]
fn every_message_in_every_phase_is_taken_dropped_or_a_protocol_error() {
    use codec::Kind as K;
    // What each phase takes; past a goodbye the rest is dropped, elsewhere it is refused.
    let takes: &[(&str, &[K])] = &[
        ("client awaiting the challenge", &[K::Challenge, K::Refused]),
        ("client awaiting the welcome", &[K::Welcome, K::Refused]),
        (
            "client ready",
            &[K::Metadata, K::Withdraw, K::Notify, K::Bye],
        ),
        ("client closing", &[K::Notify, K::Bye]),
        ("server awaiting the answer", &[K::Auth]),
        ("server ready", &[K::Writes, K::Notify, K::Bye]),
        ("server leaving", &[K::Bye]),
        ("client answering the server's goodbye", &[]),
    ];
    for (name, conn, node) in in_every_phase() {
        let taken = takes.iter().find(|t| t.0 == name).expect("listed").1;
        let past_goodbye = conn.is_closing() || conn.is_leaving() || conn.is_answering();
        for m in every_message() {
            let kind = m.kind();
            let (mut c, mut n) = (conn.clone(), node.clone());
            let mut out = Vec::new();
            c.handle(&mut n, m, Instant::now(), &mut out);
            let got = outcome(conn.role(), &out, &conn, &c);
            let want = if taken.contains(&kind) {
                Outcome::Taken
            } else if past_goodbye {
                Outcome::Dropped
            } else {
                Outcome::ProtocolError
            };
            // A client's acknowledgement of writes it did not send answers nothing: a
            // protocol error even past its own goodbye, where it still waits for real ones.
            let want = if name == "client closing" && kind == K::WritesAck {
                Outcome::ProtocolError
            } else {
                want
            };
            assert_eq!(got, want, "{name}: {kind:?} gave {out:?}");
            // After the end nothing more is done.
            if c.is_over() {
                let mut again = Vec::new();
                c.handle(&mut n, Message::Bye, Instant::now(), &mut again);
                c.poll(
                    &mut n,
                    Instant::now() + Duration::from_secs(1 << 30),
                    &mut again,
                );
                assert!(
                    again.is_empty(),
                    "{name}: {kind:?}: acted after the end: {again:?}"
                );
            }
        }
        // Bytes the decoder refused are a protocol error in every phase but the end.
        let (mut c, mut n) = (conn.clone(), node.clone());
        let mut out = Vec::new();
        c.decode_failed(
            &mut n,
            DecodeError::BadMagic(*b"\xff\xff\xff\xff"),
            &mut out,
        );
        assert_eq!(
            outcome(conn.role(), &out, &conn, &c),
            Outcome::ProtocolError,
            "{name}: garbage"
        );
        if let Some(Err(Error::Protocol { source, .. })) = out.iter().find_map(|a| match a {
            Action::End(r) => Some(r),
            _ => None,
        }) {
            assert_eq!(
                source.as_ref(),
                Some(&DecodeError::BadMagic(*b"\xff\xff\xff\xff")),
                "the decoder's error is kept"
            );
        }
    }
}

#[test]
fn acknowledgements_that_answer_what_was_sent_are_taken() {
    // The exceptions of the table above: a WritesAck of writes sent, a WithdrawAck of a
    // withdrawal sent.
    let mut w = Wire::connected();
    w.c.conn.writes_sent(77, w.now);
    let mut out = Vec::new();
    w.c.conn.handle(
        &mut w.c.node,
        Message::WritesAck {
            seq: 77,
            status: WritesStatus::Done,
        },
        w.now,
        &mut out,
    );
    assert!(matches!(out[..], [Action::WritesAcked { seq: 77, .. }]));
    // The same answer twice: the second answers nothing.
    out.clear();
    w.c.conn.handle(
        &mut w.c.node,
        Message::WritesAck {
            seq: 77,
            status: WritesStatus::Done,
        },
        w.now,
        &mut out,
    );
    assert!(matches!(
        out.last(),
        Some(Action::End(Err(Error::Protocol { .. })))
    ));
    let mut w = Wire::connected();
    w.withdraw(1);
    let mut out = Vec::new();
    w.s.conn.handle(
        &mut w.s.node,
        Message::WithdrawAck(vec![1]),
        w.now,
        &mut out,
    );
    assert!(matches!(out[..], [Action::Release(1)]), "{out:?}");
}
