//! GPU memory of another process on the same node, through CUDA IPC and the agent protocol.
//!
//! The exporting agent adds its GPU region's IPC handle to the region's metadata
//! ([`export_meta`]: `cuIpcGetMemHandle` of the allocation, the GPU's PCI address and the
//! node's boot id). An importing agent on the same node (same boot id) keeps it with the remote
//! region ([`IpcImport`], made by the network backend when the region is registered); the
//! `cuda` backend then plans GPU ↔ remote pairs and block lists on it and opens the handle once
//! per local GPU (`cuIpcOpenMemHandle`, in [`IpcImport::mapping`]), moving the bytes with its
//! own copies and block copier instead of UCX. Where the handle cannot be used (another node,
//! the exporter's own process, a GPU not visible here) the `cuda` backend refuses the pair and
//! the network backend takes it.
//!
//! Lifetime: the mapping is closed when the importing region and every copy using it are gone
//! (the CUDA rule: before the exporter frees the memory). The exporter keeps an unexported
//! region until its peers acknowledged the withdrawal; an importer must therefore drop its
//! remote region of a withdrawn export before acknowledging would free it (see
//! `docs/gpu.md`, "GPU memory of another process").

use super::devices::Gpus;
use super::memory::gpu_buffer;
use crate::net::codec::IpcMeta;
use crate::os::boot_id as host_id;
use crate::region::Region;
use gdpath_cuda::{DeviceBuffer, IpcMemHandle};
use std::sync::{Arc, Mutex};

/// The IPC part of an exported GPU region's metadata, or `None` (with the reason logged) when
/// the region cannot be shared so: not GPU memory, not the start of its allocation (a
/// `GpuPointer` inside a larger one), a driver without IPC, an unreadable boot id.
pub(crate) fn export_meta(region: &Region) -> Option<IpcMeta> {
    let buf = gpu_buffer(region)?;
    let made = (|| {
        let host = host_id().ok_or_else(|| "no boot id".to_owned())?;
        let handle = IpcMemHandle::export(buf).map_err(|e| e.to_string())?;
        let pci = buf
            .context()
            .device()
            .pci_bus_id()
            .map_err(|e| e.to_string())?;
        Ok::<_, String>(IpcMeta {
            host,
            pci,
            handle: handle.to_bytes(),
            offset: 0,
        })
    })();
    match made {
        Ok(m) => Some(m),
        Err(why) => {
            tracing::debug!(region = %region.id(), %why, "exported without a CUDA IPC handle");
            None
        }
    }
}

/// A mapping opened in one GPU's context, or why it could not be.
type Opened = Result<Arc<DeviceBuffer>, String>;

/// A peer's GPU region that this process can map: its handle, where the region lies in the
/// mapping, and the mappings opened so far (one per local GPU).
pub struct IpcImport {
    handle: IpcMemHandle,
    /// Bytes from the allocation's start to the region's.
    offset: u64,
    len: u64,
    pci: String,
    opened: Mutex<Vec<(u32, Opened)>>,
}

impl std::fmt::Debug for IpcImport {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("IpcImport")
            .field("handle", &self.handle)
            .field("offset", &self.offset)
            .field("len", &self.len)
            .field("pci", &self.pci)
            .finish()
    }
}

impl IpcImport {
    /// The import of `len` bytes `range_offset` bytes into the range `meta` names, when the
    /// exporter is on this node; `None` otherwise.
    pub(crate) fn from_meta(meta: &IpcMeta, range_offset: u64, len: u64) -> Option<Arc<Self>> {
        if host_id() != Some(meta.host) {
            return None;
        }
        Some(Arc::new(IpcImport {
            handle: IpcMemHandle::from_bytes(meta.handle),
            offset: meta.offset.checked_add(range_offset)?,
            len,
            pci: meta.pci.clone(),
            opened: Mutex::new(Vec::new()),
        }))
    }

    /// PCI address of the exporter's GPU.
    pub(crate) fn pci(&self) -> &str {
        &self.pci
    }

    /// The mapping in GPU `ordinal`'s context (opened on first use, kept while this import
    /// lives) and the byte offset of the region in it.
    ///
    /// Errors: the driver's refusal as text (`CUDA_ERROR_INVALID_CONTEXT` in the exporter's own
    /// process), or a mapping shorter than the region.
    pub(crate) fn mapping(
        &self,
        gpus: &Gpus,
        ordinal: u32,
    ) -> Result<(Arc<DeviceBuffer>, u64), String> {
        let mut opened = self.opened.lock().unwrap_or_else(|p| p.into_inner());
        let r = match opened.iter().find(|(o, _)| *o == ordinal) {
            Some((_, r)) => r.clone(),
            None => {
                let r = gpus
                    .context(ordinal)
                    .and_then(|ctx| self.handle.open(&ctx))
                    .map_err(|e| format!("cuIpcOpenMemHandle on GPU {ordinal}: {e}"))
                    .and_then(|buf| {
                        let end = self.offset.saturating_add(self.len);
                        if end > buf.len() as u64 {
                            Err(format!(
                                "the IPC mapping holds {} bytes, the region ends at {end}",
                                buf.len()
                            ))
                        } else {
                            Ok(Arc::new(buf))
                        }
                    });
                opened.push((ordinal, r.clone()));
                r
            }
        };
        r.map(|b| (b, self.offset))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn imports_from_another_node_are_not_made() {
        let meta = IpcMeta {
            host: [0xee; 16],
            pci: "0000:00:06.0".into(),
            handle: [1; 64],
            offset: 0,
        };
        assert!(IpcImport::from_meta(&meta, 0, 10).is_none());
        if let Some(h) = host_id() {
            let here = IpcImport::from_meta(&IpcMeta { host: h, ..meta }, 4096, 10).unwrap();
            assert_eq!((here.offset, here.pci()), (4096, "0000:00:06.0"));
        }
    }
}
