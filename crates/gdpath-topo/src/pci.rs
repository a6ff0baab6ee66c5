//! PCI addresses (`domain:bus:device.function`) as Linux sysfs writes them.

use std::fmt;
use std::str::FromStr;

/// A PCI function address. Displays as sysfs does: `0000:00:06.0`, with the domain in at least
/// four hex digits and more when it needs them (`10000:00:00.0`, a 32-bit domain such as VMD or
/// Hyper-V use). Ordered by (domain, bus, device, function): "PCI bus order", the order of
/// `CUDA_DEVICE_ORDER=PCI_BUS_ID` and of `nvidia-smi`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct PciAddr {
    /// PCI domain (segment); 0 on most machines.
    pub domain: u32,
    /// Bus number.
    pub bus: u8,
    /// Device number, 0..=31.
    pub device: u8,
    /// Function number, 0..=7.
    pub function: u8,
}

/// Why a text is not a PCI address.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("not a PCI address (domain:bus:device.function): {0:?}")]
pub struct PciAddrError(pub String);

impl fmt::Display for PciAddr {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "{:04x}:{:02x}:{:02x}.{:x}",
            self.domain, self.bus, self.device, self.function
        )
    }
}

impl FromStr for PciAddr {
    type Err = PciAddrError;

    /// Accepts `DDDD:BB:dd.f` (sysfs), `BB:dd.f` (domain 0, lspci short form) and NVML's
    /// `DDDDDDDD:BB:dd.f` (8-digit domain), case-insensitive.
    fn from_str(s: &str) -> Result<Self, Self::Err> {
        let err = || PciAddrError(s.to_owned());
        let (head, function) = s.rsplit_once('.').ok_or_else(err)?;
        let mut parts = head.rsplitn(3, ':');
        let device = parts.next().ok_or_else(err)?;
        let bus = parts.next().ok_or_else(err)?;
        let domain = parts.next().unwrap_or("0");
        let hex = |t: &str, max_len: usize| -> Result<u32, PciAddrError> {
            if t.is_empty() || t.len() > max_len || !t.bytes().all(|b| b.is_ascii_hexdigit()) {
                return Err(err());
            }
            u32::from_str_radix(t, 16).map_err(|_| err())
        };
        let domain = hex(domain, 8)?;
        let bus = hex(bus, 2)?;
        let device = hex(device, 2)?;
        let function = hex(function, 1)?;
        if device > 31 || function > 7 {
            return Err(err());
        }
        Ok(PciAddr {
            domain,
            bus: bus as u8,
            device: device as u8,
            function: function as u8,
        })
    }
}

serde_via_text!(PciAddr);

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_and_parse() {
        let a: PciAddr = "0000:00:06.0".parse().unwrap();
        assert_eq!(a.to_string(), "0000:00:06.0");
        let b: PciAddr = "10000:00:04.0".parse().unwrap();
        assert_eq!(b.domain, 0x10000);
        assert_eq!(b.to_string(), "10000:00:04.0");
        let c: PciAddr = "00000000:1B:00.0".parse().unwrap();
        assert_eq!(c.to_string(), "0000:1b:00.0");
        let d: PciAddr = "82:00.1".parse().unwrap();
        assert_eq!(d.to_string(), "0000:82:00.1");
        assert!(a < b && a < c);
    }

    #[test]
    fn rejects_garbage() {
        for bad in [
            "",
            "pci0000:00",
            "0000:00:20.0",
            "0000:00:00.8",
            "0000:100:00.0",
            "x:y:z.w",
        ] {
            assert!(bad.parse::<PciAddr>().is_err(), "{bad}");
        }
    }
}
