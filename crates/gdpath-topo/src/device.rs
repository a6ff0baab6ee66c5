//! One PCI function and what gdpath knows about it.

use crate::acs::AcsState;
use crate::link::PcieLink;
use crate::names::{self, vendor, UNKNOWN_CLASS, UNKNOWN_ID};
use crate::pci::PciAddr;
use serde::{Deserialize, Serialize, Serializer};

/// What a device is, for gdpath's purposes. Serialized in lower case (`"gpu"`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum DeviceKind {
    /// An NVIDIA display or 3D controller (class 0x03xx), or an AMD compute GPU (class 0x0302 or
    /// 0x0380; AMD parts of class 0x0300 are mostly on-board server VGA chips and stay `Other`).
    Gpu,
    /// A network controller (class 0x02xx), an InfiniBand controller of class 0x0c06 (older HCAs
    /// such as QLogic's), or any device with an RDMA device under it.
    Nic,
    /// An NVMe controller (class 0x0108).
    Nvme,
    /// A PCI-to-PCI bridge (class 0x0604 or 0x0609): root ports and PCIe switch ports.
    Bridge,
    /// Everything else.
    Other,
}

impl DeviceKind {
    /// Decides the kind from the class code, the vendor id, whether an RDMA device sits under the
    /// function, and whether the source itself names it an NVIDIA GPU (listed by the NVIDIA
    /// driver in `/proc/driver/nvidia/gpus`, or a GPU entry of an NCCL topology file) — that
    /// evidence counts when the vendor id could not be read.
    pub fn decide(class: u32, vendor_id: u16, has_rdma: bool, gpu_evidence: bool) -> DeviceKind {
        let base = (class >> 16) & 0xff;
        let base_sub = (class >> 8) & 0xffff;
        if class != UNKNOWN_CLASS && base == 0x03 {
            let amd_compute = vendor_id == vendor::AMD_ATI && matches!(base_sub, 0x0302 | 0x0380);
            if vendor_id == vendor::NVIDIA || gpu_evidence || amd_compute {
                return DeviceKind::Gpu;
            }
            return DeviceKind::Other;
        }
        if class == UNKNOWN_CLASS && gpu_evidence {
            return DeviceKind::Gpu;
        }
        if has_rdma || (class != UNKNOWN_CLASS && (base == 0x02 || base_sub == 0x0c06)) {
            return DeviceKind::Nic;
        }
        match base_sub {
            _ if class == UNKNOWN_CLASS => DeviceKind::Other,
            0x0108 => DeviceKind::Nvme,
            0x0604 | 0x0609 => DeviceKind::Bridge,
            _ => DeviceKind::Other,
        }
    }

    /// Prefix of the short ids (`GPU0`, `NIC0`, `NVME0`); `None` for bridges and others, whose id
    /// is their PCI address.
    pub fn id_prefix(self) -> Option<&'static str> {
        match self {
            DeviceKind::Gpu => Some("GPU"),
            DeviceKind::Nic => Some("NIC"),
            DeviceKind::Nvme => Some("NVME"),
            DeviceKind::Bridge | DeviceKind::Other => None,
        }
    }
}

/// What shows that a device can do RDMA ([`Device::rdma_capable`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RdmaEvidence<'a> {
    /// An RDMA device the source lists under the function (`mlx5_0`, `rdmap16s27`).
    Device(&'a str),
    /// The function's PCI identity (`Amazon EFA`): no RDMA device named, the hardware has one.
    Identity(&'static str),
}

impl std::fmt::Display for RdmaEvidence<'_> {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            RdmaEvidence::Device(name) => write!(f, "RDMA device {name}"),
            RdmaEvidence::Identity(what) => write!(f, "{what}, by its PCI identity"),
        }
    }
}

/// NVIDIA GPU products that have no NVLink connector, by PCI device id (vendor 0x10de): a pair
/// with one of them moves P2P data over PCIe only, so the doctor judges its PCIe path even where
/// the source does not describe NVLink ([`Device::pcie_only`]). The device ids are those of
/// NVIDIA's driver (`src/nvidia/generated/g_nv_name_released.h` in NVIDIA's
/// open-gpu-kernel-modules, which names every board of each id); the lack of NVLink is each
/// product's datasheet or product brief:
///
/// - L40S (0x26b9) and L40 (0x26b5): the L40/L40S datasheets give "PCIe Gen4 x16" as the only
///   interconnect and "NVLink support: No"; Ada Lovelace dropped NVLink (NVIDIA, GTC 2022).
/// - L4 (0x27b8): L4 datasheet, interconnect "PCIe Gen4 x16", no NVLink.
/// - A10 (0x2236): A10 datasheet, interconnect "PCIe Gen4 64 GB/s", no NVLink bridge.
/// - A16 and A2 (0x25b6, one id for both): A16 product brief PB-10518-001 and A2 datasheet,
///   PCIe Gen4 (A2: x8), no NVLink.
/// - T4 (0x1eb8): T4 datasheet, interconnect "PCIe Gen3 x16", no NVLink.
/// - RTX 6000 Ada Generation (0x26b1): its datasheet has no NVLink (Ada has none).
///
/// Not listed, as they have an NVLink bridge connector: A40 (0x2235; product brief
/// PB-09976-001, "NVLink: 2-way, 112.5 GB/s"), A30, A100 PCIe, H100 PCIe, RTX A6000; SXM parts
/// have NVLink by design. An id not listed stays unknown where the source is silent.
pub const PCIE_ONLY_GPUS: [(u16, &str); 7] = [
    (0x26b9, "L40S"),
    (0x26b5, "L40"),
    (0x27b8, "L4"),
    (0x2236, "A10"),
    (0x25b6, "A16/A2"),
    (0x1eb8, "T4"),
    (0x26b1, "RTX 6000 Ada Generation"),
];

/// One PCI function.
///
/// Unknown values are `None` (or the documented sentinels for ids), never a guess: sysfs
/// `numa_node` = -1 is `numa: None`, not node 0.
#[derive(Debug, Clone, PartialEq, Serialize)]
pub struct Device {
    /// `GPU0`, `NIC0`, `NVME0` (numbered per kind in PCI bus order), or the PCI address for
    /// bridges and other devices.
    pub id: String,
    /// The function's PCI address (domain:bus:device.function).
    pub pci: PciAddr,
    /// What the device is (GPU, NIC, NVMe, bridge, other), from its class code.
    pub kind: DeviceKind,
    /// 24-bit class code (`0x030200`); [`names::UNKNOWN_CLASS`] when unreadable (JSON: null).
    #[serde(serialize_with = "ser_class")]
    pub class: u32,
    /// Vendor id; [`names::UNKNOWN_ID`] (0xFFFF) when unreadable (JSON: null).
    #[serde(serialize_with = "ser_id")]
    pub vendor: u16,
    /// Device id; [`names::UNKNOWN_ID`] when unreadable (JSON: null).
    #[serde(serialize_with = "ser_id")]
    pub device: u16,
    /// Readable name (see [`names::display_name`]).
    pub name: Option<String>,
    /// NUMA node from the source (sysfs `numa_node`; -1 there is `None`).
    pub numa: Option<u32>,
    /// CPUs local to the device, as a cpulist (`0-31`).
    pub cpus: Option<String>,
    /// The device's PCIe link: trained and capable speed and width.
    pub link: PcieLink,
    /// The bridge directly above, `None` on a root bus or when the tree is unknown.
    pub parent: Option<PciAddr>,
    /// The PCIe host bridge (root complex) the device is under, as sysfs names it
    /// (`pci0000:00`); `None` when the tree is unknown.
    pub host_bridge: Option<String>,
    /// RDMA devices (`/sys/class/infiniband/*`) under this function, e.g. `mlx5_0`.
    pub rdma: Vec<String>,
    /// Network interfaces (`/sys/class/net/*`) under this function.
    pub netdevs: Vec<String>,
    /// Whole block devices (not partitions) under this function, e.g. `nvme0n1`.
    pub block: Vec<String>,
    /// ACS state of a bridge; `None` when unknown (config space not readable past 64 or 256
    /// bytes) or not read (non-bridges).
    pub acs: Option<AcsState>,
    /// IOMMU group number (`iommu_group` link); `None` when there is none or it is unreadable.
    pub iommu_group: Option<u32>,
    /// NUMA node holding the GPU's own memory when the driver exposes it as one
    /// (`/proc/driver/nvidia/gpus/*/numa_status`, coherent GPU memory on POWER9 or Grace): the
    /// `GPU NUMA ID` column of `nvidia-smi topo -m`.
    pub gpu_numa_id: Option<u32>,
    /// What an NCCL topology file says of GPUDirect RDMA through this NIC: the `gdr` attribute
    /// of its `<net>` entries, which NCCL writes from its network plugin's answer for the device
    /// (1: it can read and write GPU memory; 0: it cannot, e.g. the socket transport on an
    /// Ethernet NIC); true when any entry says 1. `None` when the source does not say (every
    /// other source, and NCCL files without the attribute).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub nccl_gdr: Option<bool>,
    /// True when the PCI address is not a real one (NCCL XML's virtual switches `ffff:ff:xx.0`,
    /// or a NIC that NCCL XML lists without an address).
    #[serde(skip_serializing_if = "std::ops::Not::not")]
    pub synthetic: bool,
}

fn ser_id<S: Serializer>(v: &u16, s: S) -> Result<S::Ok, S::Error> {
    if *v == UNKNOWN_ID {
        s.serialize_none()
    } else {
        s.collect_str(&format_args!("0x{v:04x}"))
    }
}

fn ser_class<S: Serializer>(v: &u32, s: S) -> Result<S::Ok, S::Error> {
    if *v == UNKNOWN_CLASS {
        s.serialize_none()
    } else {
        s.collect_str(&format_args!("0x{v:06x}"))
    }
}

impl Device {
    /// A device with only its address known; readers fill in the rest.
    pub fn new(pci: PciAddr) -> Self {
        Device {
            id: String::new(),
            pci,
            kind: DeviceKind::Other,
            class: UNKNOWN_CLASS,
            vendor: UNKNOWN_ID,
            device: UNKNOWN_ID,
            name: None,
            numa: None,
            cpus: None,
            link: PcieLink::default(),
            parent: None,
            host_bridge: None,
            rdma: Vec::new(),
            netdevs: Vec::new(),
            block: Vec::new(),
            acs: None,
            iommu_group: None,
            gpu_numa_id: None,
            nccl_gdr: None,
            synthetic: false,
        }
    }

    /// The names of this function's interfaces: its RDMA devices, then its network interfaces
    /// (`mlx5_0`, `eth0`).
    pub fn interface_names(&self) -> Vec<&str> {
        self.rdma
            .iter()
            .chain(&self.netdevs)
            .map(String::as_str)
            .collect()
    }

    /// The readable name, or one made from vendor and class when the reader gave none.
    pub fn display_name(&self) -> String {
        self.name
            .clone()
            .unwrap_or_else(|| names::display_name(self.vendor, self.device, self.class, None))
    }

    /// The product name when this function is an NVIDIA GPU that has no NVLink
    /// ([`PCIE_ONLY_GPUS`]): P2P between it and any GPU goes over PCIe, whatever the source says
    /// of NVLink. `None` for every other device, NVLink-capable GPUs included.
    pub fn pcie_only(&self) -> Option<&'static str> {
        if self.kind != DeviceKind::Gpu || self.vendor != names::vendor::NVIDIA {
            return None;
        }
        PCIE_ONLY_GPUS
            .iter()
            .find(|(id, _)| *id == self.device)
            .map(|(_, name)| *name)
    }

    /// Why this function is an RDMA-capable NIC judging by its PCI identity alone, for sources
    /// that list no RDMA devices (hwloc or NCCL XML, where `/sys/class/infiniband` is absent):
    /// class 0x0207 (InfiniBand controller, PCI Code and ID Assignment Specification), Mellanox
    /// ConnectX (vendor 0x15b3: InfiniBand or RoCE), Amazon EFA (0x1d0f:0xefa0–0xefa4; Linux's
    /// `efa` driver table). `None`
    /// when the identity says nothing (an RDMA driver may still serve it: iWARP, Broadcom RoCE).
    /// Whether the RDMA driver is loaded is a separate question only a live machine answers.
    pub fn rdma_capable_by_id(&self) -> Option<&'static str> {
        if self.class >> 8 == 0x0207 {
            return Some("InfiniBand controller (class 0x0207)");
        }
        let network = self.class >> 16 == 0x02;
        match (self.vendor, self.device) {
            (names::vendor::MELLANOX, _) if network => Some("Mellanox ConnectX (InfiniBand/RoCE)"),
            (names::vendor::AMAZON, 0xefa0..=0xefa4) => Some("Amazon EFA"),
            _ => None,
        }
    }

    /// Why this function can do RDMA: an RDMA device the source lists under it (`mlx5_0`), else
    /// its PCI identity ([`Device::rdma_capable_by_id`]: EFA, ConnectX, class 0x0207). `None`
    /// when neither says so. This is how the doctor and `topo` recognise RDMA NICs in sources
    /// that name no RDMA devices (hwloc or NCCL XML without `<net>` entries).
    pub fn rdma_capable(&self) -> Option<RdmaEvidence<'_>> {
        match self.rdma.first() {
            Some(name) => Some(RdmaEvidence::Device(name)),
            None => self.rdma_capable_by_id().map(RdmaEvidence::Identity),
        }
    }

    /// The name a matrix legend shows for a NIC or NVMe: the RDMA device, else the interface or
    /// block device, else the PCI address (`mlx5_0`, `eth0`, `nvme0n1`).
    pub fn os_name(&self) -> String {
        self.rdma
            .first()
            .or(self.netdevs.first())
            .or(self.block.first())
            .cloned()
            .unwrap_or_else(|| self.pci.to_string())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rdma_capability_by_pci_identity() {
        let dev = |class: u32, vendor: u16, device: u16| {
            let mut d = Device::new(PciAddr {
                domain: 0,
                bus: 1,
                device: 0,
                function: 0,
            });
            (d.class, d.vendor, d.device) = (class, vendor, device);
            d
        };
        assert!(dev(0x020700, UNKNOWN_ID, UNKNOWN_ID)
            .rdma_capable_by_id()
            .is_some());
        assert!(dev(0x020000, 0x15b3, 0x101b).rdma_capable_by_id().is_some());
        assert!(dev(0x020000, 0x1d0f, 0xefa0).rdma_capable_by_id().is_some());
        // An ENA (Amazon Ethernet, 0x1d0f:0xec20) and an Intel NIC are not RDMA by identity.
        assert!(dev(0x020000, 0x1d0f, 0xec20).rdma_capable_by_id().is_none());
        assert!(dev(0x020000, 0x8086, 0x1572).rdma_capable_by_id().is_none());
        // A Mellanox function that is not a network controller (e.g. a BlueField bridge).
        assert!(dev(0x060400, 0x15b3, 0xa2d6).rdma_capable_by_id().is_none());
    }

    #[test]
    fn kinds() {
        use DeviceKind::*;
        assert_eq!(DeviceKind::decide(0x030200, 0x10de, false, false), Gpu);
        assert_eq!(DeviceKind::decide(0x030000, 0x10de, false, false), Gpu);
        assert_eq!(DeviceKind::decide(0x030000, 0x1a03, false, false), Other);
        assert_eq!(DeviceKind::decide(0x030000, UNKNOWN_ID, false, true), Gpu);
        assert_eq!(DeviceKind::decide(0x030000, 0x1002, false, false), Other);
        assert_eq!(DeviceKind::decide(0x038000, 0x1002, false, false), Gpu);
        assert_eq!(DeviceKind::decide(0x028000, 0x15b3, true, false), Nic);
        assert_eq!(DeviceKind::decide(0x0c0600, 0x1077, false, false), Nic);
        assert_eq!(DeviceKind::decide(0x010802, 0x8086, false, false), Nvme);
        assert_eq!(DeviceKind::decide(0x060400, 0x8086, false, false), Bridge);
        assert_eq!(DeviceKind::decide(0x060000, 0x8086, false, false), Other);
        assert_eq!(
            DeviceKind::decide(UNKNOWN_CLASS, UNKNOWN_ID, false, false),
            Other
        );
    }

    #[test]
    fn json_ids() {
        let mut d = Device::new("0000:00:06.0".parse().unwrap());
        d.vendor = 0x10de;
        d.class = 0x030200;
        let v = serde_json::to_value(&d).unwrap();
        assert_eq!(v["vendor"], "0x10de");
        assert_eq!(v["device"], serde_json::Value::Null);
        assert_eq!(v["class"], "0x030200");
        assert_eq!(v["pci"], "0000:00:06.0");
        assert!(v.get("synthetic").is_none());
    }
}
