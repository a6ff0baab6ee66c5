//! Host memory of another process on this node, the host counterpart of CUDA IPC
//! ([`super::cuda::IpcImport`]).
//!
//! An exporter whose host region is a shared buffer ([`crate::HostBuffer::try_shared`]) adds
//! its name to the region's metadata ([`export_meta`]). An importer on the same node (same boot
//! id) keeps it with the remote region ([`ShmImport`], made by the network backend with the
//! remote region); the `host-copy` backend then moves host ↔ that region with `memcpy`, and the
//! `cuda` backend GPU ↔ that region with its copies and block copier (the mapping page-locked
//! once), instead of UCX. Where the memory cannot be mapped (another user's process, the
//! exporter gone before the first use) the backends refuse the pair and UCX takes it.
//!
//! Lifetime: the importer's mapping keeps the pages alive, so unlike a CUDA IPC mapping it may
//! outlive the exporter's buffer; a withdrawn export is refused by the engine like any
//! withdrawn remote region.

use crate::net::codec::ShmMeta;
use crate::os::mem::HostMem;
use crate::region::Region;
use std::sync::{Arc, OnceLock};

/// The shared-memory part of an exported host region's metadata, or `None` when the region
/// is not a shared buffer (or the boot id is unreadable).
pub(crate) fn export_meta(region: &Region) -> Option<ShmMeta> {
    let id = region.host_mem()?.shm_id()?;
    Some(ShmMeta {
        host: crate::os::boot_id()?,
        pid: id.pid,
        fd: id.fd,
        dev: id.dev,
        ino: id.ino,
        name: id.name,
        offset: 0,
    })
}

/// A peer's shared host region that this process can map: its name, where the range lies in
/// the peer's buffer, and the mapping (made on first use, kept while the import lives).
pub struct ShmImport {
    id: crate::os::ShmId,
    /// Bytes from the shared buffer's start to the range's.
    offset: u64,
    len: u64,
    mapped: OnceLock<Result<HostMem, String>>,
    /// The mapping page-locked by the `cuda` backend, on its first GPU pair.
    pub(crate) pinned: OnceLock<Result<Arc<super::cuda::memory::PinnedHandle>, String>>,
}

impl std::fmt::Debug for ShmImport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("ShmImport")
            .field("id", &self.id)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .finish()
    }
}

impl ShmImport {
    /// The import of `len` bytes `range_offset` bytes into the region `meta` names, when the
    /// exporter is on this node; `None` otherwise.
    pub(crate) fn from_meta(meta: &ShmMeta, range_offset: u64, len: u64) -> Option<Arc<Self>> {
        if crate::os::boot_id() != Some(meta.host) {
            return None;
        }
        Some(Arc::new(ShmImport {
            id: crate::os::ShmId {
                pid: meta.pid,
                fd: meta.fd,
                dev: meta.dev,
                ino: meta.ino,
                name: meta.name,
            },
            offset: meta.offset.checked_add(range_offset)?,
            len,
            mapped: OnceLock::new(),
            pinned: OnceLock::new(),
        }))
    }

    /// The range as host memory of this process (mapped on first use; a failure is kept, so
    /// each pair is refused at once after it).
    ///
    /// Errors: why the peer's memory cannot be mapped ([`crate::os::shm`]'s checks).
    pub(crate) fn mem(&self) -> Result<&HostMem, String> {
        self.mapped
            .get_or_init(|| {
                let r = crate::os::shm::map_peer(self.id, self.offset, self.len);
                if let Err(why) = &r {
                    // Once per import: its pairs go through UCX, much slower, from now on.
                    tracing::warn!(%why, "a peer's shared host memory cannot be mapped here; UCX moves its pairs");
                }
                r
            })
            .as_ref()
            .map_err(Clone::clone)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_from_another_node_are_not_made() {
        let meta = ShmMeta {
            host: [0xee; 16],
            pid: 1,
            fd: 3,
            dev: 1,
            ino: 2,
            name: [1; 16],
            offset: 0,
        };
        assert!(ShmImport::from_meta(&meta, 0, 10).is_none());
        if let Some(h) = crate::os::boot_id() {
            let here = ShmImport::from_meta(&ShmMeta { host: h, ..meta }, 4096, 10).unwrap();
            assert_eq!(here.offset, 4096);
            // pid 1's fd 3 is not a buffer of that name (or not ours to read).
            assert!(here.mem().is_err());
        }
    }
}
