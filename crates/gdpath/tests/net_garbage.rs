//! Untrusted bytes on the control connection: a raw TCP client sending garbage, malformed,
//! oversized, half or out-of-order messages to a serving agent, and a fake TCP server sending a
//! malformed welcome to a connecting agent. Both are refused; nothing of it reaches UCX; the
//! server keeps serving others. An authenticated raw client's packed writes over UCX are checked
//! against the export. Plus random and truncated input to the decoder (proptest), which must
//! never panic.

use gdpath::net::auth::binding;
use gdpath::net::codec::{
    self, Message, Metadata, RefuseCode, RegionMeta, WireKind, WritesStatus, AM_ID, HEADER_LEN,
};
use gdpath::net::{ConnectOptions, FailureMode, NetEvent, Token};
use gdpath::Error;
use gdpath_ucx::{Context, Endpoint, Features, UcxCfg, Worker, WorkerAddress};
use proptest::prelude::*;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::time::{Duration, Instant};

use gdpath_testkit::ucx_serial as serial;

mod net_common;
use net_common::{agent, small_server};

const T: Duration = Duration::from_secs(20);

/// A raw TCP connection to `addr`, its reads bounded by `T`.
fn raw(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(T)).unwrap();
    s
}

/// Reads one frame from `s` and decodes it; `None` when the server closed the connection.
fn read_msg(s: &mut TcpStream) -> Option<Message> {
    let mut head = [0u8; HEADER_LEN];
    s.read_exact(&mut head).ok()?;
    let n = codec::body_len(&head, codec::MAX_MESSAGE).expect("the server sends frames");
    let mut frame = head.to_vec();
    frame.resize(HEADER_LEN + n, 0);
    s.read_exact(&mut frame[HEADER_LEN..]).unwrap();
    Some(codec::decode(&frame).unwrap())
}

/// Whether the server closed `s` (a read sees the end, at once or within `T`).
fn closed(s: &mut TcpStream) -> bool {
    let mut b = [0u8; 64];
    loop {
        match s.read(&mut b) {
            Ok(0) => return true,
            Ok(_) => continue,
            Err(e) if e.kind() == std::io::ErrorKind::ConnectionReset => return true,
            Err(_) => return false,
        }
    }
}

fn challenge(s: &mut TcpStream) -> [u8; 32] {
    match read_msg(s) {
        Some(Message::Challenge { server_nonce }) => server_nonce,
        other => panic!("the server speaks first with a challenge, not {other:?}"),
    }
}

fn raw_worker() -> Worker {
    let ctx = Context::new(&UcxCfg {
        features: Features::RMA | Features::AM,
        devices: Some("lo".into()),
        ..UcxCfg::default()
    })
    .unwrap();
    let w = Worker::new(&ctx).unwrap();
    w.am_register(AM_ID).unwrap();
    w
}

#[test]
fn garbage_on_the_control_connection_is_refused_and_the_server_keeps_serving() {
    let _serial = serial();
    let (_server, _r, srv) = small_server(Token::none());
    let good_auth = codec::encode(&Message::Auth {
        client_nonce: [1; 32],
        mac: [2; 32],
        name: "x".into(),
        session: 7,
        worker_address: vec![1, 2, 3],
    })
    .unwrap();
    // A complete frame whose body is cut short (its header says so).
    let mut truncated = good_auth[..good_auth.len() - 5].to_vec();
    let body = (truncated.len() - HEADER_LEN) as u32;
    truncated[8..12].copy_from_slice(&body.to_le_bytes());
    let mut huge = codec::encode(&Message::Bye).unwrap();
    huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
    let cases: Vec<(&str, Vec<u8>)> = vec![
        ("16 bytes of 0xff", vec![0xff; 16]),
        ("1000 zero bytes", vec![0; 1000]),
        (
            "random bytes",
            (0..200u32).map(|i| (i * 7919 % 251) as u8).collect(),
        ),
        ("truncated auth", truncated),
        ("wrong version", {
            let mut b = good_auth.clone();
            b[4] = 9;
            b
        }),
        (
            "metadata before auth",
            codec::encode(&Message::Metadata(Metadata::default())).unwrap(),
        ),
        ("a length prefix of 4 GiB", huge),
    ];
    for (what, bytes) in cases {
        let mut s = raw(srv.local_addr());
        challenge(&mut s);
        s.write_all(&bytes).unwrap();
        match read_msg(&mut s) {
            Some(Message::Refused { code, reason }) => {
                assert_eq!(code, RefuseCode::Protocol, "{what}: {reason}");
                eprintln!("{what}: refused: {reason}");
            }
            other => panic!("{what}: expected a refusal, got {other:?}"),
        }
        assert!(closed(&mut s), "{what}: the connection stays open");
        match srv.next_event(T) {
            Some(NetEvent::Refused { .. }) => {}
            e => panic!("{what}: expected a Refused event, got {e:?}"),
        }
    }
    // A well-behaved agent still connects and reads.
    let client = agent("cli", FailureMode::Detect);
    let peer = client.connect(srv.local_addr()).unwrap();
    assert_eq!(peer.regions().len(), 1);
}

/// A client that authenticates over TCP by hand, then talks UCX to the server's worker: the
/// welcome it got, its worker, its endpoint to the server's worker.
struct RawClient {
    welcome: (u64, Metadata),
    w: Worker,
    ep: Endpoint,
    _tcp: TcpStream,
}

impl RawClient {
    fn connect(addr: SocketAddr) -> RawClient {
        let w = raw_worker();
        let mut s = raw(addr);
        let server_nonce = challenge(&mut s);
        let client_nonce = [7u8; 32];
        let me = w.address().unwrap().0;
        let session = 0x5eed;
        let auth = Message::Auth {
            client_nonce,
            mac: Token::none().client_mac(&server_nonce, &client_nonce, &binding(session, &me)),
            name: "raw".into(),
            session,
            worker_address: me,
        };
        s.write_all(&codec::encode(&auth).unwrap()).unwrap();
        let Some(Message::Welcome {
            session: theirs,
            worker_address,
            metadata,
            ..
        }) = read_msg(&mut s)
        else {
            panic!("authenticated")
        };
        let ep = Endpoint::connect_address(&w, &WorkerAddress(worker_address)).unwrap();
        ep.wait_connected(T).unwrap();
        RawClient {
            welcome: (theirs, metadata),
            w,
            ep,
            _tcp: s,
        }
    }

    /// Sends `m` over UCX to the server's connection, and returns its answer (over UCX, with
    /// this client's routing id at its head).
    fn ask(&self, m: &Message) -> Message {
        let route = self.welcome.0.to_le_bytes();
        self.ep
            .am_send(AM_ID, &route, &codec::encode(m).unwrap())
            .unwrap()
            .wait(T)
            .unwrap();
        let a = self.w.am_recv(AM_ID, T).unwrap();
        assert_eq!(
            a.header,
            0x5eedu64.to_le_bytes(),
            "answers carry our routing id"
        );
        codec::decode(&a.data).unwrap()
    }
}

/// Packed writes from an authenticated but untrusted client (a raw UCX endpoint that speaks
/// the protocol): a write inside the exported region lands and is acknowledged; a message with
/// one write past the region's end, or to a region that is not exported, is refused whole (the
/// acknowledgement says why) and changes no byte; the server keeps serving.
#[test]
fn packed_writes_are_checked_against_the_export_before_any_byte_lands() {
    let _serial = serial();
    let (_server, region, srv) = small_server(Token::none());
    let c = RawClient::connect(srv.local_addr());
    let (id, len) = (c.welcome.1.regions[0].id, c.welcome.1.regions[0].len);
    assert_eq!(len, 4096);
    let write = |seq: u64, region: u64, records: Vec<(u64, u32)>, data: &[u8]| {
        let m = Message::Writes {
            seq,
            region,
            records,
            data: data.to_vec().into(),
        };
        match c.ask(&m) {
            Message::WritesAck { seq: s, status } => {
                assert_eq!(s, seq);
                status
            }
            other => panic!("expected an acknowledgement, got {other:?}"),
        }
    };
    assert_eq!(
        write(1, id, vec![(0, 3), (4093, 3)], b"abcxyz"),
        WritesStatus::Done
    );
    match write(2, id, vec![(10, 2), (4095, 2)], b"QQRR") {
        WritesStatus::Refused(why) => assert!(why.contains("past the end"), "{why}"),
        s => panic!("expected a refusal, got {s:?}"),
    }
    assert_eq!(
        write(3, id + 100, vec![(0, 1)], b"Z"),
        WritesStatus::NotExported
    );
    let v = region.host_view().unwrap();
    assert_eq!(&v[..3], b"abc");
    assert_eq!(&v[4093..], b"xyz");
    assert!(
        v[3..4093].iter().all(|&b| b == 0),
        "a refused message wrote nothing"
    );
    drop(v);
    // A well-behaved agent still connects.
    let client = agent("cli", FailureMode::Detect);
    assert_eq!(client.connect(srv.local_addr()).unwrap().regions().len(), 1);
}

/// A client that connects and never answers the challenge, and one that sends half an answer
/// and hangs, are dropped as `Lost` once `connect_timeout` passed: not before, and not a whole
/// idle poll of the control thread after it, since it wakes for the deadline.
#[test]
fn a_silent_or_half_answering_client_is_dropped_at_the_handshake_deadline() {
    let _serial = serial();
    let timeout = Duration::from_millis(330);
    let server = net_common::agent_with(
        "srv",
        gdpath::net::NetConfig {
            connect_timeout: timeout,
            ..net_common::cfg(FailureMode::Detect)
        },
    );
    let srv = server
        .serve("127.0.0.1:0".parse().unwrap(), Token::none())
        .unwrap();
    let auth = codec::encode(&Message::Auth {
        client_nonce: [1; 32],
        mac: [2; 32],
        name: "half".into(),
        session: 1,
        worker_address: vec![1; 64],
    })
    .unwrap();
    for (what, send) in [("silent", &auth[..0]), ("half an answer", &auth[..40])] {
        // Before the connection exists, so that the server's clock (started when it accepts)
        // cannot start earlier than this one.
        let start = Instant::now();
        let mut s = raw(srv.local_addr());
        challenge(&mut s);
        s.write_all(send).unwrap();
        let (detail, at) = match srv.next_event(T) {
            Some(NetEvent::Lost { detail, .. }) => (detail, start.elapsed()),
            e => panic!("{what}: expected Lost, got {e:?}"),
        };
        eprintln!("{what} client lost after {at:?}: {detail}");
        assert!(detail.contains("no handshake within"), "{detail}");
        assert!(at >= timeout, "{what}: dropped before the deadline: {at:?}");
        assert!(
            at < timeout + Duration::from_millis(60),
            "{what}: dropped {:?} after the deadline",
            at - timeout
        );
        assert!(closed(&mut s), "{what}: the connection stays open");
    }
}

/// A fake server that accepts one connection and does `then` with it (keeping it open until
/// the client closes it).
fn fake_listener(
    then: impl FnOnce(&mut TcpStream) + Send + 'static,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    let l = TcpListener::bind("127.0.0.1:0").unwrap();
    let addr = l.local_addr().unwrap();
    let h = std::thread::spawn(move || {
        let (mut s, _) = l.accept().unwrap();
        s.set_read_timeout(Some(T)).unwrap();
        then(&mut s);
        let mut b = [0u8; 4096];
        while matches!(s.read(&mut b), Ok(n) if n > 0) {}
    });
    (addr, h)
}

/// A fake server on TCP: challenge, then `welcome(client_nonce, server_nonce)` as the reply;
/// the client, having refused it (or failed after it), closes the connection.
fn fake_server(
    welcome: impl Fn([u8; 32], [u8; 32]) -> Vec<u8> + Send + 'static,
) -> (SocketAddr, std::thread::JoinHandle<()>) {
    fake_listener(move |s| {
        let sn = [5u8; 32];
        let ch = codec::encode(&Message::Challenge { server_nonce: sn }).unwrap();
        s.write_all(&ch).unwrap();
        let Some(Message::Auth { client_nonce, .. }) = read_msg(s) else {
            panic!("client did not answer with Auth");
        };
        s.write_all(&welcome(client_nonce, sn)).unwrap();
        assert!(closed(s), "the client kept the connection");
    })
}

#[test]
fn client_refuses_malformed_welcome() {
    let _serial = serial();
    let region = |addr: u64, len: u64| RegionMeta {
        id: 1,
        kind: WireKind::Host,
        addr,
        len,
        rkey: vec![1, 2, 3],
        ipc: None,
        shm: None,
    };
    type Make = Box<dyn Fn([u8; 32], [u8; 32]) -> Vec<u8> + Send>;
    let welcome = |md: Metadata| -> Make {
        Box::new(move |cn, sn| {
            let wa = vec![9u8; 16];
            codec::encode(&Message::Welcome {
                mac: Token::none().server_mac(&cn, &sn, &binding(3, &wa)),
                session: 3,
                worker_address: wa,
                metadata: md.clone(),
            })
            .unwrap()
        })
    };
    let good = Metadata {
        name: "fake".into(),
        regions: vec![region(4096, 4096)],
    };
    let cases: Vec<(&str, Make)> = vec![
        ("truncated", {
            let w = welcome(good.clone());
            Box::new(move |cn, sn| {
                let mut b = w(cn, sn);
                b.truncate(b.len() - 2);
                let body = (b.len() - HEADER_LEN) as u32;
                b[8..12].copy_from_slice(&body.to_le_bytes());
                b
            })
        }),
        ("wrapping region", {
            let w = welcome(Metadata::default());
            Box::new(move |cn, sn| {
                let mut b = w(cn, sn);
                // Append a region by hand whose addr + len wraps, and fix the lengths.
                let mut reg = 1u64.to_le_bytes().to_vec();
                reg.push(0);
                reg.extend_from_slice(&0u32.to_le_bytes());
                reg.extend_from_slice(&(u64::MAX - 8).to_le_bytes());
                reg.extend_from_slice(&64u64.to_le_bytes());
                reg.extend_from_slice(&1u16.to_le_bytes());
                reg.push(7);
                let count_at = b.len() - 4;
                b[count_at..].copy_from_slice(&1u32.to_le_bytes());
                b.extend_from_slice(&reg);
                let body = (b.len() - HEADER_LEN) as u32;
                b[8..12].copy_from_slice(&body.to_le_bytes());
                b
            })
        }),
        (
            "bad server mac",
            Box::new(move |_, _| {
                codec::encode(&Message::Welcome {
                    mac: [0; 32],
                    session: 3,
                    worker_address: vec![9; 16],
                    metadata: good.clone(),
                })
                .unwrap()
            }),
        ),
        ("garbage", Box::new(|_, _| vec![0xff; 16])),
    ];
    let client = agent("cli", FailureMode::Detect);
    for (what, make) in cases {
        let (addr, h) = fake_server(make);
        let err = client
            .connect_with(
                addr,
                &ConnectOptions {
                    token: Token::none(),
                    timeout: T,
                },
            )
            .unwrap_err();
        match (what, &err) {
            ("bad server mac", Error::AuthFailed { .. }) => {}
            (_, Error::Protocol { source, .. }) if what != "bad server mac" => {
                assert!(source.is_some(), "{what}: the decoder's error is kept")
            }
            _ => panic!("{what}: unexpected {err:?}"),
        }
        eprintln!("{what}: {err}");
        h.join().unwrap();
    }
}

/// Every way a connect can wait or fail names its phase (TCP connect, the handshake's step,
/// auth, UCX wireup) and the bound it waited for, and returns within that bound: a zero
/// timeout is refused up front (it read "connect did not complete within 0ns"), a port nobody
/// listens on is a `TCP connect` failure, a server that never challenges or never answers the
/// proof of the token is `no handshake within` the bound with the step, and a server whose UCX
/// worker never answers is `UCX wireup`.
#[test]
fn a_connect_says_which_phase_waited_and_for_how_long() {
    let _serial = serial();
    let client = agent("cli", FailureMode::Detect);
    let bound = Duration::from_millis(400);
    let opts = ConnectOptions {
        token: Token::none(),
        timeout: bound,
    };
    let detail = |what: &str, addr: SocketAddr, opts: &ConnectOptions| -> String {
        let start = Instant::now();
        let err = client.connect_with(addr, opts).unwrap_err();
        let took = start.elapsed();
        eprintln!("{what}: {err} (after {took:?})");
        assert!(
            took < opts.timeout + Duration::from_secs(1),
            "{what}: took {took:?}"
        );
        match err {
            Error::PeerFailed { detail, .. } => detail,
            e => panic!("{what}: {e:?}"),
        }
    };

    // A zero bound: refused before any connection is tried.
    let nobody = {
        let l = TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap()
    };
    let zero = ConnectOptions {
        timeout: Duration::ZERO,
        ..opts.clone()
    };
    let err = client.connect_with(nobody, &zero).unwrap_err();
    assert!(
        matches!(&err, Error::Config(m) if m.contains("timeout of 0")),
        "{err:?}"
    );

    // Nobody listens.
    let d = detail("refused", nobody, &opts);
    assert!(d.starts_with("TCP connect: "), "{d}");
    assert!(d.contains("is `gdpath serve` listening at"), "{d}");

    // A server that accepts and never challenges.
    let (addr, h) = fake_listener(|_| {});
    let d = detail("silent", addr, &opts);
    assert_eq!(
        d,
        format!("no handshake within {bound:?} (waiting for the server's challenge)")
    );
    h.join().unwrap();

    // A server that challenges and never answers the proof of the token.
    let (addr, h) = fake_listener(|s| {
        let ch = codec::encode(&Message::Challenge {
            server_nonce: [5; 32],
        })
        .unwrap();
        s.write_all(&ch).unwrap();
    });
    let d = detail("no welcome", addr, &opts);
    assert!(
        d.starts_with(&format!(
            "no handshake within {bound:?} (auth: waiting for the server"
        )),
        "{d}"
    );
    h.join().unwrap();

    // A server that welcomes with the address of a UCX worker that never progresses: its
    // endpoint cannot complete, and the rest of the bound is what the wireup waits.
    let w = raw_worker();
    let wa = w.address().unwrap().0;
    let (addr, h) = fake_server(move |cn, sn| {
        codec::encode(&Message::Welcome {
            mac: Token::none().server_mac(&cn, &sn, &binding(3, &wa)),
            session: 3,
            worker_address: wa.clone(),
            metadata: Metadata::default(),
        })
        .unwrap()
    });
    let d = detail("wireup", addr, &opts);
    assert!(d.starts_with("UCX wireup: "), "{d}");
    assert!(d.contains("connect bound"), "{d}");
    assert!(d.contains("same failure mode"), "{d}");
    h.join().unwrap();
    drop(w);
}

fn arb_message() -> impl Strategy<Value = Message> {
    let region = (
        any::<u64>(),
        0u64..1 << 40,
        1u64..1 << 30,
        prop::collection::vec(any::<u8>(), 1..64),
        any::<bool>(),
        0u32..8,
    )
        .prop_map(|(id, addr, len, rkey, gpu, o)| RegionMeta {
            id,
            kind: if gpu {
                WireKind::Gpu(o)
            } else {
                WireKind::Host
            },
            addr,
            len,
            rkey,
            // GPU regions carry an IPC handle half of the time (offset within the address).
            ipc: (gpu && id % 2 == 0).then(|| codec::IpcMeta {
                host: [id as u8; 16],
                pci: "0000:00:06.0".into(),
                handle: [o as u8; 64],
                offset: addr / 2,
            }),
            // Host regions name shared memory half of the time.
            shm: (!gpu && id % 2 == 0).then(|| codec::ShmMeta {
                host: [id as u8; 16],
                pid: o + 100,
                fd: o,
                dev: id,
                ino: id / 3,
                name: [o as u8; 16],
                offset: addr / 3,
            }),
        });
    let md =
        ("[a-z]{0,20}", prop::collection::vec(region, 0..6)).prop_map(|(name, mut regions)| {
            let mut seen = std::collections::HashSet::new();
            regions.retain(|r| seen.insert(r.id));
            Metadata { name, regions }
        });
    let address = || prop::collection::vec(any::<u8>(), 1..300);
    prop_oneof![
        any::<[u8; 32]>().prop_map(|n| Message::Challenge { server_nonce: n }),
        (
            any::<[u8; 32]>(),
            any::<[u8; 32]>(),
            "[ -~]{0,40}",
            any::<u64>(),
            address()
        )
            .prop_map(|(c, m, name, session, worker_address)| Message::Auth {
                client_nonce: c,
                mac: m,
                name,
                session,
                worker_address,
            }),
        (any::<[u8; 32]>(), any::<u64>(), address(), md.clone()).prop_map(
            |(mac, session, worker_address, metadata)| Message::Welcome {
                mac,
                session,
                worker_address,
                metadata
            }
        ),
        md.prop_map(Message::Metadata),
        prop::collection::vec(any::<u64>(), 0..20).prop_map(Message::Withdraw),
        prop::collection::vec(any::<u8>(), 0..300).prop_map(Message::Notify),
    ]
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(2000))]

    #[test]
    fn random_bytes_never_panic(bytes in prop::collection::vec(any::<u8>(), 0..2048)) {
        let _ = codec::decode(&bytes);
    }

    #[test]
    fn valid_messages_round_trip_and_every_prefix_is_refused(m in arb_message()) {
        let b = codec::encode(&m).unwrap();
        prop_assert_eq!(codec::decode(&b).unwrap(), m);
        for cut in 0..b.len() {
            prop_assert!(codec::decode(&b[..cut]).is_err());
        }
    }

    #[test]
    fn mutated_messages_never_panic(m in arb_message(), at in any::<prop::sample::Index>(), x in any::<u8>()) {
        let mut b = codec::encode(&m).unwrap();
        let i = at.index(b.len());
        b[i] ^= x;
        if let Ok(d) = codec::decode(&b) {
            // Whatever decodes re-encodes to the same bytes (no hidden state).
            prop_assert_eq!(codec::encode(&d).unwrap(), b);
        }
    }
}
