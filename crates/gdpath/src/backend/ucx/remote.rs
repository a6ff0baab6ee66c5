//! A peer's exported region, registered with this agent as [`Memory::Remote`].
//!
//! A [`RemoteMemory`] is accepted only when it lies inside a region the peer listed in its
//! metadata with the same packed rkey: an application cannot make the backend post to an
//! address or with a key the peer did not hand out. Every access is checked again against the
//! range by `gdpath_ucx::RemoteRegion::check` before it is posted.

use super::conn::PeerConn;
use super::{lock, UcxBackend};
use crate::error::{Error, Result};
use crate::memory::RemoteMemory;
use crate::net::codec::WireKind;
use crate::net::protocol::Role;
use crate::region::{ForeignMemory, Region};
use gdpath_ucx::{PackedRkey, RegionDesc, RemoteRegion};
use std::any::Any;
use std::fmt;
use std::sync::Arc;

/// A range of a peer's exported region, with its rkey unpacked on the peer's endpoint.
pub(crate) struct RemoteMem {
    pub(crate) peer: Arc<PeerConn>,
    /// The exporting agent's id of the region.
    pub(crate) region_id: u64,
    /// What the exporter says the memory is.
    pub(crate) kind: WireKind,
    /// Where this range starts inside the exported region, bytes (a `RemoteMemory` may be a
    /// sub-range of an export): offsets of packed writes are relative to the export.
    pub(crate) base_off: u64,
    pub(crate) remote: RemoteRegion,
    /// The exporter's CUDA IPC handle of this range, when it sent one and is on this node: the
    /// `cuda` backend then moves GPU ↔ this region itself.
    pub(crate) ipc: Option<Arc<crate::backend::cuda::IpcImport>>,
    /// The exporter's shared host memory of this range, when it sent its name and is on this
    /// node: the `host-copy` and `cuda` backends then move bytes to and from it themselves.
    pub(crate) shm: Option<Arc<crate::backend::shm::ShmImport>>,
}

/// The CUDA IPC import of a remote region, if it has one (for the `cuda` backend's planning).
pub(crate) fn ipc_import(region: &Region) -> Option<&crate::backend::cuda::IpcImport> {
    region
        .foreign()?
        .as_any()
        .downcast_ref::<RemoteMem>()?
        .ipc
        .as_deref()
}

/// The shared-memory import of a remote region: `None` when it has none; the error once its
/// peer's connection failed (its control connection is read for that here: nothing else
/// progresses UCX on this path) or the region was withdrawn (the backends' planning refuses it, so
/// UCX takes new pairs and reports that as for any peer; a pair planned before fails with it).
pub(crate) fn shm_import(
    region: &Region,
) -> Option<std::result::Result<&crate::backend::shm::ShmImport, Error>> {
    let rm = region.foreign()?.as_any().downcast_ref::<RemoteMem>()?;
    let imp = rm.shm.as_deref()?;
    if rm.withdrawn() {
        return Some(Err(Error::Deregistered {
            region: region.id(),
        }));
    }
    if let Some(e) = rm.peer.failed_error() {
        return Some(Err(e));
    }
    if let Some(detail) = rm.peer.control_gone() {
        return Some(Err(Error::PeerFailed {
            peer: rm.peer.label(),
            detail,
        }));
    }
    Some(Ok(imp))
}

impl fmt::Debug for RemoteMem {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("RemoteMem")
            .field("peer", &self.peer.label())
            .field("region", &self.region_id)
            .field("kind", &self.kind)
            .field("addr", &format_args!("{:#x}", self.remote.base))
            .field("len", &self.remote.len)
            .finish()
    }
}

impl ForeignMemory for RemoteMem {
    fn len(&self) -> u64 {
        self.remote.len
    }
    fn as_any(&self) -> &dyn Any {
        self
    }
}

impl RemoteMem {
    /// Remembers the local region made from this memory, so that a withdrawal marks it.
    pub(crate) fn track(&self, region: &Region) {
        self.peer.track(self.region_id, region);
    }

    /// True once the peer withdrew the region.
    pub(crate) fn withdrawn(&self) -> bool {
        self.peer.is_withdrawn(self.region_id)
    }
}

impl UcxBackend {
    /// Validates `r` against the metadata of the connected peer it names and unpacks its key.
    ///
    /// Errors: [`Error::PeerFailed`] (no ready connection to that agent),
    /// [`Error::Config`] (zero length, or not inside an exported region with that key),
    /// [`Error::Deregistered`]-like refusal as [`Error::Config`] when the peer withdrew it,
    /// [`Error::Ucx`] when UCX refuses the key.
    pub(crate) fn materialize_remote(&self, r: &RemoteMemory) -> Result<Box<dyn ForeignMemory>> {
        if r.len == 0 {
            return Err(Error::Config(format!(
                "remote memory of agent {} has length 0",
                r.agent
            )));
        }
        // Find the region under the state lock, unpack its key outside it: binding a CUDA
        // context for a GPU region may create one (hundreds of ms) and must not stall progress.
        let found = {
            let st = lock(&self.state);
            let peers: Vec<&Arc<PeerConn>> = st
                .peers
                .iter()
                .filter(|p| p.role == Role::Client && p.label() == r.agent)
                .collect();
            if peers.is_empty() {
                return Err(Error::PeerFailed {
                    peer: r.agent.clone(),
                    detail: "no connection to this agent (Agent::connect first)".into(),
                });
            }
            let end = r.addr.checked_add(r.len);
            peers.into_iter().filter(|p| p.is_ready()).find_map(|p| {
                p.metadata()
                    .into_iter()
                    .find(|m| {
                        m.rkey == r.rkey
                            && r.addr >= m.addr
                            && end.is_some_and(|e| {
                                m.addr.checked_add(m.len).is_some_and(|me| e <= me)
                            })
                    })
                    .map(|m| (p.clone(), m))
            })
        };
        if let Some((p, m)) = found {
            if p.is_withdrawn(m.id) {
                return Err(Error::Config(format!(
                    "region {} of agent {} was withdrawn by its owner",
                    m.id, r.agent
                )));
            }
            let desc = RegionDesc {
                base: r.addr,
                len: r.len,
                rkey: PackedRkey(r.rkey.clone()),
            };
            if m.kind != WireKind::Host {
                self.bind_cuda();
            }
            let remote = RemoteRegion::new(&p.ep, &desc).map_err(|source| Error::Ucx {
                op: "ucp_ep_rkey_unpack",
                source,
            })?;
            let ipc = m.ipc.as_ref().and_then(|i| {
                crate::backend::cuda::IpcImport::from_meta(i, r.addr - m.addr, r.len)
            });
            let shm = m
                .shm
                .as_ref()
                .filter(|_| self.cfg.shared_memory)
                .and_then(|s| crate::backend::shm::ShmImport::from_meta(s, r.addr - m.addr, r.len));
            return Ok(Box::new(RemoteMem {
                peer: p,
                region_id: m.id,
                kind: m.kind,
                base_off: r.addr - m.addr,
                remote,
                ipc,
                shm,
            }));
        }
        Err(Error::Config(format!(
            "remote memory {:#x}+{} is not inside a region agent {} exports with this key",
            r.addr, r.len, r.agent
        )))
    }
}
