//! Bench result documents (`gdpath bench … --json`, schema `gdpath.bench/1`): reading them as
//! untrusted input, and which of their figures belong to which drawn path.
//!
//! Attribution: `bench p2p` rows name their GPUs (`GPU0` → `GPU1`, CUDA ordinals, mapped to
//! gdpath's ids by PCI address through the machine's driver facts; without facts, CUDA's
//! ordinals are taken to be PCI order, as `CUDA_DEVICE_ORDER=PCI_BUS_ID` makes them); a cell
//! of the P2P matrix shows the direct path's median at the largest size measured (the staged
//! path's when P2P did not run). `bench storage --gpu N` rows (file → `gpu:N`) go on GPU N's
//! GDS path, and `bench net` rows with local GPU memory over an RDMA transport on its GDR path.
//! Everything else (host ↔ file, host ↔ GPU) is charted only.

use crate::matrix::PairRates;
use crate::routing::RouteLabels;
use gdpath::finding::Area;
use gdpath_bench::{BenchRow, BENCH_SCHEMA};
use gdpath_doctor::routes::{Route, RouteState};
use gdpath_topo::Machine;
use serde::Deserialize;
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// Largest result document read (a sweep of every size and pair is far smaller).
pub const MAX_DOC_BYTES: u64 = 32 << 20;
/// Most rows taken from one document.
pub const MAX_ROWS: usize = 100_000;

/// Where a document came from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Origin {
    /// Read with `--from`.
    File(PathBuf),
    /// Measured by `gdpath report --measure`.
    Measured,
}

/// One bench result document.
#[derive(Debug, Clone)]
pub struct BenchDoc {
    /// Where the document came from: a file given with `--from`, or measured.
    pub origin: Origin,
    /// `bench storage`, `bench p2p`, … (the document's `command`).
    pub command: String,
    /// The command line that made it, when recorded (`argv`: program name first).
    pub argv: Option<Vec<String>>,
    /// When it started, seconds since the Unix epoch (`started_unix_s`).
    pub started_unix_s: Option<u64>,
    /// The file a storage bench used.
    pub file: Option<String>,
    /// The rows of the document.
    pub rows: Vec<BenchRow>,
    /// Finding ids the bench reported, and its notes.
    pub findings: Vec<String>,
    /// The notes the bench added to its rows.
    pub notes: Vec<String>,
}

impl BenchDoc {
    /// The command line as shown: the recorded one, else the command with what the document
    /// says of it.
    pub fn command_line(&self) -> String {
        match &self.argv {
            Some(a) if !a.is_empty() => {
                let mut words = vec!["gdpath".to_owned()];
                words.extend(a.iter().skip(1).map(|w| shell_word(w)));
                words.join(" ")
            }
            _ => {
                let mut s = format!("gdpath {}", self.command);
                if let Some(f) = &self.file {
                    s.push_str(&format!(" --file {}", shell_word(f)));
                }
                s.push_str(" … (the document does not record its full command line)");
                s
            }
        }
    }
}

/// A word quoted for a POSIX shell when it needs it.
pub fn shell_word(w: &str) -> String {
    let plain = !w.is_empty()
        && w.chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./:=,+@%".contains(c));
    if plain {
        w.to_owned()
    } else {
        format!("'{}'", w.replace('\'', "'\\''"))
    }
}

/// Why a result document was refused. Each names the file.
#[derive(Debug, thiserror::Error)]
pub enum ResultsError {
    /// The file could not be opened or read.
    #[error("cannot read {path}: {source}")]
    Io {
        /// The file at fault, as given.
        path: PathBuf,
        /// The error of the read.
        #[source]
        source: std::io::Error,
    },
    /// The file is larger than [`MAX_DOC_BYTES`]; it is not read.
    #[error("{path}: {bytes} bytes is more than a bench result document can be ({MAX_DOC_BYTES})")]
    TooLarge {
        /// The file at fault, as given.
        path: PathBuf,
        /// Its size, bytes.
        bytes: u64,
    },
    /// The file is not JSON.
    #[error("{path}:{line}:{column}: not JSON: {message}")]
    Json {
        /// The file at fault, as given.
        path: PathBuf,
        /// Line of the first error, from 1.
        line: usize,
        /// Column of the first error, from 1.
        column: usize,
        /// The parser's message.
        message: String,
    },
    /// The document is JSON but not of schema [`BENCH_SCHEMA`].
    #[error("{path}: not a gdpath bench result (schema {found:?}, expected {BENCH_SCHEMA:?}; `gdpath bench … --json` writes one)")]
    NotBench {
        /// The file at fault, as given.
        path: PathBuf,
        /// The schema the document names (empty when it names none).
        found: String,
    },
    /// The document has no `rows`, more than [`MAX_ROWS`], or a row it cannot read.
    #[error("{path}: row {index}: {why}")]
    Row {
        /// The file at fault, as given.
        path: PathBuf,
        /// The row's index in `rows`, from 0.
        index: usize,
        /// What is wrong with it.
        why: String,
    },
}

#[derive(Deserialize)]
struct Doc {
    schema: Option<String>,
    command: Option<String>,
    argv: Option<Vec<String>>,
    started_unix_s: Option<u64>,
    file: Option<serde_json::Value>,
    rows: Option<Vec<serde_json::Value>>,
    #[serde(default)]
    findings: Vec<serde_json::Value>,
    #[serde(default)]
    notes: Vec<serde_json::Value>,
}

/// Reads a document written by `gdpath bench … --json`.
pub fn read(path: &Path) -> Result<BenchDoc, ResultsError> {
    let io = |source| ResultsError::Io {
        path: path.to_owned(),
        source,
    };
    let meta = std::fs::metadata(path).map_err(io)?;
    if meta.len() > MAX_DOC_BYTES {
        return Err(ResultsError::TooLarge {
            path: path.to_owned(),
            bytes: meta.len(),
        });
    }
    // A regular file only (a FIFO would block the read), bounded as the topology inputs are.
    let raw = gdpath_topo::input::read_limited(path, MAX_DOC_BYTES).map_err(io)?;
    let text = String::from_utf8(raw).map_err(|e| {
        io(std::io::Error::new(
            std::io::ErrorKind::InvalidData,
            format!("not UTF-8 text ({e})"),
        ))
    })?;
    parse(&text, Origin::File(path.to_owned()))
}

/// Parses a document's text (`origin` names it in errors).
pub fn parse(text: &str, origin: Origin) -> Result<BenchDoc, ResultsError> {
    let path = match &origin {
        Origin::File(p) => p.clone(),
        Origin::Measured => PathBuf::from("(measured)"),
    };
    let doc: Doc = serde_json::from_str(text).map_err(|e| ResultsError::Json {
        path: path.clone(),
        line: e.line(),
        column: e.column(),
        message: e.to_string(),
    })?;
    let schema = doc.schema.unwrap_or_default();
    if schema != BENCH_SCHEMA {
        return Err(ResultsError::NotBench {
            path,
            found: schema,
        });
    }
    let raw = doc.rows.ok_or_else(|| ResultsError::Row {
        path: path.clone(),
        index: 0,
        why: "the document has no `rows`".to_owned(),
    })?;
    if raw.len() > MAX_ROWS {
        return Err(ResultsError::Row {
            path,
            index: MAX_ROWS,
            why: format!("{} rows, more than {MAX_ROWS}", raw.len()),
        });
    }
    let mut rows = Vec::with_capacity(raw.len());
    for (index, v) in raw.into_iter().enumerate() {
        let row: BenchRow = serde_json::from_value(v).map_err(|e| ResultsError::Row {
            path: path.clone(),
            index,
            why: e.to_string(),
        })?;
        check_row(&row).map_err(|why| ResultsError::Row {
            path: path.clone(),
            index,
            why,
        })?;
        rows.push(row);
    }
    let text_of = |v: serde_json::Value| match v {
        serde_json::Value::String(s) => s,
        other => other.to_string(),
    };
    Ok(BenchDoc {
        origin,
        command: doc.command.unwrap_or_else(|| "bench".to_owned()),
        argv: doc.argv,
        started_unix_s: doc.started_unix_s,
        file: doc.file.map(text_of),
        rows,
        findings: doc.findings.into_iter().map(text_of).collect(),
        notes: doc.notes.into_iter().map(text_of).collect(),
    })
}

fn check_row(r: &BenchRow) -> Result<(), String> {
    for (name, v) in [
        ("gbps_min", r.gbps_min),
        ("gbps_median", r.gbps_median),
        ("gbps_max", r.gbps_max),
    ] {
        if !v.is_finite() || v < 0.0 {
            return Err(format!("{name} is {v}: a rate must be a finite number ≥ 0"));
        }
    }
    if let Some(l) = r.limit_gbps {
        if !l.is_finite() || l <= 0.0 {
            return Err(format!(
                "limit_gbps is {l}: a limit must be a finite number > 0"
            ));
        }
    }
    if r.path.len() > 200 || r.op.len() > 200 {
        return Err("path or op longer than 200 characters".to_owned());
    }
    Ok(())
}

/// The figures of the documents that belong to drawn paths (see the module docs).
#[derive(Debug, Default)]
pub struct Figures {
    /// (from, to) gdpath GPU ids → (direct text, staged text).
    pairs: BTreeMap<(String, String), (Option<String>, Option<String>)>,
    /// GPU id → text, per area.
    per_gpu: BTreeMap<(u8, String), String>,
    /// How CUDA ordinals were mapped to gdpath's GPU ids.
    pub ordinal_note: Option<String>,
}

/// Largest-size row of each key, by `bytes` then `block`.
fn keep_largest<K: Ord>(map: &mut BTreeMap<K, BenchRow>, key: K, row: &BenchRow) {
    let bigger = |old: &BenchRow| (row.bytes, row.block) > (old.bytes, old.block);
    match map.get(&key) {
        Some(old) if !bigger(old) => {}
        _ => {
            map.insert(key, row.clone());
        }
    }
}

fn area_key(a: Area) -> u8 {
    match a {
        Area::P2p => 0,
        Area::Gdr => 1,
        _ => 2,
    }
}

/// `392.1` with three significant digits or so.
pub fn rate(v: f64) -> String {
    if v >= 100.0 {
        format!("{v:.0}")
    } else if v >= 10.0 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

impl Figures {
    /// Gathers the figures of `docs` for machine `m`.
    pub fn of(m: &Machine, docs: &[BenchDoc]) -> Figures {
        let gpus: Vec<&gdpath_topo::Device> = m.gpus().collect();
        let mut f = Figures::default();
        let by_ordinal = |o: u32| -> Option<String> {
            match &m.driver {
                Some(d) => d
                    .gpu(o)
                    .and_then(|g| gpus.iter().find(|x| x.pci.to_string() == g.pci))
                    .map(|x| x.id.clone()),
                None => gpus.get(o as usize).map(|x| x.id.clone()),
            }
        };
        let ordinal =
            |s: &str, prefix: &str| -> Option<u32> { s.strip_prefix(prefix)?.parse().ok() };
        let mut direct: BTreeMap<(String, String), BenchRow> = BTreeMap::new();
        let mut staged: BTreeMap<(String, String), BenchRow> = BTreeMap::new();
        let mut gds: BTreeMap<(String, bool), BenchRow> = BTreeMap::new();
        let mut gdr: BTreeMap<String, BenchRow> = BTreeMap::new();
        let mut used_ordinals = false;
        for r in docs.iter().flat_map(|d| d.rows.iter()) {
            let (Some(src), Some(dst)) = (r.src.as_deref(), r.dst.as_deref()) else {
                continue;
            };
            if !r.verified {
                continue;
            }
            if let (Some(a), Some(b)) = (ordinal(src, "GPU"), ordinal(dst, "GPU")) {
                used_ordinals = true;
                let (Some(a), Some(b)) = (by_ordinal(a), by_ordinal(b)) else {
                    continue;
                };
                if r.path.starts_with("p2p-") && !r.path.ends_with("-bidir") {
                    keep_largest(&mut direct, (a, b), r);
                } else if r.path == "staged" {
                    keep_largest(&mut staged, (a, b), r);
                }
                continue;
            }
            if let Some(n) = ordinal(dst, "gpu:").or_else(|| ordinal(src, "gpu:")) {
                used_ordinals = true;
                let Some(g) = by_ordinal(n) else { continue };
                let rdma = r.transport.as_deref().is_some_and(rdma_transport);
                if r.transport.is_some() {
                    if rdma {
                        keep_largest(&mut gdr, g, r);
                    }
                } else if r.path.starts_with("gds")
                    || r.path == "staged"
                    || r.path.contains("compat")
                {
                    keep_largest(&mut gds, (g, r.path.starts_with("gds-native")), r);
                }
            }
        }
        for ((a, b), r) in direct {
            f.pairs.entry((a, b)).or_default().0 = Some(rate(r.gbps_median));
        }
        for ((a, b), r) in staged {
            f.pairs.entry((a, b)).or_default().1 = Some(rate(r.gbps_median));
        }
        // GDS: the native path's figure when it ran, else whichever ran.
        let mut best: BTreeMap<String, BenchRow> = BTreeMap::new();
        for ((g, native), r) in gds {
            if native || !best.contains_key(&g) {
                best.insert(g, r);
            }
        }
        for (g, r) in best {
            f.per_gpu.insert(
                (area_key(Area::Gds), g),
                format!("{} GB/s {}", rate(r.gbps_median), r.path),
            );
        }
        for (g, r) in gdr {
            f.per_gpu.insert(
                (area_key(Area::Gdr), g),
                format!(
                    "{} GB/s {}",
                    rate(r.gbps_median),
                    r.transport.clone().unwrap_or_default()
                ),
            );
        }
        if used_ordinals && m.driver.is_none() {
            f.ordinal_note = Some(
                "GPU numbers in the results are CUDA ordinals; without driver facts for this \
                 machine they are taken to be in PCI bus order (CUDA_DEVICE_ORDER=PCI_BUS_ID)"
                    .to_owned(),
            );
        }
        f
    }

    /// The P2P rate text from `a` to `b` (direct, or `staged …`).
    pub fn p2p(&self, a: &str, b: &str) -> Option<String> {
        let (d, s) = self.pairs.get(&(a.to_owned(), b.to_owned()))?;
        d.clone()
            .or_else(|| s.as_ref().map(|s| format!("staged {s}")))
    }
}

/// UCX transports that move data by RDMA through a NIC (`rc_mlx5`, `dc_mlx5`, `ud_verbs`,
/// EFA's `srd`).
fn rdma_transport(t: &str) -> bool {
    ["rc", "dc", "ud", "srd"]
        .iter()
        .any(|p| t == *p || t.starts_with(&format!("{p}_")))
}

impl PairRates for Figures {
    fn pair(&self, from: &str, to: &str) -> Option<String> {
        self.p2p(from, to)
    }
}

impl RouteLabels for Figures {
    fn label(&self, r: &Route) -> Option<String> {
        let fig = match r.area {
            Area::P2p => self.p2p(&r.gpu, &r.peer).map(|t| format!("{t} GB/s")),
            a => self.per_gpu.get(&(area_key(a), r.gpu.clone())).cloned(),
        };
        match (r.state, fig) {
            (RouteState::Degraded, Some(f)) => Some(format!("▲ {f}")),
            (RouteState::Degraded, None) => Some("▲".to_owned()),
            (_, f) => f,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn refuses_what_is_not_a_bench_document() {
        let o = || Origin::File("x.json".into());
        assert!(matches!(
            parse("{", o()),
            Err(ResultsError::Json { line: 1, .. })
        ));
        assert!(matches!(
            parse(r#"{"schema":"gdpath.topo/1","rows":[]}"#, o()),
            Err(ResultsError::NotBench { .. })
        ));
        assert!(matches!(
            parse(r#"{"schema":"gdpath.bench/1"}"#, o()),
            Err(ResultsError::Row { .. })
        ));
        let row = |g: &str| {
            format!(
                r#"{{"schema":"gdpath.bench/1","command":"bench storage","rows":[{{"path":"posix-direct","op":"read","bytes":1,"block":1,"qd":1,"gbps_min":{g},"gbps_median":1,"gbps_max":1,"iops":1,"latency_us_p50":1,"latency_us_p99":1,"verified":true}}]}}"#
            )
        };
        assert!(parse(&row("1"), o()).is_ok());
        let e = parse(&row("-1"), o()).unwrap_err().to_string();
        assert!(e.contains("row 0") && e.contains("gbps_min"), "{e}");
        assert!(matches!(
            parse(&row("\"a\""), o()),
            Err(ResultsError::Row { .. })
        ));
        assert_eq!(shell_word("a b"), "'a b'");
        assert_eq!(shell_word("--size=1MiB"), "--size=1MiB");
        assert_eq!(shell_word("it's"), "'it'\\''s'");
    }
}
