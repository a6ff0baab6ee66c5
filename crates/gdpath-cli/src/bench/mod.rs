//! `gdpath bench ...`: argument parsing and output of the benchmarks of `gdpath_bench`.
//!
//! One module per bench: `file` (`bench storage`, with its `--gpu` rows), `copies` (`bench
//! p2p|h2d|d2h`), `blocks` (`bench kv`), `peer` (`bench net`); the helpers they share (tables,
//! the command line, the exit status) are here.

mod blocks;
mod copies;
mod file;
mod peer;

use blocks::run_kv;
pub use blocks::KvArgs;
use copies::run_gpu;
pub use copies::GpuArgs;
use file::run_storage;
pub use file::StorageArgs;
use peer::run_net;
pub use peer::NetBenchArgs;

use anyhow::Result;
use clap::Subcommand;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use gdpath::units::format_size;
use gdpath_bench::{gpu, BenchRow};
use std::process::ExitCode;

#[derive(Debug, Subcommand)]
pub enum BenchCommand {
    /// File <-> host memory through the engine (O_DIRECT + io_uring, or buffered), like gdsio.
    Storage(StorageArgs),
    /// Every GPU pair: P2P uni- and bidirectional, staged with P2P off, small-copy latency.
    P2p(GpuArgs),
    /// Every GPU: host -> GPU with pinned and pageable memory (gdpath's staging and the driver's).
    H2d(GpuArgs),
    /// Every GPU: GPU -> host, as h2d.
    D2h(GpuArgs),
    /// Put/get to a peer agent's memory over UCX, like ib_write_bw / ucx_perftest.
    Net(NetBenchArgs),
    /// KV-cache blocks: one block transfer of N scattered blocks beside one contiguous copy of
    /// the same bytes (the ratio is the figure), data verified, posting cost per descriptor.
    Kv(KvArgs),
}

impl BenchCommand {
    /// `--json` was given.
    pub fn json(&self) -> bool {
        match self {
            BenchCommand::Storage(a) => a.json,
            BenchCommand::Net(a) => a.json,
            BenchCommand::Kv(a) => a.json,
            BenchCommand::P2p(a) | BenchCommand::H2d(a) | BenchCommand::D2h(a) => a.json,
        }
    }

    /// `--metrics-out FILE`, if given.
    fn metrics_out(&self) -> Option<&std::path::Path> {
        let m = match self {
            BenchCommand::Storage(a) => &a.metrics,
            BenchCommand::Net(a) => &a.metrics,
            BenchCommand::Kv(a) => &a.metrics,
            BenchCommand::P2p(a) | BenchCommand::H2d(a) | BenchCommand::D2h(a) => &a.metrics,
        };
        m.metrics_out.as_deref()
    }
}

/// `--metrics-out`, which every bench takes.
#[derive(Debug, clap::Args)]
pub struct MetricsOut {
    /// After the run, write the engine's metrics to FILE in the Prometheus text format
    /// (created, or replaced whole: never left half written), e.g. for node_exporter's
    /// textfile collector. docs/metrics.md names the metrics.
    #[arg(long, value_name = "FILE")]
    pub metrics_out: Option<std::path::PathBuf>,
}

/// Writes the engine's metrics to `file` through the engine's crash-safe replace.
fn write_metrics(file: &std::path::Path) -> Result<()> {
    use anyhow::Context;
    use std::io::Write;
    let text = gdpath_metrics::text()?;
    let opts = gdpath::file::ReplaceOptions {
        overwrite: true,
        ..Default::default()
    };
    let mut f = gdpath::file::AtomicFile::create(file, opts)
        .with_context(|| format!("--metrics-out {}", file.display()))?;
    f.write_all(text.as_bytes())
        .with_context(|| format!("writing {}", file.display()))?;
    f.commit()?;
    Ok(())
}

pub fn run(cmd: BenchCommand) -> Result<ExitCode> {
    let metrics_out = cmd.metrics_out().map(std::path::Path::to_path_buf);
    let code = run_bench(cmd)?;
    if let Some(file) = metrics_out {
        write_metrics(&file)?;
    }
    Ok(code)
}

fn run_bench(cmd: BenchCommand) -> Result<ExitCode> {
    match cmd {
        BenchCommand::Storage(a) => run_storage(a),
        BenchCommand::Net(a) => run_net(a),
        BenchCommand::Kv(a) => run_kv(a),
        BenchCommand::P2p(a) => run_gpu(gpu::GpuBenchKind::P2p, a),
        BenchCommand::H2d(a) => run_gpu(gpu::GpuBenchKind::H2d, a),
        BenchCommand::D2h(a) => run_gpu(gpu::GpuBenchKind::D2h, a),
    }
}
/// The command line that made a document (`argv`, program name first): `gdpath report` shows
/// it beside every figure it takes from the document.
pub(super) fn argv() -> Vec<String> {
    std::env::args().collect()
}

/// A bench's exit status: success when every row verified, else
/// [`crate::NOT_VERIFIED_STATUS`] after saying so (with `hint` on what may have caused it).
pub(super) fn verdict(all_verified: bool, hint: &str) -> ExitCode {
    if all_verified {
        return ExitCode::SUCCESS;
    }
    errln!("gdpath: data verification FAILED for at least one row{hint}");
    ExitCode::from(crate::NOT_VERIFIED_STATUS)
}

/// GB/s with four significant digits down to 0.0001, scientific below (8-byte messages).
pub(super) fn fmt_gbps(v: f64) -> String {
    if v >= 1.0 {
        format!("{v:.3}")
    } else if v >= 1e-4 {
        format!("{v:.4}")
    } else {
        format!("{v:.2e}")
    }
}

pub(super) fn print_table(rows: &[BenchRow]) {
    let mut t = Table::new();
    t.load_preset(UTF8_BORDERS_ONLY);
    t.set_header([
        "path",
        "op",
        "size",
        "block",
        "qd",
        "GB/s min",
        "GB/s median",
        "GB/s max",
        "IOPS",
        "p50 µs",
        "p99 µs",
        "verified",
    ]);
    for r in rows {
        t.add_row([
            r.path.clone(),
            r.op.clone(),
            format_size(r.bytes),
            format_size(r.block),
            r.qd.to_string(),
            format!("{:.3}", r.gbps_min),
            format!("{:.3}", r.gbps_median),
            format!("{:.3}", r.gbps_max),
            format!("{:.0}", r.iops),
            lat(r.latency_us_p50),
            lat(r.latency_us_p99),
            if r.verified {
                "yes".into()
            } else {
                "NO".into()
            },
        ]);
    }
    outln!("{t}");
}

/// One line per finding of a bench run, pointing at the doctor for its evidence and remedy.
pub(super) fn print_findings(findings: &[gdpath::FindingId]) {
    for f in findings {
        outln!("finding: {f} (run `gdpath doctor` for evidence and remedy)");
    }
}

pub(super) fn print_ratios(rows: &[BenchRow]) {
    if let Some(src) = rows
        .iter()
        .find(|r| r.path == "read-loop")
        .and_then(|r| r.src.as_deref())
    {
        outln!("read-loop: buffered read(2), one in flight; {src}");
    }
    for r in rows.iter().filter(|r| r.path == "read-loop") {
        if let Some(e) = rows
            .iter()
            .find(|e| e.block == r.block && e.path != "read-loop")
        {
            if r.gbps_median > 0.0 {
                outln!(
                    "block {}: {} / read-loop = {:.2}x (median GB/s)",
                    format_size(r.block),
                    e.path,
                    e.gbps_median / r.gbps_median
                );
            }
        }
    }
}
/// A latency cell: `-` where the bench does not measure per-I/O latency (the GPU rows).
fn lat(us: f64) -> String {
    if us > 0.0 {
        format!("{us:.1}")
    } else {
        "-".into()
    }
}

/// The serving agent of `--peer ADDR` or `--peer-name NAME`.
pub(super) struct PeerTarget {
    /// What to call it in messages: the address, or the agent's name (its address is added
    /// where the message names one, `serve::named`).
    pub given: String,
    /// Its control-plane address.
    pub addr: std::net::SocketAddr,
    /// For `--peer-name`: the bench connects through `ClusterPeer`, which checks that the
    /// agent answering is the record's incarnation (docs/cluster.md).
    pub connector: Option<gdpath_bench::net::Connector>,
    /// The cluster's refusal of that connection, where there was one.
    refused: std::sync::Arc<std::sync::Mutex<Option<gdpath_cluster::ClusterError>>>,
}

impl PeerTarget {
    /// The bench's error `e`, or the cluster's refusal behind it (`incarnation_mismatch`,
    /// `not_found`, ...), which the engine error only carries as text.
    pub fn explain(&self, e: gdpath::Error) -> anyhow::Error {
        let refused = self
            .refused
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .take();
        match refused {
            Some(c) => c.into(),
            None => e.into(),
        }
    }
}

/// The serving agent from `--peer ADDR`, or from the record of `--peer-name NAME` in
/// `--cluster`, waiting up to `wait` for it; `None` without either.
pub(super) fn peer_target(
    peer: Option<&str>,
    peer_name: Option<&str>,
    cluster: &crate::cluster::ClusterOpts,
    wait: std::time::Duration,
) -> Result<Option<PeerTarget>> {
    let refused = std::sync::Arc::new(std::sync::Mutex::new(None));
    match (peer, peer_name) {
        (Some(p), _) => Ok(Some(PeerTarget {
            given: p.to_owned(),
            addr: crate::serve::resolve("--peer", p)?,
            connector: None,
            refused,
        })),
        (None, Some(name)) => {
            let c = cluster.connect()?;
            let (record, _) = c.resolve(name, wait)?;
            let (name, slot) = (name.to_owned(), refused.clone());
            let connect = move |agent: &gdpath::Agent, opts: &gdpath::net::ConnectOptions| {
                match gdpath_cluster::ClusterPeer::connect(
                    &c,
                    agent,
                    &name,
                    opts.token.clone(),
                    wait,
                ) {
                    Ok(p) => Ok(p.peer().clone()),
                    Err(gdpath_cluster::ClusterError::Engine(e)) => Err(e),
                    Err(e) => {
                        let text = e.to_string();
                        *slot
                            .lock()
                            .unwrap_or_else(std::sync::PoisonError::into_inner) = Some(e);
                        Err(gdpath::Error::Config(text))
                    }
                }
            };
            Ok(Some(PeerTarget {
                given: record.name.clone(),
                addr: record.socket_addr()?,
                connector: Some(gdpath_bench::net::Connector(std::sync::Arc::new(connect))),
                refused,
            }))
        }
        (None, None) => Ok(None),
    }
}
