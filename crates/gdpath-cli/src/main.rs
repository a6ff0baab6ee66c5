//! The `gdpath` command. A thin dispatcher: each subcommand lives in its own module, which
//! parses its arguments (clap), calls the `gdpath` crate and formats the result.

mod bench;
mod copy;
mod doctor;
mod load;
mod p2p;
mod progress;
mod serve;
mod topo;

use clap::{Parser, Subcommand};
use std::process::ExitCode;

/// See, check, move and prove GPUDirect data paths (P2P, GDR, GDS) and their host fallbacks.
#[derive(Debug, Parser)]
#[command(name = "gdpath", version, about)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// GPUs, NICs, NVMe, PCIe tree, NUMA and NVLink as a matrix like `nvidia-smi topo -m`.
    Topo(topo::TopoArgs),
    /// Measure a data path: bandwidth, IOPS, latency, data verified.
    #[command(subcommand)]
    Bench(bench::BenchCommand),
    /// P2P capability matrices per GPU pair, as `nvidia-smi topo -p2p r|w|n|a|p`, with CUDA
    /// access and the path gdpath takes.
    P2p(p2p::P2pArgs),
    /// Copy a file through registered host memory (into memory only, or out to another file),
    /// or between a file and GPU memory (`gpu:N[@offset]`).
    Copy(copy::CopyArgs),
    /// Will P2P, GDR and GDS work here, and if not, why and what to do. Exit status: 0 all
    /// available, 1 some degraded, 2 some unavailable, 3 the doctor failed.
    Doctor(doctor::DoctorArgs),
    /// Load a safetensors checkpoint into one GPU allocation on the fastest path.
    Load(load::LoadArgs),
    /// Serve exported memory regions to peer agents over UCX (remote read/write).
    Serve(serve::ServeArgs),
}

fn main() -> ExitCode {
    // UCX writes its log (warnings such as "unused env variable") to stdout unless told
    // otherwise, which would corrupt `--json` output and tables alike: send it to stderr, as
    // gdpath's own log, unless the user chose a destination. Set before any thread starts and
    // before libucp is loaded (UCX reads it when the library initialises).
    if std::env::var_os("UCX_LOG_FILE").is_none() {
        std::env::set_var("UCX_LOG_FILE", "stderr");
    }
    tracing_subscriber::fmt()
        .with_env_filter(tracing_subscriber::EnvFilter::from_env("GDPATH_LOG"))
        .with_writer(std::io::stderr)
        .init();
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Bench(b) => bench::run(b),
        Command::Copy(c) => copy::run(c),
        Command::Load(l) => load::run(l),
        Command::Serve(a) => serve::run(a),
        Command::Topo(args) => topo::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::P2p(args) => p2p::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gdpath: error: {}", error_chain(&e));
            ExitCode::from(1)
        }
    }
}

/// The error and its causes joined by `: `, leaving out a cause whose text the message already
/// holds (several error types put their source in their own message, and anyhow's `{:#}` would
/// then print it twice: "No such file or directory (os error 2): No such file or directory").
pub(crate) fn error_chain(e: &anyhow::Error) -> String {
    let mut out = String::new();
    for cause in e.chain() {
        let text = cause.to_string();
        if out.contains(&text) {
            continue;
        }
        if !out.is_empty() {
            out.push_str(": ");
        }
        out.push_str(&text);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::error_chain;

    #[test]
    fn a_cause_already_in_the_message_is_not_repeated() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let text = io.to_string();
        let e = anyhow::Error::new(io).context(format!("cannot read x: {text}"));
        assert_eq!(error_chain(&e), format!("cannot read x: {text}"));
        let e = anyhow::anyhow!("inner").context("outer");
        assert_eq!(error_chain(&e), "outer: inner");
    }
}
