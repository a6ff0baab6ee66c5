//! gdpath-report: `gdpath report`, the machine and its GPUDirect data paths as one page that
//! people would rather look at than read, and `gdpath topo --svg`, the drawing alone.
//!
//! The page is one self-contained HTML document (style and SVG inline, nothing loaded, no
//! script; it opens from disk) holding:
//! - the machine drawn as a tree — NUMA nodes, host bridges, PCIe switches, GPUs, NICs, NVMe —
//!   with each PCIe link's generation and width (downtrained ones red), NVLink with its link
//!   count, and over it the paths of [`gdpath_doctor::routes`]: GDR from each GPU to its RDMA
//!   NIC in green, GDS to its NVMe in orange, P2P in blue (lines on small machines, a matrix of
//!   every pair always), solid where the doctor finds the direct path in use, dashed red through
//!   host memory where it does not, dotted where it cannot tell; measured GB/s on them when
//!   results are given ([`layout`] explains the design, [`routing`] how paths are laid);
//! - the doctor's findings with remedies, their subjects compressed to ranges ([`findings`]);
//! - bandwidth-versus-size charts of bench results (`--from` documents of
//!   `gdpath bench … --json`, or `--measure`), with link limits ([`chart`]);
//! - the version, the date, where the machine was read from and the command line behind
//!   every number ([`page`]).
//!
//! Layering: above the doctor and the bench harness, below the CLI, which only parses and
//! writes ([`save`] writes crash-safely).

#![deny(unsafe_code)]

pub mod chart;
pub mod drawing;
pub mod findings;
pub mod geometry;
pub mod lanes;
pub mod layout;
pub mod links;
pub mod matrix;
pub mod measure;
pub mod nccl;
pub mod nvlink;
pub mod page;
pub mod results;
pub mod route_labels;
pub mod routing;
pub mod save;
pub mod strokes;
pub mod svg;
pub mod tree;

pub use results::{BenchDoc, ResultsError};
pub use save::save;

use gdpath_doctor::{ExamineError, Mode};
use gdpath_topo::Source;
use std::path::PathBuf;

/// What `gdpath report` was asked for.
#[derive(Debug, Clone)]
pub struct Options {
    /// Where to read the machine from.
    pub source: Source,
    /// Directories checked for GDS (the current directory when empty); the first also holds
    /// the scratch files of `--measure`'s storage benches.
    pub paths: Vec<PathBuf>,
    /// Bench result documents (`gdpath bench … --json`).
    pub from: Vec<PathBuf>,
    /// Run the quick benches and the doctor's probes now ([`measure`]).
    pub measure: bool,
    /// The command line, program name first, shown in the report.
    pub argv: Vec<String>,
    /// NCCL logs (`NCCL_DEBUG=INFO`) whose chosen paths are shown over the machine ([`nccl`]).
    pub nccl_logs: Vec<PathBuf>,
}

/// Most GPUs, NICs and NVMe drawn as a machine: 256. Each is a box some 110 px wide, so 256
/// make a drawing of about 28,000 px, past what can be read on a page; the largest single-node
/// machines have a few dozen (AWS p5.48xlarge: 8 GPUs, 32 EFA NICs, 8 NVMe). Past it
/// `gdpath report` leaves the drawing out, with a line saying why and the pairs counted per
/// class, and `gdpath topo --svg` refuses ([`ReportError::TooManyToDraw`]); the layout, the
/// paths and the labels, whose placing grows faster than the boxes, stay bounded with it.
pub const MAX_DRAWN_DEVICES: usize = 256;

/// Why no report could be made.
#[derive(Debug, thiserror::Error)]
pub enum ReportError {
    /// The machine, its findings or its GDS directories could not be examined.
    #[error(transparent)]
    Examine(#[from] ExamineError),
    /// A bench result document given with `--from` was refused.
    #[error(transparent)]
    Results(#[from] ResultsError),
    /// An NCCL log could not be read (`--nccl-log`).
    #[error(transparent)]
    Nccl(#[from] gdpath_nccl::NcclError),
    /// More GPUs, NICs and NVMe than [`MAX_DRAWN_DEVICES`] (`gdpath topo --svg`).
    #[error(
        "{devices} GPUs, NICs and NVMe: more than the {limit} gdpath draws (the drawing would be \
         some {} px wide); `gdpath topo` lists them and counts their pairs per class",
        drawing::width_of(*.devices)
    )]
    TooManyToDraw {
        /// The GPUs, NICs and NVMe controllers of the machine.
        devices: usize,
        /// The most the report draws, [`MAX_DRAWN_DEVICES`].
        limit: usize,
    },
}

/// The report page for `opts` (see the crate docs). Errors: the machine cannot be read, a
/// `--path` is not a directory, a `--from` document is not a bench result.
pub fn report(opts: &Options) -> Result<String, ReportError> {
    // Documents first: a bad one fails before anything is measured.
    let mut docs = opts
        .from
        .iter()
        .map(|p| results::read(p))
        .collect::<Result<Vec<_>, _>>()?;
    // Logs next, also before anything is measured.
    let job = if opts.nccl_logs.is_empty() {
        None
    } else {
        Some(gdpath_nccl::read_logs(
            &opts.nccl_logs,
            gdpath_nccl::Limits::default(),
        )?)
    };
    let ex = gdpath_doctor::examine(&opts.source, &opts.paths, opts.measure)?;
    let nccl = job.map(|job| {
        // The machine drawn, and the doctor's peer-memory findings on it.
        let mut topo =
            gdpath_nccl::Topology::new(ex.loaded.machine.clone(), opts.source.describe());
        topo.gdr_facts = ex
            .report
            .findings
            .iter()
            .filter(|f| {
                [
                    gdpath::finding::ids::GDR_PEERMEM_MISSING,
                    gdpath::finding::ids::GDR_DMABUF_UNAVAILABLE,
                ]
                .contains(&f.id.as_str())
            })
            .cloned()
            .collect();
        gdpath_nccl::explain(job, Some(&topo))
    });
    let mut missing = Vec::new();
    if opts.measure {
        match &ex.loaded.mode {
            Mode::Live => {
                let m = measure::measure(&ex.paths[0]);
                docs.extend(m.docs);
                missing.extend(m.missing);
            }
            Mode::Replay { what } => missing.push(format!(
                "--measure: {what} is a replay, with no GPU or drive to measure: run the report \
                 on the machine itself"
            )),
        }
    }
    let routes = ex.routes();
    Ok(page::html(&page::PageInput {
        examination: &ex,
        routes: &routes,
        docs: &docs,
        missing: &missing,
        measured: opts.measure,
        argv: &opts.argv,
        generated: std::time::SystemTime::now(),
        nccl: nccl.as_ref(),
    }))
}

/// The machine drawing alone (an SVG document), with the paths as the doctor judges them
/// (no measurement). Errors: as [`report`], and [`ReportError::TooManyToDraw`] past
/// [`MAX_DRAWN_DEVICES`].
pub fn drawing(source: &Source, paths: &[PathBuf]) -> Result<String, ReportError> {
    let ex = gdpath_doctor::examine(source, paths, false)?;
    let devices = ex.loaded.machine.matrix_devices().len();
    if devices > MAX_DRAWN_DEVICES {
        return Err(ReportError::TooManyToDraw {
            devices,
            limit: MAX_DRAWN_DEVICES,
        });
    }
    let routes = ex.routes();
    let none = results::Figures::default();
    Ok(drawing::machine_svg(
        &ex.loaded.machine,
        &routes,
        &none,
        &none,
    ))
}
