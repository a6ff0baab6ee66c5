//! Non-blocking operation handles: test, wait, and release (`ucp_request_*`).

use std::fmt;
use std::os::raw::c_void;
use std::sync::Arc;
use std::time::Duration;

use crate::call::{self, Posted};
use crate::error::{Result, Status, UcxError};
use crate::memory::MemHandle;
use crate::peer::Peer;
use crate::sys;
use crate::worker::Worker;

/// How long dropping an unfinished request keeps progressing before it gives up and leaks
/// the buffers the operation may still touch (leaking is safe; freeing them would not be).
pub const DROP_WAIT: Duration = Duration::from_secs(30);

/// What an operation's buffers need to stay alive until UCX is done with them.
/// Fields are held, never read: their Drop is what matters.
#[derive(Default)]
#[allow(dead_code)]
pub(crate) struct Pins {
    pub(crate) mem: Option<MemHandle>,
    /// The mappings an IOV send reads from (`Endpoint::am_send_parts`).
    pub(crate) mems: Vec<MemHandle>,
    /// The remote key the operation uses (a `RemoteKey`'s inside), held without its type:
    /// keys belong to endpoints, which sit above requests.
    pub(crate) rkey: Option<Arc<dyn Send + Sync>>,
    pub(crate) bytes: Vec<Box<[u8]>>,
    /// An IOV send's entry array: UCX reads it until the send completes.
    pub(crate) iov: Option<IovPin>,
    pub(crate) ep: Option<EpPin>,
}

/// The endpoint an operation runs on.
pub(crate) struct EpPin {
    /// The endpoint (an `Endpoint`'s inside), held without its type so that it is not closed
    /// under the operation.
    #[allow(dead_code)]
    pub(crate) hold: Arc<dyn Send + Sync>,
    /// Its peer, to name when the operation fails.
    pub(crate) peer: Arc<Peer>,
}

/// An IOV descriptor array held for UCX. Its raw pointers point into mappings the same
/// [`Pins`] hold; Rust never reads them.
pub(crate) struct IovPin(#[allow(dead_code)] pub(crate) Box<[sys::ucp_dt_iov_t]>);

// SAFETY: the array is only allocated and freed here, never dereferenced by Rust; what it
// points to is kept alive by the same Pins.
unsafe impl Send for IovPin {}
// SAFETY: as for Send: Rust never reads the array.
unsafe impl Sync for IovPin {}

/// A posted operation (put, get, flush, active message). Owns what the operation touches
/// (local memory handle, remote key, copied message bytes), so the memory stays valid
/// however the request ends, even if it is leaked.
///
/// Dropping an unfinished request progresses its worker until the operation ends (at most
/// [`DROP_WAIT`]; UCX fails operations of a failed endpoint, which is always requested with
/// peer error handling), then releases it; a flush, which holds no buffer of the caller, is
/// released at once instead (UCX frees it when it ends), so that giving up on a flush that a
/// silent peer never completes costs nothing more.
#[must_use = "an operation completes only when waited on or tested until done"]
pub struct Request {
    worker: Worker,
    /// NULL once finished and released.
    raw: *mut c_void,
    op: &'static str,
    result: Option<Result<()>>,
    pins: Pins,
    /// UCX may read or write the caller's memory until the operation ends (false for a
    /// flush): its drop then waits for the end.
    holds_buffers: bool,
}

// SAFETY: the raw request is only touched under the worker's lock.
unsafe impl Send for Request {}

impl fmt::Debug for Request {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("Request")
            .field("op", &self.op)
            .field("pending", &!self.raw.is_null())
            .finish()
    }
}

impl Request {
    /// Wraps what an `*_nbx` call returned: an error (naming the peer when the endpoint in
    /// `pins` failed), an operation finished at post, or a request to poll. Call with the
    /// worker lock held or not: it does not lock.
    pub(crate) fn new(
        worker: Worker,
        pins: Option<Pins>,
        posted: Result<Posted>,
    ) -> Result<Request> {
        let posted = match posted {
            Ok(p) => p,
            Err(UcxError::Status { op, status }) => {
                // The peer's name only on failure: formatting it costs more than a small put.
                return Err(match pins.as_ref().and_then(|p| p.ep.as_ref()) {
                    Some(ep) if status.is_peer_failure() => ep.peer.failed(status),
                    _ => UcxError::Status { op, status },
                });
            }
            Err(e) => return Err(e),
        };
        Ok(Request {
            worker,
            raw: posted.req,
            op: posted.op,
            result: posted.req.is_null().then_some(Ok(())),
            pins: pins.unwrap_or_default(),
            holds_buffers: true,
        })
    }

    /// Marks a request whose operation touches no memory of the caller's (a flush): its drop
    /// does not wait for it.
    pub(crate) fn bufferless(mut self) -> Request {
        self.holds_buffers = false;
        self
    }

    /// The operation's name (`ucp_put_nbx`, ...).
    pub fn op(&self) -> &'static str {
        self.op
    }

    /// UCX's description of the protocol this pending operation runs
    /// (`ucp_request_query` with `UCP_REQUEST_ATTR_FIELD_INFO_STRING`): under UCX ≥ 1.15's
    /// protocol selection it names the operation, memory types, length, protocol and the
    /// `transport/device` pairs it uses (e.g. `… zero-copy cuda_ipc/cuda`). `None` when the
    /// operation already finished (no request to ask), when the query fails, or when UCX has no
    /// description for it (`<no debug info>`, e.g. RMA under UCX 1.13's older protocols).
    /// [`ProtoInfo::parse`] reads the transports out of it.
    pub fn info(&self) -> Option<String> {
        if self.raw.is_null() {
            return None;
        }
        // UCX writes at most this much (truncating); multi-rail descriptions fit in 1 KiB.
        let mut buf = vec![0u8; 1024];
        let mut attr: sys::ucp_request_attr_t = call::unset();
        attr.field_mask = (sys::UCP_REQUEST_ATTR_FIELD_INFO_STRING
            | sys::UCP_REQUEST_ATTR_FIELD_INFO_STRING_SIZE) as u64;
        attr.debug_string = buf.as_mut_ptr().cast();
        attr.debug_string_size = buf.len();
        let queried = {
            let _g = self.worker.guard();
            // SAFETY: raw is a live (not yet released) request of this worker; INFO_STRING(_SIZE)
            // exist since UCX 1.13; UCX writes at most debug_string_size bytes, NUL-terminated,
            // into buf.
            unsafe { call::request_query(self.worker.api(), self.raw, &mut attr) }
        };
        queried.ok()?;
        let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
        let text = String::from_utf8_lossy(&buf[..end]).trim().to_owned();
        (!text.is_empty() && !text.contains("<no debug info>")).then_some(text)
    }

    /// Checks (without progressing) whether the operation finished; once it has, returns
    /// its result every time. `Ok(false)` while in flight.
    pub fn test(&mut self) -> Result<bool> {
        if let Some(r) = &self.result {
            return r.clone().map(|()| true);
        }
        let st = {
            let _g = self.worker.guard();
            // SAFETY: raw is a live request of this worker, serialised.
            let st = unsafe { call::request_check_status(self.worker.api(), self.raw) };
            if st.0 != sys::UCS_INPROGRESS {
                // SAFETY: finished; released exactly once.
                unsafe { call::request_free(self.worker.api(), self.raw) };
                self.raw = std::ptr::null_mut();
            }
            st
        };
        if st.0 == sys::UCS_INPROGRESS {
            return Ok(false);
        }
        let r = if st.is_ok() {
            Ok(())
        } else {
            Err(self.error(st))
        };
        self.result = Some(r.clone());
        r.map(|()| true)
    }

    fn error(&self, status: Status) -> UcxError {
        match &self.pins.ep {
            Some(ep) if status.is_peer_failure() || ep.peer.failure().is_some() => {
                ep.peer.failed(ep.peer.failure().unwrap_or(status))
            }
            _ => UcxError::Status {
                op: self.op,
                status,
            },
        }
    }

    /// Progresses the worker until the operation finishes, up to `timeout`.
    ///
    /// Errors: the operation's status ([`UcxError::EndpointFailed`] when its endpoint
    /// failed), or [`UcxError::Timeout`] (the request stays owned and is finished on drop).
    pub fn wait(mut self, timeout: Duration) -> Result<()> {
        self.wait_mut(timeout)
    }

    /// As [`Request::wait`], keeping the request (to wait again after a timeout).
    pub fn wait_mut(&mut self, timeout: Duration) -> Result<()> {
        let mut res: Option<Result<bool>> = None;
        self.worker.clone().progress_until(timeout, || {
            let r = self.test();
            let finished = !matches!(r, Ok(false));
            res = Some(r);
            finished
        });
        match res {
            Some(Ok(true)) => Ok(()),
            Some(Err(e)) => Err(e),
            _ => Err(UcxError::Timeout {
                op: self.op,
                timeout,
            }),
        }
    }
}

impl Drop for Request {
    fn drop(&mut self) {
        if self.raw.is_null() {
            return;
        }
        let worker = self.worker.clone();
        if !self.holds_buffers {
            let _g = worker.guard();
            // SAFETY: a live request of this worker, released once; UCX frees it when the
            // operation ends, which reads nothing the pins keep but the endpoint, whose close
            // ends it.
            unsafe { call::request_free(worker.api(), self.raw) };
            self.raw = std::ptr::null_mut();
            return;
        }
        let finished = worker.progress_until(DROP_WAIT, || !matches!(self.test(), Ok(false)));
        if !finished {
            tracing::warn!(
                op = self.op,
                "UCX operation still pending after {DROP_WAIT:?} at drop; leaking its buffers"
            );
            {
                let _g = worker.guard();
                // SAFETY: released once; UCX frees a pending request when it completes.
                unsafe { call::request_free(worker.api(), self.raw) };
            }
            std::mem::forget(std::mem::take(&mut self.pins));
        }
    }
}

/// The transports named in a protocol description of [`Request::info`] (or a line of
/// `UCX_PROTO_INFO`): the `transport/device` tokens UCX prints, such as `cuda_ipc/cuda`,
/// `tcp/lo`, `rc_mlx5/mlx5_0:1`, and whether UCX emulates the operation in software (active
/// messages carrying the data, the remote CPU copying it: `software emulation`).
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct ProtoInfo {
    /// Transport names in order of appearance, without duplicates (`cuda_ipc`, `tcp`, ...).
    pub transports: Vec<String>,
    /// True when the description says the operation is emulated in software.
    pub emulated: bool,
}

/// Transport names of UCX 1.13–1.22 (`ucx_info -d`), used to tell `transport/device` tokens
/// from other words containing a slash.
const TRANSPORTS: &[&str] = &[
    "self",
    "tcp",
    "sysv",
    "posix",
    "cma",
    "knem",
    "xpmem",
    "cuda_ipc",
    "cuda_copy",
    "gdr_copy",
    "rc_mlx5",
    "dc_mlx5",
    "gga_mlx5",
    "ud_mlx5",
    "rc_verbs",
    "ud_verbs",
    "srd",
    "rocm_ipc",
    "rocm_copy",
];

impl ProtoInfo {
    /// Parses a description; transports UCX may add later are ignored.
    pub fn parse(text: &str) -> ProtoInfo {
        let mut transports: Vec<String> = Vec::new();
        for word in text.split(|c: char| c.is_whitespace() || c == ',' || c == '|') {
            let Some((tl, dev)) = word.split_once('/') else {
                continue;
            };
            if dev.is_empty() || !TRANSPORTS.contains(&tl) {
                continue;
            }
            if !transports.iter().any(|t| t == tl) {
                transports.push(tl.to_owned());
            }
        }
        ProtoInfo {
            transports,
            emulated: text.contains("emulation"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::ProtoInfo;

    #[test]
    fn parses_protocol_descriptions_of_ucx_1_22() {
        // Table rows UCX 1.22 printed with UCX_PROTO_INFO=y on the H200 pair (ucx_perftest
        // and gdpath), then constructed forms: a request description and a multi-lane row.
        let ipc = ProtoInfo::parse("| 0..inf | zero-copy   | cuda_ipc/cuda |");
        assert_eq!(ipc.transports, ["cuda_ipc"]);
        assert!(!ipc.emulated);
        let req = ProtoInfo::parse("{proto_send} put* from cuda/GPU0 to cuda/dev[0] length 1073741824 zero-copy cuda_ipc/cuda");
        assert_eq!(req.transports, ["cuda_ipc"]);
        let emu = ProtoInfo::parse("| 0..inf | software emulation | sysv/memory |");
        assert_eq!(emu.transports, ["sysv"]);
        assert!(emu.emulated);
        let multi = ProtoInfo::parse(
            "rendezvous zero-copy read from remote cma/memory, 50% on rc_mlx5/mlx5_0:1 and 50% on rc_mlx5/mlx5_1:1",
        );
        assert_eq!(multi.transports, ["cma", "rc_mlx5"]);
        let none = ProtoInfo::parse("put* from host memory to host, 2/3 done");
        assert!(none.transports.is_empty());
    }
}
