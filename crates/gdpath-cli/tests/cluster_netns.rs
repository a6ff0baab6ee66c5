//! Agents in their own network namespaces, joined through a bridge in a third one where etcd
//! runs (as root; skipped aloud otherwise): a decode agent finds a prefill agent by name and
//! moves verified bytes and KV blocks across namespaces; the prefill namespace's link goes
//! down, its lease expires and a watcher sees it gone within the TTL; the link comes back and
//! it re-joins.

mod common;
#[path = "../../gdpath-cluster/tests/common/mod.rs"]
mod etcd;

use common::ip;
use std::io::{BufRead, BufReader};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

const TTL_S: u64 = 2;

/// Namespaces `hub` (a bridge at .1, etcd), `a` (.2) and `b` (.3) on 10.214.N.0/24.
struct Net {
    hub: String,
    a: String,
    b: String,
    oct: u32,
    tag: u32,
}

impl Net {
    fn create(tag: u32) -> Result<Net, String> {
        let n = Net {
            hub: format!("gdc-h-{tag}"),
            a: format!("gdc-a-{tag}"),
            b: format!("gdc-b-{tag}"),
            oct: 16 + tag % 200,
            tag,
        };
        for ns in [&n.hub, &n.a, &n.b] {
            ip(&["netns", "add", ns])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        ip(&["-n", &n.hub, "link", "add", "br0", "type", "bridge"])?;
        ip(&[
            "-n",
            &n.hub,
            "addr",
            "add",
            &format!("10.214.{}.1/24", n.oct),
            "dev",
            "br0",
        ])?;
        ip(&["-n", &n.hub, "link", "set", "br0", "up"])?;
        for (ns, side, host) in [(&n.a, "a", 2), (&n.b, "b", 3)] {
            let (h, g) = (format!("gch{side}{tag}"), n.dev(side));
            ip(&["link", "add", &h, "type", "veth", "peer", "name", &g])?;
            ip(&["link", "set", &h, "netns", &n.hub])?;
            ip(&["link", "set", &g, "netns", ns])?;
            ip(&["-n", &n.hub, "link", "set", &h, "master", "br0", "up"])?;
            let addr = format!("10.214.{}.{host}/24", n.oct);
            ip(&["-n", ns, "addr", "add", &addr, "dev", &g])?;
            ip(&["-n", ns, "link", "set", &g, "up"])?;
        }
        Ok(n)
    }

    /// The veth end inside namespace `side` (`a` or `b`).
    fn dev(&self, side: &str) -> String {
        format!("gcn{side}{}", self.tag)
    }

    fn addr(&self, host: u32) -> String {
        format!("10.214.{}.{host}", self.oct)
    }
}

impl Drop for Net {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b, &self.hub] {
            let _ = Command::new("ip").args(["netns", "del", ns]).status();
        }
    }
}

fn gdpath_in(ns: &str) -> Command {
    let mut c = Command::new("ip");
    c.args(["netns", "exec", ns, env!("CARGO_BIN_EXE_gdpath")]);
    c
}

/// Lines of `child`'s stdout, read on a thread of their own.
fn lines_of(child: &mut Child) -> mpsc::Receiver<String> {
    let (tx, rx) = mpsc::channel();
    let out = child.stdout.take().unwrap();
    std::thread::spawn(move || {
        for l in BufReader::new(out).lines().map_while(Result::ok) {
            if tx.send(l).is_err() {
                return;
            }
        }
    });
    rx
}

/// Waits up to `t` for a line for which `f` holds; returns it.
fn wait_for(rx: &mpsc::Receiver<String>, t: Duration, f: impl Fn(&str) -> bool) -> Option<String> {
    let end = Instant::now() + t;
    while let Some(left) = end.checked_duration_since(Instant::now()) {
        match rx.recv_timeout(left) {
            Ok(l) if f(&l) => return Some(l),
            Ok(_) => {}
            Err(_) => return None,
        }
    }
    None
}

struct Killed(Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

fn json_rows_verified(out: &std::process::Output) -> usize {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let j: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let rows = j["rows"].as_array().unwrap();
    for r in rows {
        assert_eq!(r["verified"], true, "{r}");
    }
    rows.len()
}

#[test]
fn found_by_name_across_namespaces_then_partitioned_gone_and_back() {
    let _serial = gdpath_testkit::ucx_serial();
    if let Some(why) = common::why_no_netns() {
        eprintln!("SKIP found_by_name_across_namespaces_then_partitioned_gone_and_back: {why}");
        return;
    }
    if etcd::etcd_binary().is_none() {
        return;
    }
    let tag = std::process::id() % 10_000;
    let net = Net::create(tag).unwrap_or_else(|e| panic!("creating namespaces failed: {e}"));
    let Some(e) = etcd::Etcd::start_in(&net.hub, &net.addr(1)) else {
        return;
    };
    let url = e.url("kv");
    let tok = e.dir.path().join("token");
    std::fs::write(&tok, "netns cluster token 0123456789").unwrap();
    let listen = format!("{}:18515", net.addr(2));

    // The prefill agent in namespace a, published by name.
    let mut prefill = gdpath_in(&net.a)
        .args(["serve", "--listen", &listen, "--export", "host:64MiB"])
        .args(["--name", "prefill-0", "--cluster", &url])
        .args([
            "--lease-ttl",
            &TTL_S.to_string(),
            "--devices",
            &net.dev("a"),
        ])
        .arg("--token-file")
        .arg(&tok)
        .stdout(Stdio::piped())
        .stderr(Stdio::null())
        .spawn()
        .unwrap();
    let prefill_out = lines_of(&mut prefill);
    let prefill = Killed(prefill);
    let published = wait_for(&prefill_out, Duration::from_secs(30), |l| {
        l.starts_with("cluster: published prefill-0")
    })
    .expect("prefill publishes");
    let inc = published.split_whitespace().nth(4).unwrap().to_owned();

    // A watcher in namespace b.
    let mut watch = gdpath_in(&net.b)
        .args([
            "cluster",
            "watch",
            "--json",
            "--duration",
            "90",
            "--cluster",
            &url,
        ])
        .stdout(Stdio::piped())
        .spawn()
        .unwrap();
    let events = lines_of(&mut watch);
    let _watch = Killed(watch);
    let is = |ev: &'static str| {
        let inc = inc.clone();
        move |l: &str| {
            let v: serde_json::Value = serde_json::from_str(l).unwrap_or_default();
            v["event"] == ev
                && (v["incarnation"] == inc.as_str() || v["record"]["incarnation"] == inc.as_str())
        }
    };
    wait_for(&events, Duration::from_secs(10), is("joined")).expect("the watcher sees prefill");

    // The decode side in namespace b finds it by name: verified gets, and KV blocks written
    // into its host memory through UCX, checked.
    let out = gdpath_in(&net.b)
        .args([
            "bench",
            "net",
            "--peer-name",
            "prefill-0",
            "--cluster",
            &url,
        ])
        .args(["--op", "get", "--size", "4KiB,1MiB", "--runs", "1"])
        .args([
            "--bytes-per-run",
            "8MiB",
            "--json",
            "--devices",
            &net.dev("b"),
        ])
        .arg("--token-file")
        .arg(&tok)
        .output()
        .unwrap();
    assert_eq!(json_rows_verified(&out), 2);
    let out = gdpath_in(&net.b)
        .args(["bench", "kv", "--src", "host", "--dst", "peer-host"])
        .args(["--peer-name", "prefill-0", "--cluster", &url])
        .args(["--blocks", "1000", "--block-size", "16KiB", "--runs", "1"])
        .args(["--no-shared-memory", "--json", "--devices", &net.dev("b")])
        .arg("--token-file")
        .arg(&tok)
        .output()
        .unwrap();
    assert_eq!(json_rows_verified(&out), 2);

    // Partition: namespace a's link goes down. Its lease expires; the watcher sees it gone
    // within the TTL (plus etcd's 500 ms expiry scan and the watch's delivery).
    let t0 = Instant::now();
    ip(&["-n", &net.a, "link", "set", &net.dev("a"), "down"]).unwrap();
    wait_for(&events, Duration::from_secs(TTL_S + 5), is("left"))
        .unwrap_or_else(|| panic!("no leave within {} s", TTL_S + 5));
    let gone_after = t0.elapsed();
    assert!(
        gone_after <= Duration::from_secs(TTL_S + 3),
        "gone after {gone_after:?}"
    );
    // The link returns: the agent re-publishes (same incarnation) and says so.
    ip(&["-n", &net.a, "link", "set", &net.dev("a"), "up"]).unwrap();
    wait_for(&events, Duration::from_secs(20), is("joined")).expect("prefill re-joins");
    wait_for(&prefill_out, Duration::from_secs(5), |l| {
        l.starts_with("cluster: record published again")
    })
    .expect("serve says it published again");
    drop(prefill);
    drop(e);
    drop(net);
}
