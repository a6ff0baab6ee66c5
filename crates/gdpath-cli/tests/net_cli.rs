//! `gdpath serve` and `gdpath bench net` as separate processes over 127.0.0.1
//! (`--devices lo`), a peer killed with SIGKILL on either side, tokens, and two network
//! namespaces joined by a veth pair (as root; skipped with a reason otherwise).

use gdpath::net::{ConnectOptions, NetConfig, Token};
use gdpath::{Agent, AgentConfig, DataPath, Error, HostBuffer, Memory, TransferRequest};
use gdpath_bench::fill_pattern;
use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

mod common;

use common::{bench_net, bin, json_ok, lo_serve, signal, Proc, VethPair};
const T: Duration = Duration::from_secs(30);

use gdpath_testkit::ucx_serial as serial;

/// A client agent over `lo` that leaves every remote pair to UCX (the transport these tests
/// are about: `gdpath serve` exports shared host memory, which a client on this node would
/// otherwise write itself).
fn client() -> Agent {
    client_with(false)
}

/// Posts `r` and waits for it.
fn done(a: &Agent, r: TransferRequest) -> gdpath::TransferReport {
    a.post(r).unwrap().wait().unwrap()
}

fn client_with(shared_memory: bool) -> Agent {
    let a = Agent::new(AgentConfig {
        name: "test".into(),
        ..AgentConfig::default()
    })
    .unwrap();
    a.enable_net(NetConfig {
        devices: Some("lo".into()),
        shared_memory,
        ..NetConfig::default()
    })
    .unwrap();
    a
}

fn pattern(len: usize, seed: u64) -> Vec<u8> {
    let mut v = vec![0u8; len];
    fill_pattern(&mut v, 0, seed);
    v
}

/// Writes then reads back `len` bytes of the peer's first region; asserts they match.
fn round_trip(agent: &Agent, addr: SocketAddr, len: usize, seed: u64) {
    let peer = agent.connect(addr).unwrap();
    let id = peer.regions()[0].id;
    let remote = agent.register(peer.memory(id).unwrap()).unwrap();
    let src = agent
        .register(Memory::host(HostBuffer::from_slice(&pattern(len, seed))))
        .unwrap();
    let dst = agent
        .register(Memory::host(HostBuffer::zeroed(len)))
        .unwrap();
    let n = len as u64;
    let rep = agent
        .post(TransferRequest::write(
            vec![src.desc(0, n)],
            vec![remote.desc(0, n)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    // Host writes over tcp go as the engine's packed writes (up to what this UCX's own put
    // does better); reads are UCX's get.
    let packed = n <= gdpath::net::packed_write_max().unwrap();
    assert_eq!(
        rep.pairs[0].path,
        DataPath::Ucx {
            transport: if packed { "tcp (packed writes)" } else { "tcp" }.into()
        }
    );
    let rep = agent
        .post(TransferRequest::read(
            vec![dst.desc(0, n)],
            vec![remote.desc(0, n)],
        ))
        .unwrap()
        .wait()
        .unwrap();
    assert_eq!(
        rep.pairs[0].path,
        DataPath::Ucx {
            transport: "tcp".into()
        }
    );
    assert!(
        dst.host_view().unwrap()[..] == pattern(len, seed)[..],
        "not byte-exact"
    );
}

#[test]
fn two_processes_over_loopback() {
    let _serial = serial();
    let (mut srv, addr) = lo_serve(&["--export", "host:8MiB"]);
    round_trip(&client(), addr, 8 << 20, 3);
    srv.wait_line("connected: test@127.0.0.1", T);
}

#[test]
fn a_peers_shared_host_memory_is_written_in_place_on_this_node() {
    let _serial = serial();
    let (mut srv, addr) = lo_serve(&["--export", "host:8MiB"]);
    let agent = client_with(true);
    let peer = agent.connect(addr).unwrap();
    let id = peer.regions()[0].id;
    let remote = agent.register(peer.memory(id).unwrap()).unwrap();
    let len = 8usize << 20;
    let n = len as u64;
    let src = agent
        .register(Memory::host(HostBuffer::from_slice(&pattern(len, 21))))
        .unwrap();
    let dst = agent
        .register(Memory::host(HostBuffer::zeroed(len)))
        .unwrap();
    let rep = done(
        &agent,
        TransferRequest::write(vec![src.desc(0, n)], vec![remote.desc(0, n)]),
    );
    assert_eq!(rep.pairs[0].path, DataPath::HostCopy, "{rep:?}");
    // Read back at an offset: the bytes are in the server's memory, not in a local copy.
    let rep = done(
        &agent,
        TransferRequest::read(
            vec![dst.desc(0, n - 4096)],
            vec![remote.desc(4096, n - 4096)],
        ),
    );
    assert_eq!(rep.pairs[0].path, DataPath::HostCopy);
    assert!(dst.host_view().unwrap()[..len - 4096] == pattern(len, 21)[4096..]);
    // A second client over UCX sees what the first wrote through shared memory.
    let other = client();
    let peer2 = other.connect(addr).unwrap();
    let remote2 = other.register(peer2.memory(id).unwrap()).unwrap();
    let dst2 = other
        .register(Memory::host(HostBuffer::zeroed(len)))
        .unwrap();
    let rep = done(
        &other,
        TransferRequest::read(vec![dst2.desc(0, n)], vec![remote2.desc(0, n)]),
    );
    assert!(matches!(rep.pairs[0].path, DataPath::Ucx { .. }), "{rep:?}");
    assert!(dst2.host_view().unwrap()[..] == pattern(len, 21)[..]);
    // A request with a notification goes through UCX, which delivers it after the writes.
    let rep = done(
        &agent,
        TransferRequest::write(vec![src.desc(0, 4096)], vec![remote.desc(0, 4096)])
            .notify(b"kv ready".to_vec()),
    );
    assert!(matches!(rep.pairs[0].path, DataPath::Ucx { .. }), "{rep:?}");
    srv.wait_line("notification from test@127.0.0.1", T);
}

#[test]
fn a_killed_exporter_of_shared_memory_fails_the_next_post() {
    let _serial = serial();
    let (srv, addr) = lo_serve(&["--export", "host:1MiB"]);
    let agent = client_with(true);
    let peer = agent.connect(addr).unwrap();
    let remote = agent
        .register(peer.memory(peer.regions()[0].id).unwrap())
        .unwrap();
    let src = agent
        .register(Memory::host(HostBuffer::from_slice(&pattern(4096, 2))))
        .unwrap();
    let write = || {
        agent
            .post(TransferRequest::write(
                vec![src.desc(0, 4096)],
                vec![remote.desc(0, 4096)],
            ))
            .and_then(|t| t.wait_timeout(T).map_err(|e| e.error))
    };
    assert_eq!(write().unwrap().pairs[0].path, DataPath::HostCopy);
    signal(&srv, libc::SIGKILL);
    // The shared mapping would take the bytes as if nothing happened; the closed control
    // connection says the peer is gone, and the post fails within the bound.
    let start = Instant::now();
    let err = loop {
        match write() {
            Err(e) => break e,
            Ok(rep) => {
                assert!(start.elapsed() < T, "still writing to a dead peer: {rep:?}");
                std::thread::sleep(Duration::from_millis(20));
            }
        }
    };
    assert!(
        matches!(err, Error::PeerFailed { .. } | Error::Refused { .. }),
        "{err:?}"
    );
    assert!(
        start.elapsed() < Duration::from_secs(5),
        "{:?}",
        start.elapsed()
    );
}

#[test]
fn kv_blocks_to_a_peers_shared_host_memory_are_verified() {
    let _serial = serial();
    let (_srv, addr) = lo_serve(&["--export", "host:64MiB"]);
    let out = Command::new(bin())
        .args([
            "bench",
            "kv",
            "--src",
            "host",
            "--dst",
            "peer-host",
            "--peer",
        ])
        .arg(addr.to_string())
        .args([
            "--devices",
            "lo",
            "--blocks",
            "4096",
            "--block-size",
            "4KiB",
        ])
        .args(["--runs", "2", "--json"])
        .output()
        .unwrap();
    let v = json_ok(&out);
    let row = &v["rows"][0];
    assert_eq!(row["verified"], true, "{v}");
    assert_eq!(row["path"], "host-copy", "{v}");
}

#[test]
fn bench_net_json_rows_are_verified_and_name_the_transport() {
    let _serial = serial();
    let (_srv, addr) = lo_serve(&["--export", "host:4MiB"]);
    for op in ["put", "get"] {
        // An environment variable UCX does not know makes it print a warning at start: that
        // must land on stderr, not in the JSON on stdout.
        let out = bench_net(&addr.to_string())
            .env("UCX_GDPATH_TEST_UNKNOWN", "1")
            .args(["--op", op, "--size", "8B,64KiB,1MiB", "--runs", "2"])
            .args(["--bytes-per-run", "4MiB", "--json"])
            .output()
            .unwrap();
        let j = json_ok(&out);
        assert!(
            String::from_utf8_lossy(&out.stderr).contains("UCX_GDPATH_TEST_UNKNOWN"),
            "UCX's warning should be on stderr: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        let rows = j["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 3);
        for r in rows {
            let net_fields = ["transport", "latency_us_min", "latency_us_max"];
            for k in gdpath_bench::ROW_FIELDS.iter().chain(&net_fields) {
                assert!(r.get(k).is_some(), "row lacks {k}: {r}");
            }
            assert_eq!(r["op"], op);
            // Puts over tcp go as the engine's packed writes (up to what this UCX's own put
            // does better), gets as UCX's.
            let packed = op == "put"
                && r["block"].as_u64().unwrap() <= gdpath::net::packed_write_max().unwrap();
            let transport = if packed { "tcp (packed writes)" } else { "tcp" };
            assert_eq!(r["transport"], transport, "{r}");
            assert_eq!(r["path"], format!("ucx:{transport}"), "{r}");
            assert_eq!(r["verified"], true);
            assert!(r["gbps_median"].as_f64().unwrap() > 0.0);
            assert!(r["latency_us_min"].as_f64().unwrap() > 0.0);
        }
    }
}

#[test]
fn wrong_token_is_refused() {
    let _serial = serial();
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("token");
    std::fs::write(&tok, "a shared secret of some length\n").unwrap();
    let (mut srv, addr) = lo_serve(&[
        "--export",
        "host:1MiB",
        "--token-file",
        tok.to_str().unwrap(),
    ]);
    let out = bench_net(&addr.to_string())
        .args(["--size", "4KiB"])
        .env("GDPATH_TOKEN", "another secret of some length")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("authentication"), "{err}");
    srv.wait_line("refused:", T);
    // The right token works, from the environment.
    let out = bench_net(&addr.to_string())
        .args(["--size", "4KiB"])
        .args(["--runs", "1", "--bytes-per-run", "64KiB"])
        .env("GDPATH_TOKEN", "a shared secret of some length")
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // And in the library.
    let a = client();
    let opts = ConnectOptions {
        token: Token::new("a shared secret of some length").unwrap(),
        ..ConnectOptions::default()
    };
    assert_eq!(a.connect_with(addr, &opts).unwrap().regions().len(), 1);
    assert!(matches!(a.connect(addr), Err(Error::AuthFailed { .. })));
}

#[test]
fn serve_refuses_non_loopback_without_token() {
    let _serial = serial();
    let out = Command::new(bin())
        .args(["serve", "--listen", "0.0.0.0:0", "--duration", "1"])
        .env_remove("GDPATH_TOKEN")
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert!(String::from_utf8_lossy(&out.stderr).contains("needs a token"));
}

#[test]
fn server_killed_mid_stream_fails_transfers_with_a_typed_error() {
    let _serial = serial();
    let (mut srv, addr) = lo_serve(&["--export", "host:16MiB"]);
    let a = client();
    let peer = a.connect(addr).unwrap();
    let remote = a
        .register(peer.memory(peer.regions()[0].id).unwrap())
        .unwrap();
    let src = a
        .register(Memory::host(HostBuffer::zeroed(16 << 20)))
        .unwrap();
    let mut q = std::collections::VecDeque::new();
    let start = Instant::now();
    let mut killed_at = None;
    let mut i = 0u64;
    let err = loop {
        if i == 32 && killed_at.is_none() {
            srv.child.kill().unwrap(); // SIGKILL
            srv.wait_exit(T);
            killed_at = Some(Instant::now());
        }
        let off = (i % 16) << 20;
        match a.post(TransferRequest::write(
            vec![src.desc(off, 1 << 20)],
            vec![remote.desc(off, 1 << 20)],
        )) {
            Ok(t) => q.push_back(t),
            Err(e) => break e,
        }
        i += 1;
        if q.len() >= 8 {
            if let Err(e) = q.pop_front().unwrap().wait_timeout(T) {
                break e.error;
            }
        }
        assert!(
            start.elapsed() < Duration::from_secs(60),
            "no failure after the kill"
        );
    };
    let took = killed_at.expect("killed").elapsed();
    assert!(
        matches!(err, Error::PeerFailed { .. } | Error::Refused { .. }),
        "expected a peer failure, got {err:?}"
    );
    eprintln!("server killed: transfers failed after {took:?}: {err}");
    assert!(took < Duration::from_secs(20), "detection took {took:?}");
    assert!(peer.failure().is_some());
}

/// UCX 1.13 (Debian's, the CI's) can abort the target of a put stream whose client was
/// killed: its software put handler (`ucp_put_handler`, puts over tcp are active messages)
/// answers each put on the endpoint UCX has just marked failed, and treats the error as fatal
/// ("Fatal: unexpected error: Endpoint timeout", `ucs_fatal`). Seen on 1 of 20 kills with the
/// engine of 6e477af and of 2eff9d7 alike (docs/network.md, "Known UCX defects"). True when
/// `srv` died that way.
fn died_in_ucx_put_handler(srv: &mut Proc) -> bool {
    let exited = matches!(srv.child.try_wait(), Ok(Some(_)));
    let err = srv.stderr();
    exited
        && err.iter().any(|l| l.contains("Fatal: unexpected error"))
        && err.iter().any(|l| l.contains("ucp_put_handler"))
}

#[test]
fn client_killed_mid_stream_server_keeps_serving_another() {
    let _serial = serial();
    // A server that survives is required; one that dies of the UCX defect above is reported
    // and the scenario run again with a fresh one, at most three times.
    for attempt in 1..=3 {
        let (mut srv, addr) = lo_serve(&["--export", "host:16MiB"]);
        let mut bench = Proc::spawn(bench_net(&addr.to_string()).args([
            "--size",
            "1MiB",
            "--runs",
            "100",
            "--bytes-per-run",
            "1GiB",
        ]));
        srv.wait_line("connected: bench@", T);
        std::thread::sleep(Duration::from_millis(500));
        bench.child.kill().unwrap(); // SIGKILL mid-stream
        bench.child.wait().unwrap();
        match srv.try_wait_line("lost: bench@", T) {
            Ok(_) => {
                round_trip(&client(), addr, 8 << 20, 11);
                srv.wait_line("connected: test@", T);
                return;
            }
            Err(seen) => {
                // Give a dying process time to exit before looking at how it ended.
                std::thread::sleep(Duration::from_millis(200));
                assert!(
                    died_in_ucx_put_handler(&mut srv),
                    "no line with \"lost: bench@\" within {T:?}; saw {seen:?}"
                );
                eprintln!(
                    "KNOWN UCX DEFECT (attempt {attempt} of 3): gdpath serve aborted in UCX's \
                     ucp_put_handler after its client was killed; running the scenario again"
                );
            }
        }
    }
    panic!("gdpath serve aborted in UCX's put handler in all three attempts");
}

/// A `bench net` client that finishes says goodbye: `gdpath serve` prints `left:`, and no
/// `lost:` follows when the client's endpoint closes (a client killed with SIGKILL is still
/// `lost:`, above).
#[test]
fn bench_client_that_finishes_is_reported_as_left_not_lost() {
    let _serial = serial();
    let (mut srv, addr) = lo_serve(&["--export", "host:4MiB"]);
    let out = bench_net(&addr.to_string())
        .args(["--size", "64KiB", "--runs", "1", "--bytes-per-run", "1MiB"])
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    srv.wait_line("connected: bench@", T);
    let ended = srv.wait_line("bench@", T);
    assert!(
        ended.starts_with("left: bench@127.0.0.1:") && ended.contains("cleanly"),
        "{ended}"
    );
    // The next line about any peer is the next client's: nothing about the bench in between.
    round_trip(&client(), addr, 1 << 20, 5);
    let next = srv.wait_line("@", T);
    assert!(next.starts_with("connected: test@"), "{next}");
    let ended = srv.wait_line("test@", T);
    assert!(ended.starts_with("left: test@"), "{ended}");
}

#[test]
fn two_hosts_in_network_namespaces_over_veth() {
    let _serial = serial();
    if let Some(why) = common::why_no_netns() {
        eprintln!("SKIP two_hosts_in_network_namespaces_over_veth: {why}");
        return;
    }
    let ns = match VethPair::create(std::process::id()) {
        Ok(ns) => ns,
        Err(e) => panic!("creating namespaces failed (root, iproute2 present): {e}"),
    };
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("token");
    std::fs::write(&tok, "veth test token 0123456789").unwrap();
    let listen = format!("{}:18515", ns.addr_a);
    let (mut srv, addr) = common::serve(
        &["ip", "netns", "exec", &ns.a],
        &[
            "--listen",
            &listen,
            "--export",
            "host:8MiB",
            "--token-file",
            tok.to_str().unwrap(),
            "--devices",
            &ns.dev_a,
            "--duration",
            "60",
        ],
        T,
    );
    assert_eq!(addr.to_string(), listen);
    let out = Command::new("ip")
        .args([
            "netns",
            "exec",
            &ns.b,
            &bin(),
            "bench",
            "net",
            "--peer",
            &listen,
        ])
        .args([
            "--token-file",
            tok.to_str().unwrap(),
            "--devices",
            &ns.dev_b,
        ])
        .args([
            "--size",
            "4KiB,1MiB",
            "--runs",
            "1",
            "--bytes-per-run",
            "8MiB",
            "--json",
        ])
        .output()
        .unwrap();
    let j = json_ok(&out);
    for r in j["rows"].as_array().unwrap() {
        assert_eq!(r["verified"], true, "{r}");
        // Puts across the veth go as the engine's packed writes over tcp (1 MiB ones in two
        // pieces), up to what this UCX's own put does better.
        let packed = r["block"].as_u64().unwrap() <= gdpath::net::packed_write_max().unwrap();
        let transport = if packed { "tcp (packed writes)" } else { "tcp" };
        assert_eq!(r["transport"], transport, "{r}");
    }
    srv.wait_line(&format!("connected: bench@{}", ns.addr_b), T);
    drop(srv);
    drop(ns);
}

/// `--batch` and `--completion local` end to end, with `--no-pack` (UCX puts): rows say the
/// batch used, the plain `tcp` transport, and are verified.
#[test]
fn bench_net_batch_and_local_completion_are_verified() {
    let _serial = serial();
    let (_srv, addr) = lo_serve(&["--export", "host:4MiB"]);
    let out = bench_net(&addr.to_string())
        .args([
            "--op", "put", "--size", "8B,64KiB", "--qd", "8", "--batch", "4",
        ])
        .args([
            "--completion",
            "local",
            // UCX puts that complete locally: without it these sizes go as packed writes.
            "--no-pack",
            "--runs",
            "2",
            "--bytes-per-run",
            "1MiB",
            "--json",
        ])
        .output()
        .unwrap();
    let j = json_ok(&out);
    let rows = j["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 2);
    for r in rows {
        assert_eq!(r["batch"], 4, "{r}");
        assert_eq!(r["qd"], 8, "{r}");
        assert_eq!(r["verified"], true, "{r}");
        assert_eq!(r["transport"], "tcp", "{r}");
    }
}

/// Mistakes a newcomer makes are refused with a reason: a batch above the queue depth, two
/// token sources at once, and a port already taken.
#[test]
fn bad_network_arguments_are_refused_with_a_reason() {
    let _serial = serial();
    let (ok, _, err) = common::gdpath(&[
        "bench",
        "net",
        "--peer",
        "127.0.0.1:9",
        "--qd",
        "4",
        "--batch",
        "8",
    ]);
    assert!(!ok && err.contains("exceeds --qd"), "{err}");
    let (ok, _, err) = common::gdpath(&[
        "bench",
        "net",
        "--peer",
        "127.0.0.1:9",
        "--token",
        "a shared secret of some length",
        "--token-file",
        "/nonexistent",
    ]);
    assert!(!ok && err.contains("cannot be used with"), "{err}");
    // A name peers would see cut, or an empty one, is refused rather than changed.
    let long = "n".repeat(65);
    for (name, why) in [("", "empty"), (long.as_str(), "at most 64")] {
        let (ok, _, err) = common::gdpath(&["serve", "--name", name]);
        assert!(!ok && err.contains(why), "{name:?}: {err}");
    }
    let (_srv, addr) = lo_serve(&["--export", "host:1MiB"]);
    let (ok, _, err) = common::gdpath(&[
        "serve",
        "--listen",
        &addr.to_string(),
        "--export",
        "host:1MiB",
        "--duration",
        "5",
    ]);
    assert!(!ok && err.contains("address already in use"), "{err}");
}

/// A peer that does not answer is a failure a `--json` script can read: a `gdpath.error/1`
/// document on stdout with the engine's kind, the message also on stderr, exit status 1.
#[test]
fn bench_net_with_no_peer_prints_a_json_error() {
    let _serial = serial();
    let out = bench_net("127.0.0.1:1")
        .args(["--size", "4KiB", "--json"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let stderr = String::from_utf8_lossy(&out.stderr);
    let j = common::error_doc(&out);
    assert_eq!(j["kind"], "peer_failed", "{j}");
    let msg = j["error"].as_str().unwrap();
    assert!(
        msg.contains("127.0.0.1:1") && stderr.contains(msg),
        "{j} / {stderr}"
    );
}

/// `--listen` and `--peer` take a host name: `localhost` resolves to its IPv4 address on both
/// sides, and the bench reaches the server by name.
#[test]
fn serve_and_bench_net_accept_host_names() {
    let _serial = serial();
    let (mut srv, addr) = common::serve(
        &[],
        &[
            "--listen",
            "localhost:0",
            "--devices",
            "lo",
            "--export",
            "host:1MiB",
            "--duration",
            "60",
        ],
        T,
    );
    assert_eq!(addr.ip(), std::net::Ipv4Addr::LOCALHOST, "{addr}");
    let peer = format!("localhost:{}", addr.port());
    let out = bench_net(&peer)
        .args(["--size", "4KiB", "--runs", "1", "--bytes-per-run", "64KiB"])
        .args(["--json"])
        .output()
        .unwrap();
    let j = json_ok(&out);
    assert_eq!(j["rows"][0]["verified"], true, "{j}");
    srv.wait_line("connected: bench@127.0.0.1", T);
}

/// A name that does not resolve, or a HOST without a port, is refused naming what was given.
#[test]
fn unresolvable_or_portless_addresses_are_refused_by_name() {
    let (ok, out, err) =
        common::gdpath(&["bench", "net", "--peer", "nonexistent.invalid:1", "--json"]);
    assert!(!ok, "{err}");
    assert!(
        err.contains("--peer nonexistent.invalid:1: cannot resolve host name"),
        "{err}"
    );
    let j: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(j["kind"], "resolve", "{j}");
    let (ok, _, err) = common::gdpath(&["bench", "net", "--peer", "localhost"]);
    assert!(!ok && err.contains("--peer localhost: no port"), "{err}");
    let (ok, _, err) = common::gdpath(&["serve", "--listen", "localhost", "--duration", "1"]);
    assert!(!ok && err.contains("--listen localhost: no port"), "{err}");
    let (ok, _, err) = common::gdpath(&[
        "serve",
        "--listen",
        "nonexistent.invalid:18515",
        "--duration",
        "1",
    ]);
    assert!(
        !ok && err.contains("--listen nonexistent.invalid:18515: cannot resolve"),
        "{err}"
    );
}

/// A `gdpath serve` and a `bench net` client (with `extra` arguments) half a second into a
/// stream of 1 MiB puts that would last many seconds: (server, client).
fn streaming_bench(extra: &[&str]) -> (Proc, Proc) {
    let (mut srv, addr) = lo_serve(&["--export", "host:64MiB"]);
    let cl = Proc::spawn(
        bench_net(&addr.to_string())
            .args(["--size", "1MiB", "--runs", "5", "--bytes-per-run", "4GiB"])
            .args(extra),
    );
    srv.wait_line("connected: bench@", T);
    std::thread::sleep(Duration::from_millis(500));
    (srv, cl)
}

/// Ctrl-C on a `bench net` client mid-stream: the client finishes the transfers in flight,
/// says goodbye (the server prints `left:`, not `lost:`) and exits with 130 (with `--json`,
/// after an error document of kind `cancelled`).
#[test]
fn an_interrupted_bench_says_goodbye() {
    let _serial = serial();
    let (mut srv, mut cl) = streaming_bench(&["--json"]);
    signal(&cl, libc::SIGINT);
    let status = cl.wait_exit(T);
    assert_eq!(status.code(), Some(130), "{:?}", cl.stderr());
    assert!(
        cl.stderr().iter().any(|l| l.contains("interrupted")),
        "{:?}",
        cl.stderr()
    );
    // With --json the interruption is also the error document on stdout.
    let doc = cl.try_wait_line("\"kind\"", T).unwrap_or_default();
    assert!(doc.contains("cancelled"), "{doc:?}");
    let ended = srv.wait_line("bench@", T);
    assert!(ended.starts_with("left: bench@"), "{ended}");
}

/// SIGTERM to `gdpath serve` with a client streaming puts: the server tells it goodbye, says
/// so and exits with 0; the client fails with "the peer closed the connection", not a
/// transport timeout.
#[test]
fn a_terminated_server_tells_its_clients_goodbye() {
    let _serial = serial();
    let (mut srv, mut cl) = streaming_bench(&[]);
    signal(&srv, libc::SIGTERM);
    let told = srv.wait_line("stopped:", T);
    assert!(told.contains("told 1 connected client"), "{told}");
    let status = srv.wait_exit(T);
    assert_eq!(status.code(), Some(0), "{:?}", srv.stderr());
    let status = cl.wait_exit(T);
    assert_eq!(status.code(), Some(1));
    let err = cl.stderr().join("\n");
    assert!(err.contains("the peer closed the connection"), "{err}");
}

/// Without `--size` the default sweep (8 B … 1 GiB) leaves out what does not fit the peer's
/// region, and says which; an explicit size that does not fit is still an error.
#[test]
fn the_default_sweep_fits_the_peers_region() {
    let _serial = serial();
    let (_srv, addr) = lo_serve(&["--export", "host:64KiB"]);
    let out = bench_net(&addr.to_string())
        .args([
            "--runs",
            "1",
            "--bytes-per-run",
            "64KiB",
            "--lat-iters",
            "5",
            "--json",
        ])
        .output()
        .unwrap();
    let j = json_ok(&out);
    let rows = j["rows"].as_array().unwrap();
    let blocks: Vec<u64> = rows.iter().map(|r| r["block"].as_u64().unwrap()).collect();
    assert_eq!(blocks.first(), Some(&8));
    assert_eq!(blocks.last(), Some(&(64 << 10)));
    assert!(rows.iter().all(|r| r["verified"] == true), "{j}");
    let skipped: Vec<u64> = j["skipped_sizes"]
        .as_array()
        .unwrap()
        .iter()
        .map(|v| v.as_u64().unwrap())
        .collect();
    assert_eq!(j["remote_region"]["bytes"], 64 << 10, "{j}");
    assert_eq!(skipped.first(), Some(&(128 << 10)));
    assert_eq!(skipped.last(), Some(&(1 << 30)));
    let out = bench_net(&addr.to_string())
        .args(["--size", "1MiB", "--runs", "1"])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("exceeds the peer's region"), "{err}");
}

/// A client with a token against a server without one is told that, not "wrong token".
#[test]
fn a_token_the_server_does_not_have_is_named() {
    let _serial = serial();
    let (mut srv, addr) = lo_serve(&["--export", "host:64KiB"]);
    let out = bench_net(&addr.to_string())
        .args([
            "--size",
            "4KiB",
            "--runs",
            "1",
            "--token",
            "0123456789abcdef0123",
        ])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("this server has none"), "{err}");
    let refused = srv.wait_line("refused:", T);
    assert!(refused.contains("this server has none"), "{refused}");
}

/// A server without a token (the default) says in its start line that any local user can
/// connect and read and write the exported memory, and how to require a token; with one, the
/// line says only that a token is required. The start line once said only "no token".
#[test]
fn a_tokenless_serve_says_who_can_read_and_write_its_memory() {
    let _serial = serial();
    let start_line = |extra: &[&str]| -> String {
        let out = Command::new(bin())
            .args(["serve", "--listen", "127.0.0.1:0", "--devices", "lo"])
            .args(["--export", "host:64KiB", "--duration", "0.2"])
            .args(extra)
            .env_remove("GDPATH_TOKEN")
            .output()
            .unwrap();
        assert!(out.status.success(), "{out:?}");
        let stdout = String::from_utf8_lossy(&out.stdout).into_owned();
        let line = stdout.lines().next().unwrap_or_default().to_owned();
        assert!(
            line.starts_with("gdpath serve: listening on 127.0.0.1:"),
            "{stdout}"
        );
        line
    };
    let line = start_line(&[]);
    assert!(
        line.contains(
            "no token: any local user can connect and read and write the exported memory"
        ),
        "{line}"
    );
    assert!(
        line.contains("--token-file FILE") && line.contains("GDPATH_TOKEN"),
        "{line}"
    );
    let dir = tempfile::tempdir().unwrap();
    let tok = dir.path().join("token");
    std::fs::write(&tok, "a shared secret of some length\n").unwrap();
    std::fs::set_permissions(&tok, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();
    let line = start_line(&["--token-file", tok.to_str().unwrap()]);
    assert!(line.ends_with(", token required)"), "{line}");
    assert!(!line.contains("any local user"), "{line}");
}
