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
