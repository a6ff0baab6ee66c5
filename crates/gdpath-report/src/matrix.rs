//! P2P between every GPU pair as a matrix: one cell per ordered pair, filled by how the doctor
//! judges the pair, with the pair's class (`NV18`, `PIX`, `SYS`) and, when measured, the rate
//! from the row's GPU to the column's. 28 pairs of an 8-GPU machine read at a glance here; as
//! lines across the tree they would not.

use crate::layout::{FONT, SMALL};
use crate::svg::{esc, num, Anchor, Rect, Text};
use gdpath::finding::Area;
use gdpath_doctor::routes::{Route, RouteState};
use std::fmt::Write as _;

const CELL_W: f64 = 64.0;
const CELL_H: f64 = 32.0;
const HEAD_W: f64 = 50.0;

/// A measured rate for an ordered GPU pair (`from`, `to`) in GB/s, and the path it went by.
pub trait PairRates {
    /// The rate to show in the cell (row `from`, column `to`), e.g. `394` or `staged 43`.
    fn pair(&self, from: &str, to: &str) -> Option<String>;
}

/// The matrix drawn at (`x`, `y`): SVG, its labels and its bounds. `None` with fewer than two
/// GPUs.
pub fn draw(
    gpus: &[String],
    routes: &[Route],
    rates: &dyn PairRates,
    x: f64,
    y: f64,
) -> Option<(String, Vec<Text>, Rect)> {
    if gpus.len() < 2 {
        return None;
    }
    let mut svg = String::new();
    let mut texts = vec![Text::new(
        x,
        y + 11.0,
        FONT,
        "P2P between GPU pairs (row → column)",
        "panel-title",
    )];
    let top = y + 22.0;
    let n = gpus.len() as f64;
    for (i, g) in gpus.iter().enumerate() {
        texts.push(
            Text::new(
                x + HEAD_W + CELL_W * (i as f64 + 0.5),
                top + 12.0,
                SMALL,
                g.clone(),
                "mx-head",
            )
            .anchored(Anchor::Middle),
        );
        texts.push(
            Text::new(
                x + HEAD_W - 6.0,
                top + 18.0 + CELL_H * (i as f64 + 0.5) + 3.5,
                SMALL,
                g.clone(),
                "mx-head",
            )
            .anchored(Anchor::End),
        );
    }
    let grid_top = top + 18.0;
    for (i, a) in gpus.iter().enumerate() {
        for (j, b) in gpus.iter().enumerate() {
            let cx = x + HEAD_W + CELL_W * j as f64;
            let cy = grid_top + CELL_H * i as f64;
            let cell = Rect::new(cx + 1.0, cy + 1.0, CELL_W - 2.0, CELL_H - 2.0);
            let mid = cell.cx();
            if i == j {
                let _ = write!(
                    svg,
                    "<rect class=\"mx-self\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/>",
                    num(cell.x),
                    num(cell.y),
                    num(cell.w),
                    num(cell.h)
                );
                texts.push(
                    Text::new(mid, cell.y + 19.0, SMALL, "X", "mx-self-t").anchored(Anchor::Middle),
                );
                continue;
            }
            let r = routes.iter().find(|r| {
                r.area == Area::P2p
                    && ((r.gpu == *a && r.peer == *b) || (r.gpu == *b && r.peer == *a))
            });
            let Some(r) = r else { continue };
            let (class, mark) = match r.state {
                RouteState::Direct => ("mx-direct", ""),
                RouteState::Degraded => ("mx-degraded", "▲ "),
                RouteState::Staged => ("mx-staged", ""),
                RouteState::Unknown => ("mx-unknown", ""),
            };
            let why: Vec<String> = r
                .deciding
                .iter()
                .filter(|_| r.state != RouteState::Direct)
                .take(4)
                .map(|f| format!("{}: {}", f.id, f.evidence))
                .collect();
            let state = crate::routing::state_words(r.state);
            let _ = write!(
                svg,
                "<g class=\"mx-cell\" data-pair=\"{a}-{b}\"><title>{}</title>\
                 <rect class=\"{class}\" x=\"{}\" y=\"{}\" width=\"{}\" height=\"{}\"/></g>",
                esc(&format!(
                    "{a} → {b} ({}): {state}{}{}",
                    r.class,
                    if why.is_empty() { "" } else { "\n" },
                    why.join("\n")
                )),
                num(cell.x),
                num(cell.y),
                num(cell.w),
                num(cell.h)
            );
            let t = format!("{mark}{}", r.class);
            texts.push(
                Text::new(mid, cell.y + 12.0, SMALL, t, format_class(r.state, true))
                    .anchored(Anchor::Middle),
            );
            let second = rates.pair(a, b).unwrap_or_else(|| match r.state {
                RouteState::Direct | RouteState::Degraded => String::new(),
                RouteState::Staged => "staged".to_owned(),
                RouteState::Unknown => "?".to_owned(),
            });
            texts.push(
                Text::new(
                    mid,
                    cell.y + 25.0,
                    SMALL,
                    second,
                    format_class(r.state, false),
                )
                .anchored(Anchor::Middle),
            );
        }
    }
    let right = texts
        .iter()
        .map(|t| t.rect().right())
        .fold(x + HEAD_W + CELL_W * n, f64::max);
    let bounds = Rect::new(x, y, right - x, grid_top + CELL_H * n - y);
    Some((svg, texts, bounds))
}

/// The text class in a cell of a state (white on the filled cells).
fn format_class(s: RouteState, first: bool) -> &'static str {
    match (s, first) {
        (RouteState::Direct, true) => "mx-t-on mx-class",
        (RouteState::Direct, false) => "mx-t-on",
        (RouteState::Degraded, true) => "mx-t-deg mx-class",
        (RouteState::Degraded, false) => "mx-t-deg",
        (RouteState::Staged, true) => "mx-t-staged mx-class",
        (RouteState::Staged, false) => "mx-t-staged",
        (RouteState::Unknown, true) => "mx-t-unknown mx-class",
        (RouteState::Unknown, false) => "mx-t-unknown",
    }
}
