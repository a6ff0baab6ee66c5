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
    pub id: FindingId,
    pub path: Area,
    /// What the finding is about: `"GPU0-GPU1"`, `"GPU0"`, `"/data"`, `"system"`.
    pub subject: String,
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
}
