//! Real UCX over 127.0.0.1: two workers of one process, put/get, keys, bounds, AM, errors.

mod common;

use std::time::{Duration, Instant};

use common::{pattern, BgProgress, Pair, T};
use gdpath_ucx::{
    AmPart, Context, Endpoint, ErrorMode, Features, MemHandle, MemType, RegionDesc, RemoteRegion,
    Ucx, UcxCfg, UcxError, Worker, AM_HOLD_MIN, MAX_PACKED_RKEY,
};

use gdpath_testkit::ucx_serial as serial;

const SIZES: [usize; 7] = [1, 7, 4096, 65_537, 1 << 20, 5 << 20, 16 << 20];

/// Puts each size from client memory into server memory at an odd offset, flushes, and
/// compares byte for byte, including the bytes around the target range.
fn put_get_roundtrip(transports: Option<&str>, mode: ErrorMode) {
    let p = Pair::new_with(transports, mode);
    let max = *SIZES.iter().max().unwrap();
    let off = 3usize;
    let server_mem = MemHandle::from_vec(&p.ctx, vec![0xEE; max + 2 * off]).unwrap();
    let client_mem = MemHandle::alloc(&p.ctx, max + off, MemType::Host).unwrap();
    let region = RemoteRegion::new(&p.client_ep, &server_mem.describe().unwrap()).unwrap();
    for (i, &n) in SIZES.iter().enumerate() {
        // put
        let data = pattern(n, i as u64 + 1);
        client_mem.write(off, &data).unwrap();
        server_mem.write(0, &vec![0xEE; max + 2 * off]).unwrap();
        p.client_ep
            .put(&client_mem, off, &region, off as u64, n)
            .unwrap()
            .wait(T)
            .unwrap();
        p.client_ep.flush(T).unwrap();
        let mut got = vec![0u8; n + 2 * off];
        server_mem.read(0, &mut got).unwrap();
        assert_eq!(
            &got[..off],
            &[0xEE; 3],
            "bytes before the put changed (n={n})"
        );
        assert!(
            got[off..off + n] == data[..],
            "put of {n} bytes not byte-exact"
        );
        assert_eq!(
            &got[off + n..],
            &[0xEE; 3],
            "bytes after the put changed (n={n})"
        );

        // get
        let src = pattern(n, 1000 + i as u64);
        server_mem.write(off, &src).unwrap();
        client_mem.write(0, &vec![0u8; n + off]).unwrap();
        p.client_ep
            .get(&client_mem, off, &region, off as u64, n)
            .unwrap()
            .wait(T)
            .unwrap();
        let mut back = vec![0u8; n];
        client_mem.read(off, &mut back).unwrap();
        assert!(back == src, "get of {n} bytes not byte-exact");
    }
}

#[test]
fn put_get_tcp_1b_to_16mib_byte_exact() {
    let _serial = serial();
    put_get_roundtrip(Some("tcp"), ErrorMode::Peer);
}

#[test]
fn put_get_default_transports_1b_to_16mib_byte_exact() {
    let _serial = serial();
    put_get_roundtrip(None, ErrorMode::Peer);
}

#[test]
fn put_get_shared_memory_1b_to_16mib_byte_exact() {
    let _serial = serial();
    // Without peer error handling UCX may pick shared memory (see ErrorMode).
    put_get_roundtrip(None, ErrorMode::None);
}

#[test]
fn rkey_pack_unpack_and_checked_bounds() {
    let _serial = serial();
    let p = Pair::new(Some("tcp"));
    let server_mem = MemHandle::from_vec(&p.ctx, vec![0x11; 4096]).unwrap();
    let desc = server_mem.describe().unwrap();
    assert_eq!((desc.base, desc.len), (server_mem.addr(), 4096));
    assert!(!desc.rkey.as_bytes().is_empty());
    // Packing twice gives a key for the same mapping; both unpack.
    let again = server_mem.pack_rkey().unwrap();
    let region = RemoteRegion::new(&p.client_ep, &desc).unwrap();
    let _region2 = RemoteRegion::new(
        &p.client_ep,
        &RegionDesc {
            rkey: again,
            ..desc.clone()
        },
    )
    .unwrap();

    // Remote bounds: exactly the end is fine, one past is refused before posting.
    assert_eq!(region.check(4095, 1).unwrap(), desc.base + 4095);
    let local = MemHandle::alloc(&p.ctx, 8192, MemType::Host).unwrap();
    local.write(0, &[0x22; 8192]).unwrap();
    for (off, len) in [(4095u64, 2usize), (4096, 1), (0, 4097), (u64::MAX, 1)] {
        match p.client_ep.put(&local, 0, &region, off, len) {
            Err(UcxError::RemoteOutOfBounds { region_len, .. }) => assert_eq!(region_len, 4096),
            other => panic!("put at {off}+{len} gave {other:?}"),
        }
    }
    match p.client_ep.get(&local, 8190, &region, 0, 4) {
        Err(UcxError::LocalOutOfBounds { region_len, .. }) => assert_eq!(region_len, 8192),
        other => panic!("local overrun gave {other:?}"),
    }
    p.client_ep.flush(T).unwrap();
    let mut after = vec![0u8; 4096];
    server_mem.read(0, &mut after).unwrap();
    assert!(
        after.iter().all(|&b| b == 0x11),
        "a refused put touched memory"
    );

    // Untrusted key bytes: empty and oversized are refused; a wrapping region too.
    assert!(matches!(
        RemoteRegion::new(
            &p.client_ep,
            &RegionDesc {
                rkey: gdpath_ucx::PackedRkey(vec![]),
                ..desc.clone()
            }
        ),
        Err(UcxError::InvalidArgument(_))
    ));
    assert!(matches!(
        gdpath_ucx::RemoteKey::unpack(&p.client_ep, &vec![0u8; MAX_PACKED_RKEY + 1]),
        Err(UcxError::InvalidArgument(_))
    ));
    assert!(matches!(
        RemoteRegion::new(
            &p.client_ep,
            &RegionDesc {
                base: u64::MAX - 10,
                ..desc.clone()
            }
        ),
        Err(UcxError::InvalidArgument(_))
    ));

    // A key unpacked on one endpoint cannot be used on another.
    match p.server_ep.put(&local, 0, &region, 0, 1) {
        Err(UcxError::InvalidArgument(m)) => assert!(m.contains("another endpoint"), "{m}"),
        other => panic!("foreign key gave {other:?}"),
    }
}

#[test]
fn active_message_round_trip() {
    let _serial = serial();
    let p = Pair::new(Some("tcp"));
    p.server.am_register(7).unwrap();
    p.client.am_register(8).unwrap();
    let payload = pattern(100_000, 9);
    p.client_ep
        .am_send(7, b"hello", &payload)
        .unwrap()
        .wait(T)
        .unwrap();
    // The background thread progresses the server; poll its queue.
    let start = Instant::now();
    let msg = loop {
        if let Some(m) = p.server.am_try_recv(7) {
            break m;
        }
        assert!(start.elapsed() < T, "no active message within {T:?}");
        std::thread::sleep(Duration::from_millis(1));
    };
    assert_eq!(msg.id, 7);
    assert_eq!(msg.header, b"hello");
    assert!(*msg.data == payload[..]);
    assert_eq!(msg.reply_ep, Some(p.server_ep.id()));

    p.server_ep
        .am_send(8, b"", b"pong")
        .unwrap()
        .wait(T)
        .unwrap();
    let reply = p.client.am_recv(8, T).unwrap();
    assert_eq!(
        (reply.header.as_slice(), &*reply.data),
        (&b""[..], &b"pong"[..])
    );
    assert_eq!(reply.reply_ep, Some(p.client_ep.id()));
    assert_eq!(p.server.am_dropped() + p.client.am_dropped(), 0);

    let big = vec![0u8; gdpath_ucx::AM_MAX_MESSAGE];
    assert!(matches!(
        p.client_ep.am_send(7, b"x", &big),
        Err(UcxError::MessageTooLarge { .. })
    ));
    assert!(matches!(
        p.client.am_recv(99, Duration::from_millis(50)),
        Err(UcxError::Timeout { .. })
    ));
}

/// Waits for the next message to `id` on a worker the background thread progresses.
fn next_message(w: &Worker, id: u16) -> gdpath_ucx::AmMessage {
    let start = Instant::now();
    loop {
        if let Some(m) = w.am_try_recv(id) {
            return m;
        }
        assert!(start.elapsed() < T, "no active message within {T:?}");
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[test]
fn active_message_gathered_from_mappings_arrives_whole() {
    let _serial = serial();
    let p = Pair::new(Some("tcp"));
    p.server.am_register(7).unwrap();
    let a = MemHandle::from_vec(&p.ctx, pattern(120_000, 1)).unwrap();
    let b = MemHandle::from_vec(&p.ctx, pattern(5_000, 2)).unwrap();
    let mut a_bytes = vec![0u8; 120_000];
    a.read(0, &mut a_bytes).unwrap();
    let mut b_bytes = vec![0u8; 5_000];
    b.read(0, &mut b_bytes).unwrap();
    let part = |mem: &MemHandle, offset, len| AmPart {
        mem: mem.clone(),
        offset,
        len,
    };
    // Parts from two mappings, one of them twice, an empty one, behind a head: over 64 KiB,
    // which UCX's tcp sends in fragments and assembles at the receiver.
    let parts = [
        part(&a, 3, 100_000),
        part(&b, 0, 5_000),
        part(&a, 0, 0),
        part(&a, 119_990, 10),
    ];
    p.client_ep
        .am_send_parts(7, b"head".to_vec(), &parts)
        .unwrap()
        .wait(T)
        .unwrap();
    let msg = next_message(&p.server, 7);
    let mut want = b"head".to_vec();
    want.extend_from_slice(&a_bytes[3..100_003]);
    want.extend_from_slice(&b_bytes);
    want.extend_from_slice(&a_bytes[119_990..]);
    assert!(msg.header.is_empty());
    assert_eq!(msg.data.len(), want.len());
    assert!(*msg.data == want[..], "gathered payload not byte-exact");
    // UCX hands an assembled message over for keeping (UCP_AM_RECV_ATTR_FLAG_DATA): the
    // receiver's copy and allocation per message that AM_HOLD_MIN avoids.
    assert!(
        msg.data.is_held(),
        "an assembled 105 KB payload was copied, not held"
    );

    // A short message is always copied out (only large payloads are held).
    p.client_ep
        .am_send_parts(7, Vec::new(), &[part(&a, 10, AM_HOLD_MIN - 1)])
        .unwrap()
        .wait(T)
        .unwrap();
    let small = next_message(&p.server, 7);
    assert!(*small.data == a_bytes[10..10 + AM_HOLD_MIN - 1]);
    assert!(!small.data.is_held());
    // A clone is a copy with the same bytes.
    let copy = msg.clone();
    assert!(!copy.data.is_held() && copy == msg);

    // Bounds, and the total bound, are checked before anything is sent.
    assert!(matches!(
        p.client_ep
            .am_send_parts(7, Vec::new(), &[part(&b, 4_999, 2)]),
        Err(UcxError::LocalOutOfBounds { .. })
    ));
    let big = MemHandle::alloc(&p.ctx, gdpath_ucx::AM_MAX_MESSAGE, MemType::Host).unwrap();
    assert!(matches!(
        p.client_ep
            .am_send_parts(7, vec![1], &[part(&big, 0, gdpath_ucx::AM_MAX_MESSAGE)]),
        Err(UcxError::MessageTooLarge { .. })
    ));
    assert_eq!(p.server.am_dropped(), 0);
}

#[test]
fn held_payloads_outlive_or_precede_their_worker_safely() {
    let _serial = serial();
    let p = Pair::new(Some("tcp"));
    p.server.am_register(7).unwrap();
    const N: usize = 100_000;
    let held_before = gdpath_ucx::am_held_live();
    let src = MemHandle::from_vec(&p.ctx, pattern(N, 5)).unwrap();
    let whole = AmPart {
        mem: src.clone(),
        offset: 0,
        len: N,
    };
    for _ in 0..3 {
        p.client_ep
            .am_send_parts(7, Vec::new(), std::slice::from_ref(&whole))
            .unwrap()
            .wait(T)
            .unwrap();
    }
    let first = next_message(&p.server, 7);
    // One taken and dropped while its worker lives; one left queued.
    drop(next_message(&p.server, 7));
    let start = Instant::now();
    while p.server.am_queued(7) < 1 {
        assert!(start.elapsed() < T, "third message did not arrive");
        std::thread::sleep(Duration::from_millis(1));
    }
    let mut want = vec![0u8; N];
    src.read(0, &mut want).unwrap();
    assert!(*first.data == want[..]);
    assert!(
        first.data.is_held(),
        "the case under test is a held payload"
    );
    // Drop every handle on the server worker while one message is queued and one is held
    // here: the held one keeps the worker alive; the queued one goes back to UCX when the
    // worker does, after `first` is dropped.
    let Pair {
        client_ep,
        server_ep,
        bg,
        listener,
        client,
        server,
        ctx,
        ..
    } = p;
    drop(bg);
    drop((
        client_ep, server_ep, listener, client, server, src, whole, ctx,
    ));
    assert!(
        *first.data == want[..],
        "a held payload changed before it was dropped"
    );
    // Two are held still: `first`, and the queued one that its worker (alive through `first`)
    // gives back when it goes.
    assert_eq!(gdpath_ucx::am_held_live(), held_before + 2);
    drop(first);
    assert_eq!(
        gdpath_ucx::am_held_live(),
        held_before,
        "a held payload was not given back to UCX"
    );
}

#[test]
fn connect_to_closed_port_is_a_typed_error_in_bounded_time() {
    let _serial = serial();
    // A port nobody listens on: bind, note the port, close.
    let port = {
        let l = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
        l.local_addr().unwrap().port()
    };
    let ctx = Context::new(&common::cfg(Some("tcp"))).unwrap();
    let w = Worker::new(&ctx).unwrap();
    let start = Instant::now();
    let r = Endpoint::connect(&w, format!("127.0.0.1:{port}").parse().unwrap())
        .and_then(|ep| ep.wait_connected(T));
    let took = start.elapsed();
    match r {
        Err(UcxError::EndpointFailed { status, peer }) => {
            assert!(status.is_peer_failure(), "{status}");
            assert!(peer.ends_with(&format!(":{port}")), "{peer}");
        }
        Err(UcxError::Status { status, .. }) => assert!(status.is_peer_failure(), "{status}"),
        other => panic!("connect to a closed port gave {other:?}"),
    }
    assert!(took < T, "took {took:?}");
    eprintln!("connect to closed port failed after {took:?}");
}

#[test]
fn peer_endpoint_closed_surfaces_as_error() {
    let _serial = serial();
    let p = Pair::new(Some("tcp"));
    let server_mem = MemHandle::alloc(&p.ctx, 4096, MemType::Host).unwrap();
    let region = RemoteRegion::new(&p.client_ep, &server_mem.describe().unwrap()).unwrap();
    let local = MemHandle::alloc(&p.ctx, 4096, MemType::Host).unwrap();
    p.client_ep
        .put(&local, 0, &region, 0, 64)
        .unwrap()
        .wait(T)
        .unwrap();
    p.client_ep.flush(T).unwrap();

    let Pair {
        client_ep,
        server_ep,
        bg,
        ..
    } = p;
    // The server drops its endpoint: flush, then force close; the client must find out.
    drop(server_ep);
    // Keep posting until the client side learns the peer is gone.
    let start = Instant::now();
    let err = loop {
        let r = client_ep
            .put(&local, 0, &region, 0, 64)
            .and_then(|r| r.wait(T))
            .and_then(|()| client_ep.flush(T));
        if let Err(e) = r {
            break e;
        }
        assert!(start.elapsed() < T, "peer close not detected within {T:?}");
        client_ep.worker().progress();
        std::thread::sleep(Duration::from_millis(5));
    };
    assert!(
        matches!(err, UcxError::EndpointFailed { .. }),
        "expected EndpointFailed, got {err:?}"
    );
    assert!(client_ep.failure().is_some());
    eprintln!("peer close detected after {:?}: {err}", start.elapsed());
    drop(region);
    drop(client_ep);
    drop(bg);
}

#[test]
fn graceful_close_with_both_sides_progressing() {
    let _serial = serial();
    let p = Pair::new(Some("tcp"));
    let Pair {
        client_ep,
        server_ep,
        client,
        bg,
        ..
    } = p;
    let client_bg = BgProgress::new(&client);
    let start = Instant::now();
    server_ep.close(T).unwrap();
    eprintln!("graceful close took {:?}", start.elapsed());
    drop(client_bg);
    drop(client_ep);
    drop(bg);
}

#[test]
fn connect_by_worker_address() {
    let _serial = serial();
    let ctx = Context::new(&common::cfg(Some("tcp"))).unwrap();
    let a = Worker::new(&ctx).unwrap();
    let b = Worker::new(&ctx).unwrap();
    let addr = b.address().unwrap();
    assert!(!addr.0.is_empty());
    let _bg = BgProgress::new(&b);
    let ep = Endpoint::connect_address(&a, &addr).unwrap();
    let target = MemHandle::from_vec(&ctx, vec![0; 1024]).unwrap();
    let src = MemHandle::from_vec(&ctx, pattern(1024, 5)).unwrap();
    let region = RemoteRegion::new(&ep, &target.describe().unwrap()).unwrap();
    ep.put(&src, 0, &region, 0, 1024).unwrap().wait(T).unwrap();
    ep.flush(T).unwrap();
    let mut got = vec![0u8; 1024];
    target.read(0, &mut got).unwrap();
    assert_eq!(got, pattern(1024, 5));
}

#[test]
fn memory_handles_check_type_and_bounds() {
    let _serial = serial();
    let ctx = Context::new(&common::cfg(None)).unwrap();
    assert!(matches!(
        MemHandle::alloc(&ctx, 0, MemType::Host),
        Err(UcxError::InvalidArgument(_))
    ));
    let m = MemHandle::from_vec(&ctx, pattern(100, 3)).unwrap();
    assert_eq!(m.len(), 100);
    let mut out = vec![0u8; 100];
    m.read(0, &mut out).unwrap();
    assert_eq!(
        out,
        pattern(100, 3),
        "from_vec must keep the buffer's bytes"
    );
    assert!(matches!(
        m.write(99, &[1, 2]),
        Err(UcxError::LocalOutOfBounds {
            offset: 99,
            len: 2,
            region_len: 100
        })
    ));
    assert!(matches!(
        m.read(usize::MAX, &mut [0u8; 1]),
        Err(UcxError::LocalOutOfBounds { .. })
    ));
    if ctx.supports(MemType::Cuda).unwrap() {
        eprintln!("skipped the no-CUDA check: this UCX supports CUDA memory");
    } else {
        match MemHandle::alloc(&ctx, 4096, MemType::Cuda) {
            Err(UcxError::MemTypeUnsupported(MemType::Cuda, have)) => {
                assert!(have.contains("host"), "{have}")
            }
            other => panic!("CUDA alloc without CUDA support gave {other:?}"),
        }
    }
}

#[test]
fn worker_wait_wakes_on_signal_and_times_out() {
    let _serial = serial();
    let ctx = Context::new(&UcxCfg {
        features: Features::RMA | Features::AM | Features::WAKEUP,
        ..common::cfg(Some("tcp"))
    })
    .unwrap();
    let w = Worker::new(&ctx).unwrap();
    while w.progress() > 0 {}
    let start = Instant::now();
    let _ = w.wait(Duration::from_millis(100)).unwrap();
    assert!(start.elapsed() < Duration::from_secs(5));
    w.signal().unwrap();
    let start = Instant::now();
    assert!(
        w.wait(Duration::from_secs(5)).unwrap(),
        "signal did not wake the worker"
    );
    assert!(start.elapsed() < Duration::from_secs(5));

    // Without WAKEUP the call is refused with a typed error.
    let plain = Worker::new(&Context::new(&common::cfg(Some("tcp"))).unwrap()).unwrap();
    assert!(matches!(
        plain.wait(Duration::from_millis(1)),
        Err(UcxError::FeatureMissing("WAKEUP"))
    ));
}

#[test]
fn missing_library_is_a_typed_error_naming_it() {
    let _serial = serial();
    let path = "/nonexistent/gdpath-test/libucp.so.0";
    let err = Ucx::load_from(path).unwrap_err();
    let UcxError::LibraryMissing { library, .. } = &err else {
        panic!("expected LibraryMissing, got {err:?}");
    };
    assert_eq!(library, path);
    let msg = err.to_string();
    assert!(
        msg.contains(path) && msg.contains("libucx0") && msg.contains("libucx-cu13"),
        "{msg}"
    );
    // The loader's own reason is kept (dlerror's text, or the check made before it).
    assert!(msg.to_lowercase().contains("no such file"), "{msg}");
}

/// A setting UCX refuses (a size that does not parse) is an error in `extra` and skipped in
/// `defaults`. (UCX 1.13 accepts names it does not know: it keeps them for transports, so a
/// default for a transport this UCX was built without, e.g. cuda_ipc's, is harmless.)
#[test]
fn refused_defaults_are_skipped_refused_extras_are_errors() {
    let _serial = serial();
    let bad = || vec![("RNDV_THRESH".to_owned(), "not-a-size".to_owned())];
    let refused = Context::new(&UcxCfg {
        extra: bad(),
        ..common::cfg(Some("tcp"))
    });
    assert!(
        matches!(refused, Err(UcxError::Status { .. })),
        "a malformed extra setting was accepted: {refused:?}"
    );
    let unknown = vec![("NO_SUCH_GDPATH_SETTING".to_owned(), "1".to_owned())];
    for defaults in [bad(), unknown] {
        let ctx = Context::new(&UcxCfg {
            defaults: defaults.clone(),
            ..common::cfg(Some("tcp"))
        })
        .unwrap_or_else(|e| panic!("default {defaults:?} stopped the context: {e}"));
        Worker::new(&ctx).unwrap();
    }
}

/// A failed call names the libucp function that was loaded and called: a context whose
/// transports UCX does not have fails in `ucp_init_version` (what the header inline `ucp_init`
/// calls), and a setting UCX refuses in `ucp_config_modify`.
#[test]
fn failed_calls_name_the_symbol_loaded() {
    let _serial = serial();
    let none = Context::new(&common::cfg(Some("no_such_transport")));
    let Err(UcxError::Status { op, status }) = &none else {
        panic!("a context without transports was made: {none:?}");
    };
    assert_eq!(*op, "ucp_init_version", "{none:?}");
    assert!(!status.is_ok(), "{status}");
    let refused = Context::new(&UcxCfg {
        extra: vec![("RNDV_THRESH".to_owned(), "not-a-size".to_owned())],
        ..common::cfg(Some("tcp"))
    });
    assert!(
        matches!(
            refused,
            Err(UcxError::Status {
                op: "ucp_config_modify",
                ..
            })
        ),
        "{refused:?}"
    );
}

/// A retired endpoint (`Endpoint::retire`) drops at once even though its peer never progresses
/// again and it has sends of its own not flushed; the worker's progress finishes the close.
/// A flush that the silent peer cannot complete is given up on at once too (its request's drop
/// does not wait `DROP_WAIT`).
#[test]
fn a_retired_endpoint_drops_at_once_though_its_peer_is_silent() {
    let _serial = serial();
    let p = Pair::new(Some("tcp"));
    // Dropped here; the rest of the pair at the end (the client's endpoint first).
    let server_ep = p.server_ep;
    // The client never progresses from here on: whatever needs its answer never gets it.
    p.client.am_register(8).unwrap();
    server_ep
        .am_send(8, b"", &pattern(64 << 10, 3))
        .unwrap()
        .wait(T)
        .unwrap();
    let flush = server_ep.flush_nb().unwrap();
    let start = Instant::now();
    drop(flush);
    let took = start.elapsed();
    assert!(
        took < Duration::from_millis(500),
        "dropping a flush took {took:?}"
    );
    server_ep.retire();
    let start = Instant::now();
    drop(server_ep);
    let took = start.elapsed();
    assert!(took < Duration::from_millis(500), "dropping took {took:?}");
    // The server's background progress finishes the close.
    let start = Instant::now();
    while p.server.closes_pending() > 0 {
        assert!(start.elapsed() < T, "the close never finished");
        std::thread::sleep(Duration::from_millis(1));
    }
}
