//! The CUDA driver API (`libcuda.so.1`), loaded at run time, in two layers:
//!
//! 1. [`sys`]: the raw entry points and C types of cuda.h, resolved once from the library, each
//!    with the export name it was found under.
//! 2. [`call`]: one checked function per entry point, turning its `CUresult` into
//!    `Result<_, CudaError>` that names that export; `unsafe` where the driver dereferences or
//!    keeps what it is given (host pointers, handles, kernel arguments).
//!
//! The safe types of the crate ([`crate::Cuda`], [`crate::Context`], [`crate::Stream`], the
//! buffers, the kernels and the block copier) call the driver through [`call`] only.

pub(crate) mod call;
pub(crate) mod sys;

use std::sync::OnceLock;

use crate::error::{CudaError, Library};
use crate::loader::{self, SearchEnv};
pub(crate) use sys::DriverApi;

/// The loaded driver and the outcome of `cuInit(0)`, cached for the process.
pub(crate) struct Loaded {
    /// The resolved entry points.
    pub(crate) api: DriverApi,
    /// `cuInit`'s outcome: `CUDA_ERROR_NO_DEVICE` is not a load failure (zero devices).
    pub(crate) init: Result<(), CudaError>,
}

static DRIVER: OnceLock<Result<Loaded, CudaError>> = OnceLock::new();

/// Load `libcuda`, resolve every symbol, call `cuInit(0)`. Cached: later calls return the same.
///
/// Errors: [`CudaError::LibraryMissing`] without a driver; [`CudaError::SymbolMissing`] for a
/// driver older than the table needs.
pub(crate) fn loaded() -> Result<&'static Loaded, CudaError> {
    DRIVER
        .get_or_init(|| {
            let env = SearchEnv::from_process(Library::CudaDriver);
            let (lib, from) = loader::open(Library::CudaDriver, &env)?;
            let api = DriverApi::resolve(lib, from.display())?;
            let init = call::init(&api);
            Ok(Loaded { api, init })
        })
        .as_ref()
        .map_err(Clone::clone)
}
