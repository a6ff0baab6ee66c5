//! Findings: the doctor's results, and the reason a transfer did not take its preferred path.
//!
//! A finding has a stable id (`p2p.acs-enabled`, `gds.nvidia-fs-missing`, …). The doctor reports
//! findings about a machine; the path planner attaches the id of the finding that explains a
//! fallback to the transfer that fell back. Both use the ids in [`ids`], so a user who sees an id
//! in a transfer result finds the same id, with evidence and remedy, in `gdpath doctor`.

use serde::{Deserialize, Serialize};
use std::fmt;

/// Which data path (or the system as a whole) a finding is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Area {
    /// GPUDirect P2P: GPU ↔ GPU inside a node.
    P2p,
    /// GPUDirect RDMA: GPU memory ↔ NIC.
    Gdr,
    /// GPUDirect Storage: file ↔ GPU memory.
    Gds,
    /// File ↔ host memory (O_DIRECT, buffered).
    Storage,
    /// Driver, kernel, limits, virtualisation.
    System,
}

impl Area {
    /// The name JSON documents and `gdpath doctor --need` use: `p2p`, `gdr`, `gds`, `storage`,
    /// `system`.
    pub fn as_str(self) -> &'static str {
        match self {
            Area::P2p => "p2p",
            Area::Gdr => "gdr",
            Area::Gds => "gds",
            Area::Storage => "storage",
            Area::System => "system",
        }
    }
}

/// How a finding affects its path.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Status {
    /// The check passed.
    Ok,
    /// The path works, but slower or less directly than it could (a fallback, a narrow link).
    Degraded,
    /// The path cannot be used.
    Unavailable,
    /// The facts needed could not be read (permissions, missing files, a virtual machine).
    Unknown,
    /// The check needs live hardware and was not run (e.g. replaying a snapshot).
    NotRun,
}

impl Status {
    /// The name JSON documents use: `ok`, `degraded`, `unavailable`, `unknown`, `not-run`.
    pub fn as_str(self) -> &'static str {
        match self {
            Status::Ok => "ok",
            Status::Degraded => "degraded",
            Status::Unavailable => "unavailable",
            Status::Unknown => "unknown",
            Status::NotRun => "not-run",
        }
    }
}

/// A stable finding id such as `gds.compat-mode`. Ids never change meaning once published.
#[derive(Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct FindingId(pub String);

impl FindingId {
    /// The id as text.
    pub fn as_str(&self) -> &str {
        &self.0
    }
}

impl From<&str> for FindingId {
    fn from(s: &str) -> Self {
        FindingId(s.to_owned())
    }
}

impl fmt::Display for FindingId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.0)
    }
}

/// One finding: what was checked, on what, the verdict, the evidence and the remedy.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Finding {
    /// The check's stable id (`gds.nvidia-fs-missing`, `p2p.unsupported`, ...).
    pub id: FindingId,
    /// The area of the data path it checks.
    pub path: Area,
    /// What the finding is about: `"GPU0-GPU1"`, `"GPU0"`, `"/data"`, `"system"`.
    pub subject: String,
    /// The verdict.
    pub status: Status,
    /// What was observed and where it was read (file, API), e.g.
    /// `"/proc/driver/nvidia-fs/version: absent"`.
    pub evidence: String,
    /// What to change; empty when nothing needs changing.
    pub remedy: String,
}

/// The stable finding ids shared by the doctor and the path planner.
pub mod ids {
    /// O_DIRECT refused by the file system (tmpfs on old kernels, overlayfs, some network file
    /// systems): the buffered path was used.
    pub const STORAGE_ODIRECT_UNSUPPORTED: &str = "storage.odirect-unsupported";
    /// O_DIRECT switched off by the caller (`DirectIo::Off`, `--buffered`): the buffered path was
    /// used.
    pub const STORAGE_ODIRECT_DISABLED: &str = "storage.odirect-disabled";
    /// io_uring could not be set up (old kernel, seccomp, `io_uring_disabled` sysctl): the
    /// buffered thread-pool path was used.
    pub const STORAGE_IO_URING_UNAVAILABLE: &str = "storage.io-uring-unavailable";
    /// Peer access between two GPUs is not possible (CUDA `cuDeviceCanAccessPeer` = 0).
    pub const P2P_UNSUPPORTED: &str = "p2p.unsupported";
    /// P2P switched off by the caller or by `NCCL_P2P_DISABLE`-style configuration.
    pub const P2P_DISABLED: &str = "p2p.disabled";
    /// ACS redirect enabled on a bridge between two devices: P2P traffic goes up to the root
    /// complex.
    pub const P2P_ACS_ENABLED: &str = "p2p.acs-enabled";
    /// No RDMA device on the machine.
    pub const GDR_NO_RDMA_DEVICE: &str = "gdr.no-rdma-device";
    /// Neither `nvidia_peermem` nor `nv_peer_mem` is loaded and no dma-buf path exists.
    pub const GDR_PEERMEM_MISSING: &str = "gdr.peermem-missing";
    /// The UCX build in use has no CUDA transports: GPU memory goes through pinned staging.
    pub const GDR_UCX_NO_CUDA: &str = "gdr.ucx-no-cuda";
    /// The peer agent of a remote region is gone (connection failed or closed).
    pub const NET_PEER_FAILED: &str = "net.peer-failed";
    /// The nvidia-fs kernel module is not loaded: cuFile cannot do native GDS.
    pub const GDS_NVIDIA_FS_MISSING: &str = "gds.nvidia-fs-missing";
    /// cuFile runs in compatibility mode (POSIX reads through its own bounce buffers).
    pub const GDS_COMPAT_MODE: &str = "gds.compat-mode";
    /// libcufile could not be loaded.
    pub const GDS_CUFILE_MISSING: &str = "gds.cufile-missing";
    /// cuFile refused to register the file handle.
    pub const GDS_HANDLE_REGISTER_FAILED: &str = "gds.handle-register-failed";
    /// libcuda could not be loaded: no GPU path is possible.
    pub const SYSTEM_CUDA_MISSING: &str = "system.cuda-missing";
    /// Host memory was pageable: it went through gdpath's pinned staging buffers.
    pub const HOST_PAGEABLE: &str = "system.host-pageable";

    // ---- gdpath doctor. Each id is one check; `docs/doctor.md` gives its rule, the
    // rule's source and the remedy. A finding with status `ok` carries the id of the check that
    // passed. ----

    /// The NVIDIA kernel driver and its version (`/proc/driver/nvidia/version`, NVML).
    pub const SYSTEM_DRIVER: &str = "system.driver";
    /// The running kernel (`/proc/sys/kernel/osrelease`); dma-buf GDR needs 5.12 or later.
    pub const SYSTEM_KERNEL: &str = "system.kernel";
    /// No NVIDIA GPU in the PCI device list: no GPUDirect path exists.
    pub const SYSTEM_NO_GPU: &str = "system.no-gpu";
    /// RLIMIT_MEMLOCK below physical memory: RDMA registration of host memory can fail.
    pub const SYSTEM_MEMLOCK_LOW: &str = "system.memlock-low";
    /// The IOMMU translates DMA (`DMA`/`DMA-FQ` groups): peer DMA goes through it.
    pub const SYSTEM_IOMMU: &str = "system.iommu";
    /// Running in a virtual machine: the PCI tree, ACS and NUMA seen are the hypervisor's.
    pub const SYSTEM_VIRTUAL_MACHINE: &str = "system.virtual-machine";
    /// Running in a container: modules, limits and devices seen may be the host's or hidden.
    pub const SYSTEM_CONTAINER: &str = "system.container";
    /// NVML reports P2P "GNS" (GPU not supported) for the pair: the SKU has no P2P.
    pub const P2P_GPU_NOT_SUPPORTED: &str = "p2p.gpu-not-supported";
    /// The IOMMU translates DMA for a GPU of a pair that talks over PCIe.
    pub const P2P_IOMMU_TRANSLATED: &str = "p2p.iommu-translated";
    /// The pair crosses the SMP interconnect between sockets (SYS).
    pub const P2P_CROSS_SOCKET: &str = "p2p.cross-socket";
    /// Fewer NVLinks up on a GPU than its SKU has.
    pub const P2P_NVLINK_DEGRADED: &str = "p2p.nvlink-degraded";
    /// GPUs joined by NVLink whose NVML P2P status is not OK.
    pub const P2P_NVLINK_NO_P2P: &str = "p2p.nvlink-no-p2p";
    /// NCCL's P2P transport will not be used for the pair (its P2P level, default PXB).
    pub const P2P_NCCL_LEVEL: &str = "p2p.nccl-level";
    /// `nvidia_peermem`/`nv_peer_mem` loaded but not registered in `/sys/kernel/mm/memory_peers`.
    pub const GDR_PEERMEM_UNREGISTERED: &str = "gdr.peermem-unregistered";
    /// The dma-buf path for GDR is missing a piece (kernel ≥ 5.12, CUDA attribute, rdma-core).
    pub const GDR_DMABUF_UNAVAILABLE: &str = "gdr.dmabuf-unavailable";
    /// CUDA's `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` is 0 for the GPU.
    pub const GDR_CUDA_UNSUPPORTED: &str = "gdr.cuda-unsupported";
    /// BAR1 smaller than GPU memory: registrations are limited to the BAR1 window.
    pub const GDR_BAR1_SMALL: &str = "gdr.bar1-small";
    /// GPU and its nearest RDMA NIC farther apart than NCCL's GDR level (default PXB).
    pub const GDR_NIC_FAR: &str = "gdr.nic-far";
    /// The PCIe link of a GPU or RDMA NIC trained below its maximum.
    pub const GDR_LINK_DEGRADED: &str = "gdr.link-degraded";
    /// cufile.json in force and its settings (compat mode, direct I/O size, P2PDMA).
    pub const GDS_CUFILE_CONFIG: &str = "gds.cufile-config";
    /// The file system of a path is not one nvidia-fs supports (ext4 ordered, XFS, ...).
    pub const GDS_FS_UNSUPPORTED: &str = "gds.fs-unsupported";
    /// The path's block device is a device-mapper volume (LVM, dm-crypt, multipath).
    pub const GDS_DEVICE_MAPPER: &str = "gds.device-mapper";
    /// The path's block device is not an NVMe namespace (virtio, SCSI, md, loop).
    pub const GDS_NOT_NVME: &str = "gds.not-nvme";
    /// The NVMe behind a path is beyond PXB from a GPU (through the CPU or across sockets).
    pub const GDS_NVME_FAR: &str = "gds.nvme-far";
    /// Measured: GPU↔GPU "P2P" ran at no more than 1.2× the staged fallback.
    pub const P2P_MEASURED_FALLBACK: &str = "p2p.measured-fallback";
    /// Measured: GDR ran at no more than 1.2× the staged fallback.
    pub const GDR_MEASURED_FALLBACK: &str = "gdr.measured-fallback";
    /// Measured: GDS read below 0.8× the staged (POSIX) fallback.
    pub const GDS_MEASURED_FALLBACK: &str = "gds.measured-fallback";
}
