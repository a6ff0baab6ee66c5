//! The engine's typed errors.
//!
//! Every error names what was wrong (the descriptor index, the region, the file and offset) so a
//! caller can act on it without parsing text. Errors are `Clone` (I/O errors are shared through an
//! `Arc`) because one failure is reported both for its descriptor pair and for the transfer.

use crate::finding::FindingId;
use crate::memory_kind::MemoryKind;
use crate::net::DevicesError;
use crate::path::{DataPath, UnknownPath};
use crate::region_id::RegionId;
use gdpath_wire::codec::{DecodeError, EncodeError};
use std::fmt;
use std::path::PathBuf;
use std::sync::Arc;

/// Which side of a descriptor pair an error is about.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum Side {
    /// The local descriptor (the memory being read into or written from).
    Local,
    /// The target descriptor (the file, remote region or other memory being read or written).
    Target,
}

impl fmt::Display for Side {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Side::Local => "local",
            Side::Target => "target",
        })
    }
}

/// An engine error. Variants are stable; new ones may be added.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum Error {
    /// A descriptor reaches past its region: `offset + len > region_len` (bytes).
    #[error(
        "descriptor {index} ({side}): range {offset}+{len} is outside region {region} of {region_len} bytes"
    )]
    OutOfBounds {
        /// Position of the descriptor in its list (0-based).
        index: usize,
        /// Which list the descriptor is in.
        side: Side,
        /// The region the descriptor names.
        region: RegionId,
        /// Where the descriptor starts in the region (bytes).
        offset: u64,
        /// The descriptor's length (bytes).
        len: u64,
        /// The region's length (bytes).
        region_len: u64,
    },
    /// The local and target descriptor lists have different lengths.
    #[error("descriptor lists differ in length: {local} local, {target} target")]
    ListLengthMismatch {
        /// Number of local descriptors.
        local: usize,
        /// Number of target descriptors.
        target: usize,
    },
    /// A descriptor pair has two different lengths (bytes), so the totals differ too.
    #[error("descriptor pair {index}: local length {local} bytes != target length {target} bytes")]
    PairLengthMismatch {
        /// Position of the pair in the lists (0-based).
        index: usize,
        /// The local descriptor's length (bytes).
        local: u64,
        /// The target descriptor's length (bytes).
        target: u64,
    },
    /// The region was registered with another [`crate::Agent`].
    #[error("region {region} is not registered with this agent")]
    ForeignRegion {
        /// The region's id, unknown to this agent.
        region: RegionId,
    },
    /// The region was deregistered with [`crate::Agent::deregister`].
    #[error("region {region} was deregistered")]
    Deregistered {
        /// The deregistered region's id.
        region: RegionId,
    },
    /// The region is in use: transfers in flight (when deregistering or taking its memory back), or
    /// a host view held (when posting).
    #[error("region {region} is busy: {reason}")]
    RegionBusy {
        /// The busy region's id.
        region: RegionId,
        /// What holds it (transfers in flight, a host view).
        reason: String,
    },
    /// The file ends before the requested range: `available` bytes exist from `offset`.
    #[error("short file {}: {wanted} bytes wanted at offset {offset}, only {available} there", gdpath_topo::text::escape(.path))]
    ShortFile {
        /// The file read.
        path: PathBuf,
        /// Where the read starts in the file (bytes).
        offset: u64,
        /// Bytes the read asked for from `offset`.
        wanted: u64,
        /// Bytes the file holds from `offset` (less than `wanted`).
        available: u64,
    },
    /// The file system refused an O_DIRECT request that the engine could not realign.
    #[error(
        "O_DIRECT refused for {}: {len} bytes at offset {offset} (alignment {align} bytes)",
        gdpath_topo::text::escape(.path)
    )]
    Misaligned {
        /// The file opened with `O_DIRECT`.
        path: PathBuf,
        /// Where the request starts in the file (bytes).
        offset: u64,
        /// The request's length (bytes).
        len: u64,
        /// The alignment the file system asks of offset, length and buffer address (bytes).
        align: u64,
    },
    /// An I/O call failed. `op` is the call (`read`, `write`, `fstat`, ...).
    #[error("{}", file_text(self))]
    Io {
        /// The system call that failed (`read`, `write`, `fstat`, ...).
        op: &'static str,
        /// The file it was made on.
        path: PathBuf,
        /// Where in the file the call was made (bytes; 0 where the call takes none).
        offset: u64,
        /// The OS error, shared so that the error stays `Clone`.
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The file could not be opened.
    #[error("{}", file_text(self))]
    Open {
        /// The file that could not be opened.
        path: PathBuf,
        /// The OS error (`ENOENT`, `EACCES`, ...).
        #[source]
        source: Arc<std::io::Error>,
    },
    /// No file could be created in the directory (a file written whole is made there first):
    /// permission, a read-only file system, a missing directory. Kind `open`, as [`Error::Open`].
    #[error("{}", file_text(self))]
    CreateIn {
        /// The directory no file could be created in.
        dir: PathBuf,
        /// The OS error (`EACCES`, `EROFS`, `ENOENT`, ...).
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The path names something that is not a regular file (`what`: "a directory", ...).
    #[error("{}", file_text(self))]
    NotAFile {
        /// The path named.
        path: PathBuf,
        /// What it is instead ("a directory", "a socket", ...).
        what: &'static str,
    },
    /// A write was asked to follow a symbolic link that the kernel's `fs.protected_symlinks`
    /// rule forbids following, whatever the sysctl says
    /// ([`gdpath_file::Error::SymlinkRefused`] says when). Nothing was written. Python raises
    /// it as a `PermissionError` (`EACCES`, what `open(2)` returns when the kernel applies the
    /// rule).
    #[error("{}", file_text(self))]
    SymlinkRefused {
        /// The symbolic link not followed.
        link: PathBuf,
        /// The link's owner (a uid).
        owner: u32,
        /// The sticky, world-writable directory holding the link.
        dir: PathBuf,
    },
    /// A write with `overwrite` would replace another user's file in a sticky directory: the
    /// kernel's `fs.protected_regular=2` rule, applied whatever the sysctl says
    /// ([`gdpath_file::Error::ForeignFileRefused`] says when). Nothing was written. Python
    /// raises it as a `PermissionError` (`EACCES`, what `open(2)` returns when the kernel
    /// applies the rule).
    #[error("{}", file_text(self))]
    ForeignFileRefused {
        /// The file not written.
        path: PathBuf,
        /// The file's owner (a uid).
        owner: u32,
        /// The sticky, world- or group-writable directory holding the file.
        dir: PathBuf,
    },
    /// The path written goes through `link`, a magic link of `/proc` (`/dev/stdout` is one,
    /// through `/proc/self/fd/1`), which a file written whole cannot go into
    /// ([`gdpath_file::Error::MagicLinkRefused`]). Nothing was written.
    #[error("{}", file_text(self))]
    MagicLinkRefused {
        /// The path asked to be written.
        path: PathBuf,
        /// The `/proc` magic link on the way to it.
        link: PathBuf,
    },
    /// The file system holding `path` is full (`ENOSPC`, or `EDQUOT`: a quota is): `needed`
    /// bytes were to be written (when known in advance), `written` bytes were when it filled
    /// up. Written through [`crate::file::AtomicFile`], `path` is the target, which is as it
    /// was.
    #[error("{}", file_text(self))]
    NoSpace {
        /// The file being written (the target, for a file written whole).
        path: PathBuf,
        /// Bytes the write was to put there, when known in advance.
        needed: Option<u64>,
        /// Bytes written when the file system filled up.
        written: u64,
        /// The OS error (`ENOSPC` or `EDQUOT`).
        #[source]
        source: Arc<std::io::Error>,
    },
    /// The file exists and replacing it was not asked for
    /// ([`crate::file::ReplaceOptions::overwrite`], the commands' `--overwrite`).
    /// The message names no option: the CLI adds "--overwrite", Python `overwrite=True`.
    #[error("{}", file_text(self))]
    Exists {
        /// The existing file.
        path: PathBuf,
    },
    /// A write was requested into a file region registered read-only.
    /// The message names no API: Rust's is `FileAccess::ReadWrite`, Python's `mode="r+"`.
    #[error("{} was registered read-only", gdpath_topo::text::escape(.path))]
    ReadOnly {
        /// The file registered read-only.
        path: PathBuf,
    },
    /// Memory registered read-only (a read-only Python buffer, [`crate::HostPointer::new`] with
    /// `writable: false`, [`crate::GpuPointer::read_only`]) would be written: as a read's local
    /// descriptor, a write's target, through a host view, or by peers it is exported to (a UCX
    /// remote key lets them write). `detail` says which.
    #[error("region {region} is read-only memory: {detail}")]
    ReadOnlyMemory {
        /// The read-only region's id.
        region: RegionId,
        /// How it would have been written (local descriptor of a read, host view, export).
        detail: String,
    },
    /// The memory kind or operation needs a backend this build or machine does not have.
    #[error("{what} is not available: it needs the {backend} backend")]
    Unsupported {
        /// The memory kind or operation asked for.
        what: String,
        /// The backend it needs (`cuda`, `ucx`, `posix-direct`, ...).
        backend: &'static str,
    },
    /// No backend serves this pair of memory kinds for this operation.
    #[error("descriptor pair {index}: no backend moves data between {local} and {target}")]
    NoPath {
        /// Position of the pair in the lists (0-based).
        index: usize,
        /// The local descriptor's memory kind.
        local: MemoryKind,
        /// The target descriptor's memory kind.
        target: MemoryKind,
    },
    /// Every backend that serves the pair's memory kinds refused it (often there is one, such
    /// as the network backend for a peer that failed); `finding` says why.
    #[error(
        "descriptor pair {index} refused{}: {detail}",
        finding.as_ref().map(|f| format!(" [{f}]")).unwrap_or_default()
    )]
    Refused {
        /// Position of the pair in the lists (0-based).
        index: usize,
        /// The doctor finding that explains the refusal, when one does.
        finding: Option<FindingId>,
        /// The last backend's reason.
        detail: String,
    },
    /// Strict mode: no backend could serve the pair on an accepted path. Nothing was moved.
    /// `planned` is the path the planner would have used; `finding` says why the accepted one was
    /// not possible.
    #[error(
        "descriptor pair {index}: none of the accepted paths {} is possible{}{}: {detail}",
        path_list(accepted),
        planned.as_ref().map(|p| format!(" (would use {p})")).unwrap_or_default(),
        finding.as_ref().map(|f| format!(" [{f}]")).unwrap_or_default()
    )]
    PathNotAccepted {
        /// Position of the pair in the lists (0-based).
        index: usize,
        /// The paths the request accepts; empty means the preferred path only.
        accepted: Vec<DataPath>,
        /// The path the planner would have used, when it found one.
        planned: Option<DataPath>,
        /// The doctor finding that explains why no accepted path is possible, when one does.
        finding: Option<FindingId>,
        /// Why the accepted paths were not possible.
        detail: String,
    },
    /// The request's deadline passed before this work was done.
    #[error("deadline exceeded")]
    DeadlineExceeded,
    /// The transfer was cancelled before this work was done.
    #[error("cancelled")]
    Cancelled,
    /// An invalid configuration value.
    #[error("{}", file_text(self))]
    Config(String),
    /// The connection to a peer agent failed or was lost (killed, unreachable, reset, or no
    /// completion within the network operation bound). `peer` is the peer's label
    /// (`name@address`) or its address.
    #[error("peer {peer}: {detail}")]
    PeerFailed {
        /// The peer's label (`name@address`) or its address.
        peer: String,
        /// What failed (closed, reset, timed out, ...).
        detail: String,
    },
    /// Authentication with a peer failed: wrong or missing token on either side, or the peer
    /// refused the connection (`detail` says why).
    #[error("authentication with {peer} failed: {detail}")]
    AuthFailed {
        /// The peer's label (`name@address`) or its address.
        peer: String,
        /// Why authentication failed.
        detail: String,
    },
    /// A peer broke the agent protocol: malformed, oversized, unknown-version or unexpected
    /// message. Nothing it sent was used. `source`: the decoder's refusal, for a malformed
    /// message.
    #[error(
        "protocol error from {peer}: {detail}{}",
        source.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
    )]
    Protocol {
        /// The peer's label (`name@address`) or its address.
        peer: String,
        /// What was wrong with the message.
        detail: String,
        /// The decoder's refusal, for a malformed message.
        #[source]
        source: Option<DecodeError>,
    },
    /// A message to a peer could not be encoded: a value of this agent's (a notification, a
    /// name, the regions it exports) is over a limit of the agent protocol
    /// ([`EncodeError`] says which and the limit). Nothing was sent.
    #[error("{0}")]
    ProtocolLimit(#[source] EncodeError),
    /// The network devices UCX may use could not be chosen for a serve or connect, or do not
    /// cover it ([`crate::net::NetConfig::devices`] names them outright).
    #[error("UCX network devices: {0}")]
    NetDevices(#[source] Box<DevicesError>),
    /// A UCX call failed outside any one descriptor pair (context, worker, listener, mapping).
    #[error("UCX {op}: {source}")]
    Ucx {
        /// The UCX call or stage that failed (`ucp_mem_map`, `ucp_rkey_pack`, `context`, ...).
        op: &'static str,
        /// UCX's status and its text.
        #[source]
        source: gdpath_ucx::UcxError,
    },
    /// A backend's bounce-buffer pool could not serve a request: `wanted` bytes of buffers were
    /// needed, more than the `budget` (bytes) allows at once, or the rest of the budget stayed in
    /// use for as long as the backend waits. `pool` names the backend's pool.
    #[error(
        "{pool} bounce buffers exhausted: {wanted} bytes wanted, the budget is {budget} bytes"
    )]
    BounceExhausted {
        /// The backend's pool.
        pool: &'static str,
        /// Bounce-buffer bytes the request needed.
        wanted: u64,
        /// The pool's budget: the most bytes of buffers it holds at once.
        budget: u64,
    },
    /// A CUDA driver, NVML or cuFile call failed in `backend` while doing `what` (e.g.
    /// "HostToDevice { pinned: false } of 4096 bytes", "pinned staging buffer"); `source` is
    /// the driver layer's error with its call, code and text (cuFile errors are
    /// [`gdpath_cuda::CudaError::CuFile`] / `CuFileIo`).
    #[error("backend {backend}: {what}: {source}")]
    Cuda {
        /// The backend that made the call (`cuda`, `ucx`, ...).
        backend: &'static str,
        /// What it was doing: the copy and its size, or the resource being made.
        what: String,
        /// The driver layer's error: its call, code and text.
        #[source]
        source: gdpath_cuda::CudaError,
    },
    /// A block transfer's layouts or ids are wrong ([`crate::blocks::BlockError`] names the
    /// side, the position and the block). Nothing was moved.
    #[error("block transfer: {0}")]
    Blocks(#[source] crate::blocks::BlockError),
    /// A backend failed outside any one descriptor (e.g. io_uring setup).
    #[error("backend {backend}: {detail}")]
    Backend {
        /// The backend that failed.
        backend: &'static str,
        /// What failed.
        detail: String,
    },
}

/// The text of a variant this error shares with [`gdpath_file::Error`]: that error's, so that it
/// is written once; empty for no other (none asks for it).
fn file_text(e: &Error) -> String {
    use gdpath_file::FileError;
    e.clone()
        .into_file_error()
        .map(|f| f.to_string())
        .unwrap_or_default()
}

fn path_list(paths: &[DataPath]) -> String {
    if paths.is_empty() {
        // `TransferRequest::preferred_only`.
        return "[the preferred path]".into();
    }
    let names: Vec<String> = paths.iter().map(DataPath::name).collect();
    format!("[{}]", names.join(", "))
}

impl Error {
    /// The error's kind: its variant's name in snake_case (`out_of_bounds`, `open`, `config`,
    /// `peer_failed`, ...), except [`Error::Cuda`], whose kind is `backend` (CUDA failures were
    /// `Error::Backend` before they kept their typed source). A contract: scripts match on it (`gdpath --json` prints it as the
    /// `kind` of its `gdpath.error/1` document), so a kind never changes once released, a
    /// renamed variant keeps its old kind, and a new variant gets a new one here (the match is
    /// exhaustive so that it must be named).
    pub fn kind(&self) -> &'static str {
        match self {
            Error::OutOfBounds { .. } => "out_of_bounds",
            Error::ListLengthMismatch { .. } => "list_length_mismatch",
            Error::PairLengthMismatch { .. } => "pair_length_mismatch",
            Error::ForeignRegion { .. } => "foreign_region",
            Error::Deregistered { .. } => "deregistered",
            Error::RegionBusy { .. } => "region_busy",
            Error::ShortFile { .. } => "short_file",
            Error::Misaligned { .. } => "misaligned",
            Error::Io { .. } => "io",
            Error::Open { .. } | Error::CreateIn { .. } => "open",
            Error::NotAFile { .. } => "not_a_file",
            Error::SymlinkRefused { .. } => "symlink_refused",
            Error::ForeignFileRefused { .. } => "foreign_file_refused",
            Error::MagicLinkRefused { .. } => "magic_link_refused",
            Error::NoSpace { .. } => "no_space",
            Error::Exists { .. } => "exists",
            Error::ReadOnly { .. } => "read_only",
            Error::ReadOnlyMemory { .. } => "read_only_memory",
            Error::Unsupported { .. } => "unsupported",
            Error::NoPath { .. } => "no_path",
            Error::Refused { .. } => "refused",
            Error::PathNotAccepted { .. } => "path_not_accepted",
            Error::DeadlineExceeded => "deadline_exceeded",
            Error::Cancelled => "cancelled",
            Error::Config(_) => "config",
            Error::PeerFailed { .. } => "peer_failed",
            Error::AuthFailed { .. } => "auth_failed",
            Error::Protocol { .. } => "protocol",
            Error::ProtocolLimit(_) => "protocol_limit",
            Error::NetDevices(_) => "net_devices",
            Error::Ucx { .. } => "ucx",
            // A CUDA failure was an `Error::Backend` before it kept its typed source: scripts
            // that match on the kind keep seeing `backend`.
            Error::Backend { .. } | Error::Cuda { .. } => "backend",
            Error::BounceExhausted { .. } => "bounce_exhausted",
            Error::Blocks(_) => "blocks",
        }
    }

    /// An [`Error::Io`] from an OS error number.
    pub fn io(op: &'static str, path: &std::path::Path, offset: u64, e: std::io::Error) -> Self {
        Error::Io {
            op,
            path: path.to_owned(),
            offset,
            source: Arc::new(e),
        }
    }
}

impl From<EncodeError> for Error {
    fn from(e: EncodeError) -> Self {
        Error::ProtocolLimit(e)
    }
}

/// The protocol's errors are the engine's variants of the same names, text and kind.
impl From<gdpath_wire::Error> for Error {
    fn from(e: gdpath_wire::Error) -> Self {
        use gdpath_wire::Error as W;
        match e {
            W::Config(detail) => Error::Config(detail),
            W::PeerFailed { peer, detail } => Error::PeerFailed { peer, detail },
            W::AuthFailed { peer, detail } => Error::AuthFailed { peer, detail },
            W::Protocol {
                peer,
                detail,
                source,
            } => Error::Protocol {
                peer,
                detail,
                source,
            },
        }
    }
}

/// The file crate's errors are the engine's variants of the same names, fields, text and kind.
impl From<gdpath_file::Error> for Error {
    fn from(e: gdpath_file::Error) -> Self {
        use gdpath_file::Error as F;
        match e {
            F::Io {
                op,
                path,
                offset,
                source,
            } => Error::Io {
                op,
                path,
                offset,
                source,
            },
            F::Open { path, source } => Error::Open { path, source },
            F::CreateIn { dir, source } => Error::CreateIn { dir, source },
            F::NotAFile { path, what } => Error::NotAFile { path, what },
            F::SymlinkRefused { link, owner, dir } => Error::SymlinkRefused { link, owner, dir },
            F::ForeignFileRefused { path, owner, dir } => {
                Error::ForeignFileRefused { path, owner, dir }
            }
            F::MagicLinkRefused { path, link } => Error::MagicLinkRefused { path, link },
            F::NoSpace {
                path,
                needed,
                written,
                source,
            } => Error::NoSpace {
                path,
                needed,
                written,
                source,
            },
            F::Exists { path } => Error::Exists { path },
            F::Config(detail) => Error::Config(detail),
        }
    }
}

/// The engine's variants that the file crate has too go back to it: for
/// [`gdpath_file::AtomicFile::explain`] and for their text.
impl gdpath_file::FileError for Error {
    fn into_file_error(self) -> std::result::Result<gdpath_file::Error, Self> {
        use gdpath_file::Error as F;
        Ok(match self {
            Error::Io {
                op,
                path,
                offset,
                source,
            } => F::Io {
                op,
                path,
                offset,
                source,
            },
            Error::Open { path, source } => F::Open { path, source },
            Error::CreateIn { dir, source } => F::CreateIn { dir, source },
            Error::NotAFile { path, what } => F::NotAFile { path, what },
            Error::SymlinkRefused { link, owner, dir } => F::SymlinkRefused { link, owner, dir },
            Error::ForeignFileRefused { path, owner, dir } => {
                F::ForeignFileRefused { path, owner, dir }
            }
            Error::MagicLinkRefused { path, link } => F::MagicLinkRefused { path, link },
            Error::NoSpace {
                path,
                needed,
                written,
                source,
            } => F::NoSpace {
                path,
                needed,
                written,
                source,
            },
            Error::Exists { path } => F::Exists { path },
            Error::Config(detail) => F::Config(detail),
            other => return Err(other),
        })
    }
}

impl From<DevicesError> for Error {
    fn from(e: DevicesError) -> Self {
        Error::NetDevices(Box::new(e))
    }
}

/// An unknown path name ([`DataPath`]'s `FromStr`) is a configuration error.
impl From<UnknownPath> for Error {
    fn from(e: UnknownPath) -> Self {
        Error::Config(e.0)
    }
}

/// The engine's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;

#[cfg(test)]
mod tests {
    use super::*;

    /// `Debug`'s variant name in snake_case: `PeerFailed { .. }` → `peer_failed`.
    fn snake_case_variant(e: &Error) -> String {
        snake_case_variant_of(&format!("{e:?}"))
    }

    /// The variant name that starts `debug`, in snake_case.
    fn snake_case_variant_of(debug: &str) -> String {
        let mut out = String::new();
        for c in debug.chars().take_while(char::is_ascii_alphanumeric) {
            if c.is_ascii_uppercase() && !out.is_empty() {
                out.push('_');
            }
            out.push(c.to_ascii_lowercase());
        }
        out
    }

    #[test]
    fn a_kind_is_the_variant_name_in_snake_case() {
        let io = std::io::Error::from(std::io::ErrorKind::NotFound);
        let cases = [
            Error::PeerFailed {
                peer: "a".into(),
                detail: "b".into(),
            },
            Error::Config("x".into()),
            Error::DeadlineExceeded,
            Error::Cancelled,
            Error::io("read", std::path::Path::new("/x"), 0, io),
            Error::ListLengthMismatch {
                local: 1,
                target: 2,
            },
            Error::Unsupported {
                what: "w".into(),
                backend: "b",
            },
            Error::ReadOnlyMemory {
                region: RegionId(1),
                detail: "d".into(),
            },
            Error::NoSpace {
                path: "/x".into(),
                needed: None,
                written: 0,
                source: Arc::new(std::io::Error::from_raw_os_error(libc::ENOSPC)),
            },
            Error::Exists { path: "/x".into() },
            Error::SymlinkRefused {
                link: "/s/l".into(),
                owner: 65534,
                dir: "/s".into(),
            },
            Error::ForeignFileRefused {
                path: "/s/f".into(),
                owner: 65534,
                dir: "/s".into(),
            },
            Error::MagicLinkRefused {
                path: "/dev/stdout".into(),
                link: "/proc/1/fd/1".into(),
            },
            Error::ProtocolLimit(EncodeError {
                what: "notification",
                len: 70_000,
                max: 65_536,
            }),
        ];
        for e in cases {
            assert_eq!(e.kind(), snake_case_variant(&e), "{e:?}");
        }
        assert_eq!(Error::Config("x".into()).kind(), "config");
    }

    /// An unknown path name is a configuration error with the parser's text.
    #[test]
    fn an_unknown_path_is_a_config_error() {
        let e = Error::from("posix".parse::<DataPath>().unwrap_err());
        assert_eq!(e.kind(), "config");
        assert!(
            e.to_string()
                .starts_with("invalid configuration: unknown path \"posix\": one of"),
            "{e}"
        );
    }

    /// A protocol error becomes the engine's variant of the same name: same kind (the wire
    /// variant's name in snake_case), same text, the decoder's refusal kept as its source.
    #[test]
    fn a_protocol_error_keeps_its_kind_and_text() {
        use gdpath_wire::Error as W;
        let cases = [
            W::Config("token of 5 bytes is too short".into()),
            W::PeerFailed {
                peer: "a@b".into(),
                detail: "the peer closed the connection".into(),
            },
            W::AuthFailed {
                peer: "a@b".into(),
                detail: "wrong or missing token".into(),
            },
            W::Protocol {
                peer: "a@b".into(),
                detail: "malformed message".into(),
                source: Some(DecodeError::Trailing(3)),
            },
        ];
        use std::error::Error as _;
        for w in cases {
            let (kind, text) = (snake_case_variant_of(&format!("{w:?}")), w.to_string());
            let source = w.source().map(|s| s.to_string());
            let e = Error::from(w);
            assert_eq!(e.kind(), kind, "{e:?}");
            assert_eq!(
                (e.to_string(), e.source().map(|s| s.to_string())),
                (text, source)
            );
        }
    }

    /// A file crate's error becomes the engine's variant of the same name, and back: same
    /// kind (the variant's name in snake_case), same text, same source.
    #[test]
    fn a_file_error_keeps_its_kind_and_text() {
        use gdpath_file::{Error as F, FileError};
        use std::error::Error as _;
        let enospc = || Arc::new(std::io::Error::from_raw_os_error(libc::ENOSPC));
        let cases = [
            F::io(
                "write",
                std::path::Path::new("/x"),
                4096,
                std::io::Error::other("e"),
            ),
            F::Open {
                path: "/x".into(),
                source: enospc(),
            },
            F::NotAFile {
                path: "/dev/null".into(),
                what: "a character device",
            },
            F::SymlinkRefused {
                link: "/s/l".into(),
                owner: 65534,
                dir: "/s".into(),
            },
            F::ForeignFileRefused {
                path: "/s/f".into(),
                owner: 65534,
                dir: "/s".into(),
            },
            F::MagicLinkRefused {
                path: "/dev/stdout".into(),
                link: "/proc/1/fd/1".into(),
            },
            F::NoSpace {
                path: "/x".into(),
                needed: Some(1 << 20),
                written: 512,
                source: enospc(),
            },
            F::Exists { path: "/x".into() },
            F::Config("x".into()),
        ];
        for f in cases {
            let (kind, text) = (snake_case_variant_of(&format!("{f:?}")), f.to_string());
            let source = f.source().map(|s| s.to_string());
            let e = Error::from(f);
            assert_eq!(e.kind(), kind, "{e:?}");
            assert_eq!(
                (e.to_string(), e.source().map(|s| s.to_string())),
                (text.clone(), source)
            );
            assert_eq!(e.into_file_error().map(|f| f.to_string()).ok(), Some(text));
        }
        let e = Error::CreateIn {
            dir: "/d".into(),
            source: enospc(),
        };
        assert_eq!(
            (
                e.kind(),
                e.to_string().starts_with("cannot create a file in /d: ")
            ),
            ("open", true)
        );
        assert!(Error::Cancelled.into_file_error().is_err());
    }
}
