//! Loading a checkpoint onto a GPU: validate, allocate once, read once on the fastest path.

use super::{CheckpointError, Dtype, Header, LoadPlan};
use crate::backend::cuda::gpu_buffer;
use crate::error::Error;
use crate::finding::FindingId;
use crate::memory::{FileSpec, Memory};
use crate::path::Path;
use crate::region::Region;
use crate::transfer::TransferRequest;
use crate::Agent;
use std::time::{Duration, Instant};

/// O_DIRECT / cuFile alignment the load plan uses (bytes).
pub const LOAD_ALIGN: u64 = 4096;

/// Why a load failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// The file is not a valid safetensors checkpoint (nothing was allocated on the GPU).
    #[error("{path}: {error}")]
    Checkpoint {
        path: std::path::PathBuf,
        #[source]
        error: CheckpointError,
    },
    /// Registration, allocation or the transfer failed (the allocation is freed again).
    #[error("{path}: {error}")]
    Engine {
        path: std::path::PathBuf,
        #[source]
        error: Box<Error>,
    },
}

impl LoadError {
    /// The error's kind for scripts: [`CheckpointError::kind`] for a malformed file, the
    /// engine's [`Error::kind`] for the rest.
    pub fn kind(&self) -> &'static str {
        match self {
            LoadError::Checkpoint { error, .. } => error.kind(),
            LoadError::Engine { error, .. } => error.kind(),
        }
    }
}

/// One tensor on the GPU.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedTensor {
    pub name: String,
    pub dtype: Dtype,
    pub shape: Vec<u64>,
    /// Absolute byte range in the file.
    pub file_range: std::ops::Range<u64>,
    /// Device address (`CUdeviceptr`) of the tensor's first byte, valid while
    /// [`LoadedCheckpoint::region`] lives.
    pub device_ptr: u64,
    /// Offset in the allocation (bytes).
    pub offset: u64,
}

impl LoadedTensor {
    /// Length in bytes.
    pub fn bytes(&self) -> u64 {
        self.file_range.end - self.file_range.start
    }
}

/// A checkpoint on a GPU: one allocation holding every tensor.
#[derive(Debug)]
pub struct LoadedCheckpoint {
    /// The GPU allocation (`Memory::Gpu`); dropping every handle frees it.
    pub region: Region,
    /// Tensors in file order.
    pub tensors: Vec<LoadedTensor>,
    /// Tensor bytes (the data section).
    pub tensor_bytes: u64,
    /// Bytes read from the file (the data section plus the aligned lead-in).
    pub read_bytes: u64,
    /// The path that moved the bytes (`gds-native`, `posix-direct`, ...).
    pub path: Path,
    /// Why the preferred path was not taken (e.g. `gds.handle-register-failed`).
    pub finding: Option<FindingId>,
    /// The planner's evidence for `finding`.
    pub detail: Option<String>,
    /// Wall time from opening the file to the last byte on the GPU (header, allocation,
    /// registration and transfer).
    pub elapsed: Duration,
    /// Time of the transfer alone (first I/O to last completion).
    pub transfer: Duration,
}

impl LoadedCheckpoint {
    /// Tensor bytes per second of [`LoadedCheckpoint::elapsed`], in GB/s (1e9 B/s).
    pub fn gbps(&self) -> f64 {
        crate::units::gbps(self.tensor_bytes, self.elapsed)
    }
}

/// Loads the safetensors checkpoint at `file` onto GPU `gpu`: validates the header (before any
/// GPU memory is allocated), allocates one buffer, reads every tensor with one transfer on the
/// path the planner picks (GDS where cuFile can, else the staged O_DIRECT path, else buffered),
/// and returns each tensor's device pointer, dtype, shape and byte range.
///
/// Errors: [`LoadError::Checkpoint`] for a malformed file (see [`CheckpointError`]);
/// [`LoadError::Engine`] for registration (`Error::Unsupported` without a GPU), allocation and
/// transfer failures — the allocation is freed before returning.
pub fn load(
    agent: &Agent,
    file: &std::path::Path,
    gpu: u32,
) -> Result<LoadedCheckpoint, LoadError> {
    let t0 = Instant::now();
    let header = Header::read(file).map_err(|error| LoadError::Checkpoint {
        path: file.to_owned(),
        error,
    })?;
    let plan = LoadPlan::new(&header, LOAD_ALIGN);
    let eng = |error: Error| LoadError::Engine {
        path: file.to_owned(),
        error: Box::new(error),
    };
    let f = agent
        .register(Memory::File(FileSpec::read(file)))
        .map_err(eng)?;
    let region = agent
        .register(Memory::Gpu {
            ordinal: gpu,
            len: plan.read_len,
        })
        .map_err(eng)?;
    let report = agent
        .post(TransferRequest::read(
            vec![region.desc(0, plan.read_len)],
            vec![f.desc(plan.read_offset, plan.read_len)],
        ))
        .map_err(eng)?
        .wait()
        .map_err(|e| eng(e.error))?;
    let elapsed = t0.elapsed();
    let base = gpu_buffer(&region)
        .ok_or_else(|| {
            eng(Error::Backend {
                backend: "cuda",
                detail: "the checkpoint region has no device buffer".into(),
            })
        })?
        .device_ptr();
    let tensors = plan
        .tensors
        .iter()
        .map(|t| LoadedTensor {
            name: t.entry.name.clone(),
            dtype: t.entry.dtype,
            shape: t.entry.shape.clone(),
            file_range: t.entry.file_range.clone(),
            device_ptr: base + t.offset,
            offset: t.offset,
        })
        .collect();
    let pair = &report.pairs[0];
    let detail = agent
        .plan(&TransferRequest::read(
            vec![region.desc(0, plan.read_len)],
            vec![f.desc(plan.read_offset, plan.read_len)],
        ))
        .ok()
        .and_then(|p| p.into_iter().next())
        .and_then(|p| p.detail);
    Ok(LoadedCheckpoint {
        region,
        tensors,
        tensor_bytes: plan.tensor_bytes,
        read_bytes: plan.read_len,
        path: pair.path.clone(),
        finding: pair.finding.clone(),
        detail,
        elapsed,
        transfer: report.elapsed,
    })
}
