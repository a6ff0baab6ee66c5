//! PCIe Access Control Services (ACS), read from a bridge's configuration space.
//!
//! ACS is a PCIe extended capability (capability id 0x000D, PCI Express Base Specification,
//! "ACS Extended Capability"). Its control register decides whether a downstream or root port
//! forwards peer-to-peer requests directly or redirects them up to the root complex (and the
//! IOMMU). Request Redirect (RR) or Completion Redirect (CR) enabled on a bridge between two
//! devices sends their P2P traffic through the root complex: slower, and on many platforms not
//! possible at all, which is why NVIDIA asks for ACS to be disabled for GPUDirect P2P and RDMA.

use serde::{Deserialize, Serialize};

/// ACS extended capability id.
pub const ACS_CAP_ID: u16 = 0x000d;

/// Extended configuration space starts here; a `config` file this short or shorter holds only
/// the legacy header (unprivileged reads of sysfs `config` return 64 bytes).
pub const EXT_CONFIG_START: usize = 0x100;

/// The seven ACS bits, as they appear in both the capability and the control register
/// (bit 0 SV .. bit 6 DT).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct AcsFlags {
    /// Source Validation.
    pub sv: bool,
    /// Translation Blocking.
    pub tb: bool,
    /// P2P Request Redirect.
    pub rr: bool,
    /// P2P Completion Redirect.
    pub cr: bool,
    /// Upstream Forwarding.
    pub uf: bool,
    /// P2P Egress Control.
    pub ec: bool,
    /// Direct Translated P2P.
    pub dt: bool,
}

impl AcsFlags {
    /// Decodes the low seven bits of an ACS capability or control register.
    pub fn from_bits(bits: u16) -> Self {
        let b = |n: u16| bits & (1 << n) != 0;
        AcsFlags {
            sv: b(0),
            tb: b(1),
            rr: b(2),
            cr: b(3),
            uf: b(4),
            ec: b(5),
            dt: b(6),
        }
    }

    /// Names of the bits that are set, in register order (`["SV", "RR", "CR"]`).
    pub fn names(&self) -> Vec<&'static str> {
        [
            (self.sv, "SV"),
            (self.tb, "TB"),
            (self.rr, "RR"),
            (self.cr, "CR"),
            (self.uf, "UF"),
            (self.ec, "EC"),
            (self.dt, "DT"),
        ]
        .into_iter()
        .filter_map(|(on, n)| on.then_some(n))
        .collect()
    }
}

/// What a bridge's configuration space says about ACS. A device whose extended configuration
/// space could not be read has no `AcsState` at all (`Device::acs` is `None`: unknown).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum AcsState {
    /// The extended configuration space was read and has no ACS capability: the bridge forwards
    /// P2P traffic directly.
    Absent,
    /// The capability is there; `control` is what is enabled.
    Present {
        /// The ACS features the bridge supports (the ACS Capability register, PCIe Base
        /// Specification).
        capability: AcsFlags,
        /// The ACS features enabled (the ACS Control register, PCIe Base Specification).
        control: AcsFlags,
    },
}

impl AcsState {
    /// True when P2P requests or completions are redirected to the root complex (RR or CR
    /// enabled): the setting that hurts GPUDirect P2P and RDMA.
    pub fn redirects_p2p(&self) -> bool {
        matches!(self, AcsState::Present { control, .. } if control.rr || control.cr)
    }
}

/// Finds the ACS capability in a configuration space dump (`/sys/bus/pci/devices/*/config`).
/// `None` (unknown) when the dump does not reach the extended space (≤ 256 bytes), or when its
/// first extended header reads as all ones (no extended space behind a conventional PCI bridge
/// or a VM that hides it). Walks the capability list with bounds and loop checks.
pub fn parse_acs(config: &[u8]) -> Option<AcsState> {
    if config.len() <= EXT_CONFIG_START {
        return None;
    }
    let dword = |off: usize| -> Option<u32> {
        let b = config.get(off..off + 4)?;
        Some(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    };
    let first = dword(EXT_CONFIG_START)?;
    if first == 0xffff_ffff {
        return None;
    }
    let mut off = EXT_CONFIG_START;
    // The extended space is 4 KiB: at most 1024 headers fit; more means a loop.
    for _ in 0..1024 {
        let header = dword(off)?;
        if header == 0 {
            return Some(AcsState::Absent);
        }
        let id = (header & 0xffff) as u16;
        let next = (header >> 20) as usize & 0xffc;
        if id == ACS_CAP_ID {
            let regs = dword(off + 4)?;
            return Some(AcsState::Present {
                capability: AcsFlags::from_bits((regs & 0xffff) as u16),
                control: AcsFlags::from_bits((regs >> 16) as u16),
            });
        }
        if next < EXT_CONFIG_START || next <= off {
            return Some(AcsState::Absent);
        }
        off = next;
    }
    Some(AcsState::Absent)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn put(cfg: &mut [u8], off: usize, v: u32) {
        cfg[off..off + 4].copy_from_slice(&v.to_le_bytes());
    }

    #[test]
    fn finds_acs_after_another_capability() {
        let mut cfg = vec![0u8; 4096];
        // AER (id 1) at 0x100 -> next 0x148; ACS at 0x148, last.
        put(&mut cfg, 0x100, 0x0001 | (1 << 16) | (0x148 << 20));
        put(&mut cfg, 0x148, u32::from(ACS_CAP_ID) | (1 << 16));
        // capability: SV TB RR CR UF EC (0x3f); control: SV RR CR UF (0x1d)
        put(&mut cfg, 0x14c, 0x003f | (0x001d << 16));
        let acs = parse_acs(&cfg).unwrap();
        assert!(acs.redirects_p2p());
        match acs {
            AcsState::Present {
                capability,
                control,
            } => {
                assert_eq!(capability.names(), ["SV", "TB", "RR", "CR", "UF", "EC"]);
                assert_eq!(control.names(), ["SV", "RR", "CR", "UF"]);
            }
            AcsState::Absent => panic!("ACS not found"),
        }
    }

    #[test]
    fn header_only_is_unknown_and_no_cap_is_absent() {
        assert_eq!(parse_acs(&[0u8; 64]), None);
        assert_eq!(parse_acs(&[0u8; 256]), None);
        assert_eq!(parse_acs(&[0xffu8; 4096]), None);
        let mut cfg = vec![0u8; 4096];
        put(&mut cfg, 0x100, 0x0001 | (1 << 16)); // AER, no next
        assert_eq!(parse_acs(&cfg), Some(AcsState::Absent));
        // A self-loop ends the walk instead of spinning.
        put(&mut cfg, 0x100, 0x0001 | (1 << 16) | (0x100 << 20));
        assert_eq!(parse_acs(&cfg), Some(AcsState::Absent));
        // ACS with control 0 does not redirect.
        put(&mut cfg, 0x100, u32::from(ACS_CAP_ID) | (1 << 16));
        put(&mut cfg, 0x104, 0x001f);
        assert!(!parse_acs(&cfg).unwrap().redirects_p2p());
        // Truncated right after the header: the registers are out of bounds.
        assert_eq!(parse_acs(&cfg[..0x104]), None);
    }
}
