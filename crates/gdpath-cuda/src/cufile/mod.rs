//! GPUDirect Storage through cuFile (`libcufile.so.0`), loaded at run time by gdpath itself.
//!
//! Why not cudarc's `cufile` module: its library search never tries `libcufile.so.0` (the SONAME
//! the toolkit and the `nvidia-cufile` wheel ship), it cannot be pointed at a path, its error
//! enum is fixed at build time (the CUDA 12.8 enum ends at 5039 while libcufile 1.15 returns
//! codes up to 5050, which would be an invalid enum value), and a missing symbol panics. The
//! API is small, so this module declares the calls it needs with raw integer codes.
//!
//! Three layers:
//! 1. `sys`: the raw symbols and C structs of cufile.h, resolved from the library.
//! 2. `call` (with `codes`): one wrapper per call, its result as `Result<_, CudaError>` with
//!    cuFile's code, name and text; `unsafe` where the library dereferences what it is given.
//! 3. The RAII types: [`CuFileDriver`] (`cuFileDriverOpen` / `cuFileDriverClose_v2`),
//!    [`CuFileBuf`] (`cuFileBufRegister` / `cuFileBufDeregister`), [`CuFileHandle`]
//!    (`cuFileHandleRegister` / `cuFileHandleDeregister`). Each holds what it depends on
//!    (`Arc`s), so drop order cannot break it.

mod call;
mod codes;
mod driver;
mod handle;
mod sys;

pub use call::io_result;
pub use codes::{cufile_error, error_text};
pub use driver::{CuFileDriver, CuFileProperties};
pub use handle::{CuFileBuf, CuFileHandle};
pub use sys::library;
