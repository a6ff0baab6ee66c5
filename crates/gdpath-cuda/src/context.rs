//! The primary context of one device, retained for as long as any handle to it lives.

use std::sync::{Arc, OnceLock};

use crate::cuda::{Cuda, Device, DeviceAttribute};
use crate::driver::call;
use crate::driver::sys::{CUcontext, CUfunction, DriverApi};
use crate::error::CudaError;
use crate::module::{Kernel, Module, Ptx};

/// A retained primary context (`cuDevicePrimaryCtxRetain` / `cuDevicePrimaryCtxRelease_v2`).
///
/// The primary context is the one the CUDA runtime, PyTorch and NCCL share, so memory gdpath
/// allocates is usable by them and vice versa. Cheap to clone (an `Arc`); released when the last
/// clone, buffer, stream or event made from it is dropped. `Send + Sync`: a driver context may be
/// made current on any thread, and every method here makes it current itself.
#[derive(Clone)]
pub struct Context {
    pub(crate) inner: Arc<ContextInner>,
}

pub(crate) struct ContextInner {
    pub(crate) device: Device,
    pub(crate) raw: CUcontext,
    /// The shipped PTX modules, each loaded on the first use of one of its kernels (a failed
    /// load is kept too, and not retried).
    modules: [OnceLock<Result<Module, CudaError>>; Ptx::COUNT],
    /// The device's SM count, read on first use.
    multiprocessors: OnceLock<Result<u32, CudaError>>,
}

// SAFETY: a CUcontext is a handle the driver lets any thread bind (cuCtxSetCurrent); we never
// touch the memory behind it.
unsafe impl Send for ContextInner {}
// SAFETY: as above; all mutation goes through the driver, which is thread-safe.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        let api = self.device.cuda.api;
        let ordinal = Some(self.device.ordinal());
        for module in self.modules.iter_mut().filter_map(|m| m.take()?.ok()) {
            // SAFETY: our context, still retained; no kernel of ours runs once the last handle to
            // the context (which every stream holds) is gone, and the module goes with this call.
            let r = unsafe { call::ctx_set_current(api, self.raw) }
                // SAFETY: as above, with the context current.
                .and_then(|()| unsafe { module.unload(api) });
            if let Err(e) = r {
                crate::error::log_teardown("unloading a PTX module", ordinal, &e);
            }
        }
        // SAFETY: balances the retain in Context::new.
        if let Err(e) = unsafe { call::device_primary_ctx_release(api, self.device.raw) } {
            crate::error::log_teardown("releasing primary context", ordinal, &e);
        }
    }
}

impl std::fmt::Debug for Context {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Context")
            .field("ordinal", &self.ordinal())
            .finish()
    }
}

impl Context {
    /// Retain the primary context of device `ordinal`.
    pub fn new(cuda: &Cuda, ordinal: u32) -> Result<Context, CudaError> {
        let device = cuda.device(ordinal)?;
        let raw = call::device_primary_ctx_retain(cuda.api, device.raw)?;
        let ctx = Context {
            inner: Arc::new(ContextInner {
                device,
                raw,
                modules: Default::default(),
                multiprocessors: OnceLock::new(),
            }),
        };
        ctx.bind()?;
        Ok(ctx)
    }

    pub(crate) fn api(&self) -> &'static DriverApi {
        self.inner.device.cuda.api
    }

    /// CUDA ordinal of the device.
    pub fn ordinal(&self) -> u32 {
        self.inner.device.ordinal()
    }

    /// The device.
    pub fn device(&self) -> Device {
        self.inner.device
    }

    /// Make this context current on the calling thread (`cuCtxSetCurrent`). Every method of this
    /// crate does this itself; call it only before your own driver calls.
    pub fn bind(&self) -> Result<(), CudaError> {
        // SAFETY: a retained context handle.
        unsafe { call::ctx_set_current(self.api(), self.inner.raw) }
    }

    /// Wait for all work in this context (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        call::ctx_synchronize(self.api())
    }

    /// (free, total) device memory in bytes (`cuMemGetInfo_v2`).
    pub fn memory_info(&self) -> Result<(u64, u64), CudaError> {
        self.bind()?;
        let (free, total) = call::mem_get_info(self.api())?;
        Ok((free as u64, total as u64))
    }

    /// The function of `kernel` in this context, loading its module on first use (the context
    /// is bound then).
    ///
    /// Errors: the module's load error (kept: a module that failed to load is not retried).
    pub(crate) fn kernel(&self, kernel: Kernel) -> Result<CUfunction, CudaError> {
        let ptx = kernel.ptx();
        let module = self.inner.modules[ptx.slot()]
            .get_or_init(|| {
                self.bind()?;
                Module::load(self.api(), ptx)
            })
            .as_ref()
            .map_err(Clone::clone)?;
        module.function(kernel).ok_or_else(|| {
            CudaError::InvalidArgument(format!("{kernel:?} is not a kernel of {ptx:?}"))
        })
    }

    /// Number of SMs of the device (`CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`, at least 1), read
    /// once per context: the kernels size their grids by it.
    pub(crate) fn multiprocessors(&self) -> Result<u32, CudaError> {
        self.inner
            .multiprocessors
            .get_or_init(|| {
                let n = self
                    .device()
                    .attribute(DeviceAttribute::MULTIPROCESSOR_COUNT)?;
                Ok(n.max(1) as u32)
            })
            .clone()
    }

    /// Whether both handles are the same device's context.
    pub fn same_device(&self, other: &Context) -> bool {
        self.ordinal() == other.ordinal()
    }
}

/// What [`enable_peer_access`] did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PeerAccess {
    /// Access was enabled by this call.
    Enabled,
    /// It was already enabled (`CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED`), by gdpath or by
    /// another library sharing the primary context.
    AlreadyEnabled,
}

/// Let kernels and copies running in `from` access memory of `to` directly
/// (`cuCtxEnablePeerAccess` with `from` current and `to` as the peer). One direction only: call
/// it twice for both. Stays enabled for the life of the primary contexts.
///
/// Errors: [`CudaError::InvalidArgument`] for the same device twice; the driver's
/// `CUDA_ERROR_PEER_ACCESS_UNSUPPORTED` when P2P is impossible between the two (check
/// [`Device::can_access_peer`] first).
pub fn enable_peer_access(from: &Context, to: &Context) -> Result<PeerAccess, CudaError> {
    if from.same_device(to) {
        return Err(CudaError::InvalidArgument(format!(
            "peer access from GPU {} to itself",
            from.ordinal()
        )));
    }
    from.bind()?;
    // SAFETY: `to` is a retained context (its handle keeps it so).
    if unsafe { call::ctx_enable_peer_access(from.api(), to.inner.raw) }? {
        Ok(PeerAccess::Enabled)
    } else {
        Ok(PeerAccess::AlreadyEnabled)
    }
}
