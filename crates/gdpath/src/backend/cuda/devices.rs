//! The GPUs the backend drives: the loaded driver, one retained primary context per GPU (made
//! on first use), the driver facts that choose NVLink vs PCIe, peer access, and a pool of
//! streams per GPU.

use crate::path::DataPath;
use gdpath_cuda::{enable_peer_access, BlockCopier, BlockCopy, Context, Cuda, CudaError, Stream};
use gdpath_topo::facts::DriverFacts;
use std::collections::HashMap;
use std::sync::{Mutex, MutexGuard, OnceLock};

/// Whether P2P is possible for an ordered GPU pair, and over what ([`super::gpu_pair_path`]).
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum PeerLink {
    /// `cuDeviceCanAccessPeer` is 1 both ways: the P2P path (NVLink or PCIe).
    Possible(DataPath),
    /// Not possible; the text is the evidence (the driver call and its answer, or its error).
    Impossible(String),
}

pub(crate) struct Gpus {
    cuda: Cuda,
    count: u32,
    contexts: Vec<OnceLock<Result<Context, CudaError>>>,
    facts: OnceLock<Option<DriverFacts>>,
    links: Mutex<HashMap<(u32, u32), PeerLink>>,
    /// Pairs whose peer access has been enabled both ways (`Err`: enabling failed, with why).
    enabled: Mutex<HashMap<(u32, u32), Result<(), String>>>,
    streams: Vec<Mutex<Vec<Stream>>>,
    /// Block copiers per GPU (with their staging), pooled like the streams.
    copiers: Vec<Mutex<Vec<CopierSlot>>>,
    /// PCI address of each GPU, read once (for CUDA IPC imports).
    pci: OnceLock<Vec<Option<String>>>,
}

/// A block copier and the descriptor list it is given, kept together so that a steady stream
/// of lists allocates nothing.
pub(crate) struct CopierSlot {
    pub(crate) copier: BlockCopier,
    pub(crate) list: Vec<BlockCopy>,
}

fn lock<T>(m: &Mutex<T>) -> MutexGuard<'_, T> {
    m.lock().unwrap_or_else(|p| p.into_inner())
}

impl Gpus {
    /// Loads the driver and counts GPUs. Errors: the loader's ([`CudaError::LibraryMissing`]
    /// without libcuda), or the driver's.
    pub(crate) fn load() -> Result<Gpus, CudaError> {
        let cuda = Cuda::load()?;
        let count = cuda.device_count()?;
        Ok(Gpus {
            cuda,
            count,
            contexts: (0..count).map(|_| OnceLock::new()).collect(),
            facts: OnceLock::new(),
            links: Mutex::new(HashMap::new()),
            enabled: Mutex::new(HashMap::new()),
            streams: (0..count).map(|_| Mutex::new(Vec::new())).collect(),
            copiers: (0..count).map(|_| Mutex::new(Vec::new())).collect(),
            pci: OnceLock::new(),
        })
    }

    /// Number of GPUs visible (after `CUDA_VISIBLE_DEVICES`).
    pub(crate) fn count(&self) -> u32 {
        self.count
    }

    /// The retained primary context of GPU `ordinal`.
    pub(crate) fn context(&self, ordinal: u32) -> Result<Context, CudaError> {
        let Some(slot) = self.contexts.get(ordinal as usize) else {
            return Err(CudaError::NoSuchDevice {
                ordinal,
                count: self.count,
            });
        };
        slot.get_or_init(|| Context::new(&self.cuda, ordinal))
            .clone()
    }

    /// NVML + CUDA facts, read once (`None` when they could not be read at all).
    pub(crate) fn facts(&self) -> Option<&DriverFacts> {
        self.facts
            .get_or_init(|| match gdpath_cuda::gather_facts() {
                Ok(f) => Some(f),
                Err(e) => {
                    tracing::debug!(error = %e, "driver facts unavailable: P2P links count as PCIe");
                    None
                }
            })
            .as_ref()
    }

    /// Whether P2P is possible from `a` to `b` (both directions must allow access, since a
    /// bidirectional user and the copy engines need both mappings), and over how many NVLinks.
    pub(crate) fn peer_link(&self, a: u32, b: u32) -> PeerLink {
        if let Some(l) = lock(&self.links).get(&(a, b)) {
            return l.clone();
        }
        let link = self.probe_link(a, b);
        lock(&self.links).insert((a, b), link.clone());
        link
    }

    fn probe_link(&self, a: u32, b: u32) -> PeerLink {
        let devs = (self.cuda.device(a), self.cuda.device(b));
        let (da, db) = match devs {
            (Ok(da), Ok(db)) => (da, db),
            (Err(e), _) | (_, Err(e)) => return PeerLink::Impossible(e.to_string()),
        };
        let mut access = [None; 2];
        let mut refused = None;
        for (answer, (x, y)) in access.iter_mut().zip([(&da, &db), (&db, &da)]) {
            match x.can_access_peer(y) {
                Ok(ok) => *answer = Some(ok),
                Err(e) => return PeerLink::Impossible(e.to_string()),
            }
            if *answer == Some(false) && refused.is_none() {
                refused = Some(format!(
                    "cuDeviceCanAccessPeer(GPU {}, GPU {}) = 0",
                    x.ordinal(),
                    y.ordinal()
                ));
            }
        }
        let nvlinks = || self.facts().map(|f| f.nvlink_count(a, b)).unwrap_or(0);
        match super::gpu_pair_path(access, nvlinks) {
            Some(path @ (DataPath::P2pNvlink | DataPath::P2pPcie)) => PeerLink::Possible(path),
            // Staged: a direction answered 0, which `refused` names.
            _ => PeerLink::Impossible(refused.unwrap_or_default()),
        }
    }

    /// Enables peer access both ways between `a` and `b`, once per process (it stays enabled
    /// for the life of the primary contexts).
    pub(crate) fn ensure_peer_access(&self, a: u32, b: u32) -> Result<(), CudaError> {
        let key = (a.min(b), a.max(b));
        if let Some(r) = lock(&self.enabled).get(&key) {
            return r.clone().map_err(CudaError::InvalidArgument);
        }
        let (ca, cb) = (self.context(a)?, self.context(b)?);
        let r = enable_peer_access(&ca, &cb)
            .and_then(|_| enable_peer_access(&cb, &ca))
            .map(|_| ());
        lock(&self.enabled).insert(key, r.clone().map_err(|e| e.to_string()));
        r
    }

    /// A stream of GPU `ordinal` from the pool (made when the pool is empty); it goes back to
    /// the pool when the lease drops.
    pub(crate) fn stream(&self, ordinal: u32) -> Result<StreamLease<'_>, CudaError> {
        let pool = self
            .streams
            .get(ordinal as usize)
            .ok_or(CudaError::NoSuchDevice {
                ordinal,
                count: self.count,
            })?;
        let s = match lock(pool).pop() {
            Some(s) => s,
            None => Stream::new(&self.context(ordinal)?)?,
        };
        Ok(StreamLease {
            pool,
            stream: Some(s),
        })
    }
}

impl Gpus {
    /// A block copier of GPU `ordinal` from the pool (made when the pool is empty); back to
    /// the pool when the lease drops. One lock per lease, none per descriptor.
    pub(crate) fn copier(&self, ordinal: u32) -> Result<CopierLease<'_>, CudaError> {
        let pool = self
            .copiers
            .get(ordinal as usize)
            .ok_or(CudaError::NoSuchDevice {
                ordinal,
                count: self.count,
            })?;
        let slot = match lock(pool).pop() {
            Some(s) => s,
            None => CopierSlot {
                copier: BlockCopier::new(&self.context(ordinal)?),
                list: Vec::new(),
            },
        };
        Ok(CopierLease {
            pool,
            slot: Some(slot),
        })
    }

    /// The ordinal of the GPU at PCI address `pci` (sysfs form), if this process sees it.
    pub(crate) fn ordinal_of_pci(&self, pci: &str) -> Option<u32> {
        let all = self.pci.get_or_init(|| {
            (0..self.count)
                .map(|o| self.cuda.device(o).and_then(|d| d.pci_bus_id()).ok())
                .collect()
        });
        all.iter()
            .position(|p| p.as_deref().is_some_and(|p| p.eq_ignore_ascii_case(pci)))
            .map(|o| o as u32)
    }
}

/// A pooled block copier; see [`Gpus::copier`].
pub(crate) struct CopierLease<'a> {
    pool: &'a Mutex<Vec<CopierSlot>>,
    slot: Option<CopierSlot>,
}

impl std::ops::Deref for CopierLease<'_> {
    type Target = CopierSlot;
    fn deref(&self) -> &CopierSlot {
        self.slot.as_ref().expect("present until drop")
    }
}

impl std::ops::DerefMut for CopierLease<'_> {
    fn deref_mut(&mut self) -> &mut CopierSlot {
        self.slot.as_mut().expect("present until drop")
    }
}

impl Drop for CopierLease<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.slot.take() {
            lock(self.pool).push(s);
        }
    }
}

/// A pooled stream; see [`Gpus::stream`]. Returned to the pool on drop once idle (a stream whose
/// synchronize fails is dropped instead, which waits for it).
pub(crate) struct StreamLease<'a> {
    pool: &'a Mutex<Vec<Stream>>,
    stream: Option<Stream>,
}

impl std::ops::Deref for StreamLease<'_> {
    type Target = Stream;
    fn deref(&self) -> &Stream {
        self.stream.as_ref().expect("present until drop")
    }
}

impl Drop for StreamLease<'_> {
    fn drop(&mut self) {
        if let Some(s) = self.stream.take() {
            if s.synchronize().is_ok() {
                lock(self.pool).push(s);
            }
        }
    }
}
