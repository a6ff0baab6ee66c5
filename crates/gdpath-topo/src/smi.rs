//! The text of `nvidia-smi topo -m`: a parser (to compare gdpath with nvidia-smi on the same
//! machine, and to test against matrices posted from real machines) and a writer of the same
//! format.
//!
//! The format: a header row of column ids (`GPU0 … NIC0 …`) followed by `CPU Affinity`,
//! `NUMA Affinity` and `GPU NUMA ID`; one row per id with the class codes and, for GPUs, the
//! three affinity cells; then `Legend:` and, when there are NICs, `NIC Legend:` mapping `NIC0`
//! to the RDMA device name. nvidia-smi separates cells with tabs (and underlines the header with
//! ANSI codes on a terminal); copies posted on the web often have spaces instead. The parser
//! accepts both; a blank cell is kept as `None` when the row uses tabs.

use crate::class::LinkClass;
use crate::machine::Machine;

/// One `nvidia-smi topo -m` matrix.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SmiMatrix {
    /// Column and row ids, in header order.
    pub ids: Vec<String>,
    /// One row per id that has a row in the text (a cut-short copy may have fewer rows).
    pub rows: Vec<SmiRow>,
    /// `NIC Legend` entries: (`NIC0`, `mlx5_0`).
    pub nic_legend: Vec<(String, String)>,
}

/// One row of the matrix.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SmiRow {
    pub id: String,
    /// One class per column id.
    pub cells: Vec<LinkClass>,
    /// `CPU Affinity` (`0-31`), `NUMA Affinity` (`0`) and `GPU NUMA ID` (`N/A`) as printed;
    /// `None` where the cell is blank.
    pub cpu_affinity: Option<String>,
    pub numa_affinity: Option<String>,
    pub gpu_numa_id: Option<String>,
}

/// Why a text is not an `nvidia-smi topo -m` matrix.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum SmiError {
    #[error("no header row with GPU0 found")]
    NoHeader,
    #[error("line {line}: {message}")]
    BadRow { line: usize, message: String },
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

fn is_id(tok: &str) -> bool {
    ["GPU", "NIC", "NVME", "NVMe"].iter().any(|p| {
        tok.strip_prefix(p)
            .is_some_and(|n| !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()))
    })
}

impl SmiMatrix {
    /// Parses the first matrix in `text` (lines starting with `#` are skipped).
    pub fn parse(text: &str) -> Result<SmiMatrix, SmiError> {
        let lines: Vec<String> = text.lines().map(strip_ansi).collect();
        let (hdr_no, ids) = lines
            .iter()
            .enumerate()
            .filter(|(_, l)| !l.trim_start().starts_with('#'))
            .find_map(|(i, l)| {
                let toks: Vec<&str> = l.split_whitespace().collect();
                (toks.first() == Some(&"GPU0")).then(|| {
                    let ids: Vec<String> = toks
                        .iter()
                        .take_while(|t| is_id(t))
                        .map(|t| t.to_string())
                        .collect();
                    (i, ids)
                })
            })
            .ok_or(SmiError::NoHeader)?;
        let n = ids.len();
        let mut m = SmiMatrix {
            ids,
            ..Default::default()
        };
        let mut in_nic_legend = false;
        for (i, line) in lines.iter().enumerate().skip(hdr_no + 1) {
            let trimmed = line.trim();
            if trimmed.starts_with("NIC Legend") {
                in_nic_legend = true;
                continue;
            }
            if in_nic_legend {
                if let Some((k, v)) = trimmed.split_once(':') {
                    if is_id(k.trim()) {
                        m.nic_legend
                            .push((k.trim().to_owned(), v.trim().to_owned()));
                    }
                }
                continue;
            }
            // A row is a line starting with a column id not seen yet; later matrices in the
            // same text (`topo -p2p`) repeat the ids and are skipped.
            let first = trimmed.split_whitespace().next().unwrap_or("");
            if !m.ids.iter().any(|id| id == first) || m.rows.iter().any(|r| r.id == first) {
                continue;
            }
            m.rows.push(parse_row(trimmed, first, n, i + 1)?);
        }
        Ok(m)
    }

    /// The matrix gdpath computes for `machine`, in this form: the affinity cells hold the
    /// device's local CPUs, its NUMA node ([`Machine::numa_of`]) and the GPU's memory NUMA node,
    /// `N/A` where unknown — as nvidia-smi prints for GPUs; NIC and NVMe rows leave them blank.
    pub fn from_machine(machine: &Machine) -> SmiMatrix {
        let mx = machine.matrix();
        let devs = machine.matrix_devices();
        let rows = devs
            .iter()
            .zip(&mx.cells)
            .map(|(d, cells)| {
                let gpu = d.kind == crate::DeviceKind::Gpu;
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
            .map(|d| (d.id.clone(), d.os_name()))
            .collect();
        SmiMatrix {
            ids: mx.ids,
            rows,
            nic_legend,
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

    /// The matrix in nvidia-smi's own format (tab-separated, legend and NIC legend after it).
    pub fn to_text(&self) -> String {
        let mut s = String::new();
        s.push('\t');
        for id in &self.ids {
            s.push_str(id);
            s.push('\t');
        }
        s.push_str("CPU Affinity\tNUMA Affinity\tGPU NUMA ID\n");
        for r in &self.rows {
            s.push_str(&r.id);
            for c in &r.cells {
                s.push('\t');
                if *c == LinkClass::X {
                    s.push_str(" X ");
                } else {
                    s.push_str(&c.to_string());
                }
            }
            let cell = |v: &Option<String>| v.clone().unwrap_or_default();
            s.push_str(&format!(
                "\t{}\t{}\t\t{}\n",
                cell(&r.cpu_affinity),
                cell(&r.numa_affinity),
                cell(&r.gpu_numa_id)
            ));
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
}

/// The legend lines exactly as nvidia-smi prints them (`  SYS  = Connection traversing …`).
pub fn legend_lines() -> Vec<String> {
    LinkClass::LEGEND
        .iter()
        .map(|(code, meaning)| format!("  {code:<4} = {meaning}"))
        .collect()
}

fn parse_row(line: &str, id: &str, n: usize, line_no: usize) -> Result<SmiRow, SmiError> {
    let rest = line[id.len()..].to_owned();
    // With tabs, blank cells survive; with spaces, they cannot be told apart.
    let cells: Vec<String> = if rest.contains('\t') {
        rest.trim_start_matches([' '])
            .trim_start_matches('\t')
            .split('\t')
            .map(|c| c.trim().to_owned())
            .collect()
    } else {
        rest.split_whitespace().map(str::to_owned).collect()
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
            c.parse::<LinkClass>().map_err(|e| SmiError::BadRow {
                line: line_no,
                message: e.to_string(),
            })
        })
        .collect::<Result<Vec<_>, _>>()?;
    let tail: Vec<&String> = cells[n..].iter().collect();
    let nonblank = |s: Option<&&String>| s.filter(|v| !v.is_empty()).map(|v| v.to_string());
    let last = tail
        .iter()
        .rev()
        .find(|v| !v.is_empty())
        .map(|v| v.to_string());
    let cpu = nonblank(tail.first());
    let numa = nonblank(tail.get(1));
    // GPU NUMA ID is the last non-blank cell after the NUMA Affinity cell.
    let gpu_numa = if tail.len() > 2 { last } else { None };
    Ok(SmiRow {
        id: id.to_owned(),
        cells: classes,
        cpu_affinity: cpu,
        numa_affinity: numa,
        gpu_numa_id: gpu_numa,
    })
}
