//! The Prometheus test across network namespaces: two namespaces joined by a veth pair
//! (as root), `gdpath serve --metrics` exporting host memory in namespace `a`, a client agent
//! in namespace `b` writing and reading back verified bytes over UCX tcp across the link, and
//! a real Prometheus (Debian's `prometheus`) in namespace `a` scraping the server on its
//! loopback and the client's endpoint on the far end of the veth. Asked through its HTTP API,
//! Prometheus must hold exactly the bytes the client's transfer reports say moved, by op, path
//! (`ucx:tcp…`) and peer (the server as the client knows it), every pair's duration, the
//! connection on both sides while it is open and on neither once the client said goodbye, and
//! the server's exported memory. Then `gdpath bench net --metrics-out` from namespace `b`, a
//! one-shot client: its exposition passes `promtool check metrics` and holds exactly the bytes
//! the bench's method moves, by op, path and peer.
//!
//! The serving side has no bytes of its own to show: the engine counts a pair where it is
//! posted and completes, and the client's gets and puts on the server's memory are the
//! client's pairs (docs/metrics.md, "Who counts").
//!
//! The client is this test binary run again inside namespace `b` (`ip netns exec`, with
//! [`CLIENT_ENV`] saying what to do), so its metrics are a process of their own, as a remote
//! node's would be. Skipped aloud when not root, without iproute2 or without `prometheus`,
//! unless `GDPATH_REQUIRE_PROMETHEUS=1` (CI, which is root), which makes any of those a failure.

mod common;
mod prometheus;

use common::{Proc, VethPair};
use gdpath::net::{ConnectOptions, NetConfig, Token};
use gdpath::{Agent, AgentConfig, HostBuffer, Memory, Op, TransferRequest};
use gdpath_metrics::MetricsServer;
use prometheus::{Prometheus, Series};
use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

/// This test's name, which the client run selects (`--exact`).
const TEST: &str = "prometheus_scrapes_ucx_tcp_between_namespaces";
/// Set in the client run: `SERVE_ADDR TOKEN_FILE DEVICE METRICS_ADDR`.
const CLIENT_ENV: &str = "GDPATH_TEST_METRICS_NETNS_CLIENT";
/// The server's exported host memory, bytes.
const EXPORT: u64 = 4 << 20;
/// Lengths the client writes and reads back, bytes: a small pair and one of several MiB (their
/// paths are the ones their reports name: gets, and writes as packed writes or UCX puts
/// depending on the UCX version, `gdpath::net::pack_limit`).
const LENGTHS: [u64; 2] = [64 << 10, 3 << 20];
/// Where the client's and Prometheus's endpoints listen; fixed, as the namespaces are new.
const CLIENT_METRICS_PORT: u16 = 9464;
const PROMETHEUS_PORT: u16 = 9090;
/// Bound on each step of a process started here (its start, its exit).
const T: Duration = Duration::from_secs(90);

/// Bytes by (op, path, peer), as the transfer reports give them and Prometheus's
/// `sum by (op, path, peer)` does.
type Moved = BTreeMap<(String, String, String), u64>;

#[test]
fn prometheus_scrapes_ucx_tcp_between_namespaces() {
    if let Ok(args) = std::env::var(CLIENT_ENV) {
        return client(&args);
    }
    if let Some(why) = common::why_no_netns() {
        return gdpath_testkit::skip_prometheus_test(TEST, why);
    }
    let (Some(bin), Some(promtool)) = (
        gdpath_testkit::prometheus_tool("prometheus", TEST),
        gdpath_testkit::prometheus_tool("promtool", TEST),
    ) else {
        return;
    };
    let _ucx = gdpath_testkit::ucx_serial();
    let net = VethPair::create(std::process::id())
        .unwrap_or_else(|e| panic!("creating namespaces failed (root, iproute2 present): {e}"));
    let dir = gdpath_testkit::scratch();
    let tok = dir.path().join("token");
    std::fs::write(&tok, "metrics across namespaces 0123456789").unwrap();
    std::fs::set_permissions(&tok, std::os::unix::fs::PermissionsExt::from_mode(0o600)).unwrap();

    // The server in namespace a, its metrics on a's loopback.
    let (mut serve, serve_ucx) = common::serve(
        &["ip", "netns", "exec", &net.a],
        &[
            "--listen",
            &format!("{}:0", net.addr_a),
            "--export",
            &format!("host:{EXPORT}"),
            "--metrics",
            "127.0.0.1:0",
            "--token-file",
            tok.to_str().unwrap(),
            "--transports",
            "tcp",
            "--devices",
            &net.dev_a,
            "--duration",
            "300",
        ],
        T,
    );
    let line = serve.wait_line("metrics: http://", T);
    let serve_metrics: SocketAddr = line
        .strip_prefix("metrics: http://")
        .and_then(|r| r.strip_suffix("/metrics"))
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no metrics address in {line:?}"));

    // The client in namespace b; it says what moved, then holds its connection until told.
    let client_metrics = SocketAddr::from((net.addr_b, CLIENT_METRICS_PORT));
    let mut cmd = Command::new("ip");
    cmd.args(["netns", "exec", &net.b])
        .arg(std::env::current_exe().unwrap())
        .args(["--exact", TEST, "--nocapture", "--test-threads=1"])
        .env(
            CLIENT_ENV,
            format!(
                "{serve_ucx} {} {} {client_metrics}",
                tok.display(),
                net.dev_b
            ),
        )
        .env_remove("GDPATH_METRICS")
        .stdin(Stdio::piped());
    let mut client = Proc::spawn(&mut cmd);
    let line = client.wait_line("client: moved ", T);
    let (moved, pairs): (Moved, u64) = {
        let doc = line.split_once("client: moved ").map_or("", |(_, d)| d);
        let v: serde_json::Value =
            serde_json::from_str(doc).unwrap_or_else(|e| panic!("the client's line {line:?}: {e}"));
        let moved = v["bytes"]
            .as_array()
            .unwrap()
            .iter()
            .map(|e| {
                let s = |i: usize| e[i].as_str().unwrap().to_owned();
                ((s(0), s(1), s(2)), e[3].as_u64().unwrap())
            })
            .collect();
        (moved, v["pairs"].as_u64().unwrap())
    };
    assert!(
        moved.keys().all(|(_, path, _)| path.starts_with("ucx:tcp")),
        "every pair crossed on UCX tcp: {moved:?}"
    );
    for op in ["write", "read"] {
        let bytes: u64 = moved
            .iter()
            .filter(|((o, _, _), _)| o == op)
            .map(|(_, b)| b)
            .sum();
        assert_eq!(bytes, LENGTHS.iter().sum::<u64>(), "{op}: {moved:?}");
    }

    // Prometheus in namespace a: the server on loopback, the client across the veth.
    let prom = Prometheus::start(
        &bin,
        Some(&net.a),
        SocketAddr::from(([127, 0, 0, 1], PROMETHEUS_PORT)),
        &[("serve", serve_metrics), ("client", client_metrics)],
    );
    prom.wait_for(
        "sum by (op, path, peer) (gdpath_bytes_total{job=\"client\",outcome=\"ok\"})",
        |r| by_op_path_peer(r) == moved,
    );
    prom.wait_for(
        "sum(gdpath_pair_duration_seconds_count{job=\"client\"})",
        |r| r.len() == 1 && r[0].1 == pairs as f64,
    );
    for job in ["serve", "client"] {
        prom.wait_for(&format!("gdpath_peers_connected{{job=\"{job}\"}}"), |r| {
            r.len() == 1 && r[0].1 == 1.0
        });
    }
    prom.wait_for(
        "sum(gdpath_registered_bytes{job=\"serve\",device=\"host\"})",
        |r| r.len() == 1 && r[0].1 == EXPORT as f64,
    );
    // Scraped since the transfers (its peer shows), the server counts none of their bytes.
    let served = prom.query("gdpath_bytes_total{job=\"serve\"}");
    assert!(served.is_empty(), "{served:?}");

    // Told to finish, the client closes its connection with a goodbye and exits.
    {
        use std::io::Write;
        let mut stdin = client.child.stdin.take().unwrap();
        writeln!(stdin, "done").unwrap();
    }
    let status = client.wait_exit(T);
    assert!(status.success(), "the client failed: {:?}", client.stderr());
    serve.wait_line(&format!("left: client@{}", net.addr_b), T);
    prom.wait_for("gdpath_peers_connected{job=\"serve\"}", |r| {
        r.len() == 1 && r[0].1 == 0.0
    });

    // A one-shot client from namespace b, `bench net --metrics-out`: its exposition passes
    // promtool and holds the bytes of the bench's method (crates/gdpath-bench/src/net.rs): per
    // size, a warm-up pass of the window, the timed runs and the latency samples as puts, then
    // the window read back with one get to verify it.
    let file = dir.path().join("bench.prom");
    let (runs, lat_iters) = (2u64, 5u64);
    // coreutils' `timeout` bounds the run (a hung bench fails the test with its stderr).
    let out = Command::new("timeout")
        .args([
            "--kill-after=10",
            &T.as_secs().to_string(),
            "ip",
            "netns",
            "exec",
        ])
        .args([&net.b, &common::bin(), "bench", "net"])
        .args(["--peer", &serve_ucx.to_string(), "--token-file"])
        .arg(&tok)
        .args(["--devices", &net.dev_b, "--transports", "tcp"])
        .args(["--size", "64KiB", "--qd", "4", "--bytes-per-run", "1MiB"])
        .args([
            "--runs",
            &runs.to_string(),
            "--lat-iters",
            &lat_iters.to_string(),
        ])
        .arg("--json")
        .arg("--metrics-out")
        .arg(&file)
        .env_remove("GDPATH_METRICS")
        .output()
        .unwrap();
    let doc = common::json_ok(&out);
    let text = std::fs::read_to_string(&file).unwrap();
    gdpath_testkit::promtool_check_metrics(&promtool, &text).unwrap();
    let [row] = &doc["rows"].as_array().unwrap()[..] else {
        panic!("one size, one row: {doc}");
    };
    assert_eq!(row["verified"], true, "{row}");
    let get = |k: &str| row[k].as_u64().unwrap_or_else(|| panic!("{k} in {row}"));
    let window = get("qd") * get("block");
    let peer = doc["peer"].as_str().unwrap().to_owned();
    // The get's path is the one the first client's reads took from the same server.
    let read_path = moved
        .keys()
        .find(|(op, _, p)| op == "read" && *p == peer)
        .map(|(_, path, _)| path.clone())
        .unwrap_or_else(|| panic!("the bench's peer {peer} is not the first client's: {moved:?}"));
    let want = Moved::from([
        (
            (
                "write".into(),
                format!("ucx:{}", row["transport"].as_str().unwrap()),
                peer.clone(),
            ),
            window + runs * get("bytes") + lat_iters * get("block"),
        ),
        (("read".into(), read_path, peer), window),
    ]);
    assert_eq!(bytes_in(&text), want, "{text}");
    serve.wait_line("left: bench@", T);
    drop(prom);
    drop(serve);
    drop(net);
}

/// A query's answer as bytes by (op, path, peer).
fn by_op_path_peer(r: &[Series]) -> Moved {
    r.iter()
        .map(|(l, v)| {
            let label = |k: &str| l.get(k).cloned().unwrap_or_default();
            ((label("op"), label("path"), label("peer")), *v as u64)
        })
        .collect()
}

/// The `gdpath_bytes_total` samples of outcome `ok` in the exposition `text`, by (op, path,
/// peer).
fn bytes_in(text: &str) -> Moved {
    text.lines()
        .filter_map(|l| l.strip_prefix("gdpath_bytes_total{")?.rsplit_once("} "))
        .filter_map(|(labels, value)| {
            let l: BTreeMap<&str, &str> = labels
                .split("\",")
                .filter_map(|kv| kv.split_once("=\""))
                .map(|(k, v)| (k, v.trim_end_matches('"')))
                .collect();
            (l.get("outcome") == Some(&"ok")).then(|| {
                let label = |k: &str| l.get(k).copied().unwrap_or_default().to_owned();
                (
                    (label("op"), label("path"), label("peer")),
                    value.parse().unwrap(),
                )
            })
        })
        .collect()
}

/// The client's run in namespace b (`args`: see [`CLIENT_ENV`]): serves its metrics, writes
/// each of [`LENGTHS`] to the server's memory and reads it back, checks the bytes, prints
/// `client: moved {"bytes": [[op, path, peer, bytes], ...], "pairs": N}`, then waits for a
/// line on stdin (at most [`T`] × 4) before it lets the server go.
fn client(args: &str) {
    let a: Vec<&str> = args.split(' ').collect();
    let [serve, token, device, metrics] = a[..] else {
        panic!("{CLIENT_ENV}={args:?}: want SERVE_ADDR TOKEN_FILE DEVICE METRICS_ADDR");
    };
    let _endpoint = MetricsServer::bind(metrics.parse().unwrap()).unwrap();
    let agent = Agent::new(AgentConfig {
        name: "client".into(),
        ..AgentConfig::default()
    })
    .unwrap();
    agent
        .enable_net(NetConfig {
            transports: Some("tcp".into()),
            devices: Some(device.into()),
            shared_memory: false,
            ..NetConfig::default()
        })
        .unwrap();
    let opts = ConnectOptions {
        token: Token::new(std::fs::read_to_string(token).unwrap().trim()).unwrap(),
        ..ConnectOptions::default()
    };
    let peer = agent.connect_with(serve.parse().unwrap(), &opts).unwrap();
    let id = peer.regions()[0].id;
    let remote = agent.register(peer.memory(id).unwrap()).unwrap();
    // The peer label is the name the server is known by here (`name@address`).
    let gdpath::MemoryKind::Remote { agent: server } = remote.kind().clone() else {
        panic!("{:?}", remote.kind());
    };

    let mut moved = Moved::new();
    let mut pairs = 0u64;
    for (i, &n) in LENGTHS.iter().enumerate() {
        let mut data = vec![0u8; n as usize];
        gdpath_bench::fill_pattern(&mut data, 0, 43 + i as u64);
        let src = agent
            .register(Memory::host(HostBuffer::from_slice(&data)))
            .unwrap();
        let back = agent
            .register(Memory::host(HostBuffer::zeroed(n as usize)))
            .unwrap();
        for (op, local) in [(Op::Write, &src), (Op::Read, &back)] {
            let req = TransferRequest::new(op, vec![local.desc(0, n)], vec![remote.desc(0, n)]);
            let report = agent.post(req).unwrap().wait().unwrap();
            for p in report.pairs {
                pairs += 1;
                *moved
                    .entry((op.to_string(), p.path.name(), server.clone()))
                    .or_default() += p.bytes;
            }
        }
        assert!(
            back.host_view().unwrap()[..] == data[..],
            "{n} bytes read back are not those written"
        );
    }
    let bytes: Vec<serde_json::Value> = moved
        .iter()
        .map(|((op, path, peer), b)| serde_json::json!([op, path, peer, b]))
        .collect();
    println!(
        "client: moved {}",
        serde_json::json!({"bytes": bytes, "pairs": pairs})
    );

    // Held until the test has seen the metrics; bounded in case the test is gone.
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let mut line = String::new();
        let _ = std::io::stdin().read_line(&mut line);
        let _ = tx.send(());
    });
    let _ = rx.recv_timeout(T * 4);
    drop(remote);
    drop(peer);
}
