//! PCI addresses in the sysfs form, from what CUDA and NVML print.

use gdpath_topo::PciAddr;

use crate::error::CudaError;

/// Normalise a PCI address to the sysfs form: `DDDD:BB:DD.F`, lower case, domain at least four
/// hex digits. Accepts NVML's eight-digit domain (`00000000:00:06.0`), CUDA's form
/// (`0000:00:06.0`) and a missing domain (`00:06.0`, domain 0), as [`PciAddr`] parses them.
///
/// Errors: [`CudaError::InvalidArgument`] for anything that is not a PCI address.
pub fn normalize_pci(s: &str) -> Result<String, CudaError> {
    s.trim()
        .parse::<PciAddr>()
        .map(|a| a.to_string())
        .map_err(|_| CudaError::InvalidArgument(format!("not a PCI address: {s:?}")))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pci_forms() {
        assert_eq!(normalize_pci("00000000:00:06.0").unwrap(), "0000:00:06.0");
        assert_eq!(normalize_pci("0000:00:07.0").unwrap(), "0000:00:07.0");
        assert_eq!(normalize_pci("00000000:1B:00.0").unwrap(), "0000:1b:00.0");
        assert_eq!(normalize_pci("00010000:c1:00.1").unwrap(), "10000:c1:00.1");
        assert_eq!(normalize_pci("3b:00.0").unwrap(), "0000:3b:00.0");
        for bad in [
            "",
            "0000:00:06",
            "zz:00.0",
            "0000:00:20.0",
            "0000:00:06.8",
            "0:0:0:0.0",
        ] {
            assert!(normalize_pci(bad).is_err(), "{bad:?} accepted");
        }
    }
}
