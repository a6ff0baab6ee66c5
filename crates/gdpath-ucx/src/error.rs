//! Typed errors: UCX status codes (`ucs_status_t`) and the crate's own failures.

use std::fmt;
use std::time::Duration;

use crate::mem_type::MemType;
use crate::sys;

/// A UCX status code (`ucs_status_t`, a signed byte: 0 is `UCS_OK`, 1 `UCS_INPROGRESS`,
/// negative values are errors). Names follow `ucs/type/status.h` of UCX 1.13.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct Status(pub i8);

impl Status {
    /// The symbolic name (`UCS_ERR_UNREACHABLE`, ...), or `UCS_ERR_<code>` for codes in the
    /// link/endpoint failure ranges (-40..=-59, -60..=-89) that UCX numbers without naming.
    pub fn name(self) -> String {
        let known = match self.0 {
            sys::UCS_OK => "UCS_OK",
            sys::UCS_INPROGRESS => "UCS_INPROGRESS",
            sys::UCS_ERR_NO_MESSAGE => "UCS_ERR_NO_MESSAGE",
            sys::UCS_ERR_NO_RESOURCE => "UCS_ERR_NO_RESOURCE",
            sys::UCS_ERR_IO_ERROR => "UCS_ERR_IO_ERROR",
            sys::UCS_ERR_NO_MEMORY => "UCS_ERR_NO_MEMORY",
            sys::UCS_ERR_INVALID_PARAM => "UCS_ERR_INVALID_PARAM",
            sys::UCS_ERR_UNREACHABLE => "UCS_ERR_UNREACHABLE",
            sys::UCS_ERR_INVALID_ADDR => "UCS_ERR_INVALID_ADDR",
            sys::UCS_ERR_NOT_IMPLEMENTED => "UCS_ERR_NOT_IMPLEMENTED",
            sys::UCS_ERR_MESSAGE_TRUNCATED => "UCS_ERR_MESSAGE_TRUNCATED",
            sys::UCS_ERR_NO_PROGRESS => "UCS_ERR_NO_PROGRESS",
            sys::UCS_ERR_BUFFER_TOO_SMALL => "UCS_ERR_BUFFER_TOO_SMALL",
            sys::UCS_ERR_NO_ELEM => "UCS_ERR_NO_ELEM",
            sys::UCS_ERR_SOME_CONNECTS_FAILED => "UCS_ERR_SOME_CONNECTS_FAILED",
            sys::UCS_ERR_NO_DEVICE => "UCS_ERR_NO_DEVICE",
            sys::UCS_ERR_BUSY => "UCS_ERR_BUSY",
            sys::UCS_ERR_CANCELED => "UCS_ERR_CANCELED",
            sys::UCS_ERR_SHMEM_SEGMENT => "UCS_ERR_SHMEM_SEGMENT",
            sys::UCS_ERR_ALREADY_EXISTS => "UCS_ERR_ALREADY_EXISTS",
            sys::UCS_ERR_OUT_OF_RANGE => "UCS_ERR_OUT_OF_RANGE",
            sys::UCS_ERR_TIMED_OUT => "UCS_ERR_TIMED_OUT",
            sys::UCS_ERR_EXCEEDS_LIMIT => "UCS_ERR_EXCEEDS_LIMIT",
            sys::UCS_ERR_UNSUPPORTED => "UCS_ERR_UNSUPPORTED",
            sys::UCS_ERR_REJECTED => "UCS_ERR_REJECTED",
            sys::UCS_ERR_NOT_CONNECTED => "UCS_ERR_NOT_CONNECTED",
            sys::UCS_ERR_CONNECTION_RESET => "UCS_ERR_CONNECTION_RESET",
            sys::UCS_ERR_ENDPOINT_TIMEOUT => "UCS_ERR_ENDPOINT_TIMEOUT",
            _ => "",
        };
        if known.is_empty() {
            format!("UCS_ERR_{}", self.0)
        } else {
            known.to_string()
        }
    }

    /// True for `UCS_OK`.
    pub fn is_ok(self) -> bool {
        self.0 == sys::UCS_OK
    }

    /// True when the code means the connection to the peer is gone (unreachable, reset, not
    /// connected, endpoint timeout, or any code in UCX's link/endpoint failure ranges).
    pub fn is_peer_failure(self) -> bool {
        matches!(
            self.0,
            sys::UCS_ERR_UNREACHABLE
                | sys::UCS_ERR_CONNECTION_RESET
                | sys::UCS_ERR_NOT_CONNECTED
                | sys::UCS_ERR_REJECTED
                | sys::UCS_ERR_ENDPOINT_TIMEOUT
                | sys::UCS_ERR_IO_ERROR
        ) || (sys::UCS_ERR_LAST_ENDPOINT_FAILURE..=sys::UCS_ERR_FIRST_LINK_FAILURE)
            .contains(&self.0)
    }
}

impl fmt::Display for Status {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} ({})", self.name(), self.0)
    }
}

/// Everything that can go wrong in this crate.
#[derive(Debug, Clone, thiserror::Error)]
pub enum UcxError {
    /// libucp could not be opened (`dlopen` failed).
    #[error("cannot load {library}: {reason}; install the Debian/Ubuntu package `libucx0` (UCX without CUDA) or the PyPI wheel `libucx-cu13` (UCX built with CUDA; set GDPATH_UCX_LIB to its libucx/lib/libucp.so.0)")]
    LibraryMissing {
        /// The name or path passed to `dlopen`.
        library: String,
        /// The loader's message.
        reason: String,
    },
    /// The library opened but lacks a function gdpath needs.
    #[error("{library} lacks the symbol {symbol}; gdpath needs UCX >= 1.13")]
    SymbolMissing {
        /// The library that was opened.
        library: String,
        /// The missing function.
        symbol: &'static str,
    },
    /// The library is older than the supported ABI floor (UCX 1.13).
    #[error("{library} is UCX {found}; gdpath needs UCX 1.x with x >= 13")]
    VersionTooOld {
        /// The library that was opened.
        library: String,
        /// Its version as `ucp_get_version` reports it.
        found: String,
    },
    /// A different libucp is already loaded in this process; two UCX builds cannot coexist.
    #[error("{loaded} is already loaded in this process; cannot also load {requested}")]
    AlreadyLoaded {
        /// The library loaded first.
        loaded: String,
        /// The one asked for now.
        requested: String,
    },
    /// A UCX call returned an error status.
    #[error("{op} failed: {status}")]
    Status {
        /// The UCX function or operation.
        op: &'static str,
        /// What it returned.
        status: Status,
    },
    /// An endpoint's error callback reported a failure (peer gone, connection refused, ...);
    /// every later operation on it fails with this error.
    #[error("endpoint to {peer} failed: {status}")]
    EndpointFailed {
        /// The peer address as known (`?` for endpoints made from a worker address).
        peer: String,
        /// The status UCX passed to the error callback.
        status: Status,
    },
    /// An operation did not complete within its time bound.
    #[error("{op} did not complete within {timeout:?}")]
    Timeout {
        /// The operation.
        op: &'static str,
        /// The bound.
        timeout: Duration,
    },
    /// A remote access (offset, length) falls outside the remote region.
    #[error("remote access out of bounds: offset {offset} + length {len} exceeds region length {region_len} bytes")]
    RemoteOutOfBounds {
        /// Offset into the remote region, bytes.
        offset: u64,
        /// Access length, bytes.
        len: u64,
        /// The region's length, bytes.
        region_len: u64,
    },
    /// A local access (offset, length) falls outside the local memory handle.
    #[error("local access out of bounds: offset {offset} + length {len} exceeds mapped length {region_len} bytes")]
    LocalOutOfBounds {
        /// Offset into the local region, bytes.
        offset: usize,
        /// Access length, bytes.
        len: usize,
        /// The mapped length, bytes.
        region_len: usize,
    },
    /// The memory is not host memory, so the CPU cannot read or write it directly.
    #[error("memory of type {0} cannot be accessed by the CPU through this handle")]
    NotHostMemory(MemType),
    /// This UCX build cannot map or move memory of the given type.
    #[error("this UCX build does not support {0} memory (supported: {1})")]
    MemTypeUnsupported(MemType, String),
    /// UCX's detection found another memory type than the caller declared.
    #[error("memory declared as {expected} was detected by UCX as {detected}")]
    MemTypeMismatch {
        /// The type the caller passed.
        expected: MemType,
        /// What `ucp_mem_query` reported.
        detected: String,
    },
    /// A message exceeds the bound this crate accepts.
    #[error("message of {len} bytes exceeds the limit of {max} bytes")]
    MessageTooLarge {
        /// Its length, bytes.
        len: usize,
        /// The bound, bytes.
        max: usize,
    },
    /// The context was created without a feature the call needs.
    #[error("the UCX context lacks feature {0}; add it to UcxCfg::features")]
    FeatureMissing(&'static str),
    /// A caller-supplied argument is invalid.
    #[error("invalid argument: {0}")]
    InvalidArgument(String),
    /// A system call around UCX failed (memstream, poll).
    #[error("{op}: {source}")]
    Os {
        /// What was attempted.
        op: &'static str,
        /// The OS error (shared: the error is `Clone`).
        #[source]
        source: std::sync::Arc<std::io::Error>,
    },
}

/// Result alias of this crate.
pub type Result<T> = std::result::Result<T, UcxError>;

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn status_names_and_classes() {
        assert_eq!(
            Status(sys::UCS_ERR_UNREACHABLE).name(),
            "UCS_ERR_UNREACHABLE"
        );
        assert_eq!(Status(-45).name(), "UCS_ERR_-45");
        assert!(Status(sys::UCS_ERR_CONNECTION_RESET).is_peer_failure());
        assert!(Status(-70).is_peer_failure());
        assert!(!Status(sys::UCS_ERR_INVALID_PARAM).is_peer_failure());
        assert!(Status(0).is_ok());
    }
}
