//! The agent-to-agent control protocol's wire format: a hand-written, versioned binary codec.
//!
//! Everything a peer sends is untrusted. [`decode`] checks, before using any of it: the magic,
//! the version, the message kind, that the declared body length equals the bytes present and
//! stays under [`MAX_MESSAGE`], every count against its limit ([`MAX_REGIONS`],
//! [`MAX_WITHDRAW`]) *and* against the bytes left (so a count cannot make it allocate), every
//! string's length ([`MAX_NAME`]) and UTF-8, every packed rkey's length (1..=[`MAX_RKEY`]),
//! every region's `addr + len` against wrapping, region ids for duplicates, packed writes
//! ([`MAX_WRITES`], no write wrapping, exactly the bytes the writes add up to), worker addresses
//! (1..=[`MAX_WORKER_ADDRESS`] bytes), and that no byte is left over. It never panics (fuzzed:
//! `fuzz/fuzz_targets/metadata.rs`). A stream reader ([`body_len`]) checks a frame's header,
//! and bounds its body length, before it allocates for the body.
//!
//! Frame (little endian):
//!
//! | bytes | field |
//! | --- | --- |
//! | 4 | magic `GDPN` |
//! | 2 | version ([`VERSION`]) |
//! | 1 | kind ([`Kind`]) |
//! | 1 | flags, must be 0 |
//! | 4 | body length in bytes |
//! | n | body, by kind (see [`Message`]) |
//!
//! Strings are `u16 length + UTF-8`; byte strings `u32 length + bytes` (notifications) or
//! `u16 length + bytes` (rkeys); nonces and MACs are 32 raw bytes.

use std::fmt;
use std::sync::Arc;

/// The UCX active-message id control messages are sent to.
pub const AM_ID: u16 = 0x6764;
/// First four bytes of every message.
pub const MAGIC: [u8; 4] = *b"GDPN";
/// The protocol version this build speaks (and the only one it accepts). Version 3 moved the
/// handshake to gdpath's own TCP connection, added the UCX worker addresses and routing ids
/// to `Auth` and `Welcome`, and lets a region carry a CUDA IPC handle ([`RegionMeta::ipc`]);
/// version 2 added `Bye`, `Writes` and `WritesAck`; version 4 lets a host region carry its
/// shared-memory name ([`RegionMeta::shm`]).
pub const VERSION: u16 = 4;
/// Frame header length in bytes.
pub const HEADER_LEN: usize = 12;
/// Largest message (header + body) in bytes: the UCX control-message bound
/// (`gdpath_ucx::AM_MAX_MESSAGE`, 1 MiB; the engine's network backend checks that the two agree).
pub const MAX_MESSAGE: usize = 1 << 20;
/// Most regions one metadata message may list.
pub const MAX_REGIONS: usize = 4096;
/// Most region ids one withdraw (or its acknowledgement) may list.
pub const MAX_WITHDRAW: usize = 4096;
/// Longest agent name or reason text, bytes of UTF-8.
pub const MAX_NAME: usize = 256;
/// Characters of an agent's name that the metadata it sends carries (longer names are cut).
pub const AGENT_NAME_CHARS: usize = 64;
/// Longest packed remote key accepted, bytes. UCX keys are tens to hundreds of bytes (one entry
/// per memory domain); 4 KiB leaves room for CUDA and multi-rail builds.
pub const MAX_RKEY: usize = 4096;
/// Longest notification payload, bytes.
pub const MAX_NOTIFY: usize = 64 * 1024;
/// Most writes one [`Message::Writes`] carries.
pub const MAX_WRITES: usize = 1024;
/// Nonce and MAC length (HMAC-SHA256 output), bytes.
pub const NONCE_LEN: usize = 32;
/// Longest UCX worker address accepted, bytes. UCX packs one entry per transport and device (a
/// few hundred bytes over tcp and shared memory; kilobytes with many RDMA ports).
pub const MAX_WORKER_ADDRESS: usize = 64 * 1024;

/// Message kinds (byte 6 of the frame).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum Kind {
    /// Server → client, first message: the server's nonce.
    Challenge = 1,
    /// Client → server: the client's nonce, MAC, name, routing id and worker address.
    Auth = 2,
    /// Server → client after a verified `Auth`: the server's MAC, routing id, worker address and
    /// metadata.
    Welcome = 3,
    /// Server → client: the connection is refused, with a code and a reason.
    Refused = 4,
    /// Server → client: the exporter's full, current metadata.
    Metadata = 5,
    /// Server → client: regions being unexported.
    Withdraw = 6,
    /// Client → server: every operation on the withdrawn regions has completed.
    WithdrawAck = 7,
    /// Either way: an application notification.
    Notify = 8,
    /// Either way: a clean close of the connection.
    Bye = 9,
    /// Client → server: packed writes into an exported host region.
    Writes = 10,
    /// Server → client: the answer to a packed-writes message.
    WritesAck = 11,
}

impl Kind {
    fn from_u8(b: u8) -> Option<Kind> {
        Some(match b {
            1 => Kind::Challenge,
            2 => Kind::Auth,
            3 => Kind::Welcome,
            4 => Kind::Refused,
            5 => Kind::Metadata,
            6 => Kind::Withdraw,
            7 => Kind::WithdrawAck,
            8 => Kind::Notify,
            9 => Kind::Bye,
            10 => Kind::Writes,
            11 => Kind::WritesAck,
            _ => return None,
        })
    }
}

/// The memory behind an exported region, as the exporting agent declares it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum WireKind {
    /// Host memory (kind byte 0, ordinal 0).
    Host,
    /// GPU memory of this CUDA ordinal (kind byte 1).
    Gpu(u32),
}

/// One exported region: the exporting agent's region id, its memory kind, its address in the
/// exporter's address space, its length in bytes, its packed UCX remote key and, for GPU
/// memory, optionally its CUDA IPC handle.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RegionMeta {
    /// The exporting agent's region id, unique among its exports.
    pub id: u64,
    /// The memory behind the region (host, or GPU of a CUDA ordinal).
    pub kind: WireKind,
    /// Start address of the region in the exporter's address space (a virtual address, bytes).
    pub addr: u64,
    /// Length of the region, bytes; `addr + len` does not wrap.
    pub len: u64,
    /// The packed UCX remote key of the registration holding the region (1..=[`MAX_RKEY`] bytes).
    pub rkey: Vec<u8>,
    /// The CUDA IPC handle of the GPU allocation holding the region, for importers on the same
    /// node (wire: a presence byte 0 (none), 1 (this), 2 ([`RegionMeta::shm`]), then the
    /// fields of [`IpcMeta`]).
    pub ipc: Option<IpcMeta>,
    /// For host memory: the shared memory holding the region, for importers on the same node
    /// (wire: presence byte 2, then the fields of [`ShmMeta`]). At most one of `ipc` and `shm`.
    pub shm: Option<ShmMeta>,
}

/// A host region's shared memory as its exporter declares it: a sealed memfd that processes of
/// the same node (the importer compares `host` with its own) find as `/proc/PID/fd/FD`, check
/// against its random `name`, `dev` and `ino`, and map, the region `offset` bytes into it.
/// Wire: `host[16]`, `pid` u32, `fd` u32, `dev` u64, `ino` u64, `name[16]`, `offset` u64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ShmMeta {
    /// The exporter's node: the kernel's boot id (`/proc/sys/kernel/random/boot_id`).
    pub host: [u8; 16],
    /// The exporting process.
    pub pid: u32,
    /// The memfd's descriptor number in the exporting process.
    pub fd: u32,
    /// Device number of the memfd (`fstat`).
    pub dev: u64,
    /// Inode number of the memfd (`fstat`).
    pub ino: u64,
    /// The random part of the memfd's name, which the importer compares with the file's.
    pub name: [u8; 16],
    /// Bytes from the file's start to the region's.
    pub offset: u64,
}

/// Longest PCI address an [`IpcMeta`] carries, bytes (`0000:00:06.0` is 12).
pub const MAX_PCI: usize = 32;

/// A GPU region's CUDA IPC handle as its exporter declares it: usable only by processes of
/// the same node (the importer compares `host` with its own), which open `handle` and find the
/// region `offset` bytes into the mapping. Wire: `host[16]`, `pci` (u16 length + UTF-8, at most
/// [`MAX_PCI`]), `handle[64]`, `offset` u64.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct IpcMeta {
    /// The exporter's node: the kernel's boot id (`/proc/sys/kernel/random/boot_id`).
    pub host: [u8; 16],
    /// PCI address of the GPU holding the memory, sysfs form (`0000:00:06.0`).
    pub pci: String,
    /// `CUipcMemHandle` of the allocation.
    pub handle: [u8; 64],
    /// Bytes from the allocation's start to the region's.
    pub offset: u64,
}

/// An agent's metadata: its name and the regions it exports.
#[derive(Debug, Clone, PartialEq, Eq, Default)]
pub struct Metadata {
    /// The agent's name, at most [`AGENT_NAME_CHARS`] characters.
    pub name: String,
    /// The regions the agent exports, at most [`MAX_REGIONS`], ids unique.
    pub regions: Vec<RegionMeta>,
}

/// Why a server refused a connection (byte of [`Message::Refused`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
#[repr(u8)]
pub enum RefuseCode {
    /// The client's MAC did not verify: wrong or missing token.
    BadToken = 1,
    /// The client broke the protocol (unexpected or malformed message).
    Protocol = 2,
    /// The server has as many peers as it accepts.
    Busy = 3,
    /// Anything else (text says).
    Other = 255,
}

impl RefuseCode {
    fn from_u8(b: u8) -> Option<RefuseCode> {
        Some(match b {
            1 => RefuseCode::BadToken,
            2 => RefuseCode::Protocol,
            3 => RefuseCode::Busy,
            255 => RefuseCode::Other,
            _ => return None,
        })
    }
}

/// A control message. Direction: S = the serving agent, C = the connecting one.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Message {
    /// S → C first: the server's nonce. Body: nonce[32].
    Challenge {
        /// The server's random nonce, which the client's MAC covers.
        server_nonce: [u8; NONCE_LEN],
    },
    /// C → S: the client's nonce, its MAC (over both nonces, its routing id and its worker
    /// address), its name, the id the server is to put on the messages it sends the client
    /// over UCX (`session`), and the client's UCX worker address, which the server connects to
    /// once the MAC verified. Body: nonce[32], mac[32], name (str16), session u64, worker
    /// address (u32 length, 1..=[`MAX_WORKER_ADDRESS`] bytes).
    Auth {
        /// The client's random nonce, which the server's MAC covers.
        client_nonce: [u8; NONCE_LEN],
        /// HMAC-SHA256 over both nonces, the client's routing id and worker address, keyed by the
        /// token.
        mac: [u8; NONCE_LEN],
        /// The client agent's name (at most [`MAX_NAME`] bytes).
        name: String,
        /// The routing id the server is to put on every message it sends the client over UCX.
        session: u64,
        /// The client's UCX worker address (1..=[`MAX_WORKER_ADDRESS`] bytes).
        worker_address: Vec<u8>,
    },
    /// S → C after a verified Auth: the server's MAC (mutual authentication, also over its
    /// routing id and worker address), its routing id (`session`), its UCX worker address and
    /// its metadata, rkeys included. Body: mac[32], session u64, worker address (u32 length +
    /// bytes), metadata.
    Welcome {
        /// HMAC-SHA256 over both nonces, the server's routing id and worker address, keyed by the
        /// token.
        mac: [u8; NONCE_LEN],
        /// The routing id the client is to put on every message it sends the server over UCX.
        session: u64,
        /// The server's UCX worker address (1..=[`MAX_WORKER_ADDRESS`] bytes).
        worker_address: Vec<u8>,
        /// The server's metadata: its name and exported regions, rkeys included.
        metadata: Metadata,
    },
    /// S → C: the connection is refused. Body: code u8, reason (str16).
    Refused {
        /// Why, as a code the client can act on.
        code: RefuseCode,
        /// Why, in words (at most [`MAX_NAME`] bytes).
        reason: String,
    },
    /// S → C: the full, current metadata (after exports change).
    Metadata(Metadata),
    /// S → C: these regions are being unexported; stop using them and acknowledge.
    /// Body: count u32, ids u64 × count.
    Withdraw(Vec<u64>),
    /// C → S: every operation on these regions has completed (the endpoint was flushed).
    WithdrawAck(Vec<u64>),
    /// Either way: an application notification, sent after the writes it follows completed.
    /// Body: length u32, bytes.
    Notify(Vec<u8>),
    /// Either way, after authentication: this side is closing the connection on purpose (its
    /// operations on it were flushed first). The receiver releases the peer's state and
    /// reports a clean disconnect rather than a lost peer; a server answers with `Bye` before
    /// the client closes its endpoint, so that the endpoint failure the close causes at the
    /// server is never mistaken for a death. Body: empty.
    Bye,
    /// C → S: writes into one of the server's exported host regions, the bytes carried in the
    /// message (for transports on which UCX emulates puts with a message each: many small
    /// writes go in one). Body: seq u64, region u64, count u32, (offset u64, len u32) × count,
    /// then the writes' bytes back to back, exactly as many as the lengths add up to.
    Writes {
        /// The client's sequence number for this message, echoed by the [`Message::WritesAck`].
        seq: u64,
        /// The id of the server's exported host region written.
        region: u64,
        /// The writes: `(offset, length)` in bytes from the region's start, at most [`MAX_WRITES`].
        records: Vec<(u64, u32)>,
        /// The writes' bytes back to back, exactly as many as the lengths add up to.
        data: WriteBytes,
    },
    /// S → C: the writes of message `seq` are in the region's memory, or why none was made.
    /// Body: seq u64, status u8 (0 done, 1 the region is not exported, 2 refused), then for a
    /// refusal the reason (str16).
    WritesAck {
        /// The `seq` of the [`Message::Writes`] answered.
        seq: u64,
        /// Whether its writes were made.
        status: WritesStatus,
    },
}

/// The answer to a [`Message::Writes`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum WritesStatus {
    /// Every write is in the region's memory.
    Done,
    /// The region is not (or no longer) exported: withdrawn while the writes were on the way,
    /// or never. No write was made.
    NotExported,
    /// Refused for the reason given (GPU memory, a write past the region's end). No write was
    /// made.
    Refused(String),
}

/// The bytes of a [`Message::Writes`]: the tail of the buffer the message arrived in, so that
/// [`decode_owned`] hands a packed message's writes (up to a 512 KiB piece) over without copying
/// them.
#[derive(Clone)]
pub struct WriteBytes {
    buf: Arc<dyn AsRef<[u8]> + Send + Sync>,
    start: usize,
}

impl WriteBytes {
    /// The bytes of `buf` from `start` on.
    fn tail(buf: Arc<dyn AsRef<[u8]> + Send + Sync>, start: usize) -> Self {
        debug_assert!(start <= (*buf).as_ref().len());
        WriteBytes { buf, start }
    }
}

impl Default for WriteBytes {
    fn default() -> Self {
        Vec::new().into()
    }
}

impl From<Vec<u8>> for WriteBytes {
    fn from(buf: Vec<u8>) -> Self {
        WriteBytes::tail(Arc::new(buf), 0)
    }
}

impl std::ops::Deref for WriteBytes {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        &(*self.buf).as_ref()[self.start..]
    }
}

impl PartialEq for WriteBytes {
    fn eq(&self, other: &Self) -> bool {
        **self == **other
    }
}
impl Eq for WriteBytes {}

impl fmt::Debug for WriteBytes {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{} bytes", self.len())
    }
}

impl Message {
    /// The message's kind.
    pub fn kind(&self) -> Kind {
        match self {
            Message::Challenge { .. } => Kind::Challenge,
            Message::Auth { .. } => Kind::Auth,
            Message::Welcome { .. } => Kind::Welcome,
            Message::Refused { .. } => Kind::Refused,
            Message::Metadata(_) => Kind::Metadata,
            Message::Withdraw(_) => Kind::Withdraw,
            Message::WithdrawAck(_) => Kind::WithdrawAck,
            Message::Notify(_) => Kind::Notify,
            Message::Bye => Kind::Bye,
            Message::Writes { .. } => Kind::Writes,
            Message::WritesAck { .. } => Kind::WritesAck,
        }
    }
}

/// Why bytes from a peer were rejected. Offsets are from the start of the message.
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
pub enum DecodeError {
    /// The message ends before a field does.
    #[error("message truncated: {what} needs {need} bytes at offset {at}, {have} left")]
    Truncated {
        /// The field being read (e.g. "rkey").
        what: &'static str,
        /// Its offset, bytes from the message's start.
        at: usize,
        /// The bytes it needs.
        need: usize,
        /// The bytes left in the message from `at`.
        have: usize,
    },
    /// The first four bytes are not [`MAGIC`]: the sender is not a gdpath agent.
    #[error("bad magic {0:02x?} (not a gdpath agent)")]
    BadMagic([u8; 4]),
    /// The frame's version is not [`VERSION`], the only one this build speaks.
    #[error("protocol version {got} not supported (this build speaks {VERSION})")]
    Version {
        /// The version the frame carries.
        got: u16,
    },
    /// The kind byte names no [`Kind`].
    #[error("unknown message kind {0}")]
    UnknownKind(u8),
    /// The refusal code names no [`RefuseCode`].
    #[error("unknown refusal code {0}")]
    UnknownCode(u8),
    /// The flags byte, reserved, is not 0.
    #[error("reserved flags {0:#04x} set")]
    Flags(u8),
    /// The header's body length is not the number of bytes that follow it.
    #[error("declared body length {declared} bytes, but {present} bytes present")]
    BodyLength {
        /// The length the header declares, bytes.
        declared: u64,
        /// The bytes actually present after the header.
        present: usize,
    },
    /// A length or count over its protocol limit.
    #[error("{what} of {len} exceeds the limit of {max}")]
    TooLarge {
        /// The length or count (e.g. "region count").
        what: &'static str,
        /// Its value as sent (bytes, or items for a count).
        len: u64,
        /// The limit, in the same unit.
        max: u64,
    },
    /// A string's bytes are not UTF-8.
    #[error("{what} is not valid UTF-8")]
    Utf8 {
        /// The string's field (e.g. "agent name").
        what: &'static str,
    },
    /// A region's description is inconsistent.
    #[error("region {id}: {detail}")]
    BadRegion {
        /// The region's id as sent.
        id: u64,
        /// What is wrong with it (a duplicate id, an address range that wraps).
        detail: String,
    },
    /// Bytes left over after the message's last field (the count of them).
    #[error("{0} unexpected trailing bytes")]
    Trailing(usize),
}

/// Bounds-checked reader over untrusted bytes.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn left(&self) -> usize {
        self.buf.len() - self.pos
    }
    fn take(&mut self, what: &'static str, n: usize) -> Result<&'a [u8], DecodeError> {
        if n > self.left() {
            return Err(DecodeError::Truncated {
                what,
                at: self.pos,
                need: n,
                have: self.left(),
            });
        }
        let s = &self.buf[self.pos..self.pos + n];
        self.pos += n;
        Ok(s)
    }
    fn array<const N: usize>(&mut self, what: &'static str) -> Result<[u8; N], DecodeError> {
        let mut a = [0u8; N];
        a.copy_from_slice(self.take(what, N)?);
        Ok(a)
    }
    fn u8(&mut self, what: &'static str) -> Result<u8, DecodeError> {
        Ok(self.array::<1>(what)?[0])
    }
    fn u16(&mut self, what: &'static str) -> Result<u16, DecodeError> {
        Ok(u16::from_le_bytes(self.array(what)?))
    }
    fn u32(&mut self, what: &'static str) -> Result<u32, DecodeError> {
        Ok(u32::from_le_bytes(self.array(what)?))
    }
    fn u64(&mut self, what: &'static str) -> Result<u64, DecodeError> {
        Ok(u64::from_le_bytes(self.array(what)?))
    }
    /// A `u16`-length UTF-8 string of at most `max` bytes.
    fn str16(&mut self, what: &'static str, max: usize) -> Result<String, DecodeError> {
        let n = self.u16(what)? as usize;
        if n > max {
            return Err(DecodeError::TooLarge {
                what,
                len: n as u64,
                max: max as u64,
            });
        }
        let b = self.take(what, n)?;
        std::str::from_utf8(b)
            .map(str::to_owned)
            .map_err(|_| DecodeError::Utf8 { what })
    }
    /// A count of items of at least `item_len` bytes each, checked against `max` and the bytes
    /// left, so that it cannot make the decoder allocate more than the message holds.
    fn count(
        &mut self,
        what: &'static str,
        max: usize,
        item_len: usize,
    ) -> Result<usize, DecodeError> {
        let n = self.u32(what)? as usize;
        if n > max {
            return Err(DecodeError::TooLarge {
                what,
                len: n as u64,
                max: max as u64,
            });
        }
        let need = n.saturating_mul(item_len);
        if need > self.left() {
            return Err(DecodeError::Truncated {
                what,
                at: self.pos,
                need,
                have: self.left(),
            });
        }
        Ok(n)
    }
}

/// The body length of a frame whose first [`HEADER_LEN`] bytes are `header`, for a reader of a
/// byte stream, which reads the body next: magic, version, kind and flags checked as
/// [`decode`] checks them, and the length bounded by `max` (at most [`MAX_MESSAGE`] in all)
/// *before* the reader allocates for it.
pub fn body_len(head: &[u8; HEADER_LEN], max: usize) -> Result<usize, DecodeError> {
    let (_, declared) = header(&mut Reader { buf: head, pos: 0 })?;
    let declared = declared as usize;
    let max = max.min(MAX_MESSAGE - HEADER_LEN);
    if declared > max {
        return Err(DecodeError::TooLarge {
            what: "body",
            len: declared as u64,
            max: max as u64,
        });
    }
    Ok(declared)
}

/// A frame header: magic, version, kind and flags checked; the kind and the declared body
/// length.
fn header(r: &mut Reader<'_>) -> Result<(Kind, u32), DecodeError> {
    let magic = r.array::<4>("magic")?;
    if magic != MAGIC {
        return Err(DecodeError::BadMagic(magic));
    }
    let version = r.u16("version")?;
    if version != VERSION {
        return Err(DecodeError::Version { got: version });
    }
    let kind_byte = r.u8("kind")?;
    let kind = Kind::from_u8(kind_byte).ok_or(DecodeError::UnknownKind(kind_byte))?;
    let flags = r.u8("flags")?;
    if flags != 0 {
        return Err(DecodeError::Flags(flags));
    }
    Ok((kind, r.u32("body length")?))
}

/// Decodes one message. See the module docs for every check made.
pub fn decode(bytes: &[u8]) -> Result<Message, DecodeError> {
    let (mut msg, writes_at) = decode_in_place(bytes)?;
    if let (Message::Writes { data, .. }, Some(at)) = (&mut msg, writes_at) {
        *data = bytes[at..].to_vec().into();
    }
    Ok(msg)
}

/// [`decode`] of a message the caller owns (a `Vec<u8>`, a received UCX payload): a
/// [`Message::Writes`] keeps `bytes` as its [`WriteBytes`] instead of copying its writes out.
/// The same checks and errors.
pub fn decode_owned<B>(bytes: B) -> Result<Message, DecodeError>
where
    B: AsRef<[u8]> + Send + Sync + 'static,
{
    decode_owned_from(bytes, 0)
}

/// [`decode_owned`] of the message that starts `start` bytes into `bytes` (a received payload
/// with a routing prefix). `start` past the end is a truncated message.
pub fn decode_owned_from<B>(bytes: B, start: usize) -> Result<Message, DecodeError>
where
    B: AsRef<[u8]> + Send + Sync + 'static,
{
    let all = bytes.as_ref();
    let Some(frame) = all.get(start..) else {
        return Err(DecodeError::Truncated {
            what: "message",
            at: 0,
            need: start,
            have: all.len(),
        });
    };
    let (mut msg, writes_at) = decode_in_place(frame)?;
    if let (Message::Writes { data, .. }, Some(at)) = (&mut msg, writes_at) {
        *data = WriteBytes::tail(Arc::new(bytes), start + at);
    }
    Ok(msg)
}

/// Decodes every field but a [`Message::Writes`]'s bytes, which it leaves empty: their offset
/// comes back instead (they run to the end of the message; trailing bytes are refused).
fn decode_in_place(bytes: &[u8]) -> Result<(Message, Option<usize>), DecodeError> {
    if bytes.len() > MAX_MESSAGE {
        return Err(DecodeError::TooLarge {
            what: "message",
            len: bytes.len() as u64,
            max: MAX_MESSAGE as u64,
        });
    }
    let mut r = Reader { buf: bytes, pos: 0 };
    let (kind, declared) = header(&mut r)?;
    if declared as usize != r.left() {
        return Err(DecodeError::BodyLength {
            declared: declared.into(),
            present: r.left(),
        });
    }
    let mut writes_at = None;
    let msg = match kind {
        Kind::Challenge => Message::Challenge {
            server_nonce: r.array("server nonce")?,
        },
        Kind::Auth => Message::Auth {
            client_nonce: r.array("client nonce")?,
            mac: r.array("client mac")?,
            name: r.str16("client name", MAX_NAME)?,
            session: r.u64("session")?,
            worker_address: worker_address(&mut r)?,
        },
        Kind::Welcome => Message::Welcome {
            mac: r.array("server mac")?,
            session: r.u64("session")?,
            worker_address: worker_address(&mut r)?,
            metadata: metadata(&mut r)?,
        },
        Kind::Refused => Message::Refused {
            code: {
                let c = r.u8("refusal code")?;
                RefuseCode::from_u8(c).ok_or(DecodeError::UnknownCode(c))?
            },
            reason: r.str16("refusal reason", MAX_NAME)?,
        },
        Kind::Metadata => Message::Metadata(metadata(&mut r)?),
        Kind::Withdraw => Message::Withdraw(ids(&mut r)?),
        Kind::WithdrawAck => Message::WithdrawAck(ids(&mut r)?),
        Kind::Notify => {
            let n = r.u32("notification length")? as usize;
            if n > MAX_NOTIFY {
                return Err(DecodeError::TooLarge {
                    what: "notification",
                    len: n as u64,
                    max: MAX_NOTIFY as u64,
                });
            }
            Message::Notify(r.take("notification", n)?.to_vec())
        }
        // Empty body: a byte present is refused below as trailing.
        Kind::Bye => Message::Bye,
        Kind::Writes => {
            let seq = r.u64("writes seq")?;
            let region = r.u64("writes region")?;
            let n = r.count("write count", MAX_WRITES, 12)?;
            let mut records = Vec::with_capacity(n);
            let mut total: usize = 0;
            for _ in 0..n {
                let off = r.u64("write offset")?;
                let len = r.u32("write length")?;
                if off.checked_add(len.into()).is_none() {
                    return Err(DecodeError::BadRegion {
                        id: region,
                        detail: format!("write at {off} of {len} bytes wraps around"),
                    });
                }
                total = total.saturating_add(len as usize);
                records.push((off, len));
            }
            // The bytes must be exactly what the records say: no more (refused below as
            // trailing), no less.
            writes_at = Some(r.pos);
            r.take("write bytes", total)?;
            Message::Writes {
                seq,
                region,
                records,
                data: WriteBytes::default(),
            }
        }
        Kind::WritesAck => {
            let seq = r.u64("writes ack seq")?;
            let status = match r.u8("writes ack status")? {
                0 => WritesStatus::Done,
                1 => WritesStatus::NotExported,
                2 => WritesStatus::Refused(r.str16("writes refusal", MAX_NAME)?),
                c => return Err(DecodeError::UnknownCode(c)),
            };
            Message::WritesAck { seq, status }
        }
    };
    if r.left() != 0 {
        return Err(DecodeError::Trailing(r.left()));
    }
    Ok((msg, writes_at))
}

/// Smallest encoded region: id, kind, ordinal, addr, len, rkey length, one rkey byte, the IPC
/// presence byte.
const MIN_REGION_LEN: usize = 8 + 1 + 4 + 8 + 8 + 2 + 1 + 1;

fn metadata(r: &mut Reader<'_>) -> Result<Metadata, DecodeError> {
    let name = r.str16("agent name", MAX_NAME)?;
    let n = r.count("region count", MAX_REGIONS, MIN_REGION_LEN)?;
    let mut regions: Vec<RegionMeta> = Vec::with_capacity(n);
    for _ in 0..n {
        let id = r.u64("region id")?;
        let kind_b = r.u8("region kind")?;
        let ordinal = r.u32("region ordinal")?;
        let kind = match (kind_b, ordinal) {
            (0, 0) => WireKind::Host,
            (1, o) => WireKind::Gpu(o),
            (k, o) => {
                return Err(DecodeError::BadRegion {
                    id,
                    detail: format!("unknown memory kind {k} (ordinal {o})"),
                })
            }
        };
        let addr = r.u64("region address")?;
        let len = r.u64("region length")?;
        if len == 0 {
            return Err(DecodeError::BadRegion {
                id,
                detail: "zero length".into(),
            });
        }
        if addr.checked_add(len).is_none() {
            return Err(DecodeError::BadRegion {
                id,
                detail: format!("{addr:#x}+{len} wraps the address space"),
            });
        }
        let klen = r.u16("rkey length")? as usize;
        if klen == 0 || klen > MAX_RKEY {
            return Err(DecodeError::BadRegion {
                id,
                detail: format!("packed rkey of {klen} bytes (expected 1..={MAX_RKEY})"),
            });
        }
        let rkey = r.take("rkey", klen)?.to_vec();
        let (mut ipc, mut shm) = (None, None);
        match r.u8("IPC presence")? {
            0 => {}
            1 => {
                let host = r.array::<16>("IPC host")?;
                let pci = r.str16("IPC PCI address", MAX_PCI)?;
                let handle = r.array::<64>("IPC handle")?;
                let offset = r.u64("IPC offset")?;
                if addr.checked_sub(offset).is_none() {
                    return Err(DecodeError::BadRegion {
                        id,
                        detail: format!("IPC offset {offset} is past the region's address"),
                    });
                }
                ipc = Some(IpcMeta {
                    host,
                    pci,
                    handle,
                    offset,
                });
            }
            2 => {
                let host = r.array::<16>("shared memory host")?;
                let pid = r.u32("shared memory pid")?;
                let fd = r.u32("shared memory fd")?;
                let dev = r.u64("shared memory device")?;
                let ino = r.u64("shared memory inode")?;
                let name = r.array::<16>("shared memory name")?;
                let offset = r.u64("shared memory offset")?;
                if offset.checked_add(len).is_none() {
                    return Err(DecodeError::BadRegion {
                        id,
                        detail: format!("shared memory offset {offset}+{len} wraps"),
                    });
                }
                shm = Some(ShmMeta {
                    host,
                    pid,
                    fd,
                    dev,
                    ino,
                    name,
                    offset,
                });
            }
            b => {
                return Err(DecodeError::BadRegion {
                    id,
                    detail: format!("IPC presence byte {b} (expected 0, 1 or 2)"),
                })
            }
        }
        if ipc.is_some() && kind == WireKind::Host {
            return Err(DecodeError::BadRegion {
                id,
                detail: "an IPC handle for host memory".into(),
            });
        }
        if shm.is_some() && kind != WireKind::Host {
            return Err(DecodeError::BadRegion {
                id,
                detail: "shared host memory for GPU memory".into(),
            });
        }
        if regions.iter().any(|x| x.id == id) {
            return Err(DecodeError::BadRegion {
                id,
                detail: "listed twice".into(),
            });
        }
        regions.push(RegionMeta {
            id,
            kind,
            addr,
            len,
            rkey,
            ipc,
            shm,
        });
    }
    Ok(Metadata { name, regions })
}

fn worker_address(r: &mut Reader<'_>) -> Result<Vec<u8>, DecodeError> {
    let n = r.u32("worker address length")? as usize;
    if n == 0 || n > MAX_WORKER_ADDRESS {
        return Err(DecodeError::TooLarge {
            what: "worker address (1.. bytes)",
            len: n as u64,
            max: MAX_WORKER_ADDRESS as u64,
        });
    }
    Ok(r.take("worker address", n)?.to_vec())
}

fn ids(r: &mut Reader<'_>) -> Result<Vec<u64>, DecodeError> {
    let n = r.count("region id count", MAX_WITHDRAW, 8)?;
    (0..n).map(|_| r.u64("region id")).collect()
}

/// Why a message could not be encoded (a local value over a protocol limit).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("cannot encode: {what} of {len} exceeds the protocol limit of {max}")]
pub struct EncodeError {
    /// What was over its limit (e.g. "agent name").
    pub what: &'static str,
    /// Its length (bytes, or items for a list).
    pub len: usize,
    /// The protocol's limit, in the same unit as `len`.
    pub max: usize,
}

/// A frame being written, after the first `.1` bytes of `.0` (a prefix that is not part of it).
/// `Ok` for a notification the wire carries (at most [`MAX_NOTIFY`] bytes), else the error
/// encoding it gives: the agent checks at post what the encoder would refuse after the writes.
pub fn notification_fits(message: &[u8]) -> Result<(), EncodeError> {
    Writer::limit("notification", message.len(), MAX_NOTIFY)
}

struct Writer(Vec<u8>, usize);

impl Writer {
    /// The frame header of a message of `kind`, its body length left for [`Writer::finish`].
    fn start(kind: Kind) -> Self {
        Self::start_after(Vec::with_capacity(64), kind)
    }
    /// [`Writer::start`] after the bytes already in `prefix`.
    fn start_after(prefix: Vec<u8>, kind: Kind) -> Self {
        let base = prefix.len();
        let mut w = Writer(prefix, base);
        w.0.extend_from_slice(&MAGIC);
        w.0.extend_from_slice(&VERSION.to_le_bytes());
        w.0.push(kind as u8);
        w.0.push(0);
        w.0.extend_from_slice(&[0; 4]); // body length, patched by finish
        w
    }
    /// Checks the message's size, `after` bytes that the caller sends beyond what is written
    /// included, and patches the body length.
    fn finish(mut self, after: usize) -> Result<Vec<u8>, EncodeError> {
        let base = self.1;
        let len = (self.0.len() - base).saturating_add(after);
        Self::limit("message", len, MAX_MESSAGE)?;
        let body = (len - HEADER_LEN) as u32;
        self.0[base + 8..base + 12].copy_from_slice(&body.to_le_bytes());
        Ok(self.0)
    }
    /// A [`Message::Writes`] body up to its bytes, `data_len` of which must follow.
    fn writes_head(
        &mut self,
        seq: u64,
        region: u64,
        records: &[(u64, u32)],
        data_len: usize,
    ) -> Result<(), EncodeError> {
        Self::limit("write count", records.len(), MAX_WRITES)?;
        if let Some(&(off, len)) = records
            .iter()
            .find(|&&(off, len)| off.checked_add(len.into()).is_none())
        {
            return Err(EncodeError {
                what: "write end (wraps around)",
                len: len as usize,
                max: (u64::MAX - off) as usize,
            });
        }
        let total = records.iter().map(|&(_, l)| u64::from(l)).sum::<u64>();
        if total != data_len as u64 {
            return Err(EncodeError {
                what: "write bytes (not what the records add up to)",
                len: data_len,
                max: total as usize,
            });
        }
        self.0.extend_from_slice(&seq.to_le_bytes());
        self.0.extend_from_slice(&region.to_le_bytes());
        self.0
            .extend_from_slice(&(records.len() as u32).to_le_bytes());
        for &(off, len) in records {
            self.0.extend_from_slice(&off.to_le_bytes());
            self.0.extend_from_slice(&len.to_le_bytes());
        }
        Self::limit(
            "message",
            (self.0.len() - self.1).saturating_add(data_len),
            MAX_MESSAGE,
        )
    }
    fn limit(what: &'static str, len: usize, max: usize) -> Result<(), EncodeError> {
        if len > max {
            Err(EncodeError { what, len, max })
        } else {
            Ok(())
        }
    }
    fn str16(&mut self, what: &'static str, s: &str) -> Result<(), EncodeError> {
        Self::limit(what, s.len(), MAX_NAME)?;
        self.0.extend_from_slice(&(s.len() as u16).to_le_bytes());
        self.0.extend_from_slice(s.as_bytes());
        Ok(())
    }
    fn worker_address(&mut self, a: &[u8]) -> Result<(), EncodeError> {
        Self::limit("worker address", a.len(), MAX_WORKER_ADDRESS)?;
        if a.is_empty() {
            return Err(EncodeError {
                what: "worker address (empty)",
                len: 0,
                max: MAX_WORKER_ADDRESS,
            });
        }
        self.0.extend_from_slice(&(a.len() as u32).to_le_bytes());
        self.0.extend_from_slice(a);
        Ok(())
    }
    fn ids(&mut self, ids: &[u64]) -> Result<(), EncodeError> {
        Self::limit("region id count", ids.len(), MAX_WITHDRAW)?;
        self.0.extend_from_slice(&(ids.len() as u32).to_le_bytes());
        for id in ids {
            self.0.extend_from_slice(&id.to_le_bytes());
        }
        Ok(())
    }
    fn metadata(&mut self, m: &Metadata) -> Result<(), EncodeError> {
        self.str16("agent name", &m.name)?;
        Self::limit("region count", m.regions.len(), MAX_REGIONS)?;
        self.0
            .extend_from_slice(&(m.regions.len() as u32).to_le_bytes());
        for g in &m.regions {
            Self::limit("rkey", g.rkey.len(), MAX_RKEY)?;
            self.0.extend_from_slice(&g.id.to_le_bytes());
            let (k, o) = match g.kind {
                WireKind::Host => (0u8, 0u32),
                WireKind::Gpu(o) => (1, o),
            };
            self.0.push(k);
            self.0.extend_from_slice(&o.to_le_bytes());
            self.0.extend_from_slice(&g.addr.to_le_bytes());
            self.0.extend_from_slice(&g.len.to_le_bytes());
            self.0
                .extend_from_slice(&(g.rkey.len() as u16).to_le_bytes());
            self.0.extend_from_slice(&g.rkey);
            match (&g.ipc, &g.shm) {
                (None, None) => self.0.push(0),
                (Some(i), None) => {
                    Self::limit("IPC PCI address", i.pci.len(), MAX_PCI)?;
                    self.0.push(1);
                    self.0.extend_from_slice(&i.host);
                    self.str16("IPC PCI address", &i.pci)?;
                    self.0.extend_from_slice(&i.handle);
                    self.0.extend_from_slice(&i.offset.to_le_bytes());
                }
                (None, Some(m)) => {
                    self.0.push(2);
                    self.0.extend_from_slice(&m.host);
                    self.0.extend_from_slice(&m.pid.to_le_bytes());
                    self.0.extend_from_slice(&m.fd.to_le_bytes());
                    self.0.extend_from_slice(&m.dev.to_le_bytes());
                    self.0.extend_from_slice(&m.ino.to_le_bytes());
                    self.0.extend_from_slice(&m.name);
                    self.0.extend_from_slice(&m.offset.to_le_bytes());
                }
                (Some(_), Some(_)) => {
                    return Err(EncodeError {
                        what: "memory-sharing records (CUDA IPC and shared host memory)",
                        len: 2,
                        max: 1,
                    })
                }
            }
        }
        Ok(())
    }
}

/// Encodes a message. Errors when a field exceeds a protocol limit (the peer would refuse it).
pub fn encode(msg: &Message) -> Result<Vec<u8>, EncodeError> {
    let mut w = Writer::start(msg.kind());
    match msg {
        Message::Challenge { server_nonce } => w.0.extend_from_slice(server_nonce),
        Message::Auth {
            client_nonce,
            mac,
            name,
            session,
            worker_address,
        } => {
            w.0.extend_from_slice(client_nonce);
            w.0.extend_from_slice(mac);
            w.str16("client name", name)?;
            w.0.extend_from_slice(&session.to_le_bytes());
            w.worker_address(worker_address)?;
        }
        Message::Welcome {
            mac,
            session,
            worker_address,
            metadata,
        } => {
            w.0.extend_from_slice(mac);
            w.0.extend_from_slice(&session.to_le_bytes());
            w.worker_address(worker_address)?;
            w.metadata(metadata)?;
        }
        Message::Refused { code, reason } => {
            w.0.push(*code as u8);
            // Reasons are ours; cut rather than fail (on a char boundary).
            let mut end = reason.len().min(MAX_NAME);
            while !reason.is_char_boundary(end) {
                end -= 1;
            }
            w.str16("refusal reason", &reason[..end])?;
        }
        Message::Metadata(m) => w.metadata(m)?,
        Message::Withdraw(ids) | Message::WithdrawAck(ids) => w.ids(ids)?,
        Message::Notify(b) => {
            notification_fits(b)?;
            w.0.extend_from_slice(&(b.len() as u32).to_le_bytes());
            w.0.extend_from_slice(b);
        }
        Message::Bye => {}
        Message::Writes {
            seq,
            region,
            records,
            data,
        } => {
            w.writes_head(*seq, *region, records, data.len())?;
            w.0.extend_from_slice(data);
        }
        Message::WritesAck { seq, status } => {
            w.0.extend_from_slice(&seq.to_le_bytes());
            match status {
                WritesStatus::Done => w.0.push(0),
                WritesStatus::NotExported => w.0.push(1),
                WritesStatus::Refused(e) => {
                    w.0.push(2);
                    let mut end = e.len().min(MAX_NAME);
                    while !e.is_char_boundary(end) {
                        end -= 1;
                    }
                    w.str16("writes refusal", &e[..end])?;
                }
            }
        }
    }
    w.finish(0)
}

/// Everything of a [`Message::Writes`] but its bytes: the frame and body up to the last
/// record, with the body length counting the `data_len` bytes the caller sends right after
/// (`gdpath_ucx::Endpoint::am_send_parts` reads them in place). The same checks and errors as
/// [`encode`], with `data_len` standing for the bytes.
pub fn encode_writes_head(
    seq: u64,
    region: u64,
    records: &[(u64, u32)],
    data_len: usize,
) -> Result<Vec<u8>, EncodeError> {
    encode_writes_head_after(Vec::new(), seq, region, records, data_len)
}

/// [`encode_writes_head`] appended to `prefix` (a routing id that goes before the frame), in
/// the same buffer.
pub fn encode_writes_head_after(
    prefix: Vec<u8>,
    seq: u64,
    region: u64,
    records: &[(u64, u32)],
    data_len: usize,
) -> Result<Vec<u8>, EncodeError> {
    let mut w = Writer::start_after(prefix, Kind::Writes);
    w.writes_head(seq, region, records, data_len)?;
    w.finish(data_len)
}

impl fmt::Display for WireKind {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            WireKind::Host => f.write_str("host"),
            WireKind::Gpu(o) => write!(f, "gpu:{o}"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn sample() -> Vec<Message> {
        let md = Metadata {
            name: "srv".into(),
            regions: vec![
                RegionMeta {
                    id: 7,
                    kind: WireKind::Host,
                    addr: 0x7f00_0000_0000,
                    len: 1 << 20,
                    rkey: vec![1, 2, 3],
                    ipc: None,
                    shm: None,
                },
                RegionMeta {
                    id: 9,
                    kind: WireKind::Gpu(1),
                    addr: 0x1000,
                    len: 4096,
                    rkey: vec![9; 300],
                    ipc: Some(IpcMeta {
                        host: [7; 16],
                        pci: "0000:00:06.0".into(),
                        handle: [0xa5; 64],
                        offset: 256,
                    }),
                    shm: None,
                },
                RegionMeta {
                    id: 11,
                    kind: WireKind::Host,
                    addr: 0x7e00_0000_0000,
                    len: 1 << 16,
                    rkey: vec![4; 40],
                    ipc: None,
                    shm: Some(ShmMeta {
                        host: [8; 16],
                        pid: 1234,
                        fd: 9,
                        dev: 0x1a,
                        ino: 77,
                        name: [0x5a; 16],
                        offset: 4096,
                    }),
                },
            ],
        };
        vec![
            Message::Challenge {
                server_nonce: [3; 32],
            },
            Message::Auth {
                client_nonce: [4; 32],
                mac: [5; 32],
                name: "client é".into(),
                session: 0x1234_5678_9abc_def0,
                worker_address: vec![0xa5; 300],
            },
            Message::Welcome {
                mac: [6; 32],
                session: 42,
                worker_address: vec![1],
                metadata: md.clone(),
            },
            Message::Refused {
                code: RefuseCode::BadToken,
                reason: "bad token".into(),
            },
            Message::Metadata(md),
            Message::Withdraw(vec![1, 2, 3]),
            Message::WithdrawAck(vec![]),
            Message::Notify(b"layer 3 done".to_vec()),
            Message::Bye,
            Message::Writes {
                seq: 7,
                region: 3,
                records: vec![(0, 4), (4096, 2), (8, 0)],
                data: b"abcdxy".to_vec().into(),
            },
            Message::WritesAck {
                seq: 7,
                status: WritesStatus::Done,
            },
            Message::WritesAck {
                seq: 8,
                status: WritesStatus::NotExported,
            },
            Message::WritesAck {
                seq: 9,
                status: WritesStatus::Refused("write past the end".into()),
            },
        ]
    }

    #[test]
    fn writes_head_and_owned_decode_match_the_whole_message() {
        let records = vec![(0, 4), (4096, 2), (8, 0)];
        let whole = encode(&Message::Writes {
            seq: 7,
            region: 3,
            records: records.clone(),
            data: b"abcdxy".to_vec().into(),
        })
        .unwrap();
        // The head followed by the bytes is the message, byte for byte.
        let mut split = encode_writes_head(7, 3, &records, 6).unwrap();
        split.extend_from_slice(b"abcdxy");
        assert_eq!(split, whole);
        // Decoding in place gives what decoding a copy gives, for every kind.
        for m in sample() {
            let b = encode(&m).unwrap();
            assert_eq!(decode_owned(b.clone()), Ok(m));
            assert_eq!(decode_owned(b.clone()), decode(&b));
        }
        assert_eq!(
            decode_owned(whole[..whole.len() - 1].to_vec()),
            decode(&whole[..whole.len() - 1])
        );
        // After a prefix, the same bytes follow it.
        let prefixed = encode_writes_head_after(vec![9; 8], 7, 3, &records, 6).unwrap();
        assert_eq!(&prefixed[..8], &[9; 8]);
        assert_eq!(&prefixed[8..], &whole[..whole.len() - 6]);
        // The head's own checks: the bytes must be what the records add up to, and fit.
        assert!(encode_writes_head(7, 3, &records, 5).is_err());
        let big = vec![(0, MAX_MESSAGE as u32)];
        assert!(encode_writes_head(7, 3, &big, MAX_MESSAGE).is_err());
    }

    #[test]
    fn writes_must_carry_exactly_their_bytes() {
        let m = |records: Vec<(u64, u32)>, data: &[u8]| Message::Writes {
            seq: 1,
            region: 1,
            records,
            data: data.to_vec().into(),
        };
        // The encoder refuses a mismatch of its own making.
        assert!(encode(&m(vec![(0, 4)], b"abc")).is_err());
        let good = encode(&m(vec![(0, 4)], b"abcd")).unwrap();
        // One byte more than the records say: trailing (the declared body length grows too).
        let mut b = good.clone();
        b.push(b'e');
        let body = (b.len() - HEADER_LEN) as u32;
        b[8..12].copy_from_slice(&body.to_le_bytes());
        assert_eq!(decode(&b), Err(DecodeError::Trailing(1)));
        // A length that claims more bytes than the message holds.
        let mut b = good.clone();
        let len_at = HEADER_LEN + 8 + 8 + 4 + 8;
        b[len_at..len_at + 4].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&b), Err(DecodeError::Truncated { .. })));
        // An offset that wraps around.
        let mut b = good.clone();
        let off_at = HEADER_LEN + 8 + 8 + 4;
        b[off_at..off_at + 8].copy_from_slice(&(u64::MAX - 1).to_le_bytes());
        assert!(matches!(decode(&b), Err(DecodeError::BadRegion { .. })));
        // More records than allowed.
        let mut b = good;
        let count_at = HEADER_LEN + 16;
        b[count_at..count_at + 4].copy_from_slice(&(MAX_WRITES as u32 + 1).to_le_bytes());
        assert!(matches!(decode(&b), Err(DecodeError::TooLarge { .. })));
        // An unknown acknowledgement status.
        let mut b = encode(&Message::WritesAck {
            seq: 1,
            status: WritesStatus::Done,
        })
        .unwrap();
        b[HEADER_LEN + 8] = 9;
        assert_eq!(decode(&b), Err(DecodeError::UnknownCode(9)));
    }

    #[test]
    fn a_stream_reader_bounds_the_body_before_reading_it() {
        for m in sample() {
            let b = encode(&m).unwrap();
            let head: [u8; HEADER_LEN] = b[..HEADER_LEN].try_into().unwrap();
            assert_eq!(body_len(&head, MAX_MESSAGE), Ok(b.len() - HEADER_LEN));
        }
        let mut head: [u8; HEADER_LEN] = encode(&Message::Bye).unwrap().try_into().unwrap();
        // A huge declared length is refused from the header alone, against the reader's bound.
        head[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            body_len(&head, MAX_MESSAGE),
            Err(DecodeError::TooLarge { what: "body", .. })
        ));
        head[8..12].copy_from_slice(&100u32.to_le_bytes());
        assert!(body_len(&head, 99).is_err());
        assert_eq!(body_len(&head, 100), Ok(100));
        // Garbage is refused by its magic, as decode refuses it.
        assert_eq!(
            body_len(&[0xff; HEADER_LEN], MAX_MESSAGE),
            Err(DecodeError::BadMagic([0xff; 4]))
        );
        assert!(matches!(
            body_len(&[0; HEADER_LEN], MAX_MESSAGE),
            Err(DecodeError::BadMagic(_))
        ));
    }

    #[test]
    fn a_message_after_a_routing_prefix_decodes_in_place() {
        for m in sample() {
            let mut b = 7u64.to_le_bytes().to_vec();
            b.extend_from_slice(&encode(&m).unwrap());
            assert_eq!(decode_owned_from(b, 8), Ok(m));
        }
        assert!(matches!(
            decode_owned_from(vec![1, 2, 3], 8),
            Err(DecodeError::Truncated { .. })
        ));
    }

    #[test]
    fn worker_addresses_are_bounded() {
        let auth = |worker_address: Vec<u8>| Message::Auth {
            client_nonce: [0; 32],
            mac: [0; 32],
            name: String::new(),
            session: 1,
            worker_address,
        };
        assert!(encode(&auth(vec![])).is_err());
        assert!(encode(&auth(vec![0; MAX_WORKER_ADDRESS + 1])).is_err());
        let good = encode(&auth(vec![9; 3])).unwrap();
        // The length field: past the limit, zero, or past the bytes present.
        let at = HEADER_LEN + 32 + 32 + 2 + 8;
        for (len, what) in [
            (MAX_WORKER_ADDRESS as u32 + 1, "too large"),
            (0, "empty"),
            (4, "truncated"),
        ] {
            let mut b = good.clone();
            b[at..at + 4].copy_from_slice(&len.to_le_bytes());
            assert!(decode(&b).is_err(), "{what}");
        }
    }

    #[test]
    fn round_trip_every_kind() {
        for m in sample() {
            let b = encode(&m).unwrap();
            assert_eq!(decode(&b).unwrap(), m);
        }
    }

    #[test]
    fn every_truncation_is_refused() {
        for m in sample() {
            let b = encode(&m).unwrap();
            for cut in 0..b.len() {
                assert!(decode(&b[..cut]).is_err(), "{:?} cut at {cut}", m.kind());
            }
        }
    }

    #[test]
    fn header_checks() {
        let good = encode(&Message::Withdraw(vec![1])).unwrap();
        let mut b = good.clone();
        b[0] = b'X';
        assert!(matches!(decode(&b), Err(DecodeError::BadMagic(_))));
        let mut b = good.clone();
        b[4] = 1;
        assert_eq!(decode(&b), Err(DecodeError::Version { got: 1 }));
        let mut b = good.clone();
        b[6] = 99;
        assert_eq!(decode(&b), Err(DecodeError::UnknownKind(99)));
        let mut b = good.clone();
        b[7] = 1;
        assert_eq!(decode(&b), Err(DecodeError::Flags(1)));
        let mut b = good.clone();
        b.push(0);
        assert!(matches!(decode(&b), Err(DecodeError::BodyLength { .. })));
    }

    #[test]
    fn counts_cannot_outrun_the_bytes() {
        // A withdraw claiming 4000 ids with none present must fail before allocating.
        let mut b = encode(&Message::Withdraw(vec![])).unwrap();
        b[12..16].copy_from_slice(&4000u32.to_le_bytes());
        assert!(matches!(decode(&b), Err(DecodeError::Truncated { .. })));
        b[12..16].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(decode(&b), Err(DecodeError::TooLarge { .. })));
    }

    fn with_region(g: RegionMeta) -> Vec<u8> {
        // Encode by hand to bypass the encoder's own limits.
        let mut body = vec![0u8, 0]; // empty name
        body.extend_from_slice(&1u32.to_le_bytes());
        body.extend_from_slice(&g.id.to_le_bytes());
        let (k, o) = match g.kind {
            WireKind::Host => (0u8, 0u32),
            WireKind::Gpu(o) => (1, o),
        };
        body.push(k);
        body.extend_from_slice(&o.to_le_bytes());
        body.extend_from_slice(&g.addr.to_le_bytes());
        body.extend_from_slice(&g.len.to_le_bytes());
        body.extend_from_slice(&(g.rkey.len() as u16).to_le_bytes());
        body.extend_from_slice(&g.rkey);
        match (&g.ipc, &g.shm) {
            (None, None) => body.push(0),
            (Some(i), _) => {
                body.push(1);
                body.extend_from_slice(&i.host);
                body.extend_from_slice(&(i.pci.len() as u16).to_le_bytes());
                body.extend_from_slice(i.pci.as_bytes());
                body.extend_from_slice(&i.handle);
                body.extend_from_slice(&i.offset.to_le_bytes());
            }
            (None, Some(m)) => {
                body.push(2);
                body.extend_from_slice(&m.host);
                body.extend_from_slice(&m.pid.to_le_bytes());
                body.extend_from_slice(&m.fd.to_le_bytes());
                body.extend_from_slice(&m.dev.to_le_bytes());
                body.extend_from_slice(&m.ino.to_le_bytes());
                body.extend_from_slice(&m.name);
                body.extend_from_slice(&m.offset.to_le_bytes());
            }
        }
        let mut b = MAGIC.to_vec();
        b.extend_from_slice(&VERSION.to_le_bytes());
        b.push(Kind::Metadata as u8);
        b.push(0);
        b.extend_from_slice(&(body.len() as u32).to_le_bytes());
        b.extend_from_slice(&body);
        b
    }

    #[test]
    fn region_fields_are_checked() {
        let ok = RegionMeta {
            id: 1,
            kind: WireKind::Host,
            addr: 4096,
            len: 4096,
            rkey: vec![1],
            ipc: None,
            shm: None,
        };
        assert!(decode(&with_region(ok.clone())).is_ok());
        let ipc = IpcMeta {
            host: [1; 16],
            pci: "0000:19:00.0".into(),
            handle: [2; 64],
            offset: 4096,
        };
        let gpu = RegionMeta {
            kind: WireKind::Gpu(0),
            ipc: Some(ipc.clone()),
            shm: None,
            ..ok.clone()
        };
        assert!(decode(&with_region(gpu.clone())).is_ok());
        let shm = ShmMeta {
            host: [3; 16],
            pid: 4242,
            fd: 7,
            dev: 5,
            ino: 99,
            name: [6; 16],
            offset: 8192,
        };
        let shared = RegionMeta {
            shm: Some(shm.clone()),
            ..ok.clone()
        };
        assert_eq!(
            decode(&with_region(shared.clone())).unwrap(),
            Message::Metadata(Metadata {
                name: String::new(),
                regions: vec![shared.clone()]
            })
        );
        // Both sharing records on one region cannot be encoded.
        assert!(encode(&Message::Metadata(Metadata {
            name: String::new(),
            regions: vec![RegionMeta {
                ipc: Some(ipc.clone()),
                ..shared.clone()
            }],
        }))
        .is_err());
        let bad = [
            // Shared host memory named for GPU memory; an offset that wraps with the length.
            RegionMeta {
                ipc: None,
                shm: Some(shm.clone()),
                ..gpu.clone()
            },
            RegionMeta {
                shm: Some(ShmMeta {
                    offset: u64::MAX - 100,
                    ..shm.clone()
                }),
                ..ok.clone()
            },
            RegionMeta {
                len: 0,
                ..ok.clone()
            },
            RegionMeta {
                addr: u64::MAX - 10,
                len: 11,
                ..ok.clone()
            },
            RegionMeta {
                rkey: vec![0; MAX_RKEY + 1],
                ..ok.clone()
            },
            // An IPC handle of host memory; an offset past the address.
            RegionMeta {
                ipc: Some(ipc.clone()),
                shm: None,
                ..ok.clone()
            },
            RegionMeta {
                ipc: Some(IpcMeta {
                    offset: 4097,
                    ..ipc.clone()
                }),
                shm: None,
                ..gpu.clone()
            },
        ];
        let long_pci = RegionMeta {
            ipc: Some(IpcMeta {
                pci: "x".repeat(MAX_PCI + 1),
                ..ipc.clone()
            }),
            shm: None,
            ..gpu.clone()
        };
        assert!(matches!(
            decode(&with_region(long_pci.clone())),
            Err(DecodeError::TooLarge { .. })
        ));
        assert!(encode(&Message::Metadata(Metadata {
            name: String::new(),
            regions: vec![long_pci],
        }))
        .is_err());
        for g in bad {
            assert!(
                matches!(
                    decode(&with_region(g.clone())),
                    Err(DecodeError::BadRegion { .. })
                ),
                "{g:?}"
            );
        }
        let mut b = with_region(ok.clone());
        b[12 + 2 + 4 + 8] = 7; // kind byte
        assert!(matches!(decode(&b), Err(DecodeError::BadRegion { .. })));
        let mut b = with_region(ok.clone());
        *b.last_mut().unwrap() = 3; // sharing presence byte (0, 1 or 2)
        assert!(matches!(decode(&b), Err(DecodeError::BadRegion { .. })));
        let dup = encode(&Message::Metadata(Metadata {
            name: String::new(),
            regions: vec![ok.clone(), ok],
        }))
        .unwrap();
        assert!(matches!(decode(&dup), Err(DecodeError::BadRegion { .. })));
    }

    #[test]
    fn encoder_refuses_over_limit_values() {
        let long = "x".repeat(MAX_NAME + 1);
        assert!(encode(&Message::Metadata(Metadata {
            name: long,
            regions: vec![]
        }))
        .is_err());
        assert!(encode(&Message::Notify(vec![0; MAX_NOTIFY + 1])).is_err());
        // Refusal reasons are cut, not refused.
        let r = encode(&Message::Refused {
            code: RefuseCode::Other,
            reason: "é".repeat(MAX_NAME),
        })
        .unwrap();
        assert!(decode(&r).is_ok());
    }

    #[test]
    fn bye_is_a_bare_header_and_refuses_a_body() {
        let b = encode(&Message::Bye).unwrap();
        assert_eq!(b.len(), HEADER_LEN);
        assert_eq!(b[6], Kind::Bye as u8);
        assert_eq!(&b[8..12], &[0; 4]);
        assert_eq!(decode(&b), Ok(Message::Bye));
        // A body, declared or not, is refused; so is a header cut short.
        let mut with_body = b.clone();
        with_body[8..12].copy_from_slice(&1u32.to_le_bytes());
        with_body.push(0);
        assert_eq!(decode(&with_body), Err(DecodeError::Trailing(1)));
        let mut undeclared = b.clone();
        undeclared.push(0);
        assert!(matches!(
            decode(&undeclared),
            Err(DecodeError::BodyLength { .. })
        ));
        let mut overdeclared = b.clone();
        overdeclared[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        assert!(matches!(
            decode(&overdeclared),
            Err(DecodeError::BodyLength { .. })
        ));
        for cut in 0..b.len() {
            assert!(decode(&b[..cut]).is_err(), "cut at {cut}");
        }
        // The next kind number is still unknown.
        let mut unknown = b;
        unknown[6] = Kind::WritesAck as u8 + 1;
        assert_eq!(
            decode(&unknown),
            Err(DecodeError::UnknownKind(Kind::WritesAck as u8 + 1))
        );
    }
}
