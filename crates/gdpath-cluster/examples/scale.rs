//! Scale measurement (scripts/cluster-scale.sh): N memberships in one process against one
//! etcd, each with its own lease. Prints the time to register all, the time for one watcher
//! to see every join, and the time from stopping every keep-alive at once (as SIGKILL would)
//! to the watcher seeing every leave; then etcd's CPU time and RSS from /proc.
//!
//! Usage: scale URL N TTL_S ETCD_PID

use gdpath_cluster::{AgentRecord, Cluster, ClusterEvent, ClusterUrl, Membership};
use std::collections::HashSet;
use std::time::{Duration, Instant};

fn etcd_usage(pid: &str) -> (f64, u64) {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap_or_default();
    let f: Vec<&str> = stat
        .rsplit_once(')')
        .map(|(_, r)| r.split_whitespace().collect())
        .unwrap_or_default();
    let tick = 100.0; // USER_HZ on Linux x86-64
    let cpu = f
        .get(11)
        .zip(f.get(12))
        .map(|(u, s)| (u.parse::<f64>().unwrap_or(0.0) + s.parse::<f64>().unwrap_or(0.0)) / tick)
        .unwrap_or(0.0);
    let status = std::fs::read_to_string(format!("/proc/{pid}/status")).unwrap_or_default();
    let rss = status
        .lines()
        .find_map(|l| l.strip_prefix("VmRSS:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0);
    (cpu, rss)
}

fn main() {
    let a: Vec<String> = std::env::args().collect();
    let url: ClusterUrl = a[1].parse().expect("URL");
    let n: usize = a[2].parse().expect("N");
    let ttl = Duration::from_secs(a[3].parse().expect("TTL"));
    let pid = &a[4];
    let watcher = Cluster::connect(&url).expect("watcher connects");
    let w = watcher.watch().expect("watch");
    let (cpu0, rss0) = etcd_usage(pid);
    let t0 = Instant::now();
    // Agents join from 8 threads, each agent on its own lease; one shared gRPC connection per
    // thread (a real deployment has one per process).
    let per = n.div_ceil(8);
    let handles: Vec<_> = (0..8)
        .map(|t| {
            let url = url.clone();
            std::thread::spawn(move || {
                let c = Cluster::connect(&url).expect("connect");
                (t * per..((t + 1) * per).min(n))
                    .map(|i| {
                        let r =
                            AgentRecord::new(&format!("agent-{i}"), "127.0.0.1:1".parse().unwrap())
                                .unwrap();
                        Membership::join(&c, r, ttl).expect("join")
                    })
                    .collect::<Vec<_>>()
            })
        })
        .collect();
    let members: Vec<Membership> = handles
        .into_iter()
        .flat_map(|h| h.join().unwrap())
        .collect();
    let registered = t0.elapsed();
    let mut seen = HashSet::new();
    while seen.len() < n && t0.elapsed() < Duration::from_secs(120) {
        if let Some(ClusterEvent::Joined(r)) = w.next(Duration::from_millis(100)) {
            seen.insert(r.name);
        }
    }
    let all_seen = t0.elapsed();
    // Steady state: keep-alives only, for three TTLs.
    let (cpu1, _) = etcd_usage(pid);
    std::thread::sleep(ttl * 3);
    let (cpu2, rss2) = etcd_usage(pid);
    let t1 = Instant::now();
    for m in members {
        m.abandon();
    }
    let mut left = HashSet::new();
    let mut first = None;
    while left.len() < n && t1.elapsed() < ttl * 4 + Duration::from_secs(30) {
        if let Some(ClusterEvent::Left { name, .. }) = w.next(Duration::from_millis(100)) {
            first.get_or_insert(t1.elapsed());
            left.insert(name);
        }
    }
    let gone = t1.elapsed();
    println!("agents {n}, TTL {:?}", ttl);
    println!("register all: {:.2} s", registered.as_secs_f64());
    println!(
        "watcher saw every join: {:.2} s after the first join began ({} seen)",
        all_seen.as_secs_f64(),
        seen.len()
    );
    println!(
        "keep-alives stopped -> watcher saw every leave: first {:.2} s, all {:.2} s ({} seen)",
        first.unwrap_or_default().as_secs_f64(),
        gone.as_secs_f64(),
        left.len()
    );
    println!(
        "etcd CPU: {:.2} s during registration, {:.3} CPU-s/s steady (keep-alives); RSS {} MiB before, {} MiB with {n} agents",
        cpu1 - cpu0,
        (cpu2 - cpu1) / (ttl * 3).as_secs_f64(),
        rss0 / 1024,
        rss2 / 1024
    );
}
