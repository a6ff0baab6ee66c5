//! Device-side verification: fill with the test pattern, check against it, compare two
//! buffers, without copying the data back to the host.
//!
//! The kernels are hand-written PTX (`src/ptx/verify.ptx`), loaded with `cuModuleLoadData`: the
//! driver JIT-compiles PTX itself, so no NVRTC (a CUDA toolkit library users often lack) is
//! needed. If loading fails (a driver without a PTX JIT, e.g. some embedded builds), the
//! `*_on_host` methods do the same work by copying back in chunks and checking on the CPU.

use std::ffi::{c_uint, c_void, CString};

use crate::context::Context;
use crate::error::CudaError;
use crate::ffi::{CUcontext, CUfunction, CUmodule, DriverApi};
use crate::memory::{check_range, DeviceBuffer, PinnedHostBuffer};
use crate::pattern::{self, Verdict};
use crate::stream::Stream;

const PTX: &str = concat!(include_str!("ptx/verify.ptx"), "\0");

/// Threads per block of every kernel.
const BLOCK: u32 = 256;

pub(crate) struct Kernels {
    module: CUmodule,
    fill: CUfunction,
    check: CUfunction,
    compare: CUfunction,
    /// Blocks to launch: enough to fill every SM several times over.
    grid_max: u32,
}

// SAFETY: module and function handles are plain driver handles, usable from any thread with the
// context current.
unsafe impl Send for Kernels {}
// SAFETY: as above.
unsafe impl Sync for Kernels {}

impl Kernels {
    fn load(ctx: &Context) -> Result<Kernels, CudaError> {
        let (module, [fill, check, compare]) = load_module(
            ctx,
            PTX,
            [
                "gdpath_fill_pattern",
                "gdpath_check_pattern",
                "gdpath_compare",
            ],
        )?;
        let sms = ctx
            .device()
            .attribute(crate::cuda::DeviceAttribute::MULTIPROCESSOR_COUNT)
            .unwrap_or(16)
            .max(1) as u32;
        Ok(Kernels {
            module,
            fill,
            check,
            compare,
            grid_max: sms * 8,
        })
    }

    pub(crate) fn unload(&self, api: &DriverApi, ctx: CUcontext) {
        unload_module(api, ctx, self.module);
    }

    fn grid(&self, len: usize) -> u32 {
        let blocks = len.div_ceil(BLOCK as usize);
        (blocks.min(self.grid_max as usize)).max(1) as u32
    }
}

/// Load the NUL-terminated PTX text `ptx` in `ctx` (`cuModuleLoadData`: the driver JIT-compiles
/// it for the device) and look up the entry points `names`; the module is unloaded again when
/// one is missing.
pub(crate) fn load_module<const N: usize>(
    ctx: &Context,
    ptx: &str,
    names: [&str; N],
) -> Result<(CUmodule, [CUfunction; N]), CudaError> {
    ctx.bind()?;
    let api = ctx.api();
    let mut module: CUmodule = std::ptr::null_mut();
    // SAFETY: NUL-terminated PTX text; context current.
    api.check("cuModuleLoadData", unsafe {
        (api.cuModuleLoadData)(&mut module, ptx.as_ptr() as *const c_void)
    })?;
    let mut funcs = [std::ptr::null_mut(); N];
    for (f, name) in funcs.iter_mut().zip(names) {
        let c = CString::new(name).expect("kernel names have no NUL");
        // SAFETY: module loaded above; out-pointer live.
        let r = unsafe { (api.cuModuleGetFunction)(f, module, c.as_ptr()) };
        if let Err(e) = api.check("cuModuleGetFunction", r) {
            unload_module(api, std::ptr::null_mut(), module);
            return Err(e);
        }
    }
    Ok((module, funcs))
}

/// Unload `module` with `ctx` made current first (unless null: then the current one).
pub(crate) fn unload_module(api: &DriverApi, ctx: CUcontext, module: CUmodule) {
    // SAFETY: a module this crate loaded, in a context that is still retained.
    unsafe {
        if !ctx.is_null() {
            (api.cuCtxSetCurrent)(ctx);
        }
        (api.cuModuleUnload)(module);
    }
}

fn kernels(ctx: &Context) -> Result<&Kernels, CudaError> {
    ctx.inner
        .kernels
        .get_or_init(|| Kernels::load(ctx))
        .as_ref()
        .map_err(Clone::clone)
}

impl Stream {
    fn launch(&self, f: CUfunction, grid: u32, args: &mut [*mut c_void]) -> Result<(), CudaError> {
        let api = self.context().api();
        self.context().bind()?;
        // SAFETY: `args` points at live values of the kernel's parameter types, in order; the
        // driver copies them before returning.
        api.check("cuLaunchKernel", unsafe {
            (api.cuLaunchKernel)(
                f,
                grid as c_uint,
                1,
                1,
                BLOCK,
                1,
                1,
                0,
                self.raw(),
                args.as_mut_ptr(),
                std::ptr::null_mut(),
            )
        })
    }

    fn same_device(&self, buf: &DeviceBuffer, what: &str) -> Result<(), CudaError> {
        if buf.ordinal() != self.context().ordinal() {
            return Err(CudaError::InvalidArgument(format!(
                "{what} on GPU {} but the stream is on GPU {}",
                buf.ordinal(),
                self.context().ordinal()
            )));
        }
        Ok(())
    }

    /// Fill `buf[off .. off + len]` with the test pattern for stream positions
    /// `pos .. pos + len` ([`crate::pattern`]), on the GPU, asynchronously.
    pub fn fill_pattern(
        &self,
        buf: &DeviceBuffer,
        off: usize,
        len: usize,
        seed: u64,
        pos: u64,
    ) -> Result<(), CudaError> {
        check_range("pattern fill", buf.len(), off, len)?;
        self.same_device(buf, "pattern fill buffer")?;
        if len == 0 {
            return Ok(());
        }
        let k = kernels(self.context())?;
        let (mut p, mut n, mut b, mut s) = (buf.device_ptr() + off as u64, len as u64, pos, seed);
        let mut args = [
            &mut p as *mut u64 as *mut c_void,
            &mut n as *mut u64 as *mut c_void,
            &mut b as *mut u64 as *mut c_void,
            &mut s as *mut u64 as *mut c_void,
        ];
        self.launch(k.fill, k.grid(len), &mut args)?;
        self.hold_device(&[buf]);
        Ok(())
    }

    fn run_check(
        &self,
        f: impl FnOnce(&Kernels, u64) -> Result<(), CudaError>,
    ) -> Result<Verdict, CudaError> {
        let k = kernels(self.context())?;
        let out = DeviceBuffer::new(self.context(), 16)?;
        self.write_from_slice(
            &out,
            0,
            &[0u8; 8]
                .iter()
                .chain(&[0xffu8; 8])
                .copied()
                .collect::<Vec<_>>(),
        )?;
        f(k, out.device_ptr())?;
        self.hold_device(&[&out]);
        let mut res = [0u8; 16];
        self.read_into_slice(&mut res, &out, 0)?;
        let count = u64::from_le_bytes(res[..8].try_into().expect("8 bytes"));
        let first = u64::from_le_bytes(res[8..].try_into().expect("8 bytes"));
        Ok(Verdict {
            mismatches: count,
            first_mismatch: (count > 0).then_some(first),
        })
    }

    /// Check `buf[off .. off + len]` against the pattern for positions `pos .. pos + len`, on
    /// the GPU. Blocking: synchronizes the stream (so it also waits for earlier work on it).
    pub fn verify_pattern(
        &self,
        buf: &DeviceBuffer,
        off: usize,
        len: usize,
        seed: u64,
        pos: u64,
    ) -> Result<Verdict, CudaError> {
        check_range("pattern check", buf.len(), off, len)?;
        self.same_device(buf, "pattern check buffer")?;
        if len == 0 {
            return Ok(Verdict::default());
        }
        self.run_check(|k, out| {
            let (mut p, mut n, mut b, mut s, mut o) =
                (buf.device_ptr() + off as u64, len as u64, pos, seed, out);
            let mut args = [
                &mut p as *mut u64 as *mut c_void,
                &mut n as *mut u64 as *mut c_void,
                &mut b as *mut u64 as *mut c_void,
                &mut s as *mut u64 as *mut c_void,
                &mut o as *mut u64 as *mut c_void,
            ];
            self.launch(k.check, k.grid(len), &mut args)?;
            self.hold_device(&[buf]);
            Ok(())
        })
    }

    /// Compare `a[a_off ..]` with `b[b_off ..]` over `len` bytes on the GPU. Both buffers must
    /// be on the stream's GPU. Blocking.
    pub fn compare(
        &self,
        a: &DeviceBuffer,
        a_off: usize,
        b: &DeviceBuffer,
        b_off: usize,
        len: usize,
    ) -> Result<Verdict, CudaError> {
        check_range("compare a", a.len(), a_off, len)?;
        check_range("compare b", b.len(), b_off, len)?;
        self.same_device(a, "compare buffer a")?;
        self.same_device(b, "compare buffer b")?;
        if len == 0 {
            return Ok(Verdict::default());
        }
        self.run_check(|k, out| {
            let (mut pa, mut pb, mut n, mut o) = (
                a.device_ptr() + a_off as u64,
                b.device_ptr() + b_off as u64,
                len as u64,
                out,
            );
            let mut args = [
                &mut pa as *mut u64 as *mut c_void,
                &mut pb as *mut u64 as *mut c_void,
                &mut n as *mut u64 as *mut c_void,
                &mut o as *mut u64 as *mut c_void,
            ];
            self.launch(k.compare, k.grid(len), &mut args)?;
            self.hold_device(&[a, b]);
            Ok(())
        })
    }

    /// [`Stream::verify_pattern`] without kernels: copy back through `staging` (pinned, any
    /// size) chunk by chunk and check on the CPU. Blocking.
    pub fn verify_pattern_on_host(
        &self,
        buf: &DeviceBuffer,
        off: usize,
        len: usize,
        seed: u64,
        pos: u64,
        staging: &mut PinnedHostBuffer,
    ) -> Result<Verdict, CudaError> {
        check_range("pattern check", buf.len(), off, len)?;
        let mut v = Verdict::default();
        let mut done = 0usize;
        while done < len {
            let n = staging.len().min(len - done);
            self.copy_d2h(staging, 0, buf, off + done, n)?;
            self.synchronize()?;
            let local = pattern::check(&staging.as_slice()?[..n], seed, pos + done as u64);
            v.merge(local, done as u64);
            done += n;
        }
        Ok(v)
    }

    /// Whether the verification kernels load on this stream's device (PTX JIT available).
    pub fn kernels_available(&self) -> Result<(), CudaError> {
        kernels(self.context()).map(|_| ())
    }
}
