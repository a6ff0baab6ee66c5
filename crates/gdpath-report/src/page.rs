//! The report page: one HTML document with its style inline and a content security policy that
//! lets it load nothing (no script, no font, no image from anywhere), so it opens from disk,
//! offline, the same everywhere. It is also well-formed XML (void elements closed, everything
//! escaped), so an XML parser checks it whole, the SVG inside included.

use crate::chart;
use crate::drawing;
use crate::findings::{self, chip};
use crate::results::{rate, BenchDoc, Figures, Origin};
use crate::svg::esc;
use gdpath::finding::Area;
use gdpath::units::format_size;
use gdpath_doctor::routes::{Route, RouteState};
use gdpath_doctor::Examination;
use std::fmt::Write as _;
use std::time::SystemTime;

const CSS: &str = r#"
body { font: 14px/1.45 system-ui, "DejaVu Sans", sans-serif; color: #111827; margin: 24px; }
h1 { font-size: 22px; margin: 0 0 4px; }
h2 { font-size: 17px; margin: 30px 0 10px; padding-bottom: 4px; border-bottom: 1px solid #e5e7eb; }
h3 { font-size: 14px; margin: 0 0 6px; }
.meta { color: #4b5563; margin: 2px 0; }
code, .mono { font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; font-size: 12.5px; }
.verdicts { display: flex; gap: 10px; flex-wrap: wrap; margin-top: 14px; }
.verdict { border: 1px solid #d1d5db; border-left-width: 6px; border-radius: 6px; padding: 8px 10px; flex: 1 1 240px; max-width: 480px; }
.verdict .name { font-weight: bold; margin-right: 6px; }
.verdict .sum { color: #374151; font-size: 13px; margin-top: 4px; }
.verdict .routes { font-size: 13px; margin-top: 2px; }
.v-p2p { border-left-color: #2563eb; } .v-gdr { border-left-color: #16a34a; }
.v-gds { border-left-color: #ea580c; } .v-system { border-left-color: #6b7280; }
.st { display: inline-block; padding: 0 7px; border-radius: 10px; font-size: 12px; white-space: nowrap; }
.st-ok { background: #dcfce7; color: #166534; } .st-degraded { background: #fef3c7; color: #92400e; }
.st-unavailable { background: #fee2e2; color: #991b1b; } .st-unknown { background: #f3f4f6; color: #374151; }
.st-not-run { background: #f9fafb; color: #6b7280; border: 1px solid #e5e7eb; }
.figure { overflow-x: auto; border: 1px solid #e5e7eb; border-radius: 6px; background: #fff; }
.figure svg { display: block; }
.hint { color: #6b7280; font-size: 12.5px; }
table { border-collapse: collapse; font-size: 13px; }
table.findings { width: 100%; }
th, td { border-bottom: 1px solid #e5e7eb; padding: 5px 8px; text-align: left; vertical-align: top; }
th { background: #f9fafb; }
details > summary { cursor: pointer; }
details.passed { margin-top: 10px; }
.cards { display: flex; flex-wrap: wrap; gap: 18px; }
.card { border: 1px solid #e5e7eb; border-radius: 6px; padding: 10px 12px; max-width: 660px; }
.card .cmd { display: block; white-space: pre-wrap; overflow-wrap: break-word; background: #f9fafb; padding: 4px 6px; border-radius: 4px; margin: 4px 0; }
.missing { color: #991b1b; }
svg.chart text { font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; fill: #374151; }
svg.chart .grid { stroke: #eef0f3; fill: none; }
svg.chart .axis { stroke: #6b7280; fill: none; }
svg.chart .band { fill-opacity: 0.13; stroke: none; }
svg.chart .line { fill: none; stroke-width: 2; }
svg.chart .limit { stroke: #111827; stroke-dasharray: 6 4; stroke-width: 1.3; fill: none; }
svg.chart .limit-t { fill: #111827; }
svg.chart .series-t { font-weight: bold; }
"#;

/// Everything the page shows.
pub struct PageInput<'a> {
    /// The machine, its GDS directories and the doctor's report on them.
    pub examination: &'a Examination,
    /// The doctor's routes of the examination.
    pub routes: &'a [Route<'a>],
    /// Bench results: read with `--from`, or measured.
    pub docs: &'a [BenchDoc],
    /// What `--measure` could not measure, and why.
    pub missing: &'a [String],
    /// Whether `--measure` was asked for.
    pub measured: bool,
    /// The report's own command line (program name first).
    pub argv: &'a [String],
    /// When the page was made (shown in its header).
    pub generated: SystemTime,
    /// NCCL's chosen paths (`--nccl-log`), compared with this machine.
    pub nccl: Option<&'a gdpath_nccl::Explanation>,
}

fn area_what(a: Area) -> &'static str {
    match a {
        Area::P2p => "GPU ↔ GPU",
        Area::Gdr => "GPU ↔ RDMA NIC",
        Area::Gds | Area::Storage => "file ↔ GPU",
        Area::System => "driver, kernel, limits",
    }
}

/// `28 pairs: 4 direct, 24 staged`.
fn route_counts(routes: &[Route], area: Area, m: &gdpath_topo::Machine) -> String {
    let of: Vec<&Route> = routes.iter().filter(|r| r.area == area).collect();
    let gpus = m.gpus().count();
    if area == Area::P2p && gpus > gdpath_doctor::PER_PAIR_GPUS {
        // No route per pair: the doctor judges this many pairs in groups.
        let all: Vec<&gdpath_topo::Device> = m.gpus().collect();
        let counts = m.pair_counts(&all);
        return format!(
            "{} GPU pairs ({}), judged in groups: see the findings",
            counts.pairs,
            counts.classes_text()
        );
    }
    if of.is_empty() {
        return match area {
            _ if gpus == 0 => "no GPU".to_owned(),
            Area::P2p => "one GPU: no pair".to_owned(),
            Area::Gdr => "no NIC".to_owned(),
            _ => "no NVMe drive".to_owned(),
        };
    }
    let unit = match area {
        Area::P2p => "GPU pair",
        Area::Gdr => "GPU ↔ NIC path",
        _ => "GPU ↔ NVMe path",
    };
    let mut parts = Vec::new();
    for (s, w) in [
        (RouteState::Direct, "direct"),
        (RouteState::Degraded, "degraded"),
        (RouteState::Staged, "staged through host memory"),
        (RouteState::Unknown, "not known"),
    ] {
        let n = of.iter().filter(|r| r.state == s).count();
        if n > 0 {
            parts.push(format!("{n} {w}"));
        }
    }
    format!(
        "{} {unit}{}: {}",
        of.len(),
        if of.len() == 1 { "" } else { "s" },
        parts.join(", ")
    )
}

/// `2026-12-01 20:22 UTC`.
pub fn utc(t: SystemTime) -> String {
    let s = humantime::format_rfc3339_seconds(t).to_string();
    // 2026-12-01T20:22:08Z → 2026-12-01 20:22 UTC
    match (s.get(..10), s.get(11..16)) {
        (Some(d), Some(hm)) => format!("{d} {hm} UTC"),
        _ => s,
    }
}

fn from_unix(s: u64) -> SystemTime {
    std::time::UNIX_EPOCH + std::time::Duration::from_secs(s)
}

/// The page.
pub fn html(p: &PageInput) -> String {
    let ex = p.examination;
    let m = &ex.loaded.machine;
    let figures = Figures::of(m, p.docs);
    let not_drawn = drawing::not_drawn(m);
    let svg = match &not_drawn {
        None => {
            let marks = p.nccl.map(|e| crate::nccl::marks(e).0).unwrap_or_default();
            drawing::machine_svg_marked(m, p.routes, &figures, &figures, &marks)
        }
        Some(_) => String::new(),
    };
    let mut o = String::new();
    let title = format!("gdpath report — {}", drawing::summary(m));
    let _ = write!(
        o,
        "<!DOCTYPE html>\n<html lang=\"en\"><head><meta charset=\"utf-8\"/>\
         <meta http-equiv=\"Content-Security-Policy\" content=\"default-src 'none'; style-src 'unsafe-inline'; img-src data:\"/>\
         <meta name=\"viewport\" content=\"width=device-width, initial-scale=1\"/>\
         <meta name=\"generator\" content=\"gdpath {}\"/>\
         <title>{}</title><style>{CSS}</style></head><body>",
        env!("CARGO_PKG_VERSION"),
        esc(&title)
    );
    let _ = write!(o, "<h1>{}</h1>", esc(&title));
    let _ = write!(o, "<p class=\"meta\">Machine: {}</p>", esc(&ex.what()));
    let _ = write!(
        o,
        "<p class=\"meta\">Made {} by gdpath {} with <code>{}</code></p>",
        esc(&utc(p.generated)),
        env!("CARGO_PKG_VERSION"),
        esc(&command_line(p.argv))
    );
    // Verdicts.
    o.push_str("<div class=\"verdicts\">");
    for v in &ex.report.verdicts {
        let class = match v.path {
            Area::P2p => "v-p2p",
            Area::Gdr => "v-gdr",
            Area::Gds | Area::Storage => "v-gds",
            Area::System => "v-system",
        };
        let _ = write!(
            o,
            "<div class=\"verdict {class}\"><span class=\"name\">{}</span>{} <span class=\"hint\">{}</span>",
            findings::area_name(v.path),
            chip(v.status),
            area_what(v.path)
        );
        if v.path != Area::System {
            let _ = write!(
                o,
                "<div class=\"routes\">{}</div>",
                esc(&route_counts(p.routes, v.path, m))
            );
        }
        let _ = write!(o, "<div class=\"sum\">{}</div></div>", esc(&v.summary));
    }
    o.push_str("</div>");
    // The machine.
    o.push_str("<h2>The machine and its data paths</h2>");
    match &not_drawn {
        None => {
            let _ = write!(o, "<div class=\"figure\">{svg}</div>");
            o.push_str(
                "<p class=\"hint\">Each path is drawn as the doctor judges it: solid where the \
                 direct path is in use, dashed red where the data goes through host memory \
                 instead, dotted where it is not known. Point at a path, a box or a matrix cell \
                 for what decided it.</p>",
            );
        }
        Some(why) => {
            let _ = write!(o, "<p class=\"missing\">{}</p>", esc(why));
        }
    }
    if let Some(f) = ex.report.findings.iter().find(|f| {
        f.id.as_str() == gdpath::finding::ids::SYSTEM_VIRTUAL_MACHINE
            && f.evidence.starts_with("virtual machine")
    }) {
        let _ = write!(
            o,
            "<p class=\"hint\">A virtual machine: the PCI tree, NUMA nodes and links drawn are \
             the ones the hypervisor shows, not the host's ({}: {}).</p>",
            esc(f.id.as_str()),
            esc(&f.evidence)
        );
    }
    if let Some(n) = &figures.ordinal_note {
        let _ = write!(o, "<p class=\"hint\">{}</p>", esc(n));
    }
    // Findings.
    o.push_str("<h2>Findings</h2>");
    o.push_str(&findings::html(&ex.report, m, &ex.paths));
    if let Some(e) = p.nccl {
        o.push_str(&crate::nccl::html(e));
    }
    // Measurements.
    o.push_str("<h2>Measurements</h2>");
    measurements(&mut o, p);
    // Provenance.
    o.push_str("<h2>Where every figure comes from</h2><table><tbody>");
    let _ = write!(
        o,
        "<tr><th>machine</th><td>{} (reader: <code>{}</code>)</td></tr>",
        esc(&ex.what()),
        esc(&m.source)
    );
    let _ = write!(
        o,
        "<tr><th>findings</th><td>gdpath {}'s doctor, {} mode, on the machine above; {}</td></tr>",
        env!("CARGO_PKG_VERSION"),
        ex.report.mode,
        esc(&gds_dirs(&ex.paths))
    );
    for d in p.docs {
        let (when, origin) = (when(d), origin(d));
        let _ = write!(
            o,
            "<tr><th>{}</th><td><code>{}</code><br/>{}; {}; {} row(s)</td></tr>",
            esc(&d.command),
            esc(&d.command_line()),
            esc(&origin),
            esc(&when),
            d.rows.len()
        );
    }
    let _ = write!(
        o,
        "<tr><th>report</th><td><code>{}</code>, {}</td></tr></tbody></table>",
        esc(&command_line(p.argv)),
        esc(&utc(p.generated))
    );
    o.push_str(
        "<p class=\"hint\">GB/s = 10⁹ bytes/s. Link limits are per direction after line \
         encoding (docs/topology.md).</p></body></html>\n",
    );
    o
}

/// Which directories GDS was checked in: none in a replay without `--path` (the directory
/// the report runs in is not on the replayed machine).
fn gds_dirs(paths: &[std::path::PathBuf]) -> String {
    if paths.is_empty() {
        return "GDS checked in no directory (a replay checks only directories given with \
                --path)"
            .to_owned();
    }
    let dirs: Vec<String> = paths.iter().map(|p| p.display().to_string()).collect();
    format!("GDS checked in {}", dirs.join(", "))
}

/// When a document's bench ran.
fn when(d: &BenchDoc) -> String {
    d.started_unix_s
        .map(|s| utc(from_unix(s)))
        .unwrap_or_else(|| "date not recorded".to_owned())
}

/// Where a document came from.
fn origin(d: &BenchDoc) -> String {
    match &d.origin {
        Origin::File(f) => format!("read from {}", f.display()),
        Origin::Measured => "measured by this report (--measure)".to_owned(),
    }
}

fn command_line(argv: &[String]) -> String {
    let mut w = vec!["gdpath".to_owned()];
    w.extend(argv.iter().skip(1).map(|a| crate::results::shell_word(a)));
    w.join(" ")
}

fn measurements(o: &mut String, p: &PageInput) {
    if p.docs.is_empty() && p.missing.is_empty() {
        o.push_str(
            "<p>No measurements in this report: pass <code>--from results.json</code> (documents \
             of <code>gdpath bench … --json</code>) or <code>--measure</code>.</p>",
        );
        return;
    }
    if !p.missing.is_empty() {
        o.push_str("<p class=\"missing\">Not measured:</p><ul class=\"missing\">");
        for m in p.missing {
            let _ = write!(o, "<li>{}</li>", esc(m));
        }
        o.push_str("</ul>");
    }
    o.push_str("<div class=\"cards\">");
    for d in p.docs {
        let _ = write!(o, "<div class=\"card\"><h3>{}</h3>", esc(&d.command));
        let _ = write!(o, "<code class=\"cmd\">{}</code>", esc(&d.command_line()));
        let (when, origin) = (when(d), origin(d));
        let _ = write!(o, "<p class=\"hint\">{}, {}</p>", esc(&when), esc(&origin));
        match chart::chart(d) {
            Some((svg, _)) => o.push_str(&svg),
            None => o.push_str("<p>No verified row with a size to chart.</p>"),
        }
        for f in &d.findings {
            let _ = write!(o, "<p class=\"hint\">finding: <code>{}</code></p>", esc(f));
        }
        for n in &d.notes {
            let _ = write!(o, "<p class=\"hint\">note: {}</p>", esc(n));
        }
        rows_table(o, d);
        o.push_str("</div>");
    }
    o.push_str("</div>");
}

fn rows_table(o: &mut String, d: &BenchDoc) {
    let _ = write!(
        o,
        "<details><summary>{} row(s)</summary><table><thead><tr><th>path</th><th>op</th>\
         <th>src → dst</th><th>size</th><th>GB/s min</th><th>median</th><th>max</th>\
         <th>limit</th><th>verified</th></tr></thead><tbody>",
        d.rows.len()
    );
    for r in d.rows.iter().take(2000) {
        let ends = match (&r.src, &r.dst) {
            (Some(s), Some(t)) => format!("{s} → {t}"),
            _ => String::new(),
        };
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{}</td><td>{}</td></tr>",
            esc(&r.path),
            esc(&r.op),
            esc(&ends),
            esc(&format_size(r.block)),
            rate(r.gbps_min),
            rate(r.gbps_median),
            rate(r.gbps_max),
            r.limit_gbps.map(rate).unwrap_or_default(),
            if r.verified { "yes" } else { "<b>NO</b>" }
        );
    }
    o.push_str("</tbody></table></details>");
}
