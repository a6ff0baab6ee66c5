//! `gdpath bench net`: puts and gets to a serving agent over UCX.

use super::{argv, fmt_gbps, print_findings, verdict};
use crate::progress;
use anyhow::{Context, Result};
use clap::Args;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use gdpath::net::{NetConfig, PutCompletion};
use gdpath::units::{format_size, parse_size, parse_size_range};
use gdpath::Op;
use gdpath_bench::net::{self, MemSpec};
use gdpath_bench::BenchDocument;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct NetBenchArgs {
    /// The serving agent (`gdpath serve`), HOST:PORT: an IP address or a name (an IPv4
    /// address of the name when it has several).
    #[arg(
        long,
        required_unless_present = "peer_name",
        conflicts_with = "peer_name"
    )]
    peer: Option<String>,
    /// The serving agent by its name in the cluster (`serve --cluster URL --name NAME`), with
    /// --cluster: its address is read from its record, waiting up to --connect-timeout for it.
    #[arg(long, value_name = "NAME", requires = "cluster")]
    peer_name: Option<String>,
    #[command(flatten)]
    cluster: crate::cluster::ClusterOpts,
    /// put (write to the peer) or get (read from it).
    #[arg(long, default_value = "put", value_parser = ["put", "get"])]
    op: String,
    /// Local memory: host or gpu:N.
    #[arg(long, default_value = "host", value_parser = MemSpec::parse)]
    mem: MemSpec,
    /// The peer's exported memory to use: host or gpu:N.
    #[arg(long, default_value = "host", value_parser = MemSpec::parse)]
    remote_mem: MemSpec,
    /// Message sizes: a size, a power-of-two sweep `8B..1GiB`, or a list of either `4KiB,1MiB..8MiB` [default:
    /// 8B..1GiB, without the sizes larger than the peer's region]
    #[arg(long)]
    size: Option<String>,
    /// Messages in flight, 1..=4096 (what the peer's receive queue holds).
    #[arg(long, default_value_t = 16)]
    qd: u32,
    /// Where in the peer's region this run's window starts (e.g. 64MiB): clients benchmarking
    /// one region at once each need their own, or they overwrite each other's data.
    #[arg(long, default_value = "0", value_parser = parse_size)]
    remote_offset: u64,
    /// Messages per transfer (descriptor pairs of one request, completed by one flush), 1..=qd.
    /// 1: every message is its own transfer.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..))]
    batch: u32,
    /// Timed bandwidth runs per size.
    #[arg(long, default_value_t = 3)]
    runs: usize,
    /// Bytes per bandwidth run (messages = this / size, at least qd and at most 200000).
    #[arg(long, default_value = "256MiB", value_parser = parse_size)]
    bytes_per_run: u64,
    /// Latency samples per size; 0: 64 MiB / size, 5..=1000.
    #[arg(long, default_value_t = 0)]
    lat_iters: usize,
    /// When a put counts as done: `remote` (confirmed in the peer's memory by a flush, one
    /// round trip per transfer) or `local` (the local buffer is free; each bandwidth run ends
    /// with one flush, like ucx_perftest) [default: remote]. Puts only: gets always complete
    /// when their data arrived.
    #[arg(long, value_enum)]
    completion: Option<Completion>,
    /// Send every put as a UCX put, also where host writes over tcp would go as packed writes
    /// (the engine's own messages, acknowledged by the peer; docs/network.md). Puts only.
    #[arg(long)]
    no_pack: bool,
    #[command(flatten)]
    net: crate::serve::NetOpts,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    pub metrics: super::MetricsOut,
}

/// `bench net --completion`: when a put counts as done.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Completion {
    /// Confirmed in the peer's memory by a flush.
    Remote,
    /// The local buffer is free.
    Local,
}

impl From<Completion> for PutCompletion {
    fn from(c: Completion) -> Self {
        match c {
            Completion::Remote => PutCompletion::Remote,
            Completion::Local => PutCompletion::Local,
        }
    }
}

/// `bench net`'s sweep when `--size` is not given (sizes above the peer's region are skipped).
const DEFAULT_NET_SIZES: &str = "8B..1GiB";

impl NetBenchArgs {
    /// Refuses the options that do not apply to the operation chosen: `--completion` and
    /// `--no-pack` say how puts are sent and confirmed, which a get run has none of.
    fn check_op(&self) -> Result<()> {
        use crate::args::refuse_if;
        if self.op == "get" {
            let why = "applies to puts (--op put): a get completes when its data arrived";
            refuse_if(self.completion.is_some(), "--completion", why)?;
            refuse_if(
                self.no_pack,
                "--no-pack",
                "applies to puts (--op put): only writes are sent as packed writes",
            )?;
        }
        Ok(())
    }
}

pub(super) fn run_net(a: NetBenchArgs) -> Result<ExitCode> {
    a.check_op()?;
    if a.qd == 0 || a.qd > net::MAX_QD {
        return Err(crate::usage(format!(
            "--qd {} is outside 1..={}: the peer's receive queue holds at most {} messages",
            a.qd,
            net::MAX_QD,
            net::MAX_QD
        )));
    }
    if a.batch > a.qd {
        return Err(crate::usage(format!(
            "--batch {} exceeds --qd {}: a transfer's messages are all in flight at once",
            a.batch, a.qd
        )));
    }
    let target = super::peer_target(
        a.peer.as_deref(),
        a.peer_name.as_deref(),
        &a.cluster,
        a.net.connect_timeout(),
    )?
    .ok_or_else(|| crate::usage("--peer or --peer-name is required"))?;
    let (given, peer) = (target.given.clone(), target.addr);
    let cfg = net::NetBenchConfig {
        peer,
        connector: target.connector.clone(),
        token: a.net.token()?,
        net: NetConfig {
            put_completion: a.completion.unwrap_or(Completion::Remote).into(),
            pack_writes: !a.no_pack,
            // The bench measures UCX, also against a peer on this node that shares its memory.
            shared_memory: false,
            ..a.net.config()
        },
        op: if a.op == "get" { Op::Read } else { Op::Write },
        mem: a.mem,
        remote_mem: a.remote_mem,
        sizes: parse_size_range(a.size.as_deref().unwrap_or(DEFAULT_NET_SIZES))
            .context("--size")?,
        fit_sizes: a.size.is_none(),
        qd: a.qd,
        batch: a.batch,
        runs: a.runs,
        bytes_per_run: a.bytes_per_run,
        lat_iters: a.lat_iters,
        stop: Some(crate::interrupt::flag()),
        remote_offset: a.remote_offset,
        connect_timeout: a.net.connect_timeout(),
    };
    let bars = progress::for_terminal(a.json);
    let started = std::time::SystemTime::now();
    let report = match net::run(&cfg, bars.as_ref()) {
        // A signal: the run stopped and the connection closed with a goodbye.
        Err(gdpath::Error::Cancelled) => {
            let message = "bench net interrupted: the transfers in flight were cancelled";
            errln!("gdpath: {message}");
            if a.json {
                crate::print_error_json(message, "cancelled");
            }
            return Ok(ExitCode::from(130));
        }
        r => r
            .map_err(|e| target.explain(e))
            .with_context(|| format!("bench net with {}", crate::serve::named(&given, peer)))?,
    };
    let all_verified = report.rows.iter().all(|r| r.row.verified);
    if a.json {
        let out = BenchDocument::new("bench net", argv(), started, report.rows)
            .findings(&report.findings)
            .with("skipped_sizes", &report.skipped_sizes)?
            .with(
                "remote_region",
                serde_json::json!({"id": report.remote_region.0, "bytes": report.remote_region.1}),
            )?
            .with("peer", &report.peer)?
            .with("ucx_version", &report.ucx_version)?;
        outln!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        outln!(
            "peer {} (UCX {}), its region {} of {}",
            report.peer,
            report.ucx_version,
            report.remote_region.0,
            format_size(report.remote_region.1)
        );
        if let (Some(lo), Some(hi)) = (report.skipped_sizes.first(), report.skipped_sizes.last()) {
            outln!(
                "note: sizes {}..{} skipped: larger than the peer's region (choose sizes with \
                 --size)",
                format_size(*lo),
                format_size(*hi)
            );
        }
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY);
        t.set_header([
            "op",
            "size",
            "qd",
            "batch",
            "GB/s min",
            "GB/s median",
            "GB/s max",
            "lat µs min",
            "lat µs median",
            "lat µs max",
            "transport",
            "verified",
        ]);
        for r in &report.rows {
            t.add_row([
                r.row.op.clone(),
                format_size(r.row.block),
                r.row.qd.to_string(),
                r.batch.to_string(),
                fmt_gbps(r.row.gbps_min),
                fmt_gbps(r.row.gbps_median),
                fmt_gbps(r.row.gbps_max),
                format!("{:.1}", r.latency_us_min),
                format!("{:.1}", r.latency_us_median),
                format!("{:.1}", r.latency_us_max),
                r.row.transport.clone().unwrap_or_default(),
                if r.row.verified {
                    "yes".into()
                } else {
                    "NO".into()
                },
            ]);
        }
        outln!("{t}");
        print_findings(&report.findings);
        for r in &report.rows {
            if r.row.qd < a.qd || r.batch < a.batch {
                outln!(
                    "note: {} messages ran with qd {} and batch {} (asked: {} and {}): the \
                     peer's region holds only that many messages of that size, and a window \
                     holds whole transfers",
                    format_size(r.row.block),
                    r.row.qd,
                    r.batch,
                    a.qd,
                    a.batch
                );
            }
        }
        outln!(
            "GB/s = 1e9 bytes/s over messages in flight; latency = one message at a time, post to \
             completion ({})",
            if a.op == "get" {
                "a get completes when its data is in local memory"
            } else if a.completion == Some(Completion::Local) {
                "--completion local: a put completes when its buffer is free; each bandwidth run \
                 ends with a flush confirming all of them"
            } else {
                "a put completes when it is in the peer's memory"
            }
        );
    }
    Ok(verdict(
        all_verified,
        " (was another client writing the same region of the peer?)",
    ))
}
