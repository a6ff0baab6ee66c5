//! Where every box, line and label of the machine drawing goes.
//!
//! The drawing is a tree hung from the top: the CPU interconnect between NUMA nodes, the NUMA
//! nodes (each a header with its CPUs and a strip for host memory), their PCIe host bridges,
//! the PCIe switches and, at the bottom, the devices. The design, for machines of 8 GPUs with
//! 18–32 NICs and 9 NVMe drives:
//!
//! - **Columns.** Each hub (NUMA node, host bridge, switch) lays out what hangs below it as
//!   columns side by side under a horizontal rail: one column per switch below it, one per GPU,
//!   and its NICs and NVMe stacked in one column (a vertical bus with a row per device, at most
//!   [`MAX_STACK`] rows before a second column starts). A switch with a GPU, four NICs and an NVMe
//!   (a p5.48xlarge) is then two columns wide, not six, and 8 such switches fit a page.
//! - **One GPU row.** Every GPU sits on the same row at the bottom, below the deepest stack: the
//!   NVLink band under that row joins them without crossing the tree, and P2P between GPUs is
//!   a matrix ([`crate::matrix`]) rather than 28 lines across the tree.
//! - **Many host bridges.** Clouds put each device of a VM on a host bridge of its own (Hyper-V
//!   gives each a PCI domain). When a NUMA node has more than [`MAX_BRIDGE_COLUMNS`] host
//!   bridges, those holding only NICs and NVMe are merged into one stack whose rows name their
//!   host bridge, so 25 single-device host bridges do not become 25 columns.
//! - **Links.** A PCIe link is labelled where it enters its box: just above a GPU or switch, to
//!   the right of the line into it (past the lanes of any paths coming down that line; paths
//!   going up run on its left), or inside the row of a stacked device.
//! - **Room for paths.** The paths ([`crate::routing`]) are laid out once on a first layout; the
//!   room their lanes take ([`Extra`]) is then given on a second: under rails, between the CPU
//!   interconnect and the NUMA nodes, beside link labels and the CPU list of a NUMA node.
//!
//! Every label's box is known here ([`Layout::texts`]); nothing is placed over another label
//! (the tests check the SVG itself).

use crate::geometry::{Node, NodeKind, Seg, FONT, P, SMALL};
pub use crate::links::{link_label, LinkLabel};
pub use crate::nvlink::NvDraw;
use crate::svg::{fit, text_rect, text_width, Anchor, Rect, Text};
use crate::tree::{Group, Hub, HubKind, Leaf, Tree};
use gdpath_topo::{Device, DeviceKind, Machine};

/// Rows in one stack column before another column starts.
pub const MAX_STACK: usize = 10;
/// Host bridges of one NUMA node drawn as columns of their own before the NIC/NVMe-only ones
/// are merged into stacks.
pub const MAX_BRIDGE_COLUMNS: usize = 6;

const PAD: f64 = 16.0;
const ROW_H: f64 = 20.0;
const ROW_GAP: f64 = 6.0;
const BUS_INDENT: f64 = 8.0;
const STUB: f64 = 14.0;
const GPU_H: f64 = 46.0;
/// A GPU box whose model name takes two lines.
const GPU_H2: f64 = 58.0;
const HUB_H: f64 = 32.0;
const NUMA_H: f64 = 48.0;
const RAIL_GAP: f64 = 12.0;
const DROP: f64 = 16.0;
/// Shortest line above a GPU: room for its link label.
const GPU_DROP_MIN: f64 = 34.0;
/// Space between the deepest stack and the GPU row.
const CLEAR: f64 = 22.0;
const COL_GAP: f64 = 16.0;
const GROUP_GAP: f64 = 30.0;
const SMP_H: f64 = 34.0;

/// A horizontal rail under a hub, from x0 to x1 at y, with the drop from the hub above it.
#[derive(Debug, Clone, Copy)]
pub struct Rail {
    /// The node the rail hangs from.
    pub node: usize,
    /// Height of the rail, px.
    pub y: f64,
    /// Left end of the rail, px.
    pub x0: f64,
    /// Right end of the rail, px.
    pub x1: f64,
    /// The vertical line from the hub's bottom down to the rail, as (top, bottom) points.
    pub drop: (P, P),
}

/// The whole drawing's geometry.
#[derive(Debug, Clone)]
pub struct Layout {
    /// Width of the drawing, px.
    pub width: f64,
    /// Height of the drawing, px.
    pub height: f64,
    /// The boxes, parents before children.
    pub nodes: Vec<Node>,
    /// The rails under the hubs.
    pub rails: Vec<Rail>,
    /// The CPU interconnect's bus line, when there are several NUMA nodes.
    pub smp: Option<(f64, f64, f64)>,
    /// The NVLink connections drawn in the band under the GPU row.
    pub nvlinks: Vec<NvDraw>,
    /// Labels outside boxes: link labels, the interconnect's, NVLink counts.
    pub texts: Vec<Text>,
    /// Bottom of the machine (GPU row and NVLink band), where the panels below may start.
    pub bottom: f64,
    /// PCI functions not drawn, and bridges folded or drawn.
    pub undrawn: usize,
    /// PCI bridges folded into their devices' links or drawn as switches.
    pub bridges: usize,
    /// NVLink connections not drawn: more brackets than [`crate::nvlink::MAX_BRACKETS`].
    pub nvlink_undrawn: usize,
}

impl Layout {
    /// The box of the device with this id.
    pub fn device(&self, id: &str) -> Option<usize> {
        self.nodes.iter().position(|n| n.id.as_deref() == Some(id))
    }

    /// Every label of the drawing: inside boxes and out.
    pub fn all_texts(&self) -> impl Iterator<Item = &Text> {
        self.nodes
            .iter()
            .flat_map(|n| n.texts.iter())
            .chain(self.texts.iter())
    }

    /// The tree's lines: rails with their drops, each box's line up, the CPU interconnect, and
    /// the NVLink lines.
    pub fn lines(&self) -> Vec<Seg> {
        let mut v: Vec<Seg> = Vec::new();
        for r in &self.rails {
            v.push(r.drop);
            v.push(((r.x0, r.y), (r.x1, r.y)));
        }
        for n in &self.nodes {
            v.extend(n.up.windows(2).map(|w| (w[0], w[1])));
        }
        if let Some((y, x0, x1)) = self.smp {
            v.push(((x0, y), (x1, y)));
        }
        for nv in &self.nvlinks {
            for l in &nv.lines {
                v.extend(l.windows(2).map(|w| (w[0], w[1])));
            }
        }
        v
    }

    /// Areas later labels must avoid: boxes and labels.
    pub fn obstacles(&self) -> Vec<Rect> {
        self.nodes
            .iter()
            .filter(|n| n.kind != NodeKind::Numa)
            .map(|n| n.rect)
            .chain(self.texts.iter().map(Text::rect))
            .chain(
                self.nodes
                    .iter()
                    .filter(|n| n.kind == NodeKind::Numa)
                    .flat_map(|n| n.texts.iter().map(Text::rect)),
            )
            .collect()
    }
}

/// One column under a hub.
enum Col<'t, 'm> {
    Stack(Vec<Row<'t, 'm>>),
    Gpu(&'t Leaf<'m>),
    Hub(&'t Hub<'m>),
}

/// A row of a stack: a NIC or NVMe, and the host bridge it was merged from.
struct Row<'t, 'm> {
    leaf: &'t Leaf<'m>,
    via: Option<String>,
}

fn columns<'t, 'm>(hub: &'t Hub<'m>) -> Vec<Col<'t, 'm>> {
    let io: Vec<Row> = hub
        .leaves
        .iter()
        .filter(|l| l.dev.kind != DeviceKind::Gpu)
        .map(|leaf| Row { leaf, via: None })
        .collect();
    let mut cols = stacks(io);
    // GPUs and switches in PCI order.
    let mut rest: Vec<(gdpath_topo::PciAddr, Col)> = hub
        .leaves
        .iter()
        .filter(|l| l.dev.kind == DeviceKind::Gpu)
        .map(|l| (l.dev.pci, Col::Gpu(l)))
        .chain(hub.hubs.iter().map(|h| {
            let first = h.all_leaves().iter().map(|l| l.dev.pci).min();
            (
                first.unwrap_or(gdpath_topo::PciAddr {
                    domain: 0,
                    bus: 0,
                    device: 0,
                    function: 0,
                }),
                Col::Hub(h),
            )
        }))
        .collect();
    rest.sort_by_key(|(p, _)| *p);
    cols.extend(rest.into_iter().map(|(_, c)| c));
    cols
}

fn stacks<'t, 'm>(rows: Vec<Row<'t, 'm>>) -> Vec<Col<'t, 'm>> {
    let mut out = Vec::new();
    let mut cur = Vec::new();
    for r in rows {
        cur.push(r);
        if cur.len() == MAX_STACK {
            out.push(Col::Stack(std::mem::take(&mut cur)));
        }
    }
    if !cur.is_empty() {
        out.push(Col::Stack(cur));
    }
    out
}

/// The columns under a NUMA node: its host bridges, with the NIC/NVMe-only ones merged into
/// stacks when there are more than [`MAX_BRIDGE_COLUMNS`].
fn group_columns<'t, 'm>(g: &'t Group<'m>) -> Vec<Col<'t, 'm>> {
    let io_only = |h: &Hub| {
        h.hubs.is_empty()
            && h.leaves.iter().all(|l| l.dev.kind != DeviceKind::Gpu)
            && matches!(h.kind, HubKind::HostBridge(_))
    };
    if g.bridges.len() <= MAX_BRIDGE_COLUMNS || g.bridges.iter().filter(|h| io_only(h)).count() < 2
    {
        return g.bridges.iter().map(Col::Hub).collect();
    }
    let rows: Vec<Row> = g
        .bridges
        .iter()
        .filter(|h| io_only(h))
        .flat_map(|h| {
            let via = match &h.kind {
                HubKind::HostBridge(n) => Some(n.clone()),
                _ => None,
            };
            h.leaves.iter().map(move |leaf| Row {
                leaf,
                via: via.clone(),
            })
        })
        .collect();
    let mut cols = stacks(rows);
    cols.extend(g.bridges.iter().filter(|h| !io_only(h)).map(Col::Hub));
    cols
}

/// Texts of a stack row: id, interface name, host bridge; the link, right-aligned.
fn row_parts(r: &Row) -> (String, String, Option<LinkLabel>) {
    let d = r.leaf.dev;
    // The interface or block device; the address only in the tooltip (it would double the
    // row's width on sources that name no interface, such as NCCL's files).
    let mut name = d
        .interface_names()
        .first()
        .map(|s| (*s).to_owned())
        .or_else(|| d.block.first().cloned())
        .unwrap_or_default();
    if let Some(v) = &r.via {
        name = if name.is_empty() {
            v.clone()
        } else {
            format!("{name} · {v}")
        };
    }
    (d.id.clone(), name, link_label(d, &r.leaf.chain))
}

fn row_width(r: &Row) -> f64 {
    let (id, name, link) = row_parts(r);
    8.0 + text_width(&id, FONT)
        + 7.0
        + text_width(&name, SMALL)
        + link.map_or(0.0, |l| 12.0 + text_width(&l.text, SMALL))
        + 8.0
}

fn stack_width(rows: &[Row]) -> f64 {
    BUS_INDENT + STUB + rows.iter().map(row_width).fold(0.0, f64::max)
}

fn stack_depth(rows: &[Row]) -> f64 {
    rows.len() as f64 * (ROW_H + ROW_GAP) - ROW_GAP
}

/// A GPU box's lines: id, model, address (none for the made-up addresses of a source that
/// gives none).
fn gpu_lines(d: &Device) -> [String; 3] {
    [
        d.id.clone(),
        d.display_name().trim_start_matches("NVIDIA ").to_owned(),
        if d.synthetic {
            "(no address)".to_owned()
        } else {
            d.pci.to_string()
        },
    ]
}

const GPU_W_MIN: f64 = 96.0;
const GPU_W_MAX: f64 = 150.0;
/// Room for text in a GPU box (its width less the margins).
const GPU_TEXT_PAD: f64 = 16.0;

fn gpu_width(d: &Device) -> f64 {
    let [id, name, pci] = gpu_lines(d);
    let text = name_lines(&name)
        .iter()
        .map(|l| text_width(l, SMALL))
        .fold(text_width(&id, FONT).max(text_width(&pci, SMALL)), f64::max);
    (text + GPU_TEXT_PAD).clamp(GPU_W_MIN, GPU_W_MAX)
}

/// The model name as a GPU box shows it: one line when it fits the widest box, else two,
/// broken at the space that makes the longer line shortest (the box is then only as wide as
/// that line), the second cut with `…` if it still does not fit.
fn name_lines(name: &str) -> Vec<String> {
    let room = GPU_W_MAX - GPU_TEXT_PAD;
    if text_width(name, SMALL) <= room {
        return vec![name.to_owned()];
    }
    let chars: Vec<char> = name.chars().collect();
    let split = |i: usize| -> (String, String) {
        (
            chars[..i].iter().collect::<String>().trim_end().to_owned(),
            chars[i..].iter().collect::<String>().trim().to_owned(),
        )
    };
    let max = (room / text_width("x", SMALL)) as usize;
    let spaces: Vec<usize> = (1..chars.len()).filter(|&i| chars[i - 1] == ' ').collect();
    let longer = |i: &usize| {
        let (a, b) = split(*i);
        a.chars().count().max(b.chars().count())
    };
    // Balanced when both halves fit; else as much as fits on the first line.
    let at = match spaces.iter().min_by_key(|i| longer(i)) {
        Some(&i) if longer(&i) <= max => i,
        _ => spaces
            .iter()
            .copied()
            .filter(|&i| i <= max + 1)
            .max()
            .unwrap_or(max.min(chars.len())),
    };
    let (first, rest) = split(at);
    vec![fit(&first, SMALL, room), fit(&rest, SMALL, room)]
}

fn hub_lines(h: &Hub) -> (String, String) {
    match &h.kind {
        HubKind::HostBridge(name) => ("host bridge".to_owned(), name.clone()),
        HubKind::Switch(b) if b.synthetic => ("PCIe switch".to_owned(), "(NCCL)".to_owned()),
        HubKind::Switch(b) => ("PCIe switch".to_owned(), b.pci.to_string()),
        HubKind::NoTree => ("PCI tree".to_owned(), "not in source".to_owned()),
    }
}

fn hub_box_width(h: &Hub) -> f64 {
    let (a, b) = hub_lines(h);
    (text_width(&a, SMALL).max(text_width(&b, SMALL)) + 16.0).max(84.0)
}

/// Width and depth (from its top to where the GPU row may start) of a column.
fn measure(c: &Col, ex: &Extra) -> (f64, f64) {
    match c {
        Col::Stack(rows) => (stack_width(rows), stack_depth(rows) + CLEAR),
        Col::Gpu(l) => (gpu_width(l.dev), GPU_DROP_MIN - DROP),
        Col::Hub(h) => measure_hub(h, ex),
    }
}

fn measure_cols(cols: &[Col], ex: &Extra) -> (f64, f64) {
    let w = cols.iter().map(|c| measure(c, ex).0).sum::<f64>()
        + COL_GAP * cols.len().saturating_sub(1) as f64;
    let d = cols.iter().map(|c| measure(c, ex).1).fold(0.0, f64::max);
    (w, d)
}

fn measure_hub(h: &Hub, ex: &Extra) -> (f64, f64) {
    let (w, d) = measure_cols(&columns(h), ex);
    let drop = DROP + extra(ex, &hub_key(h));
    (w.max(hub_box_width(h)), HUB_H + RAIL_GAP + drop + d)
}

/// The room under a rail beyond the usual drop that a path `d` px below the rail needs, to
/// keep clear of the link labels just above the boxes below (≤ 0: none).
pub fn room_needed(d: f64) -> f64 {
    d + 1.5 + 2.0 + LINK_LABEL_RISE + text_rect(0.0, 0.0, 0.0, SMALL).y.abs() - DROP
}

/// The room beyond the usual space above the NUMA nodes that a path `d` px below the CPU
/// interconnect's line needs, to stay above the nodes' tops.
pub fn smp_room_needed(d: f64) -> f64 {
    d + 6.0 - (SMP_H - SMP_LINE)
}

/// Gap between a line and the link label right of it.
pub const LINK_LABEL_GAP: f64 = 4.0;
/// A link label's baseline above the top of the box it enters.
const LINK_LABEL_RISE: f64 = 4.0;
/// The CPU interconnect's line below the top margin.
const SMP_LINE: f64 = 14.0;
/// [`Extra`] key of the room between the CPU interconnect and the NUMA nodes.
pub const SMP_KEY: &str = "smp";

/// [`Extra`] key of the shift right of the link label of box `key`, past the lanes of paths
/// coming down the line into it.
pub fn right_key(key: &str) -> String {
    format!("right:{key}")
}

/// [`Extra`] key of the room left of the interconnect's line through NUMA node `key`, kept
/// clear of its CPU list for the lanes of paths going up it.
pub fn cpu_key(key: &str) -> String {
    format!("cpu:{key}")
}

/// The height of the GPU boxes: taller when a model name takes two lines.
fn gpu_height(tree: &Tree) -> f64 {
    let two = tree.groups.iter().any(|g| {
        g.bridges.iter().any(|h| {
            h.all_leaves().iter().any(|l| {
                l.dev.kind == DeviceKind::Gpu && {
                    let [_, name, _] = gpu_lines(l.dev);
                    name_lines(&name).len() > 1
                }
            })
        })
    });
    if two {
        GPU_H2
    } else {
        GPU_H
    }
}

/// Extra space under a hub's rail, by [`Node::key`], for the paths that run along it (found by
/// laying the paths out once: [`crate::routing::rail_room`]).
pub type Extra = std::collections::BTreeMap<String, f64>;

fn extra(ex: &Extra, key: &str) -> f64 {
    ex.get(key).copied().unwrap_or(0.0).max(0.0)
}

fn hub_key(h: &Hub) -> String {
    match &h.kind {
        HubKind::HostBridge(n) => format!("hb:{n}"),
        HubKind::Switch(b) => format!("sw:{}", b.pci),
        HubKind::NoTree => format!(
            "nt:{}",
            h.leaves
                .first()
                .map(|l| l.dev.pci.to_string())
                .unwrap_or_default()
        ),
    }
}

fn group_key(g: &Group) -> String {
    match g.numa {
        Some(n) => format!("numa:{n}"),
        None => "numa:?".to_owned(),
    }
}

fn numa_title(g: &Group) -> (String, String) {
    let id = match g.numa {
        Some(n) => format!("NUMA {n}"),
        None => "NUMA ?".to_owned(),
    };
    let cpus = match (&g.cpus, g.numa) {
        (Some(c), _) => format!("CPUs {c}"),
        (None, Some(_)) => "CPUs ?".to_owned(),
        (None, None) => "node not in the source".to_owned(),
    };
    (id, cpus)
}

fn measure_group(g: &Group, ex: &Extra) -> (f64, f64) {
    let (w, d) = measure_cols(&group_columns(g), ex);
    let (id, _) = numa_title(g);
    // Room for the id, a little of the CPU list, and the interconnect's line at the right.
    let min = text_width(&id, FONT) + 150.0;
    let below = if g.bridges.is_empty() {
        0.0
    } else {
        RAIL_GAP + DROP + extra(ex, &group_key(g)) + d
    };
    (w.max(min), NUMA_H + below)
}

struct Builder<'a> {
    m: &'a Machine,
    ex: &'a Extra,
    nodes: Vec<Node>,
    rails: Vec<Rail>,
    texts: Vec<Text>,
    gpu_top: f64,
    gpu_h: f64,
}

impl Builder<'_> {
    fn push(&mut self, n: Node) -> usize {
        self.nodes.push(n);
        self.nodes.len() - 1
    }

    /// Places columns left to right from `x` with their tops at `top`, under `parent`, whose
    /// rail is at `rail_y`; returns the x of each column's drop.
    fn place_cols(
        &mut self,
        cols: &[Col],
        x: f64,
        top: f64,
        parent: usize,
        rail_y: f64,
    ) -> Vec<f64> {
        let mut cx = x;
        let mut drops = Vec::new();
        for c in cols {
            let (w, _) = measure(c, self.ex);
            match c {
                Col::Stack(rows) => drops.push(self.place_stack(rows, cx, top, parent, rail_y)),
                Col::Gpu(l) => drops.push(self.place_gpu(l, cx, parent, rail_y)),
                Col::Hub(h) => drops.push(self.place_hub(h, cx, top, parent, rail_y)),
            }
            cx += w + COL_GAP;
        }
        drops
    }

    fn place_stack(&mut self, rows: &[Row], x: f64, top: f64, parent: usize, rail_y: f64) -> f64 {
        let bus_x = x + BUS_INDENT;
        let w = stack_width(rows) - BUS_INDENT - STUB;
        for (i, r) in rows.iter().enumerate() {
            let y = top + i as f64 * (ROW_H + ROW_GAP);
            let rect = Rect::new(bus_x + STUB, y, w, ROW_H);
            let (id, name, link) = row_parts(r);
            let base = y + ROW_H / 2.0 + 3.5;
            let id_t = Text::new(rect.x + 8.0, base, FONT, id.clone(), "dev-id");
            let name_x = rect.x + 8.0 + id_t.width() + 7.0;
            let mut texts = vec![id_t, Text::new(name_x, base, SMALL, name, "dev-sub")];
            if let Some(l) = &link {
                texts.push(
                    Text::new(rect.right() - 8.0, base, SMALL, l.text.clone(), l.class)
                        .anchored(Anchor::End),
                );
            }
            let d = r.leaf.dev;
            let kind = if d.kind == DeviceKind::Nic {
                NodeKind::Nic
            } else {
                NodeKind::Nvme
            };
            let mid = y + ROW_H / 2.0;
            self.push(Node {
                key: d.id.clone(),
                kind,
                rect,
                parent: Some(parent),
                id: Some(d.id.clone()),
                pci: pci_list(d, &r.leaf.chain),
                attach: (rect.x, mid),
                up: vec![(rect.x, mid), (bus_x, mid), (bus_x, rail_y)],
                rail_y: 0.0,
                through_x: 0.0,
                texts,
                title: device_title(self.m, d, r.via.as_deref()),
                link,
                mem_y: 0.0,
                pass_y: 0.0,
            });
        }
        bus_x
    }

    fn place_gpu(&mut self, l: &Leaf, x: f64, parent: usize, rail_y: f64) -> f64 {
        let d = l.dev;
        let w = gpu_width(d);
        let rect = Rect::new(x, self.gpu_top, w, self.gpu_h);
        let cx = rect.cx();
        let [id, name, pci] = gpu_lines(d);
        let mut texts =
            vec![Text::new(cx, rect.y + 15.0, FONT, id, "dev-id gpu-id").anchored(Anchor::Middle)];
        let mut y = rect.y + 28.0;
        for line in name_lines(&name) {
            texts.push(Text::new(cx, y, SMALL, line, "dev-sub").anchored(Anchor::Middle));
            y += 12.0;
        }
        texts.push(
            Text::new(cx, rect.bottom() - 6.0, SMALL, pci, "dev-pci").anchored(Anchor::Middle),
        );
        let link = link_label(d, &l.chain);
        self.link_text(&link, &d.id, parent, cx, rail_y, rect.y);
        self.push(Node {
            key: d.id.clone(),
            kind: NodeKind::Gpu,
            rect,
            parent: Some(parent),
            id: Some(d.id.clone()),
            pci: pci_list(d, &l.chain),
            attach: (cx, rect.y),
            up: vec![(cx, rect.y), (cx, rail_y)],
            rail_y: 0.0,
            through_x: cx,
            texts,
            title: device_title(self.m, d, None),
            link,
            mem_y: 0.0,
            pass_y: 0.0,
        });
        cx
    }

    /// The label of the link into box `key` (below `parent`'s rail at `y0`, its top at `y1`):
    /// right of its line at `x` and of the lanes of paths coming down it; half way down a long
    /// line, else just above the box — below the lanes along the rail either way.
    fn link_text(
        &mut self,
        link: &Option<LinkLabel>,
        key: &str,
        parent: usize,
        x: f64,
        y0: f64,
        y1: f64,
    ) {
        if let Some(l) = link {
            let dx = LINK_LABEL_GAP + extra(self.ex, &right_key(key));
            let below_lanes = y0 + extra(self.ex, &self.nodes[parent].key) + DROP - LINK_LABEL_RISE;
            let base = ((y0 + y1) / 2.0 + 3.5)
                .max(below_lanes)
                .min(y1 - LINK_LABEL_RISE);
            self.texts
                .push(Text::new(x + dx, base, SMALL, l.text.clone(), l.class));
        }
    }

    fn place_hub(&mut self, h: &Hub, x: f64, top: f64, parent: usize, rail_y: f64) -> f64 {
        let cols = columns(h);
        let (cw, _) = measure_cols(&cols, self.ex);
        let (bw, _) = measure_hub(h, self.ex);
        let box_w = hub_box_width(h);
        let cols_x = x + (bw - cw) / 2.0;
        let bx = x + hub_center_offset(h, self.ex) - box_w / 2.0;
        let rect = Rect::new(bx, top, box_w, HUB_H);
        let cx = rect.cx();
        let (l1, l2) = hub_lines(h);
        let texts = vec![
            Text::new(cx, top + 13.0, SMALL, l1, "hub-title").anchored(Anchor::Middle),
            Text::new(cx, top + 26.0, SMALL, l2, "hub-sub").anchored(Anchor::Middle),
        ];
        let (kind, own, title, link) = match &h.kind {
            HubKind::HostBridge(n) => (
                NodeKind::HostBridge,
                None,
                format!("PCIe host bridge (root complex) {n}"),
                None,
            ),
            HubKind::Switch(b) => (
                NodeKind::Switch,
                Some(*b),
                format!(
                    "PCIe switch: upstream port {}{}",
                    b.pci,
                    if b.synthetic {
                        " (NCCL's virtual switch: not a real address)"
                    } else {
                        ""
                    }
                ),
                link_label(b, &h.chain),
            ),
            HubKind::NoTree => (
                NodeKind::NoTree,
                None,
                "the source has no PCI tree: where these devices attach is not known".to_owned(),
                None,
            ),
        };
        self.link_text(&link, &hub_key(h), parent, cx, rail_y, top);
        let my_rail = top + HUB_H + RAIL_GAP;
        let mut pci: Vec<String> = own.iter().map(|b| b.pci.to_string()).collect();
        pci.extend(h.chain.iter().map(|b| b.pci.to_string()));
        let me = self.push(Node {
            key: hub_key(h),
            kind,
            rect,
            parent: Some(parent),
            id: None,
            pci,
            attach: (cx, top),
            up: vec![(cx, top), (cx, rail_y)],
            rail_y: my_rail,
            through_x: cx,
            texts,
            title,
            link,
            mem_y: 0.0,
            pass_y: 0.0,
        });
        let drop = DROP + extra(self.ex, &hub_key(h));
        let drops = self.place_cols(&cols, cols_x, my_rail + drop, me, my_rail);
        self.rail(me, &drops);
        cx
    }

    /// The rail under node `me` across its children's drops (none without children).
    fn rail(&mut self, me: usize, drops: &[f64]) {
        if drops.is_empty() {
            return;
        }
        let n = &self.nodes[me];
        // The drop from the box: at its centre (a NUMA node's through line is at its right).
        let cx = n.rect.cx();
        let x0 = drops.iter().copied().fold(cx, f64::min);
        let x1 = drops.iter().copied().fold(cx, f64::max);
        self.rails.push(Rail {
            node: me,
            y: n.rail_y,
            x0,
            x1,
            drop: ((cx, n.rect.bottom()), (cx, n.rail_y)),
        });
    }

    fn place_group(&mut self, g: &Group, x: f64, top: f64, smp_y: Option<f64>) {
        let cols = group_columns(g);
        let (cw, _) = measure_cols(&cols, self.ex);
        let (w, _) = measure_group(g, self.ex);
        let rect = Rect::new(x, top, w, NUMA_H);
        let (id, cpus) = numa_title(g);
        let id_t = Text::new(x + 8.0, top + 15.0, FONT, id, "numa-id");
        let cpu_x = id_t.rect().right() + 8.0;
        let smp_x = rect.right() - 14.0;
        // Clear of the interconnect's line and the lanes of paths going up beside it.
        let cpus = fit(
            &cpus,
            SMALL,
            smp_x - 12.0 - extra(self.ex, &cpu_key(&group_key(g))) - cpu_x,
        );
        let mem_label = Text::new(x + 8.0, top + 41.0, SMALL, "host memory", "mem-label");
        let texts = vec![
            id_t,
            Text::new(cpu_x, top + 15.0, SMALL, cpus, "numa-sub"),
            mem_label,
        ];
        let rail_y = top + NUMA_H + RAIL_GAP;
        let title = match (g.numa, &g.cpus) {
            (Some(n), Some(c)) => format!("NUMA node {n}: CPUs {c} and their memory"),
            (Some(n), None) => format!("NUMA node {n}"),
            (None, _) => "devices whose NUMA node the source does not give".to_owned(),
        };
        let up = match smp_y {
            Some(y) => vec![(smp_x, top), (smp_x, y)],
            None => Vec::new(),
        };
        let me = self.push(Node {
            key: group_key(g),
            kind: NodeKind::Numa,
            rect,
            parent: None,
            id: None,
            pci: Vec::new(),
            attach: (smp_x, top),
            up,
            rail_y,
            through_x: smp_x,
            texts,
            title,
            link: None,
            mem_y: top + 37.0,
            pass_y: top + 22.0,
        });
        let drop = DROP + extra(self.ex, &group_key(g));
        let drops = self.place_cols(&cols, x + (w - cw) / 2.0, rail_y + drop, me, rail_y);
        self.rail(me, &drops);
    }
}

/// Where a hub's box centre falls from its block's left edge (to centre a parent over it).
fn hub_center_offset(h: &Hub, ex: &Extra) -> f64 {
    let cols = columns(h);
    let (cw, _) = measure_cols(&cols, ex);
    let (bw, _) = measure_hub(h, ex);
    let box_w = hub_box_width(h);
    let cols_x = (bw - cw) / 2.0;
    let mut cx = cols_x;
    let mut v = Vec::new();
    for c in &cols {
        let (w, _) = measure(c, ex);
        v.push(match c {
            Col::Stack(_) => cx + BUS_INDENT,
            Col::Gpu(l) => cx + gpu_width(l.dev) / 2.0,
            Col::Hub(sub) => cx + hub_center_offset(sub, ex),
        });
        cx += w + COL_GAP;
    }
    let span = match (v.first(), v.last()) {
        (Some(a), Some(b)) => (a + b) / 2.0,
        _ => bw / 2.0,
    };
    (span - box_w / 2.0).clamp(0.0, bw - box_w) + box_w / 2.0
}

fn pci_list(d: &Device, chain: &[&Device]) -> Vec<String> {
    std::iter::once(d)
        .chain(chain.iter().copied())
        .map(|x| x.pci.to_string())
        .collect()
}

fn device_title(m: &Machine, d: &Device, via: Option<&str>) -> String {
    let mut t = format!("{} {} — {}", d.id, d.pci, d.display_name());
    let names = d.interface_names();
    if !names.is_empty() {
        t.push_str(&format!(" ({})", names.join(", ")));
    }
    if !d.block.is_empty() {
        t.push_str(&format!(" ({})", d.block.join(", ")));
    }
    match (d.numa, crate::tree::placement(m, d)) {
        (Some(n), _) => t.push_str(&format!("; NUMA {n}")),
        (None, Some(p)) => match p.by {
            Some((gpu, class)) => t.push_str(&format!(
                "; NUMA {} (not in the source: placed with {gpu}, {class} from it)",
                p.numa
            )),
            None => t.push_str(&format!("; NUMA {} (inferred)", p.numa)),
        },
        (None, None) => t.push_str("; NUMA unknown"),
    }
    if let Some(v) = via {
        t.push_str(&format!("; host bridge {v}"));
    }
    t
}

/// Lays out the machine drawing of `tree` (from [`Tree::of`]), with `ex` room under rails.
pub fn layout(m: &Machine, tree: &Tree, ex: &Extra) -> Layout {
    let several = tree.groups.len() > 1;
    let top = PAD
        + if several {
            SMP_H + extra(ex, SMP_KEY)
        } else {
            0.0
        };
    let smp_y = several.then_some(PAD + SMP_LINE);
    let depth = tree
        .groups
        .iter()
        .map(|g| measure_group(g, ex).1)
        .fold(0.0, f64::max);
    let mut b = Builder {
        m,
        ex,
        nodes: Vec::new(),
        rails: Vec::new(),
        texts: Vec::new(),
        gpu_top: top + depth,
        gpu_h: gpu_height(tree),
    };
    let mut x = PAD;
    for g in &tree.groups {
        let (w, _) = measure_group(g, ex);
        b.place_group(g, x, top, smp_y);
        x += w + GROUP_GAP;
    }
    let smp = smp_y.map(|y| {
        let xs: Vec<f64> = b
            .nodes
            .iter()
            .filter(|n| n.kind == NodeKind::Numa)
            .map(|n| n.attach.0)
            .collect();
        let x0 = xs.iter().copied().fold(f64::MAX, f64::min);
        let x1 = xs.iter().copied().fold(x0, f64::max);
        (y, x0, x1)
    });
    // The interconnect's label sits above the bus, where no path runs (paths along the bus
    // run below it).
    if let Some((y, x0, _)) = smp {
        b.texts.push(Text::new(
            x0,
            y - 6.0,
            SMALL,
            "CPU interconnect between NUMA nodes (UPI / Infinity Fabric)",
            "smp-label",
        ));
    }
    let has_gpu = b.nodes.iter().any(|n| n.kind == NodeKind::Gpu);
    let mut bottom = if has_gpu {
        b.gpu_top + b.gpu_h
    } else {
        b.nodes.iter().map(|n| n.rect.bottom()).fold(top, f64::max)
    };
    let (nvlinks, nv_texts, nv_bottom, nvlink_undrawn) = crate::nvlink::band(m, &b.nodes, bottom);
    b.texts.extend(nv_texts);
    bottom = bottom.max(nv_bottom);
    let right = b
        .nodes
        .iter()
        .map(|n| n.rect.right())
        .chain(b.texts.iter().map(|t| t.rect().right()))
        .fold(0.0, f64::max);
    Layout {
        width: right + PAD,
        height: bottom + PAD,
        nodes: b.nodes,
        rails: b.rails,
        smp,
        nvlinks,
        texts: b.texts,
        bottom,
        undrawn: tree.undrawn,
        bridges: tree.bridges,
        nvlink_undrawn,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn gpu_model_names_take_one_line_or_two_balanced() {
        assert_eq!(name_lines("H200"), vec!["H200"]);
        assert_eq!(
            name_lines("3D controller (vendor unknown)"),
            vec!["3D controller", "(vendor unknown)"]
        );
        // Too long for two balanced lines: the first as full as fits, the rest cut.
        let v = name_lines("GPU (listed by the NVIDIA driver; vendor id unreadable)");
        assert_eq!(v[0], "GPU (listed by the");
        assert!(v[1].ends_with('…'), "{v:?}");
        for l in &v {
            assert!(text_width(l, SMALL) <= GPU_W_MAX - GPU_TEXT_PAD);
        }
    }
}
