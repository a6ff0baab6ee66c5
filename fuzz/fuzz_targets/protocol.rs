//! Fuzzes the agent-to-agent protocol state machine (`gdpath_wire::protocol`): a client and a
//! server connection driven by an arbitrary sequence of inputs, in any order: bytes from an
//! arbitrary peer (decoded, or refused by the decoder), the real messages the other side sent,
//! the clock moving and deadlines checked, local requests (close, withdraw, export, leave,
//! packed writes sent, flushes and writes reported done), transports failing.
//!
//! Checked on every step: nothing panics; every message a side sends encodes and decodes back
//! to itself, and is one its role may send; a connection ends once, and after its end does
//! nothing more; an export is released once, and only after it was withdrawn; a server reports
//! a connection `Connected` at most once and nothing after its end; a poll before the next
//! deadline ends nothing.
//!
//! Run: `scripts/fuzz.sh SECONDS` (stable Rust; runs this target and `metadata`), or with
//! AddressSanitizer `cargo +nightly fuzz run protocol -- -max_total_time=60` (from `fuzz/`).
#![no_main]

use gdpath_wire::codec::{self, Kind, Message, RegionMeta, WireKind, WritesStatus};
use gdpath_wire::protocol::{Action, Conn, Flush, Limits, Node, Role};
use gdpath_wire::auth::Token;
use gdpath_wire::NetEvent;
use libfuzzer_sys::fuzz_target;
use std::collections::{HashSet, VecDeque};
use std::time::{Duration, Instant};

const LIMITS: Limits = Limits {
    handshake: Duration::from_secs(10),
    goodbye: Duration::from_secs(5),
    ack: Duration::from_secs(60),
};

/// One side: its connection, its node, messages the other side sent it, flushes and packed
/// writes it was asked for, and what the invariants need to remember.
struct Side {
    conn: Conn,
    node: Node,
    inbox: VecDeque<Message>,
    flushes: Vec<Flush>,
    to_apply: Vec<u64>,
    ended: bool,
    connected: bool,
    withdrawn: HashSet<u64>,
    released: HashSet<u64>,
}

impl Side {
    fn new(conn: Conn, node: Node) -> Side {
        Side {
            conn,
            node,
            inbox: VecDeque::new(),
            flushes: Vec::new(),
            to_apply: Vec::new(),
            ended: false,
            connected: false,
            withdrawn: HashSet::new(),
            released: HashSet::new(),
        }
    }

    /// Checks `out` against the invariants and queues its messages for `other`.
    fn take(&mut self, out: Vec<Action>, other: &mut VecDeque<Message>) {
        let role = self.conn.role();
        for a in out {
            assert!(!self.ended || matches!(a, Action::Release(_)), "{role:?} acted after its end: {a:?}");
            match a {
                Action::Send(m) => {
                    let allowed = match role {
                        Role::Client => matches!(
                            m.kind(),
                            Kind::Auth | Kind::WithdrawAck | Kind::Notify | Kind::Bye | Kind::Writes
                        ),
                        Role::Server => matches!(
                            m.kind(),
                            Kind::Challenge
                                | Kind::Welcome
                                | Kind::Refused
                                | Kind::Metadata
                                | Kind::Withdraw
                                | Kind::Notify
                                | Kind::Bye
                                | Kind::WritesAck
                        ),
                    };
                    assert!(allowed, "{role:?} sent {:?}", m.kind());
                    let bytes = codec::encode(&m).expect("the protocol sends what encodes");
                    assert_eq!(codec::decode(&bytes).as_ref(), Ok(&m));
                    other.push_back(m);
                }
                Action::Flush(f) => self.flushes.push(f),
                Action::ApplyWrites { seq, .. } => {
                    assert_eq!(role, Role::Server);
                    self.to_apply.push(seq);
                }
                Action::Release(id) => {
                    assert!(self.withdrawn.contains(&id), "released {id}, never withdrawn");
                    assert!(self.released.insert(id), "released {id} twice");
                }
                Action::Event(e) => {
                    assert_eq!(role, Role::Server, "a client reported {e:?}");
                    if let NetEvent::Connected { .. } = e {
                        assert!(!self.connected, "connected twice");
                        self.connected = true;
                    }
                }
                Action::End(_) => {
                    assert!(!self.ended, "{role:?} ended twice");
                    self.ended = true;
                    assert!(self.conn.is_over());
                }
                Action::Connect { session, .. } => {
                    // The data channel goes to the other side's id, after it authenticated.
                    let want = match role {
                        Role::Client => 0x5e,
                        Role::Server => 0xc1,
                    };
                    assert_eq!(session, want, "{role:?} connected to {session:#x}");
                    assert_eq!(self.conn.peer_session(), Some(session));
                }
                Action::Withdrawn(_)
                | Action::WritesAcked { .. }
                | Action::Notification(_)
                | Action::Fail(_) => {}
            }
        }
    }
}

/// Reads the fuzz input as a stream of small numbers and byte strings.
struct Input<'a>(&'a [u8]);

impl Input<'_> {
    fn byte(&mut self) -> Option<u8> {
        let (&b, rest) = self.0.split_first()?;
        self.0 = rest;
        Some(b)
    }
    fn u16(&mut self) -> u16 {
        u16::from(self.byte().unwrap_or(0)) | u16::from(self.byte().unwrap_or(0)) << 8
    }
    fn bytes(&mut self) -> &[u8] {
        let n = (self.u16() as usize).min(self.0.len());
        let (b, rest) = self.0.split_at(n);
        self.0 = rest;
        b
    }
}

fn host_region(id: u64) -> RegionMeta {
    RegionMeta {
        id,
        kind: WireKind::Host,
        addr: 0x1000,
        len: 4096,
        rkey: vec![1],
        ipc: None,
        shm: None,
    }
}

fuzz_target!(|data: &[u8]| {
    let mut input = Input(data);
    let t0 = Instant::now();
    let mut now = t0;
    let token = if input.byte().unwrap_or(0) & 1 == 0 {
        Token::none()
    } else {
        Token::new("a token of at least sixteen bytes").unwrap()
    };
    let mut snode = Node::new("srv");
    snode.token = Some(token.clone());
    snode.worker_address = b"server worker".to_vec();
    snode.exports.add(host_region(1)).unwrap();
    let mut cnode = Node::new("cli");
    cnode.worker_address = b"client worker".to_vec();
    let mut c = Side::new(
        Conn::client(1, None, token, [7; 32], 0xc1, now, LIMITS),
        cnode,
    );
    let mut s = Side::new(Conn::server(2, None, [5; 32], 0x5e, now, LIMITS), snode);
    let mut out = Vec::new();
    s.conn.challenge(&mut out);
    s.take(out, &mut c.inbox);
    let mut next_export = 2u64;
    let mut next_seq = 1u64;
    while let Some(op) = input.byte() {
        let mut out = Vec::new();
        // Which side acts: the low bit; what it does: the rest.
        let client = op & 1 == 0;
        match (op >> 1) % 12 {
            // Bytes from an arbitrary peer.
            0 => {
                let bytes = input.bytes().to_vec();
                let side = if client { &mut c } else { &mut s };
                match codec::decode_owned(bytes) {
                    Ok(m) => side.conn.handle(&mut side.node, m, now, &mut out),
                    Err(e) => side.conn.decode_failed(&mut side.node, e, &mut out),
                }
            }
            // The next message the other side sent.
            1 => {
                let side = if client { &mut c } else { &mut s };
                if let Some(m) = side.inbox.pop_front() {
                    side.conn.handle(&mut side.node, m, now, &mut out);
                }
            }
            // The clock moves (up to 65 s), then deadlines are checked.
            2 => {
                now += Duration::from_millis(u64::from(input.u16()));
                let side = if client { &mut c } else { &mut s };
                let before = side.conn.next_deadline();
                side.conn.poll(&mut side.node, now, &mut out);
                if before.is_none_or(|d| now <= d) {
                    assert!(
                        !out.iter().any(|a| matches!(a, Action::End(_))),
                        "ended before its deadline {before:?}: {out:?}"
                    );
                }
            }
            3 => {
                c.conn.close(now, &mut out);
            }
            // The flushes asked for finish, well or not.
            4 => {
                let ok = input.byte().unwrap_or(0) & 1 == 0;
                let side = if client { &mut c } else { &mut s };
                for f in std::mem::take(&mut side.flushes) {
                    let r = if ok { Ok(()) } else { Err("flush failed".into()) };
                    side.conn.flushed(&mut side.node, f, r, &mut out);
                }
            }
            // The server withdraws a region from its client.
            5 => {
                let id = u64::from(input.byte().unwrap_or(1) % 4);
                if s.node.exports.get(id).is_some() {
                    let told = s.conn.withdraw(vec![id], now, &mut out).then_some(2);
                    assert!(s.node.exports.withdraw(id, told, &mut out));
                    s.withdrawn.insert(id);
                }
            }
            // The server exports another region.
            6 => {
                if s.node.exports.add(host_region(next_export)).is_ok() {
                    let md = s.node.exports.metadata("srv");
                    s.conn.send_metadata(md, &mut out);
                }
                next_export += 1;
            }
            // Packed writes the server was asked to apply are made, or refused.
            7 => {
                let status = match input.byte().unwrap_or(0) % 3 {
                    0 => WritesStatus::Done,
                    1 => WritesStatus::NotExported,
                    _ => WritesStatus::Refused("busy".into()),
                };
                for seq in std::mem::take(&mut s.to_apply) {
                    s.conn.writes_applied(seq, status.clone(), &mut out);
                }
            }
            // The client sends packed writes into a region of the server.
            8 => {
                let region = u64::from(input.byte().unwrap_or(1) % 4);
                let len = input.u16() % 64;
                c.conn.writes_sent(next_seq, now);
                if c.conn.is_ready() || c.conn.is_closing() {
                    s.inbox.push_back(Message::Writes {
                        seq: next_seq,
                        region,
                        records: vec![(u64::from(len), u32::from(len))],
                        data: vec![0; len as usize].into(),
                    });
                }
                next_seq += 1;
            }
            // A transport fails.
            9 => {
                let side = if client { &mut c } else { &mut s };
                side.conn
                    .transport_failed(&mut side.node, "transport failed".into(), &mut out);
            }
            // The server stops.
            10 => {
                s.conn.leave(&mut s.node, now, &mut out);
            }
            // The client gives up on its connection.
            _ => {
                c.conn.abandon(&mut c.node, "given up".into(), &mut out);
            }
        }
        // Whoever acted, the actions are checked against its side.
        let (me, other) = match op >> 1 {
            x if matches!(x % 12, 3 | 8 | 11) => (&mut c, &mut s),
            x if matches!(x % 12, 5 | 6 | 7 | 10) => (&mut s, &mut c),
            _ if client => (&mut c, &mut s),
            _ => (&mut s, &mut c),
        };
        me.take(out, &mut other.inbox);
    }
    assert!(now >= t0);
});
