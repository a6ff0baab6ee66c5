//! Loading a checkpoint: validate every header, allocate once (on a GPU or in host memory), read
//! every file with one transfer on the fastest path.

use super::{CheckpointError, CheckpointPlan, Dtype, Header, Index};
use gdpath::backend::cuda::gpu_buffer;
use gdpath::error::Error;
use gdpath::finding::FindingId;
use gdpath::memory::{FileSpec, HostBuffer, Memory};
use gdpath::path::DataPath;
use gdpath::Agent;
use gdpath::Region;
use gdpath::{PairReport, TransferRequest};
use std::path::PathBuf;
use std::time::{Duration, Instant};

/// O_DIRECT / cuFile alignment the load plan uses (bytes).
pub const LOAD_ALIGN: u64 = 4096;

/// How long [`super::LoadSetup::settle_after_free`] waits between freeing one GPU load and
/// timing the next (`gdpath load --repeat`): copies to the GPU that overlap the driver's work on
/// a freed multi-GB allocation run slower, so a load timed at once would be charged the previous
/// one's clean-up (docs/benchmarks.md, "Measurements behind the defaults", the
/// `SETTLE_AFTER_FREE` row).
pub const SETTLE_AFTER_FREE: Duration = Duration::from_secs(1);

/// Why a load failed.
#[derive(Debug, Clone, thiserror::Error)]
pub enum LoadError {
    /// The file is not a valid safetensors checkpoint (nothing was allocated on the GPU).
    #[error("{}: {error}", gdpath_text::escape(.path))]
    Checkpoint {
        /// The file that failed the checks.
        path: std::path::PathBuf,
        /// What is wrong with it.
        #[source]
        error: CheckpointError,
    },
    /// Registration, allocation or the transfer failed (the allocation is freed again).
    #[error("{}: {error}", gdpath_text::escape(.path))]
    Engine {
        /// The checkpoint file being loaded.
        path: std::path::PathBuf,
        /// The engine's error, with its kind.
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

/// Where a checkpoint is loaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Destination {
    /// One allocation on the GPU with this CUDA ordinal (`Memory::Gpu`; needs the CUDA backend).
    Gpu(u32),
    /// One host allocation ([`HostBuffer`], 4 KiB-aligned, so O_DIRECT reads land in place);
    /// `pinned` page-locks it (needs the CUDA backend).
    Host {
        /// Page-lock the allocation (`cuMemHostRegister`) so copies to a GPU skip a bounce
        /// buffer.
        pinned: bool,
    },
}

/// One tensor in the loaded allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadedTensor {
    /// The name the header gives it.
    pub name: String,
    /// Its element type.
    pub dtype: Dtype,
    /// Its shape, row-major (C order); `[]` is a scalar.
    pub shape: Vec<u64>,
    /// Index of its file in [`Checkpoint::files`] (0 for a single file).
    pub file: usize,
    /// Absolute byte range in its file.
    pub file_range: std::ops::Range<u64>,
    /// Address of the tensor's first byte, valid while [`LoadedCheckpoint::region`] lives: a
    /// device pointer (`CUdeviceptr`) for [`Destination::Gpu`], a host address for
    /// [`Destination::Host`].
    pub addr: u64,
    /// Offset in the allocation (bytes).
    pub offset: u64,
}

impl LoadedTensor {
    /// Length in bytes.
    pub fn bytes(&self) -> u64 {
        self.file_range.end - self.file_range.start
    }
}

/// A loaded checkpoint: one allocation holding every tensor loaded.
#[derive(Debug)]
pub struct LoadedCheckpoint {
    /// The allocation (`Memory::Gpu`, or host memory); dropping every handle frees it.
    pub region: Region,
    /// Tensors in plan order (file by file, in file order within each).
    pub tensors: Vec<LoadedTensor>,
    /// Tensor bytes loaded.
    pub tensor_bytes: u64,
    /// Bytes read from the files (the tensors plus each read's aligned lead-in).
    pub read_bytes: u64,
    /// The path that moved the first read's bytes (`gds-native`, `posix-direct`, ...); `None`
    /// when nothing was read (only tensors of no bytes). Every read's is in `pairs`.
    pub path: Option<DataPath>,
    /// Why the preferred path was not taken for the first read (e.g.
    /// `gds.handle-register-failed`).
    pub finding: Option<FindingId>,
    /// The planner's evidence for `finding`.
    pub detail: Option<String>,
    /// One report per read of the plan (`pairs[i]` is `plan.reads[i]`).
    pub pairs: Vec<PairReport>,
    /// The plan it was loaded with.
    pub plan: CheckpointPlan,
    /// Wall time from opening the files (or, for [`Checkpoint::load`], from the call) to the
    /// last byte in place (headers, allocation, registration and transfer).
    pub elapsed: Duration,
    /// Time of the transfer alone (first I/O to last completion).
    pub transfer: Duration,
    /// The checkpoint's files (`plan.reads[i].file` indexes it), for [`LoadedCheckpoint::verify`].
    pub files: Vec<PathBuf>,
}

/// Bytes compared per step by [`LoadedCheckpoint::verify`] (64 MiB of host memory, twice).
pub const VERIFY_WINDOW: u64 = 64 << 20;

/// The outcome of [`LoadedCheckpoint::verify`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Verified {
    /// Every byte read equals the file's.
    pub ok: bool,
    /// Bytes compared.
    pub bytes: u64,
    /// Where the first difference is: (file index, file offset); `None` when equal.
    pub first_difference: Option<(usize, u64)>,
    /// Time the comparison took.
    pub elapsed: Duration,
}

impl LoadedCheckpoint {
    /// Compares the loaded bytes with the files: every read of the plan, copied back
    /// [`VERIFY_WINDOW`] bytes at a time from the allocation (GPU or host) into host memory
    /// through `agent` (the agent that loaded it) and compared with the same bytes read from
    /// the file with `pread`. Holds `2 × VERIFY_WINDOW` bytes of host memory at most.
    ///
    /// Errors: [`LoadError::Engine`] naming the file: the copy back failed, or the file could
    /// not be opened or read (`Error::Open`, `Error::Io` with op `read`, `Error::ShortFile`
    /// when it is shorter than when it was loaded).
    pub fn verify(&self, agent: &Agent) -> Result<Verified, LoadError> {
        use std::os::unix::fs::FileExt;
        let t0 = Instant::now();
        let eng = |path: &std::path::Path, error: Error| LoadError::Engine {
            path: path.to_owned(),
            error: Box::new(error),
        };
        let first = self.files.first().cloned().unwrap_or_default();
        let longest = self.plan.reads.iter().map(|r| r.len).max().unwrap_or(0);
        let window = VERIFY_WINDOW.min(longest.max(1));
        let host = HostBuffer::try_zeroed(window as usize)
            .and_then(|b| agent.register(Memory::host(b)))
            .map_err(|e| eng(&first, e))?;
        let mut from_file = vec![0u8; window as usize];
        let mut opened: Vec<Option<std::fs::File>> = (0..self.files.len()).map(|_| None).collect();
        let mut bytes = 0;
        for r in &self.plan.reads {
            let path = &self.files[r.file];
            if opened[r.file].is_none() {
                let f = std::fs::File::open(path).map_err(|e| {
                    eng(
                        path,
                        Error::Open {
                            path: path.clone(),
                            source: std::sync::Arc::new(e),
                        },
                    )
                })?;
                opened[r.file] = Some(f);
            }
            let f = opened[r.file].as_ref().expect("opened above");
            let mut off = 0;
            while off < r.len {
                let l = window.min(r.len - off);
                agent
                    .post(TransferRequest::read(
                        vec![host.desc(0, l)],
                        vec![self.region.desc(r.at + off, l)],
                    ))
                    .and_then(|t| t.wait().map_err(|e| e.error))
                    .map_err(|e| eng(path, e))?;
                let buf = &mut from_file[..l as usize];
                f.read_exact_at(buf, r.offset + off).map_err(|e| {
                    let err = if e.kind() == std::io::ErrorKind::UnexpectedEof {
                        Error::ShortFile {
                            path: path.clone(),
                            offset: r.offset + off,
                            wanted: l,
                            available: 0,
                        }
                    } else {
                        Error::io("read", path, r.offset + off, e)
                    };
                    eng(path, err)
                })?;
                let view = host.host_view().map_err(|e| eng(path, e))?;
                if let Some(i) = view[..l as usize]
                    .iter()
                    .zip(buf.iter())
                    .position(|(a, b)| a != b)
                {
                    return Ok(Verified {
                        ok: false,
                        bytes: bytes + i as u64,
                        first_difference: Some((r.file, r.offset + off + i as u64)),
                        elapsed: t0.elapsed(),
                    });
                }
                bytes += l;
                off += l;
            }
        }
        Ok(Verified {
            ok: true,
            bytes,
            first_difference: None,
            elapsed: t0.elapsed(),
        })
    }

    /// Tensor bytes per second of [`LoadedCheckpoint::elapsed`], in GB/s (1e9 B/s).
    pub fn gbps(&self) -> f64 {
        gdpath::units::gbps(self.tensor_bytes, self.elapsed)
    }
}

/// A checkpoint of one or several safetensors files (a sharded checkpoint): every header read
/// and validated, tensor names unique across the files. Nothing is allocated until
/// [`Checkpoint::load`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Checkpoint {
    /// The files, in load order.
    pub files: Vec<PathBuf>,
    /// Their headers (`headers[i]` is `files[i]`'s).
    pub headers: Vec<Header>,
}

impl Checkpoint {
    /// Reads and validates the headers of `files`. Errors: [`LoadError::Checkpoint`] naming the
    /// file: a malformed header ([`CheckpointError`]), a tensor name in two files
    /// ([`CheckpointError::DuplicateAcrossFiles`]), no file ([`CheckpointError::NoFiles`]).
    pub fn open<P: AsRef<std::path::Path>>(files: &[P]) -> Result<Checkpoint, LoadError> {
        let Some(first) = files.first() else {
            return Err(LoadError::Checkpoint {
                path: PathBuf::new(),
                error: CheckpointError::NoFiles,
            });
        };
        let mut headers = Vec::with_capacity(files.len());
        let mut seen: std::collections::HashMap<&str, usize> = std::collections::HashMap::new();
        for f in files {
            let path = f.as_ref();
            headers.push(Header::read(path).map_err(|error| LoadError::Checkpoint {
                path: path.to_owned(),
                error,
            })?);
        }
        for (i, h) in headers.iter().enumerate() {
            for t in &h.tensors {
                if let Some(j) = seen.insert(&t.name, i) {
                    return Err(LoadError::Checkpoint {
                        path: first.as_ref().to_owned(),
                        error: CheckpointError::DuplicateAcrossFiles {
                            name: t.name.clone(),
                            first: files[j].as_ref().to_owned(),
                            second: files[i].as_ref().to_owned(),
                        },
                    });
                }
            }
        }
        Ok(Checkpoint {
            files: files.iter().map(|f| f.as_ref().to_owned()).collect(),
            headers,
        })
    }

    /// A checkpoint named the way users name one: a single path ending in `.json` is a sharded
    /// checkpoint's index ([`Checkpoint::open_index`]); otherwise the files themselves, one
    /// or several ([`Checkpoint::open`]). Errors: those of the two.
    pub fn open_paths<P: AsRef<std::path::Path>>(paths: &[P]) -> Result<Checkpoint, LoadError> {
        match paths {
            [one] if one.as_ref().extension().is_some_and(|e| e == "json") => {
                Checkpoint::open_index(one.as_ref())
            }
            _ => Checkpoint::open(paths),
        }
    }

    /// Opens the sharded checkpoint that the index at `index` lists (see [`Index`]): its shards
    /// in name order, each checked to hold exactly the tensors the weight map gives it.
    /// Errors: as [`Checkpoint::open`], and [`CheckpointError::BadIndex`] (naming the index)
    /// for a malformed index or one that disagrees with its shards.
    pub fn open_index(index: &std::path::Path) -> Result<Checkpoint, LoadError> {
        let bad = |error| LoadError::Checkpoint {
            path: index.to_owned(),
            error,
        };
        let ix = Index::read(index).map_err(bad)?;
        let ck = Checkpoint::open(&ix.shards)?;
        for (i, h) in ck.headers.iter().enumerate() {
            for t in &h.tensors {
                if ix.weight_map.get(&t.name) != Some(&i) {
                    return Err(bad(CheckpointError::BadIndex {
                        message: format!(
                            "tensor {:?} of {} is not mapped to that file",
                            t.name,
                            gdpath_text::escape(&ck.files[i])
                        ),
                    }));
                }
            }
        }
        if let Some((name, &i)) = ix
            .weight_map
            .iter()
            .find(|(name, &i)| !ck.headers[i].tensors.iter().any(|t| &t.name == *name))
        {
            return Err(bad(CheckpointError::BadIndex {
                message: format!(
                    "tensor {name:?} is mapped to {}, which does not hold it",
                    gdpath_text::escape(&ck.files[i])
                ),
            }));
        }
        Ok(ck)
    }

    /// The plan for every tensor (`names: None`) or for the tensors named (in file order,
    /// whatever the order given; a name given twice is placed once), reads aligned to
    /// [`LOAD_ALIGN`]. Errors: [`CheckpointError::NoSuchTensor`].
    pub fn plan(&self, names: Option<&[&str]>) -> Result<CheckpointPlan, CheckpointError> {
        let headers: Vec<&Header> = self.headers.iter().collect();
        let Some(names) = names else {
            return Ok(CheckpointPlan::whole(&headers, LOAD_ALIGN));
        };
        let wanted: std::collections::HashSet<&str> = names.iter().copied().collect();
        let mut found = 0;
        let picks: Vec<_> = headers
            .iter()
            .enumerate()
            .flat_map(|(i, h)| h.tensors.iter().map(move |t| (i, t)))
            .filter(|(_, t)| wanted.contains(t.name.as_str()))
            .inspect(|_| found += 1)
            .collect();
        if found != wanted.len() {
            let have: std::collections::HashSet<&str> =
                picks.iter().map(|(_, t)| t.name.as_str()).collect();
            let missing = names.iter().find(|n| !have.contains(*n)).expect("one is");
            return Err(CheckpointError::NoSuchTensor {
                name: (*missing).to_owned(),
            });
        }
        Ok(CheckpointPlan::new(picks, LOAD_ALIGN))
    }

    /// Loads every tensor (`names: None`) or the tensors named into one allocation at `dest`,
    /// with one transfer of one descriptor pair per read of the plan ([`Checkpoint::plan`]),
    /// on the path the planner picks per pair (GDS where cuFile can for a GPU, O_DIRECT where
    /// the file system allows, else buffered). Errors: [`LoadError::Checkpoint`] for an
    /// unknown name (nothing allocated); [`LoadError::Engine`] for allocation, registration
    /// (`Error::Unsupported` for a GPU or pinned memory without the CUDA backend) and transfer
    /// failures, the allocation freed before returning.
    pub fn load(
        &self,
        agent: &Agent,
        dest: Destination,
        names: Option<&[&str]>,
    ) -> Result<LoadedCheckpoint, LoadError> {
        let t0 = Instant::now();
        let first = &self.files[0];
        let plan = self.plan(names).map_err(|error| LoadError::Checkpoint {
            path: first.clone(),
            error,
        })?;
        let eng = |path: &std::path::Path| {
            let path = path.to_owned();
            move |error: Error| LoadError::Engine {
                path,
                error: Box::new(error),
            }
        };
        let memory = match dest {
            Destination::Gpu(ordinal) => Memory::Gpu {
                ordinal,
                len: plan.len,
            },
            Destination::Host { pinned } => {
                let len = usize::try_from(plan.len).map_err(|_| {
                    eng(first)(Error::Config(format!(
                        "{} bytes do not fit in host memory",
                        plan.len
                    )))
                })?;
                let buffer = HostBuffer::try_zeroed(len).map_err(eng(first))?;
                Memory::Host { buffer, pinned }
            }
        };
        let region = agent.register(memory).map_err(eng(first))?;
        let mut files: Vec<Option<Region>> = vec![None; self.files.len()];
        let (mut local, mut target) = (Vec::new(), Vec::new());
        for r in &plan.reads {
            let f = match &files[r.file] {
                Some(f) => f.clone(),
                None => {
                    let path = &self.files[r.file];
                    let f = agent
                        .register(Memory::File(FileSpec::read(path)))
                        .map_err(eng(path))?;
                    files[r.file] = Some(f.clone());
                    f
                }
            };
            local.push(region.desc(r.at, r.len));
            target.push(f.desc(r.offset, r.len));
        }
        let t = agent
            .post(TransferRequest::read(local, target))
            .map_err(eng(first))?;
        let (finding, detail) = t
            .plan()
            .first()
            .map(|p| (p.finding.clone(), p.detail.clone()))
            .unwrap_or_default();
        let report = t.wait().map_err(|e| {
            // The pair that failed names its file.
            let file = e
                .outcomes
                .iter()
                .find_map(|o| match o {
                    gdpath::PairOutcome::Failed { index, .. } => Some(*index),
                    _ => None,
                })
                .map_or(first, |i| &self.files[plan.reads[i].file]);
            eng(file)(e.error)
        })?;
        let base = match dest {
            Destination::Gpu(_) => gpu_buffer(&region).map(|b| b.device_ptr()),
            Destination::Host { .. } => region.host_ptr().map(|p| p as u64),
        }
        .ok_or_else(|| {
            eng(first)(Error::Backend {
                backend: "engine",
                detail: "the checkpoint region has no memory address".into(),
            })
        })?;
        let tensors = plan
            .tensors
            .iter()
            .map(|t| LoadedTensor {
                name: t.entry.name.clone(),
                dtype: t.entry.dtype,
                shape: t.entry.shape.clone(),
                file: t.file,
                file_range: t.entry.file_range.clone(),
                addr: base + t.offset,
                offset: t.offset,
            })
            .collect();
        let first_pair = report.pairs.first();
        Ok(LoadedCheckpoint {
            region,
            tensors,
            tensor_bytes: plan.tensor_bytes,
            read_bytes: plan.reads.iter().map(|r| r.len).sum(),
            path: first_pair.map(|p| p.path.clone()),
            finding: first_pair.and(finding),
            detail: first_pair.and(detail),
            transfer: report.elapsed,
            pairs: report.pairs,
            plan,
            elapsed: t0.elapsed(),
            files: self.files.clone(),
        })
    }
}

/// Loads the safetensors checkpoint at `file` onto GPU `gpu`: validates the header (before any
/// GPU memory is allocated), allocates one buffer, reads every tensor with one transfer on the
/// path the planner picks (GDS where cuFile can, else the staged O_DIRECT path, else buffered),
/// and returns each tensor's device pointer, dtype, shape and byte range. The same as
/// [`Checkpoint::open`] of the one file and [`Checkpoint::load`] of all of it onto the GPU,
/// with `elapsed` counted from opening the file.
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
    let mut c = Checkpoint::open(&[file])?.load(agent, Destination::Gpu(gpu), None)?;
    c.elapsed = t0.elapsed();
    Ok(c)
}
