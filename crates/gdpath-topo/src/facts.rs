//! Driver facts: what the NVIDIA driver (NVML) and CUDA report about GPUs and GPU pairs.
//!
//! These are plain data. `gdpath-cuda` fills them from a live driver; a snapshot stores them
//! (`driver.json` inside the capture) so that a replayed machine gives the same matrix and the
//! same doctor findings as the live one. Nothing here calls a driver.

use serde::{Deserialize, Serialize};
use std::collections::HashMap;

/// Everything gdpath knows from the driver about one machine.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct DriverFacts {
    /// NVIDIA driver version as NVML prints it, e.g. `"580.159.04"`.
    pub driver_version: Option<String>,
    /// CUDA driver API version as `cuDriverGetVersion` returns it (e.g. 13000 for 13.0).
    pub cuda_driver_version: Option<u32>,
    /// One entry per GPU, in CUDA ordinal order (`CUDA_DEVICE_ORDER=PCI_BUS_ID` order).
    pub gpus: Vec<GpuFacts>,
    /// One entry per ordered GPU pair (a, b) with a != b.
    pub pairs: Vec<GpuPairFacts>,
    /// Why some facts above are missing (a library absent, a call unsupported), so that a
    /// report can say "unknown because ..." instead of guessing. Empty when everything was read.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub gaps: Vec<FactGap>,
}

/// Where a driver fact comes from.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum FactSource {
    /// The CUDA driver API (`libcuda.so.1`).
    Cuda,
    /// NVML (`libnvidia-ml.so.1`).
    Nvml,
}

/// One reason facts are missing: which source, and its error text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct FactGap {
    /// Which library the facts were to come from.
    pub source: FactSource,
    /// What could not be read, e.g. `"all NVML facts"` or `"GPU 0 BAR1"`.
    pub what: String,
    /// The error, e.g. `libnvidia-ml.so.1 could not be loaded ...`.
    pub reason: String,
}

/// Facts about one GPU.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct GpuFacts {
    /// CUDA device ordinal.
    pub ordinal: u32,
    /// PCI address in sysfs form, lower case: `0000:00:06.0`.
    pub pci: String,
    /// Marketing name, e.g. `NVIDIA H200`.
    pub name: String,
    /// Device memory in bytes.
    pub memory_bytes: u64,
    /// BAR1 aperture size in bytes (NVML `nvmlDeviceGetBAR1MemoryInfo`), the window through
    /// which a NIC or another PCIe device can reach GPU memory (GPUDirect RDMA, P2P over PCIe).
    pub bar1_total_bytes: Option<u64>,
    /// BAR1 bytes in use.
    pub bar1_used_bytes: Option<u64>,
    /// PCIe link as NVML reports it.
    pub pcie: Option<PcieLinkFacts>,
    /// NVLink links that are up, with their remote end.
    pub nvlinks: Vec<NvLinkFacts>,
    /// CUDA's `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED`.
    pub gdr_supported: Option<bool>,
    /// CUDA's `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED`.
    pub dma_buf_supported: Option<bool>,
}

/// PCIe generation and width, current and maximum (NVML `nvmlDeviceGetCurrPcieLinkGeneration`
/// and friends). Generation 1..=6; width in lanes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PcieLinkFacts {
    /// Current (trained) PCIe generation, 1..=6.
    pub cur_gen: u32,
    /// Highest PCIe generation the GPU and its slot support, 1..=6.
    pub max_gen: u32,
    /// Current (trained) link width, lanes.
    pub cur_width: u32,
    /// Widest link the GPU and its slot support, lanes.
    pub max_width: u32,
}

/// One NVLink link that is up.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct NvLinkFacts {
    /// Link index on this GPU (0-based, as `nvidia-smi nvlink -s` numbers them).
    pub link: u32,
    /// PCI address of the remote end in sysfs form (another GPU, or an NVSwitch).
    pub remote_pci: String,
    /// Whether the remote end is an NVSwitch rather than a GPU.
    pub remote_is_switch: bool,
    /// Per-direction data rate of this link in GB/s (1e9 B/s), as `nvidia-smi nvlink -s` prints
    /// it (26.562 GB/s per link on H100/H200 NVLink4).
    pub gbps: Option<f64>,
    /// NVLink version as NVML reports it (`nvmlDeviceGetNvLinkVersion`), e.g. `"4.0"`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub version: Option<String>,
}

/// Status of one P2P capability between two GPUs, with the codes and meanings of the legend of
/// `nvidia-smi topo -p2p` (NVML `nvmlGpuP2PStatus_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "UPPERCASE")]
pub enum P2pCap {
    /// `OK`: status OK.
    Ok,
    /// `CNS`: chipset not supported.
    Cns,
    /// `GNS`: GPU not supported.
    Gns,
    /// `TNS`: topology not supported.
    Tns,
    /// `NS`: not supported (disabled by the driver or by a registry key, or simply not possible).
    Ns,
    /// `U`: unknown.
    U,
}

impl P2pCap {
    /// The code `nvidia-smi topo -p2p` prints.
    pub fn code(self) -> &'static str {
        match self {
            P2pCap::Ok => "OK",
            P2pCap::Cns => "CNS",
            P2pCap::Gns => "GNS",
            P2pCap::Tns => "TNS",
            P2pCap::Ns => "NS",
            P2pCap::U => "U",
        }
    }
}

/// NVML's P2P status for the five capabilities of `nvidia-smi topo -p2p r|w|n|a|p`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct NvmlP2pStatus {
    /// Whether the GPU can read the peer's memory over P2P (`NVML_P2P_CAPS_INDEX_READ`).
    pub read: P2pCap,
    /// Whether the GPU can write the peer's memory over P2P (`NVML_P2P_CAPS_INDEX_WRITE`).
    pub write: P2pCap,
    /// Whether the pair is joined by NVLink (`NVML_P2P_CAPS_INDEX_NVLINK`).
    pub nvlink: P2pCap,
    /// Whether P2P atomics are supported (`NVML_P2P_CAPS_INDEX_ATOMICS`).
    pub atomics: P2pCap,
    /// Whether P2P over PCIe is supported (`NVML_P2P_CAPS_INDEX_PCI`).
    pub pci: P2pCap,
}

/// CUDA's view of a GPU pair (`cuDeviceCanAccessPeer`, `cuDeviceGetP2PAttribute`).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CudaP2pAttrs {
    /// Whether the GPU can map the peer's memory (`CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED`).
    pub access_supported: bool,
    /// Whether atomics over the link are native
    /// (`CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED`).
    pub native_atomics: bool,
    /// Whether CUDA arrays can be accessed over the link
    /// (`CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED`).
    pub cuda_array_access: bool,
    /// `CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK`: relative, lower is better.
    pub performance_rank: i32,
}

/// Facts about one ordered GPU pair.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct GpuPairFacts {
    /// Source GPU ordinal.
    pub a: u32,
    /// Destination GPU ordinal.
    pub b: u32,
    /// NVML's P2P status of the pair; `None` when NVML could not say.
    pub nvml: Option<NvmlP2pStatus>,
    /// CUDA's P2P attributes of the pair; `None` when the driver API could not say.
    pub cuda: Option<CudaP2pAttrs>,
}

/// Driver facts looked up in O(1): [`DriverFacts::pair`], [`DriverFacts::gpu`] and
/// [`DriverFacts::nvlink_count`] read their lists, which for every pair of many GPUs is the
/// square of the list. Same answers: the first entry wins where a list repeats one.
#[derive(Debug, Clone)]
pub struct FactsIndex<'f> {
    gpus: HashMap<u32, &'f GpuFacts>,
    pairs: HashMap<(u32, u32), &'f GpuPairFacts>,
    /// Per GPU ordinal: links by remote address (as written), and links to NVSwitches.
    links: HashMap<u32, (HashMap<&'f str, u32>, u32)>,
}

impl<'f> FactsIndex<'f> {
    /// The index of `facts`: O(GPUs + links + pairs).
    pub fn new(facts: &'f DriverFacts) -> Self {
        let mut gpus = HashMap::new();
        let mut links = HashMap::new();
        for g in &facts.gpus {
            if gpus.contains_key(&g.ordinal) {
                continue;
            }
            gpus.insert(g.ordinal, g);
            let (mut direct, mut switch) = (HashMap::new(), 0u32);
            for l in &g.nvlinks {
                if l.remote_is_switch {
                    switch += 1;
                } else {
                    *direct.entry(l.remote_pci.as_str()).or_insert(0) += 1;
                }
            }
            links.insert(g.ordinal, (direct, switch));
        }
        let mut pairs = HashMap::new();
        for p in &facts.pairs {
            pairs.entry((p.a, p.b)).or_insert(p);
        }
        FactsIndex { gpus, pairs, links }
    }

    /// [`DriverFacts::gpu`].
    pub fn gpu(&self, ordinal: u32) -> Option<&'f GpuFacts> {
        self.gpus.get(&ordinal).copied()
    }

    /// [`DriverFacts::pair`].
    pub fn pair(&self, a: u32, b: u32) -> Option<&'f GpuPairFacts> {
        self.pairs.get(&(a, b)).copied()
    }

    /// Every ordered pair the facts describe, each once (the first entry of a repeated one).
    pub fn pairs(&self) -> impl Iterator<Item = &'f GpuPairFacts> + '_ {
        self.pairs.values().copied()
    }

    /// CUDA's peer access from `a` to `b` (`cuDeviceCanAccessPeer`), when recorded.
    pub fn access(&self, a: u32, b: u32) -> Option<bool> {
        self.pair(a, b)
            .and_then(|p| p.cuda)
            .map(|c| c.access_supported)
    }

    /// [`DriverFacts::nvlink_count`].
    pub fn nvlink_count(&self, a: u32, b: u32) -> u32 {
        let (Some(la), Some(lb), Some(gb)) = (self.links.get(&a), self.links.get(&b), self.gpu(b))
        else {
            return 0;
        };
        match la.0.get(gb.pci.as_str()) {
            Some(&n) => n,
            None if la.1 > 0 && lb.1 > 0 => la.1.min(lb.1),
            None => 0,
        }
    }
}

impl DriverFacts {
    /// Number of NVLink links from GPU `a` that end directly at GPU `b`, or — when links go
    /// through NVSwitches — the number of links of `a` that are up to a switch, if `b` also has
    /// links up to a switch. This is the `#` of `NV#` in `nvidia-smi topo -m`.
    pub fn nvlink_count(&self, a: u32, b: u32) -> u32 {
        let (Some(ga), Some(gb)) = (self.gpu(a), self.gpu(b)) else {
            return 0;
        };
        let direct = ga
            .nvlinks
            .iter()
            .filter(|l| !l.remote_is_switch && l.remote_pci == gb.pci)
            .count();
        if direct > 0 {
            return direct as u32;
        }
        let via_switch_a = ga.nvlinks.iter().filter(|l| l.remote_is_switch).count();
        let via_switch_b = gb.nvlinks.iter().filter(|l| l.remote_is_switch).count();
        if via_switch_a > 0 && via_switch_b > 0 {
            via_switch_a.min(via_switch_b) as u32
        } else {
            0
        }
    }

    /// The GPU with this CUDA ordinal.
    pub fn gpu(&self, ordinal: u32) -> Option<&GpuFacts> {
        self.gpus.iter().find(|g| g.ordinal == ordinal)
    }

    /// The GPU at this PCI address (sysfs form, case-insensitive).
    pub fn gpu_by_pci(&self, pci: &str) -> Option<&GpuFacts> {
        self.gpus.iter().find(|g| g.pci.eq_ignore_ascii_case(pci))
    }

    /// Facts for the ordered pair (a, b).
    pub fn pair(&self, a: u32, b: u32) -> Option<&GpuPairFacts> {
        self.pairs.iter().find(|p| p.a == a && p.b == b)
    }
}
