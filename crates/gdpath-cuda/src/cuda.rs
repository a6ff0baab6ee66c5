//! The driver handle and per-device queries (no context needed).

use gdpath_topo::facts::CudaP2pAttrs;

use crate::driver::sys::{self, CUdevice, DriverApi};
use crate::driver::{self, call};
use crate::error::CudaError;
use crate::pci::normalize_pci;

/// The loaded CUDA driver. Cheap to copy; every `Cuda` shares one process-wide library handle,
/// loaded on the first [`Cuda::load`] and never unloaded.
#[derive(Clone, Copy)]
pub struct Cuda {
    pub(crate) api: &'static DriverApi,
    /// `cuInit` found no device: the driver loaded, and the machine has no GPU.
    no_device: bool,
}

impl std::fmt::Debug for Cuda {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cuda")
            .field("loaded_from", &self.api.loaded_from)
            .field("no_device", &self.no_device)
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
        let loaded = driver::loaded()?;
        let no_device = match &loaded.init {
            Ok(()) => false,
            Err(e) if e.cu_result() == Some(sys::CUDA_ERROR_NO_DEVICE) => true,
            Err(e) => return Err(e.clone()),
        };
        Ok(Cuda {
            api: &loaded.api,
            no_device,
        })
    }

    /// Where the driver library was loaded from (a bare SONAME or an absolute path).
    pub fn loaded_from(&self) -> &str {
        &self.api.loaded_from
    }

    /// `cuDriverGetVersion`: the CUDA version the driver supports, as 1000*major + 10*minor
    /// (13000 for CUDA 13.0).
    pub fn driver_version(&self) -> Result<u32, CudaError> {
        Ok(call::driver_get_version(self.api)? as u32)
    }

    /// Whether the calling thread has a CUDA context current (`cuCtxGetCurrent` non-NULL).
    /// Libraries that issue CUDA calls on the caller's thread without choosing a context
    /// themselves (UCX's CUDA transports) need one.
    pub fn has_current_context(&self) -> bool {
        call::ctx_get_current(self.api).is_ok_and(|ctx| !ctx.is_null())
    }

    /// Number of CUDA devices visible to this process (after `CUDA_VISIBLE_DEVICES`).
    pub fn device_count(&self) -> Result<u32, CudaError> {
        if self.no_device {
            return Ok(0);
        }
        Ok(call::device_get_count(self.api)?.max(0) as u32)
    }

    /// The device with CUDA ordinal `ordinal`.
    pub fn device(&self, ordinal: u32) -> Result<Device, CudaError> {
        let count = self.device_count()?;
        if ordinal >= count {
            return Err(CudaError::NoSuchDevice { ordinal, count });
        }
        Ok(Device {
            cuda: *self,
            ordinal,
            raw: call::device_get(self.api, ordinal as i32)?,
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
    /// `CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT`: SMs of the device.
    pub const MULTIPROCESSOR_COUNT: Self = Self(sys::CU_DEVICE_ATTRIBUTE_MULTIPROCESSOR_COUNT);
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR`.
    pub const COMPUTE_CAPABILITY_MAJOR: Self =
        Self(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MAJOR);
    /// `CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR`.
    pub const COMPUTE_CAPABILITY_MINOR: Self =
        Self(sys::CU_DEVICE_ATTRIBUTE_COMPUTE_CAPABILITY_MINOR);
    /// `CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED` (CUDA 11.3+).
    pub const GPU_DIRECT_RDMA_SUPPORTED: Self =
        Self(sys::CU_DEVICE_ATTRIBUTE_GPU_DIRECT_RDMA_SUPPORTED);
    /// `CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED` (CUDA 11.7+).
    pub const DMA_BUF_SUPPORTED: Self = Self(sys::CU_DEVICE_ATTRIBUTE_DMA_BUF_SUPPORTED);
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
        call::device_get_name(self.cuda.api, self.raw)
    }

    /// `cuDeviceTotalMem_v2`: device memory in bytes.
    pub fn total_memory(&self) -> Result<u64, CudaError> {
        Ok(call::device_total_mem(self.cuda.api, self.raw)? as u64)
    }

    /// `cuDeviceGetPCIBusId`, in sysfs form (`0000:00:06.0`, lower case).
    pub fn pci_bus_id(&self) -> Result<String, CudaError> {
        normalize_pci(&call::device_get_pci_bus_id(self.cuda.api, self.raw)?)
    }

    /// `cuDeviceGetAttribute`.
    pub fn attribute(&self, attr: DeviceAttribute) -> Result<i32, CudaError> {
        call::device_get_attribute(self.cuda.api, attr.0, self.raw)
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
        call::device_can_access_peer(self.cuda.api, self.raw, peer.raw)
    }

    /// `cuDeviceGetP2PAttribute` for the ordered pair (self → peer): access, native atomics,
    /// CUDA array access and performance rank (relative; lower is better).
    pub fn p2p_attributes(&self, peer: &Device) -> Result<CudaP2pAttrs, CudaError> {
        let get = |attr| call::device_get_p2p_attribute(self.cuda.api, attr, self.raw, peer.raw);
        Ok(CudaP2pAttrs {
            access_supported: get(sys::CU_DEVICE_P2P_ATTRIBUTE_ACCESS_SUPPORTED)? != 0,
            native_atomics: get(sys::CU_DEVICE_P2P_ATTRIBUTE_NATIVE_ATOMIC_SUPPORTED)? != 0,
            cuda_array_access: get(sys::CU_DEVICE_P2P_ATTRIBUTE_CUDA_ARRAY_ACCESS_SUPPORTED)? != 0,
            performance_rank: get(sys::CU_DEVICE_P2P_ATTRIBUTE_PERFORMANCE_RANK)?,
        })
    }
}
