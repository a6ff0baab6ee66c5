//! Where the figure of a route (a measured rate, a degraded mark) goes: on its own line, as a
//! tag hung on the line up from its GPU just above the GPU's box (a white box with a border and
//! text in its path's colour, over the GPU's own line and lanes and nothing else), so that it
//! reads as that line's even between two GPUs' lines; higher up the line when that spot is
//! taken. A route that does not start by going up (P2P over NVLink) gets its figure beside its
//! line, or below a horizontal run. Never over another line, a box or another label.

use crate::geometry::{dir, CLEAR, HALF_STROKE, P, SMALL};
use crate::svg::{text_rect, text_width, Rect, Text};
use gdpath::finding::Area;

/// Steps between the spots tried along a line, px.
const STEP: f64 = 12.0;

/// The CSS class of a route's label (its path's colour, darker).
pub fn class(area: Area) -> &'static str {
    match area {
        Area::P2p => "route-label rl-p2p",
        Area::Gdr => "route-label rl-gdr",
        _ => "route-label rl-gds",
    }
}

/// Spots (left x, baseline) for a label `w` wide beside the line `pts`, nearest its start
/// first.
fn spots(pts: &[P], w: f64) -> Vec<(f64, f64)> {
    let asc = -text_rect(0.0, 0.0, 0.0, SMALL).y;
    let gap = HALF_STROKE + CLEAR;
    let mut v = Vec::new();
    for s in pts.windows(2) {
        let (a, b) = (s[0], s[1]);
        let (sx, sy) = dir(a, b);
        let len = (b.0 - a.0).abs() + (b.1 - a.1).abs();
        let n = (len / STEP).floor() as usize;
        if sx == 0 && sy != 0 {
            // Beside a vertical run, from its start: on the lane's side first (left going up,
            // right going down), then the other.
            let (first, second) = if sy < 0 {
                (a.0 - gap - w, a.0 + gap)
            } else {
                (a.0 + gap, a.0 - gap - w)
            };
            for k in 0..=n {
                let base = if sy < 0 {
                    a.1 - gap - 1.0 - STEP * k as f64
                } else {
                    a.1 + gap + asc + STEP * k as f64
                };
                v.push((first, base));
                v.push((second, base));
            }
        } else if sy == 0 && sx != 0 {
            // Below a horizontal run (above it are the boxes it runs under), centred on its
            // middle, then further down.
            let mid = (a.0 + b.0) / 2.0;
            for k in 0..4 {
                v.push((mid - w / 2.0, a.1 + gap + asc + STEP * k as f64));
            }
            v.push((mid - w / 2.0, a.1 - gap - 2.5));
        }
    }
    v
}

/// A placed figure: its text, and the tag's box when it hangs on the line.
#[derive(Debug, Clone)]
pub struct Placed {
    /// The figure's label.
    pub text: Text,
    /// The box of the tag the label sits in when it hangs on the line; `None` when it stands beside
    /// it.
    pub tag: Option<Rect>,
}

/// Padding of a tag around its text, px.
const TAG_PAD: (f64, f64) = (3.0, 1.5);
/// Lines this close to a tag's line are its GPU's own (its tree line and lanes).
const OWN_LINE: f64 = 12.0;

/// A tag on the first run of `pts` when it goes up: spots from its start upwards.
fn tag(
    pts: &[P],
    text: &str,
    area: Area,
    boxes: &[Rect],
    lines: &[Rect],
    width: f64,
) -> Option<Placed> {
    let (a, b) = (*pts.first()?, *pts.get(1)?);
    if dir(a, b) != (0, -1) {
        return None;
    }
    let desc = text_rect(0.0, 0.0, 0.0, SMALL).bottom();
    let own = |l: &Rect| l.w < l.h && l.w < 4.0 && (l.cx() - a.0).abs() <= OWN_LINE;
    let others: Vec<&Rect> = lines.iter().filter(|l| !own(l)).collect();
    (0..)
        .map(|k| a.1 - CLEAR - 1.0 - TAG_PAD.1 - desc - STEP * 1.5 * k as f64)
        .take_while(|base| *base - STEP > b.1)
        .find_map(|base| {
            let t =
                Text::new(a.0, base, SMALL, text, class(area)).anchored(crate::svg::Anchor::Middle);
            let r = t.rect();
            let boxed = Rect::new(
                r.x - TAG_PAD.0,
                r.y - TAG_PAD.1,
                r.w + 2.0 * TAG_PAD.0,
                r.h + 2.0 * TAG_PAD.1,
            );
            let grown = boxed.grow(1.0);
            let inside = grown.x >= 0.0 && grown.right() <= width;
            let clear = boxes
                .iter()
                .chain(others.iter().copied())
                .all(|o| !o.overlaps(&grown));
            (inside && clear).then_some(Placed {
                text: t,
                tag: Some(boxed),
            })
        })
}

/// A figure for a route: a tag on its line up from its GPU, else beside its line at the first
/// of [`spots`]; clear of `boxes` (boxes and labels) and of `lines` (but the GPU's own, under
/// a tag), inside the drawing (`width`).
pub fn place(
    pts: &[P],
    text: &str,
    area: Area,
    boxes: &[Rect],
    lines: &[Rect],
    width: f64,
) -> Option<Placed> {
    if let Some(p) = tag(pts, text, area, boxes, lines, width) {
        return Some(p);
    }
    let w = text_width(text, SMALL);
    spots(pts, w).into_iter().find_map(|(x0, base)| {
        let r = text_rect(x0, base, w, SMALL);
        let grown = r.grow(1.0);
        let inside = grown.x >= 0.0 && grown.right() <= width && grown.y >= 0.0;
        let clear = boxes.iter().chain(lines).all(|o| !o.overlaps(&grown));
        (inside && clear).then(|| Placed {
            text: Text::new(x0, base, SMALL, text, class(area)),
            tag: None,
        })
    })
}
