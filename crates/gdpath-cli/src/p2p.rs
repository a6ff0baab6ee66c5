//! `gdpath p2p`: the P2P capability matrices of every GPU pair, in the format of
//! `nvidia-smi topo -p2p r|w|n|a|p` (codes and legend from its output), plus CUDA's
//! `cuDeviceCanAccessPeer` and the path gdpath takes for each pair. `--json` for scripts
//! (schema `gdpath.p2p/1`).

use anyhow::{bail, Context, Result};
use clap::Args;
use gdpath::backend::cuda::gpu_pair_path;
use gdpath::topo::facts::{DriverFacts, FactsIndex, NvmlP2pStatus, P2pCap};
use gdpath::topo::text::escape;
use gdpath::topo::Source;
use gdpath::DataPath;
use serde::Serialize;
use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
pub struct P2pArgs {
    /// Replay the driver facts stored in a snapshot (`gdpath topo capture`).
    #[arg(long, value_name = "FILE", conflicts_with = "facts")]
    snapshot: Option<PathBuf>,
    /// Read driver facts from a JSON file (the `driver.json` of a snapshot).
    #[arg(long, value_name = "FILE")]
    facts: Option<PathBuf>,
    /// Print JSON (schema gdpath.p2p/1) instead of text.
    #[arg(long)]
    pub(crate) json: bool,
}

/// The five capabilities of `nvidia-smi topo -p2p`, with the letter it takes and our name.
pub const CAPS: [(char, &str, &str); 5] = [
    ('r', "read", "P2P read"),
    ('w', "write", "P2P write"),
    ('n', "nvlink", "NVLink"),
    ('a', "atomics", "P2P atomics"),
    ('p', "pci", "PCIe P2P"),
];

/// The legend `nvidia-smi topo -p2p` prints (R580), line for line.
pub fn legend_lines() -> [&'static str; 7] {
    [
        "  X    = Self",
        "  OK   = Status Ok",
        "  CNS  = Chipset not supported",
        "  GNS  = GPU not supported",
        "  TNS  = Topology not supported",
        "  NS   = Not supported",
        "  U    = Unknown",
    ]
}

fn cap_of(s: &NvmlP2pStatus, letter: char) -> P2pCap {
    match letter {
        'r' => s.read,
        'w' => s.write,
        'n' => s.nvlink,
        'a' => s.atomics,
        _ => s.pci,
    }
}

/// Where the driver facts came from: `live` (NVML and CUDA now), `snapshot` (the facts a
/// `topo capture` stored) or `facts` (a `driver.json`), as `topo` and `doctor` name their
/// source.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct FactsSource {
    /// `live`, `snapshot` or `facts`.
    pub kind: &'static str,
    /// The file read; `None` for the live machine.
    pub path: Option<PathBuf>,
    /// For a snapshot, the source it was captured from (`live` or `sysfs-root`).
    pub captured_from: Option<String>,
}

impl FactsSource {
    /// The live machine's driver.
    pub fn live() -> FactsSource {
        FactsSource {
            kind: "live",
            path: None,
            captured_from: None,
        }
    }

    /// The header's words: `live driver (NVML, CUDA)`, `snapshot FILE (its driver facts)`,
    /// `driver facts FILE`, the file name escaped.
    pub fn describe(&self) -> String {
        let path = self.path.as_ref().map(escape).unwrap_or_default();
        match self.kind {
            "snapshot" => format!("snapshot {path} (its driver facts)"),
            "facts" => format!("driver facts {path}"),
            _ => "live driver (NVML, CUDA)".to_owned(),
        }
    }
}

/// The P2P view of a machine's driver facts.
#[derive(Debug, Clone, Serialize)]
pub struct P2pView {
    pub schema: &'static str,
    /// Where the facts came from ([`FactsSource::kind`]): the replayed source, never the
    /// machine the command runs on.
    pub source: &'static str,
    /// For a snapshot, the source it was captured from; absent otherwise.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub captured_from: Option<String>,
    /// GPU ordinals, in order.
    pub gpus: Vec<u32>,
    /// Capability name → matrix of codes (`X` on the diagonal), rows = source GPU. Absent past
    /// [`MAX_LISTED_GPUS`], where `pair_counts` counts the codes instead.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub capabilities: Option<Vec<(String, Vec<Vec<String>>)>>,
    /// `cuDeviceCanAccessPeer` per ordered pair (`X`, `yes`, `no`, `?`); absent past the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub cuda_access: Option<Vec<Vec<String>>>,
    /// The path gdpath's planner takes per ordered pair
    /// ([`gdpath::backend::cuda::gpu_pair_path`]): `p2p-nvlink (NV#)`, `p2p-pcie`, `staged`, `?`
    /// without CUDA's answers; absent past the limit.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub paths: Option<Vec<Vec<String>>>,
    /// Past [`MAX_LISTED_GPUS`]: the ordered pairs counted per code, in place of the matrices.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub pair_counts: Option<PairCodeCounts>,
    /// Why some facts are missing.
    pub gaps: Vec<String>,
}

/// Most GPUs whose ordered pairs `gdpath p2p` prints as matrices: the topology's limit for
/// listing pairs ([`gdpath::topo::input::MAX_LISTED_PAIR_DEVICES`], 256; the largest
/// single-node machines have 8 to 16 GPUs). Past it the seven matrices (of the square of the
/// GPUs) are replaced by the pairs counted per code.
pub const MAX_LISTED_GPUS: usize = gdpath::topo::input::MAX_LISTED_PAIR_DEVICES;

/// The matrices of `gdpath p2p` in counts: ordered pairs per code, for driver facts of more
/// GPUs than [`MAX_LISTED_GPUS`].
#[derive(Debug, Clone, Serialize)]
pub struct PairCodeCounts {
    /// Why the pairs are counted rather than listed.
    pub reason: String,
    /// [`MAX_LISTED_GPUS`].
    pub limit: usize,
    /// Ordered pairs of distinct GPUs: GPUs × (GPUs − 1).
    pub ordered_pairs: u64,
    /// Capability name → code → pairs.
    pub capabilities: Vec<(String, BTreeMap<String, u64>)>,
    /// `cuDeviceCanAccessPeer` answer (`yes`, `no`, `?`) → pairs.
    pub cuda_access: BTreeMap<String, u64>,
    /// gdpath's path → pairs.
    pub paths: BTreeMap<String, u64>,
}

/// The path gdpath takes from `a` to `b`, as the view prints it.
fn path_text(ix: &FactsIndex, a: u32, b: u32) -> String {
    match gpu_pair_path([ix.access(a, b), ix.access(b, a)], || ix.nvlink_count(a, b)) {
        Some(DataPath::P2pNvlink) => format!("p2p-nvlink (NV{})", ix.nvlink_count(a, b)),
        Some(path) => path.name(),
        None => "?".to_owned(),
    }
}

fn access_text(ix: &FactsIndex, a: u32, b: u32) -> &'static str {
    match ix.access(a, b) {
        Some(true) => "yes",
        Some(false) => "no",
        None => "?",
    }
}

fn code(ix: &FactsIndex, a: u32, b: u32, letter: char) -> &'static str {
    ix.pair(a, b)
        .and_then(|p| p.nvml)
        .map_or(P2pCap::U, |s| cap_of(&s, letter))
        .code()
}

impl P2pView {
    /// Builds the view from driver facts (live or recorded) read from `source`: matrices for
    /// at most [`MAX_LISTED_GPUS`] GPUs, counts past it. O(GPUs²) up to the limit, O(GPUs +
    /// pairs in the facts) past it.
    pub fn from_facts(f: &DriverFacts, source: &FactsSource) -> P2pView {
        let gpus: Vec<u32> = f.gpus.iter().map(|g| g.ordinal).collect();
        let ix = FactsIndex::new(f);
        let mut view = P2pView {
            schema: "gdpath.p2p/1",
            source: source.kind,
            captured_from: source.captured_from.clone(),
            gpus,
            capabilities: None,
            cuda_access: None,
            paths: None,
            pair_counts: None,
            gaps: f
                .gaps
                .iter()
                .map(|g| format!("{}: {}", g.what, g.reason))
                .collect(),
        };
        if view.gpus.len() > MAX_LISTED_GPUS {
            view.pair_counts = Some(counts(&view.gpus, &ix));
            return view;
        }
        let grid = |cell: &dyn Fn(u32, u32) -> String| -> Vec<Vec<String>> {
            view.gpus
                .iter()
                .map(|&a| {
                    view.gpus
                        .iter()
                        .map(|&b| if a == b { "X".to_owned() } else { cell(a, b) })
                        .collect()
                })
                .collect()
        };
        let capabilities = CAPS
            .iter()
            .map(|&(letter, name, _)| {
                let m = grid(&|a, b| code(&ix, a, b, letter).to_owned());
                (name.to_owned(), m)
            })
            .collect();
        let cuda_access = grid(&|a, b| access_text(&ix, a, b).to_owned());
        let paths = grid(&|a, b| path_text(&ix, a, b));
        view.capabilities = Some(capabilities);
        view.cuda_access = Some(cuda_access);
        view.paths = Some(paths);
        view
    }

    /// One capability as `nvidia-smi topo -p2p <letter>` prints it (tabs, a leading space);
    /// `None` for another letter, or past [`MAX_LISTED_GPUS`] (no matrices).
    pub fn smi_text(&self, letter: char) -> Option<String> {
        let idx = CAPS.iter().position(|c| c.0 == letter)?;
        let m = &self.capabilities.as_ref()?[idx].1;
        let mut o = String::from(" \t");
        for g in &self.gpus {
            let _ = write!(o, "GPU{g}\t");
        }
        o.push('\n');
        for (i, g) in self.gpus.iter().enumerate() {
            let _ = write!(o, " GPU{g}\t");
            for c in &m[i] {
                let _ = write!(o, "{c}\t");
            }
            o.push('\n');
        }
        Some(o)
    }

    fn grid_text(&self, title: &str, m: &[Vec<String>]) -> String {
        let mut rows = vec![{
            let mut h = vec![String::new()];
            h.extend(self.gpus.iter().map(|g| format!("GPU{g}")));
            h
        }];
        for (i, g) in self.gpus.iter().enumerate() {
            let mut r = vec![format!("GPU{g}")];
            r.extend(m[i].iter().cloned());
            rows.push(r);
        }
        let w: Vec<usize> = (0..rows[0].len())
            .map(|c| rows.iter().map(|r| r[c].len()).max().unwrap_or(0))
            .collect();
        let mut o = format!("{title}\n");
        for r in rows {
            let line: Vec<String> = r
                .iter()
                .enumerate()
                .map(|(i, c)| format!("{c:<w$}", w = w[i]))
                .collect();
            let _ = writeln!(o, "  {}", line.join("  ").trim_end());
        }
        o
    }

    /// The human output: five matrices, the legend, CUDA access and gdpath's paths; past
    /// [`MAX_LISTED_GPUS`], the pairs counted per code.
    pub fn render(&self) -> String {
        let mut o = String::new();
        let (Some(cuda_access), Some(paths)) = (&self.cuda_access, &self.paths) else {
            if let Some(c) = &self.pair_counts {
                o.push_str(&c.render());
            }
            for g in &self.gaps {
                let _ = writeln!(o, "\nunknown: {g}");
            }
            return o;
        };
        for (letter, _, title) in CAPS {
            let _ = writeln!(o, "{title} (nvidia-smi topo -p2p {letter}):");
            o.push_str(&self.smi_text(letter).unwrap_or_default());
            o.push('\n');
        }
        let _ = writeln!(o, "Legend:\n");
        for l in legend_lines() {
            let _ = writeln!(o, "{l}");
        }
        o.push('\n');
        o.push_str(&self.grid_text("CUDA peer access (cuDeviceCanAccessPeer):", cuda_access));
        o.push('\n');
        o.push_str(&self.grid_text("gdpath path per pair (row = source):", paths));
        for g in &self.gaps {
            let _ = writeln!(o, "\nunknown: {}", escape(g));
        }
        o
    }
}

impl PairCodeCounts {
    /// The counts as text: a line of codes per capability, CUDA access and path.
    pub fn render(&self) -> String {
        let line = |m: &BTreeMap<String, u64>| -> String {
            let parts: Vec<String> = m.iter().map(|(k, n)| format!("{k} {n}")).collect();
            parts.join(", ")
        };
        let mut o = format!(
            "Ordered pairs per code, not matrices ({}; {} ordered pairs; `pair_counts` in \
             --json):\n\n",
            self.reason, self.ordered_pairs
        );
        let mut rows: Vec<(String, String)> = CAPS
            .iter()
            .zip(&self.capabilities)
            .map(|((letter, _, title), (_, m))| (format!("{title} (-p2p {letter}):"), line(m)))
            .collect();
        rows.push(("CUDA peer access:".to_owned(), line(&self.cuda_access)));
        rows.push(("gdpath path:".to_owned(), line(&self.paths)));
        let w = rows
            .iter()
            .map(|(t, _)| t.chars().count())
            .max()
            .unwrap_or(0);
        for (t, v) in rows {
            let _ = writeln!(o, "  {t:<w$}  {v}");
        }
        let _ = writeln!(o, "\nLegend:\n");
        for l in legend_lines() {
            let _ = writeln!(o, "{l}");
        }
        o
    }
}

/// The ordered pairs of the distinct ordinals of `gpus` counted per code: the pairs the facts
/// describe one by one, and every other pair at once (no NVML status: `U`; no CUDA answer: `?`),
/// so the work is O(GPUs + described pairs), not O(GPUs²).
fn counts(gpus: &[u32], ix: &FactsIndex) -> PairCodeCounts {
    let distinct: BTreeSet<u32> = gpus.iter().copied().collect();
    let n = distinct.len() as u64;
    let ordered_pairs = n * n.saturating_sub(1);
    let described: Vec<(u32, u32)> = ix
        .pairs()
        .map(|p| (p.a, p.b))
        .filter(|(a, b)| a != b && distinct.contains(a) && distinct.contains(b))
        .collect();
    let rest = ordered_pairs - described.len() as u64;
    let tally = |cell: &dyn Fn(u32, u32) -> String, default: &str| -> BTreeMap<String, u64> {
        let mut m: BTreeMap<String, u64> = BTreeMap::new();
        for &(a, b) in &described {
            *m.entry(cell(a, b)).or_insert(0) += 1;
        }
        if rest > 0 {
            *m.entry(default.to_owned()).or_insert(0) += rest;
        }
        m
    };
    // A path needs CUDA's answer both ways: a pair described one way only reads `?`.
    let capabilities = CAPS
        .iter()
        .map(|&(letter, name, _)| {
            let m = tally(&|a, b| code(ix, a, b, letter).to_owned(), P2pCap::U.code());
            (name.to_owned(), m)
        })
        .collect();
    PairCodeCounts {
        reason: format!(
            "{n} GPUs, more than the {MAX_LISTED_GPUS} whose pairs are listed one by one"
        ),
        limit: MAX_LISTED_GPUS,
        ordered_pairs,
        capabilities,
        cuda_access: tally(&|a, b| access_text(ix, a, b).to_owned(), "?"),
        paths: tally(&|a, b| path_text(ix, a, b), "?"),
    }
}

/// Largest `--facts` file read: 64 MiB. The two-H200 machine's facts are 5.5 KB, most of it its
/// two ordered pairs: this holds the facts of some 200 GPUs.
const MAX_FACTS_BYTES: u64 = 64 << 20;

fn read_facts(a: &P2pArgs) -> Result<(DriverFacts, FactsSource)> {
    if let Some(p) = &a.facts {
        let text = gdpath::file::read_bounded(p, MAX_FACTS_BYTES)
            .with_context(|| format!("reading {}", escape(&p)))?;
        let facts = serde_json::from_slice(&text)
            .with_context(|| format!("{} is not driver facts JSON", escape(&p)))?;
        let source = FactsSource {
            kind: "facts",
            path: Some(p.clone()),
            captured_from: None,
        };
        return Ok((facts, source));
    }
    if let Some(p) = &a.snapshot {
        let m = gdpath_doctor::machine::load(&Source::Snapshot(p.clone()))?;
        let source = FactsSource {
            kind: "snapshot",
            path: Some(p.clone()),
            captured_from: m.captured_from.clone(),
        };
        return match m.driver {
            Some(d) => Ok((d, source)),
            None => bail!(
                "snapshot {} has no driver facts (captured without a driver); P2P status unknown",
                escape(&p)
            ),
        };
    }
    let facts = gdpath_doctor::machine::live_driver_facts().context("P2P facts unavailable")?;
    Ok((facts, FactsSource::live()))
}

/// Runs `gdpath p2p`.
pub fn run(a: P2pArgs) -> Result<ExitCode> {
    let (f, source) = read_facts(&a)?;
    let view = P2pView::from_facts(&f, &source);
    if a.json {
        outln!("{}", serde_json::to_string_pretty(&view)?);
    } else if view.gpus.is_empty() {
        outln!(
            "gdpath p2p: {}: no GPU in the driver facts",
            source.describe()
        );
    } else {
        outln!("gdpath p2p: {}\n", source.describe());
        out!("{}", view.render());
    }
    Ok(ExitCode::SUCCESS)
}

#[cfg(test)]
mod tests {
    use super::*;
    use gdpath::topo::facts::CudaP2pAttrs;
    use gdpath_testkit::fixtures;

    /// The `nvidia-smi topo -p2p <letter>` matrices printed in a fixture, by letter.
    fn printed(text: &str) -> Vec<(char, Vec<Vec<String>>)> {
        let mut out = Vec::new();
        let mut lines = text.lines().peekable();
        while let Some(l) = lines.next() {
            let Some(letter) = l.strip_prefix("+ nvidia-smi topo -p2p ") else {
                continue;
            };
            let letter = letter.trim().chars().next().unwrap();
            lines.next(); // header
            let mut m = Vec::new();
            while let Some(r) = lines.peek() {
                let cells: Vec<String> = r.split('\t').map(|c| c.trim().to_owned()).collect();
                if !cells[0].starts_with("GPU") {
                    break;
                }
                m.push(
                    cells[1..]
                        .iter()
                        .filter(|c| !c.is_empty())
                        .cloned()
                        .collect(),
                );
                lines.next();
            }
            out.push((letter, m));
        }
        out
    }

    /// The H200 machine's driver facts (`gdpath_testkit::H200_DRIVER_FACTS_JSON`): NV18
    /// through 18 links, NVML read/write/NVLink/atomics OK and PCIe NS, CUDA access both ways.
    fn h200() -> DriverFacts {
        serde_json::from_str(gdpath_testkit::H200_DRIVER_FACTS_JSON).unwrap()
    }

    #[test]
    fn h200_matrices_match_the_probe_for_all_five_capabilities() {
        let path = fixtures().join("device/h200x2-probe-2026-11-30.txt");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("fixture {} missing: {e}", path.display()));
        let want = printed(&text);
        assert_eq!(want.len(), 5, "the probe prints r w n a p");
        let view = P2pView::from_facts(&h200(), &FactsSource::live());
        for (letter, m) in want {
            let ours = printed(&format!(
                "+ nvidia-smi topo -p2p {letter}\n{}",
                view.smi_text(letter).unwrap()
            ));
            assert_eq!(ours[0].1, m, "capability {letter}");
        }
        assert_eq!(view.paths.as_ref().unwrap()[0][1], "p2p-nvlink (NV18)");
        assert_eq!(view.cuda_access.as_ref().unwrap()[1][0], "yes");
        let text = view.render();
        for l in legend_lines() {
            assert!(text.contains(l), "legend line {l:?} missing");
        }
    }

    #[test]
    fn gns_pair_without_access_is_staged_and_missing_facts_are_u() {
        // The 2× RTX 5090 fixture prints GNS for read/write; CUDA refuses access.
        let path = fixtures().join("nvidia-smi/topo-club3090-1229-2x5090-phb-gns.txt");
        let text = std::fs::read_to_string(&path)
            .unwrap_or_else(|e| panic!("fixture {} missing: {e}", path.display()));
        assert!(text.contains(" GPU0\tX\tGNS\t"), "fixture changed");
        let mut f = h200();
        for g in &mut f.gpus {
            g.nvlinks.clear();
        }
        for p in &mut f.pairs {
            p.nvml = Some(NvmlP2pStatus {
                read: P2pCap::Gns,
                write: P2pCap::Gns,
                nvlink: P2pCap::Ns,
                atomics: P2pCap::Gns,
                pci: P2pCap::Gns,
            });
            p.cuda = Some(CudaP2pAttrs::default());
        }
        let view = P2pView::from_facts(&f, &FactsSource::live());
        let r = view.smi_text('r').unwrap();
        assert!(r.contains(" GPU0\tX\tGNS\t"), "{r}");
        assert_eq!(view.paths.as_ref().unwrap()[0][1], "staged");
        f.pairs.clear();
        let view = P2pView::from_facts(&f, &FactsSource::live());
        assert!(view.smi_text('p').unwrap().contains(" GPU1\tU\tX\t"));
        assert_eq!(view.paths.as_ref().unwrap()[1][0], "?");
        assert!(view.smi_text('z').is_none());
    }
}
