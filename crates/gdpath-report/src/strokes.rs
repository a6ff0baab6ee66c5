//! Which parts of each route's line are stroked: routes that look alike and share a lane lie on
//! top of one another, and two dashed lines over each other with their dashes out of step read
//! as a solid one. So each stretch is stroked once, by the first route that runs it; a later
//! route strokes only what no look-alike has (its line runs on as subpaths, so dashes start
//! afresh where it leaves the shared stretch).

use crate::geometry::{dir, P};
use crate::lanes::Look;
use std::collections::BTreeMap;

/// A stroked stretch: on the vertical line x = `at` (or horizontal y = `at`) from `lo` to `hi`.
#[derive(Debug, Clone, Copy)]
struct Stretch {
    vertical: bool,
    at: f64,
    lo: f64,
    hi: f64,
}

/// What of [lo, hi] the stretches on the same line leave uncovered, in increasing order.
fn uncovered(done: &[Stretch], s: Stretch) -> Vec<(f64, f64)> {
    let mut cover: Vec<(f64, f64)> = done
        .iter()
        .filter(|d| d.vertical == s.vertical && (d.at - s.at).abs() < 0.5)
        .map(|d| (d.lo, d.hi))
        .collect();
    cover.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut out = Vec::new();
    let mut from = s.lo;
    for (lo, hi) in cover {
        if hi <= from || lo >= s.hi {
            continue;
        }
        if lo > from + 0.5 {
            out.push((from, lo));
        }
        from = from.max(hi);
    }
    if s.hi > from + 0.5 {
        out.push((from, s.hi));
    }
    out
}

/// The subpaths to stroke for each line (in order), lines of one [`Look`] sharing stretches
/// as the module docs say. A line wholly covered by earlier ones gets none.
pub fn visible(lines: &[(Look, Vec<P>)]) -> Vec<Vec<Vec<P>>> {
    let mut done: BTreeMap<Look, Vec<Stretch>> = BTreeMap::new();
    let mut out = Vec::new();
    for (look, pts) in lines {
        let done = done.entry(*look).or_default();
        let mut subpaths: Vec<Vec<P>> = Vec::new();
        let mut cur: Vec<P> = Vec::new();
        for w in pts.windows(2) {
            let (a, b) = (w[0], w[1]);
            let (sx, sy) = dir(a, b);
            if (sx != 0) == (sy != 0) {
                // Diagonal or empty: not shared, stroked as it is.
                extend(&mut cur, &mut subpaths, a, b);
                continue;
            }
            let vertical = sx == 0;
            let (at, p, q) = if vertical {
                (a.0, a.1, b.1)
            } else {
                (a.1, a.0, b.0)
            };
            let s = Stretch {
                vertical,
                at,
                lo: p.min(q),
                hi: p.max(q),
            };
            let mut parts = uncovered(done, s);
            if p > q {
                parts = parts.into_iter().rev().map(|(x, y)| (y, x)).collect();
            }
            let point = |v: f64| if vertical { (at, v) } else { (v, at) };
            for (u, v) in parts {
                if (u - p).abs() > 0.01 {
                    flush(&mut cur, &mut subpaths);
                }
                extend(&mut cur, &mut subpaths, point(u), point(v));
                if (v - q).abs() > 0.01 {
                    flush(&mut cur, &mut subpaths);
                }
            }
            if cur
                .last()
                .is_some_and(|l| (l.0 - b.0).abs() + (l.1 - b.1).abs() > 0.01)
            {
                flush(&mut cur, &mut subpaths);
            }
            done.push(s);
        }
        flush(&mut cur, &mut subpaths);
        out.push(subpaths);
    }
    out
}

/// Continues the open subpath with a → b, or starts one when it ends elsewhere.
fn extend(cur: &mut Vec<P>, subpaths: &mut Vec<Vec<P>>, a: P, b: P) {
    let joins = cur
        .last()
        .is_some_and(|l| (l.0 - a.0).abs() + (l.1 - a.1).abs() < 0.01);
    if !joins {
        flush(cur, subpaths);
        cur.push(a);
    }
    cur.push(b);
}

fn flush(cur: &mut Vec<P>, subpaths: &mut Vec<Vec<P>>) {
    if cur.len() >= 2 {
        subpaths.push(std::mem::take(cur));
    } else {
        cur.clear();
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_shared_stretch_is_stroked_once() {
        let red = (0, 0);
        // Two paths up the same line from different heights, then on to different ends.
        let a = vec![(0.0, 100.0), (0.0, 0.0), (50.0, 0.0)];
        let b = vec![(0.0, 60.0), (0.0, 0.0), (-50.0, 0.0)];
        let v = visible(&[(red, a.clone()), (red, b.clone())]);
        assert_eq!(v[0], vec![a.clone()]);
        // b's climb is a's: only its own turn is stroked.
        assert_eq!(v[1], vec![vec![(0.0, 0.0), (-50.0, 0.0)]]);
        // A path that looks different strokes everything.
        let v = visible(&[(red, a), ((1, 3), b.clone())]);
        assert_eq!(v[1], vec![b]);
        // Wholly covered: nothing.
        let c = vec![(0.0, 50.0), (0.0, 10.0)];
        let v = visible(&[(red, vec![(0.0, 100.0), (0.0, 0.0)]), (red, c)]);
        assert!(v[1].is_empty());
        // A gap in the middle: two subpaths, dashes afresh after the shared part.
        let v = visible(&[
            (red, vec![(0.0, 40.0), (0.0, 20.0)]),
            (red, vec![(0.0, 60.0), (0.0, 0.0)]),
        ]);
        assert_eq!(
            v[1],
            vec![
                vec![(0.0, 60.0), (0.0, 40.0)],
                vec![(0.0, 20.0), (0.0, 0.0)]
            ]
        );
    }
}
