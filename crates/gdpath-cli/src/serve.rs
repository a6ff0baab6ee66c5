//! `gdpath serve`: an agent that exports memory regions to peer agents over UCX.

use anyhow::{Context, Result};
use clap::Args;
use gdpath::net::{EventKind, EventLog, FailureMode, NetConfig, NetEvent, Token};
use gdpath::topo::text::escape;
use gdpath::units::{format_size, parse_size};
use gdpath::{Agent, AgentConfig, HostBuffer, Memory};
use std::net::{IpAddr, SocketAddr, ToSocketAddrs};
use std::path::PathBuf;
use std::process::ExitCode;
use std::time::{Duration, Instant};

#[derive(Debug, Args)]
pub struct ServeArgs {
    /// Address to listen on, HOST:PORT: an IP address or a name (an IPv4 address of the name
    /// when it has several). Loopback unless told otherwise; a non-loopback address needs a
    /// token.
    #[arg(long, default_value = "127.0.0.1:18515")]
    listen: String,
    /// A region to export: `host:SIZE` (e.g. host:1GiB; shared memory, which agents on this
    /// node map and move bytes into themselves) or `gpu:N:SIZE` (needs a CUDA-enabled UCX).
    /// Repeat for several. Only these are visible to peers.
    #[arg(long = "export", value_name = "KIND:SIZE")]
    exports: Vec<String>,
    /// The agent name peers see: 1 to 64 characters; with --cluster 1 to 31 of A-Z a-z 0-9 .
    /// _ - (it is an etcd key's last component, and `NAME#INCARNATION` must fit the 64).
    #[arg(long, default_value = "serve", value_parser = parse_name)]
    name: String,
    #[command(flatten)]
    net: NetOpts,
    /// Publish this agent in the cluster under --name (docs/cluster.md).
    #[command(flatten)]
    cluster: crate::cluster::ClusterOpts,
    /// TTL of the published record's lease, seconds: a crashed or cut-off agent's record goes
    /// within it; keep-alives go every third of it.
    #[arg(long, default_value_t = 10, requires = "cluster",
          value_parser = clap::value_parser!(u64).range(2..=3600))]
    lease_ttl: u64,
    /// Exit after this many seconds (default: run until killed).
    #[arg(long)]
    duration: Option<f64>,
    /// Serve the engine's metrics (Prometheus text format) at http://ADDR/metrics, HOST:PORT
    /// (e.g. 127.0.0.1:9464). No authentication: keep it on loopback unless every host that
    /// reaches ADDR may read them (docs/metrics.md).
    #[arg(long, value_name = "ADDR")]
    metrics: Option<String>,
}

/// Network options shared by `serve` and `bench net`.
#[derive(Debug, Args)]
pub struct NetOpts {
    /// Shared secret (at least 16 bytes). Prefer --token-file or GDPATH_TOKEN: a command line
    /// is visible to other users. Never sent over the network as-is (HMAC challenge).
    #[arg(long, conflicts_with = "token_file")]
    token: Option<String>,
    /// Read the token from this file (trailing newline removed).
    #[arg(long)]
    token_file: Option<PathBuf>,
    /// Let UCX use shared memory between processes of one host (UCX error mode none): fast,
    /// but a dead peer is detected only by time bounds.
    #[arg(long)]
    fast_local: bool,
    /// UCX transports (UCX_TLS), e.g. `tcp`.
    #[arg(long)]
    transports: Option<String>,
    /// UCX network devices (UCX_NET_DEVICES), e.g. `lo` or `veth0` [default: for serve, the
    /// interface of --listen (every one for 0.0.0.0); for bench net, the one that reaches
    /// --peer; RDMA devices always]. UCX's own tcp port listens on these, without
    /// authentication: firewall it (docs/network.md).
    #[arg(long)]
    devices: Option<String>,
    /// Bound on a handshake, seconds (a server drops a client that has not finished it by then;
    /// a client gives up connecting).
    #[arg(long, default_value_t = 10.0, value_parser = parse_seconds)]
    connect_timeout: f64,
}

/// `--metrics ADDR`: the endpoint started, its address printed (with a warning when it is not
/// loopback: anyone who reaches it reads the metrics).
fn serve_metrics(addr: &str) -> Result<gdpath_metrics::MetricsServer> {
    let m = gdpath_metrics::MetricsServer::bind(resolve("--metrics", addr)?)?;
    let at = m.local_addr();
    outln!("metrics: http://{at}/metrics");
    if !at.ip().is_loopback() {
        errln!("gdpath serve: warning: metrics on {at}, not a loopback address, are readable by anyone who reaches it (no authentication; docs/metrics.md)");
    }
    Ok(m)
}

/// A positive number of seconds, at most a day.
fn parse_seconds(s: &str) -> std::result::Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v > 0.0 && v <= 86_400.0 => Ok(v),
        _ => Err(format!("{s:?} is not a number of seconds in (0, 86400]")),
    }
}

/// Largest token file read: 64 KiB (a token is at least 16 bytes; nothing real comes close).
const MAX_TOKEN_FILE_BYTES: u64 = 64 << 10;

impl NetOpts {
    /// The token from --token or --token-file (not both), else GDPATH_TOKEN; none if absent.
    /// A flag together with a different GDPATH_TOKEN is refused: which one was meant?
    pub fn token(&self) -> Result<Token> {
        let env = std::env::var("GDPATH_TOKEN").ok().filter(|s| !s.is_empty());
        let secret = if let Some(t) = &self.token {
            Some(t.clone())
        } else if let Some(p) = &self.token_file {
            // A regular file only, and a bounded read: a FIFO never blocks the start.
            let raw = gdpath::file::read_bounded(p, MAX_TOKEN_FILE_BYTES)
                .with_context(|| format!("reading token file {}", escape(&p)))?;
            let s = String::from_utf8(raw)
                .map_err(|_| anyhow::anyhow!("token file {} is not UTF-8 text", escape(&p)))?;
            warn_if_others_read(p);
            Some(s.trim_end_matches(['\n', '\r']).to_owned())
        } else {
            env.clone()
        };
        if let (Some(s), Some(e)) = (&secret, &env) {
            if s != e {
                return Err(crate::usage(
                    "--token/--token-file and GDPATH_TOKEN are both set and differ: unset one",
                ));
            }
        }
        match secret {
            // The engine's error, so that `--json` gives its kind (`config`).
            Some(s) => Ok(Token::new(s).map_err(gdpath::Error::from)?),
            None => Ok(Token::none()),
        }
    }

    /// The network settings these options give; puts complete remotely (the writing side,
    /// `bench net --completion`, changes that).
    pub fn config(&self) -> NetConfig {
        NetConfig {
            failure_mode: if self.fast_local {
                FailureMode::FastLocal
            } else {
                FailureMode::Detect
            },
            transports: self.transports.clone(),
            devices: self.devices.clone(),
            connect_timeout: self.connect_timeout(),
            ..NetConfig::default()
        }
    }

    /// `--connect-timeout`.
    pub fn connect_timeout(&self) -> Duration {
        Duration::from_secs_f64(self.connect_timeout)
    }
}

/// Warns (stderr) when other users may read the token file `p`: whoever reads it can connect
/// as this side.
fn warn_if_others_read(p: &std::path::Path) {
    use std::os::unix::fs::PermissionsExt;
    if let Ok(m) = std::fs::metadata(p) {
        let mode = m.permissions().mode();
        if mode & 0o044 != 0 {
            errln!(
                "gdpath: warning: token file {} can be read by other users (mode {:o}); \
                 `chmod 600 {}` keeps the secret yours",
                escape(&p),
                mode & 0o777,
                escape(&p)
            );
        }
    }
}

/// `HOST:PORT` (the value of `flag`) as one socket address: an IP address as it is (IPv6 as
/// `[ADDR]:PORT`), a name through the system resolver, taking an IPv4 address when the name has
/// several (`localhost` is often both ::1 and 127.0.0.1, and a server listening on one is not
/// reached on the other). Errors (kind `usage` or `resolve`) name the value.
pub fn resolve(flag: &str, s: &str) -> Result<SocketAddr> {
    if let Ok(a) = s.parse::<SocketAddr>() {
        return Ok(a);
    }
    let no_port = || {
        crate::usage(format!(
            "{flag} {s}: no port; expected HOST:PORT (e.g. localhost:18515, or [::1]:18515 for \
             IPv6)"
        ))
    };
    if s.parse::<IpAddr>().is_ok() {
        return Err(no_port());
    }
    let Some((host, port)) = s.rsplit_once(':') else {
        return Err(no_port());
    };
    if host.is_empty() {
        return Err(crate::usage(format!(
            "{flag} {s}: no host; expected HOST:PORT"
        )));
    }
    if host.contains(':') {
        return Err(crate::usage(format!(
            "{flag} {s}: write an IPv6 address as [ADDR]:PORT"
        )));
    }
    let port: u16 = port.parse().map_err(|_| {
        crate::usage(format!(
            "{flag} {s}: port {port:?} is not a number from 0 to 65535"
        ))
    })?;
    let resolve_err = |detail: String| {
        anyhow::Error::new(crate::CliError {
            kind: "resolve",
            message: format!("{flag} {s}: cannot resolve host name {host:?}: {detail}"),
        })
    };
    let addrs: Vec<SocketAddr> = (host, port)
        .to_socket_addrs()
        .map_err(|e| resolve_err(e.to_string()))?
        .collect();
    addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or_else(|| addrs.first())
        .copied()
        .ok_or_else(|| resolve_err("it has no address".into()))
}

/// `HOST:PORT` as given, with the address it resolved to when that differs (a name).
pub fn named(given: &str, addr: SocketAddr) -> String {
    if given == addr.to_string() {
        given.to_owned()
    } else {
        format!("{given} ({addr})")
    }
}

/// `--name`: 1 to [`AGENT_NAME_CHARS`] characters, what the metadata peers receive carries.
fn parse_name(s: &str) -> std::result::Result<String, String> {
    use gdpath::net::codec::AGENT_NAME_CHARS;
    match s.chars().count() {
        0 => Err("the name is empty".into()),
        n if n > AGENT_NAME_CHARS => Err(format!("{n} characters; at most {AGENT_NAME_CHARS}")),
        _ => Ok(s.to_owned()),
    }
}

/// A region to export: host memory or memory of a GPU, and its size in bytes.
enum ExportSpec {
    Host(u64),
    Gpu(u32, u64),
}

fn parse_export(s: &str) -> Result<ExportSpec> {
    let bad = || crate::usage(format!("--export {s:?}: expected host:SIZE or gpu:N:SIZE"));
    let (kind, rest) = s.split_once(':').ok_or_else(bad)?;
    let spec = match kind {
        "host" => ExportSpec::Host(parse_size(rest).with_context(|| format!("--export {s:?}"))?),
        "gpu" => {
            let (n, size) = rest.split_once(':').ok_or_else(bad)?;
            let n: u32 = n.parse().map_err(|_| bad())?;
            ExportSpec::Gpu(
                n,
                parse_size(size).with_context(|| format!("--export {s:?}"))?,
            )
        }
        _ => {
            return Err(crate::usage(format!(
                "--export {s:?}: unknown memory kind {kind:?} (expected host or gpu)"
            )))
        }
    };
    if matches!(spec, ExportSpec::Host(0) | ExportSpec::Gpu(_, 0)) {
        return Err(crate::usage(format!("--export {s:?}: size must be > 0")));
    }
    Ok(spec)
}

pub fn run(a: ServeArgs) -> Result<ExitCode> {
    // Before "listening on" is printed: a script may signal the server as soon as it sees it.
    let signalled = crate::interrupt::flag();
    let specs: Vec<ExportSpec> = a
        .exports
        .iter()
        .map(|e| parse_export(e))
        .collect::<Result<_>>()?;
    let token = a.net.token()?;
    // Resolved here, so the rule that a non-loopback address needs a token is checked (by
    // `Agent::serve`) on the address listened on, whatever name it was given by.
    let listen = resolve("--listen", &a.listen)?;
    let cluster_url = a.cluster.url()?;
    // In a cluster the engine's name carries the incarnation, which peers check in the
    // handshake: a restarted agent is never taken for the one before.
    let mut record = match &cluster_url {
        Some(_) if listen.ip().is_unspecified() => {
            return Err(crate::usage(
                "--cluster needs a --listen address peers can reach, not 0.0.0.0 or ::",
            ))
        }
        Some(_) => {
            let mut r = gdpath_cluster::AgentRecord::new(&a.name, listen)?;
            r.topology = gdpath_cluster::TopologySummary::of_this_machine();
            Some(r)
        }
        None => None,
    };
    let agent = Agent::new(AgentConfig {
        name: record
            .as_ref()
            .map(|r| r.engine_name())
            .unwrap_or_else(|| a.name.clone()),
        ..AgentConfig::default()
    })?;
    let host_bytes = specs
        .iter()
        .map(|s| match s {
            ExportSpec::Host(size) => *size,
            ExportSpec::Gpu(..) => 0,
        })
        .fold(0u64, u64::saturating_add);
    gdpath::memory::check_host_memory("--export", host_bytes)?;
    agent.enable_net(a.net.config())?;
    let mut regions = Vec::new();
    for spec in specs {
        let (r, what) = match spec {
            ExportSpec::Host(size) => {
                let len = usize::try_from(size).context("export size")?;
                // Shared, so that agents on this node move bytes into it themselves; where
                // memfds are refused (a seccomp filter, a full /dev/shm), private memory that
                // every peer reaches through UCX.
                let (buf, kind) = match HostBuffer::try_shared(len) {
                    Ok(b) => (b, "shared"),
                    Err(e) => {
                        errln!("gdpath: warning: {e}; exporting private memory (peers use UCX)");
                        (HostBuffer::try_zeroed(len)?, "private")
                    }
                };
                let r = agent.register(Memory::host(buf))?;
                (r, format!("host {} ({kind})", format_size(size)))
            }
            ExportSpec::Gpu(ordinal, len) => {
                // The engine's error names the GPU and the memory already.
                let r = agent.register(Memory::Gpu { ordinal, len })?;
                (r, format!("gpu:{ordinal} {}", format_size(len)))
            }
        };
        let id = agent
            .export(&r)
            .with_context(|| format!("exporting {what}"))?;
        if let Some(record) = &mut record {
            record
                .regions
                .push(gdpath_cluster::RegionRecord::exported(&agent, &r)?);
        }
        regions.push((id, what, r));
    }
    let srv = agent
        .serve(listen, token.clone())
        .with_context(|| format!("listening on {}", named(&a.listen, listen)))?;
    let facts = agent.ucx_facts().ok();
    outln!(
        "gdpath serve: listening on {} (UCX {}, {}, {})",
        srv.local_addr(),
        facts.map(|f| f.version_string).unwrap_or_default(),
        if a.net.fast_local {
            "fast-local: shared memory allowed, dead peers found by time bounds"
        } else {
            "peer failure detection"
        },
        if token.is_none() {
            no_token_warning(srv.local_addr())
        } else {
            "token required".into()
        }
    );
    for (id, what, _) in &regions {
        outln!("export {id}: {what}");
    }
    let member = match (cluster_url, record) {
        (Some(url), Some(mut record)) => {
            record.addr = srv.local_addr().to_string();
            let cluster = gdpath_cluster::Cluster::connect(&url)?;
            let m = gdpath_cluster::Membership::join(
                &cluster,
                record,
                Duration::from_secs(a.lease_ttl),
            )
            .with_context(|| format!("publishing {} in {url}", a.name))?;
            m.publish_verdicts(gdpath_cluster::VERDICTS_BOUND, || {
                gdpath_doctor::examine::path_statuses_here().map_err(|e| e.to_string())
            })?;
            outln!(
                "cluster: published {} incarnation {} in {url} (lease TTL {} s)",
                a.name,
                m.record().incarnation,
                a.lease_ttl
            );
            Some(m)
        }
        _ => None,
    };
    let _metrics = a.metrics.as_deref().map(serve_metrics).transpose()?;
    if regions.is_empty() {
        errln!(
            "gdpath serve: nothing exported: clients can connect but find no memory to use \
             (add --export host:SIZE)"
        );
    }
    use std::io::Write;
    std::io::stdout().flush().ok();
    let end = a
        .duration
        .and_then(|s| Instant::now().checked_add(Duration::from_secs_f64(s.max(0.0))));
    // Refused and lost connections are as many as anyone reaching the port makes: the
    // engine's log policy lets one line per kind and interval through, with counts.
    let log = EventLog::default();
    loop {
        if let Some(e) = srv.next_event(EVENT_WAIT) {
            if let Some(left_out) = log.admit(&e) {
                print_event(e, left_out, &log);
            }
        }
        for (kind, n) in log.overdue() {
            print_left_out(kind, n, &log);
        }
        std::io::stdout().flush().ok();
        for n in agent.take_notifications() {
            outln!("notification from {}: {} bytes", n.from, n.message.len());
        }
        for e in member.iter().flat_map(|m| m.take_events()) {
            outln!("cluster: {}", member_event_text(&e));
        }
        if signalled.load(std::sync::atomic::Ordering::Relaxed)
            || end.is_some_and(|e| Instant::now() >= e)
        {
            break;
        }
    }
    // Leave first: peers stop choosing this agent before it stops answering.
    if let Some(m) = member {
        if let Err(e) = m.leave() {
            errln!("gdpath serve: could not delete the cluster record ({e}); it goes when its lease expires");
        }
    }
    let told = srv.stop(STOP_WAIT);
    for (kind, n) in log.left_out() {
        print_left_out(kind, n, &log);
    }
    outln!("stopped: told {told} connected client(s) goodbye");
    std::io::stdout().flush().ok();
    Ok(ExitCode::SUCCESS)
}

/// One line of the log for a change of this agent's publication.
fn member_event_text(e: &gdpath_cluster::MemberEvent) -> String {
    use gdpath_cluster::MemberEvent;
    match e {
        MemberEvent::Lost { detail } => format!("record may be gone: {detail}; re-publishing"),
        MemberEvent::Republished { lease } => format!("record published again (lease {lease:x})"),
        MemberEvent::NameTaken {
            incarnation,
            hostname,
        } => format!(
            "the name is held by incarnation {incarnation} on {hostname}; retrying until it goes"
        ),
        MemberEvent::Replaced { detail } => {
            format!("record replaced or deleted by someone else: {detail}; claiming the name again")
        }
        MemberEvent::Updated { detail } => format!("record updated: {detail}"),
        MemberEvent::NotUpdated { detail } => format!("record not updated: {detail}"),
    }
}

/// What the start line says of a server without a token listening on `addr`: who can then
/// read and write the exported memory (without a token both sides prove the empty key, which
/// anyone can), and how to require one. The engine refuses a non-loopback address without a
/// token, so it is every local user, unless that rule changes.
fn no_token_warning(addr: SocketAddr) -> String {
    let who = if addr.ip().is_loopback() {
        "any local user".to_owned()
    } else {
        format!("anyone who can reach {addr}")
    };
    format!(
        "no token: {who} can connect and read and write the exported memory; to require one, \
         start serve and its clients with --token-file FILE (or GDPATH_TOKEN; 16 bytes or more)"
    )
}

/// One line for `e`, with how many of its kind were left out before it (`left_out`).
fn print_event(e: NetEvent, left_out: u64, log: &EventLog) {
    let more = if left_out > 0 {
        format!(
            " ({left_out} more like it left out since the last, one line per {}s)",
            log.interval().as_secs()
        )
    } else {
        String::new()
    };
    match e {
        NetEvent::Connected { peer } => outln!("connected: {peer}"),
        NetEvent::Refused { addr, reason } => outln!(
            "refused: {} ({reason}){more}",
            addr.map_or_else(|| "?".into(), |a| a.to_string())
        ),
        NetEvent::Lost { peer, detail, .. } => outln!("lost: {peer} ({detail}){more}"),
        NetEvent::Left { peer } => outln!("left: {peer} (closed the connection cleanly)"),
    }
}

/// The line telling that `n` events of `kind` were left out since its last line.
fn print_left_out(kind: EventKind, n: u64, log: &EventLog) {
    let (prefix, what) = match kind {
        EventKind::Refused => ("refused", "connection(s) refused"),
        EventKind::LostInHandshake => ("lost", "connection(s) lost in their handshake"),
        EventKind::Lost => ("lost", "peer(s) lost"),
        // Never rate-limited: every one has its line.
        EventKind::Connected | EventKind::Left => return,
    };
    outln!(
        "{prefix}: {n} more {what} since the last such line (one line per {}s)",
        log.interval().as_secs()
    );
}

/// How long a stopping server waits for its clients to answer its goodbye (they flush what
/// they still had on its way first): with the wait for events below, a signal stops `serve`
/// within a second.
const STOP_WAIT: Duration = Duration::from_millis(500);

/// The longest wait for an event between two looks at the stop signal.
const EVENT_WAIT: Duration = Duration::from_millis(100);
