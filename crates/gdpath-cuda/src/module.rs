//! The PTX this crate ships, loaded into a context as CUDA modules: the pattern kernels
//! (`src/ptx/verify.ptx`) and the block-list copy kernel (`src/ptx/copy_blocks.ptx`, built from
//! `copy_blocks.cu` by `scripts/gen-kv-ptx.sh`). The driver JIT-compiles PTX itself
//! (`cuModuleLoadData`), so no NVRTC (a CUDA toolkit library users often lack) is needed.
//!
//! A [`crate::Context`] loads each module on first use of one of its [`Kernel`]s and unloads it
//! before it releases its primary context; the launchers ([`crate::Stream`]'s pattern methods,
//! the block copier) ask the context for the kernel's function and launch it with [`launch`].

use std::ffi::{c_void, CStr};

use crate::driver::call;
use crate::driver::sys::{CUfunction, CUmodule, CUstream, DriverApi};
use crate::error::CudaError;

/// NUL-terminated PTX text, checked at compile time.
macro_rules! ptx {
    ($file:literal) => {
        match CStr::from_bytes_with_nul(concat!(include_str!($file), "\0").as_bytes()) {
            Ok(text) => text,
            Err(_) => panic!("PTX text with a NUL inside"),
        }
    };
}

/// The pattern fill, check and compare kernels.
const VERIFY_PTX: &CStr = ptx!("ptx/verify.ptx");
/// The gather/scatter copy kernel of block lists.
const COPY_BLOCKS_PTX: &CStr = ptx!("ptx/copy_blocks.ptx");

/// A shipped PTX module; each context holds one slot per module.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Ptx {
    /// `verify.ptx`.
    Verify,
    /// `copy_blocks.ptx`.
    CopyBlocks,
}

impl Ptx {
    /// Number of modules (and of slots in a context).
    pub(crate) const COUNT: usize = 2;

    /// The module's slot in a context.
    pub(crate) fn slot(self) -> usize {
        self as usize
    }

    fn text(self) -> &'static CStr {
        match self {
            Ptx::Verify => VERIFY_PTX,
            Ptx::CopyBlocks => COPY_BLOCKS_PTX,
        }
    }

    fn kernels(self) -> &'static [Kernel] {
        match self {
            Ptx::Verify => &[Kernel::FillPattern, Kernel::CheckPattern, Kernel::Compare],
            Ptx::CopyBlocks => &[Kernel::CopyBlocks],
        }
    }
}

/// A kernel of the shipped PTX. Every one takes only 64-bit parameters (addresses, counts,
/// seeds), which is what [`launch`] passes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Kernel {
    /// `gdpath_fill_pattern(ptr, len, pos, seed)`.
    FillPattern,
    /// `gdpath_check_pattern(ptr, len, pos, seed, out)`.
    CheckPattern,
    /// `gdpath_compare(a, b, len, out)`.
    Compare,
    /// `gdpath_copy_blocks(descriptors, count)`.
    CopyBlocks,
}

impl Kernel {
    /// The module holding the kernel.
    pub(crate) fn ptx(self) -> Ptx {
        match self {
            Kernel::FillPattern | Kernel::CheckPattern | Kernel::Compare => Ptx::Verify,
            Kernel::CopyBlocks => Ptx::CopyBlocks,
        }
    }

    fn entry(self) -> &'static CStr {
        match self {
            Kernel::FillPattern => c"gdpath_fill_pattern",
            Kernel::CheckPattern => c"gdpath_check_pattern",
            Kernel::Compare => c"gdpath_compare",
            Kernel::CopyBlocks => c"gdpath_copy_blocks",
        }
    }
}

/// A module loaded in one context, with the functions of its kernels.
pub(crate) struct Module {
    raw: CUmodule,
    functions: Vec<(Kernel, CUfunction)>,
}

// SAFETY: module and function handles are plain driver handles, usable from any thread with the
// context current.
unsafe impl Send for Module {}
// SAFETY: as above; the handles are never written after loading.
unsafe impl Sync for Module {}

impl Module {
    /// Load `ptx` into the current context and look up its kernels; the module is unloaded
    /// again when one is missing.
    ///
    /// Errors: the driver's, from `cuModuleLoadData` (no PTX JIT, a PTX ISA newer than the
    /// driver) or `cuModuleGetFunction`.
    pub(crate) fn load(api: &DriverApi, ptx: Ptx) -> Result<Module, CudaError> {
        let raw = call::module_load_data(api, ptx.text())?;
        let mut functions = Vec::with_capacity(ptx.kernels().len());
        for &k in ptx.kernels() {
            // SAFETY: the module was loaded above and is unloaded only below or by its context.
            match unsafe { call::module_get_function(api, raw, k.entry()) } {
                Ok(f) => functions.push((k, f)),
                Err(e) => {
                    // SAFETY: loaded above in the current context; none of its functions ran.
                    if let Err(u) = unsafe { call::module_unload(api, raw) } {
                        crate::error::log_teardown("unloading a PTX module", None, &u);
                    }
                    return Err(e);
                }
            }
        }
        Ok(Module { raw, functions })
    }

    /// The function of `kernel`, which must be one of this module's.
    pub(crate) fn function(&self, kernel: Kernel) -> Option<CUfunction> {
        self.functions
            .iter()
            .find(|(k, _)| *k == kernel)
            .map(|(_, f)| *f)
    }

    /// Unload the module (`cuModuleUnload`).
    ///
    /// # Safety
    /// The module's context is current, none of its kernels runs, and the module is not used
    /// afterwards.
    pub(crate) unsafe fn unload(&self, api: &DriverApi) -> Result<(), CudaError> {
        // SAFETY: the caller's contract.
        unsafe { call::module_unload(api, self.raw) }
    }
}

/// Launch `func` on `stream`: `grid` CTAs of `block` threads, with `params` as the kernel's
/// 64-bit parameters in order (at most eight).
///
/// Errors: [`CudaError::InvalidArgument`] for more than eight parameters; the driver's.
///
/// # Safety
/// `func` is a kernel of a module loaded in the stream's context, which is current, and its
/// parameters are `params.len()` 64-bit values; every address in `params` stays valid for
/// what the kernel does with it until the kernel has run; `stream` is live.
pub(crate) unsafe fn launch(
    api: &DriverApi,
    func: CUfunction,
    (grid, block): (u32, u32),
    stream: CUstream,
    params: &[u64],
) -> Result<(), CudaError> {
    let mut values = [0u64; 8];
    let values = values.get_mut(..params.len()).ok_or_else(|| {
        CudaError::InvalidArgument(format!("{} kernel parameters (at most 8)", params.len()))
    })?;
    values.copy_from_slice(params);
    let mut args = [std::ptr::null_mut::<c_void>(); 8];
    for (a, v) in args.iter_mut().zip(values.iter_mut()) {
        *a = v as *mut u64 as *mut c_void;
    }
    // SAFETY: the caller's contract; `args` points at live copies of the parameters, which the
    // driver copies before returning.
    unsafe { call::launch_kernel(api, func, (grid, block), stream, &mut args[..params.len()]) }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_kernel_is_in_its_module_and_every_module_has_its_kernels() {
        for k in [
            Kernel::FillPattern,
            Kernel::CheckPattern,
            Kernel::Compare,
            Kernel::CopyBlocks,
        ] {
            assert!(k.ptx().kernels().contains(&k), "{k:?}");
            let text = k.ptx().text().to_str().unwrap();
            let entry = k.entry().to_str().unwrap();
            assert!(
                text.contains(&format!(".visible .entry {entry}(")),
                "{entry} not declared in {:?}",
                k.ptx()
            );
        }
        for p in [Ptx::Verify, Ptx::CopyBlocks] {
            assert!(p.slot() < Ptx::COUNT);
            assert!(p.kernels().iter().all(|k| k.ptx() == p));
        }
    }

    #[test]
    fn the_shipped_copy_kernel_has_a_jit_target() {
        let ptx = COPY_BLOCKS_PTX.to_str().unwrap();
        assert!(ptx.contains(".target sm_80"), "target");
        assert!(ptx.contains(".address_size 64"));
        assert!(ptx.contains("ld.global.v4.u32") && ptx.contains("st.global.v4.u32"));
    }
}
