//! The kind of a registered region ([`MemoryKind`]) and its class ([`MemoryClass`]): values
//! errors and plans carry, so they sit below them and name nothing else of the crate.

use serde::{Deserialize, Serialize};
use std::fmt;

/// The kind of a registered region, with its parameters. Names follow docs/design.md.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum MemoryKind {
    /// Host memory. `pinned` is true for page-locked memory registered with CUDA (the CUDA
    /// backend); gdpath's own [`crate::HostBuffer`]s are pageable.
    Host {
        /// The memory is page-locked and known to CUDA.
        pinned: bool,
    },
    /// A file, read and written through the storage backends.
    File,
    /// Memory of the GPU with this CUDA ordinal.
    Gpu {
        /// The GPU's CUDA ordinal.
        ordinal: u32,
    },
    /// A region registered by the remote agent with this name (network backend).
    Remote {
        /// The name of the peer agent that registered it.
        agent: String,
    },
}

impl MemoryKind {
    /// The kind without its parameters, as backends declare it in [`crate::backend::Capability`].
    pub fn class(&self) -> MemoryClass {
        match self {
            MemoryKind::Host { .. } => MemoryClass::Host,
            MemoryKind::File => MemoryClass::File,
            MemoryKind::Gpu { .. } => MemoryClass::Gpu,
            MemoryKind::Remote { .. } => MemoryClass::Remote,
        }
    }
}

impl fmt::Display for MemoryKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            MemoryKind::Host { pinned: true } => f.write_str("host (pinned)"),
            MemoryKind::Host { pinned: false } => f.write_str("host (pageable)"),
            MemoryKind::File => f.write_str("file"),
            MemoryKind::Gpu { ordinal } => write!(f, "GPU {ordinal}"),
            MemoryKind::Remote { agent } => write!(f, "remote ({agent})"),
        }
    }
}

/// A memory kind without parameters: what a backend's capability is declared over.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum MemoryClass {
    /// Host memory, pinned or pageable ([`MemoryKind::Host`]).
    Host,
    /// A file ([`MemoryKind::File`]).
    File,
    /// Memory of any GPU ([`MemoryKind::Gpu`]).
    Gpu,
    /// A peer agent's region ([`MemoryKind::Remote`]).
    Remote,
}
