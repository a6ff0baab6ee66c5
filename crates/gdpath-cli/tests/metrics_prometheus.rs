//! A real Prometheus server (Debian's `prometheus`, started here on loopback with a temporary
//! config and data folder, scraping every second) scrapes `gdpath serve --metrics` and this
//! process's own endpoint (`gdpath_metrics::MetricsServer`, the one `serve --metrics` runs)
//! while transfers of several paths run here: host → host (host-copy), host → file (O_DIRECT
//! where the file system allows it, else buffered with its finding) and host → the serving
//! process's memory over UCX tcp on loopback. The test then asks Prometheus's HTTP API
//! (`/api/v1/query`) for the series and checks that the bytes by path and peer are exactly
//! what the transfers' reports say moved, and that the server counted its peer and its
//! exported memory.
//!
//! Skipped aloud when `prometheus` is not installed (`scripts/setup.sh` installs it), unless
//! `GDPATH_REQUIRE_PROMETHEUS=1` (CI), which makes its absence a failure. One test in its own
//! binary: the engine's metrics are the process's, and no other test adds to them here.

mod prometheus;

use gdpath::net::{ConnectOptions, NetConfig};
use gdpath::{Agent, AgentConfig, FileSpec, HostBuffer, Memory, Region, TransferRequest};
use gdpath_metrics::MetricsServer;
use prometheus::{Killed, Prometheus};
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader};
use std::net::{SocketAddr, TcpListener};
use std::process::{Command, Stdio};

/// Writes `n` bytes of `src` to `dst` (from offset 0) and waits: the transfer's report.
fn write(agent: &Agent, src: &Region, dst: &Region, n: u64) -> gdpath::TransferReport {
    let req = TransferRequest::write(vec![src.desc(0, n)], vec![dst.desc(0, n)]);
    agent.post(req).unwrap().wait().unwrap()
}

fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .unwrap()
        .local_addr()
        .unwrap()
        .port()
}

/// Starts `gdpath serve` with one 1 MiB host export and `--metrics` on loopback: (the process,
/// its UCX listen address, its metrics address).
fn start_serve() -> (Killed, SocketAddr, SocketAddr) {
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdpath"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--export",
            "host:1MiB",
            "--metrics",
            "127.0.0.1:0",
            "--transports",
            "tcp",
            "--devices",
            "lo",
            "--duration",
            "180",
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let out = child.stdout.take().unwrap();
    let child = Killed(child);
    let (mut listen, mut metrics) = (None, None);
    for line in BufReader::new(out).lines() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("gdpath serve: listening on ") {
            listen = rest.split(' ').next().map(|a| a.parse().unwrap());
        }
        if let Some(rest) = line.strip_prefix("metrics: http://") {
            metrics = rest.strip_suffix("/metrics").map(|a| a.parse().unwrap());
            break;
        }
    }
    (
        child,
        listen.unwrap(),
        metrics.expect("serve printed its metrics address"),
    )
}

#[test]
fn prometheus_scrapes_bytes_by_path_and_peer() {
    let Some(bin) =
        gdpath_testkit::prometheus_tool("prometheus", "prometheus_scrapes_bytes_by_path_and_peer")
    else {
        return;
    };
    let _ucx = gdpath_testkit::ucx_serial();
    let (_serve, serve_ucx, serve_metrics) = start_serve();
    let own = MetricsServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();
    let prom = Prometheus::start(
        &bin,
        None,
        format!("127.0.0.1:{}", free_port()).parse().unwrap(),
        &[("client", own.local_addr()), ("serve", serve_metrics)],
    );
    let dir = gdpath_testkit::scratch();

    // The transfers, each path's bytes by (path, peer) from their reports.
    let mut moved: BTreeMap<(String, String), u64> = BTreeMap::new();
    let mut npairs = 0;
    let mut add = |r: gdpath::TransferReport, peer: &str| {
        for p in r.pairs {
            npairs += 1;
            *moved.entry((p.path.name(), peer.to_owned())).or_default() += p.bytes;
        }
    };
    let agent = Agent::new(AgentConfig {
        name: "client".into(),
        ..AgentConfig::default()
    })
    .unwrap();
    let src = agent
        .register(Memory::host(HostBuffer::from_slice(&vec![5u8; 3 << 20])))
        .unwrap();
    let dst = agent
        .register(Memory::host(HostBuffer::zeroed(3 << 20)))
        .unwrap();
    let r = write(&agent, &src, &dst, 3 << 20);
    add(r, "local");
    let file = agent
        .register(Memory::File(FileSpec::write(dir.path().join("f"))))
        .unwrap();
    let r = write(&agent, &src, &file, 2 << 20);
    add(r, "local");
    agent
        .enable_net(NetConfig {
            transports: Some("tcp".into()),
            devices: Some("lo".into()),
            shared_memory: false,
            ..NetConfig::default()
        })
        .unwrap();
    let peer = agent
        .connect_with(serve_ucx, &ConnectOptions::default())
        .unwrap();
    let id = peer.regions()[0].id;
    let remote = agent.register(peer.memory(id).unwrap()).unwrap();
    let r = write(&agent, &src, &remote, 1 << 20);
    // The peer label is the name the peer agent is known by here (`name@address`).
    let gdpath::MemoryKind::Remote { agent: serve_name } = remote.kind().clone() else {
        panic!("{:?}", remote.kind());
    };
    add(r, &serve_name);

    assert_eq!(moved.len(), 3, "three paths: {moved:?}");
    assert!(
        moved.keys().any(|(p, _)| p.starts_with("ucx:")),
        "{moved:?}"
    );

    // Prometheus sees exactly those bytes, by path and peer.
    prom.wait_for(
        "sum by (path, peer) (gdpath_bytes_total{job=\"client\",outcome=\"ok\"})",
        |r| {
            let got: BTreeMap<(String, String), u64> = r
                .iter()
                .map(|(l, v)| ((l["path"].clone(), l["peer"].clone()), *v as u64))
                .collect();
            got == moved
        },
    );
    // The serving process counts its connected peer and its exported 1 MiB.
    prom.wait_for("gdpath_peers_connected{job=\"serve\"}", |r| {
        r.len() == 1 && r[0].1 == 1.0
    });
    prom.wait_for(
        "sum(gdpath_registered_bytes{job=\"serve\",device=\"host\"})",
        |r| r.len() == 1 && r[0].1 == (1 << 20) as f64,
    );
    // Every pair's duration was observed: the histogram's count equals the pairs.
    prom.wait_for(
        "sum(gdpath_pair_duration_seconds_count{job=\"client\"})",
        |r| r.len() == 1 && r[0].1 == f64::from(npairs),
    );
    prom.wait_for("gdpath_peers_connected{job=\"client\"}", |r| {
        r.len() == 1 && r[0].1 == 1.0
    });
    // Closed on both sides once the client lets the peer go.
    drop(remote);
    drop(peer);
    prom.wait_for("sum(gdpath_peers_connected)", |r| {
        r.len() == 1 && r[0].1 == 0.0
    });
}
