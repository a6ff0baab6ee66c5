//! The data paths between a machine's devices and how each fares, as the doctor's findings say:
//! P2P between every GPU pair, GDR between each GPU and the RDMA NIC the GDR checks judge it by
//! (its nearest; the nearest NIC of any kind when there is no RDMA NIC), GDS between each GPU
//! and its nearest NVMe. This is what `gdpath report` draws; the rules are here, beside the
//! checks whose subjects they read.
//!
//! Which findings apply to a route: those of the route's path (P2P, GDR or GDS) whose subject is
//! `system` (machine-wide), or names only the route's own devices ([`Subject`]: `GPU0-GPU1`,
//! `GPU0`, `NIC0 (mlx5_0)`, `GPU0-NIC0 (mlx5_0)`), or — for GDS — names a `--path` directory
//! whose NVMe is the route's (known from `gds.nvme-far`, `DIR: GPU0-NVME1`, on the live
//! machine). The route's [`RouteState`] is decided by the worst of them, in the doctor's
//! verdict order (unavailable > degraded > unknown > ok; not-run counts only alone).

use crate::Report;
use gdpath::finding::{ids, Area, Finding, Status};
use gdpath_topo::{LinkClass, Machine, SysView};
use std::collections::{HashMap, HashSet};
use std::path::PathBuf;

/// How a route fares, for drawing it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RouteState {
    /// Every applying check passed: the direct path is used.
    Direct,
    /// The direct path is used but slower than it could be (a narrow or downtrained link, ACS
    /// redirect, the path crossing sockets, BAR1 smaller than GPU memory).
    Degraded,
    /// The data goes through host memory instead: a finding is `unavailable` (the fallback of
    /// every GPUDirect path is a copy through host memory), or `degraded` with an id that says
    /// so ([`STAGED_WHEN_DEGRADED`]).
    Staged,
    /// The facts that decide it could not be read, or its checks were not run (a replay).
    Unknown,
}

/// Finding ids whose `degraded` status means the data is staged through host memory rather
/// than slowed on the direct path (docs/doctor.md): NCCL moving the pair's data through host
/// shared memory (`p2p.nccl-level`) or P2P switched off (`p2p.disabled`); NCCL turning GDR off
/// (`gdr.nic-far`), UCX without CUDA transports (`gdr.ucx-no-cuda`); cuFile's compatibility mode,
/// POSIX I/O through its bounce buffers (`gds.compat-mode` and the findings that lead to it:
/// `gds.nvidia-fs-missing`, `gds.fs-unsupported`, `storage.odirect-unsupported`,
/// `gds.device-mapper`, `gds.not-nvme`); and a direct path measured at its fallback's speed
/// (`p2p.measured-fallback`, `gdr.measured-fallback`).
pub const STAGED_WHEN_DEGRADED: [&str; 12] = [
    ids::P2P_DISABLED,
    ids::P2P_NCCL_LEVEL,
    ids::P2P_MEASURED_FALLBACK,
    ids::GDR_NIC_FAR,
    ids::GDR_UCX_NO_CUDA,
    ids::GDR_MEASURED_FALLBACK,
    ids::GDS_COMPAT_MODE,
    ids::GDS_NVIDIA_FS_MISSING,
    ids::GDS_FS_UNSUPPORTED,
    ids::STORAGE_ODIRECT_UNSUPPORTED,
    ids::GDS_DEVICE_MAPPER,
    ids::GDS_NOT_NVME,
];

/// One data path between a GPU and a peer device.
#[derive(Debug, Clone)]
pub struct Route<'r> {
    /// [`Area::P2p`], [`Area::Gdr`] or [`Area::Gds`].
    pub area: Area,
    /// The GPU's id (`GPU0`); for P2P the lower of the pair in PCI order.
    pub gpu: String,
    /// The peer's id: a GPU, a NIC or an NVMe controller.
    pub peer: String,
    /// The pair's class ([`Machine::classify`]: `NV#` for GPUs joined by NVLink).
    pub class: LinkClass,
    /// Whether the direct path is used, degraded, replaced by a copy through host memory, or
    /// unknown.
    pub state: RouteState,
    /// The worst status among the applying findings ([`Status::NotRun`] when only checks not
    /// run apply, or none).
    pub status: Status,
    /// The findings with that status: what decided the state.
    pub deciding: Vec<&'r Finding>,
    /// GDR only: false when the machine has no RDMA NIC the checks judge and the route goes to
    /// the nearest NIC of any kind (network data then goes through host memory).
    pub rdma: bool,
}

/// What a finding's subject names, in the forms the checks write.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Subject<'s> {
    /// `system`: the machine as a whole.
    System,
    /// Devices of the machine by id: `GPU0-GPU1`, `GPU0`, `NIC2 (mlx4_0)`,
    /// `GPU0-NIC0 (0000:10:1b.0)` (the parenthesised interface name or address is dropped).
    Devices(Vec<&'s str>),
    /// A `--path` directory, alone or with devices (`/data: GPU0-NVME1`).
    Dir {
        /// The directory, as the finding names it.
        dir: &'s str,
        /// The devices named after it (empty when none).
        devices: Vec<&'s str>,
    },
    /// Anything else (not matched to any route).
    Other,
}

impl<'s> Subject<'s> {
    /// Parses `subject` against the machine's device ids and the `--path` directories.
    pub fn parse(subject: &'s str, machine: &Machine, dirs: &[PathBuf]) -> Subject<'s> {
        Subject::parse_with(subject, &|id| machine.by_id(id).is_some(), dirs)
    }

    /// [`Subject::parse`] with the machine's ids given as a test (`is_id`), for parsing many
    /// subjects: [`DeviceIds`] looks an id up in O(1) where [`Machine::by_id`] reads the list.
    pub fn parse_with(
        subject: &'s str,
        is_id: &dyn Fn(&str) -> bool,
        dirs: &[PathBuf],
    ) -> Subject<'s> {
        if subject == "system" {
            return Subject::System;
        }
        for d in dirs {
            let Some(d) = d.to_str() else { continue };
            if subject == d {
                return Subject::Dir {
                    dir: subject,
                    devices: Vec::new(),
                };
            }
            if let Some(rest) = subject.strip_prefix(d).and_then(|r| r.strip_prefix(": ")) {
                if let Some(devices) = device_ids(rest, is_id) {
                    return Subject::Dir {
                        dir: &subject[..d.len()],
                        devices,
                    };
                }
            }
        }
        device_ids(subject, is_id).map_or(Subject::Other, Subject::Devices)
    }

    /// The device ids the subject names (none for `system`, a bare directory or other text).
    pub fn devices(&self) -> &[&'s str] {
        match self {
            Subject::Devices(d) | Subject::Dir { devices: d, .. } => d,
            Subject::System | Subject::Other => &[],
        }
    }
}

/// `GPU0-NIC0 (mlx5_0)` → `[GPU0, NIC0]` when every `-`-separated word, less a parenthesised
/// tail, is a device id of the machine.
fn device_ids<'s>(text: &'s str, is_id: &dyn Fn(&str) -> bool) -> Option<Vec<&'s str>> {
    let mut out = Vec::new();
    for part in text.split('-') {
        let id = part.split(" (").next().unwrap_or(part).trim();
        if !is_id(id) {
            return None;
        }
        out.push(id);
    }
    (!out.is_empty()).then_some(out)
}

/// The device ids of a machine, looked up in O(1) ([`Subject::parse_with`]).
pub struct DeviceIds<'m>(HashSet<&'m str>);

impl<'m> DeviceIds<'m> {
    /// The ids of every device of `machine`.
    pub fn of(machine: &'m Machine) -> Self {
        DeviceIds(machine.devices.iter().map(|d| d.id.as_str()).collect())
    }

    /// Whether `id` is a device id of the machine.
    pub fn contains(&self, id: &str) -> bool {
        self.0.contains(id)
    }
}

/// Every route of the machine with its state (see the module docs): P2P pairs in PCI order
/// (on machines of at most [`crate::PER_PAIR_GPUS`] GPUs: a larger one's findings name groups
/// of pairs, and it gets no route per pair), then GDR and GDS per GPU. `view` is the one the
/// report's checks read (it tells an XML source, which has no `/sys/class`); `dirs` are the
/// `--path` directories. O(findings + routes), each route's findings found by their subject.
pub fn routes<'r>(
    machine: &Machine,
    view: &dyn SysView,
    dirs: &[PathBuf],
    report: &'r Report,
) -> Vec<Route<'r>> {
    let ids = DeviceIds::of(machine);
    let parsed: Vec<(&Finding, Subject)> = report
        .findings
        .iter()
        .map(|f| {
            (
                f,
                Subject::parse_with(&f.subject, &|id| ids.contains(id), dirs),
            )
        })
        .collect();
    let index = Index::of(&parsed);
    let gpus: Vec<_> = machine.gpus().collect();
    let mut out = Vec::new();
    // Past PER_PAIR_GPUS the P2P findings name groups of pairs, not pairs: no route per pair.
    if gpus.len() <= crate::PER_PAIR_GPUS {
        let places: Vec<_> = gpus.iter().map(|g| machine.place(g)).collect();
        for (i, a) in places.iter().enumerate() {
            for b in &places[i + 1..] {
                let class = machine.pair_at(a, b).class();
                let (a, b) = (a.device(), b.device());
                out.push(route(Area::P2p, &a.id, &b.id, class, &index, &[], true));
            }
        }
    }
    let by_id: HashMap<&str, &gdpath_topo::Device> =
        machine.devices.iter().map(|d| (d.id.as_str(), d)).collect();
    let rdma_nics = crate::gdr::rdma_nics(machine, view);
    let nearest = machine.nearest();
    for (g, near) in gpus.iter().zip(&nearest) {
        let (nic, rdma) = match crate::gdr::nearest_nic(machine, g, &rdma_nics) {
            Some(n) => (Some(n.id.clone()), true),
            None => (near.nic.as_ref().map(|p| p.id.clone()), false),
        };
        if let Some(nic) = nic.and_then(|id| by_id.get(id.as_str()).copied()) {
            let class = machine.pcie_class(g, nic);
            out.push(route(Area::Gdr, &g.id, &nic.id, class, &index, &[], rdma));
        }
    }
    // The directories and the NVMe they are on, as gds.nvme-far found them.
    let nvme_far: Vec<(&str, &[&str])> = parsed
        .iter()
        .filter(|(f, _)| f.id.as_str() == ids::GDS_NVME_FAR)
        .filter_map(|(_, s)| match s {
            Subject::Dir { dir, devices } => Some((*dir, devices.as_slice())),
            _ => None,
        })
        .collect();
    for (g, near) in gpus.iter().zip(&nearest) {
        let Some(nvme) = near.nvme.as_ref() else {
            continue;
        };
        let on_nvme: Vec<&str> = nvme_far
            .iter()
            .filter(|(_, devices)| devices.contains(&nvme.id.as_str()))
            .map(|(dir, _)| *dir)
            .collect();
        out.push(route(
            Area::Gds,
            &g.id,
            &nvme.id,
            nvme.class,
            &index,
            &on_nvme,
            true,
        ));
    }
    out
}

/// The parsed findings by what their subjects name, so that a route finds the findings that
/// apply to it without reading all of them (a machine of 64 GPUs has 2,016 pairs and some
/// 12,000 P2P findings).
struct Index<'p, 'r> {
    parsed: &'p [(&'r Finding, Subject<'p>)],
    /// Findings about the machine as a whole, and those naming a directory.
    system_or_dir: Vec<usize>,
    /// Findings naming devices only, by the set of ids they name (sorted, each once).
    by_devices: HashMap<Vec<&'p str>, Vec<usize>>,
}

impl<'p, 'r> Index<'p, 'r> {
    fn of(parsed: &'p [(&'r Finding, Subject<'p>)]) -> Self {
        let mut system_or_dir = Vec::new();
        let mut by_devices: HashMap<Vec<&str>, Vec<usize>> = HashMap::new();
        for (i, (_, s)) in parsed.iter().enumerate() {
            match s {
                Subject::System | Subject::Dir { .. } => system_or_dir.push(i),
                Subject::Devices(d) => {
                    let mut key = d.clone();
                    key.sort_unstable();
                    key.dedup();
                    by_devices.entry(key).or_default().push(i);
                }
                Subject::Other => {}
            }
        }
        Index {
            parsed,
            system_or_dir,
            by_devices,
        }
    }

    /// The findings of `area` that apply to the route between `gpu` and `peer` (see the module
    /// docs), in report order.
    fn applying(&self, area: Area, gpu: &str, peer: &str, dirs: &[&str]) -> Vec<&'r Finding> {
        let ends = [gpu, peer];
        let mut pair = vec![gpu, peer];
        pair.sort_unstable();
        pair.dedup();
        let mut at: Vec<usize> = self
            .system_or_dir
            .iter()
            .copied()
            .filter(|&i| match &self.parsed[i].1 {
                Subject::Dir { dir, devices } => {
                    dirs.contains(dir) && devices.iter().all(|id| ends.contains(id))
                }
                _ => true,
            })
            .collect();
        let keys = [vec![gpu], vec![peer], pair];
        for (k, key) in keys.iter().enumerate() {
            // A route of a device to itself has one key, not three.
            if keys[..k].contains(key) {
                continue;
            }
            at.extend(self.by_devices.get(key).into_iter().flatten().copied());
        }
        at.sort_unstable();
        at.into_iter()
            .map(|i| self.parsed[i].0)
            .filter(|f| f.path == area)
            .collect()
    }
}

fn route<'r>(
    area: Area,
    gpu: &str,
    peer: &str,
    class: LinkClass,
    index: &Index<'_, 'r>,
    dirs: &[&str],
    rdma: bool,
) -> Route<'r> {
    let of = index.applying(area, gpu, peer, dirs);
    let with = |st: Status| -> Vec<&'r Finding> {
        of.iter().copied().filter(|f| f.status == st).collect()
    };
    let (state, status, deciding) = if !with(Status::Unavailable).is_empty() {
        (
            RouteState::Staged,
            Status::Unavailable,
            with(Status::Unavailable),
        )
    } else if !with(Status::Degraded).is_empty() {
        let all = with(Status::Degraded);
        let staged: Vec<&Finding> = all
            .iter()
            .copied()
            .filter(|f| STAGED_WHEN_DEGRADED.contains(&f.id.as_str()))
            .collect();
        if staged.is_empty() {
            (RouteState::Degraded, Status::Degraded, all)
        } else {
            (RouteState::Staged, Status::Degraded, staged)
        }
    } else if !with(Status::Unknown).is_empty() {
        (RouteState::Unknown, Status::Unknown, with(Status::Unknown))
    } else if !with(Status::Ok).is_empty() {
        (RouteState::Direct, Status::Ok, with(Status::Ok))
    } else {
        (RouteState::Unknown, Status::NotRun, with(Status::NotRun))
    };
    Route {
        area,
        gpu: gpu.to_owned(),
        peer: peer.to_owned(),
        class,
        state,
        status,
        deciding,
        rdma,
    }
}
