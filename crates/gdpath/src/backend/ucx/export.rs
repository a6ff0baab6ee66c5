//! Regions this agent exposes to its peers: what the protocol's export table
//! ([`crate::net::protocol::Exports`]) lists, backed here by the region and its UCX
//! registration, held until the protocol releases them.
//!
//! Only regions passed to `Agent::export` are listed in the metadata peers receive; every other
//! region stays invisible (no rkey for it ever leaves the process). Unexporting tells every
//! authenticated peer and keeps the region (its memory and UCX registration) alive until each
//! of them acknowledged that its operations on it completed, or disconnected
//! ([`crate::net::protocol::Action::Release`]): memory is never freed under a peer's transfer in
//! flight.

use super::{lock, State, UcxBackend};
use crate::error::{Error, Result};
use crate::memory::MemoryKind;
use crate::net::codec::{self, Message, RegionMeta, WireKind};
use crate::region::Region;
use gdpath_ucx::MemHandle;

/// An exported region, or one withdrawn and still held for a peer.
pub(crate) struct Held {
    /// The region's UCX registration; packed writes copy into its host mapping through it.
    /// Declared before `region` so that it is unmapped before the region (perhaps its last
    /// holder) frees the memory: fields drop in declaration order.
    pub(crate) mem: MemHandle,
    pub(crate) region: Region,
    /// Length of the mapping in bytes, as the metadata lists it.
    pub(crate) len: u64,
}

/// The protocol released export `id`: no peer can use it any more.
pub(crate) fn release(st: &mut State, id: u64) {
    if let Some(h) = st.held.remove(&id) {
        tracing::debug!(region = id, "withdrawn region released ({:?})", h.region);
    }
}

impl UcxBackend {
    /// Exports `region`: peers see it in their metadata (now, and a metadata update goes to
    /// those already connected) and may read and write it. Returns the id peers know it by.
    /// Before the first serve or connect, which makes the UCX context, the region waits to be
    /// published then ([`UcxBackend::core_for`]); an error of publishing it is that call's.
    pub(crate) fn export(&self, region: &Region) -> Result<u64> {
        if region.inner.agent != self.agent_id {
            return Err(Error::ForeignRegion {
                region: region.id(),
            });
        }
        region.check_usable()?;
        let kind = match region.kind() {
            MemoryKind::Host { .. } => WireKind::Host,
            MemoryKind::Gpu { ordinal } if self.cuda => WireKind::Gpu(*ordinal),
            MemoryKind::Gpu { .. } => {
                return Err(Error::Unsupported {
                    what: format!(
                        "exporting GPU memory with UCX {}, which has no CUDA support [{}]",
                        self.ucx.version_string(),
                        crate::finding::ids::GDR_UCX_NO_CUDA
                    ),
                    backend: "ucx (CUDA-enabled, e.g. the libucx-cu13 wheel)",
                })
            }
            other => {
                return Err(Error::Unsupported {
                    what: format!("exporting {other} memory"),
                    backend: "ucx",
                })
            }
        };
        let id = region.id().0;
        if self.core().is_none() {
            let mut st = lock(&self.state);
            // Checked again under the lock: the core may have been made (and the pending
            // exports published) since.
            if self.core().is_none() {
                st.pending_exports.insert(id, (region.clone(), kind));
                return Ok(id);
            }
        }
        self.publish(region, kind, false)?;
        Ok(id)
    }

    /// Publishes the regions exported before the UCX context was made, in id order; one that
    /// fails stays pending with those after it. Threads may run it at once (a serve and a
    /// connect): each region is claimed from the pending list where it enters the export
    /// table, under one lock, so it is published once, and one withdrawn meanwhile not at all.
    pub(crate) fn publish_pending(&self) -> Result<()> {
        loop {
            let next = lock(&self.state)
                .pending_exports
                .first_key_value()
                .map(|(_, (r, k))| (r.clone(), *k));
            let Some((region, kind)) = next else {
                return Ok(());
            };
            self.publish(&region, kind, true)?;
        }
    }

    /// Maps `region`, packs its rkey and lists it in the export table (see [`export`]), taking
    /// it off the pending list in the same locked step. `from_pending`: publish it only if it
    /// is still pending (another thread may have published it, or `unexport` withdrawn it,
    /// since it was read there); the mapping made is then dropped unused.
    fn publish(&self, region: &Region, kind: WireKind, from_pending: bool) -> Result<()> {
        let mem = self.local_mem(region)?;
        let rkey = mem
            .pack_rkey()
            .map_err(|source| Error::Ucx {
                op: "ucp_rkey_pack",
                source,
            })?
            .0;
        let id = region.id().0;
        let meta = RegionMeta {
            id,
            kind,
            addr: mem.addr(),
            len: mem.len() as u64,
            rkey,
            ipc: crate::backend::cuda::ipc_export_meta(region),
            shm: crate::backend::shm::export_meta(region),
        };
        let len = meta.len;
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        let pending = st.pending_exports.remove(&id);
        if from_pending && pending.is_none() {
            return Ok(());
        }
        // A failure leaves it pending, as it was.
        let keep_pending = |st: &mut State| {
            if let Some(p) = pending.clone() {
                st.pending_exports.insert(id, p);
            }
        };
        if let Err(e) = st.node.exports.add(meta) {
            keep_pending(st);
            return Err(Error::Config(e));
        }
        let md = st.node.exports.metadata(&self.agent_name);
        if let Err(e) = codec::encode(&Message::Metadata(md.clone())) {
            st.node.exports.remove(id);
            keep_pending(st);
            return Err(Error::ProtocolLimit(e));
        }
        st.held.insert(
            id,
            Held {
                region: region.clone(),
                mem,
                len,
            },
        );
        self.for_each_client(st, |c, _, out| c.send_metadata(md.clone(), out));
        Ok(())
    }

    /// What peers learn of exported `region`: its published metadata entry, or for one
    /// waiting for the UCX context, the entry it will be published with. Errors:
    /// [`Error::ForeignRegion`], [`Error::Config`] when it is not exported.
    pub(crate) fn export_info(&self, region: &Region) -> Result<crate::net::RemoteRegionInfo> {
        if region.inner.agent != self.agent_id {
            return Err(Error::ForeignRegion {
                region: region.id(),
            });
        }
        let id = region.id().0;
        let kind = {
            let st = lock(&self.state);
            if let Some(m) = st.node.exports.get(id) {
                return Ok(crate::net::RemoteRegionInfo::of(m));
            }
            match st.pending_exports.get(&id) {
                Some((_, kind)) => *kind,
                None => {
                    return Err(Error::Config(format!(
                        "region {} is not exported",
                        region.id()
                    )))
                }
            }
        };
        Ok(crate::net::RemoteRegionInfo {
            id,
            kind,
            len: region.len()?,
            // The functions `publish` fills the entry with.
            shm: crate::backend::shm::export_meta(region).is_some(),
            cuda_ipc: crate::backend::cuda::ipc_export_meta(region).is_some(),
        })
    }

    /// Withdraws an exported region (see the module docs). Errors: [`Error::Config`] when it
    /// is not exported.
    pub(crate) fn unexport(&self, region: &Region) -> Result<()> {
        let id = region.id().0;
        let mut guard = lock(&self.state);
        let st = &mut *guard;
        // Never published: no peer saw it.
        if st.pending_exports.remove(&id).is_some() {
            return Ok(());
        }
        if st.node.exports.get(id).is_none() {
            return Err(Error::Config(format!(
                "region {} is not exported",
                region.id()
            )));
        }
        // Peers still in the handshake never saw it; peers that failed cannot use it.
        let now = std::time::Instant::now();
        let told = self.for_each_client(st, |c, _, out| c.withdraw(vec![id], now, out));
        let mut out = Vec::new();
        st.node.exports.withdraw(id, told, &mut out);
        for a in out {
            if let crate::net::protocol::Action::Release(id) = a {
                release(st, id);
            }
        }
        Ok(())
    }

    /// True when `region` is exported (or being withdrawn, or waiting to be published) by this
    /// agent.
    pub(crate) fn is_exported(&self, region: &Region) -> bool {
        let st = lock(&self.state);
        let id = region.id().0;
        st.pending_exports.contains_key(&id) || st.node.exports.holds(id)
    }
}
