//! The pair classes of `nvidia-smi topo -m`.

use std::fmt;
use std::str::FromStr;

/// How two devices are connected, with the codes and meanings of the legend that
/// `nvidia-smi topo -m` prints:
///
/// | code  | legend |
/// | ----- | ------ |
/// | `X`   | Self |
/// | `SYS` | Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI) |
/// | `NODE`| Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node |
/// | `PHB` | Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU) |
/// | `PXB` | Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge) |
/// | `PIX` | Connection traversing at most a single PCIe bridge |
/// | `NV#` | Connection traversing a bonded set of # NVLinks |
///
/// plus `N/A` (gdpath's own), for a pair whose PCIe path cannot be known because the source has
/// no PCI tree (see [`crate::Machine::classify`] for how each class is decided).
///
/// Ordering is from near to far: `X < NV# < PIX < PXB < PHB < NODE < SYS < N/A`; among NV#,
/// more links sort first (nearer). Serialized as the code (`"NV18"`, `"PIX"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum LinkClass {
    /// The device itself.
    X,
    /// NVLink, with the number of bonded links.
    Nv(u32),
    /// Through at most one PCIe bridge (`nvidia-smi topo -m`'s `PIX`).
    Pix,
    /// Through several PCIe bridges, without crossing a PCIe host bridge (`PXB`).
    Pxb,
    /// Through a PCIe host bridge, the CPU (`PHB`).
    Phb,
    /// Through the interconnect between PCIe host bridges within one NUMA node (`NODE`).
    Node,
    /// Through the SMP interconnect between NUMA nodes (QPI/UPI, Infinity Fabric) (`SYS`).
    Sys,
    /// Not knowable from the source (no PCI tree and no NUMA difference to go by).
    Unknown,
}

impl LinkClass {
    /// The seven legend lines of `nvidia-smi topo -m`, code and meaning, in the order
    /// nvidia-smi prints them.
    pub const LEGEND: [(&'static str, &'static str); 7] = [
        ("X", "Self"),
        ("SYS", "Connection traversing PCIe as well as the SMP interconnect between NUMA nodes (e.g., QPI/UPI)"),
        ("NODE", "Connection traversing PCIe as well as the interconnect between PCIe Host Bridges within a NUMA node"),
        ("PHB", "Connection traversing PCIe as well as a PCIe Host Bridge (typically the CPU)"),
        ("PXB", "Connection traversing multiple PCIe bridges (without traversing the PCIe Host Bridge)"),
        ("PIX", "Connection traversing at most a single PCIe bridge"),
        ("NV#", "Connection traversing a bonded set of # NVLinks"),
    ];

    fn rank(self) -> (u8, u32) {
        match self {
            LinkClass::X => (0, 0),
            LinkClass::Nv(n) => (1, u32::MAX - n),
            LinkClass::Pix => (2, 0),
            LinkClass::Pxb => (3, 0),
            LinkClass::Phb => (4, 0),
            LinkClass::Node => (5, 0),
            LinkClass::Sys => (6, 0),
            LinkClass::Unknown => (7, 0),
        }
    }
}

impl PartialOrd for LinkClass {
    fn partial_cmp(&self, other: &Self) -> Option<std::cmp::Ordering> {
        Some(self.cmp(other))
    }
}

impl Ord for LinkClass {
    fn cmp(&self, other: &Self) -> std::cmp::Ordering {
        self.rank().cmp(&other.rank())
    }
}

impl fmt::Display for LinkClass {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            LinkClass::X => f.write_str("X"),
            LinkClass::Nv(n) => write!(f, "NV{n}"),
            LinkClass::Pix => f.write_str("PIX"),
            LinkClass::Pxb => f.write_str("PXB"),
            LinkClass::Phb => f.write_str("PHB"),
            LinkClass::Node => f.write_str("NODE"),
            LinkClass::Sys => f.write_str("SYS"),
            LinkClass::Unknown => f.write_str("N/A"),
        }
    }
}

/// Why a text is not a link class code.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a topology class (X, NV#, PIX, PXB, PHB, NODE, SYS, N/A): {0:?}")]
pub struct LinkClassError(pub String);

impl FromStr for LinkClass {
    type Err = LinkClassError;

    fn from_str(s: &str) -> Result<Self, Self::Err> {
        Ok(match s.trim() {
            "X" => LinkClass::X,
            "PIX" => LinkClass::Pix,
            "PXB" => LinkClass::Pxb,
            "PHB" => LinkClass::Phb,
            "NODE" => LinkClass::Node,
            "SYS" => LinkClass::Sys,
            "N/A" => LinkClass::Unknown,
            t => match t.strip_prefix("NV").map(str::parse::<u32>) {
                Some(Ok(n)) if n > 0 => LinkClass::Nv(n),
                _ => return Err(LinkClassError(s.to_owned())),
            },
        })
    }
}

serde_via_text!(LinkClass);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn order_and_text() {
        use LinkClass::*;
        let v = [X, Nv(18), Nv(2), Pix, Pxb, Phb, Node, Sys, Unknown];
        for w in v.windows(2) {
            assert!(w[0] < w[1], "{} < {}", w[0], w[1]);
        }
        for c in v {
            assert_eq!(c.to_string().parse::<LinkClass>().unwrap(), c);
        }
        assert_eq!(Nv(18).to_string(), "NV18");
        assert!("NV0".parse::<LinkClass>().is_err());
        assert!("PCI".parse::<LinkClass>().is_err());
        assert_eq!(serde_json::to_string(&Phb).unwrap(), "\"PHB\"");
    }
}
