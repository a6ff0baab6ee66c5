//! NCCL's chosen paths over the machine (`gdpath report --nccl-log LOG…`): per peer pair what
//! NCCL's log says it chose beside the class of the two GPUs in this machine and the `nccl.*`
//! findings that name the pair, and each rank's GPU ↔ NIC of its NET lines
//! ([`gdpath_nccl::explain`], compared with the machine the report draws). Every text from a
//! log (file names, `via` texts, reasons) is escaped.

use crate::svg::esc;
use gdpath_nccl::Explanation;
use std::fmt::Write as _;

/// Rows shown per table: a job of thousands of ranks has millions of pairs, which no page
/// shows usefully; the rest are counted and `gdpath nccl --verbose` lists them.
pub const MAX_ROWS: usize = 256;

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
    if e.pairs.len() > MAX_ROWS {
        let _ = write!(
            o,
            "<p class=\"hint\">… {} more pairs (<code>gdpath nccl --verbose</code> lists all).</p>",
            e.pairs.len() - MAX_ROWS
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
