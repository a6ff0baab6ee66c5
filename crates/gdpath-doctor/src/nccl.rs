//! What NCCL will do for a GPU pair or a GPU↔NIC pair, by its path levels.
//!
//! Rules (NCCL `src/graph/paths.cc`, `ncclTopoCheckP2p` and `ncclTopoCheckGdr`, NCCL 2.2x):
//! - P2P transport: used when the pair's path type is at most the P2P level. The default level
//!   is `PXB` ("don't use P2P across CPU host bridges"), raised to `SYS` on x86 AMD hosts with
//!   at most two GPUs. `NCCL_P2P_DISABLE=1` sets it to `LOC` (never); `NCCL_P2P_LEVEL` sets it
//!   by name (`LOC`, `NVL`, `PIX`, `PXB`, `PHB`, `SYS`) or by the old numbers 0–5
//!   (LOC, PIX, PXB, PHB, SYS, SYS). NCCL also refuses P2P when NVML's read or write status is
//!   not OK.
//! - GPUDirect RDMA: used when the GPU↔NIC path type is at most the GDR level, default `PXB`;
//!   `NCCL_NET_GDR_LEVEL` sets it as above.
//!
//! NCCL has no NODE class: two devices that meet at the CPU are `PHB` in its terms, so gdpath's
//! NODE maps to NCCL's PHB.

use gdpath_topo::LinkClass;
use std::fmt;

/// NCCL's path types, nearest first (a subset: the ones a level can name).
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
pub enum NcclLevel {
    /// Same device: "never use P2P" as a level.
    Loc,
    /// NVLink.
    Nvl,
    /// At most one PCIe bridge between the two devices (NCCL's `PATH_PIX`).
    Pix,
    /// Several PCIe bridges, none of them the CPU's host bridge (NCCL's `PATH_PXB`).
    Pxb,
    /// Through a PCIe host bridge of a CPU (NCCL's `PATH_PHB`; gdpath's `PHB` and `NODE`).
    Phb,
    /// Across the interconnect between CPU sockets or NUMA nodes (NCCL's `PATH_SYS`).
    Sys,
}

impl fmt::Display for NcclLevel {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            NcclLevel::Loc => "LOC",
            NcclLevel::Nvl => "NVL",
            NcclLevel::Pix => "PIX",
            NcclLevel::Pxb => "PXB",
            NcclLevel::Phb => "PHB",
            NcclLevel::Sys => "SYS",
        })
    }
}

impl NcclLevel {
    /// Parses a level as NCCL does: a name, or an old-style number 0–5 (larger numbers mean
    /// SYS). `None` for anything else (NCCL then keeps its default).
    pub fn parse(text: &str) -> Option<NcclLevel> {
        let t = text.trim();
        let by_name = match t {
            "LOC" => Some(NcclLevel::Loc),
            "NVL" => Some(NcclLevel::Nvl),
            "PIX" => Some(NcclLevel::Pix),
            "PXB" => Some(NcclLevel::Pxb),
            "PHB" => Some(NcclLevel::Phb),
            "SYS" => Some(NcclLevel::Sys),
            _ => None,
        };
        if by_name.is_some() {
            return by_name;
        }
        if !t.starts_with(|c: char| c.is_ascii_digit()) {
            return None;
        }
        let digits: String = t.chars().take_while(|c| c.is_ascii_digit()).collect();
        let n: u64 = digits.parse().unwrap_or(u64::MAX);
        Some(match n {
            0 => NcclLevel::Loc,
            1 => NcclLevel::Pix,
            2 => NcclLevel::Pxb,
            3 => NcclLevel::Phb,
            _ => NcclLevel::Sys,
        })
    }

    /// NCCL's path type for a gdpath link class; `None` for `X` and unknown (`N/A`).
    pub fn of_class(class: LinkClass) -> Option<NcclLevel> {
        Some(match class {
            LinkClass::Nv(_) => NcclLevel::Nvl,
            LinkClass::Pix => NcclLevel::Pix,
            LinkClass::Pxb => NcclLevel::Pxb,
            LinkClass::Phb | LinkClass::Node => NcclLevel::Phb,
            LinkClass::Sys => NcclLevel::Sys,
            LinkClass::X | LinkClass::Unknown => return None,
        })
    }
}

/// CPU family as NCCL distinguishes it for its P2P default.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CpuKind {
    /// An Intel x86 CPU (`vendor_id` `GenuineIntel`): NCCL's default P2P level `PXB` applies.
    IntelX86,
    /// An AMD x86 CPU (`vendor_id` `AuthenticAMD`): NCCL raises the P2P level to `SYS` with at most
    /// two GPUs.
    AmdX86,
    /// Any other or unknown CPU (ARM, POWER, Zhaoxin, ...): NCCL's default applies.
    Other,
}

impl CpuKind {
    /// From `/proc/cpuinfo`'s `vendor_id` (x86 only): `GenuineIntel`, `AuthenticAMD`.
    pub fn from_cpuinfo(cpuinfo: &str) -> CpuKind {
        let vendor = cpuinfo.lines().find_map(|l| {
            let (k, v) = l.split_once(':')?;
            (k.trim() == "vendor_id").then(|| v.trim().to_owned())
        });
        match vendor.as_deref() {
            Some("GenuineIntel") => CpuKind::IntelX86,
            Some("AuthenticAMD") => CpuKind::AmdX86,
            _ => CpuKind::Other,
        }
    }
}

/// The P2P level NCCL uses and why: (level, explanation naming the variable or default).
pub fn p2p_level(
    disable: Option<&str>,
    level: Option<&str>,
    cpu: CpuKind,
    gpus: usize,
) -> (NcclLevel, String) {
    if let Some(d) = disable {
        if parse_c_long(d) == Some(1) {
            return (NcclLevel::Loc, format!("NCCL_P2P_DISABLE={d}"));
        }
    }
    if let Some(l) = level {
        if let Some(lv) = NcclLevel::parse(l) {
            return (lv, format!("NCCL_P2P_LEVEL={l}"));
        }
    }
    if cpu == CpuKind::AmdX86 && gpus <= 2 {
        return (
            NcclLevel::Sys,
            "NCCL's default on an AMD x86 host with at most two GPUs".to_owned(),
        );
    }
    (NcclLevel::Pxb, "NCCL's default".to_owned())
}

/// The GPUDirect RDMA level NCCL uses and why.
pub fn gdr_level(level: Option<&str>) -> (NcclLevel, String) {
    if let Some(l) = level {
        if let Some(lv) = NcclLevel::parse(l) {
            return (lv, format!("NCCL_NET_GDR_LEVEL={l}"));
        }
    }
    (NcclLevel::Pxb, "NCCL's default".to_owned())
}

/// `strtol(s, NULL, 0)` for the values NCCL compares: decimal, `0x` hex or octal prefix.
fn parse_c_long(s: &str) -> Option<i64> {
    let t = s.trim();
    if let Some(h) = t.strip_prefix("0x").or_else(|| t.strip_prefix("0X")) {
        return i64::from_str_radix(h, 16).ok();
    }
    let digits: String = t
        .chars()
        .enumerate()
        .take_while(|(i, c)| c.is_ascii_digit() || (*i == 0 && (*c == '-' || *c == '+')))
        .map(|(_, c)| c)
        .collect();
    digits.parse().ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn levels() {
        assert_eq!(NcclLevel::parse("PXB"), Some(NcclLevel::Pxb));
        assert_eq!(NcclLevel::parse("3"), Some(NcclLevel::Phb));
        assert_eq!(NcclLevel::parse("9"), Some(NcclLevel::Sys));
        assert_eq!(
            NcclLevel::parse("pxb"),
            None,
            "NCCL compares names case-sensitively"
        );
        assert_eq!(NcclLevel::of_class(LinkClass::Node), Some(NcclLevel::Phb));
        assert_eq!(NcclLevel::of_class(LinkClass::Nv(18)), Some(NcclLevel::Nvl));
        let (l, why) = p2p_level(Some("1"), Some("SYS"), CpuKind::IntelX86, 8);
        assert_eq!((l, why.as_str()), (NcclLevel::Loc, "NCCL_P2P_DISABLE=1"));
        assert_eq!(
            p2p_level(Some("0"), None, CpuKind::IntelX86, 8).0,
            NcclLevel::Pxb
        );
        assert_eq!(p2p_level(None, None, CpuKind::AmdX86, 2).0, NcclLevel::Sys);
        assert_eq!(p2p_level(None, None, CpuKind::AmdX86, 4).0, NcclLevel::Pxb);
        assert_eq!(
            p2p_level(None, Some("bogus"), CpuKind::Other, 2).0,
            NcclLevel::Pxb
        );
        assert_eq!(gdr_level(Some("SYS")).0, NcclLevel::Sys);
        assert_eq!(
            CpuKind::from_cpuinfo("processor\t: 0\nvendor_id\t: AuthenticAMD\n"),
            CpuKind::AmdX86
        );
    }
}
