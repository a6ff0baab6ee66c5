//! The `gdpath` command. A thin dispatcher: each subcommand lives in its own module, which
//! parses its arguments (clap), calls the `gdpath` crates (the engine, `gdpath-bench`,
//! `gdpath-doctor`) and formats the result.

#![deny(unsafe_code)]

// First: its macros (`out!`, `outln!`, `errln!`) are used by the modules below.
#[macro_use]
mod output;
mod args;
mod bench;
mod cluster;
mod copy;
mod doctor;
mod interrupt;
mod load;
mod nccl;
mod p2p;
mod progress;
mod report;
mod resave;
mod serve;
mod source;
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
    /// Will P2P, GDR and GDS work here, and if not, why and what to do. Exit status: 0 nothing
    /// degraded or unavailable, 1 some degraded, 2 some unavailable, 3 the doctor failed, 4
    /// nothing decided.
    Doctor(doctor::DoctorArgs),
    /// Load a safetensors checkpoint into one GPU allocation on the fastest path.
    Load(load::LoadArgs),
    /// Load a safetensors checkpoint onto a GPU and save it back to another file through the
    /// engine's save (crash-safe, fsynced), checked byte-equal: the save benchmark.
    Resave(resave::ResaveArgs),
    /// Serve exported memory regions to peer agents over UCX (remote read/write).
    Serve(serve::ServeArgs),
    /// Agents published in an etcd cluster (`serve --cluster`): list them, watch them.
    #[command(subcommand)]
    Cluster(cluster::ClusterCommand),
    /// One HTML page of the machine, its P2P/GDR/GDS paths as the doctor finds them, the
    /// findings with remedies and bench charts (`--from` results, or `--measure`).
    Report(report::ReportArgs),
    /// Read NCCL's own log (NCCL_DEBUG=INFO) and explain the transport of every peer pair:
    /// P2P, SHM, NET with or without GPUDirect RDMA, and why (`run -- CMD` logs and explains).
    Nccl(nccl::NcclArgs),
}

impl Command {
    /// `--json` was given: a failure is then also a JSON document on stdout.
    fn json(&self) -> bool {
        match self {
            Command::Topo(a) => a.json,
            Command::Bench(b) => b.json(),
            Command::P2p(a) => a.json,
            Command::Copy(a) => a.json,
            Command::Doctor(a) => a.json,
            Command::Load(a) => a.json,
            Command::Resave(a) => a.json,
            Command::Nccl(a) => a.json(),
            Command::Cluster(c) => c.json(),
            Command::Serve(_) | Command::Report(_) => false,
        }
    }
}

/// Schema name of the JSON document a failing `--json` run prints on stdout:
/// `{"schema", "error", "kind"}` ([`error_kind`]).
pub(crate) const ERROR_SCHEMA: &str = "gdpath.error/1";

fn main() -> ExitCode {
    // Warnings by default: the engine's rate-limited ones (connections dropped to make room,
    // accept failing at the descriptor limit) are how an operator learns of trouble.
    let filter = tracing_subscriber::EnvFilter::try_from_env("GDPATH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    use std::io::IsTerminal;
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        // Colour codes only where a person reads them, not in a journal or a file.
        .with_ansi(std::io::stderr().is_terminal())
        .with_writer(std::io::stderr)
        .init();
    let cli = match Cli::try_parse() {
        Ok(cli) => cli,
        Err(e) => return usage_failure(e),
    };
    let json = cli.command.json();
    let is_doctor = matches!(cli.command, Command::Doctor(_));
    // `serve` and `bench net` stop gracefully on a first signal (they poll the flag); every
    // other command ends at once, removing its unfinished temporary files.
    let graceful = matches!(
        cli.command,
        Command::Serve(_)
            | Command::Bench(bench::BenchCommand::Net(_))
            | Command::Cluster(cluster::ClusterCommand::Watch(_))
    );
    if !graceful {
        interrupt::clean_up_on_interrupt();
    }
    let result = match cli.command {
        Command::Bench(b) => bench::run(b),
        Command::Copy(c) => copy::run(c),
        Command::Load(l) => load::run(l),
        Command::Resave(r) => resave::run(r),
        Command::Serve(a) => serve::run(a),
        Command::Topo(args) => topo::run(args),
        Command::Doctor(args) => doctor::run(args),
        Command::P2p(args) => p2p::run(args),
        Command::Report(args) => report::run(args),
        Command::Nccl(args) => nccl::run(args),
        Command::Cluster(c) => cluster::run(c),
    };
    let code = match result {
        Ok(code) => code,
        Err(e) => {
            let kind = error_kind(&e);
            let message = error_chain(&e) + hint(kind);
            errln!("gdpath: error: {message}");
            if json {
                print_error_json(&message, kind);
            }
            ExitCode::from(failure_status(is_doctor, kind == "usage"))
        }
    };
    // How writing stdout went decides the rest (`output`'s module docs): a reader that left
    // keeps the command's status; lost output fails the command.
    match output::finish() {
        None | Some(output::Failure::Closed) => code,
        Some(output::Failure::Failed(e)) => {
            errln!("gdpath: error: cannot write to stdout: {e}");
            ExitCode::from(failure_status(is_doctor, false))
        }
    }
}

/// Command-line parsing failed (or asked for help): clap's message, status 2 (3 for `doctor`,
/// whose 2 means "unavailable"), and with `--json` on the command line also the error
/// document with kind `usage`.
fn usage_failure(e: clap::Error) -> ExitCode {
    use clap::error::ErrorKind;
    let wants_json = std::env::args_os()
        .skip(1)
        .take_while(|a| a != "--")
        .any(|a| a == "--json");
    let help = matches!(
        e.kind(),
        ErrorKind::DisplayHelp
            | ErrorKind::DisplayVersion
            | ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
    );
    if help {
        // clap's own exit ignores a failed write; help is output like any other, so a stdout
        // that cannot take it fails the command as output::finish describes.
        let printed = e
            .print()
            .and_then(|()| std::io::Write::flush(&mut std::io::stdout()));
        if let Err(err) = printed {
            if e.kind() != ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand
                && err.kind() != std::io::ErrorKind::BrokenPipe
            {
                errln!("gdpath: error: cannot write to stdout: {err}");
                let doctor = subcommand_word().as_deref() == Some("doctor");
                return ExitCode::from(failure_status(doctor, false));
            }
        }
        return ExitCode::from(u8::try_from(e.exit_code()).unwrap_or(USAGE_STATUS));
    }
    // clap's own printing ignores a failed write too.
    let _ = e.print();
    if wants_json {
        let text = e.to_string();
        let first = text.lines().next().unwrap_or_default();
        print_error_json(first.strip_prefix("error: ").unwrap_or(first), "usage");
    }
    let doctor = subcommand_word().as_deref() == Some("doctor");
    let _ = output::finish();
    ExitCode::from(failure_status(doctor, true))
}

/// What the CLI adds to an error of `kind` whose engine message names no option: the option
/// that does what was refused.
fn hint(kind: &str) -> &'static str {
    match kind {
        "exists" => ": it is replaced only with --overwrite",
        _ => "",
    }
}

/// Exit status of a bad command line, as clap's own.
const USAGE_STATUS: u8 = 2;

/// Exit status of a command that ran but whose data did not verify (a bench row, a copy):
/// apart from a bad command line (2) and any other failure (1), so that a script can tell
/// them.
pub(crate) const NOT_VERIFIED_STATUS: u8 = 3;

/// The exit status of a failed run: the doctor's own (3; its 1 and 2 are verdicts, so a bad
/// doctor command line is 3 too); otherwise 2 for a bad command line, 1 for anything else.
fn failure_status(doctor: bool, usage: bool) -> u8 {
    if doctor {
        doctor::EXIT_FAILED
    } else if usage {
        USAGE_STATUS
    } else {
        1
    }
}

/// The first command-line word that is not an option: the subcommand, when there is one.
fn subcommand_word() -> Option<String> {
    std::env::args().skip(1).find(|a| !a.starts_with('-'))
}

fn print_error_json(message: &str, kind: &str) {
    let doc = serde_json::json!({ "schema": ERROR_SCHEMA, "error": message, "kind": kind });
    // Nothing better to do if stdout is gone: the message is on stderr already.
    if let Ok(text) = serde_json::to_string_pretty(&doc) {
        outln!("{text}");
    }
}

/// An error of the command line the CLI itself found (a bad argument, a name that does not
/// resolve), with its [`error_kind`].
#[derive(Debug)]
pub(crate) struct CliError {
    pub kind: &'static str,
    pub message: String,
}

impl std::fmt::Display for CliError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

/// A bad argument or combination of arguments (kind `usage`, as clap's own).
pub(crate) fn usage(message: impl Into<String>) -> anyhow::Error {
    CliError {
        kind: "usage",
        message: message.into(),
    }
    .into()
}

/// The machine-readable category of a failure, from the outermost typed error of its chain:
/// an engine error's [`gdpath::Error::kind`] (`peer_failed`, `open`, `config`, ...; a file
/// error's, [`gdpath::file::Error`], is the kind of the engine variant it converts into), a
/// checkpoint load's [`gdpath_checkpoint::LoadError::kind`] (`checkpoint` for a malformed
/// file), a save's [`gdpath_checkpoint::SaveError::kind`] (`exists`, `no_space`, ...); the CLI's own are `usage` and `resolve`; a size that does not parse
/// ([`gdpath::units::SizeError`]: only command-line values are parsed as sizes) is `usage`; a
/// bare I/O error is `io`; anything else `other`.
pub(crate) fn error_kind(e: &anyhow::Error) -> &'static str {
    for cause in e.chain() {
        if let Some(c) = cause.downcast_ref::<CliError>() {
            return c.kind;
        }
        if cause.is::<gdpath::units::SizeError>() {
            return "usage";
        }
        if let Some(g) = cause.downcast_ref::<gdpath::Error>() {
            return g.kind();
        }
        if let Some(f) = cause.downcast_ref::<gdpath::file::Error>() {
            return gdpath::Error::from(f.clone()).kind();
        }
        if let Some(c) = cause.downcast_ref::<gdpath_cluster::ClusterError>() {
            return c.kind();
        }
        if let Some(l) = cause.downcast_ref::<gdpath_checkpoint::LoadError>() {
            return l.kind();
        }
        if let Some(c) = cause.downcast_ref::<gdpath_checkpoint::CheckpointError>() {
            return c.kind();
        }
        if let Some(s) = cause.downcast_ref::<gdpath_checkpoint::SaveError>() {
            return s.kind();
        }
        if cause.is::<std::io::Error>() {
            return "io";
        }
    }
    "other"
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
    use super::{error_chain, error_kind, usage};

    #[test]
    fn the_kind_is_the_outermost_typed_error() {
        let e = anyhow::Error::new(gdpath::Error::PeerFailed {
            peer: "x".into(),
            detail: "y".into(),
        })
        .context("bench net with x");
        assert_eq!(error_kind(&e), "peer_failed");
        let e = anyhow::Error::new(gdpath::Error::Config("c".into())).context("outer");
        assert_eq!(error_kind(&e), "config");
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        assert_eq!(error_kind(&anyhow::Error::new(io).context("reading")), "io");
        assert_eq!(error_kind(&usage("--qd must be at least 1")), "usage");
        let size = gdpath::units::parse_size_range("0").unwrap_err();
        assert_eq!(
            error_kind(&anyhow::Error::new(size).context("--size")),
            "usage"
        );
        assert_eq!(error_kind(&anyhow::anyhow!("untyped")), "other");
    }

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
