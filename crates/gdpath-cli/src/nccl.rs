//! `gdpath nccl`: read NCCL's own log (`NCCL_DEBUG=INFO`) and explain which transport NCCL
//! chose for every peer pair, and why (`gdpath_nccl`); `gdpath nccl run -- CMD` runs a command
//! with NCCL's logging on and explains its log. Here only the arguments, the run and the output.

use crate::source::SourceArgs;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use gdpath::topo::text::escape;
use gdpath_nccl::{explain, read_logs, Limits, Topology};
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct NcclArgs {
    #[command(subcommand)]
    run: Option<NcclCommand>,
    /// NCCL log files (one per rank, or all ranks in one); NCCL 2.4 to 2.32.
    #[arg(value_name = "LOG")]
    logs: Vec<PathBuf>,
    #[command(flatten)]
    opts: ExplainOpts,
}

#[derive(Debug, Args)]
struct ExplainOpts {
    /// Compare NCCL's choices with this machine (one topology source; none: the log alone).
    #[command(flatten)]
    source: SourceArgs,
    /// Print JSON (schema gdpath.nccl/2) instead of text.
    #[arg(long)]
    json: bool,
    /// List every rank, pair and evidence line.
    #[arg(long, short)]
    verbose: bool,
}

#[derive(Debug, Subcommand)]
enum NcclCommand {
    /// Run CMD with NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT,GRAPH,NET,P2P,SHM,ENV and one
    /// NCCL_DEBUG_FILE per process in a temporary folder, then explain the logs against the
    /// live machine (or the source given). The exit status is CMD's.
    Run {
        #[command(flatten)]
        opts: ExplainOpts,
        /// The command and its arguments, after `--`.
        #[arg(last = true, required = true, value_name = "CMD")]
        cmd: Vec<String>,
    },
}

impl NcclArgs {
    /// `--json` was given.
    pub fn json(&self) -> bool {
        match &self.run {
            Some(NcclCommand::Run { opts, .. }) => opts.json,
            None => self.opts.json,
        }
    }
}

/// Runs `gdpath nccl`.
pub fn run(a: NcclArgs) -> Result<ExitCode> {
    match a.run {
        Some(NcclCommand::Run { opts, cmd }) => run_command(&opts, &cmd),
        None => {
            if a.logs.is_empty() {
                return Err(crate::usage("give NCCL log files, or `run -- CMD`"));
            }
            let given = a.opts.source.source();
            let source = (!matches!(given, gdpath::topo::Source::Live)).then_some(given);
            show(&a.logs, &a.opts, source)?;
            Ok(ExitCode::SUCCESS)
        }
    }
}

fn show(logs: &[PathBuf], opts: &ExplainOpts, source: Option<gdpath::topo::Source>) -> Result<()> {
    let job = read_logs(logs, Limits::default())?;
    let topo = match &source {
        Some(s) => Some(
            Topology::load(s)
                .with_context(|| format!("reading the topology ({})", escape(&s.describe())))?,
        ),
        None => None,
    };
    let e = explain(job, topo.as_ref());
    if opts.json {
        outln!("{}", serde_json::to_string_pretty(&e)?);
    } else {
        out!("{}", gdpath_nccl::explain::render_text(&e, opts.verbose));
    }
    Ok(())
}

fn run_command(opts: &ExplainOpts, cmd: &[String]) -> Result<ExitCode> {
    let dir = std::env::temp_dir().join(format!("gdpath-nccl.{}", std::process::id()));
    std::fs::create_dir(&dir).with_context(|| format!("creating {}", escape(&dir)))?;
    let result = (|| -> Result<ExitCode> {
        let status = std::process::Command::new(&cmd[0])
            .args(&cmd[1..])
            .env("NCCL_DEBUG", "INFO")
            .env("NCCL_DEBUG_SUBSYS", "INIT,GRAPH,NET,P2P,SHM,ENV")
            .env("NCCL_DEBUG_FILE", dir.join("nccl.%h.%p.log"))
            .status()
            .with_context(|| format!("running {}", escape(&cmd[0])))?;
        let mut logs: Vec<PathBuf> = std::fs::read_dir(&dir)?
            .filter_map(|e| e.ok().map(|e| e.path()))
            .filter(|p| p.is_file())
            .collect();
        logs.sort();
        if logs.is_empty() {
            errln!("gdpath: the command wrote no NCCL log (it did not initialise NCCL, or set NCCL_DEBUG_FILE itself)");
        } else {
            let given = opts.source.source();
            show(&logs, opts, Some(given))?;
        }
        // The command's own status is the result: 128 + signal where it was killed.
        let code = status.code().unwrap_or_else(|| {
            use std::os::unix::process::ExitStatusExt;
            128 + status.signal().unwrap_or(0)
        });
        Ok(ExitCode::from(u8::try_from(code).unwrap_or(1)))
    })();
    let _ = std::fs::remove_dir_all(&dir);
    result
}
