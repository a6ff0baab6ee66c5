//! One connection to a peer agent as the UCX backend holds it: its endpoint (made from the peer's
//! worker address once it authenticated), its control connection (TCP, the handshake's, kept
//! open as the connection's liveness), its protocol state ([`protocol::Conn`]), and what the
//! data path needs to know of it (the regions made from the peer's, the transports its lanes
//! use, whether host writes to it are packed).

use super::lock;
use super::tcp::{FrameReader, ReadError};
use crate::error::Error;
use crate::net::codec::RegionMeta;
use crate::net::protocol::{self, Role};
use crate::path::DataPath;
use crate::region::{Region, RegionInner};
use gdpath_ucx::{Endpoint, MemType, Request};
use std::io::ErrorKind;
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex, Weak};

/// What one connection's lock guards.
pub(crate) struct Link {
    /// The protocol state.
    pub(crate) proto: protocol::Conn,
    /// This agent's regions made from the peer's regions, to mark when they are withdrawn.
    tracked: Vec<(u64, Weak<RegionInner>)>,
    /// The UCX transport(s) of put/get on host memory, as `DataPath::Ucx { transport }` names them.
    transport: Arc<str>,
    /// Host memory moves over tcp, where every UCX put is a message with an acknowledgement:
    /// host writes of at most this many bytes go as this agent's own packed `Writes` messages
    /// instead (`packed`, [`crate::net::pack_limit`]); 0: none.
    pack_max: u64,
    /// The planned path of GPU memory ([`PeerConn::planned_path`]), from the endpoint's lanes.
    gpu_path: DataPath,
    /// Client closing: the goodbye flush, until it completed and `Bye` went (or the connection
    /// ended, when it is kept until UCX ends it: dropping a pending request waits for it).
    pub(crate) goodbye: Option<Request>,
}

impl Link {
    /// True while a local region made from one of the peer's regions is alive (a transfer in
    /// flight on the connection holds its regions).
    pub(crate) fn has_live_regions(&self) -> bool {
        self.tracked.iter().any(|(_, w)| w.strong_count() > 0)
    }
}

/// One connection to a peer agent.
pub(crate) struct PeerConn {
    pub(crate) id: u64,
    pub(crate) ep: Endpoint,
    pub(crate) role: Role,
    pub(crate) addr: Option<SocketAddr>,
    /// The id the peer puts at the head of what it sends this connection over UCX.
    pub(crate) session: u64,
    /// The id this side puts at the head of what it sends the peer over UCX (little endian).
    pub(crate) route: [u8; 8],
    /// The control connection: a client's own stream, which its progress rounds read for the
    /// peer's end ([`PeerConn::read_control`]); a server's duplicate of the stream its control
    /// thread reads. Shut down when the connection ends, so that the peer sees the end at once.
    ctl: Option<TcpStream>,
    /// A client's reader of `ctl`.
    ctl_reader: Mutex<FrameReader>,
    /// Client: the last `Peer` handle was dropped while regions made from the peer's were
    /// still alive; the goodbye is said once they are gone (`UcxBackend::reap_peers`).
    pub(crate) released: AtomicBool,
    pub(crate) inner: Mutex<Link>,
    /// Counts the connection in the engine's connected-peers gauge while it lives.
    _open: crate::metrics::PeerOpen,
}

impl std::fmt::Debug for PeerConn {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("PeerConn")
            .field("id", &self.id)
            .field("label", &self.label())
            .field("role", &self.role)
            .finish()
    }
}

/// The GPU path of [`PeerConn::planned_path`] for an endpoint whose lanes use `lanes`
/// (transport names, all memory types).
pub(crate) fn gpu_path_of(lanes: &[String]) -> DataPath {
    if let Some(t) = super::RDMA_TRANSPORTS
        .iter()
        .find(|t| lanes.iter().any(|l| l == *t))
    {
        return DataPath::Gdr {
            transport: (*t).into(),
        };
    }
    let mut names: Vec<&str> = lanes.iter().map(String::as_str).collect();
    names.sort_unstable();
    names.dedup();
    DataPath::Ucx {
        transport: if names.is_empty() {
            "unknown".into()
        } else {
            names.join("+").into()
        },
    }
}

impl PeerConn {
    /// A connection whose peer authenticated (`proto` knows the id to put on what goes to it),
    /// its endpoint `ep` and its control connection `ctl`.
    pub(crate) fn new(ep: Endpoint, proto: protocol::Conn, ctl: Option<TcpStream>) -> Self {
        PeerConn {
            id: proto.id(),
            ep,
            role: proto.role(),
            addr: proto.addr(),
            session: proto.session(),
            route: proto.peer_session().unwrap_or(0).to_le_bytes(),
            ctl,
            ctl_reader: Mutex::new(FrameReader::new(super::tcp::MAX_SERVER_READ)),
            released: AtomicBool::new(false),
            inner: Mutex::new(Link {
                proto,
                tracked: Vec::new(),
                transport: "unknown".into(),
                pack_max: 0,
                gpu_path: gpu_path_of(&[]),
                goodbye: None,
            }),
            _open: crate::metrics::PeerOpen::new(),
        }
    }

    /// `name@address` once authenticated, the address before.
    pub(crate) fn label(&self) -> String {
        lock(&self.inner).proto.label().to_owned()
    }

    /// Why the connection is unusable, if it is.
    pub(crate) fn failure(&self) -> Option<String> {
        self.failure_in(&lock(&self.inner))
    }

    fn failure_in(&self, g: &Link) -> Option<String> {
        g.proto
            .failure()
            .or_else(|| self.ep.failure().map(super::ep_failure))
    }

    /// The planned path of a pair between local memory and this peer, or why the connection is
    /// unusable ([`PeerConn::failure`]); one lock for both answers, as the planner asks for
    /// every run of pairs.
    ///
    /// - Host memory (`gpu` false; also GPU memory staged through host buffers): `Ucx` with
    ///   the endpoint's transport.
    /// - GPU memory UCX moves itself (CUDA-enabled UCX), before UCX has chosen a protocol:
    ///   `Gdr { transport }` when the endpoint has an RDMA lane (the NIC would read or write
    ///   GPU memory), else `Ucx` with every transport of the endpoint's lanes joined with `+`
    ///   (e.g. `cma+cuda_ipc+posix+sysv`): the candidates, not a claim. Once an operation runs,
    ///   `ops` replaces it with what UCX says it chose (`ucp_request_query`;
    ///   `docs/network.md`).
    pub(crate) fn planned_path(&self, gpu: bool) -> std::result::Result<DataPath, String> {
        let g = lock(&self.inner);
        if let Some(why) = self.failure_in(&g) {
            return Err(why);
        }
        Ok(if gpu {
            g.gpu_path.clone()
        } else {
            DataPath::Ucx {
                transport: g.transport.clone(),
            }
        })
    }

    /// Sets what the endpoint's lanes say, once connected.
    pub(crate) fn set_paths(&self, transport: String, pack_max: u64, gpu_path: DataPath) {
        let mut g = lock(&self.inner);
        g.transport = transport.into();
        g.pack_max = pack_max;
        g.gpu_path = gpu_path;
    }

    /// Whether host writes to this peer go as packed `Writes` messages: the longest pair that
    /// does, and the transport name their path reports.
    pub(crate) fn packed_writes(&self) -> Option<(u64, Arc<str>)> {
        let g = lock(&self.inner);
        (g.pack_max > 0).then(|| (g.pack_max, g.transport.clone()))
    }

    /// Authenticated, open, and its endpoint healthy.
    pub(crate) fn is_ready(&self) -> bool {
        lock(&self.inner).proto.is_ready() && self.ep.failure().is_none()
    }

    /// The UCX transport(s) of put/get on host memory, as `DataPath::Ucx { transport }` names them.
    pub(crate) fn transport(&self) -> Arc<str> {
        lock(&self.inner).transport.clone()
    }

    /// The regions the peer exports, as its last metadata listed them (withdrawn ones
    /// included).
    pub(crate) fn metadata(&self) -> Vec<RegionMeta> {
        lock(&self.inner).proto.metadata().to_vec()
    }

    /// The regions the peer exports, withdrawn ones left out.
    pub(crate) fn live_regions(&self) -> Vec<RegionMeta> {
        let g = lock(&self.inner);
        g.proto
            .metadata()
            .iter()
            .filter(|m| !g.proto.is_withdrawn(m.id))
            .cloned()
            .collect()
    }

    pub(crate) fn is_withdrawn(&self, id: u64) -> bool {
        lock(&self.inner).proto.is_withdrawn(id)
    }

    /// Remembers a local region made from the peer's region `id` (marked deregistered when the
    /// peer withdraws it; at once if it already did).
    pub(crate) fn track(&self, id: u64, region: &Region) {
        let mut g = lock(&self.inner);
        if g.proto.is_withdrawn(id) {
            region.mark_withdrawn();
        }
        g.tracked.retain(|(_, w)| w.strong_count() > 0);
        g.tracked.push((id, region.downgrade()));
    }

    /// Marks the local regions made from the peer's regions `ids` withdrawn: posts on them
    /// fail with [`Error::Deregistered`] from now on.
    pub(crate) fn mark_withdrawn(&self, ids: &[u64]) {
        let g = lock(&self.inner);
        for (id, w) in &g.tracked {
            if ids.contains(id) {
                if let Some(r) = Region::upgrade(w) {
                    r.mark_withdrawn();
                }
            }
        }
    }

    /// The error the connection failed with, if it did.
    pub(crate) fn failed_error(&self) -> Option<Error> {
        lock(&self.inner).proto.error().cloned().map(Error::from)
    }

    /// The error for work on a connection that is unusable ([`PeerConn::failure`]): the one it
    /// failed with as it is (its text names the peer already), else `PeerFailed` saying why.
    pub(crate) fn unusable(&self) -> Option<Error> {
        let why = self.failure()?;
        Some(self.failed_error().unwrap_or_else(|| Error::PeerFailed {
            peer: self.label(),
            detail: why,
        }))
    }

    /// Reads what arrived on a client's control connection (non-blocking): the frames, or why
    /// the connection is over (the peer closed it: it went away).
    pub(crate) fn read_control(&self) -> std::result::Result<Vec<Vec<u8>>, String> {
        let Some(mut s) = self.ctl.as_ref() else {
            return Ok(Vec::new());
        };
        let mut r = lock(&self.ctl_reader);
        let mut frames = Vec::new();
        loop {
            match r.read(&mut s) {
                Ok(Some(f)) => frames.push(f),
                Ok(None) => return Ok(frames),
                Err(ReadError::Closed(how)) => {
                    return Err(format!(
                        "the peer went away (it closed the control connection: {how})"
                    ))
                }
                Err(e) => return Err(format!("the control connection failed: {e}")),
            }
        }
    }

    /// Why a client's control connection is over (the peer closed it, or it failed), seen
    /// without reading what arrived on it: paths that move bytes to the peer without UCX (its
    /// shared memory) check it before they plan, as UCX's progress would otherwise notice.
    pub(crate) fn control_gone(&self) -> Option<String> {
        if self.role != Role::Client {
            return None;
        }
        let s = self.ctl.as_ref()?;
        // Non-blocking (set when the connection was made): WouldBlock is a live, quiet peer.
        match s.peek(&mut [0u8; 1]) {
            Ok(0) => Some("the peer went away (it closed the control connection)".into()),
            Ok(_) => None,
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::Interrupted) => None,
            Err(e) => Some(format!("the control connection failed: {e}")),
        }
    }

    /// Shuts the control connection down (the connection is over).
    pub(crate) fn shutdown_control(&self) {
        if let Some(s) = &self.ctl {
            let _ = s.shutdown(Shutdown::Both);
        }
    }

    /// Client: the last `Peer` handle is gone (see [`PeerConn::released`]).
    pub(crate) fn mark_released(&self) {
        self.released.store(true, Ordering::Release);
    }

    pub(crate) fn is_released(&self) -> bool {
        self.released.load(Ordering::Acquire)
    }
}

/// The transport(s) UCX uses for put/get of `mem` on `ep`, for `DataPath::Ucx { transport }`:
/// distinct transport names of the RMA lanes (or of the active-message lanes UCX emulates RMA
/// with, as over `tcp`), joined with `+`; `unknown` if UCX does not say.
pub(crate) fn rma_transport_name(ep: &Endpoint, mem: MemType) -> String {
    match ep.rma_transports(mem) {
        Ok(t) => {
            let mut names: Vec<String> = Vec::new();
            for l in t.lanes {
                if !names.contains(&l.transport) {
                    names.push(l.transport);
                }
            }
            if names.is_empty() {
                "unknown".into()
            } else {
                names.join("+")
            }
        }
        Err(e) => {
            tracing::debug!("rma transports: {e}");
            "unknown".into()
        }
    }
}
