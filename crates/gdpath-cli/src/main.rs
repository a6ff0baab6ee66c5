//! The `gdpath` command. A thin dispatcher: each subcommand lives in its own module, which
//! parses its arguments (clap), calls the `gdpath` crate and formats the result.

use clap::{Parser, Subcommand};
use std::process::ExitCode;

mod doctor;
mod topo;

/// See, check, move and prove GPUDirect data paths (P2P, GDR, GDS).
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
    /// Will P2P, GDR and GDS work here, and if not, why and what to do. Exit status: 0 all
    /// available, 1 some degraded, 2 some unavailable, 3 the doctor failed.
    Doctor(doctor::DoctorArgs),
}

fn main() -> ExitCode {
    let cli = Cli::parse();
    let result = match cli.command {
        Command::Topo(args) => topo::run(args),
        Command::Doctor(args) => doctor::run(args),
    };
    match result {
        Ok(code) => code,
        Err(e) => {
            eprintln!("gdpath: {e:#}");
            ExitCode::FAILURE
        }
    }
}
