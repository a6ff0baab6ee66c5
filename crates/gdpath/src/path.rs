//! The path a transfer really took.

use serde::{Deserialize, Serialize};
use std::fmt;
use std::sync::Arc;

/// The data path that moved a descriptor pair's bytes. Names follow docs/design.md.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "path", rename_all = "kebab-case")]
pub enum Path {
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
    /// GPU → host copy, as [`Path::HostToDevice`].
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

impl Path {
    /// A short stable name for tables and JSON rows, e.g. `p2p-nvlink`, `ucx:tcp`.
    pub fn name(&self) -> String {
        match self {
            Path::P2pNvlink => "p2p-nvlink".into(),
            Path::P2pPcie => "p2p-pcie".into(),
            Path::DeviceLocal => "device-local".into(),
            Path::HostToDevice { pinned: true } => "h2d-pinned".into(),
            Path::HostToDevice { pinned: false } => "h2d-pageable".into(),
            Path::DeviceToHost { pinned: true } => "d2h-pinned".into(),
            Path::DeviceToHost { pinned: false } => "d2h-pageable".into(),
            Path::Staged => "staged".into(),
            Path::GdsNative => "gds-native".into(),
            Path::GdsCompat => "gds-compat".into(),
            Path::PosixDirect => "posix-direct".into(),
            Path::PosixBuffered => "posix-buffered".into(),
            Path::HostCopy => "host-copy".into(),
            Path::Ucx { transport } => format!("ucx:{transport}"),
            Path::Gdr { transport } => format!("gdr:{transport}"),
        }
    }
}

/// A name that is no [`Path`]'s: its text names the unknown name and the known ones. The
/// engine's errors know paths, not the other way round, so it is its own type; it becomes
/// [`crate::Error::Config`] with the same text.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{0}")]
pub struct UnknownPath(pub String);

impl std::str::FromStr for Path {
    type Err = UnknownPath;

    /// The inverse of [`Path::name`]: `posix-direct`, `h2d-pinned`, `ucx:tcp`, `gdr:rc_mlx5`, ...
    /// (for strict-mode lists given as text: the Python binding's `accept=`). Errors:
    /// [`UnknownPath`] (converted into [`crate::Error::Config`]) naming the unknown name and the
    /// known ones.
    fn from_str(s: &str) -> Result<Path, UnknownPath> {
        let fixed = [
            Path::P2pNvlink,
            Path::P2pPcie,
            Path::DeviceLocal,
            Path::HostToDevice { pinned: true },
            Path::HostToDevice { pinned: false },
            Path::DeviceToHost { pinned: true },
            Path::DeviceToHost { pinned: false },
            Path::Staged,
            Path::GdsNative,
            Path::GdsCompat,
            Path::PosixDirect,
            Path::PosixBuffered,
            Path::HostCopy,
        ];
        if let Some(p) = fixed.iter().find(|p| p.name() == s) {
            return Ok(p.clone());
        }
        match s.split_once(':') {
            Some(("ucx", t)) if !t.is_empty() => Ok(Path::Ucx {
                transport: t.into(),
            }),
            Some(("gdr", t)) if !t.is_empty() => Ok(Path::Gdr {
                transport: t.into(),
            }),
            _ => {
                let known: Vec<String> = fixed.iter().map(Path::name).collect();
                Err(UnknownPath(format!(
                    "unknown path {s:?}: one of {}, ucx:TRANSPORT, gdr:TRANSPORT",
                    known.join(", ")
                )))
            }
        }
    }
}

impl fmt::Display for Path {
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
            Path::PosixDirect,
            Path::HostToDevice { pinned: false },
            Path::DeviceToHost { pinned: true },
            Path::Ucx {
                transport: "sysv+cma".into(),
            },
            Path::Gdr {
                transport: "rc_mlx5".into(),
            },
        ] {
            assert_eq!(p.name().parse::<Path>().unwrap(), p);
        }
        let e = "posix".parse::<Path>().unwrap_err();
        assert!(e.to_string().contains("posix-direct"), "{e}");
        assert!("ucx:".parse::<Path>().is_err());
    }
}
