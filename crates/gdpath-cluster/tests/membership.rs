//! Membership against a real etcd (Debian's etcd-server, started per test on loopback ports):
//! names claimed once, resolution with a deadline, watches, lease expiry, etcd restarted,
//! untrusted records, auth (users, client certificates), records updated in place (the doctor's
//! verdicts), exported regions recorded as the engine offers them, and a peer found by name
//! whose record goes.

mod common;
use common::{net_agent, Etcd};
use gdpath::net::Token;
use gdpath::{HostBuffer, Memory, TransferRequest};
use gdpath_cluster::{
    AgentRecord, Cluster, ClusterError, ClusterEvent, ClusterPeer, ClusterUrl, MemberEvent,
    Membership, RegionKind, RegionRecord,
};
use std::time::{Duration, Instant};

fn cluster(e: &Etcd, ns: &str) -> Cluster {
    let url: ClusterUrl = e.url(ns).parse().unwrap();
    Cluster::connect(&url).unwrap()
}

fn record(name: &str) -> AgentRecord {
    AgentRecord::new(name, "127.0.0.1:1".parse().unwrap()).unwrap()
}

const TTL: Duration = Duration::from_secs(2);

/// An agent named `name` (its engine name proving its incarnation) exporting `bytes` of host
/// memory, serving on loopback with `token` and published: (agent, server, export id, record,
/// membership).
fn publish_serving(
    c: &Cluster,
    name: &str,
    bytes: &[u8],
    token: &Token,
) -> (
    gdpath::Agent,
    gdpath::net::Server,
    u64,
    AgentRecord,
    Membership,
) {
    let mut rec = record(name);
    let server = net_agent(&rec.engine_name());
    let exported = server
        .register(Memory::host(HostBuffer::from_slice(bytes)))
        .unwrap();
    let id = server.export(&exported).unwrap();
    let srv = server
        .serve("127.0.0.1:0".parse().unwrap(), token.clone())
        .unwrap();
    rec.addr = srv.local_addr().to_string();
    let m = Membership::join(c, rec.clone(), TTL).unwrap();
    (server, srv, id, rec, m)
}

/// The next event that is not a snapshot of something else, within `t`.
fn next_matching(
    w: &gdpath_cluster::Watch,
    t: Duration,
    f: impl Fn(&ClusterEvent) -> bool,
) -> Option<ClusterEvent> {
    let end = Instant::now() + t;
    while Instant::now() < end {
        if let Some(e) = w.next(Duration::from_millis(50)) {
            if f(&e) {
                return Some(e);
            }
        }
    }
    None
}

#[test]
fn a_second_agent_claiming_a_taken_name_is_refused() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "claims");
    let first = record("prefill-0");
    let m = Membership::join(&c, first.clone(), TTL).unwrap();
    let err = Membership::join(&c, record("prefill-0"), TTL)
        .err()
        .expect("the second claim must be refused");
    match &err {
        ClusterError::NameTaken { incarnation, .. } => {
            assert_eq!(incarnation, first.incarnation.as_str())
        }
        other => panic!("expected NameTaken, got {other}"),
    }
    assert_eq!(err.kind(), "name_taken");
    // The holder's record is untouched, and once it leaves the name is free at once.
    let (r, _) = c.resolve("prefill-0", Duration::ZERO).unwrap();
    assert_eq!(r.incarnation, first.incarnation);
    m.leave().unwrap();
    Membership::join(&c, record("prefill-0"), TTL).unwrap();
}

#[test]
fn resolution_waits_for_the_record_and_gives_up_at_its_deadline() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "resolve");
    let t0 = Instant::now();
    let err = c
        .resolve("decode-3", Duration::from_millis(300))
        .unwrap_err();
    assert_eq!(err.kind(), "not_found", "{err}");
    assert!(t0.elapsed() < Duration::from_secs(3), "{:?}", t0.elapsed());
    let c2 = c.clone();
    let joiner = std::thread::spawn(move || {
        std::thread::sleep(Duration::from_millis(300));
        Membership::join(&c2, record("decode-3"), TTL).unwrap()
    });
    let (r, _) = c.resolve("decode-3", Duration::from_secs(10)).unwrap();
    assert_eq!(r.name, "decode-3");
    let m = joiner.join().unwrap();
    assert_eq!(r.incarnation, m.record().incarnation);
}

#[test]
fn a_watch_sees_join_leave_and_a_lease_that_expires_within_its_ttl() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "watch");
    let w = c.watch().unwrap();
    let a = Membership::join(&c, record("a"), TTL).unwrap();
    let b = Membership::join(&c, record("b"), TTL).unwrap();
    for name in ["a", "b"] {
        next_matching(
            &w,
            Duration::from_secs(5),
            |e| matches!(e, ClusterEvent::Joined(r) if r.name == name),
        )
        .unwrap_or_else(|| panic!("no join of {name}"));
    }
    // Kept alive past several TTLs.
    std::thread::sleep(TTL * 2);
    assert_eq!(c.list().unwrap().len(), 2);
    // A clean leave: seen at once.
    a.leave().unwrap();
    next_matching(
        &w,
        Duration::from_secs(2),
        |e| matches!(e, ClusterEvent::Left { name, .. } if name == "a"),
    )
    .expect("a's leave");
    // A crash (keep-alives stop, nothing deleted): gone within the TTL plus etcd's expiry
    // check (it scans leases every 500 ms).
    let inc = b.record().incarnation.to_string();
    let t0 = Instant::now();
    b.abandon();
    let left = next_matching(
        &w,
        TTL + Duration::from_secs(3),
        |e| matches!(e, ClusterEvent::Left { name, .. } if name == "b"),
    )
    .expect("b's lease must expire");
    assert!(
        matches!(left, ClusterEvent::Left { incarnation: Some(i), .. } if i == inc),
        "the leave names the incarnation that left"
    );
    assert!(
        t0.elapsed() <= TTL + Duration::from_secs(2),
        "{:?}",
        t0.elapsed()
    );
}

#[test]
fn the_record_comes_back_after_etcd_is_killed_and_restarted() {
    let Some(mut e) = Etcd::start() else { return };
    let c = cluster(&e, "restart");
    let m = Membership::join(&c, record("survivor"), TTL).unwrap();
    e.kill();
    // Down for longer than the TTL: the agent must assume its lease lost.
    std::thread::sleep(TTL * 2);
    e.restart();
    let end = Instant::now() + Duration::from_secs(20);
    let mut back = false;
    while Instant::now() < end && !back {
        back = c
            .resolve("survivor", Duration::from_millis(200))
            .is_ok_and(|(r, _)| r.incarnation == m.record().incarnation)
            && m.lease().is_some();
        std::thread::sleep(Duration::from_millis(200));
    }
    assert!(
        back,
        "the record must be published again after etcd returns"
    );
    let events = m.take_events();
    assert!(
        events.iter().any(|e| matches!(e, MemberEvent::Lost { .. })),
        "{events:?}"
    );
    assert!(
        events
            .iter()
            .any(|e| matches!(e, MemberEvent::Republished { .. })),
        "{events:?}"
    );
    // And kept alive afterwards, on the new lease.
    std::thread::sleep(TTL * 2);
    assert!(c.resolve("survivor", Duration::ZERO).is_ok());
}

#[test]
fn hostile_records_are_listed_as_invalid_and_never_resolved() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "hostile");
    e.ctl(&[
        "put",
        "/hostile/agents/evil",
        "{\"schema\":\"gdpath.agent/1\",\"name\":\"\u{1b}[2J\"}",
    ]);
    let big = "x".repeat(300 << 10);
    e.ctl_stdin(&["put", "/hostile/agents/big"], big.as_bytes());
    let l = c.list().unwrap();
    assert_eq!(l.len(), 2);
    assert!(l.iter().all(|x| x.record.is_err()));
    assert!(l
        .iter()
        .all(|x| !x.record.as_ref().unwrap_err().contains('\u{1b}')));
    let err = c.resolve("evil", Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), "invalid_record", "{err}");
    let err = c.resolve("big", Duration::ZERO).unwrap_err();
    assert!(err.to_string().contains("bytes; at most"), "{err}");
}

#[test]
fn etcd_with_auth_refuses_a_client_without_credentials() {
    let Some(e) = Etcd::start() else { return };
    let out = e.ctl(&["user", "add", "root:rootpw"]);
    assert!(out.contains("created"), "{out}");
    let out = e.ctl(&["auth", "enable"]);
    assert!(out.contains("Enabled"), "{out}");
    let anon: ClusterUrl = e.url("authns").parse().unwrap();
    let err = Cluster::connect(&anon)
        .and_then(|c| Membership::join(&c, record("x"), TTL).map(|_| ()))
        .unwrap_err();
    assert_eq!(err.kind(), "cluster_denied", "{err}");
    let url: ClusterUrl = e
        .url("authns")
        .replace("etcd://", "etcd://root:rootpw@")
        .parse()
        .unwrap();
    let c = Cluster::connect(&url).unwrap();
    let _m = Membership::join(&c, record("x"), TTL).unwrap();
    assert_eq!(c.resolve("x", Duration::ZERO).unwrap().0.name, "x");
}

#[test]
fn a_peer_found_by_name_moves_verified_bytes_and_fails_as_gone_when_its_record_goes() {
    let Some(e) = Etcd::start() else { return };
    let _serial = gdpath_testkit::ucx_serial();
    let c = cluster(&e, "peers");
    let token = Token::new("a-token-of-16-bytes-or-more").unwrap();
    let data: Vec<u8> = (0..1 << 20).map(|i| (i * 7 + 3) as u8).collect();
    let (_server, srv, id, rec, m) = publish_serving(&c, "prefill-0", &data, &token);

    let client = net_agent("decode-0");
    // Without the token the record is no use: reading etcd moves no byte.
    let err = ClusterPeer::connect(&c, &client, "prefill-0", Token::none(), Duration::ZERO)
        .err()
        .expect("no token, no connection");
    assert_eq!(err.kind(), "auth_failed", "{err}");
    let p = ClusterPeer::connect(&c, &client, "prefill-0", token.clone(), Duration::ZERO).unwrap();
    assert_eq!(p.record().incarnation, rec.incarnation);
    let remote = client.register(p.peer().memory(id).unwrap()).unwrap();
    let local = client
        .register(Memory::host(HostBuffer::zeroed(data.len())))
        .unwrap();
    let t = p
        .post(
            &client,
            TransferRequest::read(
                vec![local.desc(0, data.len() as u64)],
                vec![remote.desc(0, data.len() as u64)],
            ),
        )
        .unwrap();
    p.wait(t, Duration::from_secs(20)).unwrap();
    assert!(*local.host_view().unwrap() == data[..], "bytes differ");

    // The record goes (lease expired, as a partitioned or hung agent's would): the
    // connection still works at UCX's level, but the cluster says the peer is gone.
    let t0 = Instant::now();
    m.abandon();
    let end = Instant::now() + TTL + Duration::from_secs(3);
    while p.gone().is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    assert!(
        p.gone().is_some(),
        "gone within the TTL: {:?}",
        t0.elapsed()
    );
    let err = p
        .post(
            &client,
            TransferRequest::read(vec![local.desc(0, 4096)], vec![remote.desc(0, 4096)]),
        )
        .expect_err("a post to a gone peer fails at once");
    match &err {
        ClusterError::PeerGone { incarnation, .. } => {
            assert_eq!(incarnation, rec.incarnation.as_str())
        }
        other => panic!("expected PeerGone, got {other}"),
    }
    drop((remote, local, p, client, srv));
}

#[test]
fn a_stale_record_of_an_earlier_incarnation_is_never_used() {
    let Some(e) = Etcd::start() else { return };
    let _serial = gdpath_testkit::ucx_serial();
    let c = cluster(&e, "stale");
    let token = Token::new("a-token-of-16-bytes-or-more").unwrap();
    // The agent now listening is a new incarnation, but the record says the old one (a
    // restart on the same port before the old record went).
    let old = record("kv-0");
    let new = record("kv-0");
    let server = net_agent(&new.engine_name());
    let srv = server
        .serve("127.0.0.1:0".parse().unwrap(), token.clone())
        .unwrap();
    let mut stale = old.clone();
    stale.addr = srv.local_addr().to_string();
    let _m = Membership::join(&c, stale, TTL).unwrap();
    let client = net_agent("reader");
    let err = ClusterPeer::connect(&c, &client, "kv-0", token, Duration::ZERO)
        .err()
        .expect("the stale record must be refused");
    assert_eq!(err.kind(), "incarnation_mismatch", "{err}");
    assert!(err.to_string().contains(old.incarnation.as_str()), "{err}");
    drop(srv);
}

#[test]
fn transfers_between_connected_agents_continue_while_etcd_is_down_and_the_record_returns() {
    let Some(mut e) = Etcd::start() else { return };
    let _serial = gdpath_testkit::ucx_serial();
    let c = cluster(&e, "outage");
    let token = Token::new("a-token-of-16-bytes-or-more").unwrap();
    let (_server, srv, id, rec, m) = publish_serving(&c, "prefill-1", &[0; 1 << 20], &token);
    let client = net_agent("decode-1");
    let p = ClusterPeer::connect(&c, &client, "prefill-1", token, Duration::ZERO).unwrap();
    let remote = client.register(p.peer().memory(id).unwrap()).unwrap();
    let local = client
        .register(Memory::host(HostBuffer::zeroed(1 << 20)))
        .unwrap();
    let round = |seed: u8| {
        local.host_view().unwrap().fill(seed);
        let w = p
            .post(
                &client,
                TransferRequest::write(vec![local.desc(0, 1 << 20)], vec![remote.desc(0, 1 << 20)]),
            )
            .unwrap();
        p.wait(w, Duration::from_secs(10)).unwrap();
        local.host_view().unwrap().fill(0);
        let r = p
            .post(
                &client,
                TransferRequest::read(vec![local.desc(0, 1 << 20)], vec![remote.desc(0, 1 << 20)]),
            )
            .unwrap();
        p.wait(r, Duration::from_secs(10)).unwrap();
        assert!(local.host_view().unwrap().iter().all(|&b| b == seed));
    };
    round(1);
    e.kill();
    // etcd is down for two TTLs: transfers go on and the peer is not declared gone (etcd's
    // silence is not a verdict).
    let end = Instant::now() + TTL * 2;
    let mut n = 0u8;
    while Instant::now() < end {
        n = n.wrapping_add(1).max(2);
        round(n);
        assert!(p.gone().is_none());
        std::thread::sleep(Duration::from_millis(50));
    }
    e.restart();
    let end = Instant::now() + Duration::from_secs(20);
    while Instant::now() < end && m.lease().is_none() {
        round(3);
        std::thread::sleep(Duration::from_millis(100));
    }
    assert!(m.lease().is_some(), "re-published after etcd returned");
    let (back, _) = c.resolve("prefill-1", Duration::from_secs(5)).unwrap();
    assert_eq!(back.incarnation, rec.incarnation);
    round(4);
    assert!(
        p.gone().is_none(),
        "same incarnation re-published: not gone"
    );
    drop((remote, local, p, client, srv));
}

#[test]
fn a_lease_ttl_out_of_range_is_refused() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "ttl");
    for ttl in [Duration::from_secs(1), Duration::from_secs(3601)] {
        let err = Membership::join(&c, record("t"), ttl)
            .err()
            .expect("refused");
        assert_eq!(err.kind(), "config", "{err}");
    }
    assert!(c.list().unwrap().is_empty(), "nothing written");
}

#[test]
fn etcd_over_tls_is_reached_with_its_ca_and_refused_without_it() {
    let Some(e) = Etcd::start_tls() else { return };
    let mut url: ClusterUrl = e.url("tlsns").parse().unwrap();
    assert!(url.tls);
    // Without the CA the server's certificate is not trusted: nothing is read or written.
    let err = Cluster::connect(&url)
        .and_then(|c| c.list().map(|_| ()))
        .unwrap_err();
    assert_eq!(err.kind(), "cluster_unreachable", "{err}");
    url.ca_file = Some(e.dir.path().join("ca.pem"));
    let c = Cluster::connect(&url).unwrap();
    let _m = Membership::join(&c, record("secure"), TTL).unwrap();
    assert_eq!(
        c.resolve("secure", Duration::ZERO).unwrap().0.name,
        "secure"
    );
}

#[test]
fn a_peer_is_not_gone_when_an_agent_whose_name_it_prefixes_comes_and_goes() {
    let Some(e) = Etcd::start() else { return };
    let _serial = gdpath_testkit::ucx_serial();
    let c = cluster(&e, "prefixes");
    let token = Token::new("a-token-of-16-bytes-or-more").unwrap();
    let (_server, _srv, _id, _rec, _m) = publish_serving(&c, "decode-1", &[7u8; 4096], &token);
    let client = net_agent("prefill-0");
    let p = ClusterPeer::connect(&c, &client, "decode-1", token, Duration::ZERO).unwrap();
    // decode-10 and decode-1x are other agents: their keys start with decode-1's key, and
    // their joining, replacing or leaving says nothing of decode-1.
    let other = Membership::join(&c, record("decode-10"), TTL).unwrap();
    e.ctl(&["put", "/prefixes/agents/decode-1x", "not a record"]);
    e.ctl(&["del", "/prefixes/agents/decode-1x"]);
    other.leave().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    assert!(p.gone().is_none(), "{:?}", p.gone());
    p.check().unwrap();
}

#[test]
fn a_listing_and_a_watch_read_values_larger_than_one_etcd_response() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "huge");
    // Four values of 1.4 MiB each (etcd's default request limit is 1.5 MiB): together more
    // than the 4 MiB one gRPC response may carry.
    let big = vec![b'x'; 1400 << 10];
    for i in 0..4 {
        e.ctl_stdin(&["put", &format!("/huge/agents/big{i}")], &big);
    }
    let _m = Membership::join(&c, record("good"), TTL).unwrap();
    let l = c.list().unwrap();
    assert_eq!(l.len(), 5);
    assert_eq!(l.iter().filter(|x| x.record.is_err()).count(), 4);
    assert!(l
        .iter()
        .any(|x| x.record.as_ref().is_ok_and(|r| r.name == "good")));
    let w = c.watch().unwrap();
    let joined = next_matching(
        &w,
        Duration::from_secs(5),
        |ev| matches!(ev, ClusterEvent::Joined(r) if r.name == "good"),
    );
    assert!(
        joined.is_some(),
        "the watch's snapshot has the valid record"
    );
}

#[test]
fn etcd_with_client_certificate_auth_takes_a_signed_certificate_and_refuses_a_client_without() {
    let Some(e) = Etcd::start_tls_client_auth() else {
        return;
    };
    let d = e.dir.path();
    let ca = d.join("ca.pem").display().to_string();
    // The CA alone: etcd asks for a client certificate and none comes, so nothing is read.
    let url: ClusterUrl = format!("{}?ca={ca}", e.url("certs")).parse().unwrap();
    let err = Cluster::connect(&url)
        .and_then(|c| c.list().map(|_| ()))
        .unwrap_err();
    assert_eq!(err.kind(), "cluster_denied", "{err}");
    // The client certificate the same CA signed, named in the URL: joined and resolved.
    let (cert, key) = (d.join("client.pem"), d.join("client.key"));
    let url: ClusterUrl = format!(
        "{}?ca={ca}&cert={}&key={}",
        e.url("certs"),
        cert.display(),
        key.display()
    )
    .parse()
    .unwrap();
    assert_eq!(url.client_cert, Some((cert, key)));
    let c = Cluster::connect(&url).unwrap();
    let _m = Membership::join(&c, record("certified"), TTL).unwrap();
    assert_eq!(
        c.resolve("certified", Duration::ZERO).unwrap().0.name,
        "certified"
    );
}

#[test]
fn an_exported_region_is_recorded_as_the_engine_offers_it_to_peers() {
    let _serial = gdpath_testkit::ucx_serial();
    let server = net_agent("exporter");
    let len = 1usize << 20;
    let shared = server
        .register(Memory::host(HostBuffer::try_shared(len).unwrap()))
        .unwrap();
    let private = server
        .register(Memory::host(HostBuffer::zeroed(len)))
        .unwrap();
    let ids = [
        server.export(&shared).unwrap(),
        server.export(&private).unwrap(),
    ];
    // Before the first serve the exports wait for UCX: described as they will be published.
    let before = [&shared, &private].map(|r| RegionRecord::exported(&server, r).unwrap());
    for (rec, id) in before.iter().zip(ids) {
        assert_eq!(rec.id, id);
        assert_eq!(
            (rec.kind, rec.gpu, rec.len),
            (RegionKind::Host, None, len as u64)
        );
        assert!(!rec.cuda_ipc, "host memory has no CUDA IPC handle");
    }
    assert!(
        before[0].shm,
        "a sealed memfd is offered to agents of this node"
    );
    assert!(!before[1].shm, "private memory is reached through UCX only");
    let srv = server
        .serve("127.0.0.1:0".parse().unwrap(), Token::none())
        .unwrap();
    let after = [&shared, &private].map(|r| RegionRecord::exported(&server, r).unwrap());
    assert_eq!(after, before);
    // What a peer's handshake lists is what the record says.
    let client = net_agent("importer");
    let peer = client.connect(srv.local_addr()).unwrap();
    let mut seen: Vec<RegionRecord> = peer.regions().iter().map(RegionRecord::from).collect();
    seen.sort_by_key(|r| r.id);
    assert_eq!(seen, after);
    // A region not exported has no record.
    let lone = server
        .register(Memory::host(HostBuffer::zeroed(4096)))
        .unwrap();
    let err = RegionRecord::exported(&server, &lone).unwrap_err();
    assert_eq!(err.kind(), "config", "{err}");
}

/// The events of `m` until one matches `f`, within `t`.
fn member_event(
    m: &Membership,
    t: Duration,
    f: impl Fn(&MemberEvent) -> bool,
) -> Option<MemberEvent> {
    let end = Instant::now() + t;
    while Instant::now() < end {
        if let Some(e) = m.take_events().into_iter().find(|e| f(e)) {
            return Some(e);
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    None
}

#[test]
fn doctor_verdicts_are_an_update_on_the_same_lease_and_a_failed_or_slow_doctor_changes_nothing() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "verdicts");
    let w = c.watch().unwrap();
    let m = Membership::join(&c, record("doc"), TTL).unwrap();
    let (lease, inc) = (m.lease(), m.record().incarnation);
    assert!(
        m.record().topology.verdicts.is_empty(),
        "published at once, empty"
    );
    m.publish_verdicts(Duration::from_secs(10), || {
        Ok([("p2p", "unavailable"), ("gdr", "ok")]
            .map(|(a, s)| (a.to_owned(), s.to_owned()))
            .into())
    })
    .unwrap();
    let Some(ClusterEvent::Updated(r)) = next_matching(
        &w,
        Duration::from_secs(10),
        |ev| matches!(ev, ClusterEvent::Updated(r) if r.name == "doc"),
    ) else {
        panic!("watchers see the update")
    };
    assert_eq!(r.topology.verdicts["p2p"], "unavailable");
    assert_eq!(r.topology.verdicts["gdr"], "ok");
    assert_eq!(r.incarnation, inc);
    assert_eq!(m.lease(), lease, "the same lease");
    assert!(member_event(&m, Duration::from_secs(5), |e| matches!(
        e,
        MemberEvent::Updated { detail } if detail.contains("p2p unavailable")
    ))
    .is_some());
    // etcd's lease is still the one the record is on: it goes with it.
    let listed = c.list().unwrap();
    assert!(listed[0].ttl_left.is_some_and(|s| s > 0), "{listed:?}");

    // A doctor that fails, or answers after its bound, changes nothing and is told.
    m.publish_verdicts(Duration::from_secs(10), || Err("no driver".into()))
        .unwrap();
    let failed = member_event(&m, Duration::from_secs(5), |e| {
        matches!(e, MemberEvent::NotUpdated { .. })
    });
    assert!(
        matches!(&failed, Some(MemberEvent::NotUpdated { detail }) if detail.contains("no driver")),
        "{failed:?}"
    );
    m.publish_verdicts(Duration::from_millis(200), || {
        std::thread::sleep(Duration::from_secs(2));
        Ok([("gds".to_owned(), "ok".to_owned())].into())
    })
    .unwrap();
    let slow = member_event(&m, Duration::from_secs(5), |e| {
        matches!(e, MemberEvent::NotUpdated { .. })
    });
    assert!(
        matches!(&slow, Some(MemberEvent::NotUpdated { detail }) if detail.contains("within")),
        "{slow:?}"
    );
    std::thread::sleep(Duration::from_secs(2));
    let (now, _) = c.resolve("doc", Duration::ZERO).unwrap();
    assert_eq!(now.topology.verdicts, r.topology.verdicts);

    // An update keeps what names this start, and one that breaks a record's rules is refused.
    assert!(m
        .update(|r| r.incarnation = gdpath_cluster::Incarnation::new())
        .unwrap());
    assert_eq!(c.resolve("doc", Duration::ZERO).unwrap().0.incarnation, inc);
    let err = m
        .update(|r| r.topology.verdicts = (0..17).map(|i| (format!("a{i}"), "ok".into())).collect())
        .unwrap_err();
    assert_eq!(err.kind(), "invalid_record", "{err}");

    // After the agent left, a late update writes nothing back.
    let m2 = Membership::join(&c, record("late"), TTL).unwrap();
    m2.publish_verdicts(Duration::from_secs(10), || {
        std::thread::sleep(Duration::from_millis(500));
        Ok([("p2p".to_owned(), "ok".to_owned())].into())
    })
    .unwrap();
    m2.leave().unwrap();
    std::thread::sleep(Duration::from_secs(1));
    let err = c.resolve("late", Duration::ZERO).unwrap_err();
    assert_eq!(err.kind(), "not_found", "{err}");
}

/// A record of agent `name` whose first region's `kind` is `kind` (issue 41: an enum field is
/// quoted whole by serde's `unknown variant` error).
fn with_region_kind(name: &str, kind: &str) -> String {
    let mut v: serde_json::Value = serde_json::from_slice(&record(name).to_json()).unwrap();
    v["regions"] = serde_json::json!([{ "id": 1, "kind": kind, "len": 4096 }]);
    v.to_string()
}

#[test]
fn a_hostile_enum_field_is_escaped_and_bounded_by_list_resolve_watch_and_join() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "esc");
    let w = c.watch().unwrap();
    // OSC title, BEL, clear screen, an OSC 52 clipboard write, then 200 KB (the reviewer's).
    let kind = format!(
        "\u{1b}]0;PWNED\u{7}\u{1b}[2J\u{1b}]52;c;ZXZpbA==\u{7}{}",
        "Z".repeat(200_000)
    );
    e.ctl_stdin(
        &["put", "/esc/agents/m"],
        with_region_kind("m", &kind).as_bytes(),
    );
    let mut blink: serde_json::Value = serde_json::from_slice(&record("b").to_json()).unwrap();
    blink["schema"] = "\u{1b}[5mBLINK".into();
    e.ctl_stdin(&["put", "/esc/agents/b"], blink.to_string().as_bytes());
    let fine = |text: &str| {
        assert!(
            !text.chars().any(char::is_control),
            "raw control characters in {text:?}"
        );
        assert!(
            text.chars().count() < 600,
            "unbounded: {} characters",
            text.len()
        );
    };
    let listed = c.list().unwrap();
    assert_eq!(listed.len(), 2);
    for l in &listed {
        fine(l.record.as_ref().unwrap_err());
    }
    let err = c.resolve("m", Duration::ZERO).unwrap_err();
    let text = err.to_string();
    fine(&text);
    assert!(text.contains("unknown variant"), "{text}");
    assert!(text.contains("\\u{1b}]0;PWNED\\u{7}"), "{text}");
    assert!(text.ends_with('…'), "{text}");
    // Escaped once: `\u{1b}`, not `\\u{1b}`.
    let err = c.resolve("b", Duration::ZERO).unwrap_err().to_string();
    assert!(err.contains(r#"schema "\u{1b}[5mBLINK""#), "{err}");
    for _ in 0..2 {
        match next_matching(&w, Duration::from_secs(10), |e| {
            matches!(e, ClusterEvent::Invalid { .. })
        }) {
            Some(ClusterEvent::Invalid { key, detail }) => {
                fine(&key);
                fine(&detail);
                assert!(
                    !detail.contains("invalid record at"),
                    "said twice: {detail}"
                );
            }
            other => panic!("{other:?}"),
        }
    }
    // Claiming the name on another live lease: refused, bounded, and told how to clear it.
    let lease = e.lease_grant(60);
    e.ctl_stdin(
        &["put", "--lease", &lease, "/esc/agents/m"],
        with_region_kind("m", &kind).as_bytes(),
    );
    let err = Membership::join(&c, record("m"), TTL)
        .err()
        .expect("refused");
    let text = err.to_string();
    fine(&text);
    assert_eq!(err.kind(), "invalid_record");
    assert!(text.contains("etcdctl del /esc/agents/m"), "{text}");
}

#[test]
fn an_idle_watch_keeps_its_stream() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "idle");
    let w = c.watch().unwrap();
    // The reviewer saw `reconnected` every ~8 s on an idle namespace.
    let reconnect = next_matching(&w, Duration::from_secs(20), |e| {
        matches!(e, ClusterEvent::Reconnected { .. })
    });
    assert_eq!(reconnect, None);
    // Still live: a join is seen at once.
    let _m = Membership::join(&c, record("late"), TTL).unwrap();
    assert!(next_matching(&w, Duration::from_secs(5), |e| {
        matches!(e, ClusterEvent::Joined(r) if r.name == "late")
    })
    .is_some());
}

#[test]
fn a_record_written_over_by_hand_is_noticed_and_claimed_back_unless_another_lease_holds_it() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "hijack");
    let rec = record("a");
    let m = Membership::join(&c, rec.clone(), TTL).unwrap();
    let w = c.watch().unwrap();
    assert!(next_matching(&w, Duration::from_secs(5), |e| matches!(
        e,
        ClusterEvent::Joined(_)
    ))
    .is_some());
    // Another incarnation on no lease (`etcdctl put`): no live agent's, so taken back.
    let mut other: serde_json::Value = serde_json::from_slice(&rec.to_json()).unwrap();
    other["incarnation"] = "f".repeat(32).into();
    e.ctl_stdin(&["put", "/hijack/agents/a"], other.to_string().as_bytes());
    let seen = member_event(&m, TTL * 3, |e| matches!(e, MemberEvent::Replaced { .. }));
    assert!(seen.is_some(), "the member never noticed");
    assert!(member_event(&m, TTL * 5, |e| matches!(
        e,
        MemberEvent::Republished { .. }
    ))
    .is_some());
    let (back, _) = c.resolve("a", Duration::ZERO).unwrap();
    assert_eq!(back.incarnation, rec.incarnation);
    // Watchers: the change of incarnation is a leave and a join, both ways.
    let events: Vec<ClusterEvent> = std::iter::from_fn(|| w.next(Duration::from_secs(5)))
        .take(4)
        .collect();
    let incarnations: Vec<(String, String)> = events
        .iter()
        .map(|e| match e {
            ClusterEvent::Left { incarnation, .. } => ("left".into(), incarnation.clone().unwrap()),
            ClusterEvent::Joined(r) => ("joined".into(), r.incarnation.to_string()),
            other => panic!("{other:?} in {events:?}"),
        })
        .collect();
    let (ours, theirs) = (rec.incarnation.to_string(), "f".repeat(32));
    assert_eq!(
        incarnations,
        [
            ("left".into(), ours.clone()),
            ("joined".into(), theirs.clone()),
            ("left".into(), theirs),
            ("joined".into(), ours),
        ]
    );
    // On another live lease: told, never written over, taken once that lease ends.
    let lease = e.lease_grant(60);
    e.ctl_stdin(
        &["put", "--lease", &lease, "/hijack/agents/a"],
        other.to_string().as_bytes(),
    );
    assert!(member_event(&m, TTL * 3, |e| matches!(e, MemberEvent::Replaced { .. })).is_some());
    assert!(member_event(&m, TTL * 3, |e| matches!(e, MemberEvent::NameTaken { .. })).is_some());
    std::thread::sleep(TTL);
    let (held, _) = c.resolve("a", Duration::ZERO).unwrap();
    assert_eq!(held.incarnation.as_str(), "f".repeat(32));
    e.ctl(&["lease", "revoke", &lease]);
    assert!(member_event(&m, TTL * 5, |e| matches!(
        e,
        MemberEvent::Republished { .. }
    ))
    .is_some());
    assert_eq!(
        c.resolve("a", Duration::ZERO).unwrap().0.incarnation,
        rec.incarnation
    );
}

#[test]
fn an_invalid_record_on_no_lease_does_not_keep_its_name_and_a_nested_key_is_invalid() {
    let Some(e) = Etcd::start() else { return };
    let c = cluster(&e, "inv");
    e.ctl(&["put", "/inv/agents/c", "{not json"]);
    let _m = Membership::join(&c, record("c"), TTL).unwrap();
    assert_eq!(c.resolve("c", Duration::ZERO).unwrap().0.name, "c");
    // `/inv/agents/nested/x` holding a record named x is no agent x.
    let mut v: serde_json::Value = serde_json::from_slice(&record("x").to_json()).unwrap();
    v["name"] = "x".into();
    e.ctl_stdin(&["put", "/inv/agents/nested/x"], v.to_string().as_bytes());
    let l = c.list().unwrap();
    let nested = l.iter().find(|l| l.key == "/inv/agents/nested/x").unwrap();
    let why = nested.record.as_ref().unwrap_err();
    assert!(why.contains("not /NAMESPACE/agents/NAME"), "{why}");
}

#[test]
fn tls_files_that_hold_the_wrong_pem_are_named_at_connect() {
    let Some(e) = Etcd::start_tls() else { return };
    let dir = e.dir.path();
    let garbage = dir.join("garbage");
    std::fs::write(&garbage, b"root:$6$salt$hash:19000:0:99999:7:::\n").unwrap();
    let base = e.url("pem");
    let (ca, key) = (dir.join("ca.pem"), dir.join("ca.key"));
    for (query, file, what) in [
        (
            format!("ca={}", garbage.display()),
            &garbage,
            "no certificate",
        ),
        (format!("ca={}", key.display()), &key, "no certificate"),
        (
            format!("ca={0}&cert={1}&key={1}", ca.display(), ca.display()),
            &ca,
            "no private key",
        ),
        (
            format!("ca={0}&cert={1}&key={0}", ca.display(), key.display()),
            &key,
            "no certificate",
        ),
    ] {
        let url: ClusterUrl = format!("{base}?{query}").parse().unwrap();
        let err = Cluster::connect(&url).unwrap_err();
        assert_eq!(err.kind(), "cluster_url", "{err}");
        let text = err.to_string();
        assert!(
            text.contains(&format!("{} holds {what}", file.display())),
            "{query}: {text}"
        );
    }
}
