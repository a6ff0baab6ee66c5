//! The text of `nvidia-smi topo -m`: a parser, a writer of the same format, and the text as a
//! source ([`read_file`]) — many bug reports include nothing else.
//!
//! The format: a header row of column ids (`GPU0 … NIC0 …`) followed by the affinity columns
//! that version prints (`CPU Affinity`, then from R450 or so `NUMA Affinity`, and on recent
//! drivers `GPU NUMA ID`); one row per id with the class codes and, for GPUs, the affinity cells;
//! then `Legend:` and, when there are NICs, `NIC Legend:` mapping `NIC0` to the RDMA device name.
//! Older versions name NICs in the header by their RDMA device (`mlx5_0`) instead, and print
//! `SOC` (a socket-level link, today's `SYS`). nvidia-smi separates cells with tabs (and
//! underlines the header with ANSI codes on a terminal); copies posted on the web often have
//! spaces instead. The parser accepts all of these; a blank cell is kept as `None` when the row
//! uses tabs (with spaces, blank cells cannot be told apart). A second matrix in the same text
//! (`topo -p2p`) ends the first.
//!
//! As a source, the matrix is the whole of what the text says: the class of each pair, NV#,
//! and the GPUs' CPU and NUMA affinity — no PCI tree, no addresses (devices get synthetic ones,
//! `ffff:e0:00.0` on), no link state. The [`Machine`] it gives states those classes
//! ([`Machine::stated_pcie`]) and its coverage says so.

use crate::class::LinkClass;
use crate::coverage::{Coverage, Facet};
use crate::cpus::CpuSet;
use crate::device::{Device, DeviceKind};
use crate::iommu::IommuState;
use crate::machine::pair_key;
use crate::machine::Machine;
use crate::pci::PciAddr;
use crate::{input, TopoError};
use std::collections::{BTreeMap, HashMap, HashSet};
use std::path::Path;

/// One `nvidia-smi topo -m` matrix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmiMatrix {
    /// Column and row ids, in header order (`GPU0`, `NIC0`, or an RDMA device name such as
    /// `mlx5_0` in older versions).
    pub ids: Vec<String>,
    /// One row per id that has a row in the text (a cut-short copy may have fewer rows).
    pub rows: Vec<SmiRow>,
    /// `NIC Legend` entries: (`NIC0`, `mlx5_0`).
    pub nic_legend: Vec<(String, String)>,
    /// Which affinity columns the header has.
    pub columns: SmiColumns,
}

/// The affinity columns of a header.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SmiColumns {
    /// Whether the header has a `CPU Affinity` column.
    pub cpu_affinity: bool,
    /// Whether the header has a `NUMA Affinity` column.
    pub numa_affinity: bool,
    /// Whether the header has a `GPU NUMA ID` column.
    pub gpu_numa_id: bool,
}

impl SmiColumns {
    /// All three, as current nvidia-smi (and gdpath) print them.
    pub const ALL: SmiColumns = SmiColumns {
        cpu_affinity: true,
        numa_affinity: true,
        gpu_numa_id: true,
    };
}

/// One row of the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmiRow {
    /// The row's device id (`GPU0`, `NIC0`).
    pub id: String,
    /// One class per column id.
    pub cells: Vec<LinkClass>,
    /// `CPU Affinity` (`0-31`), `NUMA Affinity` (`0`) and `GPU NUMA ID` (`N/A`) as printed;
    /// `None` where the cell is blank or the column absent.
    pub cpu_affinity: Option<String>,
    /// The `NUMA Affinity` cell as printed.
    pub numa_affinity: Option<String>,
    /// The `GPU NUMA ID` cell as printed.
    pub gpu_numa_id: Option<String>,
}

/// Why a text is not an `nvidia-smi topo -m` matrix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmiError {
    /// The text has no header row naming `GPU0`.
    #[error("no header row with GPU0 found (not the output of nvidia-smi topo -m)")]
    NoHeader,
    /// A row of the matrix, or its header, cannot be read.
    #[error("line {line}: {message}")]
    BadRow {
        /// Line of the row, from 1.
        line: usize,
        /// What is wrong with it.
        message: String,
    },
    /// More devices than gdpath classifies: checked before any pairwise work.
    #[error(
        "the header has {count} devices, more than the {limit} gdpath classifies (the pairwise \
         work grows with the square of the count)"
    )]
    TooManyDevices {
        /// Devices the header names.
        count: usize,
        /// The most gdpath classifies ([`crate::input::MAX_MATRIX_DEVICES`]).
        limit: usize,
    },
}

fn strip_ansi(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    let mut chars = s.chars().peekable();
    while let Some(c) = chars.next() {
        if c == '\u{1b}' {
            // CSI: ESC [ ... final byte in @..~
            if chars.peek() == Some(&'[') {
                chars.next();
                for f in chars.by_ref() {
                    if ('@'..='~').contains(&f) {
                        break;
                    }
                }
            }
            continue;
        }
        out.push(c);
    }
    out
}

/// `GPU0`, `NIC3`, `NVME1`: an id as current nvidia-smi prints it.
fn is_id(tok: &str) -> bool {
    ["GPU", "NIC", "NVME", "NVMe"].iter().any(|p| {
        tok.strip_prefix(p)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

/// The class a cell prints: the legend's codes, and `SOC` of versions before `SYS`.
fn parse_cell(cell: &str) -> Result<LinkClass, String> {
    match cell.trim() {
        "SOC" => Ok(LinkClass::Sys),
        c => c.parse::<LinkClass>().map_err(|e| e.to_string()),
    }
}

/// A header: the ids before the affinity columns, and which affinity columns follow.
fn parse_header(line: &str) -> Option<(Vec<String>, SmiColumns)> {
    // Asked of every line: the first word decides most, before the line is split up.
    if line.split_whitespace().next() != Some("GPU0") {
        return None;
    }
    let toks: Vec<&str> = line.split_whitespace().collect();
    let ids: Vec<&str> = toks
        .iter()
        .copied()
        .take_while(|t| *t != "CPU" && *t != "NUMA" && *t != "GPU")
        .collect();
    // A row (`GPU0  X  NV18 ...`) starts like a header; its cells are classes. Other ids are
    // NIC names of older versions: RDMA device names (`mlx5_0`, `rdmap16s27`).
    let name_like = |t: &str| {
        t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || matches!(b, b'_' | b'-' | b'.'))
    };
    if ids.iter().any(|t| parse_cell(t).is_ok() || !name_like(t)) {
        return None;
    }
    let rest = toks[ids.len()..].join(" ");
    let ids: Vec<String> = ids.into_iter().map(str::to_owned).collect();
    let columns = SmiColumns {
        cpu_affinity: rest.contains("CPU Affinity"),
        numa_affinity: rest.contains("NUMA Affinity"),
        gpu_numa_id: rest.contains("GPU NUMA ID"),
    };
    Some((ids, columns))
}

impl SmiMatrix {
    /// Parses the first matrix in `text` (lines starting with `#` are skipped). Errors: no
    /// header, a row with too few cells or a cell that is not a class, more than
    /// [`input::MAX_MATRIX_DEVICES`] ids.
    pub fn parse(text: &str) -> Result<SmiMatrix, SmiError> {
        let lines: Vec<String> = text.lines().map(strip_ansi).collect();
        let (hdr_no, (ids, columns)) = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.trim_start().starts_with('#'))
            .find_map(|(i, l)| parse_header(l).map(|h| (i, h)))
            .ok_or(SmiError::NoHeader)?;
        if ids.len() > input::MAX_MATRIX_DEVICES {
            return Err(SmiError::TooManyDevices {
                count: ids.len(),
                limit: input::MAX_MATRIX_DEVICES,
            });
        }
        let n = ids.len();
        let known: HashSet<&str> = ids.iter().map(String::as_str).collect();
        if known.len() < n {
            let dup = ids
                .iter()
                .enumerate()
                .find(|(i, id)| ids[..*i].contains(id))
                .map(|(_, id)| id.clone())
                .unwrap_or_default();
            return Err(SmiError::BadRow {
                line: hdr_no + 1,
                message: format!("{dup} appears twice in the header"),
            });
        }
        let mut seen: HashSet<String> = HashSet::new();
        let mut rows = Vec::new();
        let mut nic_legend = Vec::new();
        let mut in_matrix = true;
        let mut in_nic_legend = false;
        for (i, line) in lines.iter().enumerate().skip(hdr_no + 1) {
            let trimmed = line.trim();
            if trimmed.starts_with('#') {
                continue;
            }
            if trimmed.starts_with("NIC Legend") {
                in_nic_legend = true;
                continue;
            }
            if in_nic_legend {
                if let Some((k, v)) = trimmed.split_once(':') {
                    if is_id(k.trim()) {
                        nic_legend.push((k.trim().to_owned(), v.trim().to_owned()));
                    }
                }
                continue;
            }
            // The legend, or a second matrix (`topo -p2p`), ends this one.
            if trimmed.starts_with("Legend") || parse_header(trimmed).is_some() {
                in_matrix = false;
                continue;
            }
            let first = trimmed.split_whitespace().next().unwrap_or("");
            if !in_matrix || !known.contains(first) || seen.contains(first) {
                continue;
            }
            rows.push(parse_row(trimmed, first, n, columns, i + 1)?);
            seen.insert(first.to_owned());
        }
        Ok(SmiMatrix {
            ids,
            rows,
            nic_legend,
            columns,
        })
    }

    /// The matrix gdpath computes for `machine`, in this form: the affinity cells hold the
    /// device's local CPUs, its NUMA node ([`Machine::numa_of`]) and the GPU's memory NUMA node,
    /// `N/A` where unknown — as nvidia-smi prints for GPUs; NIC and NVMe rows leave them blank.
    /// The NIC legend lists the NICs that have an RDMA device or interface name.
    pub fn from_machine(machine: &Machine) -> SmiMatrix {
        let mx = machine.matrix();
        let devs = machine.matrix_devices();
        let rows = devs
            .iter()
            .zip(&mx.cells)
            .map(|(d, cells)| {
                let gpu = d.kind == DeviceKind::Gpu;
                let na = || Some("N/A".to_owned());
                SmiRow {
                    id: d.id.clone(),
                    cells: cells.clone(),
                    cpu_affinity: gpu.then(|| d.cpus.clone().or_else(na)).flatten(),
                    numa_affinity: gpu
                        .then(|| machine.numa_of(d).map(|n| n.to_string()).or_else(na))
                        .flatten(),
                    gpu_numa_id: gpu
                        .then(|| d.gpu_numa_id.map(|n| n.to_string()).or_else(na))
                        .flatten(),
                }
            })
            .collect();
        let nic_legend = machine
            .nics()
            .filter(|d| !d.interface_names().is_empty())
            .map(|d| (d.id.clone(), d.os_name()))
            .collect();
        SmiMatrix {
            ids: mx.ids,
            rows,
            nic_legend,
            columns: SmiColumns::ALL,
        }
    }

    /// The row of `id`.
    pub fn row(&self, id: &str) -> Option<&SmiRow> {
        self.rows.iter().find(|r| r.id == id)
    }

    /// The class of (row, col), when both are present.
    pub fn get(&self, row: &str, col: &str) -> Option<LinkClass> {
        let j = self.ids.iter().position(|x| x == col)?;
        self.row(row)?.cells.get(j).copied()
    }

    /// The matrix in nvidia-smi's own format (tab-separated, the affinity columns of
    /// [`SmiMatrix::columns`], legend and NIC legend after it).
    pub fn to_text(&self) -> String {
        let c = self.columns;
        let mut s = String::new();
        s.push('\t');
        s.push_str(&self.ids.join("\t"));
        for (on, name) in [
            (c.cpu_affinity, "CPU Affinity"),
            (c.numa_affinity, "NUMA Affinity"),
            (c.gpu_numa_id, "GPU NUMA ID"),
        ] {
            if on {
                s.push('\t');
                s.push_str(name);
            }
        }
        s.push('\n');
        for r in &self.rows {
            s.push_str(&r.id);
            for cell in &r.cells {
                s.push('\t');
                if *cell == LinkClass::X {
                    s.push_str(" X ");
                } else {
                    s.push_str(&cell.to_string());
                }
            }
            let cell = |v: &Option<String>| v.clone().unwrap_or_default();
            if c.cpu_affinity {
                s.push_str(&format!("\t{}", cell(&r.cpu_affinity)));
            }
            if c.numa_affinity {
                s.push_str(&format!("\t{}", cell(&r.numa_affinity)));
            }
            if c.gpu_numa_id {
                // nvidia-smi prints two tabs before this cell.
                s.push_str(&format!("\t\t{}", cell(&r.gpu_numa_id)));
            }
            s.push('\n');
        }
        s.push_str("\nLegend:\n\n");
        for line in legend_lines() {
            s.push_str(&line);
            s.push('\n');
        }
        if !self.nic_legend.is_empty() {
            s.push_str("\nNIC Legend:\n\n");
            for (k, v) in &self.nic_legend {
                s.push_str(&format!("  {k}: {v}\n"));
            }
        }
        s
    }

    /// The machine this matrix describes (see the module docs): one device per id with a
    /// synthetic address, the stated classes ([`Machine::stated_pcie`]), NV# as NVLink bonds,
    /// the GPUs' affinities, NIC names from the legend, and the coverage of a matrix.
    pub fn to_machine(&self) -> Machine {
        let legend: HashMap<&str, &str> = self
            .nic_legend
            .iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect();
        let mut notes = Vec::new();
        let addr = |i: usize| PciAddr {
            domain: 0xffff,
            bus: 0xe0 + (i / 256) as u8,
            device: ((i % 256) / 8) as u8,
            function: (i % 8) as u8,
        };
        let mut devices = Vec::new();
        for (i, id) in self.ids.iter().enumerate() {
            let mut d = Device::new(addr(i));
            d.synthetic = true;
            let row = self.row(id);
            if id.starts_with("GPU") {
                d.kind = DeviceKind::Gpu;
                d.vendor = crate::names::vendor::NVIDIA;
                d.name = Some("NVIDIA GPU (model not in nvidia-smi topo -m)".into());
                if let Some(r) = row {
                    d.cpus = r
                        .cpu_affinity
                        .as_deref()
                        .and_then(CpuSet::parse_list)
                        .filter(|s| !s.is_empty())
                        .map(|s| s.to_list());
                    d.numa = r.numa_affinity.as_deref().and_then(|v| v.parse().ok());
                    d.gpu_numa_id = r.gpu_numa_id.as_deref().and_then(|v| v.parse().ok());
                }
            } else if id.starts_with("NVME") || id.starts_with("NVMe") {
                d.kind = DeviceKind::Nvme;
                d.name = Some("NVMe (nvidia-smi topo -m)".into());
            } else {
                d.kind = DeviceKind::Nic;
                // Current versions name NICs in the NIC Legend, older ones in the header;
                // nvidia-smi lists NICs by their RDMA device.
                let name = legend
                    .get(id.as_str())
                    .copied()
                    .or((!is_id(id)).then_some(id.as_str()));
                if let Some(name) = name {
                    d.rdma.push(name.to_owned());
                }
                d.name = Some(match name {
                    Some(n) => format!("NIC {n} (nvidia-smi topo -m)"),
                    None => "NIC (no name in the text)".into(),
                });
            }
            devices.push(d);
        }
        let n = self.ids.len();
        let mut bonds = Vec::new();
        let index: HashMap<&str, usize> = self
            .ids
            .iter()
            .enumerate()
            .map(|(i, id)| (id.as_str(), i))
            .collect();
        // The row of each device, by index: a pair is stated by the rows of both its devices,
        // and the row that comes first in the text wins.
        let mut row_of: Vec<Option<usize>> = vec![None; n];
        for (k, r) in self.rows.iter().enumerate() {
            if let Some(&i) = index.get(r.id.as_str()) {
                row_of[i] = Some(k);
            }
        }
        let pcie = |cell: LinkClass| match cell {
            LinkClass::Nv(_) => LinkClass::Unknown,
            c => c,
        };
        for r in &self.rows {
            let Some(&i) = index.get(r.id.as_str()) else {
                continue;
            };
            for (j, &cell) in r.cells.iter().enumerate() {
                if let (LinkClass::Nv(links), false) = (cell, i == j) {
                    bonds.push((addr(i), addr(j), links));
                }
            }
        }
        // Addresses grow with the index, so pairs (i < j) come in key order: the map is built
        // from a sorted list, not by a search per cell.
        let mut stated: Vec<((PciAddr, PciAddr), LinkClass)> = Vec::new();
        let mut disagree: Vec<((usize, usize), String)> = Vec::new();
        for i in 0..n {
            for j in i + 1..n {
                let says = |from: usize, to: usize| {
                    let k = row_of[from]?;
                    Some((k, self.rows[k].cells.get(to).copied()?))
                };
                // (what it says, the row's device, the column's device)
                let (first, second) = match (says(i, j), says(j, i)) {
                    (Some(a), Some(b)) if a.0 <= b.0 => (a, Some((b, j, i))),
                    (Some(a), Some(b)) => (b, Some((a, i, j))),
                    (Some(a), None) | (None, Some(a)) => (a, None),
                    (None, None) => continue,
                };
                stated.push((pair_key(addr(i), addr(j)), pcie(first.1)));
                // The second row states it again: a note where the two differ, in the order
                // of the text (its row, then its column).
                if let Some(((k, cell), row, col)) = second {
                    if pcie(cell) != pcie(first.1) {
                        disagree.push((
                            (k, col),
                            format!(
                                "{} and {} disagree on their pair ({} vs {}); the first is kept",
                                self.ids[col],
                                self.ids[row],
                                pcie(first.1),
                                cell
                            ),
                        ));
                    }
                }
            }
        }
        disagree.sort_by_key(|(at, _)| *at);
        notes.extend(disagree.into_iter().map(|(_, n)| n));
        let stated: BTreeMap<(PciAddr, PciAddr), LinkClass> = stated.into_iter().collect();
        let mut m = Machine::assemble(
            devices,
            Vec::new(),
            IommuState::default(),
            false,
            "smi-topo",
        );
        // Keep the ids as printed (GPU ids as nvidia-smi numbers them); names of old versions
        // become NIC ids, as current versions print them — unless that would give two devices
        // one id (a header mixing both forms), where the ids stay gdpath's own.
        let printed: Vec<String> = m
            .devices
            .iter()
            .zip(&self.ids)
            .map(|(d, id)| if is_id(id) { id.clone() } else { d.id.clone() })
            .collect();
        if printed.iter().collect::<HashSet<_>>().len() == printed.len() {
            for (d, id) in m.devices.iter_mut().zip(printed) {
                d.id = id;
            }
        } else {
            notes.push("the header mixes NIC names and NIC ids: devices are renumbered".into());
        }
        m.set_nvlinks(bonds);
        m.stated_pcie = Some(stated);
        m.coverage = self.coverage();
        m.notes = notes;
        m
    }

    fn coverage(&self) -> Coverage {
        let no = |what: &str| {
            Facet::unknown(format!(
                "nvidia-smi topo -m states the pair classes, not {what}"
            ))
        };
        let nic_ids: Vec<&String> = self
            .ids
            .iter()
            .filter(|id| !id.starts_with("GPU") && !id.starts_with("NVME"))
            .collect();
        let named = nic_ids
            .iter()
            .filter(|id| !is_id(id) || self.nic_legend.iter().any(|(k, _)| k == **id))
            .count();
        let nics = nic_ids.len();
        Coverage {
            pci_tree: no("the PCI tree (the classes stand in for it)"),
            numa: if self.columns.numa_affinity {
                Facet::described("the GPUs' NUMA Affinity column")
            } else {
                Facet::unknown("this nvidia-smi version prints no NUMA Affinity column")
            },
            nvlink: Facet::described("the matrix (NV# cells)"),
            link_state: no("PCIe link speed and width"),
            acs: no("ACS"),
            iommu: no("the IOMMU"),
            rdma: crate::coverage::by_count(
                named,
                nics,
                "the NIC columns and NIC Legend (nvidia-smi lists NICs by their RDMA device)",
                "NICs",
                "the NIC Legend is missing (cut short, or not copied)",
                "are not in the NIC Legend (cut short)",
            ),
            drivers: no("kernel drivers or modules"),
        }
    }
}

/// Reads `nvidia-smi topo -m` text as a machine ([`SmiMatrix::to_machine`]), at most
/// [`input::MAX_TOPOLOGY_FILE_BYTES`]. Errors: [`TopoError::Smi`] for text that is not such a
/// matrix, and the errors of a bounded read.
pub fn read_file(path: &Path) -> Result<Machine, TopoError> {
    let text = input::read_topology_text(path)?;
    let m = SmiMatrix::parse(&text).map_err(|source| TopoError::Smi {
        path: path.to_owned(),
        source,
    })?;
    Ok(m.to_machine())
}

/// The legend lines exactly as nvidia-smi prints them (`  SYS  = Connection traversing …`).
pub fn legend_lines() -> Vec<String> {
    LinkClass::LEGEND
        .iter()
        .map(|(code, meaning)| format!("  {code:<4} = {meaning}"))
        .collect()
}

fn parse_row(
    line: &str,
    id: &str,
    n: usize,
    columns: SmiColumns,
    line_no: usize,
) -> Result<SmiRow, SmiError> {
    let rest = &line[id.len()..];
    // With tabs, blank cells survive; with spaces, they cannot be told apart.
    let tabs = rest.contains('\t');
    let cells: Vec<&str> = if tabs {
        rest.trim_start_matches([' '])
            .trim_start_matches('\t')
            .split('\t')
            .map(str::trim)
            .collect()
    } else {
        rest.split_whitespace().collect()
    };
    if cells.len() < n {
        return Err(SmiError::BadRow {
            line: line_no,
            message: format!("{id} has {} cells for {n} columns", cells.len()),
        });
    }
    let classes = cells[..n]
        .iter()
        .map(|c| {
            parse_cell(c).map_err(|message| SmiError::BadRow {
                line: line_no,
                message,
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tail: Vec<&str> = cells[n..].to_vec();
    let nonblank = |s: Option<&&str>| s.filter(|v| !v.is_empty()).map(|v| v.to_string());
    let (mut cpu, mut numa, mut gpu_numa) = (None, None, None);
    if tabs {
        // Tab-separated: cells by position; nvidia-smi puts an empty cell before GPU NUMA ID,
        // so that column is the last non-blank cell after NUMA Affinity.
        let mut k = 0;
        if columns.cpu_affinity {
            cpu = nonblank(tail.get(k));
            k += 1;
        }
        if columns.numa_affinity {
            numa = nonblank(tail.get(k));
            k += 1;
        }
        if columns.gpu_numa_id {
            gpu_numa = tail
                .iter()
                .skip(k)
                .rev()
                .find(|v| !v.is_empty())
                .map(|v| v.to_string());
        }
    } else {
        // Space-separated: the cells left to right into the columns the header has.
        let mut it = tail.iter();
        for (on, slot) in [
            (columns.cpu_affinity, &mut cpu),
            (columns.numa_affinity, &mut numa),
            (columns.gpu_numa_id, &mut gpu_numa),
        ] {
            if on {
                *slot = nonblank(it.next());
            }
        }
    }
    Ok(SmiRow {
        id: id.to_owned(),
        cells: classes,
        cpu_affinity: cpu,
        numa_affinity: numa,
        gpu_numa_id: gpu_numa,
    })
}
