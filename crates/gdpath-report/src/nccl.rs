//! NCCL's chosen paths over the machine (`gdpath report --nccl-log LOG…`): per peer pair what
//! NCCL's log says it chose beside the class of the two GPUs in this machine and the `nccl.*`
//! findings that name the pair, and each rank's GPU ↔ NIC of its NET lines
//! ([`gdpath_nccl::explain`], compared with the machine the report draws). Every text from a
//! log (file names, `via` texts, reasons) is escaped.

use crate::geometry::SMALL;
use crate::svg::{esc, fit};
use gdpath_nccl::Explanation;
use std::fmt::Write as _;

/// Rows shown per table: a job of thousands of ranks has millions of pairs, which no page
/// shows usefully; the rest are counted and `gdpath nccl --verbose` lists them.
pub const MAX_ROWS: usize = 256;

/// Pairs marked on the machine drawing, one lane each; the rest are in the table only.
pub const MAX_MARKS: usize = 64;

/// Widest label of a mark, px (a `via` text of a log may be up to a line's 4096 bytes).
const MARK_LABEL_PX: f64 = 520.0;

/// One pair of NCCL's log drawn on the machine: the two GPUs of this machine that its ranks
/// run on (only pairs of one machine whose GPUs were both found) and what NCCL chose.
#[derive(Debug, Clone, PartialEq)]
pub struct NcclMark {
    /// Sending rank.
    pub src: u32,
    /// Receiving rank.
    pub dst: u32,
    /// The sending rank's GPU (`GPU0`), as the drawing's boxes name it.
    pub src_gpu: String,
    /// The receiving rank's GPU.
    pub dst_gpu: String,
    /// NCCL's `via` text (`P2P/CUMEM/read`, `SHM/direct/direct`, `NET/IB/0/GDRDMA`).
    pub via: String,
    /// The bar's CSS class by transport: `nccl-p2p`, `nccl-shm`, `nccl-net`, `nccl-other`.
    pub class: &'static str,
    /// The tooltip: transport, lines, the machine's class of the pair.
    pub title: String,
}

impl NcclMark {
    /// The label beside the bar: GPUs, ranks and `via` (cut to fit, with an ellipsis).
    pub fn label(&self) -> String {
        fit(
            &format!(
                "{} → {}  rank {} → {}  {}",
                self.src_gpu, self.dst_gpu, self.src, self.dst, self.via
            ),
            SMALL,
            MARK_LABEL_PX,
        )
    }
}

/// The pairs of `e` to mark on the drawing (at most [`MAX_MARKS`]) and how many drawable pairs
/// were left out past that. A pair between hosts, or whose GPUs the machine lacks, has none.
pub fn marks(e: &Explanation) -> (Vec<NcclMark>, usize) {
    let drawable: Vec<NcclMark> = e
        .pairs
        .iter()
        .filter_map(|r| {
            let (a, b) = (r.src_gpu.clone()?, r.dst_gpu.clone()?);
            Some(NcclMark {
                src: r.src,
                dst: r.dst,
                src_gpu: a,
                dst_gpu: b,
                via: r.via.clone(),
                class: match r.class {
                    "P2P" => "nccl-p2p",
                    "SHM" => "nccl-shm",
                    "NET" => "nccl-net",
                    _ => "nccl-other",
                },
                title: format!(
                    "rank {} → {}: NCCL chose {} ({}), {} line(s); this machine's class of the pair: {}",
                    r.src,
                    r.dst,
                    r.class,
                    r.via,
                    r.lines,
                    r.topo_class.as_deref().unwrap_or("-")
                ),
            })
        })
        .collect();
    let left = drawable.len().saturating_sub(MAX_MARKS);
    (drawable.into_iter().take(MAX_MARKS).collect(), left)
}

/// The section's HTML (heading included).
pub fn html(e: &Explanation) -> String {
    let mut o = String::new();
    o.push_str("<h2>NCCL's paths</h2>");
    let files: Vec<String> = e.job.files.iter().map(|f| esc(f)).collect();
    let _ = write!(
        o,
        "<p class=\"hint\">From {} (NCCL {}, {} rank(s), {} host(s)): what NCCL chose for every \
         peer pair, beside the class of the two GPUs in the machine above. Derived comparisons \
         are marked in the findings; <code>gdpath nccl</code> explains them.</p>",
        files.join(", "),
        esc(e.job.version.as_deref().unwrap_or("version not logged")),
        e.job.ranks.len(),
        e.job.hosts.len()
    );
    for n in &e.notes {
        let _ = write!(o, "<p class=\"hint\">{}</p>", esc(n));
    }
    let (drawn, left) = marks(e);
    let _ = write!(
        o,
        "<p class=\"hint\">{} pair(s) of one machine are marked under the drawing above{}; pairs \
         between hosts are in this table only.</p>",
        drawn.len(),
        if left > 0 {
            format!(" ({left} more past the first {MAX_MARKS})")
        } else {
            String::new()
        }
    );
    o.push_str(
        "<table><thead><tr><th>ranks</th><th>NCCL chose</th><th>via</th><th>machine</th>\
         <th>host</th><th>lines</th><th>findings</th></tr></thead><tbody>",
    );
    for r in e.pairs.iter().take(MAX_ROWS) {
        let pair = format!("{}->{}", r.src, r.dst);
        let ids: Vec<&str> = e
            .findings
            .iter()
            .filter(|f| f.finding.subject.split(',').any(|s| s == pair))
            .map(|f| f.finding.id.as_str())
            .collect();
        let host = match r.same_host {
            Some(true) => "same",
            Some(false) => "other",
            None => "?",
        };
        let _ = write!(
            o,
            "<tr class=\"nccl-pair\"><td>{} → {}</td><td>{}</td><td><code>{}</code></td><td>{}</td>\
             <td>{host}</td><td>{}</td><td>{}</td></tr>",
            r.src,
            r.dst,
            r.class,
            esc(&r.via),
            esc(r.topo_class.as_deref().unwrap_or("-")),
            r.lines,
            esc(&ids.join(" "))
        );
    }
    o.push_str("</tbody></table>");
    if e.pairs.len() + e.pairs_more > MAX_ROWS {
        let _ = write!(
            o,
            "<p class=\"hint\">… {} more pairs (<code>gdpath nccl --verbose</code> lists the first {}).</p>",
            e.pairs.len() + e.pairs_more - MAX_ROWS,
            gdpath_nccl::explain::MAX_SHOWN
        );
    }
    if !e.nic_paths.is_empty() {
        o.push_str(
            "<table><thead><tr><th>rank</th><th>GPU</th><th>NCCL device</th><th>NIC</th>\
             <th>machine</th><th>GDRDMA</th><th>matched by</th></tr></thead><tbody>",
        );
        for p in e.nic_paths.iter().take(MAX_ROWS) {
            let _ = write!(
                o,
                "<tr><td>{}{}</td><td>{}</td><td><code>NET/{}/{}</code></td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td></tr>",
                p.rank,
                p.pxn_for
                    .map(|r| format!(" (PXN proxy for rank {r})"))
                    .unwrap_or_default(),
                esc(&p.gpu),
                esc(&p.net),
                p.dev,
                esc(&p.nic),
                esc(&p.class),
                if p.gdr { "yes" } else { "no" },
                p.matched
            );
        }
        o.push_str("</tbody></table>");
    }
    if !e.findings.is_empty() {
        o.push_str("<table><thead><tr><th>finding</th><th>reason</th><th>basis</th><th>remedy</th></tr></thead><tbody>");
        for f in &e.findings {
            let basis = serde_json::to_value(f.basis)
                .ok()
                .and_then(|v| v.as_str().map(str::to_owned))
                .unwrap_or_default();
            let _ = write!(
                o,
                "<tr><td><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td></tr>",
                esc(f.finding.id.as_str()),
                esc(&f.reason),
                esc(&basis),
                esc(&f.finding.remedy)
            );
        }
        o.push_str("</tbody></table>");
    }
    o
}
