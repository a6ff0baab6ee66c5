//! The primary context of one device, retained for as long as any handle to it lives.

use std::sync::{Arc, OnceLock};

use crate::blocks::CopyKernel;
use crate::cuda::{Cuda, Device};
use crate::error::CudaError;
use crate::ffi::{self, CUcontext, DriverApi};
use crate::kernels::Kernels;

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
    /// The PTX kernels (pattern fill / verify / compare), loaded on first use.
    pub(crate) kernels: OnceLock<Result<Kernels, CudaError>>,
    /// The block-list copy kernel ([`crate::blocks`]), loaded on first use.
    pub(crate) copy_kernel: OnceLock<Result<CopyKernel, CudaError>>,
}

// SAFETY: a CUcontext is a handle the driver lets any thread bind (cuCtxSetCurrent); we never
// touch the memory behind it.
unsafe impl Send for ContextInner {}
// SAFETY: as above; all mutation goes through the driver, which is thread-safe.
unsafe impl Sync for ContextInner {}

impl Drop for ContextInner {
    fn drop(&mut self) {
        if let Some(Ok(k)) = self.kernels.take() {
            k.unload(self.device.cuda.api, self.raw);
        }
        if let Some(Ok(k)) = self.copy_kernel.take() {
            k.unload(self.device.cuda.api, self.raw);
        }
        // SAFETY: balances the retain in Context::new.
        let r = unsafe { (self.device.cuda.api.cuDevicePrimaryCtxRelease)(self.device.raw) };
        if let Err(e) = self
            .device
            .cuda
            .api
            .check("cuDevicePrimaryCtxRelease_v2", r)
        {
            crate::error::log_teardown(
                "releasing primary context",
                Some(self.device.ordinal()),
                &e,
            );
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
        let mut raw: CUcontext = std::ptr::null_mut();
        // SAFETY: valid device, out-pointer to a live handle.
        cuda.api.check("cuDevicePrimaryCtxRetain", unsafe {
            (cuda.api.cuDevicePrimaryCtxRetain)(&mut raw, device.raw)
        })?;
        let ctx = Context {
            inner: Arc::new(ContextInner {
                device,
                raw,
                kernels: OnceLock::new(),
                copy_kernel: OnceLock::new(),
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
        self.api().check("cuCtxSetCurrent", unsafe {
            (self.api().cuCtxSetCurrent)(self.inner.raw)
        })
    }

    /// Wait for all work in this context (`cuCtxSynchronize`).
    pub fn synchronize(&self) -> Result<(), CudaError> {
        self.bind()?;
        // SAFETY: context is current.
        self.api().check("cuCtxSynchronize", unsafe {
            (self.api().cuCtxSynchronize)()
        })
    }

    /// (free, total) device memory in bytes (`cuMemGetInfo_v2`).
    pub fn memory_info(&self) -> Result<(u64, u64), CudaError> {
        self.bind()?;
        let (mut free, mut total) = (0usize, 0usize);
        // SAFETY: context current, out-pointers live.
        self.api().check("cuMemGetInfo_v2", unsafe {
            (self.api().cuMemGetInfo)(&mut free, &mut total)
        })?;
        Ok((free as u64, total as u64))
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
    // SAFETY: `from` current, `to` a retained context, flags must be 0.
    let r = unsafe { (from.api().cuCtxEnablePeerAccess)(to.inner.raw, 0) };
    if r == ffi::CUDA_ERROR_PEER_ACCESS_ALREADY_ENABLED {
        return Ok(PeerAccess::AlreadyEnabled);
    }
    from.api().check("cuCtxEnablePeerAccess", r)?;
    Ok(PeerAccess::Enabled)
}
