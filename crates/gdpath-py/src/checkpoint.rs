//! Safetensors checkpoints through gdpath's loader (`gdpath_checkpoint`): headers checked,
//! one allocation (a GPU's or host memory), one transfer. `gdpath.safetensors` builds the
//! tensors from [`Loaded::view`]s (DLPack, zero-copy), so each tensor is a view of the one
//! allocation and holds it: the allocation is freed when the last tensor is. Saving is
//! [`Checkpoint::save`] (`gdpath.safetensors.save_file`): registered tensors to a file through
//! the engine's crash-safe save.

use crate::agent::Agent;
use crate::dlpack::{View, KDL_CPU, KDL_CUDA};
use crate::error::IntoPy;
use crate::region::Region;
use crate::transfer::PairReport;
use gdpath::AgentConfig;
use gdpath_checkpoint::chooser::Overrides;
use gdpath_checkpoint::{self as ck, Destination};
use pyo3::exceptions::{PyIndexError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::path::PathBuf;
use std::sync::Mutex;

/// One tensor of a checkpoint: `name`, `dtype` (the safetensors name: `F32`, `BF16`,
/// `F8_E4M3`, `F4`, ...), `shape` (elements, as the header gives it), `nbytes`, `file` (its index
/// in `Checkpoint.files`) and `offset` (where its bytes start in that file, bytes from the
/// file's start: the header's `data_offsets` begin plus `8 + N`).
#[pyclass(module = "gdpath._native", name = "TensorInfo", frozen, get_all)]
pub struct TensorInfo {
    pub name: String,
    pub dtype: String,
    pub shape: Vec<u64>,
    pub nbytes: u64,
    pub file: usize,
    pub offset: u64,
}

#[pymethods]
impl TensorInfo {
    fn __repr__(&self) -> String {
        format!(
            "TensorInfo(name={:?}, dtype={:?}, shape={:?}, nbytes={})",
            self.name, self.dtype, self.shape, self.nbytes
        )
    }
}

/// A checkpoint of one or several safetensors files, every header read and validated, tensor
/// names unique across files; nothing loaded yet. `Checkpoint(paths)` or
/// `Checkpoint.open_index("model.safetensors.index.json")`. Errors: `gdpath.CheckpointError`
/// (kind `checkpoint`) naming the file and the check that failed; `gdpath.StorageError` (kinds
/// `open`, `io`; also `FileNotFoundError`, `IsADirectoryError`, ... by errno) for a file that
/// cannot be opened or read.
#[pyclass(module = "gdpath._native", name = "Checkpoint", frozen)]
pub struct Checkpoint {
    ck: ck::Checkpoint,
}

#[pymethods]
impl Checkpoint {
    #[new]
    fn new(py: Python<'_>, paths: Vec<PathBuf>) -> PyResult<Checkpoint> {
        let ck = py.detach(move || ck::Checkpoint::open(&paths)).py_err(py)?;
        Ok(Checkpoint { ck })
    }

    /// A checkpoint named as users name one: one path ending in `.json` is a sharded
    /// checkpoint's index, else the files themselves (`gdpath_checkpoint::Checkpoint::open_paths`).
    #[staticmethod]
    fn open_paths(py: Python<'_>, paths: Vec<PathBuf>) -> PyResult<Checkpoint> {
        let ck = py
            .detach(move || ck::Checkpoint::open_paths(&paths))
            .py_err(py)?;
        Ok(Checkpoint { ck })
    }

    /// The sharded checkpoint an index lists (its shards checked against its weight map).
    #[staticmethod]
    fn open_index(py: Python<'_>, index: PathBuf) -> PyResult<Checkpoint> {
        let ck = py
            .detach(move || ck::Checkpoint::open_index(&index))
            .py_err(py)?;
        Ok(Checkpoint { ck })
    }

    /// The files, in load order.
    #[getter]
    fn files(&self) -> Vec<PathBuf> {
        self.ck.files.clone()
    }

    /// Every tensor, file by file, in file order within each.
    fn tensors(&self) -> Vec<TensorInfo> {
        self.ck
            .headers
            .iter()
            .enumerate()
            .flat_map(|(i, h)| {
                h.tensors.iter().map(move |t| TensorInfo {
                    name: t.name.clone(),
                    dtype: format!("{:?}", t.dtype),
                    shape: t.shape.clone(),
                    nbytes: t.bytes(),
                    file: i,
                    offset: t.file_range.start,
                })
            })
            .collect()
    }

    /// The `__metadata__` of file `file` (a dict of str; empty without one).
    #[pyo3(signature = (file=0))]
    fn metadata<'py>(&self, py: Python<'py>, file: usize) -> PyResult<Bound<'py, PyDict>> {
        let h = self
            .ck
            .headers
            .get(file)
            .ok_or_else(|| PyIndexError::new_err(format!("no file {file}")))?;
        let d = PyDict::new(py);
        for (k, v) in &h.metadata {
            d.set_item(k, v)?;
        }
        Ok(d)
    }

    /// Loads every tensor (`names=None`) or those named into one allocation with one transfer:
    /// on GPU `gpu`, or in host memory (`gpu=None`; `pinned` page-locks it). The GIL is
    /// released while the bytes move.
    ///
    /// `agent=None` loads with the storage settings the engine's chooser picks for these files
    /// (threads, bytes per request, O_DIRECT or the page cache, cuFile; `LoadedCheckpoint.chosen`
    /// says which and why), through an agent the module keeps for those settings (at most
    /// four, the least recently used dropped first), as `gdpath load` does; an agent given
    /// loads with its own configuration. `direct` overrides the chooser's O_DIRECT-or-buffered
    /// choice as `gdpath load --direct` / `--buffered` do (`True`: O_DIRECT where the file
    /// system allows; `False`: through the page cache, which then keeps the file for the next
    /// reader); `None` leaves it to the chooser.
    ///
    /// Errors: `ValueError` for `direct` with an agent (whose configuration decides);
    /// `checkpoint` (an unknown name), the engine's (`unsupported` without a CUDA driver for a
    /// GPU, transfer failures).
    #[pyo3(signature = (agent=None, *, gpu=None, names=None, pinned=false, direct=None))]
    fn load(
        &self,
        py: Python<'_>,
        agent: Option<&Agent>,
        gpu: Option<i64>,
        names: Option<Vec<String>>,
        pinned: bool,
        direct: Option<bool>,
    ) -> PyResult<Loaded> {
        let gpu = crate::error::ordinal("gpu", gpu)?;
        if agent.is_some() && direct.is_some() {
            return Err(PyValueError::new_err(
                "direct= chooses the settings of the module's own agents: an agent given loads \
                 with its own configuration (leave direct=None)",
            ));
        }
        let over = Overrides {
            direct,
            ..Overrides::default()
        };
        let dest = match gpu {
            Some(g) => Destination::Gpu(g),
            None => Destination::Host { pinned },
        };
        let device = match gpu {
            Some(g) => (KDL_CUDA, g as i32),
            None => (KDL_CPU, 0),
        };
        let (a, c) = (agent.map(|a| a.agent.clone()), self.ck.clone());
        let (loaded, chosen) = py
            .detach(move || {
                let names: Option<Vec<&str>> = names
                    .as_ref()
                    .map(|v| v.iter().map(String::as_str).collect());
                match a {
                    Some(a) => c.load(&a, dest, names.as_deref()).map(|l| (l, None)),
                    None => {
                        let mut setup = tuned_setup(&c, dest, &over)?;
                        let loaded = setup.load(&c, names.as_deref())?;
                        Ok((loaded, Some(setup.tuning.summary())))
                    }
                }
            })
            .py_err(py)?;
        Ok(Loaded {
            device,
            chosen,
            pairs: loaded
                .pairs
                .iter()
                .map(|p| Py::new(py, PairReport::from(p)))
                .collect::<PyResult<_>>()?,
            tensors: loaded
                .tensors
                .iter()
                .map(|t| TensorInfo {
                    name: t.name.clone(),
                    dtype: format!("{:?}", t.dtype),
                    shape: t.shape.clone(),
                    nbytes: t.bytes(),
                    file: t.file,
                    offset: t.file_range.start,
                })
                .collect(),
            addrs: loaded.tensors.iter().map(|t| t.addr).collect(),
            inner: loaded,
        })
    }

    /// Saves tensors as the safetensors file `path` through the engine's save
    /// (`gdpath_checkpoint::save`): `tensors` is a list of `(name, dtype, shape, region,
    /// offset, nbytes)` — `dtype` a safetensors name (`"F32"`, `"BF16"`, ...), `region` a
    /// registered GPU or host `Region` holding the `nbytes` bytes at `offset`. Written to a
    /// temporary in the same directory, fsynced (unless `fsync=False`), renamed over `path`:
    /// a crash leaves the old file or the new one; a replaced file keeps its owner (where the
    /// writer may set it), group, mode and extended attributes, not set-id bits; a symbolic
    /// link is followed unless the kernel's `protected_symlinks` rule forbids it (a link
    /// another user planted in a sticky world-writable directory: kind `symlink_refused`).
    /// The GIL is released while the bytes move.
    /// Returns the report as a dict: `path` (the file written: the real one when `path` is a
    /// link), `tensors`, `tensor_bytes`, `header_bytes`,
    /// `file_bytes` (bytes), `pairs`, `paths` (path names), `finding`, `detail`, `fsync`,
    /// `replaced`, `elapsed`, `transfer`, `commit` (seconds), `gbps` (file bytes per second of
    /// `elapsed`, 1e9 B/s).
    ///
    /// Errors: `ValueError` for an unknown dtype name; `gdpath.CheckpointError` (kind
    /// `checkpoint`) naming the tensor for a duplicate or reserved name, a byte count that is
    /// not `product(shape) × dtype size`, bytes outside the region; the engine's kinds for the
    /// file (`exists` without `overwrite`, `symlink_refused`, `no_space`, `io`, ...) and the
    /// transfer.
    #[staticmethod]
    #[pyo3(signature = (agent, tensors, path, *, metadata=None, overwrite=true, fsync=true))]
    // The arguments are the Python signature's.
    #[allow(clippy::too_many_arguments, clippy::type_complexity)]
    fn save<'py>(
        py: Python<'py>,
        agent: &Agent,
        tensors: Vec<(String, String, Vec<u64>, PyRef<'py, Region>, u64, u64)>,
        path: PathBuf,
        metadata: Option<std::collections::BTreeMap<String, String>>,
        overwrite: bool,
        fsync: bool,
    ) -> PyResult<Bound<'py, PyDict>> {
        let mut list = Vec::with_capacity(tensors.len());
        for (name, dtype, shape, region, offset, bytes) in tensors {
            region.check(py)?;
            let dtype = ck::save::dtype_named(&dtype).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "tensor {name:?}: {dtype:?} is not a safetensors dtype name"
                ))
            })?;
            list.push(ck::SaveTensor {
                name,
                dtype,
                shape,
                region: region.region.clone(),
                offset,
                bytes,
            });
        }
        let opts = ck::SaveOptions {
            overwrite,
            fsync,
            metadata: metadata.unwrap_or_default(),
            ..ck::SaveOptions::default()
        };
        let a = agent.agent.clone();
        let r = py
            .detach(move || ck::save(&a, &list, &path, &opts))
            .map_err(|e| match &e {
                ck::SaveError::Engine { error, .. } => crate::error::engine(py, error),
                _ => crate::error::raise(py, e.kind(), &e.to_string(), None, None),
            })?;
        let d = PyDict::new(py);
        d.set_item("path", &r.path)?;
        d.set_item("tensors", r.tensors)?;
        d.set_item("tensor_bytes", r.tensor_bytes)?;
        d.set_item("header_bytes", r.header_bytes)?;
        d.set_item("file_bytes", r.file_bytes)?;
        d.set_item("pairs", r.pairs)?;
        let paths: Vec<String> = r.paths.iter().map(gdpath::DataPath::name).collect();
        d.set_item("paths", paths)?;
        d.set_item("finding", &r.finding)?;
        d.set_item("detail", &r.detail)?;
        d.set_item("fsync", r.fsync)?;
        d.set_item("replaced", r.replaced)?;
        d.set_item("elapsed", r.elapsed.as_secs_f64())?;
        d.set_item("transfer", r.transfer.as_secs_f64())?;
        d.set_item("commit", r.commit.as_secs_f64())?;
        d.set_item("gbps", r.gbps())?;
        Ok(d)
    }

    fn __repr__(&self) -> String {
        format!("gdpath.Checkpoint(files={:?})", self.ck.files)
    }
}

/// The agents [`Checkpoint::load`] keeps for the chooser's settings, most recently used last:
/// a load whose files get the same settings reuses one (its threads and pinned buffers).
static TUNED: Mutex<Vec<(Settings, gdpath::Agent)>> = Mutex::new(Vec::new());

/// Most agents kept in [`TUNED`]: the chooser gives few distinct settings on one machine
/// (files in memory, cold files, small files), and each agent holds threads and buffers.
const MAX_TUNED: usize = 4;

/// What a chosen tuning sets in an agent (its explanation aside).
type Settings = (usize, u64, usize, bool, bool);

/// A load setup with the chooser's settings for `ck`'s files (`over`'s values in their place),
/// on a kept agent when one has them, else on a new one (kept).
fn tuned_setup(
    ck: &ck::Checkpoint,
    dest: Destination,
    over: &Overrides,
) -> Result<ck::LoadSetup, ck::LoadError> {
    let tuning = ck.choose(dest, over)?;
    let key: Settings = (
        tuning.threads,
        tuning.chunk,
        tuning.slabs,
        tuning.direct,
        tuning.cufile,
    );
    let kept = {
        let mut agents = TUNED.lock().unwrap_or_else(|p| p.into_inner());
        let i = agents.iter().position(|(k, _)| *k == key);
        i.map(|i| {
            let e = agents.remove(i);
            agents.push((e.0, e.1.clone()));
            e.1
        })
    };
    if let Some(agent) = kept {
        return Ok(ck::LoadSetup::with_agent(agent, tuning, dest));
    }
    let setup = ck.setup(dest, over, AgentConfig::default())?;
    let mut agents = TUNED.lock().unwrap_or_else(|p| p.into_inner());
    if agents.len() >= MAX_TUNED {
        agents.remove(0);
    }
    agents.push((key, setup.agent.clone()));
    Ok(setup)
}

/// A loaded checkpoint: the allocation and its tensors. `view(i)` exports tensor `i`'s bytes
/// through DLPack (each export holds the allocation); `path`, `finding`, `pairs`, `elapsed`,
/// `gbps` say how the bytes came.
#[pyclass(module = "gdpath._native", name = "LoadedCheckpoint", frozen)]
pub struct Loaded {
    inner: ck::LoadedCheckpoint,
    device: (i32, i32),
    chosen: Option<String>,
    tensors: Vec<TensorInfo>,
    addrs: Vec<u64>,
    pairs: Vec<Py<PairReport>>,
}

#[pymethods]
impl Loaded {
    /// The tensors loaded, in plan order.
    #[getter]
    fn tensors(&self, py: Python<'_>) -> PyResult<Vec<Py<TensorInfo>>> {
        self.tensors
            .iter()
            .map(|t| {
                Py::new(
                    py,
                    TensorInfo {
                        name: t.name.clone(),
                        dtype: t.dtype.clone(),
                        shape: t.shape.clone(),
                        nbytes: t.nbytes,
                        file: t.file,
                        offset: t.offset,
                    },
                )
            })
            .collect()
    }

    /// Tensor `i`'s bytes as a DLPack-exportable view (1-D `uint8`). Errors: `IndexError` for
    /// an `i` outside `0 .. len(tensors)` (negative ones included).
    fn view(&self, i: i64) -> PyResult<View> {
        let (i, t) = usize::try_from(i)
            .ok()
            .and_then(|u| Some((u, self.tensors.get(u)?)))
            .ok_or_else(|| PyIndexError::new_err(format!("no tensor {i}")))?;
        Ok(View::new(
            self.inner.region.clone(),
            self.addrs[i],
            t.nbytes,
            self.device,
        ))
    }

    /// The allocation as a `Region` (to post transfers from it).
    #[getter]
    fn region(&self) -> Region {
        Region::made(self.inner.region.clone(), "checkpoint")
    }

    /// The path of the first read (`posix-direct`, `gds-native`, ...), `None` if nothing was
    /// read.
    #[getter]
    fn path(&self) -> Option<String> {
        self.inner.path.as_ref().map(gdpath::DataPath::name)
    }

    /// The storage settings the chooser picked for the load and why (`"16 threads × 4 MiB,
    /// buffered: ..."`), `None` when the load used an agent given to it.
    #[getter]
    fn chosen(&self) -> Option<String> {
        self.chosen.clone()
    }

    /// Why the preferred path was not taken for the first read, if it was not.
    #[getter]
    fn finding(&self) -> Option<String> {
        self.inner.finding.as_ref().map(|f| f.as_str().to_owned())
    }

    /// One report per read (a read per file, or per run of adjacent tensors).
    #[getter]
    fn pairs(&self, py: Python<'_>) -> Vec<Py<PairReport>> {
        self.pairs.iter().map(|p| p.clone_ref(py)).collect()
    }

    /// Tensor bytes loaded.
    #[getter]
    fn tensor_bytes(&self) -> u64 {
        self.inner.tensor_bytes
    }

    /// Seconds from the call to the last byte in place.
    #[getter]
    fn elapsed(&self) -> f64 {
        self.inner.elapsed.as_secs_f64()
    }

    /// Tensor bytes per second of `elapsed`, GB/s (1e9 B/s).
    #[getter]
    fn gbps(&self) -> f64 {
        self.inner.gbps()
    }

    fn __repr__(&self) -> String {
        format!(
            "LoadedCheckpoint(tensors={}, tensor_bytes={}, path={}, elapsed={:.3}, gbps={:.2})",
            self.tensors.len(),
            self.inner.tensor_bytes,
            crate::error::opt_repr(self.inner.path.as_ref().map(|p| p.name()).as_deref()),
            self.inner.elapsed.as_secs_f64(),
            self.inner.gbps()
        )
    }
}
