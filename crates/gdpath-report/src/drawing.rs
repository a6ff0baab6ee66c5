//! The machine drawing as one SVG document: the tree ([`crate::layout`]), the paths over it
//! ([`crate::routing`]), the P2P matrix ([`crate::matrix`]), a legend and what was left out.
//! Colours follow the course figure of the three paths: P2P blue, GDR green, GDS orange, the
//! traditional path through host memory dashed red.

use crate::geometry::{NodeKind, FONT, SMALL};
use crate::layout::{self, Layout};
use crate::matrix::{self, PairRates};
use crate::nccl::NcclMark;
use crate::routing::{self, RouteLabels, P2P_LINES_MAX_GPUS};
use crate::svg::{esc, num, polyline_d, Rect, Text};
use crate::tree::Tree;
use gdpath::finding::Area;
use gdpath_doctor::routes::{Route, RouteState};
use gdpath_topo::Machine;
use std::fmt::Write as _;

const PAD: f64 = 16.0;
/// A machine drawing narrower than this gets its matrix and legend beside it.
const NARROW: f64 = 640.0;

/// The drawing's own style sheet (the SVG also stands alone: `gdpath topo --svg`).
pub const STYLE: &str = r#"
svg.machine text { font-family: "DejaVu Sans Mono", "Liberation Mono", monospace; fill: #111827; }
svg.machine .numa-box { fill: none; stroke: #6b7280; stroke-width: 1.2; }
svg.machine .mem-strip { fill: #fee2e2; fill-opacity: 0.8; }
svg.machine .mem-label { fill: #991b1b; }
svg.machine .numa-id { font-weight: bold; }
svg.machine .numa-sub, svg.machine .hub-sub, svg.machine .dev-pci { fill: #4b5563; }
svg.machine .wire { stroke: #9ca3af; stroke-width: 1.5; fill: none; }
svg.machine .wire.down { stroke: #dc2626; stroke-width: 2.2; }
svg.machine .smp { stroke: #6b7280; stroke-width: 3; fill: none; }
svg.machine .box { stroke: #374151; stroke-width: 1; }
svg.machine .box.gpu { fill: #f3f4f6; stroke-width: 1.6; }
svg.machine .box.nic { fill: #f0fdf4; }
svg.machine .box.nvme { fill: #fff7ed; }
svg.machine .box.hub { fill: #ffffff; stroke: #6b7280; }
svg.machine .dev-id { font-weight: bold; }
svg.machine .hub-title { fill: #374151; }
svg.machine .nv { stroke: #7c3aed; stroke-width: 3.2; fill: none; stroke-linejoin: round; }
svg.machine .nv-label { fill: #5b21b6; }
svg.machine .route { fill: none; stroke-width: 2.4; stroke-linejoin: round; }
svg.machine .route.p2p { stroke: #2563eb; }
svg.machine .route.gdr { stroke: #16a34a; }
svg.machine .route.gds { stroke: #ea580c; }
svg.machine .route.staged { stroke: #dc2626; stroke-dasharray: 7 4; }
svg.machine .route.unknown { stroke-dasharray: 1.2 3.8; stroke-linecap: round; stroke-width: 2.6; }
svg.machine .link { fill: #374151; }
svg.machine .link-down { fill: #dc2626; font-weight: bold; }
svg.machine .link-idle { fill: #b45309; }
svg.machine .link-cap { fill: #6b7280; font-style: italic; }
svg.machine .halo { paint-order: stroke; stroke: #ffffff; stroke-width: 3px; stroke-linejoin: round; }
svg.machine .route-label { fill: #111827; font-weight: bold; }
svg.machine .rl-p2p { fill: #1d4ed8; }
svg.machine .rl-gdr { fill: #15803d; }
svg.machine .rl-gds { fill: #c2410c; }
svg.machine .tag-box { fill: #ffffff; stroke-width: 1.2; }
svg.machine .tag-box.rl-p2p { stroke: #2563eb; }
svg.machine .tag-box.rl-gdr { stroke: #16a34a; }
svg.machine .tag-box.rl-gds { stroke: #ea580c; }
svg.machine .panel-title { font-weight: bold; }
svg.machine .mx-head { fill: #374151; }
svg.machine .mx-self { fill: #e5e7eb; }
svg.machine .mx-self-t { fill: #6b7280; }
svg.machine .mx-direct { fill: #2563eb; }
svg.machine .mx-degraded { fill: #bfdbfe; stroke: #dc2626; stroke-width: 1.2; }
svg.machine .mx-staged { fill: #ffffff; stroke: #dc2626; stroke-width: 1.6; stroke-dasharray: 5 3; }
svg.machine .mx-unknown { fill: #ffffff; stroke: #2563eb; stroke-width: 1.6; stroke-dasharray: 1.2 3; stroke-linecap: round; }
svg.machine .mx-t-on { fill: #ffffff; }
svg.machine .mx-t-deg { fill: #1e3a8a; }
svg.machine .mx-t-staged { fill: #b91c1c; }
svg.machine .mx-t-unknown { fill: #4b5563; }
svg.machine .mx-class { font-weight: bold; }
svg.machine .legend-t, svg.machine .note { fill: #374151; }
svg.machine .nccl-bar { fill: none; stroke-width: 2; stroke-linecap: round; }
svg.machine .nccl-bar.nccl-p2p { stroke: #2563eb; }
svg.machine .nccl-bar.nccl-shm { stroke: #dc2626; stroke-dasharray: 6 3; }
svg.machine .nccl-bar.nccl-net { stroke: #16a34a; stroke-dasharray: 2 3; }
svg.machine .nccl-bar.nccl-other { stroke: #6b7280; }
svg.machine .nccl-t { fill: #111827; }
"#;

/// Labels of texts drawn over lines (given a white halo).
const HALO: &str = " halo";

/// The machine drawing of `m` with `routes` (from [`gdpath_doctor::routes::routes`]) over it;
/// `labels` and `rates` give the measured figures, when there are any.
pub fn machine_svg(
    m: &Machine,
    routes: &[Route],
    labels: &dyn RouteLabels,
    rates: &dyn PairRates,
) -> String {
    machine_svg_marked(m, routes, labels, rates, &[])
}

/// [`machine_svg`] with NCCL's pairs ([`crate::nccl::marks`]) marked under it: one lane per
/// pair, a bar from the sending GPU's column to the receiving one's (arrow at the receiver),
/// labelled with the GPUs, the ranks and NCCL's `via`. A mark whose GPU is not drawn is left out.
pub fn machine_svg_marked(
    m: &Machine,
    routes: &[Route],
    labels: &dyn RouteLabels,
    rates: &dyn PairRates,
    marks: &[NcclMark],
) -> String {
    let tree = Tree::of(m);
    // Twice: the first layout tells how many paths run along each rail, the second leaves
    // room for them.
    let mut lay = layout::layout(m, &tree, &Default::default());
    let mut drawn = routing::draw(&lay, routes, labels);
    if !drawn.room.is_empty() {
        lay = layout::layout(m, &tree, &drawn.room);
        drawn = routing::draw(&lay, routes, labels);
    }
    let gpus: Vec<String> = m.gpus().map(|g| g.id.clone()).collect();
    // The matrix and legend go under the machine, or beside a narrow one (a VM of one or two
    // GPUs), so that the drawing stays about as wide as it is tall.
    let beside = lay.width < NARROW;
    let y0 = if beside { PAD } else { lay.bottom + 30.0 };
    let mut panels = String::new();
    let mut panel_texts: Vec<Text> = Vec::new();
    let mut right = lay.width;
    let mut bottom = lay.bottom;
    let mut x = if beside { lay.width + 24.0 } else { PAD };
    let mut ly = y0;
    // Past the doctor's per-pair limit its findings name groups of pairs: counts, not cells.
    let panel = if gpus.len() > gdpath_doctor::PER_PAIR_GPUS {
        Some(matrix::summary(m, x, y0))
    } else {
        matrix::draw(&gpus, routes, rates, x, y0)
    };
    if let Some((svg, texts, b)) = panel {
        panels.push_str(&svg);
        panel_texts.extend(texts);
        if beside {
            ly = b.bottom() + 24.0;
        } else {
            x = b.right() + 40.0;
        }
        right = right.max(b.right() + PAD);
        bottom = bottom.max(b.bottom());
    }
    let (svg, texts, b) = legend(x, ly);
    panels.push_str(&svg);
    panel_texts.extend(texts);
    right = right.max(b.right() + PAD);
    bottom = bottom.max(b.bottom());
    if !marks.is_empty() {
        let (svg, texts, b) = nccl_lanes(&lay, marks, bottom + 30.0);
        panels.push_str(&svg);
        panel_texts.extend(texts);
        right = right.max(b.right() + PAD);
        bottom = bottom.max(b.bottom());
    }
    let mut notes = notes(m, &lay, routes, gpus.len());
    if !drawn.unplaced.is_empty() {
        notes.push(format!(
            "Not drawn over the tree: {} (the source does not say where the device attaches).",
            drawn.unplaced.join(", ")
        ));
    }
    let mut ny = bottom + 22.0;
    for n in notes {
        let t = Text::new(PAD, ny, SMALL, n, "note");
        right = right.max(t.rect().right() + PAD);
        panel_texts.push(t);
        ny += 15.0;
    }
    let (w, h) = (right.ceil(), (ny + PAD).ceil());

    let mut o = String::new();
    let _ = write!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"machine\" width=\"{w}\" height=\"{h}\" \
         viewBox=\"0 0 {w} {h}\" role=\"img\" aria-label=\"{}\"><title>{}</title><style>{STYLE}</style>\
         <rect x=\"0\" y=\"0\" width=\"{w}\" height=\"{h}\" fill=\"#ffffff\"/>",
        esc(&summary(m)),
        esc(&summary(m)),
    );
    // NUMA nodes: outline and the host-memory strip (the outline is not filled, so the staged
    // paths that dip into host memory show).
    for n in lay.nodes.iter().filter(|n| n.kind == NodeKind::Numa) {
        let r = n.rect;
        let _ = write!(
            o,
            "<g class=\"numa\"><title>{}</title><rect class=\"mem-strip\" x=\"{}\" y=\"{}\" \
             width=\"{}\" height=\"{}\"/><rect class=\"numa-box\" x=\"{}\" y=\"{}\" width=\"{}\" \
             height=\"{}\" rx=\"4\"/></g>",
            esc(&n.title),
            num(r.x),
            num(r.y + 26.0),
            num(r.w),
            num(r.h - 26.0),
            num(r.x),
            num(r.y),
            num(r.w),
            num(r.h)
        );
    }
    if let Some((y, x0, x1)) = lay.smp {
        let _ = write!(
            o,
            "<path class=\"smp\" d=\"M{} {} H{}\"/>",
            num(x0),
            num(y),
            num(x1)
        );
    }
    // Tree lines: rails, drops and each box's line up (with the bridges folded into it).
    for r in &lay.rails {
        let _ = write!(
            o,
            "<path class=\"wire\" d=\"M{} {} V{} M{} {} H{}\"/>",
            num(r.drop.0 .0),
            num(r.drop.0 .1),
            num(r.drop.1 .1),
            num(r.x0),
            num(r.y),
            num(r.x1)
        );
    }
    for n in &lay.nodes {
        if n.up.len() < 2 {
            continue;
        }
        let class = if n.kind == NodeKind::Numa {
            "smp"
        } else if n.link.as_ref().is_some_and(|l| l.class == "link-down") {
            "wire down"
        } else {
            "wire"
        };
        let _ = write!(
            o,
            "<path class=\"{class}\" data-pci=\"{}\" d=\"{}\"/>",
            esc(&n.pci.join(" ")),
            polyline_d(&n.up)
        );
    }
    for nv in &lay.nvlinks {
        let _ = write!(
            o,
            "<g class=\"nvlink\" data-gpus=\"{}\">",
            esc(&nv.gpus.join(" "))
        );
        for l in &nv.lines {
            let _ = write!(o, "<path class=\"nv\" d=\"{}\"/>", polyline_d(l));
        }
        o.push_str("</g>");
    }
    // Paths: staged and unknown ones first, so the direct ones are on top.
    let mut order: Vec<&routing::DrawnRoute> = drawn.routes.iter().collect();
    order.sort_by_key(|r| match r.state {
        RouteState::Unknown => 0,
        RouteState::Staged => 1,
        RouteState::Degraded => 2,
        RouteState::Direct => 3,
    });
    for r in order {
        let area = match r.area {
            Area::P2p => "p2p",
            Area::Gdr => "gdr",
            _ => "gds",
        };
        let state = match r.state {
            RouteState::Direct => "direct",
            RouteState::Degraded => "degraded",
            RouteState::Staged => "staged",
            RouteState::Unknown => "unknown",
        };
        // A route stroked wholly by look-alikes under it keeps its line for its tooltip.
        let (d, hidden) = if r.strokes.is_empty() {
            (polyline_d(&r.points), " stroke-opacity=\"0\"")
        } else {
            let parts: Vec<String> = r.strokes.iter().map(|s| polyline_d(s)).collect();
            (parts.join(" "), "")
        };
        let _ = write!(
            o,
            "<path class=\"route {area} {state}\" data-route=\"{area} {} {}\" d=\"{d}\"{hidden}><title>{}</title></path>",
            esc(&r.gpu),
            esc(&r.peer),
            esc(&r.title)
        );
    }
    // Boxes, with their labels.
    for n in lay.nodes.iter().filter(|n| n.kind != NodeKind::Numa) {
        let class = match n.kind {
            NodeKind::Gpu => "box gpu",
            NodeKind::Nic => "box nic",
            NodeKind::Nvme => "box nvme",
            _ => "box hub",
        };
        let r = n.rect;
        let _ = write!(o, "<g class=\"node\"");
        if let Some(id) = &n.id {
            let _ = write!(o, " data-id=\"{}\"", esc(id));
        }
        if !n.pci.is_empty() {
            let _ = write!(o, " data-pci=\"{}\"", esc(&n.pci.join(" ")));
        }
        let mut title = n.title.clone();
        if let Some(l) = &n.link {
            title = format!("{title}\nlink: {}", l.title);
        }
        let _ = write!(
            o,
            "><title>{}</title><rect class=\"{class}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"3\"/>",
            esc(&title),
            num(r.x),
            num(r.y),
            num(r.w),
            num(r.h)
        );
        for t in &n.texts {
            t.write(&mut o);
        }
        o.push_str("</g>");
    }
    for n in lay.nodes.iter().filter(|n| n.kind == NodeKind::Numa) {
        for t in &n.texts {
            t.write(&mut o);
        }
    }
    for t in lay.texts.iter().chain(
        drawn
            .texts
            .iter()
            .filter(|p| p.tag.is_none())
            .map(|p| &p.text),
    ) {
        let mut t = t.clone();
        t.class = halo_class(t.class);
        t.write(&mut o);
    }
    // Figures hung on their line: a box over the GPU's own line and lanes, the text in it.
    for p in &drawn.texts {
        if let Some(r) = p.tag {
            let _ = write!(
                o,
                "<g class=\"tag\"><rect class=\"tag-box {}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\" rx=\"2\"/>",
                p.text.class.trim_start_matches("route-label "),
                num(r.x),
                num(r.y),
                num(r.w),
                num(r.h)
            );
            p.text.write(&mut o);
            o.push_str("</g>");
        }
    }
    o.push_str(&panels);
    for t in &panel_texts {
        t.write(&mut o);
    }
    o.push_str("</svg>");
    o
}

/// Space between two lanes of NCCL's pairs, px: a label's box and the next bar's ticks clear.
const LANE: f64 = 18.0;

/// NCCL's pairs from `y` down: a title, then one lane per mark whose two GPUs are drawn.
fn nccl_lanes(lay: &Layout, marks: &[NcclMark], y: f64) -> (String, Vec<Text>, Rect) {
    let x_of = |id: &str| {
        lay.nodes
            .iter()
            .find(|n| n.kind == NodeKind::Gpu && n.id.as_deref() == Some(id))
            .map(|n| n.rect.cx())
    };
    let mut svg = String::new();
    let texts = vec![Text::new(
        PAD,
        y + 11.0,
        FONT,
        "NCCL's pairs (from the log): sending GPU → receiving GPU, NCCL's transport",
        "panel-title",
    )];
    let mut right = texts[0].rect().right();
    let mut ly = y + 32.0;
    for mk in marks {
        let (Some(xa), Some(xb)) = (x_of(&mk.src_gpu), x_of(&mk.dst_gpu)) else {
            continue;
        };
        // The arrowhead points at the receiver, from whichever side the bar comes.
        let back = if xb > xa { -5.0 } else { 5.0 };
        let (bx, y0, y1) = (num(xb + back), num(ly - 3.0), num(ly + 3.0));
        let (ax, bx2, y) = (num(xa), num(xb), num(ly));
        let _ = write!(
            svg,
            "<g class=\"nccl-mark\" data-ranks=\"{} {}\" data-gpus=\"{} {}\" data-via=\"{}\">\
             <title>{}</title><path class=\"nccl-bar {}\" d=\"M{ax} {y0} V{y1} M{ax} {y} H{bx2} \
             M{bx} {y0} L{bx2} {y} L{bx} {y1}\"/>",
            mk.src,
            mk.dst,
            esc(&mk.src_gpu),
            esc(&mk.dst_gpu),
            esc(&mk.via),
            esc(&mk.title),
            mk.class,
        );
        let t = Text::new(xa.max(xb) + 10.0, ly + 3.5, SMALL, mk.label(), "nccl-t");
        right = right.max(t.rect().right());
        t.write(&mut svg);
        svg.push_str("</g>");
        ly += LANE;
    }
    (svg, texts, Rect::new(PAD, y, right - PAD, ly - y))
}

/// The class with the halo added (a fixed set, so the classes stay `'static`).
fn halo_class(c: &'static str) -> &'static str {
    match c {
        "link" => "link halo",
        "link-down" => "link-down halo",
        "link-idle" => "link-idle halo",
        "link-cap" => "link-cap halo",
        "nv-label" => "nv-label halo",
        "route-label rl-p2p" => "route-label rl-p2p halo",
        "route-label rl-gdr" => "route-label rl-gdr halo",
        "route-label rl-gds" => "route-label rl-gds halo",
        "smp-label" => "smp-label halo",
        other => {
            debug_assert!(other.ends_with(HALO), "class {other} has no halo variant");
            other
        }
    }
}

/// About how wide a drawing of `devices` boxes in a row is, px (for messages).
pub fn width_of(devices: usize) -> usize {
    devices * 110
}

/// Why the machine of `m` is not drawn: more GPUs, NICs and NVMe than
/// [`crate::MAX_DRAWN_DEVICES`], in words, with the pairs counted per class; `None` when it
/// is drawn.
pub fn not_drawn(m: &Machine) -> Option<String> {
    let devices = m.matrix_devices();
    if devices.len() <= crate::MAX_DRAWN_DEVICES {
        return None;
    }
    let counts = m.pair_counts(&devices);
    Some(format!(
        "Not drawn: {}, more than the {} GPUs, NICs and NVMe gdpath draws (the drawing would be \
         some {} px wide). Their {} pairs by class: {}. `gdpath topo` lists the devices.",
        summary(m),
        crate::MAX_DRAWN_DEVICES,
        width_of(devices.len()),
        counts.pairs,
        counts.classes_text()
    ))
}

/// `8 GPUs, 4 NICs, 0 NVMe on 2 NUMA nodes (nccl-xml)`.
pub fn summary(m: &Machine) -> String {
    let numa = m
        .numa_nodes
        .iter()
        .filter(|n| !n.cpus.is_empty())
        .count()
        .max(1);
    format!(
        "{} GPU{}, {} NIC{}, {} NVMe on {numa} NUMA node{} ({})",
        m.gpus().count(),
        plural(m.gpus().count()),
        m.nics().count(),
        plural(m.nics().count()),
        m.nvmes().count(),
        plural(numa),
        m.source
    )
}

fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// The legend at (`x`, `y`): SVG, labels, bounds.
fn legend(x: f64, y: f64) -> (String, Vec<Text>, Rect) {
    let mut svg = String::new();
    let mut texts = vec![Text::new(
        x,
        y + 11.0,
        FONT,
        "Paths and links",
        "panel-title",
    )];
    let mut yy = y + 30.0;
    let sample = |svg: &mut String, class: &str, yy: f64| {
        let _ = write!(
            svg,
            "<path class=\"{class}\" d=\"M{} {} H{}\"/>",
            num(x),
            num(yy - 4.0),
            num(x + 34.0)
        );
    };
    let rows: [(&str, &str); 8] = [
        ("route p2p direct", "P2P  GPU ↔ GPU (NVLink or PCIe)"),
        ("route gdr direct", "GDR  GPU ↔ its nearest RDMA NIC"),
        ("route gds direct", "GDS  GPU ↔ its nearest NVMe (files)"),
        (
            "route gdr direct",
            "solid: the direct path is in use (doctor: ok)",
        ),
        (
            "route gdr staged",
            "red dashes: staged through host memory (unavailable, or a fallback)",
        ),
        (
            "route gdr unknown",
            "dots: not known (facts missing; a replay runs no live checks)",
        ),
        (
            "nv",
            "NV#: # NVLinks between GPUs (directly or through NVSwitches)",
        ),
        (
            "wire down",
            "red line: a PCIe link trained below its maximum",
        ),
    ];
    for (class, text) in rows {
        sample(&mut svg, class, yy);
        texts.push(Text::new(x + 44.0, yy, SMALL, text, "legend-t"));
        yy += 17.0;
    }
    texts.push(Text::new(
        x + 44.0,
        yy,
        SMALL,
        "▲ on a path or cell: direct but degraded (slow link, ACS, across sockets)",
        "legend-t",
    ));
    yy += 17.0;
    for (t, c) in [
        ("Gen4 x16", "link"),
        ("≤Gen4 x16", "link-cap"),
        ("Gen3 x8↓Gen4 x16", "link-down"),
    ] {
        texts.push(Text::new(x, yy, SMALL, t, c));
        let what = match c {
            "link" => "link as trained",
            "link-cap" => "capable of (how it trained is not in the source)",
            _ => "trained below its maximum",
        };
        texts.push(Text::new(x + 120.0, yy, SMALL, what, "legend-t"));
        yy += 15.0;
    }
    let right = texts.iter().map(|t| t.rect().right()).fold(x, f64::max);
    (svg, texts, Rect::new(x, y, right - x, yy - y))
}

/// What the drawing leaves out or cannot show, one line each.
fn notes(m: &Machine, lay: &Layout, routes: &[Route], gpus: usize) -> Vec<String> {
    let mut v = vec![format!(
        "Drawn: {} GPU{}, {} NIC{}, {} NVMe; {} bridge{} above them (switches as boxes, the rest \
         folded into the link below them); not drawn: {} other PCI function{}.",
        gpus,
        plural(gpus),
        m.nics().count(),
        plural(m.nics().count()),
        m.nvmes().count(),
        lay.bridges,
        plural(lay.bridges),
        lay.undrawn,
        plural(lay.undrawn)
    )];
    if gpus > gdpath_doctor::PER_PAIR_GPUS {
        v.push(format!(
            "P2P: {} pairs, counted by class rather than drawn one by one (more than {} GPUs).",
            gpus * (gpus - 1) / 2,
            gdpath_doctor::PER_PAIR_GPUS
        ));
    } else if gpus > P2P_LINES_MAX_GPUS {
        v.push(format!(
            "P2P: {} pairs, shown in the matrix rather than as lines across the tree (a line for \
             a single pair only).",
            gpus * (gpus - 1) / 2
        ));
    }
    if lay.nvlink_undrawn > 0 {
        v.push(format!(
            "NVLink: {} connections that are not all to all, more than the {} drawn as \
             brackets; the matrix gives each pair's NV#.",
            lay.nvlink_undrawn,
            crate::nvlink::MAX_BRACKETS
        ));
    }
    if routes.iter().any(|r| r.area == Area::Gdr && !r.rdma) {
        v.push(
            "GDR: no RDMA NIC — drawn to the nearest NIC, through which network data goes by host \
             memory."
                .to_owned(),
        );
    } else if gpus > 0 && m.nics().next().is_none() {
        v.push("GDR: the source lists no NIC.".to_owned());
    }
    if gpus > 0 && m.nvmes().next().is_none() {
        v.push(
            "GDS: the source lists no NVMe drive: files on other devices reach the GPU through \
             host memory (cuFile's compatibility mode)."
                .to_owned(),
        );
    }
    if gpus == 0 {
        v.push("No GPU in the source: no GPUDirect path to draw.".to_owned());
    }
    if !m.tree_known {
        v.push("The source has no PCI tree: devices are grouped by NUMA node only.".to_owned());
    }
    v
}
