//! Memory registration (`ucp_mem_map`) and the packed remote key a peer needs to reach it.

use std::fmt;
use std::os::raw::c_void;
use std::sync::Arc;

use crate::call;
use crate::context::Context;
use crate::error::{Result, Status, UcxError};
use crate::mem_type::MemType;
use crate::sync::lock;
use crate::sys;

enum Owner {
    /// UCX allocated the memory (`UCP_MEM_MAP_ALLOCATE`); unmapping frees it.
    Ucx,
    /// A host buffer this handle owns; dropped after unmapping.
    Vec(#[allow(dead_code)] Vec<u8>),
    /// Memory the caller owns and promised to keep valid.
    Foreign,
}

pub(crate) struct MemInner {
    pub(crate) ctx: Context,
    pub(crate) raw: sys::ucp_mem_h,
    addr: *mut u8,
    len: usize,
    mem_type: MemType,
    _owner: Owner,
}

// SAFETY: the mapping is an address range plus a UCX handle; UCX calls on it are made under
// the context lock; CPU access goes through bounds-checked copies.
unsafe impl Send for MemInner {}
// SAFETY: as for Send: nothing of it changes after mapping.
unsafe impl Sync for MemInner {}

impl Drop for MemInner {
    fn drop(&mut self) {
        let _g = lock(&self.ctx.inner.lock);
        // SAFETY: last reference (requests hold a clone while they use the memory).
        if let Err(e) = unsafe { call::mem_unmap(self.ctx.api(), self.ctx.inner.raw, self.raw) } {
            tracing::warn!("{e}");
        }
    }
}

/// A registered memory range (`ucp_mem_h`): host or device memory UCX can move with RMA.
/// Cheap to clone; unmapped (and freed, if this handle owns the memory) when the last clone
/// and the last request using it are gone.
#[derive(Clone)]
pub struct MemHandle {
    pub(crate) inner: Arc<MemInner>,
}

impl fmt::Debug for MemHandle {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("MemHandle")
            .field("addr", &format_args!("{:#x}", self.addr()))
            .field("len", &self.len())
            .field("mem_type", &self.mem_type())
            .finish()
    }
}

impl MemHandle {
    /// Maps `len` bytes at `addr` (or lets UCX allocate them, for [`Owner::Ucx`]) and wraps the
    /// mapping with what owns the memory.
    fn map_owned(
        ctx: &Context,
        addr: *mut c_void,
        len: usize,
        mem_type: MemType,
        owner: Owner,
    ) -> Result<MemHandle> {
        if len == 0 {
            return Err(UcxError::InvalidArgument(
                "memory handle length must be > 0".into(),
            ));
        }
        if mem_type != MemType::Host {
            ctx.require_mem_type(mem_type)?;
        }
        let allocate = matches!(owner, Owner::Ucx);
        // Existing device memory is mapped without its type: UCX then detects the type *and
        // the system device* (GPU) of the range and packs that device into the remote key
        // (UCX_PROTO_INFO then shows the peer's memory as `cuda/dev[N]`, as for memory UCX
        // allocates itself). With the type given, the peer saw plain `cuda` and UCX chose
        // software emulation over shared memory instead of cuda_ipc (docs/benchmarks.md,
        // "Measurements behind the defaults", GPU memory mapped with UCX's type detection).
        // The detected type is checked against `mem_type` after mapping.
        let detect = !allocate && mem_type != MemType::Host;
        let mut p: sys::ucp_mem_map_params_t = call::unset();
        p.field_mask = (sys::UCP_MEM_MAP_PARAM_FIELD_ADDRESS
            | sys::UCP_MEM_MAP_PARAM_FIELD_LENGTH
            | sys::UCP_MEM_MAP_PARAM_FIELD_FLAGS) as u64;
        if !detect {
            p.field_mask |= sys::UCP_MEM_MAP_PARAM_FIELD_MEMORY_TYPE as u64;
        }
        p.address = addr;
        p.length = len;
        p.flags = if allocate {
            sys::UCP_MEM_MAP_ALLOCATE
        } else {
            0
        };
        p.memory_type = mem_type.raw();
        let api = ctx.api();
        let raw = {
            let _g = lock(&ctx.inner.lock);
            // SAFETY: live context, calls serialised; the flagged fields exist since UCX 1.13;
            // the caller vouches for addr/len when not allocating.
            unsafe { call::mem_map(api, ctx.inner.raw, &p) }?
        };
        let base = (|| {
            if detect {
                // SAFETY: raw was just mapped; MEM_TYPE exists since UCX 1.13.
                let attr =
                    unsafe { call::mem_query(api, raw, sys::UCP_MEM_ATTR_FIELD_MEM_TYPE as u64) }?;
                let found = MemType::from_raw(attr.mem_type);
                if found != Some(mem_type) {
                    return Err(UcxError::MemTypeMismatch {
                        expected: mem_type,
                        detected: found.map_or_else(
                            || format!("unknown ({})", attr.mem_type),
                            |t| t.to_string(),
                        ),
                    });
                }
            }
            if !allocate {
                return Ok(addr as *mut u8);
            }
            // SAFETY: raw was just mapped; ADDRESS exists since UCX 1.13.
            let attr =
                unsafe { call::mem_query(api, raw, sys::UCP_MEM_ATTR_FIELD_ADDRESS as u64) }?;
            if attr.address.is_null() {
                // UCX allocated the memory but tells no address: its query failed in effect.
                return Err(UcxError::Status {
                    op: "ucp_mem_query",
                    status: Status(sys::UCS_OK),
                });
            }
            Ok(attr.address as *mut u8)
        })();
        let base = match base {
            Ok(b) => b,
            Err(e) => {
                let _g = lock(&ctx.inner.lock);
                // SAFETY: undoes the mapping made above, which nothing else holds; its own
                // failure would add nothing to the error being returned.
                let _ = unsafe { call::mem_unmap(api, ctx.inner.raw, raw) };
                return Err(e);
            }
        };
        Ok(MemHandle {
            inner: Arc::new(MemInner {
                ctx: ctx.clone(),
                raw,
                addr: base,
                len,
                mem_type,
                _owner: owner,
            }),
        })
    }

    /// Lets UCX allocate and register `len` bytes of `mem_type` memory
    /// (`UCP_MEM_MAP_ALLOCATE`). Host memory from UCX is not zeroed.
    ///
    /// Errors: [`UcxError::InvalidArgument`] for `len == 0`, [`UcxError::MemTypeUnsupported`]
    /// when the context cannot handle `mem_type`, [`UcxError::Status`] from `ucp_mem_map`.
    pub fn alloc(ctx: &Context, len: usize, mem_type: MemType) -> Result<MemHandle> {
        Self::map_owned(ctx, std::ptr::null_mut(), len, mem_type, Owner::Ucx)
    }

    /// Registers a host buffer this handle takes ownership of (freed after unmapping).
    ///
    /// Errors: as [`MemHandle::alloc`].
    pub fn from_vec(ctx: &Context, mut buf: Vec<u8>) -> Result<MemHandle> {
        let (ptr, len) = (buf.as_mut_ptr(), buf.len());
        // The Vec's heap bytes stay where they are when it moves into the handle.
        Self::map_owned(ctx, ptr.cast(), len, MemType::Host, Owner::Vec(buf))
    }

    /// Registers existing memory of `mem_type` (host memory, or a CUDA device pointer from
    /// `cuMemAlloc`). Host memory is mapped with its type given; device memory is detected by
    /// UCX (so the remote key carries the GPU it lives on, which `cuda_ipc` needs) and the
    /// detected type must equal `mem_type`.
    ///
    /// Errors: as [`MemHandle::alloc`], and [`UcxError::MemTypeMismatch`] when UCX finds the
    /// range is not `mem_type` memory (e.g. a host pointer passed as CUDA).
    ///
    /// # Safety
    /// `addr..addr+len` must be valid memory of `mem_type` that stays allocated until this
    /// handle, all its clones and every request using it are dropped.
    pub unsafe fn map(
        ctx: &Context,
        addr: *mut u8,
        len: usize,
        mem_type: MemType,
    ) -> Result<MemHandle> {
        if addr.is_null() {
            return Err(UcxError::InvalidArgument("address is NULL".into()));
        }
        Self::map_owned(ctx, addr.cast(), len, mem_type, Owner::Foreign)
    }

    /// The first byte's address (what a peer's RMA targets), as an integer.
    pub fn addr(&self) -> u64 {
        self.inner.addr as u64
    }

    /// The length in bytes.
    pub fn len(&self) -> usize {
        self.inner.len
    }

    /// Always false: zero-length registrations are refused.
    pub fn is_empty(&self) -> bool {
        self.inner.len == 0
    }

    /// The memory type it was registered as.
    pub fn mem_type(&self) -> MemType {
        self.inner.mem_type
    }

    /// Checks `(offset, len)` against the mapping; returns the local address.
    pub(crate) fn range(&self, offset: usize, len: usize) -> Result<*mut u8> {
        match offset.checked_add(len) {
            Some(end) if end <= self.inner.len => {
                // SAFETY: in bounds of the mapping.
                Ok(unsafe { self.inner.addr.add(offset) })
            }
            _ => Err(UcxError::LocalOutOfBounds {
                offset,
                len,
                region_len: self.inner.len,
            }),
        }
    }

    fn host_range(&self, offset: usize, len: usize) -> Result<*mut u8> {
        if self.inner.mem_type != MemType::Host {
            return Err(UcxError::NotHostMemory(self.inner.mem_type));
        }
        self.range(offset, len)
    }

    /// Copies `src` into host memory at `offset`. A peer may write the same bytes at the same
    /// time by RMA; ordering such accesses is the protocol's job (flush, then message).
    ///
    /// Errors: [`UcxError::NotHostMemory`], [`UcxError::LocalOutOfBounds`].
    pub fn write(&self, offset: usize, src: &[u8]) -> Result<()> {
        let dst = self.host_range(offset, src.len())?;
        // SAFETY: bounds checked; src is a distinct Rust slice so the ranges cannot overlap.
        unsafe { std::ptr::copy_nonoverlapping(src.as_ptr(), dst, src.len()) };
        Ok(())
    }

    /// Copies host memory at `offset` into `dst`.
    ///
    /// Errors: [`UcxError::NotHostMemory`], [`UcxError::LocalOutOfBounds`].
    pub fn read(&self, offset: usize, dst: &mut [u8]) -> Result<()> {
        let src = self.host_range(offset, dst.len())?;
        // SAFETY: bounds checked; dst is a distinct Rust slice.
        unsafe { std::ptr::copy_nonoverlapping(src, dst.as_mut_ptr(), dst.len()) };
        Ok(())
    }

    /// Packs a remote key for the whole mapping (`ucp_rkey_pack`) for a peer to unpack.
    pub fn pack_rkey(&self) -> Result<PackedRkey> {
        let ctx = &self.inner.ctx;
        let api = ctx.api();
        let _g = lock(&ctx.inner.lock);
        // SAFETY: live context and mapping, calls serialised.
        let (buf, size) = unsafe { call::rkey_pack(api, ctx.inner.raw, self.inner.raw) }?;
        // SAFETY: `size` bytes at `buf`; released right after copying.
        let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: releases what rkey_pack allocated, once.
        unsafe { call::rkey_buffer_release(api, buf) };
        Ok(PackedRkey(bytes))
    }

    /// This mapping described for a peer: address, length and packed key.
    pub fn describe(&self) -> Result<RegionDesc> {
        Ok(RegionDesc {
            base: self.addr(),
            len: self.len() as u64,
            rkey: self.pack_rkey()?,
        })
    }
}

/// A packed remote key: opaque bytes to send to a peer (`ucp_rkey_pack` output, copied).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PackedRkey(pub Vec<u8>);

impl PackedRkey {
    /// The bytes.
    pub fn as_bytes(&self) -> &[u8] {
        &self.0
    }
}

/// What a peer needs to access a registered region: base address, length (bytes) and key.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionDesc {
    /// Remote address of the first byte.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// Packed remote key.
    pub rkey: PackedRkey,
}
