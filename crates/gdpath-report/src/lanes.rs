//! Lanes: routes that share a stretch of the tree's lines run beside them, each offset into a
//! lane — left of its direction of travel on vertical lines (a path going up runs left of the
//! line, one coming down right of it), below horizontal ones (rails, where the layout leaves
//! room). Routes drawn alike (all staged paths: dashed red; otherwise the same path and state)
//! share a lane where they meet, so a bundle of them is one line, not a braid; routes drawn
//! differently take the lowest lane none of their neighbours holds.

use crate::geometry::{dir, NodeKind, CLEAR, HALF_STROKE, P};
use crate::layout::{self, Extra, Layout};

/// Offset of the first lane from the tree line, and between lanes, px.
pub const LANE0: f64 = 4.0;
/// Distance between adjacent lanes, px.
pub const LANE_STEP: f64 = 3.5;
/// How a route looks: routes that look alike may share a lane and one stroke.
pub type Look = (u8, u8);

/// The offset of lane `k`, px.
pub fn offset_of(lane: usize) -> f64 {
    LANE0 + LANE_STEP * lane as f64
}

/// The lane of each centre line: the lane of an earlier look-alike it shares a stretch with,
/// when no other route there holds it; else the lowest lane free of the routes it shares with.
pub fn assign(lines: &[(Look, Vec<P>)]) -> Vec<usize> {
    let mut lanes: Vec<usize> = Vec::new();
    for (i, (look, pts)) in lines.iter().enumerate() {
        let mut taken = Vec::new();
        let mut friends = Vec::new();
        for (j, (other, q)) in lines[..i].iter().enumerate() {
            if shares(pts, q) {
                if other == look {
                    friends.push(lanes[j]);
                } else {
                    taken.push(lanes[j]);
                }
            }
        }
        let lane = friends
            .into_iter()
            .find(|l| !taken.contains(l))
            .unwrap_or_else(|| (0..).find(|k| !taken.contains(k)).unwrap_or(0));
        lanes.push(lane);
    }
    lanes
}

/// Without repeated points and with straight runs merged.
pub fn simplify(pts: Vec<P>) -> Vec<P> {
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
            if dir(a, b) == dir(b, p) {
                out.pop();
            }
        }
        out.push(p);
    }
    out
}

/// The polyline moved `d` px into its lane (see the module docs). Corners meet; a reversal
/// gets a short connector across the line.
pub fn offset(pts: &[P], d: f64) -> Vec<P> {
    if pts.len() < 2 {
        return pts.to_vec();
    }
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

fn overlap(a0: f64, a1: f64, b0: f64, b1: f64) -> bool {
    let (a0, a1) = (a0.min(a1), a0.max(a1));
    let (b0, b1) = (b0.min(b1), b0.max(b1));
    a0 < b1 - 0.5 && b0 < a1 - 0.5
}

/// True when the two centre lines share a stretch where their lanes would meet: a vertical
/// one travelled in the same direction (opposite directions run on opposite sides), or any
/// horizontal one (both run below it).
pub fn shares(a: &[P], b: &[P]) -> bool {
    a.windows(2).any(|s| {
        b.windows(2).any(|t| {
            let (ds, dt) = (dir(s[0], s[1]), dir(t[0], t[1]));
            if ds.0 == 0 && dt.0 == 0 {
                ds == dt && (s[0].0 - t[0].0).abs() < 0.5 && overlap(s[0].1, s[1].1, t[0].1, t[1].1)
            } else if ds.1 == 0 && dt.1 == 0 {
                (s[0].1 - t[0].1).abs() < 0.5 && overlap(s[0].0, s[1].0, t[0].0, t[1].0)
            } else {
                false
            }
        })
    })
}

/// The room the lanes need in the next layout ([`Extra`]): under each rail and the CPU
/// interconnect for the lanes along it, right of a link label's line for the lanes coming
/// down it, and left of a NUMA node's interconnect line for the lanes going up it.
pub fn room(layout: &Layout, lines: &[(Look, Vec<P>)], lanes: &[usize]) -> Extra {
    let mut room = Extra::new();
    let mut need = |key: String, v: f64| {
        let e = room.entry(key).or_insert(0.0);
        *e = e.max(v);
    };
    for ((_, pts), lane) in lines.iter().zip(lanes) {
        let d = offset_of(*lane);
        for s in pts.windows(2) {
            let (a, b) = (s[0], s[1]);
            match dir(a, b) {
                (_, 0) => {
                    for r in &layout.rails {
                        if (r.y - a.1).abs() < 0.5
                            && a.0.min(b.0) < r.x1 + 0.5
                            && a.0.max(b.0) > r.x0 - 0.5
                        {
                            need(layout.nodes[r.node].key.clone(), layout::room_needed(d));
                        }
                    }
                    if layout.smp.is_some_and(|(y, _, _)| (y - a.1).abs() < 0.5) {
                        need(layout::SMP_KEY.to_owned(), layout::smp_room_needed(d));
                    }
                }
                (0, sy) => {
                    for n in &layout.nodes {
                        let Some(&(x, y1)) = n.up.first() else {
                            continue;
                        };
                        let on_line = (x - a.0).abs() < 0.5
                            && overlap(a.1, b.1, y1, n.up.last().map_or(y1, |p| p.1));
                        if !on_line {
                            continue;
                        }
                        if sy > 0 && n.link.is_some() && n.kind != NodeKind::Numa {
                            let past = d + HALF_STROKE + CLEAR - layout::LINK_LABEL_GAP;
                            need(layout::right_key(&n.key), past);
                        }
                        if sy < 0 && n.kind == NodeKind::Numa {
                            need(layout::cpu_key(&n.key), d + HALF_STROKE + CLEAR);
                        }
                    }
                }
                _ => {}
            }
        }
    }
    room.retain(|_, v| *v > 0.0);
    room
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
    }

    #[test]
    fn look_alikes_share_a_lane_others_take_the_next() {
        // Vertical: the same direction shares, the opposite does not (other side of the line).
        assert!(shares(
            &[(0.0, 10.0), (0.0, 0.0)],
            &[(0.0, 5.0), (0.0, -5.0)]
        ));
        assert!(!shares(
            &[(0.0, 10.0), (0.0, 0.0)],
            &[(0.0, 0.0), (0.0, 10.0)]
        ));
        // Horizontal: both directions run below the line, so they meet.
        assert!(shares(
            &[(0.0, 0.0), (10.0, 0.0)],
            &[(8.0, 0.0), (2.0, 0.0)]
        ));
        let up = vec![(0.0, 10.0), (0.0, 0.0)];
        let staged = (0, 0);
        let green = (2, 1);
        let lanes = assign(&[
            (staged, up.clone()),
            (staged, up.clone()),
            (green, up.clone()),
            (staged, up),
        ]);
        assert_eq!(lanes, vec![0, 0, 1, 0]);
    }
}
