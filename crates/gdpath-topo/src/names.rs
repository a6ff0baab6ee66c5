//! Readable names for the PCI devices gdpath cares about.
//!
//! A deliberately small table written for gdpath (not taken from `pci.ids`): the vendors of GPUs,
//! NICs and NVMe drives, and the device ids of common data-centre GPUs and NICs plus the devices
//! in the project's test machines. Anything else is named from its vendor and its PCI class
//! (class names from the PCI Code and ID Assignment Specification), e.g.
//! `NVIDIA 3D controller [10de:1234]`.

/// Sentinel for a vendor or device id that could not be read. 0xFFFF is what a PCI read from an
/// absent function returns, so no real device carries it.
pub const UNKNOWN_ID: u16 = 0xffff;

/// Sentinel for a class code that could not be read (class codes are 24 bits).
pub const UNKNOWN_CLASS: u32 = 0xffff_ffff;

/// PCI vendor ids used in gdpath's logic.
pub mod vendor {
    /// NVIDIA Corporation.
    pub const NVIDIA: u16 = 0x10de;
    /// Advanced Micro Devices (the ATI vendor id its GPUs carry).
    pub const AMD_ATI: u16 = 0x1002;
    /// Mellanox Technologies (NVIDIA networking: ConnectX, BlueField).
    pub const MELLANOX: u16 = 0x15b3;
    /// Amazon.com (the EFA NICs of AWS instances).
    pub const AMAZON: u16 = 0x1d0f;
}

/// Short vendor name, or `None` when not in the table.
pub fn vendor_name(vendor: u16) -> Option<&'static str> {
    Some(match vendor {
        0x10de => "NVIDIA",
        0x1002 => "AMD",
        0x1022 => "AMD",
        0x15b3 => "Mellanox",
        0x14e4 => "Broadcom",
        0x1000 => "Broadcom / LSI",
        0x8086 => "Intel",
        0x1d0f => "Amazon",
        0x1077 => "QLogic",
        0x144d => "Samsung",
        0x1af4 => "virtio",
        0x1b36 => "QEMU",
        0x1014 => "IBM",
        0x1a03 => "ASPEED",
        0x102b => "Matrox",
        0x1013 => "Cirrus Logic",
        0x15ad => "VMware",
        0x1414 => "Microsoft",
        0x1344 => "Micron",
        0x1c5c => "SK hynix",
        0x1e0f => "KIOXIA",
        0x1924 => "Solarflare",
        0x19e5 => "Huawei",
        _ => return None,
    })
}

/// Model name of a device, or `None` when not in the table.
pub fn device_name(vendor: u16, device: u16) -> Option<&'static str> {
    Some(match (vendor, device) {
        // NVIDIA data-centre and common GPUs.
        (0x10de, 0x2330) => "H100 SXM5 80GB",
        (0x10de, 0x2331) => "H100 PCIe",
        (0x10de, 0x2335) => "H200",
        (0x10de, 0x20b0) => "A100 SXM4 40GB",
        (0x10de, 0x20b2) => "A100 SXM4 80GB",
        (0x10de, 0x20b5) => "A100 PCIe 80GB",
        (0x10de, 0x20f1) => "A100 PCIe 40GB",
        (0x10de, 0x2236) => "A10",
        (0x10de, 0x2237) => "A10G",
        (0x10de, 0x27b8) => "L4",
        (0x10de, 0x26b9) => "L40S",
        (0x10de, 0x1eb8) => "T4",
        (0x10de, 0x1db1) => "V100 SXM2 16GB",
        (0x10de, 0x1db4) => "V100 PCIe 16GB",
        (0x10de, 0x1db5) => "V100 SXM2 32GB",
        (0x10de, 0x1db6) => "V100 PCIe 32GB",
        (0x10de, 0x15f7) => "Tesla P100 PCIe 12GB",
        (0x10de, 0x15f8) => "Tesla P100 PCIe 16GB",
        (0x10de, 0x15f9) => "Tesla P100 SXM2 16GB",
        (0x10de, 0x1094) => "Tesla M2075",
        (0x10de, 0x2204) => "GeForce RTX 3090",
        (0x10de, 0x2684) => "GeForce RTX 4090",
        (0x10de, 0x2b85) => "GeForce RTX 5090",
        // AMD Instinct.
        (0x1002, 0x740c) => "Instinct MI250X/MI250",
        (0x1002, 0x740f) => "Instinct MI210",
        (0x1002, 0x74a1) => "Instinct MI300X",
        // Mellanox / NVIDIA networking.
        (0x15b3, 0x6746) => "ConnectX-2",
        (0x15b3, 0x1003) => "ConnectX-3",
        (0x15b3, 0x1007) => "ConnectX-3 Pro",
        (0x15b3, 0x1013) => "ConnectX-4",
        (0x15b3, 0x1015) => "ConnectX-4 Lx",
        (0x15b3, 0x1017) => "ConnectX-5",
        (0x15b3, 0x1019) => "ConnectX-5 Ex",
        (0x15b3, 0x101b) => "ConnectX-6",
        (0x15b3, 0x101d) => "ConnectX-6 Dx",
        (0x15b3, 0x101f) => "ConnectX-6 Lx",
        (0x15b3, 0x1021) => "ConnectX-7",
        (0x15b3, 0x1023) => "ConnectX-8",
        (0x15b3, 0xa2d6) => "BlueField-2",
        (0x15b3, 0xa2dc) => "BlueField-3",
        // Amazon.
        (0x1d0f, 0xefa0) => "Elastic Fabric Adapter (EFA)",
        (0x1d0f, 0xefa1) => "Elastic Fabric Adapter (EFA)",
        (0x1d0f, 0xefa2) => "Elastic Fabric Adapter (EFA)",
        (0x1d0f, 0xefa3) => "Elastic Fabric Adapter (EFA)",
        (0x1d0f, 0xefa4) => "Elastic Fabric Adapter (EFA)",
        (0x1d0f, 0xec20) => "Elastic Network Adapter (ENA)",
        (0x1d0f, 0x8061) => "EBS NVMe controller",
        (0x1d0f, 0xcd01) => "instance-store NVMe SSD",
        // Broadcom.
        (0x14e4, 0x1639) => "NetXtreme II BCM5709 Gigabit Ethernet",
        (0x14e4, 0x16d7) => "BCM57414 NetXtreme-E 25G Ethernet",
        (0x14e4, 0x1750) => "BCM57508 NetXtreme-E 100G/200G Ethernet",
        // Intel.
        (0x8086, 0x0953) => "SSD DC P3700 / 750 (NVMe)",
        (0x8086, 0x1521) => "I350 Gigabit Ethernet",
        (0x8086, 0x10c9) => "82576 Gigabit Ethernet",
        (0x8086, 0x1572) => "X710 10GbE",
        (0x8086, 0x1593) => "E810-C 100GbE",
        (0x8086, 0x159b) => "E810-XXV 25GbE",
        (0x8086, 0x225c) => "Xeon Phi coprocessor",
        // QLogic.
        (0x1077, 0x7322) => "IBA7322 QDR InfiniBand HCA",
        // Samsung NVMe.
        (0x144d, 0xa808) => "NVMe SSD PM981/PM983",
        (0x144d, 0xa80a) => "NVMe SSD PM9A1/PM9A3/980 PRO",
        (0x144d, 0xa824) => "NVMe SSD PM173X",
        (0x1af4, d) => return virtio_name(d),
        _ => return None,
    })
}

/// virtio device names: modern ids are 0x1040 + the virtio device type (virtio 1.x
/// specification, "Device Types"); legacy ids 0x1000..=0x103f are named by their transitional
/// type.
fn virtio_name(device: u16) -> Option<&'static str> {
    let ty = match device {
        0x1000 => 1,
        0x1001 => 2,
        0x1002 => 5,
        0x1003 => 3,
        0x1004 => 8,
        0x1005 => 4,
        0x1009 => 9,
        0x1040..=0x107f => device - 0x1040,
        _ => return None,
    };
    Some(match ty {
        1 => "network device",
        2 => "block device",
        3 => "console",
        4 => "entropy source",
        5 => "memory balloon",
        8 => "SCSI host",
        9 => "9P transport",
        16 => "GPU device",
        18 => "input device",
        19 => "socket device",
        26 => "file system device",
        _ => return None,
    })
}

/// Name of a PCI class (base class and subclass, the upper 16 bits of a 24-bit class code),
/// from the PCI Code and ID Assignment Specification. Unknown subclasses fall back to the base
/// class name.
pub fn class_name(class: u32) -> &'static str {
    if class == UNKNOWN_CLASS {
        return "device of unknown class";
    }
    let base_sub = (class >> 8) & 0xffff;
    match base_sub {
        0x0100 => "SCSI storage controller",
        0x0101 => "IDE interface",
        0x0104 => "RAID controller",
        0x0106 => "SATA controller",
        0x0107 => "SAS controller",
        0x0108 => "NVMe controller",
        0x0200 => "Ethernet controller",
        0x0207 => "InfiniBand controller",
        0x0280 => "network controller",
        0x0300 => "VGA controller",
        0x0302 => "3D controller",
        0x0380 => "display controller",
        0x0600 => "host bridge",
        0x0601 => "ISA bridge",
        0x0604 => "PCI bridge",
        0x0609 => "PCI bridge (semi-transparent)",
        0x0b40 => "co-processor",
        0x0c03 => "USB controller",
        0x0c05 => "SMBus controller",
        0x0c06 => "InfiniBand controller",
        0x1200 => "processing accelerator",
        _ => match base_sub >> 8 {
            0x01 => "storage controller",
            0x02 => "network controller",
            0x03 => "display controller",
            0x04 => "multimedia controller",
            0x05 => "memory controller",
            0x06 => "bridge",
            0x07 => "communication controller",
            0x08 => "system peripheral",
            0x0b => "processor",
            0x0c => "serial bus controller",
            0x11 => "signal processing controller",
            0x12 => "processing accelerator",
            _ => "device",
        },
    }
}

/// A readable name for a device. The table first; then `source_name` (a name the source itself
/// gave, such as hwloc's `PCIVendor`/`PCIDevice` info); then vendor and class with the ids:
/// `NVIDIA 3D controller [10de:1234]`.
pub fn display_name(vendor: u16, device: u16, class: u32, source_name: Option<&str>) -> String {
    let vname = vendor_name(vendor);
    if let (Some(v), Some(d)) = (vname, device_name(vendor, device)) {
        return format!("{v} {d}");
    }
    if let Some(s) = source_name.filter(|s| !s.trim().is_empty()) {
        return s.trim().to_owned();
    }
    let cname = class_name(class);
    match (vendor, vname) {
        (UNKNOWN_ID, _) => format!("{cname} (vendor unknown)"),
        (_, Some(v)) => format!("{v} {cname} [{vendor:04x}:{device:04x}]"),
        (_, None) => format!("{cname} [{vendor:04x}:{device:04x}]"),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names() {
        assert_eq!(display_name(0x10de, 0x2335, 0x030200, None), "NVIDIA H200");
        assert_eq!(
            display_name(0x10de, 0x1234, 0x030200, None),
            "NVIDIA 3D controller [10de:1234]"
        );
        assert_eq!(
            display_name(0x1af4, 0x1041, 0x020000, None),
            "virtio network device"
        );
        assert_eq!(
            display_name(UNKNOWN_ID, UNKNOWN_ID, 0x030000, None),
            "VGA controller (vendor unknown)"
        );
        assert_eq!(
            display_name(0x1234, 0x5678, 0x010802, Some("Acme SSD")),
            "Acme SSD"
        );
        assert_eq!(class_name(0x0c0600), "InfiniBand controller");
        assert_eq!(class_name(0x088000), "system peripheral");
    }
}
