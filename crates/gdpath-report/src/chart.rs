//! Bandwidth against transfer size, one chart per bench document: the size axis logarithmic
//! (powers of two), the bandwidth axis linear from zero, a line per measured path with its
//! min–max band, and a dashed line at each link limit the rows carry.
//!
//! Drawn here rather than with a plotting crate: plotters, the usual choice, has had no
//! release since 0.3.7 (September 2024), and its SVG backend either estimates text widths
//! crudely (no font feature) or links font-kit with the system's fontconfig and FreeType (the
//! `ttf` feature) to measure them; these charts need the same labels of known width as the
//! machine drawing (direct labels at the line ends, nudged apart, instead of a legend box), the
//! report's path colours, and tooltips — a hundred lines on top of [`crate::svg`].
//!
//! The x of a row is its `block` (bytes per I/O or per copy: the copy size of the GPU benches,
//! the message size of `bench net`, the I/O size of `bench storage`). Rows of one path at one
//! size from several GPUs or pairs are one point: the median of their medians, the band from
//! the lowest minimum to the highest maximum, and the label says how many were pooled.

use crate::results::{rate, BenchDoc};
use crate::svg::{esc, num, polyline_d, Anchor, Text};
use gdpath::units::format_size;
use std::collections::BTreeMap;
use std::fmt::Write as _;

const W: f64 = 620.0;
const H: f64 = 300.0;
const LEFT: f64 = 58.0;
const RIGHT: f64 = 190.0;
const TOP: f64 = 30.0;
const BOTTOM: f64 = 42.0;
const SIZE: f64 = 10.0;

/// A measured path: its points (size, median, min, max) in size order.
struct Series {
    name: String,
    points: Vec<(u64, f64, f64, f64)>,
    pooled: usize,
}

/// The colour of a path, by what it is: P2P blue, staged red (the path through host memory),
/// GDS orange, host↔GPU copies grey, file↔host teal, the rest from a small palette.
fn colour(name: &str, i: usize) -> &'static str {
    const PALETTE: [&str; 6] = [
        "#7c3aed", "#0891b2", "#65a30d", "#db2777", "#92400e", "#475569",
    ];
    if name.starts_with("p2p-") {
        if name.ends_with("-bidir") {
            "#1e40af"
        } else {
            "#2563eb"
        }
    } else if name.starts_with("staged") {
        "#dc2626"
    } else if name.starts_with("gds") {
        "#ea580c"
    } else if name.contains("pinned") {
        "#111827"
    } else if name.contains("pageable") {
        "#6b7280"
    } else if name.starts_with("posix-direct") {
        "#0f766e"
    } else if name.starts_with("read-loop") || name.contains("buffered") {
        "#a16207"
    } else {
        PALETTE[i % PALETTE.len()]
    }
}

/// Size → the (median, min, max) of each row at that size.
type BySize = BTreeMap<u64, Vec<(f64, f64, f64)>>;

fn series_of(doc: &BenchDoc) -> Vec<Series> {
    // (path, op) → size → rows' (median, min, max), and how many rows per size.
    let mut by: BTreeMap<(String, String), BySize> = BTreeMap::new();
    for r in doc.rows.iter().filter(|r| r.block > 0 && r.verified) {
        by.entry((r.path.clone(), r.op.clone()))
            .or_default()
            .entry(r.block)
            .or_default()
            .push((r.gbps_median, r.gbps_min, r.gbps_max));
    }
    let ops: std::collections::BTreeSet<&String> = by.keys().map(|(_, o)| o).collect();
    let several_ops = ops.len() > 1;
    by.into_iter()
        .map(|((path, op), sizes)| {
            let pooled = sizes.values().map(Vec::len).max().unwrap_or(1);
            let points = sizes
                .into_iter()
                .map(|(s, v)| {
                    let mut med: Vec<f64> = v.iter().map(|x| x.0).collect();
                    med.sort_by(f64::total_cmp);
                    let m = if med.len() % 2 == 1 {
                        med[med.len() / 2]
                    } else {
                        (med[med.len() / 2 - 1] + med[med.len() / 2]) / 2.0
                    };
                    let lo = v.iter().map(|x| x.1).fold(f64::MAX, f64::min);
                    let hi = v.iter().map(|x| x.2).fold(0.0, f64::max);
                    (s, m, lo.min(m), hi.max(m))
                })
                .collect();
            let name = if several_ops {
                format!("{path} {op}")
            } else {
                path
            };
            Series {
                name,
                points,
                pooled,
            }
        })
        .collect()
}

/// A "nice" step for about `n` ticks over `0..max`.
fn nice_step(max: f64, n: f64) -> f64 {
    let raw = (max / n).max(1e-9);
    let p = 10f64.powf(raw.log10().floor());
    [1.0, 2.0, 2.5, 5.0, 10.0]
        .iter()
        .map(|m| m * p)
        .find(|s| *s >= raw)
        .unwrap_or(10.0 * p)
}

/// The chart of one document: SVG (with its labels' boxes, for checking) or `None` when no
/// verified row has a size.
pub fn chart(doc: &BenchDoc) -> Option<(String, Vec<Text>)> {
    let series = series_of(doc);
    if series.is_empty() {
        return None;
    }
    let sizes: Vec<u64> = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.0))
        .collect();
    let (smin, smax) = (*sizes.iter().min()? as f64, *sizes.iter().max()? as f64);
    let (l0, l1) = (
        smin.log2().floor(),
        smax.log2().ceil().max(smin.log2().floor() + 1.0),
    );
    let mut limits: BTreeMap<u64, Vec<String>> = BTreeMap::new();
    for r in doc.rows.iter().filter(|r| r.verified && r.block > 0) {
        if let Some(l) = r.limit_gbps {
            let key = (l * 100.0).round() as u64;
            let names = limits.entry(key).or_default();
            if !names.contains(&r.path) {
                names.push(r.path.clone());
            }
        }
    }
    let ymax_data = series
        .iter()
        .flat_map(|s| s.points.iter().map(|p| p.3))
        .chain(limits.keys().map(|k| *k as f64 / 100.0))
        .fold(0.0, f64::max)
        .max(1e-6);
    let step = nice_step(ymax_data * 1.05, 5.0);
    let ymax = (ymax_data * 1.05 / step).ceil() * step;
    let (px0, px1, py0, py1) = (LEFT, W - RIGHT, TOP, H - BOTTOM);
    let xs = |s: f64| px0 + (s.log2() - l0) / (l1 - l0) * (px1 - px0);
    let ys = |v: f64| py1 - v / ymax * (py1 - py0);
    let mut o = String::new();
    let mut texts: Vec<Text> = Vec::new();
    let _ = write!(
        o,
        "<svg xmlns=\"http://www.w3.org/2000/svg\" class=\"chart\" width=\"{W}\" height=\"{H}\" \
         viewBox=\"0 0 {W} {H}\" role=\"img\" aria-label=\"{}\">",
        esc(&format!("GB/s against size: {}", doc.command))
    );
    // Grid and axes.
    let mut v = 0.0;
    while v <= ymax + step / 2.0 {
        let y = ys(v);
        let _ = write!(
            o,
            "<path class=\"grid\" d=\"M{} {} H{}\"/>",
            num(px0),
            num(y),
            num(px1)
        );
        texts.push(
            Text::new(px0 - 6.0, y + 3.5, SIZE, rate_tick(v, step), "tick").anchored(Anchor::End),
        );
        v += step;
    }
    let n = (l1 - l0) as usize;
    let every = n.div_ceil(8).max(1);
    for k in (0..=n).step_by(every) {
        let s = 2f64.powf(l0 + k as f64);
        let x = xs(s);
        let _ = write!(
            o,
            "<path class=\"grid\" d=\"M{} {} V{}\"/>",
            num(x),
            num(py0),
            num(py1)
        );
        texts.push(
            Text::new(x, py1 + 14.0, SIZE, format_size(s as u64), "tick").anchored(Anchor::Middle),
        );
    }
    let _ = write!(
        o,
        "<path class=\"axis\" d=\"M{} {} V{} H{}\"/>",
        num(px0),
        num(py0),
        num(py1),
        num(px1)
    );
    texts.push(Text::new(
        px0,
        py0 - 12.0,
        SIZE,
        "GB/s (median of runs)",
        "axis-t",
    ));
    if limits.is_empty() {
        texts.push(
            Text::new(
                px1,
                py0 - 12.0,
                SIZE,
                "no link limit in these rows",
                "axis-t",
            )
            .anchored(Anchor::End),
        );
    }
    texts.push(
        Text::new(
            (px0 + px1) / 2.0,
            H - 8.0,
            SIZE,
            "size per I/O or copy (log scale)",
            "axis-t",
        )
        .anchored(Anchor::Middle),
    );
    // Line-end labels, nudged apart vertically; each in its line's colour, inline (a page has
    // several charts, and a style sheet's rule would reach all of them).
    let mut ends: Vec<(f64, String, &'static str, Option<&'static str>)> = Vec::new();
    for (val, names) in &limits {
        let g = *val as f64 / 100.0;
        let y = ys(g);
        let _ = write!(
            o,
            "<path class=\"limit\" d=\"M{} {} H{}\"><title>{}</title></path>",
            num(px0),
            num(y),
            num(px1),
            esc(&format!(
                "link limit {} GB/s per direction (rows of {})",
                rate(g),
                names.join(", ")
            ))
        );
        let what = if limits.len() == 1 {
            format!("limit {} GB/s", rate(g))
        } else {
            format!("limit {} ({})", rate(g), names[0])
        };
        ends.push((y, what, "limit-t", None));
    }
    for (i, s) in series.iter().enumerate() {
        let c = colour(&s.name, i);
        let band: Vec<(f64, f64)> = s
            .points
            .iter()
            .map(|p| (xs(p.0 as f64), ys(p.3)))
            .chain(s.points.iter().rev().map(|p| (xs(p.0 as f64), ys(p.2))))
            .collect();
        let line: Vec<(f64, f64)> = s.points.iter().map(|p| (xs(p.0 as f64), ys(p.1))).collect();
        let tip = s
            .points
            .iter()
            .map(|p| {
                format!(
                    "{}: {} GB/s (min {}, max {})",
                    format_size(p.0),
                    rate(p.1),
                    rate(p.2),
                    rate(p.3)
                )
            })
            .collect::<Vec<_>>()
            .join("\n");
        let _ = write!(
            o,
            "<g class=\"series\"><title>{}</title><path class=\"band\" style=\"fill:{c}\" d=\"{} Z\"/>\
             <path class=\"line\" style=\"stroke:{c}\" d=\"{}\"/>",
            esc(&format!("{}\n{tip}", s.name)),
            polyline_d(&band),
            polyline_d(&line)
        );
        for (x, y) in &line {
            let _ = write!(
                o,
                "<circle cx=\"{}\" cy=\"{}\" r=\"2.6\" style=\"fill:{c}\"/>",
                num(*x),
                num(*y)
            );
        }
        o.push_str("</g>");
        let name = if s.pooled > 1 {
            format!("{} (×{})", s.name, s.pooled)
        } else {
            s.name.clone()
        };
        let last = line.last().copied().unwrap_or((px1, py1));
        ends.push((last.1, name, "series-t", Some(c)));
    }
    ends.sort_by(|a, b| a.0.total_cmp(&b.0));
    let mut placed: Vec<f64> = Vec::new();
    for (y, ..) in &ends {
        let mut y = (*y + 3.5).max(py0);
        if let Some(&prev) = placed.last() {
            y = y.max(prev + 12.0);
        }
        placed.push(y);
    }
    // Pushed past the bottom: shift the whole column up.
    if let Some(&last) = placed.last() {
        let over = last - (H - 4.0);
        if over > 0.0 {
            for p in &mut placed {
                *p -= over;
            }
        }
    }
    for ((_, name, class, fill), y) in ends.iter().zip(placed) {
        let mut t = Text::new(
            px1 + 8.0,
            y,
            SIZE,
            crate::svg::fit(name, SIZE, RIGHT - 12.0),
            class,
        );
        t.fill = *fill;
        texts.push(t);
    }
    for t in &texts {
        t.write(&mut o);
    }
    o.push_str("</svg>");
    Some((o, texts))
}

fn rate_tick(v: f64, step: f64) -> String {
    if step >= 1.0 {
        format!("{v:.0}")
    } else if step >= 0.1 {
        format!("{v:.1}")
    } else {
        format!("{v:.2}")
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::results::{parse, Origin};

    /// The recorded `bench h2d` document ([`gdpath_testkit::h2d_bench_json`]).
    fn h2d() -> BenchDoc {
        parse(&gdpath_testkit::h2d_bench_json(), Origin::Measured).unwrap()
    }

    #[test]
    fn a_limit_is_a_dashed_line_and_labels_stay_apart() {
        let (svg, texts) = chart(&h2d()).unwrap();
        assert_eq!(svg.matches("class=\"limit\"").count(), 1);
        let names: Vec<&str> = texts.iter().map(|t| t.text.as_str()).collect();
        for want in [
            "h2d-pinned",
            "h2d-pageable",
            "limit 63.0 GB/s",
            "64 MiB",
            "1 GiB",
        ] {
            assert!(names.contains(&want), "{want} not in {names:?}");
        }
        for (i, a) in texts.iter().enumerate() {
            for b in &texts[i + 1..] {
                assert!(
                    !a.rect().overlaps(&b.rect()),
                    "{:?} over {:?}",
                    a.text,
                    b.text
                );
            }
        }
        // The pinned line (54.6 GB/s) ends just below the limit (63.0): its label is nudged
        // clear of the limit's.
        let y = |n: &str| texts.iter().find(|t| t.text == n).unwrap().y;
        assert!((y("limit 63.0 GB/s") - y("h2d-pinned")).abs() >= 12.0);
    }
}
