//! The shapes every part of the machine drawing shares: points and straight pieces of line,
//! the text sizes, a route's stroke and the clearance kept from it, and the drawn boxes
//! ([`Node`]) that the layout places and the NVLink band, lanes and routes reach. Below
//! `layout`, `lanes`, `nvlink` and `route_labels`, which all use them.

use crate::links::LinkLabel;
use crate::svg::{Rect, Text};

/// A point, px.
pub type P = (f64, f64);

/// A straight piece of line from one point to another.
pub type Seg = (P, P);

/// Size of the main labels (device names in boxes), px.
pub const FONT: f64 = 11.0;
/// Size of secondary labels (link labels, notes, the legend), px.
pub const SMALL: f64 = 9.5;

/// Half the width of a route's stroke, px.
pub const HALF_STROKE: f64 = 1.3;
/// Clearance kept between a route's stroke and the labels beside its line, px.
pub const CLEAR: f64 = 2.0;

/// The unit direction of a segment, rounded to the axes (the lines are orthogonal).
pub fn dir(a: P, b: P) -> (i8, i8) {
    let sign = |d: f64| {
        if d > 0.01 {
            1
        } else if d < -0.01 {
            -1
        } else {
            0
        }
    };
    (sign(b.0 - a.0), sign(b.1 - a.1))
}

/// The thin box a line's stroke covers.
pub fn seg_rect(s: &Seg, half: f64) -> Rect {
    let ((x0, y0), (x1, y1)) = *s;
    Rect::new(
        x0.min(x1) - half,
        y0.min(y1) - half,
        (x1 - x0).abs() + 2.0 * half,
        (y1 - y0).abs() + 2.0 * half,
    )
}

/// What a box is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum NodeKind {
    /// A NUMA node: a header with its CPUs and a strip for host memory.
    Numa,
    /// A PCIe host bridge (root complex).
    HostBridge,
    /// A PCIe switch: a bridge below which several physical devices hang.
    Switch,
    /// The devices of a source without a PCI tree, whose attachment is not known.
    NoTree,
    /// A GPU.
    Gpu,
    /// A network controller (NIC).
    Nic,
    /// An NVMe controller.
    Nvme,
}

impl NodeKind {
    /// Devices (leaves) rather than hubs.
    pub fn is_device(self) -> bool {
        matches!(self, NodeKind::Gpu | NodeKind::Nic | NodeKind::Nvme)
    }
}

/// A drawn box and how lines reach it.
#[derive(Debug, Clone)]
pub struct Node {
    /// What the box is.
    pub kind: NodeKind,
    /// Stable across layouts of one machine: `numa:0`, `hb:pci0000:00`, `sw:0000:00:01.0`,
    /// or the device id.
    pub key: String,
    /// Position and size of the box, px.
    pub rect: Rect,
    /// Index of the box's parent in [`crate::layout::Layout::nodes`] (`None` at the top).
    pub parent: Option<usize>,
    /// The device id of a GPU, NIC or NVMe (`GPU0`).
    pub id: Option<String>,
    /// The PCI addresses of the box's device and of the bridges folded into its link.
    pub pci: Vec<String>,
    /// Where lines from above reach the box.
    pub attach: P,
    /// The tree line of this box: from `attach` up to its parent's rail (empty at the top).
    pub up: Vec<P>,
    /// Hubs: the y of the rail below the box, and the x where a line through the box runs.
    pub rail_y: f64,
    /// Hubs: the x where a line through the box runs, px.
    pub through_x: f64,
    /// The labels inside the box.
    pub texts: Vec<Text>,
    /// Tooltip.
    pub title: String,
    /// The link into the box, and the labels' CSS class when it is downtrained.
    pub link: Option<LinkLabel>,
    /// NUMA nodes: the y of the middle of the host-memory strip (where staged paths turn), and
    /// the y where other paths crossing the node run (the top of the strip).
    pub mem_y: f64,
    /// NUMA nodes: the y where other paths crossing the node run (the top of the strip), px.
    pub pass_y: f64,
}
