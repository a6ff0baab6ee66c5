//! The paths drawn over the machine: each route follows the tree's lines from the GPU up to
//! where it meets its peer's branch and down again, like a line on a transit map.
//!
//! - A direct path turns at the lowest box both ends hang from: the rail of their PCIe switch
//!   (PIX, PXB), of their host bridge (PHB), of their NUMA node (NODE), or the CPU interconnect
//!   above the NUMA nodes (SYS). P2P over NVLink runs in the NVLink band under the GPUs.
//! - A staged path goes up to the NUMA node and dips into its host-memory strip before coming
//!   down (crossing the interconnect first when the peer is on another node): the traditional
//!   path through host memory, dashed red.
//! - Routes that share a stretch of line in the same direction run side by side: each gets a
//!   lane, an offset to the left of its direction of travel (a path going up runs left of the
//!   tree line, one coming down runs right of it), the lowest lane none of its neighbours
//!   holds. Link labels sit right of lines going up, so a GPU's paths never cross them.

use crate::layout::{Extra, Layout, NodeKind, NvDraw, P, SMALL};
use crate::svg::{text_rect, text_width, Rect, Text};
use gdpath::finding::Area;
use gdpath_doctor::routes::{Route, RouteState};

/// Offset of the first lane from the tree line, and between lanes, px.
const LANE0: f64 = 4.0;
const LANE_STEP: f64 = 3.5;

/// A route as drawn.
#[derive(Debug, Clone)]
pub struct DrawnRoute {
    pub area: Area,
    pub state: RouteState,
    pub gpu: String,
    pub peer: String,
    /// The line, offset into its lane.
    pub points: Vec<P>,
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

/// Lays out the routes over `layout` and places their labels clear of every box and label.
pub fn draw(
    layout: &Layout,
    routes: &[Route],
    labels: &dyn RouteLabels,
) -> (Vec<DrawnRoute>, Vec<Text>, Extra) {
    let gpus = layout
        .nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Gpu)
        .count();
    let mut dips: std::collections::BTreeMap<usize, usize> = Default::default();
    let mut centre: Vec<(&Route, Vec<P>)> = Vec::new();
    for r in routes {
        if r.area == Area::P2p && gpus > P2P_LINES_MAX_GPUS {
            continue;
        }
        let (Some(a), Some(b)) = (layout.device(&r.gpu), layout.device(&r.peer)) else {
            continue;
        };
        let staged = r.state == RouteState::Staged;
        let pts = if r.area == Area::P2p && !staged {
            nvlink_path(&layout.nvlinks, &r.gpu, &r.peer).or_else(|| tree_path(layout, a, b, None))
        } else if staged {
            let numa = top_of(layout, a);
            let slot = dips.entry(numa).or_insert(0);
            *slot += 1;
            tree_path(layout, a, b, Some(*slot - 1))
        } else {
            tree_path(layout, a, b, None)
        };
        if let Some(p) = pts {
            centre.push((r, simplify(p)));
        }
    }
    // Lanes: the lowest lane no earlier route sharing a stretch in the same direction holds.
    let mut lanes: Vec<usize> = Vec::new();
    for i in 0..centre.len() {
        let taken: Vec<usize> = (0..i)
            .filter(|&j| shares(&centre[i].1, &centre[j].1))
            .map(|j| lanes[j])
            .collect();
        lanes.push((0..).find(|k| !taken.contains(k)).unwrap_or(0));
    }
    let room = rail_room(layout, &centre, &lanes);
    let mut obstacles = layout.obstacles();
    let mut texts = Vec::new();
    let mut out = Vec::new();
    for ((r, pts), lane) in centre.into_iter().zip(lanes) {
        let d = LANE0 + LANE_STEP * lane as f64;
        let points = offset(&pts, d);
        if let Some(text) = labels.label(r) {
            if let Some(t) = place_label(&points, &text, &obstacles, layout.width) {
                obstacles.push(t.rect().grow(2.0));
                texts.push(t);
            }
        }
        out.push(DrawnRoute {
            area: r.area,
            state: r.state,
            gpu: r.gpu.clone(),
            peer: r.peer.clone(),
            points,
            title: route_title(r),
        });
    }
    (out, texts, room)
}

/// The room each rail needs below it for the lanes of the paths that run along it: the lane
/// offset plus a clearance above the boxes below, less what the layout gives already.
fn rail_room(layout: &Layout, centre: &[(&Route, Vec<P>)], lanes: &[usize]) -> Extra {
    let mut room = Extra::new();
    for ((_, pts), lane) in centre.iter().zip(lanes) {
        let d = LANE0 + LANE_STEP * *lane as f64;
        for s in pts.windows(2) {
            if (s[0].1 - s[1].1).abs() > 0.01 {
                continue;
            }
            let (x0, x1) = (s[0].0.min(s[1].0), s[0].0.max(s[1].0));
            for r in &layout.rails {
                if (r.y - s[0].1).abs() < 0.5 && x0 < r.x1 + 0.5 && x1 > r.x0 - 0.5 {
                    let key = &layout.nodes[r.node].key;
                    let need = crate::layout::room_needed(d);
                    let e = room.entry(key.clone()).or_insert(0.0);
                    *e = e.max(need);
                }
            }
        }
    }
    room.retain(|_, v| *v > 0.0);
    room
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

/// The centre line between boxes `a` and `b`: direct when `dip` is `None`, else staged through
/// the host memory of `a`'s NUMA node, dipping at that node's `dip`-th slot.
fn tree_path(layout: &Layout, a: usize, b: usize, dip: Option<usize>) -> Option<Vec<P>> {
    let (ua, ub) = (ancestors(layout, a), ancestors(layout, b));
    let (na, nb) = (*ua.last()?, *ub.last()?);
    let mut pts;
    match dip {
        None => {
            if let Some(&lca) = ua.iter().find(|x| ub.contains(x)) {
                pts = climb(layout, a, lca);
                let mut back = climb(layout, b, lca);
                back.reverse();
                pts.extend(back);
            } else {
                pts = climb(layout, a, na);
                pts.extend(cross(layout, na, nb)?);
                let mut back = climb(layout, b, nb);
                back.reverse();
                pts.extend(back);
            }
        }
        Some(slot) => {
            let numa = &layout.nodes[na];
            let (x0, x1) = numa.mem_x;
            let room = ((x1 - x0 - 8.0) / 14.0).max(1.0) as usize;
            let dx = x0 + 4.0 + 14.0 * (slot % room) as f64;
            pts = climb(layout, a, na);
            pts.push((dx, numa.rail_y));
            pts.push((dx, numa.mem_y));
            if na == nb {
                pts.push((dx + 7.0, numa.mem_y));
                pts.push((dx + 7.0, numa.rail_y));
            } else {
                pts.push((numa.through_x, numa.mem_y));
                pts.extend(cross(layout, na, nb)?.into_iter().skip(1));
            }
            let mut back = climb(layout, b, nb);
            back.reverse();
            pts.extend(back);
        }
    }
    Some(pts)
}

/// From NUMA node `na`'s rail over the CPU interconnect to node `nb`'s rail.
fn cross(layout: &Layout, na: usize, nb: usize) -> Option<Vec<P>> {
    let (y, _, _) = layout.smp?;
    let (a, b) = (&layout.nodes[na], &layout.nodes[nb]);
    Some(vec![
        (a.through_x, a.rail_y),
        (a.through_x, y),
        (b.through_x, y),
        (b.through_x, b.rail_y),
    ])
}

/// P2P over NVLink: the band's line between the two GPUs.
fn nvlink_path(nv: &[NvDraw], a: &str, b: &str) -> Option<Vec<P>> {
    nv.iter()
        .flat_map(|d| d.paths.iter())
        .find_map(|(x, y, p)| {
            if x == a && y == b {
                Some(p.clone())
            } else if x == b && y == a {
                Some(p.iter().rev().copied().collect())
            } else {
                None
            }
        })
}

/// Without repeated points and with straight runs merged.
fn simplify(pts: Vec<P>) -> Vec<P> {
    let mut out: Vec<P> = Vec::new();
    for p in pts {
        if out
            .last()
            .is_some_and(|q| (q.0 - p.0).abs() < 0.01 && (q.1 - p.1).abs() < 0.01)
        {
            continue;
        }
        if out.len() >= 2 {
            let (a, b) = (out[out.len() - 2], out[out.len() - 1]);
            let same = (dir(a, b), dir(b, p));
            if same.0 == same.1 {
                out.pop();
            }
        }
        out.push(p);
    }
    out
}

/// The unit direction of a segment, rounded to the axes (the lines are orthogonal).
fn dir(a: P, b: P) -> (i8, i8) {
    let sx = if b.0 > a.0 + 0.01 {
        1
    } else if b.0 < a.0 - 0.01 {
        -1
    } else {
        0
    };
    let sy = if b.1 > a.1 + 0.01 {
        1
    } else if b.1 < a.1 - 0.01 {
        -1
    } else {
        0
    };
    (sx, sy)
}

/// The polyline moved `d` px into its lane: vertical runs to the left of their direction of
/// travel (screen coordinates: left of going up is −x), horizontal runs below the line.
/// Corners meet; a reversal gets a short connector.
pub fn offset(pts: &[P], d: f64) -> Vec<P> {
    if pts.len() < 2 {
        return pts.to_vec();
    }
    // Vertical runs: left of travel; horizontal runs (rails): always below the line, where
    // the layout leaves room ([`rail_room`]), not up into the box above.
    let normal = |a: P, b: P| {
        let (sx, sy) = dir(a, b);
        if sx != 0 {
            (0.0, 1.0)
        } else {
            (f64::from(sy), 0.0)
        }
    };
    let segs: Vec<(P, P, (f64, f64))> = pts
        .windows(2)
        .map(|w| (w[0], w[1], normal(w[0], w[1])))
        .collect();
    let shift = |p: P, n: (f64, f64)| (p.0 + d * n.0, p.1 + d * n.1);
    let mut out = vec![shift(segs[0].0, segs[0].2)];
    for w in segs.windows(2) {
        let ((_, p, n1), (_, _, n2)) = (w[0], w[1]);
        if n1 == n2 {
            out.push(shift(p, n1));
        } else if n1.0 == -n2.0 && n1.1 == -n2.1 {
            out.push(shift(p, n1));
            out.push(shift(p, n2));
        } else {
            // Perpendicular: a vertical segment's x with a horizontal one's y.
            let (a, b) = (shift(p, n1), shift(p, n2));
            let corner = if n1.0 != 0.0 { (a.0, b.1) } else { (b.0, a.1) };
            out.push(corner);
        }
    }
    let (_, last, n) = segs[segs.len() - 1];
    out.push(shift(last, n));
    out
}

/// True when the two centre lines share a stretch travelled in the same direction.
fn shares(a: &[P], b: &[P]) -> bool {
    for s in a.windows(2) {
        for t in b.windows(2) {
            let (ds, dt) = (dir(s[0], s[1]), dir(t[0], t[1]));
            if ds != dt {
                continue;
            }
            let overlap = |a0: f64, a1: f64, b0: f64, b1: f64| {
                let (a0, a1) = (a0.min(a1), a0.max(a1));
                let (b0, b1) = (b0.min(b1), b0.max(b1));
                a0 < b1 - 0.5 && b0 < a1 - 0.5
            };
            let hit = if ds.0 == 0 {
                (s[0].0 - t[0].0).abs() < 0.5 && overlap(s[0].1, s[1].1, t[0].1, t[1].1)
            } else {
                (s[0].1 - t[0].1).abs() < 0.5 && overlap(s[0].0, s[1].0, t[0].0, t[1].0)
            };
            if hit {
                return true;
            }
        }
    }
    false
}

/// A label for a route: beside its first segments (near the GPU), at the first spot clear of
/// `obstacles` and inside the drawing.
fn place_label(pts: &[P], text: &str, obstacles: &[Rect], width: f64) -> Option<Text> {
    let w = text_width(text, SMALL);
    for s in pts.windows(2) {
        let (a, b) = (s[0], s[1]);
        for t in [0.5, 0.3, 0.7, 0.15, 0.85] {
            let (x, y) = (a.0 + (b.0 - a.0) * t, a.1 + (b.1 - a.1) * t);
            let candidates = if (a.0 - b.0).abs() < 0.01 {
                // Beside a vertical segment: left of it, then right.
                vec![(x - 3.0 - w, y + 3.5), (x + 3.0, y + 3.5)]
            } else {
                // Above a horizontal one, then below.
                vec![(x - w / 2.0, y - 3.0), (x - w / 2.0, y + 10.0)]
            };
            for (x0, base) in candidates {
                let r = text_rect(x0, base, w, SMALL).grow(1.0);
                if r.x < 0.0 || r.right() > width || r.y < 0.0 {
                    continue;
                }
                if obstacles.iter().all(|o| !o.overlaps(&r)) {
                    return Some(Text::new(x0, base, SMALL, text, "route-label"));
                }
            }
        }
    }
    None
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn offsets_keep_orthogonal_corners() {
        // Up, right, down (a ⊓): the legs outward, the rail below the line.
        let p = offset(&[(0.0, 10.0), (0.0, 0.0), (10.0, 0.0), (10.0, 10.0)], 2.0);
        assert_eq!(
            p,
            vec![(-2.0, 10.0), (-2.0, 2.0), (12.0, 2.0), (12.0, 10.0)]
        );
        // A reversal gets a connector across the line.
        let p = offset(&[(0.0, 10.0), (0.0, 0.0), (0.0, 10.0)], 2.0);
        assert_eq!(p, vec![(-2.0, 10.0), (-2.0, 0.0), (2.0, 0.0), (2.0, 10.0)]);
        assert_eq!(
            simplify(vec![
                (0.0, 0.0),
                (0.0, 0.0),
                (0.0, 5.0),
                (0.0, 9.0),
                (3.0, 9.0)
            ]),
            vec![(0.0, 0.0), (0.0, 9.0), (3.0, 9.0)]
        );
        assert!(shares(
            &[(0.0, 10.0), (0.0, 0.0)],
            &[(0.0, 5.0), (0.0, -5.0)]
        ));
        assert!(!shares(
            &[(0.0, 10.0), (0.0, 0.0)],
            &[(0.0, 0.0), (0.0, 10.0)]
        ));
    }
}
