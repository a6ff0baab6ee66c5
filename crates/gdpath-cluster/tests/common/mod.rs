//! A real etcd (Debian's `etcd-server`) started on free loopback ports with a temporary data
//! directory, stopped (SIGKILL) on drop.

#![allow(dead_code)]

use std::net::TcpListener;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

pub struct Etcd {
    pub client_port: u16,
    peer_port: u16,
    pub dir: tempfile::TempDir,
    child: Option<Child>,
    pub host: String,
    /// The network namespace etcd runs in (`ip netns exec`), if not this one.
    netns: Option<String>,
    /// Clients reach it over TLS, its certificate signed by `dir/ca.pem`.
    pub tls: bool,
    /// Clients must present a certificate signed by `dir/ca.pem` (`--client-cert-auth`); one is
    /// made as `dir/client.pem` and `dir/client.key`.
    pub client_auth: bool,
}

/// The etcd binary, or `None` (said aloud) where it is not installed; CI installs it and sets
/// `GDPATH_REQUIRE_ETCD=1`, which makes its absence a failure.
pub fn etcd_binary() -> Option<PathBuf> {
    let found = ["/usr/bin/etcd", "/usr/local/bin/etcd"]
        .iter()
        .map(PathBuf::from)
        .find(|p| p.exists());
    if found.is_none() {
        assert!(
            std::env::var_os("GDPATH_REQUIRE_ETCD").is_none(),
            "GDPATH_REQUIRE_ETCD is set but no etcd binary is installed (apt-get install etcd-server)"
        );
        eprintln!("SKIPPED: no etcd binary (apt-get install etcd-server)");
    }
    found
}

/// Two distinct free ports on `host` (both held until both are chosen, so they differ;
/// another process may still take one before etcd binds it, which `start` retries).
/// How long a start may take: a loaded 2-core CI machine running a dozen etcd tests in
/// parallel has been seen to need more than 20 s.
const HEALTHY_WITHIN: Duration = Duration::from_secs(60);

fn free_ports(host: &str) -> (u16, u16) {
    let a = TcpListener::bind((host, 0)).expect("a free port");
    let b = TcpListener::bind((host, 0)).expect("a free port");
    (
        a.local_addr().expect("its address").port(),
        b.local_addr().expect("its address").port(),
    )
}

impl Etcd {
    /// Starts etcd on 127.0.0.1, or `None` where it is not installed.
    pub fn start() -> Option<Etcd> {
        Self::start_on("127.0.0.1")
    }

    /// Starts etcd listening on `host`.
    pub fn start_on(host: &str) -> Option<Etcd> {
        etcd_binary()?;
        let (client_port, peer_port) = free_ports(host);
        let mut e = Etcd {
            client_port,
            peer_port,
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
            host: host.into(),
            netns: None,
            tls: false,
            client_auth: false,
        };
        e.launch_fresh();
        Some(e)
    }

    /// Starts etcd in network namespace `netns`, listening on `host` (an address of that
    /// namespace; its ports are free there, the namespace being new).
    pub fn start_in(netns: &str, host: &str) -> Option<Etcd> {
        etcd_binary()?;
        let mut e = Etcd {
            client_port: 2379,
            peer_port: 2380,
            dir: tempfile::tempdir().expect("temp dir"),
            child: None,
            host: host.into(),
            netns: Some(netns.into()),
            tls: false,
            client_auth: false,
        };
        e.launch();
        Some(e)
    }

    /// Starts etcd on 127.0.0.1 serving clients over TLS only, with a certificate for
    /// 127.0.0.1 signed by a CA made here (`dir/ca.pem`, which also signs the client
    /// certificate `dir/client.pem`); `None` where etcd or openssl is missing (said aloud).
    pub fn start_tls() -> Option<Etcd> {
        Self::start_tls_with(false)
    }

    /// As [`Etcd::start_tls`], and clients must present a certificate signed by the same CA
    /// (`--client-cert-auth --trusted-ca-file`): `dir/client.pem` with `dir/client.key` is one.
    pub fn start_tls_client_auth() -> Option<Etcd> {
        Self::start_tls_with(true)
    }

    fn start_tls_with(client_auth: bool) -> Option<Etcd> {
        etcd_binary()?;
        let dir = tempfile::tempdir().expect("temp dir");
        let d = dir.path();
        let ssl = |args: &[&str]| {
            Command::new("openssl")
                .args(args)
                .current_dir(d)
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success())
        };
        let ec = [
            "-newkey",
            "ec",
            "-pkeyopt",
            "ec_paramgen_curve:P-256",
            "-nodes",
        ];
        // NAME.key and NAME.pem for `subject`, signed by the CA, with the extensions `ext`.
        let signed = |name: &str, subject: &str, ext: &str| {
            let file = |suffix: &str| format!("{name}.{suffix}");
            std::fs::write(d.join(file("ext")), ext).is_ok()
                && ssl(&[
                    &["req"][..],
                    &ec,
                    &[
                        "-keyout",
                        &file("key"),
                        "-out",
                        &file("csr"),
                        "-subj",
                        subject,
                    ],
                ]
                .concat())
                && ssl(&[
                    "x509",
                    "-req",
                    "-in",
                    &file("csr"),
                    "-CA",
                    "ca.pem",
                    "-CAkey",
                    "ca.key",
                    "-CAcreateserial",
                    "-out",
                    &file("pem"),
                    "-days",
                    "2",
                    "-extfile",
                    &file("ext"),
                ])
        };
        let made = ssl(&[
            &["req", "-x509"][..],
            &ec,
            &["-keyout", "ca.key", "-out", "ca.pem"],
            &["-days", "2", "-subj", "/CN=gdpath-test-ca"],
        ]
        .concat())
            && signed(
                "srv",
                "/CN=127.0.0.1",
                "subjectAltName=IP:127.0.0.1\nbasicConstraints=CA:FALSE\nextendedKeyUsage=serverAuth\n",
            )
            && signed(
                "client",
                "/CN=gdpath-test-client",
                "basicConstraints=CA:FALSE\nextendedKeyUsage=clientAuth\n",
            );
        if !made {
            eprintln!("SKIPPED: openssl could not make test certificates");
            return None;
        }
        let (client_port, peer_port) = free_ports("127.0.0.1");
        let mut e = Etcd {
            client_port,
            peer_port,
            dir,
            child: None,
            host: "127.0.0.1".into(),
            netns: None,
            tls: true,
            client_auth,
        };
        e.launch_fresh();
        Some(e)
    }

    fn client_url(&self) -> String {
        let scheme = if self.tls { "https" } else { "http" };
        format!("{scheme}://{}:{}", self.host, self.client_port)
    }

    /// `etcdctl` in etcd's namespace, pointed at it (with its CA under TLS).
    fn etcdctl(&self) -> Command {
        let mut c = self.command("etcdctl");
        c.env("ETCDCTL_API", "3")
            .args(["--endpoints", &self.client_url()]);
        if self.tls {
            c.arg("--cacert").arg(self.dir.path().join("ca.pem"));
        }
        if self.client_auth {
            c.arg("--cert")
                .arg(self.dir.path().join("client.pem"))
                .arg("--key")
                .arg(self.dir.path().join("client.key"));
        }
        c
    }

    /// `program` run in etcd's namespace.
    fn command(&self, program: &str) -> Command {
        match &self.netns {
            Some(ns) => {
                let mut c = Command::new("ip");
                c.args(["netns", "exec", ns, program]);
                c
            }
            None => Command::new(program),
        }
    }

    /// The cluster URL of namespace `ns` (`etcds://` under TLS).
    pub fn url(&self, ns: &str) -> String {
        let scheme = if self.tls { "etcds" } else { "etcd" };
        format!("{scheme}://{}:{}/{ns}", self.host, self.client_port)
    }

    /// First start: where etcd exits at once (a port taken between choosing and binding it,
    /// as parallel tests can do) it is tried again on new ports with an empty data directory.
    fn launch_fresh(&mut self) {
        for _ in 0..3 {
            if self.try_launch() {
                return;
            }
            let exited = self
                .child
                .as_mut()
                .is_some_and(|c| c.try_wait().ok().flatten().is_some());
            if !exited || self.netns.is_some() {
                break;
            }
            let _ = std::fs::remove_dir_all(self.dir.path().join("data"));
            (self.client_port, self.peer_port) = free_ports(&self.host);
        }
        self.fail();
    }

    fn launch(&mut self) {
        if !self.try_launch() {
            self.fail();
        }
    }

    fn fail(&mut self) -> ! {
        let log = std::fs::read_to_string(self.dir.path().join("etcd.log")).unwrap_or_default();
        let tail: String = log
            .lines()
            .rev()
            .take(15)
            .collect::<Vec<_>>()
            .into_iter()
            .rev()
            .collect::<Vec<_>>()
            .join("\n");
        self.kill();
        panic!("etcd did not become healthy within {HEALTHY_WITHIN:?}; its log ends:\n{tail}");
    }

    /// Spawns etcd and waits for it to answer; false where it exited or never answered.
    fn try_launch(&mut self) -> bool {
        let bin = etcd_binary().expect("etcd");
        let client = self.client_url();
        let peer = format!("http://{}:{}", self.host, self.peer_port);
        let mut cmd = self.command(&bin.to_string_lossy());
        if self.tls {
            cmd.arg("--cert-file")
                .arg(self.dir.path().join("srv.pem"))
                .arg("--key-file")
                .arg(self.dir.path().join("srv.key"));
        }
        if self.client_auth {
            cmd.arg("--client-cert-auth")
                .arg("--trusted-ca-file")
                .arg(self.dir.path().join("ca.pem"));
        }
        let child = cmd
            .args(["--name", "t", "--data-dir"])
            .arg(self.dir.path().join("data"))
            .args(["--listen-client-urls", &client])
            .args(["--advertise-client-urls", &client])
            .args(["--listen-peer-urls", &peer])
            .args(["--initial-advertise-peer-urls", &peer])
            .args(["--initial-cluster", &format!("t={peer}")])
            .stdout(Stdio::null())
            .stderr(
                std::fs::File::create(self.dir.path().join("etcd.log"))
                    .map(Stdio::from)
                    .unwrap_or_else(|_| Stdio::null()),
            )
            .spawn()
            .expect("etcd starts");
        self.child = Some(child);
        let end = Instant::now() + HEALTHY_WITHIN;
        while Instant::now() < end {
            if let Some(c) = self.child.as_mut() {
                if c.try_wait().ok().flatten().is_some() {
                    return false;
                }
            }
            let ok = self
                .etcdctl()
                .args(["endpoint", "health"])
                .stdout(Stdio::null())
                .stderr(Stdio::null())
                .status()
                .is_ok_and(|s| s.success());
            if ok {
                return true;
            }
            std::thread::sleep(Duration::from_millis(100));
        }
        false
    }

    /// SIGKILLs etcd (its data directory stays).
    pub fn kill(&mut self) {
        if let Some(mut c) = self.child.take() {
            let _ = c.kill();
            let _ = c.wait();
        }
    }

    /// Starts etcd again on the same ports and data.
    pub fn restart(&mut self) {
        self.kill();
        self.launch();
    }

    /// A lease of `ttl_s` seconds granted by `etcdctl`: its id, as etcdctl takes it back.
    pub fn lease_grant(&self, ttl_s: u64) -> String {
        let out = self.ctl(&["lease", "grant", &ttl_s.to_string()]);
        // "lease 694d8a1b2c3d4e5f granted with TTL(60s)"
        out.split_whitespace()
            .nth(1)
            .unwrap_or_else(|| panic!("no lease in {out:?}"))
            .to_owned()
    }

    /// `etcdctl` against this etcd, with extra `args`; its stdout and stderr.
    pub fn ctl(&self, args: &[&str]) -> String {
        self.ctl_stdin(args, b"")
    }
}

impl Etcd {
    /// `etcdctl` with `input` on its stdin (a value too long for an argument).
    pub fn ctl_stdin(&self, args: &[&str], input: &[u8]) -> String {
        use std::io::Write;
        let mut child = self
            .etcdctl()
            .args(args)
            .stdin(Stdio::piped())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .expect("etcdctl runs");
        child
            .stdin
            .take()
            .expect("stdin")
            .write_all(input)
            .expect("etcdctl reads its value");
        let out = child.wait_with_output().expect("etcdctl ends");
        String::from_utf8_lossy(&out.stdout).into_owned() + &String::from_utf8_lossy(&out.stderr)
    }
}

/// An agent named `name` whose UCX traffic stays on `lo`, with peer failure detection and
/// every remote byte through UCX (no shared-memory shortcut), as a peer on another node.
pub fn net_agent(name: &str) -> gdpath::Agent {
    let a = gdpath::Agent::new(gdpath::AgentConfig {
        name: name.into(),
        ..gdpath::AgentConfig::default()
    })
    .unwrap();
    a.enable_net(gdpath::net::NetConfig {
        failure_mode: gdpath::net::FailureMode::Detect,
        devices: Some("lo".into()),
        shared_memory: false,
        ..gdpath::net::NetConfig::default()
    })
    .unwrap();
    a
}

impl Drop for Etcd {
    fn drop(&mut self) {
        self.kill();
    }
}
