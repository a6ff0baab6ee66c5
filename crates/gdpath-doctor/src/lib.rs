//! gdpath-doctor: `gdpath doctor`, one readiness check for P2P, GDR and GDS that says why and
//! what to do: the findings' rules, the live facts they need, the measured probes, and the
//! machine loader that attaches live driver facts ([`machine`]).
//!
//! The doctor is a pure function of facts: [`run`] takes a [`DoctorInput`] — the machine
//! (topology), a [`SysView`] through which every `/proc` and `/sys` file is read (so a snapshot
//! or a copied tree replays those reads), driver facts (NVML/CUDA), UCX, cuFile and rdma-core
//! facts, the process environment, the memlock limit, and a probe of each `--path` directory —
//! and returns a [`Report`] of [`Finding`]s with stable ids ([`gdpath::finding::ids`]), a verdict
//! per data path and an exit code.
//!
//! Facts that only the live machine can give (the memlock limit of this process, an O_DIRECT
//! open, a cuFile handle registration) are [`Gathered::Missing`] when replaying a capture; their
//! checks then report [`Status::NotRun`]. Live gathering that this crate does itself is in
//! [`live`]; driver, UCX and cuFile facts come from the crates that load those libraries
//! ([`hardware`]); the GDS facts the engine decides by are the engine's own ([`gdpath::gds`]),
//! so the doctor's findings and the engine's path rest on the same reads. [`measured`] runs
//! benches of `gdpath-bench` as probes (`doctor --measure`).
//!
//! [`examine`] is the whole of one doctor run (load, gather, check, measure) as `gdpath doctor`
//! and `gdpath report` make it; [`routes`] says, per GPU pair, GPU↔NIC and GPU↔NVMe, whether
//! the findings leave the direct path in use. The `--json` documents of `gdpath topo` and
//! `gdpath doctor` are built in [`document`], for the CLI and the Python module alike.
//!
//! Rules and their sources are listed per finding id in `docs/doctor.md`.

#![deny(unsafe_code)]

pub mod document;
pub mod examine;
mod gdr;
mod gds;
pub mod hardware;
pub mod live;
pub mod machine;
pub mod measured;
pub mod nccl;
mod p2p;
pub mod render;
pub mod routes;
pub mod subjects;
mod system;

pub use examine::{examine, Examination, ExamineError};
pub use p2p::PER_PAIR_GPUS;

use gdpath::finding::{Area, Finding, Status};
use gdpath_topo::facts::DriverFacts;
use gdpath_topo::snapshot::Snapshot;
use gdpath_topo::{Coverage, DirView, Machine, Source, SysView, TopoError};
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::PathBuf;

/// Schema id of `gdpath doctor --json`.
pub const DOCTOR_SCHEMA: &str = "gdpath.doctor/1";

/// Facts that had to be gathered from a library or the live machine.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
#[serde(tag = "state", content = "value", rename_all = "kebab-case")]
pub enum Gathered<T> {
    /// Gathered.
    Got(T),
    /// Gathering was tried and failed; the text says why (e.g. `libcufile.so.0: cannot open
    /// shared object file`).
    Failed(String),
    /// Not gathered: replaying a capture, or the caller does not gather these facts.
    Missing,
}

impl<T> Gathered<T> {
    /// The facts, when gathered.
    pub fn got(&self) -> Option<&T> {
        match self {
            Gathered::Got(t) => Some(t),
            _ => None,
        }
    }
}

/// Whether the doctor looks at the machine it runs on or at a capture of another.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Mode {
    /// The live machine: missing facts are `unknown`.
    Live,
    /// A snapshot, copied sysfs tree or XML export, described by `what` (`snapshot x.tar.gz`):
    /// checks that need the live machine are `not-run`.
    Replay {
        /// The replayed source, as the report names it (`snapshot x.tar.gz`).
        what: String,
    },
}

/// What UCX reports about itself (filled by the caller from `gdpath-ucx`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct UcxFacts {
    /// `ucp_get_version_string()`, e.g. `1.16.0`.
    pub version: Option<String>,
    /// Transport names available (`tcp`, `posix`, `cma`, `rc_mlx5`, `cuda_copy`, `cuda_ipc`,
    /// `gdr_copy`, ...).
    pub transports: Vec<String>,
    /// Whether UCX was built with CUDA memory support (`UCT_MD cuda_cpy` present), when known.
    pub cuda_support: Option<bool>,
}

/// What cuFile reports (filled by the caller from `gdpath-cuda`).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct CufileFacts {
    /// Whether libcufile could be loaded.
    pub library_found: bool,
    /// cuFile library version (`cuFileGetVersion`, e.g. 1150 → "1.15.0"), as text.
    pub version: Option<String>,
    /// Error text of `cuFileDriverOpen`, when it failed.
    pub driver_open_error: Option<String>,
    /// True when `cuFileDriverGetProperties` says the nvidia-fs driver is in use
    /// (`nvfs.dstatusflags`), false when it says it is not; `None` when not read.
    pub nvfs_in_use: Option<bool>,
    /// True when cuFile reports PCI P2PDMA mode available (cuFile ≥ 1.13 without nvidia-fs).
    pub p2pdma_supported: Option<bool>,
    /// Result of `cuFileHandleRegister` on a file in each `--path` directory: `None` registered,
    /// `Some(text)` cuFile's error (e.g. `file descriptor is not registered`).
    pub handle_register: BTreeMap<PathBuf, Option<String>>,
}

/// What the rdma-core user library offers (gathered live by [`live::rdma_core`]).
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct RdmaCoreFacts {
    /// The library loaded (`libibverbs.so.1`), when it loaded.
    pub library: Option<String>,
    /// Whether it exports `ibv_reg_dmabuf_mr` (rdma-core ≥ 34): needed for dma-buf GDR.
    pub has_reg_dmabuf_mr: bool,
}

/// `RLIMIT_MEMLOCK` of the process, in bytes; `None` is unlimited.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct Memlock {
    /// The soft limit, bytes (`None`: unlimited, `RLIM_INFINITY`).
    pub soft: Option<u64>,
    /// The hard limit, bytes (`None`: unlimited, `RLIM_INFINITY`).
    pub hard: Option<u64>,
}

/// What a live probe of one `--path` directory found (see [`live::probe_path`]).
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PathProbe {
    /// `statfs(2)` `f_type` magic, e.g. 0xEF53 for ext2/3/4.
    pub fs_magic: Option<u64>,
    /// Device number of the file system (`st_dev`) as (major, minor).
    pub dev: Option<(u32, u32)>,
    /// Opening a new file there with `O_DIRECT`.
    pub odirect: OdirectProbe,
}

/// The result of opening a new file with `O_DIRECT` in a directory.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "result", content = "error", rename_all = "kebab-case")]
pub enum OdirectProbe {
    /// `open(O_CREAT | O_DIRECT)` succeeded.
    Works,
    /// A plain create works but `O_DIRECT` is refused; the error text with its errno
    /// (`Invalid argument (os error 22)`).
    Refused(String),
    /// No file could be created there at all (read-only, permissions): not tested.
    NotTested(String),
}

/// One `--path` directory and, when live, its probe.
#[derive(Debug, Clone, PartialEq)]
pub struct PathInput {
    /// The directory as given.
    pub path: PathBuf,
    /// What a live probe of it found; [`Gathered::Missing`] in a replay.
    pub probe: Gathered<PathProbe>,
}

/// Everything the doctor judges. Build it with [`DoctorInput::new`], then fill what is known.
pub struct DoctorInput<'a> {
    /// The machine model the checks judge.
    pub machine: &'a Machine,
    /// Every `/proc`, `/sys` (and `/etc/cufile.json`) read goes through this view.
    pub view: &'a dyn SysView,
    /// Live or replay: whether checks that need the live machine run.
    pub mode: Mode,
    /// NVML/CUDA facts: `Failed` when libcuda or NVML could not be loaded.
    pub driver: Gathered<DriverFacts>,
    /// UCX facts: `Failed` when libucp could not be loaded.
    pub ucx: Gathered<UcxFacts>,
    /// cuFile facts: `Failed` when libcufile could not be loaded or its driver not opened.
    pub cufile: Gathered<CufileFacts>,
    /// rdma-core facts: `Failed` when libibverbs could not be loaded.
    pub rdma_core: Gathered<RdmaCoreFacts>,
    /// Environment variables in force (`NCCL_P2P_DISABLE`, `NCCL_P2P_LEVEL`,
    /// `NCCL_NET_GDR_LEVEL`, `CUDA_VISIBLE_DEVICES`, `CUFILE_ENV_PATH_JSON`,
    /// `CUFILE_FORCE_COMPAT_MODE`). Replays use the current process's environment too, so a
    /// user can ask "what if".
    pub env: BTreeMap<String, String>,
    /// `RLIMIT_MEMLOCK` of the process, which bounds how much host memory can be pinned.
    pub memlock: Gathered<Memlock>,
    /// The `--path` directories for GDS (the current directory by default).
    pub paths: Vec<PathInput>,
}

impl<'a> DoctorInput<'a> {
    /// An input with only the machine and the view: driver facts from the machine
    /// ([`Machine::driver`], e.g. a snapshot's `driver.json`), everything else missing.
    pub fn new(machine: &'a Machine, view: &'a dyn SysView, mode: Mode) -> Self {
        DoctorInput {
            machine,
            view,
            mode,
            driver: machine
                .driver
                .clone()
                .map_or(Gathered::Missing, Gathered::Got),
            ucx: Gathered::Missing,
            cufile: Gathered::Missing,
            rdma_core: Gathered::Missing,
            env: BTreeMap::new(),
            memlock: Gathered::Missing,
            paths: Vec::new(),
        }
    }

    /// The value of an environment variable, trimmed; `None` when unset.
    fn env(&self, name: &str) -> Option<&str> {
        self.env.get(name).map(|v| v.trim())
    }

    /// Status for a check whose facts are missing: `not-run` in a replay, `unknown` live.
    fn missing_status(&self) -> Status {
        match self.mode {
            Mode::Live => Status::Unknown,
            Mode::Replay { .. } => Status::NotRun,
        }
    }

    /// Remedy for a check whose facts are missing: in a replay, the machine itself has them.
    fn missing_remedy(&self) -> &'static str {
        match self.mode {
            Mode::Live => "run the doctor again: these facts are gathered as it starts",
            Mode::Replay { .. } => {
                "run `gdpath doctor` on the machine itself: a replay runs no live checks"
            }
        }
    }

    /// Evidence for a check whose facts are missing.
    fn missing_evidence(&self, what: &str) -> String {
        match &self.mode {
            Mode::Live => format!("{what}: not gathered"),
            Mode::Replay { what: src } => {
                format!("{what}: needs the live machine (replaying {src})")
            }
        }
    }

    /// Text of a file read through the view, trimmed; `None` when absent or unreadable.
    fn text(&self, path: &str) -> Option<String> {
        self.view.read_text(path)
    }

    fn is_replay(&self) -> bool {
        matches!(self.mode, Mode::Replay { .. })
    }
}

/// The verdict for one data path: the worst status among its findings.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Verdict {
    /// The data path judged ([`Area::P2p`], [`Area::Gdr`] or [`Area::Gds`]).
    pub path: Area,
    /// The worst status among its findings.
    pub status: Status,
    /// One line: "available", or the status and the ids that decided it.
    pub summary: String,
}

/// The doctor's result (`--json` schema [`DOCTOR_SCHEMA`]).
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Report {
    /// The schema of this document, [`DOCTOR_SCHEMA`].
    pub schema: &'static str,
    /// Where the machine was read from (`live`, `sysfs-root`, `snapshot`, `hwloc-xml`,
    /// `nccl-xml`, `smi-topo`): a replay names the replayed source, never the machine it runs
    /// on.
    pub source: String,
    /// For a snapshot, the source it was captured from (`live` or `sysfs-root`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captured_from: Option<String>,
    /// `live` or `replay`.
    pub mode: &'static str,
    /// What the source describes and what it cannot ([`Coverage`]): the checks that need what
    /// it cannot describe are `unknown`, with the reason.
    pub coverage: Coverage,
    /// Findings in the order P2P, GDR, GDS, system.
    pub findings: Vec<Finding>,
    /// One per data path: P2P, GDR, GDS, then the system as a whole.
    pub verdicts: Vec<Verdict>,
}

/// Severity order for the exit code and the worst finding: unavailable > degraded > unknown >
/// not-run > ok.
pub fn severity(s: Status) -> u8 {
    match s {
        Status::Ok => 0,
        Status::NotRun => 1,
        Status::Unknown => 2,
        Status::Degraded => 3,
        Status::Unavailable => 4,
    }
}

/// Whether findings of area `a` count for an exit status judged on `need` (empty: all):
/// system findings always (every path depends on them), storage findings (file ↔ host) with GDS.
pub(crate) fn judged(need: &[Area], a: Area) -> bool {
    need.is_empty()
        || a == Area::System
        || need.contains(&a)
        || (a == Area::Storage && need.contains(&Area::Gds))
}

/// The exit statuses of `gdpath doctor` (docs/doctor.md, "Exit status").
pub mod exit {
    /// Nothing degraded or unavailable, and some path's verdict was decided.
    pub const OK: u8 = 0;
    /// Some finding is `degraded` (none `unavailable`).
    pub const DEGRADED: u8 = 1;
    /// Some finding is `unavailable`.
    pub const UNAVAILABLE: u8 = 2;
    /// The doctor itself failed (a source that cannot be read, a bad command line).
    pub const FAILED: u8 = 3;
    /// Nothing degraded or unavailable, but no path's verdict could be decided either: every
    /// verdict is `unknown` or `not-run` (a broken `--sysfs-root`, a source that describes too
    /// little), so a script must not read it as "ready".
    pub const UNDECIDED: u8 = 4;
}

impl Report {
    /// The status of each data path's verdict by name, `p2p`, `gdr`, `gds` → `ok`,
    /// `degraded`, `unavailable`, `unknown` or `not-run` (the system's verdict left out: it is
    /// folded into each path's), as an agent publishes them in its cluster record.
    pub fn path_statuses(&self) -> BTreeMap<String, String> {
        self.verdicts
            .iter()
            .filter(|v| matches!(v.path, Area::P2p | Area::Gdr | Area::Gds))
            .map(|v| (v.path.as_str().to_owned(), v.status.as_str().to_owned()))
            .collect()
    }

    /// The process exit status ([`exit`]): 2 when some finding is `unavailable`, else 1 when
    /// some is `degraded`, else 4 when every path's verdict is `unknown` or `not-run`, else 0.
    /// 3 — the doctor itself failed — is the caller's to return.
    pub fn exit_code(&self) -> u8 {
        self.exit_code_for(&[])
    }

    /// [`Report::exit_code`] judged on the paths `need` names alone (empty: all of them), so
    /// that a node that needs no P2P (one GPU) or no GDR (no RDMA NIC) can still pass
    /// `gdpath doctor --need gds && launch`. Findings of the system area count whatever
    /// `need` says: every path depends on them; storage findings (file ↔ host) count with GDS.
    pub fn exit_code_for(&self, need: &[Area]) -> u8 {
        let judged = |a: Area| judged(need, a);
        let worst = self
            .findings
            .iter()
            .filter(|f| judged(f.path))
            .map(|f| f.status)
            .filter(|s| matches!(s, Status::Degraded | Status::Unavailable))
            .map(severity)
            .max();
        match worst {
            Some(4) => exit::UNAVAILABLE,
            Some(3) => exit::DEGRADED,
            _ if self
                .verdicts
                .iter()
                .filter(|v| judged(v.path))
                .all(|v| matches!(v.status, Status::Unknown | Status::NotRun)) =>
            {
                exit::UNDECIDED
            }
            _ => exit::OK,
        }
    }

    /// Adds findings (e.g. from [`measured`]) in their path's group and recomputes the verdicts.
    pub fn extend(&mut self, more: impl IntoIterator<Item = Finding>) {
        self.findings.extend(more);
        let order = |a: Area| match a {
            Area::P2p => 0,
            Area::Gdr => 1,
            Area::Gds | Area::Storage => 2,
            Area::System => 3,
        };
        // Stable: keeps the order within each path.
        self.findings.sort_by_key(|f| order(f.path));
        self.verdicts = verdicts(&self.findings);
    }

    /// Findings of one path, in report order.
    pub fn of(&self, area: Area) -> impl Iterator<Item = &Finding> {
        self.findings.iter().filter(move |f| f.path == area)
    }

    /// The verdict for one path.
    pub fn verdict(&self, area: Area) -> Option<&Verdict> {
        self.verdicts.iter().find(|v| v.path == area)
    }
}

/// Runs every check. Never fails: what cannot be read is reported as `unknown` or `not-run`.
pub fn run(input: &DoctorInput) -> Report {
    let mut findings = Vec::new();
    findings.extend(p2p::check(input));
    findings.extend(gdr::check(input));
    findings.extend(gds::check(input));
    findings.extend(system::check(input));
    let verdicts = verdicts(&findings);
    Report {
        schema: DOCTOR_SCHEMA,
        source: input.machine.source.clone(),
        captured_from: input.machine.captured_from.clone(),
        mode: if input.is_replay() { "replay" } else { "live" },
        coverage: input.machine.coverage.clone(),
        findings,
        verdicts,
    }
}

fn verdicts(findings: &[Finding]) -> Vec<Verdict> {
    [Area::P2p, Area::Gdr, Area::Gds, Area::System]
        .into_iter()
        .map(|a| verdict(a, findings))
        .collect()
}

/// The verdict of one path: unavailable, else degraded, else unknown, else available when some
/// check passed (checks not run do not lower it, and the summary counts them), else not-run.
fn verdict(area: Area, findings: &[Finding]) -> Verdict {
    let of: Vec<&Finding> = findings.iter().filter(|f| f.path == area).collect();
    let count = |st: Status| of.iter().filter(|f| f.status == st).count();
    let status = [
        Status::Unavailable,
        Status::Degraded,
        Status::Unknown,
        Status::Ok,
        Status::NotRun,
    ]
    .into_iter()
    .find(|s| count(*s) > 0)
    .unwrap_or(Status::NotRun);
    let not_run = count(Status::NotRun);
    let tail = if not_run > 0 && status != Status::NotRun {
        format!("; {} not run", plural(not_run, "check", "checks"))
    } else {
        String::new()
    };
    let summary = match status {
        Status::Ok => format!(
            "available ({} passed{tail})",
            plural(count(Status::Ok), "check", "checks")
        ),
        _ if of.is_empty() => "no checks".to_owned(),
        _ => {
            // Each deciding id with its subjects in few words.
            let mut by_id: Vec<(&str, Vec<&str>)> = Vec::new();
            for f in of.iter().filter(|f| f.status == status) {
                match by_id.iter_mut().find(|(id, _)| *id == f.id.as_str()) {
                    Some((_, subs)) => subs.push(&f.subject),
                    None => by_id.push((f.id.as_str(), vec![&f.subject])),
                }
            }
            let ids: Vec<String> = by_id
                .iter()
                .map(|(id, subs)| format!("{id} ({})", subjects::compress(subs)))
                .collect();
            let word = match status {
                Status::Unavailable => "unavailable",
                Status::Degraded => "degraded",
                Status::Unknown => "unknown",
                _ => "not checked",
            };
            format!("{word}: {}{tail}", ids.join(", "))
        }
    };
    Verdict {
        path: area,
        status,
        summary,
    }
}

/// `1 GPU`, `2 GPUs`.
pub(crate) fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Builds a finding.
pub(crate) fn finding(
    id: &str,
    area: Area,
    subject: impl Into<String>,
    status: Status,
    evidence: impl Into<String>,
    remedy: impl Into<String>,
) -> Finding {
    Finding {
        id: id.into(),
        path: area,
        subject: subject.into(),
        status,
        evidence: evidence.into(),
        remedy: remedy.into(),
    }
}

/// A view with no files: for machines read from hwloc or NCCL XML, which carry no `/proc` or
/// `/sys` files. Every read fails with `NotFound`.
#[derive(Debug, Clone, Copy, Default)]
pub struct NoFiles;

impl SysView for NoFiles {
    fn read_canonical(&self, path: &str) -> std::io::Result<Vec<u8>> {
        Err(std::io::Error::new(
            std::io::ErrorKind::NotFound,
            format!("{path}: the source has no files"),
        ))
    }
    fn list_canonical(&self, path: &str) -> std::io::Result<Vec<String>> {
        self.read_canonical(path).map(|_| Vec::new())
    }
    fn link_canonical(&self, _path: &str) -> std::io::Result<String> {
        Err(std::io::Error::new(
            std::io::ErrorKind::InvalidInput,
            "not a link",
        ))
    }
}

/// A machine and the view its files are read through.
pub struct Loaded {
    /// The machine model read from the source.
    pub machine: Machine,
    /// The view every `/proc` and `/sys` read goes through (the live root or the replayed tree).
    pub view: Box<dyn SysView>,
    /// Live or replay, with the replayed source named.
    pub mode: Mode,
}

/// Loads a machine for the doctor from any source, with the view that replays its files:
/// the live `/` for [`Source::Live`], the copied tree, the snapshot's files, or [`NoFiles`] for
/// XML exports. Errors as [`gdpath_topo::load`].
pub fn load(source: &Source) -> Result<Loaded, TopoError> {
    // A replay is named as `gdpath topo` names its source (`NCCL XML FILE`, `snapshot FILE`).
    let replay = || Mode::Replay {
        what: source.describe(),
    };
    Ok(match source {
        Source::Live => {
            let mut machine = gdpath_topo::load(source)?;
            // Live NVLink facts make the pair classes NV#, as `gdpath topo` prints them (and as
            // a snapshot replays them); without a driver NVLink is unknown with the loader's
            // reason, which `live::gather` gathers again and reports as a finding.
            let _ = crate::machine::attach_live_driver(&mut machine);
            Loaded {
                machine,
                view: Box::new(DirView::live()),
                mode: Mode::Live,
            }
        }
        Source::SysfsRoot(dir) => Loaded {
            machine: gdpath_topo::load(source)?,
            view: Box::new(DirView::new(dir)),
            mode: replay(),
        },
        Source::Snapshot(path) => {
            let snap = Snapshot::open(path)?;
            Loaded {
                machine: snap.machine()?,
                view: Box::new(snap.view),
                mode: replay(),
            }
        }
        Source::HwlocXml(_) | Source::NcclXml(_) | Source::SmiTopo(_) => Loaded {
            machine: gdpath_topo::load(source)?,
            view: Box::new(NoFiles),
            mode: replay(),
        },
    })
}

/// Reads every file the doctor reads, through `view`, and discards the findings. For
/// `gdpath topo capture`: pass the capture's [`gdpath_topo::Recording`] so that the snapshot
/// holds the doctor's files too and `gdpath doctor --snapshot` replays them (the `--path`
/// probes and the environment are live-only and not captured).
pub fn read_files(machine: &Machine, view: &dyn SysView) {
    let _ = run(&DoctorInput::new(machine, view, Mode::Live));
}

/// The remedy for a finding the source leaves unknown: read the machine, `where` it shows.
pub(crate) fn read_the_machine(what: &str) -> String {
    format!(
        "read the machine itself, where {what}: `gdpath doctor` on it, or a snapshot of it \
         (`gdpath topo capture`)"
    )
}

/// The remedy for facts a snapshot's driver record lacks (captured by an older gdpath).
pub(crate) const RECAPTURE: &str = "capture the machine again (`gdpath topo capture` records \
     these driver facts), or run `gdpath doctor` on it";

/// The remedy for a pair whose PCIe class the source does not give.
pub(crate) const PAIR_CLASS_UNKNOWN: &str = "read the machine where the pair's PCIe path is \
     known: `gdpath doctor` on the machine itself, a snapshot of it (`gdpath topo capture`), or \
     its `nvidia-smi topo -m` text (`--smi-topo FILE`)";

/// The remedy of `system.no-gpu`: a machine with GPUs, or a source that can show them.
pub(crate) fn no_gpu_remedy(status: Status) -> String {
    if status == Status::Unknown {
        read_the_machine("the PCI device list gives each function's class and vendor")
    } else {
        "run the doctor on a machine with NVIDIA GPUs (or replay one with --snapshot)".to_owned()
    }
}

/// `system.no-gpu` under `area` when the machine has no GPU: GDR and GDS need one, whatever
/// else is in place.
fn no_gpu(input: &DoctorInput, area: Area) -> Option<Finding> {
    let (status, evidence) = gpu_absence(input)?;
    Some(finding(
        gdpath::finding::ids::SYSTEM_NO_GPU,
        area,
        "system",
        status,
        evidence,
        no_gpu_remedy(status),
    ))
}

/// `None` when the source has an NVIDIA GPU; else the status and evidence of its absence. A
/// replayed file whose PCI entries carry neither class nor vendor (AWS g5.48xlarge's NCCL
/// file: bare `<pci busid>`) may hold GPUs nobody can recognise: that is unknown, not absent.
fn gpu_absence(input: &DoctorInput) -> Option<(Status, String)> {
    let m = input.machine;
    if m.gpus().next().is_some() {
        return None;
    }
    if m.devices.is_empty() {
        // A machine always has PCI functions (host bridges at least): a source without any
        // did not show its PCI bus, which says nothing about GPUs.
        return Some((
            Status::Unknown,
            format!(
                "the source ({}) lists no PCI function at all: whether there are GPUs is unknown",
                m.source
            ),
        ));
    }
    let unclassified = m
        .devices
        .iter()
        .filter(|d| {
            d.class == gdpath_topo::names::UNKNOWN_CLASS
                && d.vendor == gdpath_topo::names::UNKNOWN_ID
        })
        .count();
    Some(if unclassified > 0 && input.is_replay() {
        (
            Status::Unknown,
            format!(
                "no recognisable NVIDIA GPU in the source ({}): {unclassified} of its {} PCI \
                 functions carry neither class nor vendor, so GPUs among them cannot be told",
                m.source,
                m.devices.len()
            ),
        )
    } else {
        (
            Status::Unavailable,
            format!(
                "no NVIDIA GPU among the {} PCI functions of the source ({}): nothing to move \
                 data to or from",
                m.devices.len(),
                m.source
            ),
        )
    })
}

/// Whether a kernel module is loaded, with the evidence ([`gdpath::kmod::module_state`]; where
/// neither `/sys/module` nor `/proc/modules` can be read, [`modules_unknown`]'s words).
fn module_loaded(input: &DoctorInput, name: &str) -> (Option<bool>, String) {
    match gdpath::kmod::module_state(input.view, name) {
        (None, _) => (None, modules_unknown(input)),
        known => known,
    }
}

/// Why loaded modules are unknown: on the live machine `/sys/module` and `/proc/modules` could
/// not be read; a replayed source does not describe them, which replays say as other findings
/// of what a source lacks do.
fn modules_unknown(input: &DoctorInput) -> String {
    if input.is_replay() {
        "/sys/module and /proc/modules not in the source".to_owned()
    } else {
        "/sys/module and /proc/modules not readable".to_owned()
    }
}

/// The kernel release: `/proc/sys/kernel/osrelease`, else the third word of `/proc/version`.
fn kernel_release(input: &DoctorInput) -> Option<(String, &'static str)> {
    if let Some(r) = input
        .text("/proc/sys/kernel/osrelease")
        .filter(|r| !r.is_empty())
    {
        return Some((r, "/proc/sys/kernel/osrelease"));
    }
    let v = input.text("/proc/version")?;
    let mut w = v.split_whitespace();
    (w.next() == Some("Linux") && w.next() == Some("version"))
        .then(|| w.next().map(|r| (r.to_owned(), "/proc/version")))
        .flatten()
}

/// (major, minor) of a kernel release such as `6.18.44-fc-v657-gpu` or `4.14.0-49.el7a`.
fn kernel_version(release: &str) -> Option<(u32, u32)> {
    let mut it = release.split(|c: char| !c.is_ascii_digit());
    let major = it.next()?.parse().ok()?;
    let minor = it.next()?.parse().ok()?;
    Some((major, minor))
}

/// Formats a byte count with a binary unit (`256 MiB`, `141 GiB`).
fn bytes(n: u64) -> String {
    const UNITS: [&str; 5] = ["B", "KiB", "MiB", "GiB", "TiB"];
    let mut v = n as f64;
    let mut u = 0;
    while v >= 1024.0 && u < UNITS.len() - 1 {
        v /= 1024.0;
        u += 1;
    }
    if (v - v.round()).abs() < 0.05 {
        format!("{:.0} {}", v.round(), UNITS[u])
    } else {
        format!("{v:.1} {}", UNITS[u])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn path_statuses_name_each_data_path_as_the_json_document_does() {
        let xml = gdpath_testkit::fixture("nccl-xml/nccl-azure-ndv2-topo.xml");
        let e = crate::examine(&Source::NcclXml(xml), &[], false).unwrap();
        let names = e.report.path_statuses();
        assert_eq!(
            names.keys().map(String::as_str).collect::<Vec<_>>(),
            ["gdr", "gds", "p2p"]
        );
        let doc = serde_json::to_value(&e.report).unwrap();
        for v in doc["verdicts"].as_array().unwrap() {
            let path = v["path"].as_str().unwrap();
            if path != "system" {
                assert_eq!(v["status"].as_str(), names.get(path).map(String::as_str));
            }
        }
    }

    #[test]
    fn kernel_versions_and_sizes() {
        assert_eq!(kernel_version("6.18.44-fc-v657-gpu"), Some((6, 18)));
        assert_eq!(kernel_version("4.14.0-49.el7a.ppc64le"), Some((4, 14)));
        assert_eq!(kernel_version("garbage"), None);
        assert_eq!(bytes(256 << 20), "256 MiB");
        assert_eq!(bytes(262_144 << 20), "256 GiB");
        assert_eq!(bytes(1536), "1.5 KiB");
    }
}
