//! NVTX ranges (NVIDIA Tools Extension), loaded at run time like the other vendor libraries, so
//! that Nsight Systems shows gdpath's transfers beside the kernels.
//!
//! Off unless `GDPATH_NVTX=1`: then the library is looked for once, in order `$GDPATH_LIBNVTX`,
//! `libnvToolsExt.so.1` (NVTX 2, the CUDA toolkit and PyTorch wheels' `nvidia-nvtx`) and
//! `libnvtx3interop.so.1` (CUDA 12's NVTX 3 shim), each handed to `dlopen`. Without it (or
//! with the variable unset) every call here does nothing. NVTX itself does nothing unless a
//! tool injected itself (Nsight sets `NVTX_INJECTION64_PATH`), so ranges cost a call each when
//! no profiler runs.

use libloading::Library;
use std::ffi::{c_char, c_int, CString};
use std::sync::OnceLock;

/// The environment variable that turns NVTX ranges on (`1`).
pub const ENABLE_ENV: &str = "GDPATH_NVTX";
/// An explicit path of the NVTX library.
pub const LIBRARY_ENV: &str = "GDPATH_LIBNVTX";
/// The names handed to `dlopen` after [`LIBRARY_ENV`], in order.
pub const LIBRARY_NAMES: [&str; 2] = ["libnvToolsExt.so.1", "libnvtx3interop.so.1"];

type RangeStartA = unsafe extern "C" fn(*const c_char) -> u64;
type RangeEnd = unsafe extern "C" fn(u64);
type RangePushA = unsafe extern "C" fn(*const c_char) -> c_int;
type RangePop = unsafe extern "C" fn() -> c_int;

/// Why an NVTX library could not be used: `library` as given to `dlopen`, and the loader's
/// message (the library is missing, or lacks one of the four range functions).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("NVTX library {library}: {detail}")]
pub struct NvtxError {
    /// The library as handed to `dlopen`.
    pub library: String,
    /// The loader's message.
    pub detail: String,
}

/// The NVTX functions gdpath calls, from the library that exported them.
pub struct Nvtx {
    start: RangeStartA,
    end: RangeEnd,
    push: RangePushA,
    pop: RangePop,
    /// Which library, for `gdpath doctor`-style reports and the log.
    pub library: String,
    // Keeps the functions above mapped; never unloaded.
    _lib: Library,
}

impl std::fmt::Debug for Nvtx {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Nvtx")
            .field("library", &self.library)
            .finish()
    }
}

/// NVTX when `GDPATH_NVTX=1` and a library was found (looked for once per process).
pub fn get() -> Option<&'static Nvtx> {
    static N: OnceLock<Option<Nvtx>> = OnceLock::new();
    N.get_or_init(|| {
        if std::env::var_os(ENABLE_ENV).is_none_or(|v| v != "1") {
            return None;
        }
        let explicit = std::env::var_os(LIBRARY_ENV).filter(|v| !v.is_empty());
        let names = explicit
            .into_iter()
            .chain(LIBRARY_NAMES.iter().map(Into::into));
        let found = names.into_iter().find_map(|n| Nvtx::open(&n).ok());
        if found.is_none() {
            tracing::warn!("GDPATH_NVTX=1 but no NVTX library loads ({LIBRARY_ENV}, {LIBRARY_NAMES:?}): no NVTX ranges");
        }
        found
    })
    .as_ref()
}

impl Nvtx {
    /// Opens `name` and takes its four range functions. Errors: [`NvtxError`].
    pub fn open(name: &std::ffi::OsStr) -> Result<Nvtx, NvtxError> {
        let fail = |e: libloading::Error| NvtxError {
            library: name.to_string_lossy().into_owned(),
            detail: e.to_string(),
        };
        // SAFETY: loading a vendor library runs its initializers; NVTX's do nothing but set
        // up its injection hooks.
        let lib = unsafe { Library::new(name) }.map_err(fail)?;
        // SAFETY: the types are those of nvToolsExt.h (NVTX 2 and 3 keep the same C ABI for
        // these four: nvtxRangeId_t is uint64_t).
        let (start, end, push, pop) = unsafe {
            (
                *lib.get::<RangeStartA>(b"nvtxRangeStartA\0").map_err(fail)?,
                *lib.get::<RangeEnd>(b"nvtxRangeEnd\0").map_err(fail)?,
                *lib.get::<RangePushA>(b"nvtxRangePushA\0").map_err(fail)?,
                *lib.get::<RangePop>(b"nvtxRangePop\0").map_err(fail)?,
            )
        };
        Ok(Nvtx {
            start,
            end,
            push,
            pop,
            library: name.to_string_lossy().into_owned(),
            _lib: lib,
        })
    }

    /// Starts a range that may end on another thread (a transfer's, ended where its last pair
    /// completes). A message with a NUL byte is cut there.
    pub fn start(&self, message: &str) -> Range {
        let m = c_message(message);
        // SAFETY: `m` is a NUL-terminated string alive for the call; NVTX copies it.
        Range(unsafe { (self.start)(m.as_ptr()) })
    }

    /// Ends `range` (once: a [`Range`] is consumed).
    pub fn end(&self, range: Range) {
        // SAFETY: `range.0` came from this library's nvtxRangeStartA.
        unsafe { (self.end)(range.0) }
    }

    /// Pushes a range on this thread's stack, popped when the guard drops (a phase of a call).
    pub fn push(&self, message: &str) -> Pushed<'_> {
        let m = c_message(message);
        // SAFETY: as for `start`.
        unsafe { (self.push)(m.as_ptr()) };
        Pushed(self, std::marker::PhantomData)
    }
}

fn c_message(message: &str) -> CString {
    let cut = message.split('\0').next().unwrap_or_default();
    CString::new(cut).unwrap_or_default()
}

/// An NVTX range started with [`Nvtx::start`].
#[derive(Debug)]
pub struct Range(u64);

/// A range pushed on this thread with [`Nvtx::push`]; popped on drop.
pub struct Pushed<'a>(&'a Nvtx, std::marker::PhantomData<*const ()>);

impl Drop for Pushed<'_> {
    fn drop(&mut self) {
        // SAFETY: pops the range this guard pushed on this thread (the guard is not Send, and
        // guards drop in reverse order of their pushes).
        unsafe { (self.0.pop)() };
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_missing_library_is_an_error_not_a_crash() {
        let e = Nvtx::open("libgdpath-no-such-nvtx.so.1".as_ref()).unwrap_err();
        assert_eq!(e.library, "libgdpath-no-such-nvtx.so.1");
        assert!(e.to_string().contains("libgdpath-no-such-nvtx"), "{e}");
    }

    #[test]
    fn messages_are_cut_at_a_nul() {
        assert_eq!(c_message("a\0b").as_bytes(), b"a");
    }
}
