//! The paths drawn over the machine: each route follows the tree's lines from the GPU up to
//! where it meets its peer's branch and down again, like a line on a transit map.
//!
//! - A direct path turns at the lowest box both ends hang from: the rail of their PCIe switch
//!   (PIX, PXB), of their host bridge (PHB), of their NUMA node (NODE), or the CPU interconnect
//!   above the NUMA nodes (SYS). P2P over NVLink runs just inside the NVLink band's line.
//! - A staged path goes up to its NUMA node and into the host-memory strip by the node's own
//!   line (its drop), and back down the same line; every staged path of a node takes that one
//!   way in, so they make one arch in the strip, not a loop each. A staged path to another
//!   node runs on through the strip to the node's interconnect line, across, and into the
//!   other node's strip, down its drop. A direct path across nodes passes the node's box at
//!   the top of the strip.
//! - A path is drawn across the interconnect only where the source says it crosses: the pair
//!   is SYS, or both NUMA nodes are known. A device the source places nowhere (a NIC of an
//!   `nvidia-smi` text with no class to a GPU that says where) gets no line to it.
//! - Beside shared lines the routes run in lanes ([`crate::lanes`]), look-alikes stroked once
//!   ([`crate::strokes`]); the layout leaves room for the lanes ([`crate::layout::Extra`]), so
//!   no line runs over a label. Measured figures go beside their own line
//!   ([`crate::route_labels`]).

use crate::geometry::{self, NodeKind, HALF_STROKE, P};
use crate::lanes::{self, Look};
use crate::layout::{Extra, Layout, NvDraw};
use crate::route_labels;
use crate::svg::Rect;
use gdpath::finding::Area;
use gdpath_doctor::routes::{Route, RouteState};
use gdpath_topo::LinkClass;

/// A route as drawn.
#[derive(Debug, Clone)]
pub struct DrawnRoute {
    /// The data path drawn (P2P, GDR or GDS).
    pub area: Area,
    /// The doctor's state of the route, which sets how it is drawn.
    pub state: RouteState,
    /// The GPU's id (`GPU0`).
    pub gpu: String,
    /// The peer's id: a GPU, a NIC or an NVMe controller.
    pub peer: String,
    /// The line, offset into its lane.
    pub points: Vec<P>,
    /// The parts of it to stroke (the rest is stroked by a look-alike route under it); empty
    /// when all of it is.
    pub strokes: Vec<Vec<P>>,
    /// Tooltip: what the path is and what decided its state.
    pub title: String,
}

/// The figure to put on a route (a measured rate, a degraded mark), by route.
pub trait RouteLabels {
    /// The text for the route, or `None`.
    fn label(&self, r: &Route) -> Option<String>;
}

/// P2P is drawn as a line over the machine only for a single pair (two GPUs): with three GPUs
/// the pairs' staged paths already tangle over the tree, and the matrix shows every pair.
pub const P2P_LINES_MAX_GPUS: usize = 2;

/// How far a P2P line over NVLink runs inside the band's line, px.
const NV_INSET: f64 = 7.0;

/// The routes as drawn, their labels, the room their lanes need, and the routes not drawn.
pub struct Drawn {
    /// The routes drawn.
    pub routes: Vec<DrawnRoute>,
    /// The routes' figures.
    pub texts: Vec<route_labels::Placed>,
    /// The extra room around the tree that the routes' lanes need.
    pub room: Extra,
    /// `GDR GPU0 ↔ NIC3` for each route not drawn because the source does not place its peer.
    pub unplaced: Vec<String>,
}

/// How a route looks: all staged paths alike (dashed red), else by path and state.
fn look(r: &Route) -> Look {
    let area = match r.area {
        Area::P2p => 1,
        Area::Gdr => 2,
        _ => 3,
    };
    match r.state {
        RouteState::Staged => (0, 0),
        RouteState::Direct => (area, 1),
        RouteState::Degraded => (area, 2),
        RouteState::Unknown => (area, 3),
    }
}

/// Lays out the routes over `layout` and places their labels clear of every line, box and
/// label.
pub fn draw(layout: &Layout, routes: &[Route], labels: &dyn RouteLabels) -> Drawn {
    let gpus = layout
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Gpu)
        .count();
    // Centre lines: in the tree (lanes to come), or fixed (P2P inside the NVLink band).
    let mut tree: Vec<(&Route, Look, Vec<P>)> = Vec::new();
    let mut fixed: Vec<(&Route, Vec<P>)> = Vec::new();
    let mut unplaced = Vec::new();
    for r in routes {
        if r.area == Area::P2p && gpus > P2P_LINES_MAX_GPUS {
            continue;
        }
        let (Some(a), Some(b)) = (layout.device(&r.gpu), layout.device(&r.peer)) else {
            continue;
        };
        let staged = r.state == RouteState::Staged;
        if r.area == Area::P2p && !staged {
            if let Some(p) = nvlink_path(&layout.nvlinks, &r.gpu, &r.peer) {
                fixed.push((r, p));
                continue;
            }
        }
        let cross = crossing_stated(layout, r, a, b);
        match tree_path(layout, a, b, staged, cross) {
            Some(p) => tree.push((r, look(r), lanes::simplify(p))),
            None => unplaced.push(format!(
                "{} {} ↔ {}",
                crate::findings::area_name(r.area),
                r.gpu,
                r.peer
            )),
        }
    }
    let centre: Vec<(Look, Vec<P>)> = tree.iter().map(|(_, l, p)| (*l, p.clone())).collect();
    let lane = lanes::assign(&centre);
    let room = lanes::room(layout, &centre, &lane);
    let mut laid: Vec<(&Route, Look, Vec<P>)> = tree
        .iter()
        .zip(&lane)
        .map(|((r, l, p), k)| (*r, *l, lanes::offset(p, lanes::offset_of(*k))))
        .collect();
    laid.extend(fixed.into_iter().map(|(r, p)| (r, look(r), p)));
    let strokes = crate::strokes::visible(
        &laid
            .iter()
            .map(|(_, l, p)| (*l, p.clone()))
            .collect::<Vec<_>>(),
    );
    // Labels: clear of boxes, labels, the tree's lines and every stroke.
    let mut boxes = layout.obstacles();
    let mut lines: Vec<Rect> = layout
        .lines()
        .iter()
        .map(|s| geometry::seg_rect(s, 1.6))
        .collect();
    for subpaths in &strokes {
        for sp in subpaths {
            lines.extend(
                sp.windows(2)
                    .map(|w| geometry::seg_rect(&(w[0], w[1]), HALF_STROKE)),
            );
        }
    }
    let mut texts = Vec::new();
    let mut out = Vec::new();
    for ((r, _, points), strokes) in laid.into_iter().zip(strokes) {
        if let Some(text) = labels.label(r) {
            if let Some(p) =
                route_labels::place(&points, &text, r.area, &boxes, &lines, layout.width)
            {
                boxes.push(p.tag.unwrap_or_else(|| p.text.rect()).grow(2.0));
                texts.push(p);
            }
        }
        out.push(DrawnRoute {
            area: r.area,
            state: r.state,
            gpu: r.gpu.clone(),
            peer: r.peer.clone(),
            points,
            strokes,
            title: route_title(r),
        });
    }
    Drawn {
        routes: out,
        texts,
        room,
        unplaced,
    }
}

/// How a path fares, in words (tooltips).
pub fn state_words(s: RouteState) -> &'static str {
    match s {
        RouteState::Direct => "direct path in use",
        RouteState::Degraded => "direct path in use, degraded",
        RouteState::Staged => "staged through host memory",
        RouteState::Unknown => "not known",
    }
}

/// `P2P GPU0 ↔ GPU1 (NV18): direct — …`.
fn route_title(r: &Route) -> String {
    let mut t = format!(
        "{} {} ↔ {} ({}): {}",
        crate::findings::area_name(r.area),
        r.gpu,
        r.peer,
        r.class,
        state_words(r.state)
    );
    if r.area == Area::Gdr && !r.rdma {
        t.push_str(" — no RDMA NIC: network data goes through host memory");
    }
    let why: Vec<String> = r
        .deciding
        .iter()
        .filter(|_| r.state != RouteState::Direct)
        .take(4)
        .map(|f| format!("{} ({}): {}", f.id, f.subject, f.evidence))
        .collect();
    if !why.is_empty() {
        t.push('\n');
        t.push_str(&why.join("\n"));
    }
    t
}

/// The NUMA node a box hangs from.
fn top_of(layout: &Layout, mut n: usize) -> usize {
    while let Some(p) = layout.nodes[n].parent {
        n = p;
    }
    n
}

fn ancestors(layout: &Layout, mut n: usize) -> Vec<usize> {
    let mut v = vec![n];
    while let Some(p) = layout.nodes[n].parent {
        v.push(p);
        n = p;
    }
    v
}

/// Points from box `n` up to the rail of its ancestor `top` (ending on that rail at the x of
/// the branch it arrives by).
fn climb(layout: &Layout, n: usize, top: usize) -> Vec<P> {
    let mut pts = Vec::new();
    let mut cur = n;
    loop {
        let node = &layout.nodes[cur];
        pts.extend(node.up.iter().copied());
        let Some(p) = node.parent else { break };
        if p == top {
            break;
        }
        let hub = &layout.nodes[p];
        pts.push((hub.through_x, hub.rail_y));
        cur = p;
    }
    pts
}

/// True when the source says the route crosses between NUMA nodes: its pair is SYS, or both
/// ends' nodes are known (not the group of devices the source places nowhere).
fn crossing_stated(layout: &Layout, r: &Route, a: usize, b: usize) -> bool {
    let known = |n: usize| layout.nodes[top_of(layout, n)].key != "numa:?";
    r.class == LinkClass::Sys || (known(a) && known(b))
}

/// The centre line between boxes `a` and `b`: direct, or `staged` through host memory (see
/// the module docs). `None` when they are on different NUMA nodes and `cross` is false.
fn tree_path(layout: &Layout, a: usize, b: usize, staged: bool, cross: bool) -> Option<Vec<P>> {
    let (ua, ub) = (ancestors(layout, a), ancestors(layout, b));
    let (na, nb) = (*ua.last()?, *ub.last()?);
    let mut pts;
    if na == nb && !staged {
        let lca = *ua.iter().find(|x| ub.contains(x))?;
        pts = climb(layout, a, lca);
        let mut back = climb(layout, b, lca);
        back.reverse();
        pts.extend(back);
        return Some(pts);
    }
    if na != nb && !cross {
        return None;
    }
    let (top_a, top_b) = (&layout.nodes[na], &layout.nodes[nb]);
    // Into node a's box by its drop: to the strip (staged) or the top of the strip (passing).
    // A staged path on to another node runs along the strip one lane above its middle, so
    // that in its first lane it meets the arch of the node's own staged paths there.
    let turn = |n: &crate::geometry::Node| match (staged, na == nb) {
        (true, true) => n.mem_y,
        (true, false) => n.mem_y - lanes::LANE0,
        (false, _) => n.pass_y,
    };
    pts = climb(layout, a, na);
    pts.push((top_a.rect.cx(), top_a.rail_y));
    pts.push((top_a.rect.cx(), turn(top_a)));
    if na != nb {
        let (y, _, _) = layout.smp?;
        pts.push((top_a.through_x, turn(top_a)));
        pts.push((top_a.through_x, y));
        pts.push((top_b.through_x, y));
        pts.push((top_b.through_x, turn(top_b)));
        pts.push((top_b.rect.cx(), turn(top_b)));
    }
    pts.push((top_b.rect.cx(), top_b.rail_y));
    let mut back = climb(layout, b, nb);
    back.reverse();
    pts.extend(back);
    Some(pts)
}

/// P2P over NVLink: just inside the band's line between the two GPUs (its legs inward, its
/// run above the band's), clear of the violet line.
fn nvlink_path(nv: &[NvDraw], a: &str, b: &str) -> Option<Vec<P>> {
    let p = nv
        .iter()
        .flat_map(|d| d.paths.iter())
        .find_map(|(x, y, p)| {
            if x == a && y == b {
                Some(p.clone())
            } else if x == b && y == a {
                Some(p.iter().rev().copied().collect())
            } else {
                None
            }
        })?;
    let [(xa, y0), (_, y), (xb, _), _] = p[..] else {
        return Some(p);
    };
    let s = (xb - xa).signum();
    let run = y - (y - y0).signum() * NV_INSET;
    Some(vec![
        (xa + s * NV_INSET, y0),
        (xa + s * NV_INSET, run),
        (xb - s * NV_INSET, run),
        (xb - s * NV_INSET, y0),
    ])
}
