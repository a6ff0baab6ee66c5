//! A peer's remote keys unpacked on an endpoint (`ucp_ep_rkey_unpack`), and the remote regions
//! they open, whose bounds every access is checked against.

use std::fmt;
use std::sync::Arc;

use super::Endpoint;
use crate::call;
use crate::error::{Result, UcxError};
use crate::memory::RegionDesc;
use crate::sys;

/// Largest packed remote key accepted from a peer, bytes. Real keys are tens to a few
/// hundred bytes (one entry per memory domain).
pub const MAX_PACKED_RKEY: usize = 64 * 1024;
/// Zero bytes appended after a peer's packed key before UCX parses it:
/// `ucp_ep_rkey_unpack` takes no length, so a truncated key would make UCX read past the
/// buffer; the padding keeps such reads inside memory we own.
const RKEY_PAD: usize = 4096;

pub(super) struct RkeyInner {
    pub(super) ep: Endpoint,
    pub(super) raw: sys::ucp_rkey_h,
}

// SAFETY: destroyed under the worker lock; otherwise only read by UCX under that lock.
unsafe impl Send for RkeyInner {}
// SAFETY: as for Send.
unsafe impl Sync for RkeyInner {}

impl Drop for RkeyInner {
    fn drop(&mut self) {
        let w = self.ep.worker();
        let _g = w.guard();
        // SAFETY: last reference (requests using the key hold a clone), serialised.
        unsafe { call::rkey_destroy(w.api(), self.raw) };
    }
}

/// An unpacked remote key (`ucp_rkey_h`), valid on the endpoint it was unpacked on.
#[derive(Clone)]
pub struct RemoteKey {
    pub(super) inner: Arc<RkeyInner>,
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
        let raw = {
            let _g = w.guard();
            // SAFETY: live endpoint, serialised; the buffer is readable for len + RKEY_PAD
            // bytes.
            unsafe { call::ep_rkey_unpack(w.api(), ep.raw(), padded.as_ptr().cast()) }?
        };
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
