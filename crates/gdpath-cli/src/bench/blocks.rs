//! `gdpath bench kv`: KV-cache block transfers beside one contiguous copy.

use super::{argv, verdict};
use crate::progress;
use anyhow::{Context, Result};
use clap::Args;
use comfy_table::{presets::UTF8_BORDERS_ONLY, Table};
use gdpath::units::{format_size, parse_size};
use gdpath_bench::{kv, BenchDocument, BenchRow};
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct KvArgs {
    /// Blocks per transfer (descriptors, one layer, one K/V plane).
    #[arg(long, default_value_t = 100_000)]
    blocks: u64,
    /// Bytes per block.
    #[arg(long, default_value = "16KiB", value_parser = parse_size)]
    block_size: u64,
    /// Placement: random (every block to a random slot on both sides) or runs (runs of
    /// --run-len consecutive blocks, which merge).
    #[arg(long, default_value = "random", value_parser = ["random", "runs"])]
    layout: String,
    /// Blocks per run with --layout runs.
    #[arg(long, default_value_t = 16)]
    run_len: u64,
    /// Source memory: gpu:N or host.
    #[arg(long, default_value = "gpu:0", value_parser = kv::KvMem::parse)]
    src: kv::KvMem,
    /// Destination memory: gpu:N, host, peer (a `gdpath serve --export gpu:0:SIZE`, see
    /// --peer; through CUDA IPC on this node) or peer-host (its `--export host:SIZE`: shared
    /// memory written in place on this node).
    #[arg(long, default_value = "host", value_parser = kv::KvMem::parse)]
    dst: kv::KvMem,
    /// Timed runs per row, after one warm-up.
    #[arg(long, default_value_t = 5)]
    runs: usize,
    /// auto (the backend chooses), kernel, driver-batch or copies.
    #[arg(long, default_value = "auto")]
    method: String,
    /// The serving agent for --dst peer / peer-host, HOST:PORT.
    #[arg(long, conflicts_with = "peer_name")]
    peer: Option<String>,
    /// The serving agent by its name in the cluster, with --cluster (instead of --peer).
    #[arg(long, value_name = "NAME", requires = "cluster")]
    peer_name: Option<String>,
    #[command(flatten)]
    cluster: crate::cluster::ClusterOpts,
    /// Reach a peer-host on this node through UCX instead of mapping its shared memory (to
    /// compare the two).
    #[arg(long)]
    no_shared_memory: bool,
    #[command(flatten)]
    net: crate::serve::NetOpts,
    /// Print JSON instead of a table.
    #[arg(long)]
    pub(super) json: bool,
    #[command(flatten)]
    pub metrics: super::MetricsOut,
}

pub(super) fn run_kv(a: KvArgs) -> Result<ExitCode> {
    let method = match a.method.as_str() {
        "auto" => None,
        m => Some(gdpath::CopyMethod::parse(m).ok_or_else(|| {
            crate::usage(format!(
                "--method {m}: expected auto, kernel, driver-batch or copies"
            ))
        })?),
    };
    let target = super::peer_target(
        a.peer.as_deref(),
        a.peer_name.as_deref(),
        &a.cluster,
        a.net.connect_timeout(),
    )?;
    let peer = target.as_ref().map(|t| t.addr);
    if peer.is_some() && !matches!(a.dst, kv::KvMem::Peer | kv::KvMem::PeerHost) {
        errln!("gdpath: warning: --peer is used only with --dst peer or peer-host");
    }
    let cfg = kv::KvBenchConfig {
        blocks: a.blocks,
        block_size: a.block_size,
        placement: if a.layout == "runs" {
            kv::KvPlacement::Runs
        } else {
            kv::KvPlacement::Random
        },
        run_len: a.run_len,
        src: a.src,
        dst: a.dst,
        runs: a.runs,
        method,
        peer,
        connector: target.as_ref().and_then(|t| t.connector.clone()),
        token: a.net.token()?,
        net: gdpath::net::NetConfig {
            shared_memory: !a.no_shared_memory,
            ..a.net.config()
        },
    };
    let bars = progress::for_terminal(a.json);
    let started = std::time::SystemTime::now();
    let r = kv::run(&cfg, bars.as_ref())
        .map_err(|e| match &target {
            Some(t) => t.explain(e),
            None => e.into(),
        })
        .context("bench kv")?;
    let ok = r.blocks.row.verified && r.contiguous.verified;
    if a.json {
        let rows = vec![
            serde_json::to_value(&r.blocks)?,
            serde_json::to_value(&r.contiguous)?,
        ];
        let out = BenchDocument::new("bench kv", argv(), started, rows)
            .unit("post_ns_per_descriptor", "ns")
            .unit("post_call_us", "us")
            .notes(&r.notes)
            .with("layout", &a.layout)?;
        println!("{}", serde_json::to_string_pretty(&out)?);
    } else {
        let mut t = Table::new();
        t.load_preset(UTF8_BORDERS_ONLY);
        t.set_header([
            "op",
            "path",
            "method",
            "src",
            "dst",
            "bytes",
            "block",
            "descriptors",
            "merged",
            "GB/s min",
            "GB/s median",
            "GB/s max",
            "verified",
        ]);
        let b = &r.blocks;
        let row = |x: &BenchRow, m: &str, n: String, c: String| {
            [
                x.op.clone(),
                x.path.clone(),
                m.to_owned(),
                x.src.clone().unwrap_or_default(),
                x.dst.clone().unwrap_or_default(),
                format_size(x.bytes),
                format_size(x.block),
                n,
                c,
                format!("{:.2}", x.gbps_min),
                format!("{:.2}", x.gbps_median),
                format!("{:.2}", x.gbps_max),
                if x.verified {
                    "yes".into()
                } else {
                    "NO".into()
                },
            ]
        };
        t.add_row(row(
            &b.row,
            &b.method,
            b.descriptors.to_string(),
            b.coalesced.to_string(),
        ));
        // One descriptor pair: no block method.
        t.add_row(row(&r.contiguous, "-", "1".into(), "1".into()));
        println!("{t}");
        println!(
            "blocks / contiguous = {:.3}x (median GB/s); posting {:.1} ns per descriptor \
             (post() {:.1} us){}",
            b.ratio,
            b.post_ns_per_descriptor,
            b.post_call_us,
            if b.posted_inline {
                ", the transfer included: it was done when post() returned"
            } else {
                ""
            }
        );
        for n in &r.notes {
            println!("note: {n}");
        }
        println!("GB/s = 1e9 bytes/s, post to completion; the contiguous row moves the same bytes between the same regions");
    }
    Ok(verdict(ok, ""))
}
