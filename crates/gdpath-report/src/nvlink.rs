//! NVLink in the band under the GPU row of the machine drawing: one bar for each set of GPUs
//! joined all to all by the same number of links (an NVSwitch system, or a bonded pair), with
//! its `NV#`; brackets for other connections (a hybrid cube mesh, POWER's pairs), on levels so
//! that overlapping spans do not share a height.

use crate::geometry::{Node, NodeKind, P, SMALL};
use crate::svg::{Anchor, Rect, Text};
use gdpath_topo::Machine;
use std::collections::{BTreeMap, HashMap};

/// An NVLink connection drawn in the band under the GPU row.
#[derive(Debug, Clone)]
pub struct NvDraw {
    /// The GPUs joined (ids).
    pub gpus: Vec<String>,
    /// Lines to draw.
    pub lines: Vec<Vec<P>>,
    /// Per pair of `gpus` that a P2P path may follow: (a, b, polyline from a's bottom to b's).
    pub paths: Vec<(String, String, Vec<P>)>,
}

/// Most NVLink connections drawn as brackets: 64. A hybrid cube mesh (DGX-1) has 16, POWER9's
/// GPU pairs 3; each bracket is placed clear of the others, which grows with their square, and
/// past a few dozen they no longer read. Past it none is drawn and the drawing's notes say so
/// (the P2P matrix still gives each pair's NV#).
pub const MAX_BRACKETS: usize = 64;

/// The NVLink band under the GPU row: a bar for each set of GPUs joined all to all by the same
/// number of links (an NVSwitch system, or a bonded pair), brackets for the other connections
/// (at most [`MAX_BRACKETS`]); the link count on each. Returns the drawings, their labels, the
/// band's bottom and how many connections were left undrawn.
pub fn band(m: &Machine, nodes: &[Node], gpu_bottom: f64) -> (Vec<NvDraw>, Vec<Text>, f64, usize) {
    let gpus: Vec<(&str, Rect, gdpath_topo::PciAddr)> = nodes
        .iter()
        .filter(|n| n.kind == NodeKind::Gpu)
        .filter_map(|n| {
            let id = n.id.as_deref()?;
            let d = m.by_id(id)?;
            Some((id, n.rect, d.pci))
        })
        .collect();
    // The bonds between drawn GPUs, by index (from the machine's bond list: not every pair).
    let at: HashMap<gdpath_topo::PciAddr, usize> =
        gpus.iter().enumerate().map(|(i, g)| (g.2, i)).collect();
    let mut bonds: BTreeMap<(usize, usize), u32> = BTreeMap::new();
    for l in &m.nvlinks {
        if let (Some(&a), Some(&b)) = (at.get(&l.a), at.get(&l.b)) {
            if a != b && l.links > 0 {
                bonds.insert((a.min(b), a.max(b)), m.nvlink_count(&l.a, &l.b));
            }
        }
    }
    let count = |a: usize, b: usize| bonds.get(&(a.min(b), a.max(b))).copied().unwrap_or(0);
    // Connected components of the NVLink graph.
    let n = gpus.len();
    let mut comp: Vec<usize> = (0..n).collect();
    fn find(c: &mut [usize], i: usize) -> usize {
        let mut r = i;
        while c[r] != r {
            r = c[r];
        }
        c[i] = r;
        r
    }
    for &(a, b) in bonds.keys() {
        let (ra, rb) = (find(&mut comp, a), find(&mut comp, b));
        comp[ra] = rb;
    }
    let mut groups: Vec<Vec<usize>> = Vec::new();
    let mut group_of: HashMap<usize, usize> = HashMap::new();
    for i in 0..n {
        let root = find(&mut comp, i);
        let g = *group_of.entry(root).or_insert_with(|| {
            groups.push(Vec::new());
            groups.len() - 1
        });
        groups[g].push(i);
    }
    // Per group: its bonds, and whether they join every pair with one count.
    let mut in_group: Vec<Vec<(usize, usize, u32)>> = vec![Vec::new(); groups.len()];
    for (&(a, b), &c) in &bonds {
        in_group[group_of[&find(&mut comp, a)]].push((a, b, c));
    }
    let mut draws = Vec::new();
    let mut texts = Vec::new();
    let mut y = gpu_bottom + 14.0;
    let mut brackets: Vec<(usize, usize, u32)> = Vec::new();
    for (g, joined) in groups.iter().zip(&in_group).filter(|(g, _)| g.len() > 1) {
        let first = count(g[0], g[1]);
        let k = g.len();
        let uniform = joined.len() == k * (k - 1) / 2 && joined.iter().all(|b| b.2 == first);
        if !uniform {
            // In the order of the group's members (bonds are in index order already).
            brackets.extend(joined.iter().copied());
            continue;
        }
        let xs: Vec<f64> = g.iter().map(|&i| gpus[i].1.cx()).collect();
        let x0 = xs.iter().copied().fold(f64::MAX, f64::min);
        let x1 = xs.iter().copied().fold(f64::MIN, f64::max);
        let mut lines = vec![vec![(x0, y), (x1, y)]];
        for &x in &xs {
            lines.push(vec![(x, gpu_bottom), (x, y)]);
        }
        let ids: Vec<String> = g.iter().map(|&i| gpus[i].0.to_owned()).collect();
        let mut paths = Vec::new();
        for (i, &a) in g.iter().enumerate() {
            for &b in &g[i + 1..] {
                let (xa, xb) = (gpus[a].1.cx(), gpus[b].1.cx());
                paths.push((
                    gpus[a].0.to_owned(),
                    gpus[b].0.to_owned(),
                    vec![(xa, gpu_bottom), (xa, y), (xb, y), (xb, gpu_bottom)],
                ));
            }
        }
        let what = if g.len() == 2 {
            format!(
                "NV{first}: {} NVLinks between {} and {}",
                first, ids[0], ids[1]
            )
        } else {
            format!(
                "NV{first}: {first} NVLinks between every pair of these {} GPUs",
                g.len()
            )
        };
        texts.push(Text::new(x0, y + 14.0, SMALL, what, "nv-label"));
        draws.push(NvDraw {
            gpus: ids,
            lines,
            paths,
        });
        y += 30.0;
    }
    // Too many to place clear of each other (and to read): none, said in the notes.
    let undrawn = if brackets.len() > MAX_BRACKETS {
        std::mem::take(&mut brackets).len()
    } else {
        0
    };
    // Brackets: levels so that overlapping spans get different heights.
    brackets.sort_by(|x, y| {
        let span = |b: &(usize, usize, u32)| (gpus[b.1].1.cx() - gpus[b.0].1.cx()).abs();
        span(x).total_cmp(&span(y))
    });
    let mut levels: Vec<Vec<(f64, f64)>> = Vec::new();
    let mut legs: std::collections::BTreeMap<usize, usize> = Default::default();
    let base = y;
    let mut pending: Vec<(f64, f64, f64, String)> = Vec::new();
    let mut max_y = if draws.is_empty() {
        gpu_bottom
    } else {
        y - 16.0
    };
    for (a, b, c) in brackets {
        let (xa, xb) = {
            let la = legs.entry(a).or_insert(0);
            let xa = gpus[a].1.cx() - 24.0 + 8.0 * (*la % 7) as f64;
            *la += 1;
            let lb = legs.entry(b).or_insert(0);
            let xb = gpus[b].1.cx() - 24.0 + 8.0 * (*lb % 7) as f64;
            *lb += 1;
            (xa.min(xb), xa.max(xb))
        };
        let lvl = (0..)
            .find(|&l| {
                levels.get(l).is_none_or(|spans: &Vec<(f64, f64)>| {
                    spans
                        .iter()
                        .all(|&(s0, s1)| xb + 30.0 < s0 || xa - 30.0 > s1)
                })
            })
            .unwrap_or(0);
        if levels.len() <= lvl {
            levels.resize(lvl + 1, Vec::new());
        }
        levels[lvl].push((xa, xb));
        let ly = base + 10.0 + 20.0 * lvl as f64;
        let (ia, ib) = if gpus[a].1.cx() <= gpus[b].1.cx() {
            (a, b)
        } else {
            (b, a)
        };
        let pts = vec![(xa, gpu_bottom), (xa, ly), (xb, ly), (xb, gpu_bottom)];
        pending.push((xa, xb, ly, format!("NV{c}")));
        max_y = max_y.max(ly);
        draws.push(NvDraw {
            gpus: vec![gpus[ia].0.to_owned(), gpus[ib].0.to_owned()],
            lines: vec![pts.clone()],
            paths: vec![(gpus[ia].0.to_owned(), gpus[ib].0.to_owned(), pts)],
        });
    }
    let lines: Vec<Rect> = draws
        .iter()
        .flat_map(|d| d.lines.iter())
        .flat_map(|l| {
            l.windows(2)
                .map(|w| crate::geometry::seg_rect(&(w[0], w[1]), 1.6))
        })
        .collect();
    for (xa, xb, ly, text) in pending {
        texts.push(bracket_label(xa, xb, ly, text, &lines, &texts));
    }
    let bottom = texts
        .iter()
        .map(|t| t.rect().bottom())
        .fold(max_y, f64::max);
    (draws, texts, bottom, undrawn)
}

/// A bracket's label just above its run from `xa` to `xb` at `ly`: in the middle, or slid
/// along the run to the first spot clear of the other brackets' legs and labels.
fn bracket_label(xa: f64, xb: f64, ly: f64, text: String, lines: &[Rect], texts: &[Text]) -> Text {
    let at =
        |x: f64| Text::new(x, ly - 5.5, SMALL, text.clone(), "nv-label").anchored(Anchor::Middle);
    let mid = (xa + xb) / 2.0;
    let half = at(mid).width() / 2.0 + 3.0;
    (0..)
        .map(|k: i32| mid + f64::from((k + 1) / 2 * if k % 2 == 1 { 1 } else { -1 }) * 6.0)
        .take_while(|x| (x - mid).abs() <= (xb - xa) / 2.0)
        .filter(|x| *x - half >= xa && *x + half <= xb)
        .map(at)
        .find(|t| {
            let r = t.rect().grow(1.0);
            lines.iter().all(|l| !l.overlaps(&r)) && texts.iter().all(|o| !o.rect().overlaps(&r))
        })
        .unwrap_or_else(|| at(mid))
}
