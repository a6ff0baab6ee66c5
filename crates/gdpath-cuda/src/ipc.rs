//! CUDA IPC: share device memory with another process on the same node
//! (`cuIpcGetMemHandle` / `cuIpcOpenMemHandle_v2` / `cuIpcCloseMemHandle`).
//!
//! The exporting process turns a [`DeviceBuffer`] into an [`IpcMemHandle`], 64 opaque bytes it
//! sends to the importer by any channel (a pipe, the agent protocol). The importer opens the
//! handle in one of its contexts and gets a [`DeviceBuffer`] over the exporter's memory: every
//! copy, pattern kernel and block-list copy of this crate works on it, and the mapping is closed
//! when its last reference (the handle or an in-flight stream operation) goes. This is how two
//! processes on one GPU (vLLM's disaggregated prefill and decode) or on two GPUs of one node
//! reach each other's KV cache without a host bounce.
//!
//! Rules from the CUDA driver API reference (`cuIpcGetMemHandle`, `cuIpcOpenMemHandle`):
//! - only memory from `cuMemAlloc` (here [`DeviceBuffer::new`], or a framework's caching
//!   allocator, which uses it) can be exported, and the handle names the whole allocation, so
//!   [`IpcMemHandle::export`] refuses a pointer that is not the start of its allocation;
//! - a process cannot open a handle it exported itself (`CUDA_ERROR_INVALID_CONTEXT`), and each
//!   handle can be opened once per context of the importing process;
//! - the exporter must keep the memory allocated until every importer has closed it; that
//!   ordering is the protocol's job (this crate cannot see the other process).

use std::ffi::c_char;

use crate::context::Context;
use crate::driver::call;
use crate::driver::sys::{CUdeviceptr, CUipcMemHandle, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS};
use crate::error::CudaError;
use crate::memory::{close_ipc_mapping, DeviceBuffer};

/// An exported allocation: `CUipcMemHandle`, 64 bytes, meaningful to other processes of the
/// same node while the exporter keeps the memory allocated. Plain data: `Copy`, comparable,
/// sendable as [`IpcMemHandle::to_bytes`].
#[derive(Clone, Copy, PartialEq, Eq, Hash)]
pub struct IpcMemHandle {
    bytes: [u8; IpcMemHandle::SIZE],
}

impl std::fmt::Debug for IpcMemHandle {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "IpcMemHandle(")?;
        for b in &self.bytes[..8] {
            write!(f, "{b:02x}")?;
        }
        write!(f, "..)")
    }
}

impl IpcMemHandle {
    /// `CU_IPC_HANDLE_SIZE` (cuda.h): bytes of a handle.
    pub const SIZE: usize = 64;

    /// Export `buf`'s allocation (`cuIpcGetMemHandle`).
    ///
    /// Errors: [`CudaError::InvalidArgument`] when `buf` does not start at the base of its
    /// allocation (a [`DeviceBuffer::from_raw`] view into a larger allocation: the handle would
    /// name the whole allocation, and the importer would see other offsets than the exporter);
    /// the driver's error for memory that cannot be exported (`CUDA_ERROR_INVALID_VALUE` for
    /// pool or VMM allocations, `CUDA_ERROR_NOT_SUPPORTED` where IPC is unavailable).
    pub fn export(buf: &DeviceBuffer) -> Result<IpcMemHandle, CudaError> {
        let ctx = buf.context();
        ctx.bind()?;
        let (base, _size) = address_range(ctx, buf.device_ptr())?;
        if base != buf.device_ptr() {
            return Err(CudaError::InvalidArgument(format!(
                "IPC export of {:#x}: the allocation starts at {base:#x}; export the allocation \
                 and send the offset ({} bytes) beside the handle",
                buf.device_ptr(),
                buf.device_ptr() - base
            )));
        }
        let h = call::ipc_get_mem_handle(ctx.api(), buf.device_ptr())?;
        Ok(IpcMemHandle {
            bytes: h.reserved.map(|c| c as u8),
        })
    }

    /// The 64 bytes to send to the importing process.
    pub fn to_bytes(&self) -> [u8; IpcMemHandle::SIZE] {
        self.bytes
    }

    /// A handle received from another process. Any 64 bytes are accepted here; a handle that
    /// names nothing fails in [`IpcMemHandle::open`] with the driver's error.
    pub fn from_bytes(bytes: [u8; IpcMemHandle::SIZE]) -> IpcMemHandle {
        IpcMemHandle { bytes }
    }

    /// A handle from a slice (as read from a pipe or a message).
    ///
    /// Errors: [`CudaError::InvalidArgument`] unless `bytes` is exactly [`IpcMemHandle::SIZE`]
    /// long.
    pub fn from_slice(bytes: &[u8]) -> Result<IpcMemHandle, CudaError> {
        let bytes: [u8; IpcMemHandle::SIZE] = bytes.try_into().map_err(|_| {
            CudaError::InvalidArgument(format!(
                "an IPC memory handle is {} bytes, got {}",
                IpcMemHandle::SIZE,
                bytes.len()
            ))
        })?;
        Ok(IpcMemHandle { bytes })
    }

    /// Open the exporter's allocation in `ctx` (`cuIpcOpenMemHandle_v2` with
    /// `CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS`, so memory of another GPU of the node is mapped with
    /// peer access). The result covers the whole allocation (its length from
    /// `cuMemGetAddressRange_v2`, which may be rounded up from what the exporter asked for),
    /// is usable by every stream of `ctx`'s device, and is closed with its last reference.
    ///
    /// Errors: the driver's (`CUDA_ERROR_INVALID_CONTEXT` when this process exported the
    /// handle itself; `CUDA_ERROR_INVALID_VALUE` or `CUDA_ERROR_MAP_FAILED` for a handle that
    /// names no live allocation or one already open in this context; `CUDA_ERROR_TOO_MANY_PEERS`).
    pub fn open(&self, ctx: &Context) -> Result<DeviceBuffer, CudaError> {
        ctx.bind()?;
        let h = CUipcMemHandle {
            reserved: self.bytes.map(|b| b as c_char),
        };
        let ptr = call::ipc_open_mem_handle(ctx.api(), h, CU_IPC_MEM_LAZY_ENABLE_PEER_ACCESS)?;
        let len = match address_range(ctx, ptr) {
            Ok((base, len)) if base == ptr && len > 0 => len,
            other => {
                // SAFETY: opened just above in this context; nothing else has the address.
                unsafe { close_ipc_mapping(ctx, ptr) };
                return Err(match other {
                    Err(e) => e,
                    Ok((base, len)) => CudaError::InvalidArgument(format!(
                        "IPC mapping at {ptr:#x}: the driver reports an allocation of {len} \
                         bytes at {base:#x}"
                    )),
                });
            }
        };
        Ok(DeviceBuffer::wrap(ctx, ptr, len, false, true))
    }
}

/// (base, size) of the allocation holding `ptr` (`cuMemGetAddressRange_v2`); context current.
fn address_range(ctx: &Context, ptr: CUdeviceptr) -> Result<(u64, usize), CudaError> {
    call::mem_get_address_range(ctx.api(), ptr)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn handle_bytes_round_trip_and_length_is_checked() {
        let mut b = [0u8; 64];
        for (i, x) in b.iter_mut().enumerate() {
            *x = (i * 7 + 3) as u8;
        }
        let h = IpcMemHandle::from_bytes(b);
        assert_eq!(h.to_bytes(), b);
        assert_eq!(IpcMemHandle::from_slice(&b).unwrap(), h);
        for n in [0usize, 63, 65] {
            let v = vec![0u8; n];
            let e = IpcMemHandle::from_slice(&v).unwrap_err();
            assert!(
                matches!(&e, CudaError::InvalidArgument(m) if m.contains(&format!("got {n}"))),
                "{e}"
            );
        }
        assert_eq!(std::mem::size_of::<CUipcMemHandle>(), IpcMemHandle::SIZE);
        assert!(format!("{h:?}").starts_with("IpcMemHandle(03"));
    }
}
