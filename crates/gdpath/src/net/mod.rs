//! Remote memory between agents: serve, export, connect, read and write a peer's regions.
//!
//! ```no_run
//! use gdpath::{Agent, AgentConfig, HostBuffer, Memory, TransferRequest};
//! use gdpath::net::Token;
//!
//! // Serving side: export one region, listen on loopback (no token needed there).
//! let server = Agent::new(AgentConfig::default())?;
//! let buf = server.register(Memory::host(HostBuffer::zeroed(1 << 20)))?;
//! server.export(&buf)?;
//! let srv = server.serve("127.0.0.1:0".parse()?, Token::none())?;
//!
//! // Client side: connect (handshake and metadata over gdpath's TCP connection, then UCX to the
//! // server's worker), register the peer's
//! // region as remote memory, write into it with a notification.
//! let client = Agent::new(AgentConfig::default())?;
//! let peer = client.connect(srv.local_addr())?;
//! let id = peer.regions()[0].id;
//! let remote = client.register(peer.memory(id)?)?;
//! let local = client.register(Memory::host(HostBuffer::from_slice(&[7; 4096])))?;
//! let report = client
//!     .post(TransferRequest::write(vec![local.desc(0, 4096)], vec![remote.desc(0, 4096)]).notify(*b"done"))?
//!     .wait()?;
//! println!("{}", report.pairs[0].path); // e.g. ucx:tcp
//! # Ok::<(), Box<dyn std::error::Error>>(())
//! ```
//!
//! Protocol and checks: [`codec`] (wire format, every field bounds-checked), [`auth`] (mutual
//! HMAC-SHA256 over nonces; the token never crosses the wire) and [`protocol`] (the state
//! machine of a connection, without I/O), re-exported from the `gdpath-wire` crate with the
//! types a connection reports ([`NetEvent`], [`Notification`]). See `docs/network.md`.

pub use gdpath_wire::{auth, codec, protocol};

pub use auth::{Token, MIN_TOKEN_LEN};
pub use devices_error::DevicesError;
pub use events::EventLog;
pub use gdpath_wire::{Error as WireError, EventKind, NetEvent, Notification};
pub use peer::{Peer, Server};

pub(crate) mod devices;
mod devices_error;
mod events;
mod peer;

#[cfg(doc)]
use crate::error::Error;
use crate::error::Result;
use codec::WireKind;
use gdpath_ucx::ErrorMode;
use std::time::Duration;

/// How connections learn that a peer died (UCX error handling mode).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum FailureMode {
    /// UCX peer error handling (`UCP_ERR_HANDLING_MODE_PEER`): a killed or unreachable peer
    /// fails the transfers that touch it with [`Error::PeerFailed`] within milliseconds
    /// (measured: `docs/ucx.md`). UCX then excludes shared-memory transports, so two agents of
    /// one host talk over `tcp`, far slower than shared memory (docs/ucx.md, "Quick figures").
    #[default]
    Detect,
    /// No peer error handling (`UCP_ERR_HANDLING_MODE_NONE`): UCX may use shared memory
    /// (`posix`, `sysv`, `cma`), but a dead peer ends transfers only through the request
    /// deadline or [`NetConfig::op_timeout`].
    FastLocal,
}

impl FailureMode {
    pub(crate) fn ucx(self) -> ErrorMode {
        match self {
            FailureMode::Detect => ErrorMode::Peer,
            FailureMode::FastLocal => ErrorMode::None,
        }
    }
}

/// When a put (a write to a peer's memory) counts as complete.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub enum PutCompletion {
    /// When an endpoint flush confirmed the bytes are in the peer's memory (one flush round
    /// trip per batch, coalesced across batches in flight). `Transfer::wait` returning means
    /// the peer can read the data.
    #[default]
    Remote,
    /// When UCX is done with the local buffer (it may be reused); the bytes may still be on
    /// their way. Confirm them with [`Peer::flush`] (or any later transfer with remote
    /// completion, or a notification, which always flushes first). What `ucx_perftest
    /// -t ucp_put_bw` measures; over tcp, where UCX emulates RMA, each flush is a round trip,
    /// which remote completion pays per transfer (docs/benchmarks.md, "Network: host ↔ host
    /// over tcp and shared memory", the one-pair-per-transfer row).
    /// Packed writes (host writes over tcp up to [`pack_limit`], when every pair of a request
    /// is one; docs/network.md) complete when the peer acknowledged them, in either mode.
    Local,
}

/// Network backend settings.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NetConfig {
    /// Dead-peer detection versus shared memory; see [`FailureMode`].
    pub failure_mode: FailureMode,
    /// `UCX_TLS` (e.g. `tcp`); `None` lets UCX choose.
    pub transports: Option<String>,
    /// `UCX_NET_DEVICES` (e.g. `lo`, `veth0`, `eth0,mlx5_0:1`). `None` (the default): the
    /// engine chooses, unless the environment sets `UCX_NET_DEVICES`: UCX's tcp transport
    /// listens only on the interface that carries the first [`Agent::serve`](crate::Agent::serve)'s address (the
    /// loopback interface for a loopback address; every interface for `0.0.0.0` or `::`), or,
    /// for an agent that connects first, the interface its connection left from; other
    /// network devices (RDMA) stay. A later serve or connect that needs another interface is
    /// [`Error::NetDevices`]; name every interface then (docs/network.md, "UCX's own port").
    pub devices: Option<String>,
    /// Bound on a handshake, both sides (default 10 s).
    pub connect_timeout: Duration,
    /// A batch of descriptor pairs that has not completed after this long fails with
    /// [`Error::PeerFailed`] (default 60 s; zero: no bound). This is how
    /// [`FailureMode::FastLocal`] detects a dead peer when the request has no deadline.
    pub op_timeout: Duration,
    /// Most connected peers a serving agent accepts (default 256); more are refused.
    pub max_peers: usize,
    /// How long one `Transfer::wait`/`poll` progress call keeps polling UCX while operations
    /// are in flight and none completed (default 1 ms), like UCX's own busy-polling: without it
    /// a small put's latency includes the waiter's sleep between polls (docs/benchmarks.md,
    /// "Measurements behind the defaults", `NetConfig::poll_spin`). Zero polls once.
    pub poll_spin: Duration,
    /// When puts complete (default [`PutCompletion::Remote`]).
    pub put_completion: PutCompletion,
    /// Send host writes to peers reached over tcp as packed writes, up to [`pack_limit`]
    /// (default `true`; docs/network.md, "Packed writes over tcp"); `false` keeps one UCX put
    /// per pair.
    pub pack_writes: bool,
    /// When this agent serves, raise glibc's trim threshold to 64 MiB and its mmap threshold to
    /// 4 MiB (`mallopt`, process-wide, each unless the environment sets it:
    /// `MALLOC_TRIM_THRESHOLD_`, `MALLOC_MMAP_THRESHOLD_`, `GLIBC_TUNABLES`), so that the
    /// allocation UCX makes per received packed-writes message is not given back to the kernel
    /// and faulted in again per message, which cost packed writes of 64 KiB and more about half
    /// their rate at glibc's defaults (docs/benchmarks.md, "Measurements behind the defaults",
    /// `TRIM_THRESHOLD` / `MMAP_THRESHOLD`). Default `true`; no effect elsewhere than glibc.
    pub keep_freed_memory: bool,
    /// Move bytes to and from a peer's shared host region on this node
    /// ([`crate::HostBuffer::try_shared`], what `gdpath serve --export host:SIZE` exports)
    /// without UCX: `memcpy` from host memory, the `cuda` backend's copies and block copier
    /// from GPU memory, straight into the peer's pages (default `true`; docs/network.md, "Host
    /// memory of another process"). `false` leaves every remote pair to UCX (what `gdpath bench
    /// net` measures).
    pub shared_memory: bool,
}

impl Default for NetConfig {
    fn default() -> Self {
        NetConfig {
            failure_mode: FailureMode::Detect,
            transports: None,
            devices: None,
            connect_timeout: Duration::from_secs(10),
            op_timeout: Duration::from_secs(60),
            max_peers: 256,
            poll_spin: Duration::from_millis(1),
            put_completion: PutCompletion::Remote,
            pack_writes: true,
            keep_freed_memory: true,
            shared_memory: true,
        }
    }
}

/// Options of [`Agent::connect_with`](crate::Agent::connect_with).
#[derive(Debug, Clone)]
pub struct ConnectOptions {
    /// The server's token ([`Token::none`] for a loopback server without one).
    pub token: Token,
    /// Bound on connection and handshake (default 10 s).
    pub timeout: Duration,
}

impl Default for ConnectOptions {
    fn default() -> Self {
        ConnectOptions {
            token: Token::none(),
            timeout: Duration::from_secs(10),
        }
    }
}

/// A region a peer exports, as its metadata lists it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RemoteRegionInfo {
    /// The exporter's id of the region.
    pub id: u64,
    /// Host or GPU memory, as the exporter declares it.
    pub kind: WireKind,
    /// Length in bytes.
    pub len: u64,
    /// The exporter shares it with agents of its node as a sealed memfd (host memory from
    /// [`crate::HostBuffer::try_shared`]): such an agent maps it and moves the bytes itself
    /// ([`NetConfig::shared_memory`]) instead of going through UCX.
    pub shm: bool,
    /// The exporter hands agents of its node a CUDA IPC handle of it (GPU memory at the start
    /// of its allocation, a driver with IPC): such an agent opens it and copies with the
    /// `cuda` backend instead of going through UCX.
    pub cuda_ipc: bool,
}

impl RemoteRegionInfo {
    /// What a peer learns of a region from its metadata entry `m`.
    pub(crate) fn of(m: &codec::RegionMeta) -> RemoteRegionInfo {
        RemoteRegionInfo {
            id: m.id,
            kind: m.kind,
            len: m.len,
            shm: m.shm.is_some(),
            cuda_ipc: m.ipc.is_some(),
        }
    }
}

/// UCX says only "not connected" / "reset" / "unreachable" when a connection to a worker
/// fails: the usual causes among this side's own choices, for a failed UCX wireup.
pub(crate) fn wireup_hint(cfg: &NetConfig) -> String {
    let mode = match cfg.failure_mode {
        FailureMode::FastLocal => "fast-local (--fast-local, fast_local=True in Python)",
        FailureMode::Detect => "peer error detection (no fast-local)",
    };
    let mut limits = Vec::new();
    if let Some(d) = &cfg.devices {
        limits.push(format!("devices {d}"));
    }
    if let Some(t) = &cfg.transports {
        limits.push(format!("transports {t}"));
    }
    let limits = if limits.is_empty() {
        String::new()
    } else {
        format!(
            "; this side limits UCX to {}, which may not reach it",
            limits.join(" and ")
        )
    };
    format!("both sides must use the same failure mode: this side uses {mode}{limits}")
}

/// Most control messages a peer queues before it drops them: a sender keeps at most this many
/// messages (packed writes, notifications) in flight to one peer, or waits for answers that
/// never come.
pub const MAX_MESSAGES_IN_FLIGHT: usize = gdpath_ucx::AM_MAX_QUEUED;

/// The longest pair packed over tcp with UCX `version`, given the environment's
/// `UCX_PROTO_ENABLE` (`proto`): every length before 1.16, whose tcp put is slow at every size
/// (and from 1.16 on with `UCX_PROTO_ENABLE=n`); 8 KiB from 1.16 on, where UCX's new protocol
/// infrastructure (on by default) puts longer pairs faster than packing (docs/benchmarks.md,
/// "Measurements behind the defaults", `pack_limit`). A connection packs when
/// [`NetConfig::pack_writes`] is on and host memory moves over tcp; `u64::MAX` means every
/// length. Versions 1.14 and 1.15 were not measured and are taken as 1.13.
pub fn pack_limit(version: gdpath_ucx::UcxVersion, proto: Option<&str>) -> u64 {
    // The values UCX's own boolean parser accepts (it refuses others at start-up).
    let new_protocols = match proto.map(str::to_ascii_lowercase).as_deref() {
        Some("n" | "no" | "0") => false,
        Some("y" | "yes" | "1") => true,
        _ => (version.major, version.minor) >= (1, 16),
    };
    if new_protocols && (version.major, version.minor) >= (1, 16) {
        PACK_FAST_PUT_MAX
    } else {
        u64::MAX
    }
}

/// The longest pair packed where UCX's own put is fast ([`pack_limit`]).
const PACK_FAST_PUT_MAX: u64 = 8 << 10;

/// [`pack_limit`] for the UCX this process loads (`gdpath_ucx::Ucx::load`, which honours
/// `GDPATH_UCX_LIB`) and its `UCX_PROTO_ENABLE`. Errors: UCX cannot be loaded.
pub fn packed_write_max() -> Result<u64, gdpath_ucx::UcxError> {
    let ucx = gdpath_ucx::Ucx::load()?;
    let proto = std::env::var("UCX_PROTO_ENABLE").ok();
    Ok(pack_limit(ucx.version(), proto.as_deref()))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pack_limit_follows_what_ucx_own_put_does() {
        let v = |minor| gdpath_ucx::UcxVersion {
            major: 1,
            minor,
            release: 0,
        };
        // UCX 1.13: its put is slow over tcp whatever the protocols; everything packs.
        assert_eq!(pack_limit(v(13), None), u64::MAX);
        assert_eq!(pack_limit(v(13), Some("y")), u64::MAX);
        // From 1.16 the new protocols are on by default, and UCX's put wins above 8 KiB.
        assert_eq!(pack_limit(v(16), None), PACK_FAST_PUT_MAX);
        assert_eq!(pack_limit(v(22), Some("Yes")), PACK_FAST_PUT_MAX);
        assert_eq!(pack_limit(v(22), Some("maybe")), PACK_FAST_PUT_MAX);
        // Turned off, 1.16 puts slowly again.
        assert_eq!(pack_limit(v(16), Some("n")), u64::MAX);
        assert_eq!(pack_limit(v(16), Some("NO")), u64::MAX);
        assert_eq!(pack_limit(v(16), Some("0")), u64::MAX);
    }
}
