//! Active messages on an endpoint: a header and a contiguous payload, or a payload gathered
//! from registered host memory (copied runs and parts sent in place).

use std::os::raw::c_void;
use std::sync::atomic::Ordering;
use std::sync::Arc;

use super::Endpoint;
use crate::call;
use crate::context::Features;
use crate::error::{Result, UcxError};
use crate::mem_type::MemType;
use crate::memory::MemHandle;
use crate::request::{IovPin, Pins, Request};
use crate::sys;
use crate::worker::AM_MAX_MESSAGE;

/// Largest message (bytes) [`Endpoint::am_send_parts`] copies into one buffer rather than
/// sends as UCX IOV: an IOV send never takes UCX's short protocol, which small messages need
/// (docs/benchmarks.md, "Measurements behind the defaults", `AM_GATHER_COPY_MAX`).
pub const AM_GATHER_COPY_MAX: usize = 8 * 1024;

/// Parts at least this long (bytes) of a message above [`AM_GATHER_COPY_MAX`] are sent in
/// place; shorter ones are copied into runs, because UCX's IOV costs per entry while a long
/// part costs less sent in place than copied (docs/benchmarks.md, "Measurements behind the
/// defaults", `AM_IN_PLACE_MIN`).
pub const AM_IN_PLACE_MIN: usize = 16 * 1024;

/// A piece of an [`Endpoint::am_send_parts`] payload: a run of copied bytes (by index) or a
/// part's bytes in place.
enum Seg {
    Copied(usize),
    InPlace(*mut u8, usize),
}

/// One piece of an active message's payload for [`Endpoint::am_send_parts`]: `len` bytes at
/// `offset` in a host memory mapping.
#[derive(Debug, Clone)]
pub struct AmPart {
    /// The registered host memory the bytes are in.
    pub mem: MemHandle,
    /// Offset of the first byte in `mem`, bytes.
    pub offset: usize,
    /// Length, bytes.
    pub len: usize,
}

impl Endpoint {
    /// Sends an active message to `id` on the peer (`ucp_am_send_nbx`, eager protocol, reply
    /// endpoint attached). Header and payload are copied, so the slices may be reused at once.
    ///
    /// Errors: [`UcxError::MessageTooLarge`] beyond [`AM_MAX_MESSAGE`] bytes in all,
    /// [`UcxError::EndpointFailed`], [`UcxError::FeatureMissing`] without AM.
    pub fn am_send(&self, id: u16, header: &[u8], data: &[u8]) -> Result<Request> {
        self.am_check(header.len().saturating_add(data.len()))?;
        self.am_send_contig(id, header.into(), data.into())
    }

    /// What every active message needs: the AM feature, and at most [`AM_MAX_MESSAGE`] bytes.
    fn am_check(&self, total: usize) -> Result<()> {
        self.worker().context().require(Features::AM, "AM")?;
        if total > AM_MAX_MESSAGE {
            return Err(UcxError::MessageTooLarge {
                len: total,
                max: AM_MAX_MESSAGE,
            });
        }
        Ok(())
    }

    /// Posts an active message of one header and one contiguous payload, both checked.
    fn am_send_contig(&self, id: u16, h: Box<[u8]>, d: Box<[u8]>) -> Result<Request> {
        let header = (h.as_ptr(), h.len());
        let (data, len) = (d.as_ptr().cast(), d.len());
        let pins = Pins {
            bytes: vec![h, d],
            ..self.pins()
        };
        // SAFETY: both boxes move into the request's pins; their heap bytes stay where they are.
        unsafe { self.am_post(id, header, data, len, false, pins) }
    }

    /// Posts `ucp_am_send_nbx` (eager, reply endpoint attached) of the header `(ptr, len)` and
    /// `count` payload elements at `data`: bytes, or with `iov`, the entries of that IOV array.
    /// `pins` is what the request keeps alive until it completes.
    ///
    /// # Safety
    /// The header, `data` and what IOV entries point to are held by `pins`.
    unsafe fn am_post(
        &self,
        id: u16,
        header: (*const u8, usize),
        data: *const c_void,
        count: usize,
        iov: bool,
        pins: Pins,
    ) -> Result<Request> {
        self.ensure_ok()?;
        let w = self.worker();
        let _g = w.guard();
        let mut prm: sys::ucp_request_param_t = call::unset();
        prm.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
        prm.flags = sys::UCP_AM_SEND_FLAG_REPLY | sys::UCP_AM_SEND_FLAG_EAGER;
        if iov {
            prm.op_attr_mask |= sys::UCP_OP_ATTR_FIELD_DATATYPE;
            prm.datatype = sys::UCP_DATATYPE_IOV as sys::ucp_datatype_t;
        }
        // SAFETY: live endpoint, serialised; FLAGS and DATATYPE exist since UCX 1.10; what the
        // operation reads is held by `pins` (the caller's contract), which the request keeps
        // until it completes.
        let posted = unsafe {
            call::am_send_nbx(
                w.api(),
                self.inner.raw,
                id,
                header.0.cast(),
                header.1,
                data,
                count,
                &prm,
            )
        };
        self.inner.dirty.store(true, Ordering::Release);
        Request::new(w.clone(), Some(pins), posted)
    }

    /// Sends an active message to `id` whose payload is `head` followed by the bytes of each
    /// of `parts`, from their registered host memory (`ucp_am_send_nbx`, eager protocol,
    /// reply endpoint attached). Parts of at least [`AM_IN_PLACE_MIN`] bytes are read in place
    /// (UCX's IOV datatype: UCX packs them into its send buffers or sends them zero-copy, and
    /// no staging buffer is allocated per message); shorter ones are copied into runs between
    /// them, since UCX's IOV costs per entry. A message of at most [`AM_GATHER_COPY_MAX`] bytes
    /// is copied whole and sent as [`Endpoint::am_send`] sends, which lets UCX take its short
    /// protocol (often finished at post, with no request). The receiver sees one contiguous
    /// payload either way.
    ///
    /// The parts' bytes must not change until the request completes (as a put's source); the
    /// request holds their mappings and `head` until then.
    ///
    /// Errors: [`UcxError::MessageTooLarge`] beyond [`AM_MAX_MESSAGE`] bytes in all,
    /// [`UcxError::LocalOutOfBounds`] for a part outside its mapping,
    /// [`UcxError::InvalidArgument`] for a part in GPU memory or registered with another
    /// context, [`UcxError::EndpointFailed`], [`UcxError::FeatureMissing`] without AM.
    pub fn am_send_parts(&self, id: u16, head: Vec<u8>, parts: &[AmPart]) -> Result<Request> {
        let total = parts
            .iter()
            .fold(head.len(), |t, p| t.saturating_add(p.len));
        self.am_check(total)?;
        let mut checked = Vec::with_capacity(parts.len());
        for p in parts {
            if p.mem.mem_type() != MemType::Host {
                return Err(UcxError::InvalidArgument(format!(
                    "an active message's parts must be host memory, not {}",
                    p.mem.mem_type()
                )));
            }
            self.check_same_context(&p.mem)?;
            checked.push(p.mem.range(p.offset, p.len)?);
        }
        // The payload as runs of copied bytes (the head, small parts) and large parts in place.
        let mut copied: Vec<Vec<u8>> = vec![head];
        let mut segs: Vec<Seg> = vec![Seg::Copied(0)];
        let mut mems: Vec<MemHandle> = Vec::new();
        for (p, addr) in parts.iter().zip(checked) {
            if total > AM_GATHER_COPY_MAX && p.len >= AM_IN_PLACE_MIN {
                segs.push(Seg::InPlace(addr, p.len));
                if !mems
                    .last()
                    .is_some_and(|m| Arc::ptr_eq(&m.inner, &p.mem.inner))
                {
                    mems.push(p.mem.clone());
                }
                continue;
            }
            if !matches!(segs.last(), Some(Seg::Copied(_))) {
                segs.push(Seg::Copied(copied.len()));
                copied.push(Vec::new());
            }
            let run = copied.last_mut().expect("a copied run was just ensured");
            run.reserve(p.len);
            // SAFETY: inside the part's live mapping (checked above); read without forming a
            // reference, as a peer may write the same memory meanwhile (as for a put); `p.len`
            // bytes are reserved past the run's length and initialised by the copy.
            unsafe {
                std::ptr::copy_nonoverlapping(
                    addr as *const u8,
                    run.as_mut_ptr().add(run.len()),
                    p.len,
                );
                run.set_len(run.len() + p.len);
            }
        }
        if segs.len() == 1 {
            let d = copied.pop().expect("the head's run").into_boxed_slice();
            return self.am_send_contig(id, Box::default(), d);
        }
        let copied: Vec<Box<[u8]>> = copied.into_iter().map(Vec::into_boxed_slice).collect();
        let iov: Vec<sys::ucp_dt_iov_t> = segs
            .iter()
            // An empty run (no head) is left out rather than handed over as a dangling pointer.
            .filter(|s| !matches!(**s, Seg::Copied(i) if copied[i].is_empty()))
            .map(|s| match *s {
                Seg::Copied(i) => sys::ucp_dt_iov_t {
                    buffer: copied[i].as_ptr() as *mut c_void,
                    length: copied[i].len(),
                },
                Seg::InPlace(addr, len) => sys::ucp_dt_iov_t {
                    buffer: addr.cast(),
                    length: len,
                },
            })
            .collect();
        let iov = iov.into_boxed_slice();
        let (data, count) = (iov.as_ptr().cast(), iov.len());
        let pins = Pins {
            mems,
            bytes: copied,
            iov: Some(IovPin(iov)),
            ..self.pins()
        };
        // SAFETY: the iov array, the copied runs and every mapping an entry points into
        // (bounds checked above) move into the request's pins.
        unsafe { self.am_post(id, (std::ptr::null(), 0), data, count, true, pins) }
    }
}
