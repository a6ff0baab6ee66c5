//! `gdpath serve --cluster`, `gdpath cluster ls|watch` and `bench net --peer-name` against a
//! real etcd (Debian's etcd-server on loopback ports, a temporary data directory): a serving
//! process SIGKILLed mid-transfer is "peer gone" within its lease TTL, the same name restarted
//! is a new incarnation whose predecessor's metadata is never used, and a second claim of a
//! name is refused.

#[path = "../../gdpath-cluster/tests/common/mod.rs"]
mod etcd;

use etcd::Etcd;
use gdpath::net::Token;
use gdpath::{HostBuffer, Memory, TransferRequest};
use gdpath_cluster::{Cluster, ClusterError, ClusterPeer, ClusterUrl};
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

const TOKEN: &str = "cluster-test-token-0123456789";
const TTL_S: u64 = 2;

/// `gdpath serve --cluster URL --name NAME` exporting 64 MiB of host memory; returns once it
/// published, with its incarnation.
fn serve(url: &str, name: &str, dir: &std::path::Path) -> (Child, String) {
    serve_ttl(url, name, dir, TTL_S)
}

/// [`serve`] with a lease of `ttl` seconds.
fn serve_ttl(url: &str, name: &str, dir: &std::path::Path, ttl: u64) -> (Child, String) {
    let (child, inc, _log) = serve_logged(url, name, dir, ttl);
    (child, inc)
}

/// [`serve_ttl`], with the lines it prints after publishing.
fn serve_logged(
    url: &str,
    name: &str,
    dir: &std::path::Path,
    ttl: u64,
) -> (Child, String, std::sync::mpsc::Receiver<String>) {
    let token_file = dir.join("token");
    std::fs::write(&token_file, TOKEN).unwrap();
    let mut child = Command::new(env!("CARGO_BIN_EXE_gdpath"))
        .args(["serve", "--listen", "127.0.0.1:0", "--export", "host:64MiB"])
        .args(["--devices", "lo", "--name", name, "--cluster", url])
        .args(["--lease-ttl", &ttl.to_string()])
        .arg("--token-file")
        .arg(&token_file)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let mut lines = BufReader::new(child.stdout.take().unwrap()).lines();
    for line in lines.by_ref() {
        let line = line.unwrap();
        if let Some(rest) = line.strip_prefix("cluster: published ") {
            let inc = rest.split_whitespace().nth(2).unwrap().to_owned();
            let (tx, rx) = std::sync::mpsc::channel();
            // Keep draining its stdout so that it never blocks on a full pipe.
            std::thread::spawn(move || {
                for l in lines.map_while(Result::ok) {
                    let _ = tx.send(l);
                }
            });
            return (child, inc, rx);
        }
    }
    let _ = child.kill();
    let _ = child.wait();
    panic!("serve did not publish");
}

#[test]
fn a_serve_killed_mid_transfer_is_gone_within_its_ttl_and_its_restart_is_a_new_incarnation() {
    let Some(e) = Etcd::start() else { return };
    let _serial = gdpath_testkit::ucx_serial();
    let url = e.url("kv");
    let (srv, inc1) = serve(&url, "prefill-0", e.dir.path());
    let cluster = Cluster::connect(&url.parse::<ClusterUrl>().unwrap()).unwrap();
    let agent = etcd::net_agent("decode-0");
    let token = Token::new(TOKEN).unwrap();
    let p =
        ClusterPeer::connect(&cluster, &agent, "prefill-0", token.clone(), Duration::ZERO).unwrap();
    assert_eq!(p.record().incarnation.as_str(), inc1);
    let id = p.peer().regions()[0].id;
    let remote = agent.register(p.peer().memory(id).unwrap()).unwrap();
    let len = 64u64 << 20;
    let local = agent
        .register(Memory::host(HostBuffer::from_slice(&vec![
            0x5a;
            len as usize
        ])))
        .unwrap();
    // A verified round trip first: write, read back into another buffer, compare.
    let t = p
        .post(
            &agent,
            TransferRequest::write(vec![local.desc(0, len)], vec![remote.desc(0, len)]),
        )
        .unwrap();
    p.wait(t, Duration::from_secs(30)).unwrap();
    let back = agent
        .register(Memory::host(HostBuffer::zeroed(len as usize)))
        .unwrap();
    let t = p
        .post(
            &agent,
            TransferRequest::read(vec![back.desc(0, len)], vec![remote.desc(0, len)]),
        )
        .unwrap();
    p.wait(t, Duration::from_secs(30)).unwrap();
    assert!(back.host_view().unwrap().iter().all(|&b| b == 0x5a));

    // Transfers in flight when the server is SIGKILLed: each ends, as "peer gone", within
    // the TTL (plus etcd's expiry scan), and nothing hangs.
    // Not reaped until the end: the restart below finds its predecessor a zombie, which
    // counts as dead (a supervisor that has not waited yet).
    let killer = std::thread::spawn(move || {
        let mut srv = srv;
        std::thread::sleep(Duration::from_millis(300));
        srv.kill().unwrap();
        (Instant::now(), srv)
    });
    let mut result = Ok(());
    let t_end = Instant::now() + Duration::from_secs(30);
    while Instant::now() < t_end {
        let r = p
            .post(
                &agent,
                TransferRequest::write(vec![local.desc(0, len)], vec![remote.desc(0, len)]),
            )
            .and_then(|t| p.wait(t, Duration::from_secs(30)));
        if let Err(e) = r {
            result = Err(e);
            break;
        }
    }
    let (killed_at, mut srv) = killer.join().unwrap();
    let err = result.expect_err("transfers to a killed peer must fail");
    let after = killed_at.elapsed();
    match &err {
        ClusterError::PeerGone { incarnation, .. } => assert_eq!(incarnation, &inc1),
        other => panic!("expected PeerGone, got {other}"),
    }
    assert!(
        after <= Duration::from_secs(TTL_S + 3),
        "gone after {after:?}, TTL {TTL_S} s"
    );
    // A later post fails at once.
    let t0 = Instant::now();
    let again = p.post(
        &agent,
        TransferRequest::write(vec![local.desc(0, 4096)], vec![remote.desc(0, 4096)]),
    );
    assert!(matches!(again, Err(ClusterError::PeerGone { .. })));
    assert!(t0.elapsed() < Duration::from_millis(100));
    drop((remote, p));

    // The same name restarted: a new incarnation, found by name; the old one is not used.
    let (mut srv2, inc2) = serve(&url, "prefill-0", e.dir.path());
    assert_ne!(inc1, inc2);
    let p2 =
        ClusterPeer::connect(&cluster, &agent, "prefill-0", token, Duration::from_secs(5)).unwrap();
    assert_eq!(p2.record().incarnation.as_str(), inc2);
    let out = Command::new(env!("CARGO_BIN_EXE_gdpath"))
        .args(["cluster", "ls", "--json", "--cluster", &url])
        .output()
        .unwrap();
    assert!(out.status.success());
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let agents = doc["agents"].as_array().unwrap();
    assert_eq!(agents.len(), 1, "{doc}");
    assert_eq!(agents[0]["record"]["incarnation"], inc2.as_str());
    drop(p2);
    srv2.kill().unwrap();
    srv2.wait().unwrap();
    srv.wait().unwrap();
}

#[test]
fn a_second_serve_claiming_a_live_name_is_refused_with_a_clear_error() {
    let Some(e) = Etcd::start() else { return };
    let url = e.url("claims");
    let (mut first, inc) = serve(&url, "decode-3", e.dir.path());
    let token_file = e.dir.path().join("token");
    let out = Command::new(env!("CARGO_BIN_EXE_gdpath"))
        .args(["serve", "--listen", "127.0.0.1:0", "--devices", "lo"])
        .args(["--name", "decode-3", "--cluster", &url, "--duration", "5"])
        .arg("--token-file")
        .arg(&token_file)
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(
        err.contains("agent name decode-3 is taken by incarnation") && err.contains(&inc),
        "{err}"
    );
    first.kill().unwrap();
    first.wait().unwrap();
}

/// `gdpath cluster watch --json` on `url` for `secs` seconds, its stdout piped.
fn watch_json(url: &str, secs: u32) -> Child {
    Command::new(env!("CARGO_BIN_EXE_gdpath"))
        .args([
            "cluster",
            "watch",
            "--json",
            "--duration",
            &secs.to_string(),
        ])
        .args(["--cluster", url])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap()
}

#[test]
fn cluster_watch_reports_a_join_and_a_leave() {
    let Some(e) = Etcd::start() else { return };
    let url = e.url("w");
    let watch = watch_json(&url, 8);
    std::thread::sleep(Duration::from_millis(500));
    let (mut srv, inc) = serve(&url, "a", e.dir.path());
    srv.kill().unwrap();
    srv.wait().unwrap();
    let out = watch.wait_with_output().unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    let events: Vec<serde_json::Value> = text
        .lines()
        .map(|l| serde_json::from_str(l).unwrap())
        .collect();
    assert!(
        events
            .iter()
            .any(|v| v["event"] == "joined" && v["record"]["incarnation"] == inc.as_str()),
        "{text}"
    );
    assert!(
        events
            .iter()
            .any(|v| v["event"] == "left" && v["incarnation"] == inc.as_str()),
        "{text}"
    );
}

#[test]
fn bad_cluster_arguments_and_an_unreachable_etcd_fail_clearly_and_in_bounded_time() {
    let run = |args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gdpath"))
            .args(args)
            .output()
            .unwrap()
    };
    // A TTL out of range and a malformed URL: usage errors before anything runs.
    let out = run(&[
        "serve",
        "--name",
        "a",
        "--cluster",
        "etcd://127.0.0.1:1/x",
        "--lease-ttl",
        "1",
    ]);
    assert_eq!(out.status.code(), Some(2));
    // An unclosed IPv6 bracket is the URL's fault, not the connection's.
    let out = run(&["cluster", "ls", "--cluster", "etcd://[::1:23790/ns"]);
    assert_eq!(out.status.code(), Some(2));
    let out = run(&["cluster", "ls", "--json", "--cluster", "http://h:1/x"]);
    assert_eq!(out.status.code(), Some(2));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["kind"], "usage", "{doc}");
    // Nothing listens on port 1: refused with its kind, within the connect bound.
    let t0 = Instant::now();
    let out = run(&[
        "cluster",
        "ls",
        "--json",
        "--cluster",
        "etcd://127.0.0.1:1/x",
    ]);
    assert_eq!(out.status.code(), Some(1));
    let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(doc["kind"], "cluster_unreachable", "{doc}");
    assert!(t0.elapsed() < Duration::from_secs(15), "{:?}", t0.elapsed());
}

#[test]
fn a_restart_on_the_same_node_takes_its_name_back_at_once_and_old_peers_see_it_replaced() {
    let Some(e) = Etcd::start() else { return };
    let _serial = gdpath_testkit::ucx_serial();
    let url = e.url("restart");
    // A long lease: expiry cannot be what frees the name within this test.
    let (mut old, inc1) = serve_ttl(&url, "kv-0", e.dir.path(), 60);
    let cluster = Cluster::connect(&url.parse::<ClusterUrl>().unwrap()).unwrap();
    let agent = etcd::net_agent("reader");
    let token = Token::new(TOKEN).unwrap();
    let p = ClusterPeer::connect(&cluster, &agent, "kv-0", token.clone(), Duration::ZERO).unwrap();
    // SIGKILLed and not yet reaped (a zombie, as under a supervisor that has not waited).
    old.kill().unwrap();
    let t0 = Instant::now();
    let (mut new, inc2) = serve_ttl(&url, "kv-0", e.dir.path(), 60);
    assert!(t0.elapsed() < Duration::from_secs(10), "{:?}", t0.elapsed());
    assert_ne!(inc1, inc2);
    // The peer connected to the old incarnation learns it was replaced, and is never
    // pointed at the new one through the old record.
    let end = Instant::now() + Duration::from_secs(5);
    while p.gone().is_none() && Instant::now() < end {
        std::thread::sleep(Duration::from_millis(20));
    }
    let gone = p.gone().expect("replaced");
    assert!(gone.reason.contains(&inc2), "{}", gone.reason);
    assert!(
        matches!(p.check(), Err(ClusterError::PeerGone { incarnation, .. }) if incarnation == inc1)
    );
    let p2 = ClusterPeer::connect(&cluster, &agent, "kv-0", token, Duration::ZERO).unwrap();
    assert_eq!(p2.record().incarnation.as_str(), inc2);
    drop((p, p2));
    new.kill().unwrap();
    new.wait().unwrap();
    old.wait().unwrap();
}

/// `gdpath cluster ls --cluster URL` with `args`.
fn cluster_ls(url: &str, args: &[&str]) -> std::process::Output {
    Command::new(env!("CARGO_BIN_EXE_gdpath"))
        .args(["cluster", "ls", "--cluster", url])
        .args(args)
        .output()
        .unwrap()
}

#[test]
fn serve_records_its_export_as_offered_and_its_doctor_verdicts_soon_after_publishing() {
    let Some(e) = Etcd::start() else { return };
    let _serial = gdpath_testkit::ucx_serial();
    let url = e.url("doc");
    let (mut srv, inc) = serve(&url, "prefill-0", e.dir.path());
    // Published at once; the doctor's verdicts come by an update of the same incarnation
    // (on this machine without GPUs the doctor still judges every path).
    let end = Instant::now() + gdpath_cluster::VERDICTS_BOUND + Duration::from_secs(5);
    let record = loop {
        let out = cluster_ls(&url, &["--json"]);
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        let r = doc["agents"][0]["record"].clone();
        if r["topology"]["verdicts"]
            .as_object()
            .is_some_and(|v| !v.is_empty())
            || Instant::now() >= end
        {
            break r;
        }
        std::thread::sleep(Duration::from_millis(200));
    };
    let verdicts = record["topology"]["verdicts"].as_object().unwrap();
    let areas: Vec<&str> = verdicts.keys().map(String::as_str).collect();
    assert_eq!(areas, ["gdr", "gds", "p2p"], "{record}");
    for v in verdicts.values() {
        let v = v.as_str().unwrap();
        assert!(
            ["ok", "degraded", "unavailable", "unknown", "not-run"].contains(&v),
            "{record}"
        );
    }
    assert_eq!(record["incarnation"], inc.as_str());
    // The 64 MiB export is serve's shared host memory: offered to agents of this node as a
    // sealed memfd, with no CUDA IPC handle.
    let region = &record["regions"][0];
    assert_eq!(region["kind"], "host", "{record}");
    assert_eq!(region["len"], 64u64 << 20, "{record}");
    assert_eq!(region["shm"], true, "{record}");
    assert_eq!(region["cuda_ipc"], false, "{record}");
    let text = String::from_utf8(cluster_ls(&url, &[]).stdout).unwrap();
    assert!(text.contains("DOCTOR"), "{text}");
    assert!(
        text.contains(&format!("p2p {}", verdicts["p2p"].as_str().unwrap())),
        "{text}"
    );
    assert!(text.contains("(shm)"), "{text}");
    srv.kill().unwrap();
    srv.wait().unwrap();
}

#[test]
fn bench_by_peer_name_checks_the_incarnation_in_the_handshake() {
    let Some(e) = Etcd::start() else { return };
    let _serial = gdpath_testkit::ucx_serial();
    let url = e.url("bn");
    let (mut srv, _inc) = serve(&url, "prefill-0", e.dir.path());
    let token_file = e.dir.path().join("token");
    let bench = |name: &str, args: &[&str]| {
        Command::new(env!("CARGO_BIN_EXE_gdpath"))
            .args(["bench"])
            .args(args)
            .args(["--peer-name", name, "--cluster", &url, "--devices", "lo"])
            .arg("--token-file")
            .arg(&token_file)
            .args(["--json", "--connect-timeout", "5"])
            .output()
            .unwrap()
    };
    let net = [
        "net",
        "--size",
        "4KiB",
        "--runs",
        "1",
        "--bytes-per-run",
        "1MiB",
    ];
    let kv = [
        "kv",
        "--src",
        "host",
        "--dst",
        "peer-host",
        "--blocks",
        "64",
        "--block-size",
        "4KiB",
        "--runs",
        "1",
        "--no-shared-memory",
    ];
    // The record's own incarnation answers: the bench runs and verifies its bytes.
    let out = bench("prefill-0", &net);
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    // A record naming another incarnation at the same address (what a restarted agent's
    // predecessor left): refused after the handshake, never measured.
    let key = "/bn/agents/prefill-0";
    let live: serde_json::Value =
        serde_json::from_str(e.ctl(&["get", key, "--print-value-only"]).trim()).unwrap();
    let mut stale = live.clone();
    stale["name"] = "stale-0".into();
    stale["incarnation"] = "0123456789abcdef0123456789abcdef".into();
    e.ctl_stdin(&["put", "/bn/agents/stale-0"], stale.to_string().as_bytes());
    for args in [&net[..], &kv[..]] {
        let out = bench("stale-0", args);
        assert_eq!(out.status.code(), Some(1), "{args:?}");
        let doc: serde_json::Value = serde_json::from_slice(&out.stdout)
            .unwrap_or_else(|_| panic!("{}", String::from_utf8_lossy(&out.stderr)));
        assert_eq!(doc["kind"], "incarnation_mismatch", "{args:?}: {doc}");
    }
    srv.kill().unwrap();
    srv.wait().unwrap();
}

/// Lines of `out` (stdout and stderr) that hold a raw control character or run past `width`.
fn unsafe_lines(out: &std::process::Output, width: usize) -> Vec<String> {
    [&out.stdout, &out.stderr]
        .iter()
        .flat_map(|b| {
            String::from_utf8_lossy(b)
                .lines()
                .map(str::to_owned)
                .collect::<Vec<_>>()
        })
        .filter(|l| l.chars().any(char::is_control) || l.chars().count() > width)
        .map(|l| l.chars().take(120).collect())
        .collect()
}

#[test]
fn hostile_records_reach_ls_watch_and_serve_escaped_and_bounded() {
    let Some(e) = Etcd::start() else { return };
    let url = e.url("hx");
    let (mut srv, _inc) = serve(&url, "good", e.dir.path());
    let key = "/hx/agents/good";
    let good: serde_json::Value =
        serde_json::from_str(e.ctl(&["get", key, "--print-value-only"]).trim()).unwrap();
    let hostile = |name: &str| {
        let mut v = good.clone();
        v["name"] = name.into();
        // The reviewer's: OSC title, clear screen, OSC 52 clipboard write, then 200 KB.
        v["regions"][0]["kind"] = format!(
            "\u{1b}]0;PWNED\u{7}\u{1b}[2J\u{1b}]52;c;ZXZpbA==\u{7}{}",
            "Z".repeat(200_000)
        )
        .into();
        v.to_string()
    };
    let lease = e.lease_grant(120);
    e.ctl_stdin(
        &["put", "--lease", &lease, "/hx/agents/m"],
        hostile("m").as_bytes(),
    );
    let long = "L".repeat(5000);
    let mut v = good.clone();
    v["name"] = long.clone().into();
    e.ctl_stdin(
        &["put", &format!("/hx/agents/{long}")],
        v.to_string().as_bytes(),
    );
    let mut v = good.clone();
    v["name"] = "x".into();
    e.ctl_stdin(&["put", "/hx/agents/nested/x"], v.to_string().as_bytes());

    let out = cluster_ls(&url, &[]);
    assert!(out.status.success());
    assert_eq!(unsafe_lines(&out, 400), Vec::<String>::new());
    let table = String::from_utf8_lossy(&out.stdout);
    assert!(table.contains("/hx/agents/nested/x"), "{table}");
    assert!(!table.lines().any(|l| l.starts_with("x ")), "{table}");
    // JSON keeps the whole key.
    let doc: serde_json::Value =
        serde_json::from_slice(&cluster_ls(&url, &["--json"]).stdout).unwrap();
    assert!(doc["agents"]
        .as_array()
        .unwrap()
        .iter()
        .any(|a| a["key"].as_str().is_some_and(|k| k.ends_with(&long))));

    let out = Command::new(env!("CARGO_BIN_EXE_gdpath"))
        .args(["cluster", "watch", "--duration", "3", "--cluster", &url])
        .output()
        .unwrap();
    assert!(out.status.success());
    assert_eq!(unsafe_lines(&out, 700), Vec::<String>::new());
    assert!(String::from_utf8_lossy(&out.stdout)
        .contains("invalid /hx/agents/m: not a record: unknown variant"));

    let out = Command::new(env!("CARGO_BIN_EXE_gdpath"))
        .args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--devices",
            "lo",
            "--name",
            "m",
        ])
        .args(["--cluster", &url, "--duration", "2", "--token-file"])
        .arg(e.dir.path().join("token"))
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(1));
    assert_eq!(unsafe_lines(&out, 800), Vec::<String>::new());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("etcdctl del /hx/agents/m"), "{err}");
    srv.kill().unwrap();
    srv.wait().unwrap();
}

#[test]
fn serve_notices_its_record_written_over_and_watch_tells_a_new_incarnation_as_left_and_joined() {
    let Some(e) = Etcd::start() else { return };
    let url = e.url("hj");
    let (mut srv, inc, log) = serve_logged(&url, "a", e.dir.path(), TTL_S);
    let watch = watch_json(&url, 8);
    std::thread::sleep(Duration::from_millis(1500));
    let key = "/hj/agents/a";
    let mut other: serde_json::Value =
        serde_json::from_str(e.ctl(&["get", key, "--print-value-only"]).trim()).unwrap();
    let theirs = "f".repeat(32);
    other["incarnation"] = theirs.clone().into();
    e.ctl_stdin(&["put", key], other.to_string().as_bytes());
    let said: Vec<String> = std::iter::from_fn(|| log.recv_timeout(Duration::from_secs(6)).ok())
        .take_while(|l| !l.contains("record published again"))
        .collect();
    assert!(
        said.iter()
            .any(|l| l.starts_with("cluster: record replaced or deleted by someone else")),
        "{said:?}"
    );
    let out = watch.wait_with_output().unwrap();
    let events: Vec<(String, String)> = String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str::<serde_json::Value>(l).unwrap())
        // The doctor's verdicts come as an update of the same incarnation.
        .filter(|v| v["event"] != "updated")
        .map(|v| {
            let inc = v["incarnation"]
                .as_str()
                .or(v["record"]["incarnation"].as_str());
            (
                v["event"].as_str().unwrap().to_owned(),
                inc.unwrap_or("").to_owned(),
            )
        })
        .collect();
    let pairs = |ev: &str, i: &str| (ev.to_owned(), i.to_owned());
    assert_eq!(
        events,
        [
            pairs("joined", &inc),
            pairs("left", &inc),
            pairs("joined", &theirs),
            pairs("left", &theirs),
            pairs("joined", &inc),
        ]
    );
    srv.kill().unwrap();
    srv.wait().unwrap();
}

#[test]
fn serve_help_gives_both_name_limits() {
    let out = Command::new(env!("CARGO_BIN_EXE_gdpath"))
        .args(["serve", "--help"])
        .output()
        .unwrap();
    let help = String::from_utf8_lossy(&out.stdout);
    assert!(
        help.contains("1 to 64 characters; with --cluster 1 to 31"),
        "{help}"
    );
}
