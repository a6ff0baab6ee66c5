//! Regions this agent exposes to its peers, and their withdrawal.
//!
//! Only regions passed to `Agent::export` are listed in the metadata peers receive; every other
//! region stays invisible (no rkey for it ever leaves the process). Unexporting sends a withdraw
//! to every authenticated peer and keeps the region (its memory and UCX registration) alive
//! until each of them acknowledged that its operations on it completed, or disconnected: memory
//! is never freed under a peer's transfer in flight.

use super::peer::Role;
use super::{lock, UcxBackend};
use crate::error::{Error, Result};
use crate::memory::MemoryKind;
use crate::net::codec::{self, Message, Metadata, RegionMeta, WireKind, WritesStatus};
use crate::region::Region;
use gdpath_ucx::MemHandle;
use std::collections::{BTreeMap, HashSet};

/// An exported region.
pub(crate) struct Export {
    region: Region,
    mem: MemHandle,
    meta: RegionMeta,
}

/// A region being withdrawn: alive until the peers in `waiting` acknowledged.
struct Retiring {
    id: u64,
    region: Region,
    waiting: HashSet<u64>,
}

#[derive(Default)]
pub(crate) struct Exports {
    live: BTreeMap<u64, Export>,
    retiring: Vec<Retiring>,
}

impl Exports {
    /// True while `region` is exported or waiting for withdraw acknowledgements.
    pub(crate) fn holds(&self, region: &Region) -> bool {
        let id = region.id().0;
        self.live.contains_key(&id) || self.retiring.iter().any(|r| r.id == id)
    }

    /// This agent's metadata: its name and the live exports.
    pub(crate) fn metadata(&self, name: &str) -> Metadata {
        Metadata {
            name: name.chars().take(codec::AGENT_NAME_CHARS).collect(),
            regions: self.live.values().map(|e| e.meta.clone()).collect(),
        }
    }

    /// Copies a peer's writes ([`Message::Writes`]) into live export `region`: every write is
    /// checked against the region's length before any byte is copied, so a refused message
    /// changes nothing. Like a UCX put into the region, the copy takes no local guard: an
    /// exported region is there to be written by peers. The answer: done; the region not
    /// exported (or being withdrawn); refused with the reason (GPU memory, which peers move
    /// with UCX itself; a write past the region's end; bytes that do not match the writes).
    pub(crate) fn apply_writes(
        &self,
        region: u64,
        records: &[(u64, u32)],
        data: &[u8],
    ) -> WritesStatus {
        match self.try_apply_writes(region, records, data) {
            Ok(()) => WritesStatus::Done,
            Err(None) => WritesStatus::NotExported,
            Err(Some(why)) => WritesStatus::Refused(why),
        }
    }

    /// [`Exports::apply_writes`]: `Err(None)` for a region not exported.
    fn try_apply_writes(
        &self,
        region: u64,
        records: &[(u64, u32)],
        data: &[u8],
    ) -> std::result::Result<(), Option<String>> {
        let total: u64 = records.iter().map(|&(_, l)| u64::from(l)).sum();
        if total != data.len() as u64 {
            return Err(Some(format!(
                "the writes add up to {total} bytes and {} came",
                data.len()
            )));
        }
        let e = self.live.get(&region).ok_or(None)?;
        if e.meta.kind != WireKind::Host {
            return Err(Some(format!(
                "region {region} is {} memory: packed writes are for host memory",
                e.meta.kind
            )));
        }
        for &(off, len) in records {
            if off
                .checked_add(len.into())
                .is_none_or(|end| end > e.meta.len)
            {
                return Err(Some(format!(
                    "write at {off} of {len} bytes is past the end of region {region} ({} bytes)",
                    e.meta.len
                )));
            }
        }
        // The owner may hold a host view of the region (`&mut [u8]`): no copy under it.
        let _in_use = e
            .region
            .begin_use()
            .map_err(|err| Some(format!("region {region} is busy here: {err}")))?;
        let mut at = 0usize;
        for &(off, len) in records {
            let len = len as usize;
            let src = &data[at..at + len];
            // Into the export's host mapping (`meta.addr`), alive while the export is live; the
            // range was checked against `meta.len` above; no host view is out (the use guard
            // above). Peers' UCX puts may write the same bytes meanwhile, as into any export.
            e.mem
                .write(off as usize, src)
                .map_err(|err| Some(format!("region {region}: {err}")))?;
            at += len;
        }
        Ok(())
    }

    /// Peer `peer` acknowledged the withdrawal of `ids`.
    pub(crate) fn acked(&mut self, peer: u64, ids: &[u64]) {
        for r in &mut self.retiring {
            if ids.contains(&r.id) {
                r.waiting.remove(&peer);
            }
        }
        self.release();
    }

    /// Peer `peer` is gone: nothing of it can be in flight any more.
    pub(crate) fn peer_gone(&mut self, peer: u64) {
        for r in &mut self.retiring {
            r.waiting.remove(&peer);
        }
        self.release();
    }

    fn release(&mut self) {
        self.retiring.retain(|r| {
            if r.waiting.is_empty() {
                tracing::debug!(region = r.id, "withdrawn region released ({:?})", r.region);
            }
            !r.waiting.is_empty()
        });
    }

    /// Regions waiting for acknowledgements.
    pub(crate) fn retiring(&self) -> usize {
        self.retiring.len()
    }
}

impl UcxBackend {
    /// Exports `region`: peers see it in their metadata (now, and a metadata update goes to
    /// those already connected) and may read and write it. Returns the id peers know it by.
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
                        self.ctx.ucx().version_string(),
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
        };
        let mut st = lock(&self.state);
        if st.exports.holds(region) {
            return Err(Error::Config(format!(
                "region {} is already exported",
                region.id()
            )));
        }
        st.exports.live.insert(
            id,
            Export {
                region: region.clone(),
                mem,
                meta,
            },
        );
        let md = st.exports.metadata(&self.agent_name);
        if let Err(e) = crate::net::codec::encode(&Message::Metadata(md.clone())) {
            st.exports.live.remove(&id);
            return Err(Error::Config(format!("cannot export region {id}: {e}")));
        }
        self.broadcast(&mut st, &Message::Metadata(md));
        Ok(id)
    }

    /// Withdraws an exported region (see the module docs). Errors: [`Error::Config`] when it
    /// is not exported.
    pub(crate) fn unexport(&self, region: &Region) -> Result<()> {
        let id = region.id().0;
        let mut st = lock(&self.state);
        let Some(e) = st.exports.live.remove(&id) else {
            return Err(Error::Config(format!(
                "region {} is not exported",
                region.id()
            )));
        };
        let reached = self.broadcast(&mut st, &Message::Withdraw(vec![id]));
        // Peers still in the handshake never saw it; peers that failed cannot use it.
        let waiting: HashSet<u64> = reached
            .into_iter()
            .filter(|pid| {
                st.peers
                    .iter()
                    .any(|p| p.id == *pid && p.role == Role::Server)
            })
            .collect();
        if !waiting.is_empty() {
            st.exports.retiring.push(Retiring {
                id,
                region: e.region.clone(),
                waiting,
            });
        }
        Ok(())
    }
}
