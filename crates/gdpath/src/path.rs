//! The path a transfer really took.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The data path that moved a descriptor pair's bytes. Names follow docs/design.md.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "path", rename_all = "kebab-case")]
pub enum DataPath {
    /// GPU ↔ GPU peer copy over NVLink (GPUDirect P2P).
    P2pNvlink,
    /// GPU ↔ GPU peer copy over PCIe (GPUDirect P2P).
    P2pPcie,
    /// Copy inside one GPU's memory.
    DeviceLocal,
    /// Host → GPU copy by the GPU's copy engine. `pinned` false means pageable memory that went
    /// through gdpath's pinned staging buffers.
    HostToDevice {
        /// The host memory was page-locked; false when it went through the staging buffers.
        pinned: bool,
    },
    /// GPU → host copy, as [`DataPath::HostToDevice`].
    DeviceToHost {
        /// The host memory was page-locked; false when it went through the staging buffers.
        pinned: bool,
    },
    /// GPU → pinned host bounce buffers → GPU, for pairs without P2P.
    Staged,
    /// cuFile with nvidia-fs: NVMe DMA straight into GPU memory (GPUDirect Storage).
    GdsNative,
    /// cuFile in compatibility mode (no nvidia-fs): POSIX I/O through cuFile's bounce buffers.
    GdsCompat,
    /// O_DIRECT + io_uring into aligned (pinned, where a GPU is involved) host memory.
    PosixDirect,
    /// Buffered pread/pwrite through the page cache, where O_DIRECT is refused.
    PosixBuffered,
    /// Host memory ↔ host memory, memcpy.
    HostCopy,
    /// UCX moved the bytes with the named transport (`tcp`, `posix`, `sysv`, `cma`, `rc_mlx5`,
    /// `cuda_ipc`, …). Shared (`Arc<str>`): every pair's plan and report carries it.
    Ucx {
        /// UCX's name of the transport (`tcp`, `cma`, `rc_mlx5`, ...).
        transport: Arc<str>,
    },
    /// An RDMA NIC read or wrote GPU memory itself (GPUDirect RDMA), through UCX transport
    /// `transport`.
    Gdr {
        /// UCX's name of the RDMA transport (`rc_mlx5`, `dc_mlx5`, ...).
        transport: Arc<str>,
    },
}

impl DataPath {
    /// A short stable name for tables and JSON rows, e.g. `p2p-nvlink`, `ucx:tcp`.
    pub fn name(&self) -> String {
        match self {
            DataPath::P2pNvlink => "p2p-nvlink".into(),
            DataPath::P2pPcie => "p2p-pcie".into(),
            DataPath::DeviceLocal => "device-local".into(),
            DataPath::HostToDevice { pinned: true } => "h2d-pinned".into(),
            DataPath::HostToDevice { pinned: false } => "h2d-pageable".into(),
            DataPath::DeviceToHost { pinned: true } => "d2h-pinned".into(),
            DataPath::DeviceToHost { pinned: false } => "d2h-pageable".into(),
            DataPath::Staged => "staged".into(),
            DataPath::GdsNative => "gds-native".into(),
            DataPath::GdsCompat => "gds-compat".into(),
            DataPath::PosixDirect => "posix-direct".into(),
            DataPath::PosixBuffered => "posix-buffered".into(),
            DataPath::HostCopy => "host-copy".into(),
            DataPath::Ucx { transport } => format!("ucx:{transport}"),
            DataPath::Gdr { transport } => format!("gdr:{transport}"),
        }
    }
}

/// A name that is no [`DataPath`]'s: its text names the unknown name and the known ones. The
/// engine's errors know paths, not the other way round, so it is its own type; it becomes
/// [`crate::Error::Config`] with the same text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnknownPath(pub String);

impl std::str::FromStr for DataPath {
    type Err = UnknownPath;

    /// The inverse of [`DataPath::name`]: `posix-direct`, `h2d-pinned`, `ucx:tcp`, `gdr:rc_mlx5`, ...
    /// (for strict-mode lists given as text: the Python binding's `accept=`). Errors:
    /// [`UnknownPath`] (converted into [`crate::Error::Config`]) naming the unknown name and the
    /// known ones.
    fn from_str(s: &str) -> Result<DataPath, UnknownPath> {
        let fixed = [
            DataPath::P2pNvlink,
            DataPath::P2pPcie,
            DataPath::DeviceLocal,
            DataPath::HostToDevice { pinned: true },
            DataPath::HostToDevice { pinned: false },
            DataPath::DeviceToHost { pinned: true },
            DataPath::DeviceToHost { pinned: false },
            DataPath::Staged,
            DataPath::GdsNative,
            DataPath::GdsCompat,
            DataPath::PosixDirect,
            DataPath::PosixBuffered,
            DataPath::HostCopy,
        ];
        if let Some(p) = fixed.iter().find(|p| p.name() == s) {
            return Ok(p.clone());
        }
        match s.split_once(':') {
            Some(("ucx", t)) if !t.is_empty() => Ok(DataPath::Ucx {
                transport: t.into(),
            }),
            Some(("gdr", t)) if !t.is_empty() => Ok(DataPath::Gdr {
                transport: t.into(),
            }),
            _ => {
                let known: Vec<String> = fixed.iter().map(DataPath::name).collect();
                Err(UnknownPath(format!(
                    "unknown path {s:?}: one of {}, ucx:TRANSPORT, gdr:TRANSPORT",
                    known.join(", ")
                )))
            }
        }
    }
}

impl fmt::Display for DataPath {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_parse_back() {
        for p in [
            DataPath::PosixDirect,
            DataPath::HostToDevice { pinned: false },
            DataPath::DeviceToHost { pinned: true },
            DataPath::Ucx {
                transport: "sysv+cma".into(),
            },
            DataPath::Gdr {
                transport: "rc_mlx5".into(),
            },
        ] {
            assert_eq!(p.name().parse::<DataPath>().unwrap(), p);
        }
        let e = "posix".parse::<DataPath>().unwrap_err();
        assert!(e.to_string().contains("posix-direct"), "{e}");
        assert!("ucx:".parse::<DataPath>().is_err());
    }
}
