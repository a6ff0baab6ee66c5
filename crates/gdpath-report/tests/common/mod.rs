//! Checks of a report read back from its text, as a browser gets it: it parses as XML, the
//! machine drawing shows every device, and no two labels overlap — label boxes computed from
//! the SVG's own attributes (`x`, `y`, `font-size`, `textLength`, `text-anchor`; the layout sets
//! a `textLength` on every label, so that is the width the browser draws it at).

#![allow(dead_code)]

use gdpath_report::svg::{text_rect, Rect};
use gdpath_topo::{DeviceKind, Machine};
use roxmltree::{Document, Node, ParsingOptions};

/// Parses a report page or an SVG document; panics with the parser's position on failure.
pub fn parse(text: &str) -> Document<'_> {
    let opts = ParsingOptions {
        allow_dtd: true,
        ..Default::default()
    };
    Document::parse_with_options(text, opts).unwrap_or_else(|e| panic!("not well-formed: {e}"))
}

fn f(n: Node, a: &str) -> f64 {
    n.attribute(a)
        .unwrap_or_else(|| panic!("<{}> without {a}", n.tag_name().name()))
        .parse()
        .unwrap_or_else(|e| panic!("{a}: {e}"))
}

/// A label and its box.
#[derive(Debug, Clone)]
pub struct Label {
    pub text: String,
    pub rect: Rect,
}

/// The labels under `root` (every `<text>`), with their boxes.
pub fn labels(root: Node) -> Vec<Label> {
    root.descendants()
        .filter(|n| n.has_tag_name("text"))
        .map(|n| {
            let w = f(n, "textLength");
            let (x, y, size) = (f(n, "x"), f(n, "y"), f(n, "font-size"));
            let x0 = match n.attribute("text-anchor") {
                Some("middle") => x - w / 2.0,
                Some("end") => x - w,
                _ => x,
            };
            Label {
                text: n.text().unwrap_or_default().to_owned(),
                rect: text_rect(x0, y, w, size),
            }
        })
        .collect()
}

/// Panics naming the first two labels under `root` whose boxes overlap, or a label outside
/// the SVG's canvas.
pub fn assert_no_overlap(root: Node, what: &str) {
    let ls = labels(root);
    assert!(!ls.is_empty(), "{what}: no labels at all");
    let canvas = Rect::new(0.0, 0.0, f(root, "width"), f(root, "height"));
    for l in &ls {
        assert!(
            canvas.contains(&l.rect),
            "{what}: label {:?} at {:?} outside the canvas {:?}",
            l.text,
            l.rect,
            canvas
        );
    }
    for (i, a) in ls.iter().enumerate() {
        for b in &ls[i + 1..] {
            assert!(
                !a.rect.overlaps(&b.rect),
                "{what}: labels {:?} {:?} and {:?} {:?} overlap",
                a.text,
                a.rect,
                b.text,
                b.rect
            );
        }
    }
}

/// The machine drawing (`<svg class="machine">`) of a page.
pub fn machine_svg<'a, 'i>(doc: &'a Document<'i>) -> Node<'a, 'i> {
    doc.descendants()
        .find(|n| n.has_tag_name("svg") && n.attribute("class") == Some("machine"))
        .expect("the page has the machine drawing")
}

/// Every GPU, NIC and NVMe of `m` is a box (`data-id`) labelled with its id, with its labels
/// inside the box; every bridge above one of them is named in a `data-pci`; the note counts
/// the PCI functions left out.
pub fn assert_devices_drawn(svg: Node, m: &Machine, what: &str) {
    let mut bridges = Vec::new();
    for d in m
        .devices
        .iter()
        .filter(|d| matches!(d.kind, DeviceKind::Gpu | DeviceKind::Nic | DeviceKind::Nvme))
    {
        let g = svg
            .descendants()
            .find(|n| n.attribute("data-id") == Some(d.id.as_str()))
            .unwrap_or_else(|| panic!("{what}: no box for {}", d.id));
        let rect = g
            .children()
            .find(|n| n.has_tag_name("rect"))
            .expect("a box has a rect");
        let r = Rect::new(
            f(rect, "x"),
            f(rect, "y"),
            f(rect, "width"),
            f(rect, "height"),
        );
        let ls = labels(g);
        assert!(
            ls.iter().any(|l| l.text == d.id),
            "{what}: box of {} is not labelled with its id",
            d.id
        );
        for l in &ls {
            assert!(
                r.contains(&l.rect),
                "{what}: {:?} sticks out of {}'s box",
                l.text,
                d.id
            );
        }
        if m.tree_known {
            bridges.extend(m.ancestors(d).into_iter().map(|b| b.pci.to_string()));
        }
    }
    let named: Vec<&str> = svg
        .descendants()
        .filter_map(|n| n.attribute("data-pci"))
        .flat_map(|a| a.split(' '))
        .collect();
    bridges.sort();
    bridges.dedup();
    for b in &bridges {
        assert!(
            named.contains(&b.as_str()),
            "{what}: bridge {b} not in the drawing"
        );
    }
    let shown = m
        .devices
        .iter()
        .filter(|d| matches!(d.kind, DeviceKind::Gpu | DeviceKind::Nic | DeviceKind::Nvme))
        .count();
    let undrawn = m.devices.len() - shown - bridges.len();
    let note = format!("not drawn: {undrawn} other PCI function");
    assert!(
        labels(svg).iter().any(|l| l.text.contains(&note)),
        "{what}: no note saying {note:?}"
    );
}

/// The straight pieces of an SVG path's `d` (absolute `M`, `L`, `H` and `V` only, as the
/// drawing writes them).
pub fn segments(d: &str) -> Vec<((f64, f64), (f64, f64))> {
    let mut out = Vec::new();
    let mut cur = (0.0, 0.0);
    let mut cmd = 'M';
    let mut nums: Vec<f64> = Vec::new();
    let mut flush = |cmd: char, nums: &mut Vec<f64>, cur: &mut (f64, f64)| {
        let next = match (cmd, nums.as_slice()) {
            ('M', [x, y]) => {
                *cur = (*x, *y);
                None
            }
            ('L', [x, y]) => Some((*x, *y)),
            ('H', [x]) => Some((*x, cur.1)),
            ('V', [y]) => Some((cur.0, *y)),
            (c, n) => panic!("path command {c} with {n:?}"),
        };
        if let Some(p) = next {
            out.push((*cur, p));
            *cur = p;
        }
        nums.clear();
    };
    let arity = |c: char| if matches!(c, 'H' | 'V') { 1 } else { 2 };
    let spaced: String = d
        .chars()
        .flat_map(|c| {
            if "MLHV".contains(c) {
                vec![' ', c, ' ']
            } else {
                vec![c]
            }
        })
        .collect();
    for tok in spaced.split_whitespace() {
        match tok {
            "M" | "L" | "H" | "V" => cmd = tok.chars().next().unwrap(),
            n => {
                nums.push(n.parse().unwrap_or_else(|e| panic!("{n:?} in {d:?}: {e}")));
                if nums.len() == arity(cmd) {
                    flush(cmd, &mut nums, &mut cur);
                    // Numbers after a move continue as lines.
                    if cmd == 'M' {
                        cmd = 'L';
                    }
                }
            }
        }
    }
    out
}

/// Half the stroke width of a drawn line, by its class (the drawing's style sheet).
fn half_stroke(class: &str) -> f64 {
    let has = |c: &str| class.split(' ').any(|x| x == c);
    if has("nv") {
        1.6
    } else if has("smp") {
        1.5
    } else if has("route") {
        1.3
    } else if has("down") {
        1.1
    } else {
        0.75
    }
}

/// Panics naming the first label under `root` that a drawn line runs over: every `<path>`
/// (paths, NVLink, the tree's lines, legend samples) against every label not inside a box (a
/// device or hub box, or the tag of a measured figure hung on its GPU's line: each is drawn
/// over the lines that pass under it, its labels with it).
pub fn assert_lines_clear(root: Node, what: &str) {
    let free: Vec<Label> = root
        .descendants()
        .filter(|n| n.has_tag_name("text"))
        .filter(|n| {
            !n.ancestors().any(|a| {
                a.has_tag_name("g") && matches!(a.attribute("class"), Some("node" | "tag"))
            })
        })
        .flat_map(|n| labels(n))
        .collect();
    assert!(!free.is_empty(), "{what}: no labels outside boxes");
    for p in root.descendants().filter(|n| n.has_tag_name("path")) {
        if p.attribute("stroke-opacity") == Some("0") {
            continue;
        }
        let class = p.attribute("class").unwrap_or_default();
        let half = half_stroke(class);
        for ((x0, y0), (x1, y1)) in segments(p.attribute("d").unwrap_or_default()) {
            let s = Rect::new(
                x0.min(x1) - half,
                y0.min(y1) - half,
                (x1 - x0).abs() + 2.0 * half,
                (y1 - y0).abs() + 2.0 * half,
            );
            for l in &free {
                assert!(
                    !s.overlaps(&l.rect),
                    "{what}: a line ({class}, {:?} → {:?}) runs over the label {:?} at {:?}",
                    (x0, y0),
                    (x1, y1),
                    l.text,
                    l.rect
                );
            }
        }
    }
}
