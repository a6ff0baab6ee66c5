//! The one error type of this crate.
//!
//! Every failure names what failed: the library (and what installs it), the symbol, the driver
//! call with CUDA's own error name and text, or cuFile's code with its text. Errors are `Clone`
//! so that a failed library load, which is cached for the life of the process, can be handed to
//! every caller.
//!
//! This module is the bottom of the crate and imports nothing of it: the block-list copier's
//! refusals it carries are defined here too ([`blocks`]).

use std::fmt;

pub(crate) mod blocks;

use blocks::{BlockListError, BlockMethod, Unavailable};

/// `CUDA_ERROR_DEINITIALIZED` (cuda.h): the driver has shut down, because the process is
/// exiting.
const CUDA_ERROR_DEINITIALIZED: i32 = 4;

/// A vendor library that gdpath loads at run time.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Library {
    /// The CUDA driver API, `libcuda.so.1`.
    CudaDriver,
    /// The NVIDIA Management Library, `libnvidia-ml.so.1`.
    Nvml,
    /// The GPUDirect Storage user library, `libcufile.so.0`.
    CuFile,
}

impl Library {
    /// The file name gdpath looks for first (the SONAME the vendor ships).
    pub fn soname(self) -> &'static str {
        match self {
            Library::CudaDriver => "libcuda.so.1",
            Library::Nvml => "libnvidia-ml.so.1",
            Library::CuFile => "libcufile.so.0",
        }
    }

    /// What installs this library, for the error message.
    pub fn provided_by(self) -> &'static str {
        match self {
            Library::CudaDriver => {
                "the NVIDIA driver package (e.g. libnvidia-compute-<ver> on Ubuntu, nvidia-driver-cuda on RHEL)"
            }
            Library::Nvml => {
                "the NVIDIA driver package (e.g. libnvidia-compute-<ver> on Ubuntu, nvidia-driver-NVML on RHEL)"
            }
            Library::CuFile => {
                "the CUDA toolkit's libcufile package (libcufile-<ver>) or the `nvidia-cufile` Python wheel"
            }
        }
    }

    /// The environment variable that names an explicit path for this library.
    pub fn env_override(self) -> &'static str {
        match self {
            Library::CudaDriver => "GDPATH_LIBCUDA",
            Library::Nvml => "GDPATH_LIBNVML",
            Library::CuFile => "GDPATH_LIBCUFILE",
        }
    }
}

impl fmt::Display for Library {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.soname())
    }
}

/// Errors of the CUDA, NVML and cuFile layer.
#[derive(Debug, Clone, PartialEq, thiserror::Error)]
pub enum CudaError {
    /// The library could not be loaded under any candidate name or path.
    #[error(
        "{library} could not be loaded (tried {tried_count} candidates; last error: {detail}); \
         it is provided by {provider}; set {env} to its path if it is installed elsewhere",
        tried_count = tried.len(),
        provider = library.provided_by(),
        env = library.env_override()
    )]
    LibraryMissing {
        /// The library.
        library: Library,
        /// Every name or path handed to `dlopen`, in order.
        tried: Vec<String>,
        /// The last `dlopen` error text.
        detail: String,
    },

    /// The library loaded but lacks a function gdpath needs: it is older than required.
    #[error("{library} has no symbol `{symbol}`: the installed version is too old for gdpath ({needed})")]
    SymbolMissing {
        /// The library.
        library: Library,
        /// The function's export name (the newest, where several are accepted).
        symbol: &'static str,
        /// Which release first has the symbol.
        needed: &'static str,
    },

    /// A CUDA driver API call returned an error.
    #[error("{call} failed: {name} ({code}): {message}")]
    Driver {
        /// The driver API function called, as the driver exports it, e.g. `cuMemAlloc_v2`.
        call: &'static str,
        /// The raw `CUresult`.
        code: i32,
        /// `cuGetErrorName`, e.g. `CUDA_ERROR_OUT_OF_MEMORY`.
        name: String,
        /// `cuGetErrorString`.
        message: String,
    },

    /// An argument was rejected before any driver call (bounds, sizes, devices).
    #[error("invalid argument: {0}")]
    InvalidArgument(String),

    /// No CUDA device with this ordinal.
    #[error("no CUDA device {ordinal}: the driver reports {count} device(s)")]
    NoSuchDevice {
        /// The ordinal asked for.
        ordinal: u32,
        /// Devices the driver reports.
        count: u32,
    },

    /// A host buffer is still the target or source of an operation on a stream that has not been
    /// synchronized, so the CPU may not touch it yet.
    #[error("host buffer is still in use by a stream: call Stream::synchronize first")]
    BufferBusy,

    /// An NVML call failed.
    #[error("NVML {call} failed: {message}")]
    Nvml {
        /// The NVML function.
        call: &'static str,
        /// NVML's error, as nvml-wrapper words it.
        message: String,
    },

    /// A cuFile call returned a `CU_FILE_*` error (5001..) or, for code 5011
    /// (`CU_FILE_CUDA_DRIVER_ERROR`), a CUDA error as well.
    #[error("cuFile {call} failed: {name} ({code}): {message}{}", cuda_suffix(*cu_result))]
    CuFile {
        /// The cuFile function called, as libcufile exports it.
        call: &'static str,
        /// The raw `CUfileOpError` value.
        code: i32,
        /// The enumerator name, e.g. `CU_FILE_HANDLE_NOT_REGISTERED`.
        name: &'static str,
        /// cuFile's text for the code, e.g. `file descriptor is not registered`.
        message: &'static str,
        /// The `CUresult` cuFile passed along (non-zero only for CUDA errors).
        cu_result: i32,
    },

    /// A cuFile read or write failed with a system error (`errno`).
    #[error("cuFile {call} failed: {message} (errno {errno})")]
    CuFileIo {
        /// `cuFileRead` or `cuFileWrite`.
        call: &'static str,
        /// The `errno` value.
        errno: i32,
        /// The system's text for it.
        message: String,
    },

    /// A block list was refused before anything was enqueued ([`crate::blocks`]).
    #[error("block list refused: {0}")]
    BlockList(#[from] BlockListError),

    /// A block-copy method cannot run with this driver or device.
    #[error("block copy method {method} is unavailable: {reason}")]
    MethodUnavailable {
        /// The method asked for.
        method: BlockMethod,
        /// Why it cannot run.
        reason: Unavailable,
    },

    /// A binding panicked; the panic was caught and converted. This is a bug in a binding, kept
    /// as an error so that a probe never takes the process down.
    #[error("{what} panicked: {message}")]
    Panicked {
        /// The binding call that panicked.
        what: &'static str,
        /// The panic's message.
        message: String,
    },
}

fn cuda_suffix(cu_result: i32) -> String {
    if cu_result == 0 {
        String::new()
    } else {
        format!(" (CUresult {cu_result})")
    }
}

impl CudaError {
    /// True for `CUDA_ERROR_DEINITIALIZED`: the driver shut down (the process is exiting), so a
    /// resource it held goes with the process.
    pub fn is_deinitialized(&self) -> bool {
        matches!(self, CudaError::Driver { code, .. } if *code == CUDA_ERROR_DEINITIALIZED)
    }

    /// The library this error is about, when it is a load failure.
    pub fn missing_library(&self) -> Option<Library> {
        match self {
            CudaError::LibraryMissing { library, .. }
            | CudaError::SymbolMissing { library, .. } => Some(*library),
            _ => None,
        }
    }

    /// The raw `CUresult` of a failed driver call.
    pub fn cu_result(&self) -> Option<i32> {
        match self {
            CudaError::Driver { code, .. } => Some(*code),
            _ => None,
        }
    }
}

/// Run `f`, turning a panic inside it into [`CudaError::Panicked`]. Used around the first calls
/// into third-party bindings (nvml-wrapper) as a last line of defence; our own bindings do not
/// panic on missing libraries or symbols.
pub(crate) fn no_panic<T>(
    what: &'static str,
    f: impl FnOnce() -> Result<T, CudaError>,
) -> Result<T, CudaError> {
    match std::panic::catch_unwind(std::panic::AssertUnwindSafe(f)) {
        Ok(r) => r,
        Err(payload) => {
            let message = payload
                .downcast_ref::<&str>()
                .map(|s| s.to_string())
                .or_else(|| payload.downcast_ref::<String>().cloned())
                .unwrap_or_else(|| "non-string panic payload".to_string());
            Err(CudaError::Panicked { what, message })
        }
    }
}

/// Logs an error met while freeing a CUDA resource in `Drop`: a warning, but at debug level when
/// the driver has shut down already ([`CudaError::is_deinitialized`]): threads that free their
/// streams and buffers while the process exits race the driver's own exit handler, and what
/// they held goes with the process.
pub(crate) fn log_teardown(what: &str, ordinal: Option<u32>, e: &CudaError) {
    if e.is_deinitialized() {
        tracing::debug!(?ordinal, error = %e, "{what} after the driver shut down (process exit)");
    } else {
        tracing::warn!(?ordinal, error = %e, "{what}");
    }
}

#[cfg(test)]
mod tests {
    use super::CudaError;

    fn driver(code: i32) -> CudaError {
        CudaError::Driver {
            call: "cuStreamDestroy_v2",
            code,
            name: format!("CUresult {code}"),
            message: "unknown error".into(),
        }
    }

    #[test]
    fn only_the_driver_shutting_down_counts_as_deinitialized() {
        assert!(driver(4).is_deinitialized());
        for code in [0, 1, 2, 3, 100, 700] {
            assert!(!driver(code).is_deinitialized(), "code {code}");
        }
        assert!(!CudaError::InvalidArgument("x".into()).is_deinitialized());
    }
}
