//! Memory registration (`ucp_mem_map`), packed remote keys and unpacked remote keys.

use std::fmt;
use std::os::raw::c_void;
use std::sync::Arc;

use crate::context::{lock, Context, MemType};
use crate::endpoint::Endpoint;
use crate::error::{check, Result, UcxError};
use crate::sys;

/// Largest packed remote key accepted from a peer, bytes. Real keys are tens to a few
/// hundred bytes (one entry per memory domain).
pub const MAX_PACKED_RKEY: usize = 64 * 1024;
/// Zero bytes appended after a peer's packed key before UCX parses it:
/// `ucp_ep_rkey_unpack` takes no length, so a truncated key would make UCX read past the
/// buffer; the padding keeps such reads inside memory we own.
const RKEY_PAD: usize = 4096;

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
unsafe impl Sync for MemInner {}

impl Drop for MemInner {
    fn drop(&mut self) {
        let _g = lock(&self.ctx.inner.lock);
        // SAFETY: last reference (requests hold a clone while they use the memory).
        let st = unsafe {
            self.ctx
                .inner
                .ucx
                .api
                .ucp_mem_unmap(self.ctx.inner.raw, self.raw)
        };
        if st != sys::UCS_OK {
            tracing::warn!(status = st, "ucp_mem_unmap failed");
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
    fn map_params(
        ctx: &Context,
        addr: *mut c_void,
        len: usize,
        mem_type: MemType,
        allocate: bool,
    ) -> Result<(sys::ucp_mem_h, *mut u8)> {
        if len == 0 {
            return Err(UcxError::InvalidArgument(
                "memory handle length must be > 0".into(),
            ));
        }
        if mem_type != MemType::Host && !ctx.supports(mem_type)? {
            let have: Vec<String> = ctx.memory_types()?.iter().map(|m| m.to_string()).collect();
            return Err(UcxError::MemTypeUnsupported(mem_type, have.join(",")));
        }
        // Existing device memory is mapped without its type: UCX then detects the type *and
        // the system device* (GPU) of the range and packs that device into the remote key
        // (UCX_PROTO_INFO then shows the peer's memory as `cuda/dev[N]`, as for memory UCX
        // allocates itself). With the type given, the peer saw plain `cuda` and UCX 1.22 chose
        // software emulation over shared memory instead of cuda_ipc (docs/benchmarks.md,
        // "Measurements behind the defaults", GPU memory mapped with UCX's type detection).
        // The detected type is checked against `mem_type` after mapping.
        let detect = !allocate && mem_type != MemType::Host;
        // SAFETY: zeroed params; every field flagged exists since UCX 1.13.
        let mut p: sys::ucp_mem_map_params_t = unsafe { std::mem::zeroed() };
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
        let mut raw: sys::ucp_mem_h = std::ptr::null_mut();
        {
            let _g = lock(&ctx.inner.lock);
            // SAFETY: live context; the caller vouches for addr/len when not allocating.
            check("ucp_mem_map", unsafe {
                ctx.inner.ucx.api.ucp_mem_map(ctx.inner.raw, &p, &mut raw)
            })?;
        }
        if detect {
            // SAFETY: zeroed attr; MEM_TYPE is known since 1.13; raw was just mapped.
            let mut attr: sys::ucp_mem_attr_t = unsafe { std::mem::zeroed() };
            attr.field_mask = sys::UCP_MEM_ATTR_FIELD_MEM_TYPE as u64;
            let st = unsafe { ctx.inner.ucx.api.ucp_mem_query(raw, &mut attr) };
            let found = MemType::ALL.into_iter().find(|t| t.raw() == attr.mem_type);
            if st != sys::UCS_OK || found != Some(mem_type) {
                let _g = lock(&ctx.inner.lock);
                // SAFETY: undo the mapping made above.
                unsafe { ctx.inner.ucx.api.ucp_mem_unmap(ctx.inner.raw, raw) };
                return Err(if st != sys::UCS_OK {
                    UcxError::Status {
                        op: "ucp_mem_query",
                        status: crate::Status(st),
                    }
                } else {
                    UcxError::MemTypeMismatch {
                        expected: mem_type,
                        detected: found.map_or_else(
                            || format!("unknown ({})", attr.mem_type),
                            |t| t.to_string(),
                        ),
                    }
                });
            }
        }
        let base = if allocate {
            // SAFETY: zeroed attr; ADDRESS is known since 1.13.
            let mut attr: sys::ucp_mem_attr_t = unsafe { std::mem::zeroed() };
            attr.field_mask = sys::UCP_MEM_ATTR_FIELD_ADDRESS as u64;
            // SAFETY: raw was just mapped.
            let st = unsafe { ctx.inner.ucx.api.ucp_mem_query(raw, &mut attr) };
            if st != sys::UCS_OK || attr.address.is_null() {
                let _g = lock(&ctx.inner.lock);
                // SAFETY: undo the mapping made above.
                unsafe { ctx.inner.ucx.api.ucp_mem_unmap(ctx.inner.raw, raw) };
                return Err(UcxError::Status {
                    op: "ucp_mem_query",
                    status: crate::Status(st),
                });
            }
            attr.address as *mut u8
        } else {
            addr as *mut u8
        };
        Ok((raw, base))
    }

    fn wrap(
        ctx: &Context,
        raw: sys::ucp_mem_h,
        addr: *mut u8,
        len: usize,
        mem_type: MemType,
        owner: Owner,
    ) -> MemHandle {
        MemHandle {
            inner: Arc::new(MemInner {
                ctx: ctx.clone(),
                raw,
                addr,
                len,
                mem_type,
                _owner: owner,
            }),
        }
    }

    /// Lets UCX allocate and register `len` bytes of `mem_type` memory
    /// (`UCP_MEM_MAP_ALLOCATE`). Host memory from UCX is not zeroed.
    ///
    /// Errors: [`UcxError::InvalidArgument`] for `len == 0`, [`UcxError::MemTypeUnsupported`]
    /// when the context cannot handle `mem_type`, [`UcxError::Status`] from `ucp_mem_map`.
    pub fn alloc(ctx: &Context, len: usize, mem_type: MemType) -> Result<MemHandle> {
        let (raw, base) = Self::map_params(ctx, std::ptr::null_mut(), len, mem_type, true)?;
        Ok(Self::wrap(ctx, raw, base, len, mem_type, Owner::Ucx))
    }

    /// Registers a host buffer this handle takes ownership of (freed after unmapping).
    ///
    /// Errors: as [`MemHandle::alloc`].
    pub fn from_vec(ctx: &Context, mut buf: Vec<u8>) -> Result<MemHandle> {
        let len = buf.len();
        let ptr = buf.as_mut_ptr();
        let (raw, base) = Self::map_params(ctx, ptr.cast(), len, MemType::Host, false)?;
        Ok(Self::wrap(
            ctx,
            raw,
            base,
            len,
            MemType::Host,
            Owner::Vec(buf),
        ))
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
        let (raw, base) = Self::map_params(ctx, addr.cast(), len, mem_type, false)?;
        Ok(Self::wrap(ctx, raw, base, len, mem_type, Owner::Foreign))
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
        let api = &ctx.inner.ucx.api;
        let _g = lock(&ctx.inner.lock);
        let mut buf: *mut c_void = std::ptr::null_mut();
        let mut size: usize = 0;
        // SAFETY: live context and mapping; UCX allocates the buffer.
        check("ucp_rkey_pack", unsafe {
            api.ucp_rkey_pack(ctx.inner.raw, self.inner.raw, &mut buf, &mut size)
        })?;
        // SAFETY: `size` bytes at `buf`; released right after copying.
        let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, size) }.to_vec();
        // SAFETY: releases what rkey_pack allocated.
        unsafe { api.ucp_rkey_buffer_release(buf) };
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

pub(crate) struct RkeyInner {
    pub(crate) ep: Endpoint,
    pub(crate) raw: sys::ucp_rkey_h,
}

// SAFETY: destroyed under the worker lock; otherwise only read by UCX under that lock.
unsafe impl Send for RkeyInner {}
unsafe impl Sync for RkeyInner {}

impl Drop for RkeyInner {
    fn drop(&mut self) {
        let w = self.ep.worker();
        let _g = w.guard();
        // SAFETY: last reference; requests using the key hold a clone.
        unsafe { w.api().ucp_rkey_destroy(self.raw) };
    }
}

/// An unpacked remote key (`ucp_rkey_h`), valid on the endpoint it was unpacked on.
#[derive(Clone)]
pub struct RemoteKey {
    pub(crate) inner: Arc<RkeyInner>,
}

impl fmt::Debug for RemoteKey {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteKey").finish_non_exhaustive()
    }
}

impl RemoteKey {
    /// Unpacks a peer's key on `ep` (`ucp_ep_rkey_unpack`).
    ///
    /// The bytes come from the network: they are size-checked (1..=[`MAX_PACKED_RKEY`]) and
    /// zero-padded before UCX parses them, but UCX itself does not validate keys, so accept
    /// keys only from peers on a connection you trust.
    pub fn unpack(ep: &Endpoint, packed: &[u8]) -> Result<RemoteKey> {
        if packed.is_empty() || packed.len() > MAX_PACKED_RKEY {
            return Err(UcxError::InvalidArgument(format!(
                "packed remote key of {} bytes (expected 1..={MAX_PACKED_RKEY})",
                packed.len()
            )));
        }
        ep.ensure_ok()?;
        let mut padded = vec![0u8; packed.len() + RKEY_PAD];
        padded[..packed.len()].copy_from_slice(packed);
        let w = ep.worker();
        let mut raw: sys::ucp_rkey_h = std::ptr::null_mut();
        {
            let _g = w.guard();
            // SAFETY: live endpoint; the buffer is readable for len + RKEY_PAD bytes.
            check("ucp_ep_rkey_unpack", unsafe {
                w.api()
                    .ucp_ep_rkey_unpack(ep.raw(), padded.as_ptr().cast(), &mut raw)
            })?;
        }
        Ok(RemoteKey {
            inner: Arc::new(RkeyInner {
                ep: ep.clone(),
                raw,
            }),
        })
    }
}

/// A peer's registered region: base address, length and unpacked key. Every access is
/// checked against `len` before it is posted (UCX itself does not check bounds).
#[derive(Debug, Clone)]
pub struct RemoteRegion {
    /// Remote address of the first byte.
    pub base: u64,
    /// Length in bytes.
    pub len: u64,
    /// Key for the region, unpacked on the endpoint that will access it.
    pub rkey: RemoteKey,
}

impl RemoteRegion {
    /// Unpacks `desc.rkey` on `ep` and keeps the bounds.
    pub fn new(ep: &Endpoint, desc: &RegionDesc) -> Result<RemoteRegion> {
        if desc.base.checked_add(desc.len).is_none() {
            return Err(UcxError::InvalidArgument(format!(
                "remote region {:#x}+{} wraps the address space",
                desc.base, desc.len
            )));
        }
        Ok(RemoteRegion {
            base: desc.base,
            len: desc.len,
            rkey: RemoteKey::unpack(ep, desc.rkey.as_bytes())?,
        })
    }

    /// Validates `(offset, len)` against the region; returns the remote address to use.
    ///
    /// Errors: [`UcxError::RemoteOutOfBounds`]; [`UcxError::InvalidArgument`] for a region
    /// built by hand whose `base + offset` wraps.
    pub fn check(&self, offset: u64, len: u64) -> Result<u64> {
        match offset.checked_add(len) {
            Some(end) if end <= self.len => self.base.checked_add(offset).ok_or_else(|| {
                UcxError::InvalidArgument(format!(
                    "remote region {:#x}+{} wraps the address space",
                    self.base, self.len
                ))
            }),
            _ => Err(UcxError::RemoteOutOfBounds {
                offset,
                len,
                region_len: self.len,
            }),
        }
    }
}
