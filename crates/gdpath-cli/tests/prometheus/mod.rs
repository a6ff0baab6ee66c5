//! A real Prometheus for the metrics tests: Debian's `prometheus`, started with a temporary
//! config and data folder and scraping every second, optionally inside a network namespace
//! (`ip netns exec`), and asked through its HTTP API (`/api/v1/query`).
#![allow(dead_code)]

use std::collections::BTreeMap;
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

/// How long a query is polled before the test fails: generous, for a loaded 2-core machine.
pub const T: Duration = Duration::from_secs(90);

/// One series of a query's answer: its labels and its value.
pub type Series = (BTreeMap<String, String>, f64);

/// Kills a child process when dropped (the test may fail halfway).
pub struct Killed(pub Child);

impl Drop for Killed {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A running Prometheus; stopped when dropped.
pub struct Prometheus {
    /// Where its HTTP API listens (in `netns` when set).
    pub addr: SocketAddr,
    netns: Option<String>,
    _proc: Killed,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts `bin` listening on `addr`, in network namespace `netns` when given, scraping each
    /// `(job, target)` every second.
    pub fn start(
        bin: &std::path::Path,
        netns: Option<&str>,
        addr: SocketAddr,
        jobs: &[(&str, SocketAddr)],
    ) -> Prometheus {
        let dir = gdpath_testkit::scratch();
        let mut config =
            String::from("global:\n  scrape_interval: 1s\n  scrape_timeout: 1s\nscrape_configs:\n");
        for (job, target) in jobs {
            config += &format!(
                "  - job_name: {job}\n    static_configs:\n      - targets: ['{target}']\n"
            );
        }
        let file = dir.path().join("prometheus.yml");
        std::fs::write(&file, config).unwrap();
        let log = std::fs::File::create(dir.path().join("prometheus.log")).unwrap();
        let mut cmd = match netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns]).arg(bin);
                c
            }
            None => Command::new(bin),
        };
        let child = cmd
            .arg(format!("--config.file={}", file.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .stdout(Stdio::null())
            .stderr(log)
            .spawn()
            .unwrap();
        Prometheus {
            addr,
            netns: netns.map(str::to_owned),
            _proc: Killed(child),
            dir,
        }
    }

    /// The answer to the instant query `q`: each series' labels and value; empty while
    /// Prometheus does not answer yet.
    pub fn query(&self, q: &str) -> Vec<Series> {
        let path = format!("/api/v1/query?query={}", encode(q));
        let body = match &self.netns {
            Some(ns) => in_netns(ns, || http_get(self.addr, &path)),
            None => http_get(self.addr, &path),
        };
        let Some(body) = body else {
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

    /// Polls `q` until `ok` holds for its answer; after [`T`], panics with the last answer and
    /// the end of Prometheus's log.
    pub fn wait_for(&self, q: &str, ok: impl Fn(&[Series]) -> bool) {
        let end = Instant::now() + T;
        loop {
            let r = self.query(q);
            if ok(&r) {
                return;
            }
            if Instant::now() >= end {
                let log = std::fs::read_to_string(self.dir.path().join("prometheus.log"))
                    .unwrap_or_default();
                let tail = &log[log.len().saturating_sub(4000)..];
                panic!("{q}: {r:?} after {T:?}; prometheus's log ends:\n{tail}");
            }
            std::thread::sleep(Duration::from_millis(300));
        }
    }
}

/// Runs `f` on a thread of its own that has entered network namespace `ns` (a network
/// namespace is a thread's, so this process's other threads stay where they are).
fn in_netns<R: Send>(ns: &str, f: impl FnOnce() -> Option<R> + Send) -> Option<R> {
    let file = std::fs::File::open(format!("/run/netns/{ns}")).ok()?;
    std::thread::scope(|s| {
        s.spawn(|| {
            use std::os::fd::AsRawFd;
            // SAFETY: setns on an open namespace file; it changes only the calling thread.
            if unsafe { libc::setns(file.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                panic!("setns {ns}: {}", std::io::Error::last_os_error());
            }
            f()
        })
        .join()
        .unwrap()
    })
}

/// `GET path` on `addr`, the body of a 200 answer; `None` for anything else.
fn http_get(addr: SocketAddr, path: &str) -> Option<String> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(2)).ok()?;
    s.set_read_timeout(Some(Duration::from_secs(5))).ok()?;
    write!(s, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").ok()?;
    let mut out = String::new();
    s.read_to_string(&mut out).ok()?;
    let (head, body) = out.split_once("\r\n\r\n")?;
    (head.starts_with("HTTP/1.1 200") || head.starts_with("HTTP/1.0 200")).then(|| body.to_owned())
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
