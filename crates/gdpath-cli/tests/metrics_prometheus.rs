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

use gdpath::net::{ConnectOptions, NetConfig};
use gdpath::{Agent, AgentConfig, FileSpec, HostBuffer, Memory, Region, TransferRequest};
use gdpath_metrics::MetricsServer;
use std::collections::BTreeMap;
use std::io::{BufRead, BufReader, Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const T: Duration = Duration::from_secs(60);

/// Kills a child process when dropped (the test may fail halfway).
struct Killed(Child);
impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn which(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

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

/// `GET path` on `addr`, the body of a 200 answer; `None` for anything else.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    head.starts_with("HTTP/1.1 200")
        .then(|| body.to_owned())
        .or_else(|| head.starts_with("HTTP/1.0 200").then(|| body.to_owned()))
}

/// `s` percent-encoded for a URL's query.
fn encode(s: &str) -> String {
    s.bytes()
        .map(|b| match b {
            b'A'..=b'Z' | b'a'..=b'z' | b'0'..=b'9' | b'-' | b'_' | b'.' | b'~' => {
                (b as char).to_string()
            }
            _ => format!("%{b:02X}"),
        })
        .collect()
}

/// Prometheus's answer to an instant query: each series' labels and value.
fn query(prom: SocketAddr, q: &str) -> Vec<(BTreeMap<String, String>, f64)> {
    let Some(body) = http_get(prom, &format!("/api/v1/query?query={}", encode(q))) else {
        return Vec::new();
    };
    let v: serde_json::Value = serde_json::from_str(&body).unwrap();
    v["data"]["result"]
        .as_array()
        .into_iter()
        .flatten()
        .map(|r| {
            let labels = r["metric"]
                .as_object()
                .unwrap()
                .iter()
                .map(|(k, v)| (k.clone(), v.as_str().unwrap().to_owned()))
                .collect();
            let value = r["value"][1].as_str().unwrap().parse().unwrap();
            (labels, value)
        })
        .collect()
}

/// Polls `q` until `ok` holds for its answer, or panics after [`T`] with the last answer.
fn wait_for(prom: SocketAddr, q: &str, ok: impl Fn(&[(BTreeMap<String, String>, f64)]) -> bool) {
    let end = Instant::now() + T;
    loop {
        let r = query(prom, q);
        if ok(&r) {
            return;
        }
        assert!(Instant::now() < end, "{q}: {r:?}");
        std::thread::sleep(Duration::from_millis(300));
    }
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
    let Some(prometheus) = which("prometheus") else {
        assert!(
            std::env::var_os("GDPATH_REQUIRE_PROMETHEUS").is_none_or(|v| v != "1"),
            "GDPATH_REQUIRE_PROMETHEUS=1 but no prometheus on PATH (scripts/setup.sh installs Debian's)"
        );
        eprintln!("SKIPPED prometheus_scrapes_bytes_by_path_and_peer: no prometheus on PATH (apt-get install prometheus)");
        return;
    };
    let _ucx = gdpath_testkit::ucx_serial();
    let (_serve, serve_ucx, serve_metrics) = start_serve();
    let own = MetricsServer::bind("127.0.0.1:0".parse().unwrap()).unwrap();

    let dir = gdpath_testkit::scratch();
    let config = dir.path().join("prometheus.yml");
    std::fs::write(
        &config,
        format!(
            "global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n  - job_name: client\n    static_configs:\n      - targets: ['{}']\n  - job_name: serve\n    static_configs:\n      - targets: ['{serve_metrics}']\n",
            own.local_addr()
        ),
    )
    .unwrap();
    let prom: SocketAddr = format!("127.0.0.1:{}", free_port()).parse().unwrap();
    let _prometheus = Killed(
        Command::new(prometheus)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={prom}"))
            .stdout(Stdio::null())
            .stderr(Stdio::null())
            .spawn()
            .unwrap(),
    );

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
    wait_for(
        prom,
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
    wait_for(prom, "gdpath_peers_connected{job=\"serve\"}", |r| {
        r.len() == 1 && r[0].1 == 1.0
    });
    wait_for(
        prom,
        "sum(gdpath_registered_bytes{job=\"serve\",device=\"host\"})",
        |r| r.len() == 1 && r[0].1 == (1 << 20) as f64,
    );
    // Every pair's duration was observed: the histogram's count equals the pairs.
    wait_for(
        prom,
        "sum(gdpath_pair_duration_seconds_count{job=\"client\"})",
        |r| r.len() == 1 && r[0].1 == f64::from(npairs),
    );
    wait_for(prom, "gdpath_peers_connected{job=\"client\"}", |r| {
        r.len() == 1 && r[0].1 == 1.0
    });
    // Closed on both sides once the client lets the peer go.
    drop(remote);
    drop(peer);
    wait_for(prom, "sum(gdpath_peers_connected)", |r| {
        r.len() == 1 && r[0].1 == 0.0
    });
}
