//! P2P between every GPU pair as a matrix: one cell per ordered pair, filled by how the doctor
//! judges the pair, with the pair's class (`NV18`, `PIX`, `SYS`) and, when measured, the rate
//! from the row's GPU to the column's. 28 pairs of an 8-GPU machine read at a glance here; as
//! lines across the tree they would not.

use crate::geometry::{FONT, SMALL};
use crate::svg::{esc, num, Anchor, Rect, Text};
use gdpath::finding::Area;
use gdpath_doctor::routes::{Route, RouteState};
use gdpath_topo::Machine;
use std::collections::HashMap;
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
    // Each pair's route, found once (a search per cell made the matrix quartic in the GPUs).
    let by_pair: HashMap<(&str, &str), &Route> = routes
        .iter()
        .filter(|r| r.area == Area::P2p)
        .flat_map(|r| {
            [
                ((r.gpu.as_str(), r.peer.as_str()), r),
                ((r.peer.as_str(), r.gpu.as_str()), r),
            ]
        })
        .collect();
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
            let Some(r) = by_pair.get(&(a.as_str(), b.as_str())).copied() else {
                continue;
            };
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

/// In place of the matrix past [`gdpath_doctor::PER_PAIR_GPUS`] GPUs (where the doctor judges
/// pairs in groups and names the groups in its findings): the GPU pairs counted per class
/// ([`Machine::pair_counts`]), with a line saying why. SVG (none), labels and bounds at
/// (`x`, `y`).
pub fn summary(m: &Machine, x: f64, y: f64) -> (String, Vec<Text>, Rect) {
    let gpus: Vec<&gdpath_topo::Device> = m.gpus().collect();
    let counts = m.pair_counts(&gpus);
    let mut texts = vec![Text::new(
        x,
        y + 11.0,
        FONT,
        "P2P between GPU pairs, by class",
        "panel-title",
    )];
    let mut yy = y + 30.0;
    for line in [
        format!(
            "{} GPUs, more than the {} whose pairs are drawn cell by cell: the doctor judges",
            gpus.len(),
            gdpath_doctor::PER_PAIR_GPUS
        ),
        format!(
            "their {} pairs in groups, which its findings name.",
            counts.pairs
        ),
    ] {
        texts.push(Text::new(x, yy, SMALL, line, "legend-t"));
        yy += 15.0;
    }
    yy += 4.0;
    for (class, n) in &counts.classes {
        texts.push(Text::new(
            x,
            yy,
            SMALL,
            format!("{:<5} {n} pairs", class.to_string()),
            "legend-t",
        ));
        yy += 15.0;
    }
    let right = texts.iter().map(|t| t.rect().right()).fold(x, f64::max);
    (String::new(), texts, Rect::new(x, y, right - x, yy - y))
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
