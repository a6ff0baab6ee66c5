//! RMA on an endpoint: put, get and flush.

use std::sync::atomic::Ordering;
use std::sync::Arc;
use std::time::Duration;

use super::rkey::RemoteRegion;
use super::Endpoint;
use crate::call;
use crate::context::Features;
use crate::error::{Result, UcxError};
use crate::memory::MemHandle;
use crate::request::{Pins, Request};
use crate::sys;

impl Endpoint {
    /// Completes every operation posted on this endpoint (`ucp_ep_flush_nbx`): after it,
    /// puts are visible in the target's memory. Progresses up to `timeout`.
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        // Operations posted after the flush was posted are not covered by it.
        self.inner.dirty.store(false, Ordering::Release);
        let r = self.flush_nb().and_then(|r| r.wait(timeout));
        if r.is_err() {
            self.inner.dirty.store(true, Ordering::Release);
        }
        r
    }

    /// Posts an endpoint flush and returns its request.
    pub fn flush_nb(&self) -> Result<Request> {
        self.ensure_ok()?;
        let w = self.worker();
        let _g = w.guard();
        // SAFETY: live endpoint, serialised.
        let posted = unsafe { call::ep_flush_nbx(w.api(), self.inner.raw) };
        Request::new(w.clone(), Some(self.pins()), posted).map(Request::bufferless)
    }

    fn rma(
        &self,
        get: bool,
        local: &MemHandle,
        local_off: usize,
        remote: &RemoteRegion,
        remote_off: u64,
        len: usize,
    ) -> Result<Request> {
        self.worker().context().require(Features::RMA, "RMA")?;
        if !Arc::ptr_eq(&remote.rkey.inner.ep.inner, &self.inner) {
            return Err(UcxError::InvalidArgument(
                "remote key was unpacked on another endpoint".into(),
            ));
        }
        self.check_same_context(local)?;
        let laddr = local.range(local_off, len)?;
        let raddr = remote.check(remote_off, len as u64)?;
        self.ensure_ok()?;
        let w = self.worker();
        let _g = w.guard();
        let mut p: sys::ucp_request_param_t = call::unset();
        p.op_attr_mask = sys::UCP_OP_ATTR_FIELD_MEMORY_TYPE | sys::UCP_OP_ATTR_FIELD_MEMH;
        p.memory_type = local.mem_type().raw();
        p.memh = local.inner.raw;
        let post = if get { call::get_nbx } else { call::put_nbx };
        // SAFETY: live endpoint, serialised; MEMORY_TYPE and MEMH exist since UCX 1.13; the
        // local range is inside a live mapping the request pins while pending; the remote
        // range was checked against the peer's region; the key is live on this endpoint.
        let posted = unsafe {
            post(
                w.api(),
                self.inner.raw,
                laddr.cast(),
                len,
                raddr,
                remote.rkey.inner.raw,
                &p,
            )
        };
        self.inner.dirty.store(true, Ordering::Release);
        // An operation UCX finished at post (a small put copied out, the common case) touches
        // nothing afterwards: only a pending one pins what it uses. An error keeps the
        // endpoint, to name the peer.
        let pending = posted.as_ref().map_or(true, |p| !p.req.is_null());
        let pins = pending.then(|| Pins {
            mem: Some(local.clone()),
            rkey: Some(remote.rkey.inner.clone()),
            ..self.pins()
        });
        Request::new(w.clone(), pins, posted)
    }

    /// Writes `len` bytes from `local[local_off..]` to `remote[remote_off..]`
    /// (`ucp_put_nbx`). Both ranges are bounds-checked first. Completion of the request
    /// means the local buffer may be reused; visibility at the target needs
    /// [`Endpoint::flush`].
    ///
    /// Errors: [`UcxError::LocalOutOfBounds`], [`UcxError::RemoteOutOfBounds`],
    /// [`UcxError::EndpointFailed`], [`UcxError::InvalidArgument`] (key from another endpoint,
    /// memory from another context), [`UcxError::FeatureMissing`] without RMA.
    pub fn put(
        &self,
        local: &MemHandle,
        local_off: usize,
        remote: &RemoteRegion,
        remote_off: u64,
        len: usize,
    ) -> Result<Request> {
        self.rma(false, local, local_off, remote, remote_off, len)
    }

    /// Reads `len` bytes from `remote[remote_off..]` into `local[local_off..]`
    /// (`ucp_get_nbx`); the data is in place when the request completes. Errors as
    /// [`Endpoint::put`].
    pub fn get(
        &self,
        local: &MemHandle,
        local_off: usize,
        remote: &RemoteRegion,
        remote_off: u64,
        len: usize,
    ) -> Result<Request> {
        self.rma(true, local, local_off, remote, remote_off, len)
    }
}
