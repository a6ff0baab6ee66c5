//! The memory types UCX tells apart (`ucs_memory_type_t`).

use std::fmt;

use crate::sys;

/// Memory types UCX distinguishes (`ucs_memory_type_t`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum MemType {
    /// Host (system) memory.
    Host,
    /// CUDA device memory (`cudaMalloc`/`cuMemAlloc`).
    Cuda,
    /// CUDA managed (unified) memory.
    CudaManaged,
    /// ROCm device memory.
    Rocm,
    /// ROCm managed memory.
    RocmManaged,
}

impl MemType {
    /// All types in `ucs_memory_type_t` order.
    pub const ALL: [MemType; 5] = [
        MemType::Host,
        MemType::Cuda,
        MemType::CudaManaged,
        MemType::Rocm,
        MemType::RocmManaged,
    ];

    pub(crate) fn raw(self) -> sys::ucs_memory_type_t {
        match self {
            MemType::Host => sys::UCS_MEMORY_TYPE_HOST,
            MemType::Cuda => sys::UCS_MEMORY_TYPE_CUDA,
            MemType::CudaManaged => sys::UCS_MEMORY_TYPE_CUDA_MANAGED,
            MemType::Rocm => sys::UCS_MEMORY_TYPE_ROCM,
            MemType::RocmManaged => sys::UCS_MEMORY_TYPE_ROCM_MANAGED,
        }
    }

    /// The type UCX reports as `raw`, if it is one of [`MemType::ALL`].
    pub(crate) fn from_raw(raw: sys::ucs_memory_type_t) -> Option<MemType> {
        MemType::ALL.into_iter().find(|t| t.raw() == raw)
    }

    /// UCX's name (`host`, `cuda`, `cuda-managed`, `rocm`, `rocm-managed`).
    pub fn name(self) -> &'static str {
        match self {
            MemType::Host => "host",
            MemType::Cuda => "cuda",
            MemType::CudaManaged => "cuda-managed",
            MemType::Rocm => "rocm",
            MemType::RocmManaged => "rocm-managed",
        }
    }
}

impl fmt::Display for MemType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn raw_codes_round_trip() {
        assert_eq!(MemType::Cuda.raw(), sys::UCS_MEMORY_TYPE_CUDA);
        for t in MemType::ALL {
            assert_eq!(MemType::from_raw(t.raw()), Some(t));
        }
        assert_eq!(MemType::from_raw(sys::UCS_MEMORY_TYPE_UNKNOWN), None);
    }
}
