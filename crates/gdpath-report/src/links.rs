//! The label of a PCIe link where it enters its box: as trained (`Gen4 x16`), as capable when
//! the source gives only that (`≤Gen3 x16`), or downtrained (`Gen3 x8↓Gen4 x16`).

use gdpath_topo::{Device, DeviceKind, PcieLink};

/// A link label: text, CSS class (`link`, `link-down`, `link-cap`, `link-idle`) and tooltip.
#[derive(Debug, Clone, PartialEq)]
pub struct LinkLabel {
    /// The label's text (`Gen4 x16`, `≤Gen3 x16`, `Gen3 x8↓Gen4 x16`).
    pub text: String,
    /// CSS class: `link`, `link-down` (downtrained), `link-cap` (capability only) or `link-idle`.
    pub class: &'static str,
    /// Tooltip: the link's trained and capable generation and width, as the source gives them.
    pub title: String,
}

/// The link label of a box: its own link, marked downtrained when it or a bridge folded into
/// it trained below its maximum. GPUs slow their link when idle, so a GPU whose speed alone is
/// lower is marked as possibly idle, as the doctor judges it (`gdr.link-degraded`: unknown).
pub fn link_label(dev: &Device, chain: &[&Device]) -> Option<LinkLabel> {
    let l = dev.link;
    let known = l.cur_gts.is_some() || l.cur_width.is_some();
    let max_known = l.max_gts.is_some() || l.max_width.is_some();
    let bad_bridge = chain.iter().find(|b| b.link.is_degraded());
    let bw = |l: &PcieLink| match (l.limit_gbps(), l.max_limit_gbps()) {
        (Some(c), Some(m)) => format!(", {c:.2} of {m:.2} GB/s per direction"),
        (None, Some(m)) => format!(", {m:.2} GB/s per direction"),
        _ => String::new(),
    };
    let (text, class, mut title) = if known && l.is_degraded() {
        let idle = dev.kind == DeviceKind::Gpu && l.speed_degraded() && !l.width_degraded();
        let text = format!("{}↓{}", l.cur_text(), l.max_text());
        let title = format!(
            "{}: trained {} of {}{}{}",
            dev.pci,
            l.cur_text(),
            l.max_text(),
            bw(&l),
            if idle {
                " — GPUs lower their link speed when idle: check under load"
            } else {
                ""
            }
        );
        (text, if idle { "link-idle" } else { "link-down" }, title)
    } else if known {
        (
            l.cur_text(),
            "link",
            format!("{}: PCIe {}{}", dev.pci, l.cur_text(), bw(&l)),
        )
    } else if max_known {
        (
            format!("≤{}", l.max_text()),
            "link-cap",
            format!(
                "{}: capable of PCIe {}{} (the source does not say how it trained)",
                dev.pci,
                l.max_text(),
                bw(&l)
            ),
        )
    } else if bad_bridge.is_none() {
        return None;
    } else {
        (String::new(), "link-down", String::new())
    };
    let (text, class) = match bad_bridge {
        Some(b) => {
            title = format!(
                "{title}{}bridge {} above it trained {} of {}",
                if title.is_empty() { "" } else { "; " },
                b.pci,
                b.link.cur_text(),
                b.link.max_text()
            );
            let text = if text.is_empty() {
                format!("{}↓{}", b.link.cur_text(), b.link.max_text())
            } else {
                text
            };
            (text, "link-down")
        }
        None => (text, class),
    };
    Some(LinkLabel { text, class, title })
}
