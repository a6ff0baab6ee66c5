//! Helpers shared by the CLI's integration tests: the `gdpath` binary, running it, and a
//! `gdpath serve` child whose output lines are watched.
#![allow(dead_code)]

use std::io::{BufRead, BufReader};
use std::net::SocketAddr;
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{channel, Receiver};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

/// The `gdpath` binary cargo built for these tests, or `$GDPATH_BIN` when the test binary was
/// copied to another machine (the GPU suite).
pub fn bin() -> String {
    std::env::var("GDPATH_BIN").unwrap_or_else(|_| env!("CARGO_BIN_EXE_gdpath").to_owned())
}

/// Runs `gdpath ARGS`: (success, stdout, stderr).
pub fn gdpath(args: &[&str]) -> (bool, String, String) {
    let out = Command::new(bin()).args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The finding `id` of a JSON document with a `findings` list (`doctor --json`,
/// `nccl --json`); panics naming the id and the document where there is none.
pub fn finding<'v>(v: &'v serde_json::Value, id: &str) -> &'v serde_json::Value {
    v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == id)
        .unwrap_or_else(|| panic!("no {id} in {v}"))
}

/// The JSON document a successful run printed on stdout; panics with its stderr if the run
/// failed, or with the text if stdout is not JSON.
pub fn json_ok(out: &std::process::Output) -> serde_json::Value {
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {}",
            String::from_utf8_lossy(&out.stdout)
        )
    })
}

/// The `gdpath.error/1` document a failing `--json` run printed on stdout; asserts its schema,
/// that its message is a non-empty string stderr carries too, and that it names a kind.
pub fn error_doc(out: &std::process::Output) -> serde_json::Value {
    let stderr = String::from_utf8_lossy(&out.stderr);
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap_or_else(|e| {
        panic!(
            "stdout is not JSON ({e}): {:?}; stderr: {stderr}",
            String::from_utf8_lossy(&out.stdout)
        )
    });
    assert_eq!(v["schema"], "gdpath.error/1", "{v}");
    let msg = v["error"].as_str().expect("error is a string");
    assert!(
        !msg.is_empty() && stderr.contains(msg),
        "{msg:?} not in stderr {stderr:?}"
    );
    assert!(v["kind"].is_string(), "{v}");
    v
}

/// A child process whose stdout lines arrive on a channel; its stderr is passed through to the
/// test's and kept; killed when dropped.
pub struct Proc {
    pub child: Child,
    lines: Receiver<String>,
    seen: Vec<String>,
    stderr: Arc<Mutex<Vec<String>>>,
    stderr_reader: Option<std::thread::JoinHandle<()>>,
}

impl Proc {
    pub fn spawn(cmd: &mut Command) -> Proc {
        let mut child = cmd
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("spawn");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let (err, kept) = (child.stderr.take().unwrap(), stderr.clone());
        let stderr_reader = std::thread::spawn(move || {
            for l in BufReader::new(err).lines() {
                let Ok(l) = l else { break };
                eprintln!("{l}");
                kept.lock().unwrap().push(l);
            }
        });
        let out = child.stdout.take().unwrap();
        let (tx, lines) = channel();
        std::thread::spawn(move || {
            for l in BufReader::new(out).lines() {
                let Ok(l) = l else { break };
                if tx.send(l).is_err() {
                    break;
                }
            }
        });
        Proc {
            child,
            lines,
            seen: Vec::new(),
            stderr,
            stderr_reader: Some(stderr_reader),
        }
    }

    /// Waits up to `timeout` for the process to exit (panics after it), then for its stderr to
    /// be read to the end, so that [`Proc::stderr`] holds all of it.
    pub fn wait_exit(&mut self, timeout: Duration) -> std::process::ExitStatus {
        let end = Instant::now() + timeout;
        let status = loop {
            if let Some(s) = self.child.try_wait().expect("try_wait") {
                break s;
            }
            assert!(
                Instant::now() < end,
                "the process did not exit within {timeout:?}"
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        if let Some(h) = self.stderr_reader.take() {
            let _ = h.join();
        }
        status
    }

    /// The stderr lines so far.
    pub fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// Waits for a line containing `needle`: `Err` with the lines seen when `timeout` passes or
    /// the process closes its stdout (exits) first.
    pub fn try_wait_line(
        &mut self,
        needle: &str,
        timeout: Duration,
    ) -> Result<String, Vec<String>> {
        let end = Instant::now() + timeout;
        loop {
            let left = end.saturating_duration_since(Instant::now());
            match self.lines.recv_timeout(left) {
                Ok(l) => {
                    self.seen.push(l.clone());
                    if l.contains(needle) {
                        return Ok(l);
                    }
                }
                Err(_) => return Err(self.seen.clone()),
            }
        }
    }

    /// Every stdout line read so far: those seen while waiting, then those waiting on the
    /// channel.
    pub fn stdout_lines(&mut self) -> Vec<String> {
        while let Ok(l) = self.lines.try_recv() {
            self.seen.push(l);
        }
        self.seen.clone()
    }

    /// Waits for a line containing `needle`; panics with what was seen after `timeout` (or
    /// when the process exits first).
    pub fn wait_line(&mut self, needle: &str, timeout: Duration) -> String {
        self.try_wait_line(needle, timeout).unwrap_or_else(|seen| {
            panic!("no line with {needle:?} within {timeout:?}; saw {seen:?}")
        })
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

/// Starts `gdpath serve` (optionally under a command prefix such as `ip netns exec NS`) and
/// returns it with its listening address, waiting at most `timeout` for it to listen.
pub fn serve(prefix: &[&str], args: &[&str], timeout: Duration) -> (Proc, SocketAddr) {
    let mut cmd = if prefix.is_empty() {
        Command::new(bin())
    } else {
        let mut c = Command::new(prefix[0]);
        c.args(&prefix[1..]).arg(bin());
        c
    };
    cmd.arg("serve").args(args);
    let mut p = Proc::spawn(&mut cmd);
    let line = p.wait_line("listening on", timeout);
    let addr = line
        .split_whitespace()
        .nth(4)
        .and_then(|a| a.parse().ok())
        .unwrap_or_else(|| panic!("no address in {line:?}"));
    (p, addr)
}

/// `gdpath serve` on an ephemeral loopback port (`--devices lo`, at most 120 s), under a command
/// `prefix` (empty, or a shell setting a limit), with `extra` arguments; waits up to 30 s for
/// it to listen.
pub fn lo_serve_under(prefix: &[&str], extra: &[&str]) -> (Proc, SocketAddr) {
    let mut args = vec![
        "--listen",
        "127.0.0.1:0",
        "--devices",
        "lo",
        "--duration",
        "120",
    ];
    args.extend_from_slice(extra);
    serve(prefix, &args, Duration::from_secs(30))
}

/// [`lo_serve_under`] without a prefix.
pub fn lo_serve(extra: &[&str]) -> (Proc, SocketAddr) {
    lo_serve_under(&[], extra)
}

/// `gdpath bench net --peer PEER --devices lo`, to which a test adds its own arguments.
pub fn bench_net(peer: &str) -> Command {
    let mut c = Command::new(bin());
    c.args(["bench", "net", "--peer", peer, "--devices", "lo"]);
    c
}

/// Sends `sig` to the child process of `p`.
pub fn signal(p: &Proc, sig: libc::c_int) {
    // SAFETY: kill(2) on our own child's pid.
    let r = unsafe { libc::kill(p.child.id() as libc::pid_t, sig) };
    assert_eq!(r, 0, "kill: {}", std::io::Error::last_os_error());
}

/// Writes a safetensors file of `tensors` (name, element count of F32), data in that order,
/// synced to the device (so that eviction can drop its pages); returns (total tensor bytes,
/// where the data section starts in the file).
pub fn write_checkpoint(path: &std::path::Path, tensors: &[(&str, usize)]) -> (u64, u64) {
    use std::io::Write;
    let mut header = serde_json::Map::new();
    let mut off = 0usize;
    for (name, n) in tensors {
        header.insert(
            (*name).to_owned(),
            serde_json::json!({"dtype": "F32", "shape": [n], "data_offsets": [off, off + 4 * n]}),
        );
        off += 4 * n;
    }
    let h = serde_json::to_vec(&serde_json::Value::Object(header)).unwrap();
    let mut bytes = (h.len() as u64).to_le_bytes().to_vec();
    bytes.extend_from_slice(&h);
    bytes.extend((0..off).map(|i| (i % 251) as u8));
    let mut f = std::fs::File::create(path).unwrap();
    f.write_all(&bytes).unwrap();
    f.sync_all().unwrap();
    (off as u64, 8 + h.len() as u64)
}

/// `ip ARGS` (iproute2), its stderr as the error when it fails.
pub fn ip(args: &[&str]) -> Result<(), String> {
    let o = Command::new("ip")
        .args(args)
        .output()
        .map_err(|e| e.to_string())?;
    if o.status.success() {
        Ok(())
    } else {
        Err(format!(
            "ip {}: {}",
            args.join(" "),
            String::from_utf8_lossy(&o.stderr)
        ))
    }
}

/// Why this process cannot make network namespaces (`None`: it can): it is not root, or
/// iproute2's `ip` is missing.
pub fn why_no_netns() -> Option<&'static str> {
    if !gdpath_testkit::is_root() {
        return Some("needs root for ip netns");
    }
    if Command::new("ip").arg("-V").output().is_err() {
        return Some("`ip` (iproute2) missing");
    }
    None
}

/// Two network namespaces joined by a veth pair, each end with a private address: namespace
/// `a` holds `dev_a` at `addr_a` (10.213.O.1/24), `b` holds `dev_b` at `addr_b` (.2), with O
/// and every name made from the tag (the test process's pid, so that test binaries running at
/// once do not collide). Needs root and iproute2. Both namespaces, and with them the veth
/// pair, are deleted when it is dropped, also when creating it failed halfway.
pub struct VethPair {
    /// The first namespace's name (`ip netns`).
    pub a: String,
    /// The second namespace's name.
    pub b: String,
    /// The veth end in `a`.
    pub dev_a: String,
    /// The veth end in `b`.
    pub dev_b: String,
    /// The address of `dev_a`.
    pub addr_a: std::net::Ipv4Addr,
    /// The address of `dev_b`.
    pub addr_b: std::net::Ipv4Addr,
}

impl VethPair {
    /// Creates the namespaces and the link, both ends up with `lo`. Errors: the `ip` command
    /// that failed, with its stderr.
    pub fn create(tag: u32) -> Result<VethPair, String> {
        let oct = (16 + tag % 200) as u8;
        let n = VethPair {
            a: format!("gdp-a-{tag}"),
            b: format!("gdp-b-{tag}"),
            dev_a: format!("gva{tag}"),
            dev_b: format!("gvb{tag}"),
            addr_a: [10, 213, oct, 1].into(),
            addr_b: [10, 213, oct, 2].into(),
        };
        ip(&["netns", "add", &n.a])?;
        ip(&["netns", "add", &n.b])?;
        ip(&[
            "link", "add", &n.dev_a, "type", "veth", "peer", "name", &n.dev_b,
        ])?;
        ip(&["link", "set", &n.dev_a, "netns", &n.a])?;
        ip(&["link", "set", &n.dev_b, "netns", &n.b])?;
        for (ns, dev, addr) in [(&n.a, &n.dev_a, n.addr_a), (&n.b, &n.dev_b, n.addr_b)] {
            ip(&["-n", ns, "addr", "add", &format!("{addr}/24"), "dev", dev])?;
            ip(&["-n", ns, "link", "set", dev, "up"])?;
            ip(&["-n", ns, "link", "set", "lo", "up"])?;
        }
        Ok(n)
    }
}

impl Drop for VethPair {
    fn drop(&mut self) {
        for ns in [&self.a, &self.b] {
            let _ = ip(&["netns", "del", ns]);
        }
        // A pair that never moved into a namespace is still in this one (normally gone).
        let _ = ip(&["link", "del", &self.dev_a]);
    }
}
