//! The driver handle and per-device queries (no context needed).

use std::ffi::{c_char, c_int};

use gdpath_topo::facts::CudaP2pAttrs;

use crate::error::CudaError;
use crate::facts::normalize_pci;
use crate::ffi::{self, CUdevice, DriverApi};

/// The loaded CUDA driver. Cheap to copy; every `Cuda` shares one process-wide library handle,
/// loaded on the first [`Cuda::load`] and never unloaded.
#[derive(Clone, Copy)]
pub struct Cuda {
    pub(crate) api: &'static DriverApi,
    init: ffi::CUresult,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("loaded_from", &self.api.loaded_from)
            .field("init", &self.init)
            .finish()
    }
}

impl Cuda {
    /// Load `libcuda.so.1` (see [`crate::loader`] for the search) and initialise the driver.
    ///
    /// Errors: [`CudaError::LibraryMissing`] without a driver, [`CudaError::SymbolMissing`] for a
    /// driver older than CUDA 11.4, [`CudaError::Driver`] if `cuInit` fails for a reason other
    /// than "no device" (a machine without GPUs loads fine and reports 0 devices).
    pub fn load() -> Result<Cuda, CudaError> {
        let loaded = ffi::driver()?;
        if loaded.init != ffi::CUDA_SUCCESS && loaded.init != ffi::CUDA_ERROR_NO_DEVICE {
            loaded.api.check("cuInit", loaded.init)?;
        }
        Ok(Cuda {
            api: &loaded.api,
            init: loaded.init,
        })
    }

    /// Where the driver library was loaded from (a bare SONAME or an absolute path).
    pub fn loaded_from(&self) -> &str {
        &self.api.loaded_from
    }

    /// `cuDriverGetVersion`: the CUDA version the driver supports, as 1000*major + 10*minor
    /// (13000 for CUDA 13.0).
    pub fn driver_version(&self) -> Result<u32, CudaError> {
        let mut v: c_int = 0;
        // SAFETY: out-pointer to a live int.
        self.api.check("cuDriverGetVersion", unsafe {
            (self.api.cuDriverGetVersion)(&mut v)
        })?;
        Ok(v as u32)
    }

    /// Whether the calling thread has a CUDA context current (`cuCtxGetCurrent` non-NULL).
    /// Libraries that issue CUDA calls on the caller's thread without choosing a context
    /// themselves (UCX's CUDA transports) need one.
    pub fn has_current_context(&self) -> bool {
        let mut ctx: ffi::CUcontext = std::ptr::null_mut();
        // SAFETY: out-pointer to a live handle.
        let r = unsafe { (self.api.cuCtxGetCurrent)(&mut ctx) };
        r == ffi::CUDA_SUCCESS && !ctx.is_null()
    }

    /// Number of CUDA devices visible to this process (after `CUDA_VISIBLE_DEVICES`).
    pub fn device_count(&self) -> Result<u32, CudaError> {
        if self.init == ffi::CUDA_ERROR_NO_DEVICE {
            return Ok(0);
        }
        let mut n: c_int = 0;
        // SAFETY: out-pointer to a live int.
        self.api.check("cuDeviceGetCount", unsafe {
            (self.api.cuDeviceGetCount)(&mut n)
        })?;
        Ok(n.max(0) as u32)
    }

    /// The device with CUDA ordinal `ordinal`.
    pub fn device(&self, ordinal: u32) -> Result<Device, CudaError> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        let mut dev: CUdevice = 0;
        // SAFETY: ordinal < count, out-pointer to a live int.
        self.api.check("cuDeviceGet", unsafe {
            (self.api.cuDeviceGet)(&mut dev, ordinal as c_int)
        })?;
        Ok(Device {
            cuda: *self,
            ordinal,
            raw: dev,
        })
    }

    /// All devices, in CUDA ordinal order.
    pub fn devices(&self) -> Result<Vec<Device>, CudaError> {
        (0..self.device_count()?).map(|i| self.device(i)).collect()
    }
}

/// One CUDA device: queries that need no context.
#[derive(Debug, Clone, Copy)]
pub struct Device {
    pub(crate) cuda: Cuda,
    ordinal: u32,
    pub(crate) raw: CUdevice,
}

/// A device attribute, as the raw `CUdevice_attribute` number from `cuda.h`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct DeviceAttribute(pub i32);

impl DeviceAttribute {
    pub const MULTIPROCESSOR_COUNT: Self = Self(ffi::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    pub const UNIFIED_ADDRESSING: Self = Self(ffi::CU_DEVICE_ATTRIBUTE_UNIFIED_ADDRESSING);
    pub const COMPUTE_CAPABILITY_MAJOR: Self =
        Self(ffi::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    pub const COMPUTE_CAPABILITY_MINOR: Self =
        Self(ffi::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` (CUDA 11.3+).
    pub const GPU_DIRECT_RDMA_SUPPORTED: Self =
        Self(ffi::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED);
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (CUDA 11.7+).
    pub const DMA_BUF_SUPPORTED: Self = Self(ffi::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
}

impl Device {
    /// CUDA ordinal.
    pub fn ordinal(&self) -> u32 {
        self.ordinal
    }

    /// The driver this device belongs to.
    pub fn cuda(&self) -> Cuda {
        self.cuda
    }

    /// `cuDeviceGetName`, e.g. `NVIDIA H200`.
    pub fn name(&self) -> Result<String, CudaError> {
        let mut buf = [0 as c_char; 256];
        // SAFETY: buffer of the stated length.
        self.cuda.api.check("cuDeviceGetName", unsafe {
            (self.cuda.api.cuDeviceGetName)(buf.as_mut_ptr(), buf.len() as c_int, self.raw)
        })?;
        Ok(ffi::c_buf_to_string(&buf))
    }

    /// `cuDeviceTotalMem_v2`: device memory in bytes.
    pub fn total_memory(&self) -> Result<u64, CudaError> {
        let mut n: usize = 0;
        // SAFETY: out-pointer to a live usize.
        self.cuda.api.check("cuDeviceTotalMem_v2", unsafe {
            (self.cuda.api.cuDeviceTotalMem)(&mut n, self.raw)
        })?;
        Ok(n as u64)
    }

    /// `cuDeviceGetPCIBusId`, in sysfs form (`0000:00:06.0`, lower case).
    pub fn pci_bus_id(&self) -> Result<String, CudaError> {
        let mut buf = [0 as c_char; 64];
        // SAFETY: buffer of the stated length.
        self.cuda.api.check("cuDeviceGetPCIBusId", unsafe {
            (self.cuda.api.cuDeviceGetPCIBusId)(buf.as_mut_ptr(), buf.len() as c_int, self.raw)
        })?;
        normalize_pci(&ffi::c_buf_to_string(&buf))
    }

    /// `cuDeviceGetAttribute`.
    pub fn attribute(&self, attr: DeviceAttribute) -> Result<i32, CudaError> {
        let mut v: c_int = 0;
        // SAFETY: out-pointer to a live int; unknown attributes return an error, not UB.
        self.cuda.api.check("cuDeviceGetAttribute", unsafe {
            (self.cuda.api.cuDeviceGetAttribute)(&mut v, attr.0, self.raw)
        })?;
        Ok(v)
    }

    /// (major, minor) compute capability, e.g. (9, 0) for H100/H200.
    pub fn compute_capability(&self) -> Result<(i32, i32), CudaError> {
        Ok((
            self.attribute(DeviceAttribute::COMPUTE_CAPABILITY_MAJOR)?,
            self.attribute(DeviceAttribute::COMPUTE_CAPABILITY_MINOR)?,
        ))
    }

    /// `cuDeviceCanAccessPeer(self, peer)`: whether this device can map `peer`'s memory.
    pub fn can_access_peer(&self, peer: &Device) -> Result<bool, CudaError> {
        let mut v: c_int = 0;
        // SAFETY: out-pointer to a live int.
        self.cuda.api.check("cuDeviceCanAccessPeer", unsafe {
            (self.cuda.api.cuDeviceCanAccessPeer)(&mut v, self.raw, peer.raw)
        })?;
        Ok(v != 0)
    }

    /// `cuDeviceGetP2PAttribute` for the ordered pair (self → peer): access, native atomics,
    /// CUDA array access and performance rank (relative; lower is better).
    pub fn p2p_attributes(&self, peer: &Device) -> Result<CudaP2pAttrs, CudaError> {
        let get = |attr: c_int| -> Result<i32, CudaError> {
            let mut v: c_int = 0;
            // SAFETY: out-pointer to a live int.
            self.cuda.api.check("cuDeviceGetP2PAttribute", unsafe {
                (self.cuda.api.cuDeviceGetP2PAttribute)(&mut v, attr, self.raw, peer.raw)
            })?;
            Ok(v)
        };
        Ok(CudaP2pAttrs {
            access_supported: get(ffi::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
            native_atomics: get(ffi::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
            cuda_array_access: get(ffi::CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED)? != 0,
            performance_rank: get(ffi::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
        })
    }
}
