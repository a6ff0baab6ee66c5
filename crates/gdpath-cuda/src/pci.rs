//! PCI addresses in the sysfs form, from what CUDA and NVML print.

use crate::error::CudaError;

/// Normalise a PCI address to the sysfs form: `DDDD:BB:DD.F`, lower case, domain at least four
/// hex digits. Accepts NVML's eight-digit domain (`00000000:00:06.0`), CUDA's form
/// (`0000:00:06.0`) and a missing domain (`00:06.0`, domain 0).
///
/// Errors: [`CudaError::InvalidArgument`] for anything that is not a PCI address.
pub fn normalize_pci(s: &str) -> Result<String, CudaError> {
    let bad = || CudaError::InvalidArgument(format!("not a PCI address: {s:?}"));
    let s = s.trim();
    let (rest, func) = s.rsplit_once('.').ok_or_else(bad)?;
    let parts: Vec<&str> = rest.split(':').collect();
    let (domain, bus, dev) = match parts.as_slice() {
        [d, b, v] => (*d, *b, *v),
        [b, v] => ("0", *b, *v),
        _ => return Err(bad()),
    };
    let hex = |x: &str, max_digits: usize| -> Result<u32, CudaError> {
        if x.is_empty() || x.len() > max_digits {
            return Err(bad());
        }
        u32::from_str_radix(x, 16).map_err(|_| bad())
    };
    let domain = hex(domain, 8)?;
    let bus = hex(bus, 2)?;
    let dev = hex(dev, 2)?;
    let func = hex(func, 1)?;
    if dev > 0x1f || func > 7 {
        return Err(bad());
    }
    Ok(format!("{domain:04x}:{bus:02x}:{dev:02x}.{func:x}"))
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
