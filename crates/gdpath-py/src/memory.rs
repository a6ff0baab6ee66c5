//! What `Agent.register` accepts, turned into the engine's [`Memory`] and the Python object
//! the region keeps alive ([`gdpath::Agent::register_kept`]):
//!
//! 1. `gdpath.File` → a file region.
//! 2. The buffer protocol (`bytearray`, `bytes`, `memoryview`, NumPy, `mmap`) → host memory,
//!    in place ([`crate::buffer`]).
//! 3. DLPack (`__dlpack__`: PyTorch, CuPy, JAX) → host memory (`kDLCPU`; pinned for
//!    `kDLCUDAHost` or when `is_pinned()` says so) or GPU memory (`kDLCUDA`,
//!    `kDLCUDAManaged`), in place ([`crate::dlpack`]).
//! 4. `__cuda_array_interface__` (v2/v3: Numba, CuPy) → GPU memory; the GPU is the object's
//!    `.device.id` / `.device.index`, or `gpu=`.
//!
//! Read-only memory (a `bytes`, a read-only array, a DLPack tensor flagged read-only) registers
//! read-only: the engine refuses to write it (`read_only_memory`).

use crate::dlpack::{KDL_CPU, KDL_CUDA, KDL_CUDA_HOST, KDL_CUDA_MANAGED};
use crate::geometry::{contiguous, Geometry};
use gdpath::{DirectIo, FileAccess, FileSpec, GpuPointer, HostPointer, Memory};
use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyDict, PyTuple};
use std::path::PathBuf;

/// A file to register: `gdpath.File(path, mode="r", direct="auto")`.
///
/// `mode`: `"r"` read-only (writes fail with `read_only`), `"r+"` read and write an existing
/// file, `"w"` create or truncate, `"a"` create if missing and keep what is there (writes land
/// at the offsets their descriptors give: nothing is appended). `path` is a `pathlib.Path`.
/// `direct`:
/// `"auto"` O_DIRECT where the file system allows it, `"off"` the page cache only,
/// `"required"` fail registration where O_DIRECT is refused.
#[pyclass(module = "gdpath._native", name = "File", frozen, from_py_object)]
#[derive(Clone)]
pub struct File {
    pub spec: FileSpec,
    mode: String,
    direct_name: String,
}

#[pymethods]
impl File {
    #[new]
    #[pyo3(signature = (path, mode="r", direct="auto"))]
    fn new(path: PathBuf, mode: &str, direct: &str) -> PyResult<File> {
        let access = match mode {
            "r" => FileAccess::ReadOnly,
            "r+" => FileAccess::ReadWrite,
            "w" => FileAccess::Create { truncate: true },
            "a" => FileAccess::Create { truncate: false },
            other => {
                return Err(PyValueError::new_err(format!(
                    "mode {other:?}: one of \"r\", \"r+\", \"w\", \"a\""
                )))
            }
        };
        let d = match direct {
            "auto" => DirectIo::Auto,
            "off" => DirectIo::Off,
            "required" => DirectIo::Required,
            other => {
                return Err(PyValueError::new_err(format!(
                    "direct {other:?}: one of \"auto\", \"off\", \"required\""
                )))
            }
        };
        Ok(File {
            spec: FileSpec::read(path).access(access).direct(d),
            mode: mode.to_owned(),
            direct_name: direct.to_owned(),
        })
    }

    /// The file's path.
    #[getter]
    fn path(&self) -> PathBuf {
        self.spec.path.clone()
    }

    /// The mode it was made with.
    #[getter]
    fn mode(&self) -> &str {
        &self.mode
    }

    /// The O_DIRECT policy it was made with.
    #[getter]
    fn direct(&self) -> &str {
        &self.direct_name
    }

    fn __repr__(&self) -> String {
        format!(
            "gdpath.File({:?}, mode={:?}, direct={:?})",
            self.spec.path, self.mode, self.direct_name
        )
    }
}

/// What `register` was asked: pin host memory (`Some(true)`), leave it pageable
/// (`Some(false)`), or do what the object says (`None`); register read-only whatever the object
/// allows; the GPU of a `__cuda_array_interface__` object that does not say.
pub struct Options {
    pub pinned: Option<bool>,
    pub read_only: bool,
    pub gpu: Option<u32>,
}

/// Memory for the engine, the Python object that keeps it alive (`None` for files), and a
/// word for `Region.source` (`file`, `buffer`, `dlpack`, `cuda_array_interface`).
pub struct Resolved {
    pub memory: Memory,
    pub keep: Option<Py<PyAny>>,
    pub via: &'static str,
    /// The array's shape and strides (`None` for files).
    pub geometry: Option<Geometry>,
    /// The owners of buffer-protocol memory that no pin holds, checked before every post.
    pub guard: crate::buffer::Guard,
}

/// Resolves `obj` as the module docstring says. Errors: `TypeError` for an object gdpath cannot
/// register (naming its type and what is accepted), `ValueError` for non-contiguous memory or
/// a GPU that cannot be told.
pub fn resolve(obj: &Bound<'_, PyAny>, o: &Options) -> PyResult<Resolved> {
    let py = obj.py();
    // `getattr`, not `hasattr`: PyTorch raises RuntimeError, not AttributeError, for a CUDA
    // tensor that requires grad.
    if o.gpu.is_some() && obj.getattr("__cuda_array_interface__").is_err() {
        return Err(PyValueError::new_err(format!(
            "gpu= names the GPU of a __cuda_array_interface__ object that does not name its \
             own; a {} says where its memory is",
            crate::error::type_name(obj)
        )));
    }
    if let Ok(r) = obj.cast::<crate::region::Region>() {
        return Err(PyTypeError::new_err(already_registered(&r.get().region)));
    }
    if let Ok(f) = obj.cast::<File>() {
        return Ok(Resolved {
            memory: Memory::File(f.get().spec.clone()),
            keep: None,
            via: "file",
            geometry: None,
            guard: Default::default(),
        });
    }
    if let Some(x) = crate::buffer::export(obj)? {
        // SAFETY: the memoryview given to `register_kept` holds the buffer exported, and the
        // engine drops it only when it holds the memory no more (region, transfers, I/O), so
        // the memory stays at this address as long as gdpath uses it, except where an owner
        // frees it regardless of exports: the weakrefs kept beside the memoryview pin NumPy
        // arrays, and the guard refuses a post once a ctypes object or array moved (module
        // doc of `crate::buffer`).
        let memory = unsafe { HostPointer::new(x.ptr, x.len, !x.readonly && !o.read_only) };
        let geometry = Some(x.geometry);
        return Ok(Resolved {
            memory: Memory::HostPointer {
                memory,
                pinned: o.pinned.unwrap_or(false),
            },
            keep: Some(x.keep),
            via: "buffer",
            geometry,
            guard: x.guard,
        });
    }
    if obj.hasattr("__dlpack__")? {
        let t = crate::dlpack::import(obj)?;
        let writable = !t.readonly && !o.read_only;
        // The capsule keeps the memory; the object is kept too, for `Region.obj`.
        let keep = PyTuple::new(py, [t.capsule.bind(py).clone(), obj.clone()])?
            .into_any()
            .unbind();
        let memory = match t.device_type {
            KDL_CPU | KDL_CUDA_HOST => {
                let says_pinned = t.device_type == KDL_CUDA_HOST || is_pinned(obj);
                let ptr = t.ptr as *mut u8;
                let len = usize::try_from(t.len)
                    .map_err(|_| PyValueError::new_err("tensor larger than the address space"))?;
                // SAFETY: the unconsumed capsule, given to `register_kept`, keeps the memory
                // for as long as the engine holds it.
                let memory = unsafe { HostPointer::new(ptr, len, writable) };
                Memory::HostPointer {
                    memory,
                    pinned: o.pinned.unwrap_or(says_pinned),
                }
            }
            KDL_CUDA | KDL_CUDA_MANAGED => {
                let ordinal = u32::try_from(t.device_id)
                    .map_err(|_| PyValueError::new_err("negative DLPack device id"))?;
                if let Some(g) = o.gpu.filter(|&g| g != ordinal) {
                    return Err(PyValueError::new_err(format!(
                        "gpu={g}: the object's DLPack device is GPU {ordinal}"
                    )));
                }
                gpu_pointer(ordinal, t.ptr, t.len, writable)
            }
            other => {
                return Err(PyTypeError::new_err(format!(
                    "DLPack device type {other} is not host or CUDA memory: gdpath registers \
                     kDLCPU, kDLCUDAHost, kDLCUDA and kDLCUDAManaged"
                )))
            }
        };
        return Ok(Resolved {
            memory,
            keep: Some(keep),
            via: "dlpack",
            geometry: Some(t.geometry),
            guard: Default::default(),
        });
    }
    if let Ok(cai) = obj.getattr("__cuda_array_interface__") {
        let cai = cai
            .cast_into::<PyDict>()
            .map_err(|_| PyTypeError::new_err("__cuda_array_interface__ is not a dict"))?;
        let (ptr, len, readonly, geometry) = cuda_array(&cai)?;
        let ordinal = match o.gpu {
            Some(g) => g,
            None => device_of(obj)?.ok_or_else(|| {
                PyValueError::new_err(format!(
                    "cannot tell which GPU the {} object is on: pass gpu=N",
                    crate::error::type_name(obj)
                ))
            })?,
        };
        return Ok(Resolved {
            memory: gpu_pointer(ordinal, ptr, len, !readonly && !o.read_only),
            keep: Some(obj.clone().unbind()),
            via: "cuda_array_interface",
            geometry: Some(geometry),
            guard: Default::default(),
        });
    }
    Err(PyTypeError::new_err(format!(
        "cannot register a {}: gdpath registers gdpath.File, objects with the buffer protocol \
         (bytearray, memoryview, numpy.ndarray), DLPack (__dlpack__: torch.Tensor, cupy.ndarray) \
         or __cuda_array_interface__",
        obj.get_type().name()?
    )))
}

/// The `TypeError` text for a `Region` given to `register`: it is registered memory already
/// (remote memory as `peer.memory(id)` returns it, too), used as it is.
fn already_registered(region: &gdpath::Region) -> String {
    let made = if matches!(region.kind(), gdpath::MemoryKind::Remote { .. }) {
        ", as peer.memory(id) returns it"
    } else {
        ""
    };
    format!(
        "cannot register a Region: it is registered memory already ({}{made}); use it directly \
         as a side of post() or as a descriptor's region (region[a:b], region.desc(offset, \
         length))",
        region.kind()
    )
}

fn gpu_pointer(ordinal: u32, ptr: u64, len: u64, writable: bool) -> Memory {
    // SAFETY: the region keeps the object owning the device memory (capsule or array) alive
    // until its last handle goes (`register_kept`).
    let p = unsafe { GpuPointer::new(ordinal, ptr, len) };
    Memory::GpuPointer(if writable { p } else { p.read_only() })
}

/// `obj.is_pinned()` where the object has it (PyTorch CPU tensors); false otherwise.
fn is_pinned(obj: &Bound<'_, PyAny>) -> bool {
    obj.call_method0("is_pinned")
        .and_then(|r| r.extract::<bool>())
        .unwrap_or(false)
}

/// The CUDA ordinal an array object names: CuPy's `.device.id`, PyTorch's `.device.index`.
fn device_of(obj: &Bound<'_, PyAny>) -> PyResult<Option<u32>> {
    let Ok(dev) = obj.getattr("device") else {
        return Ok(None);
    };
    for attr in ["id", "index"] {
        if let Ok(v) = dev.getattr(attr) {
            if let Ok(n) = v.extract::<u32>() {
                return Ok(Some(n));
            }
        }
    }
    Ok(None)
}

/// (pointer, length in bytes, read-only, geometry) of a `__cuda_array_interface__` (Numba's
/// spec, v3).
fn cuda_array(cai: &Bound<'_, PyDict>) -> PyResult<(u64, u64, bool, Geometry)> {
    let get = |k: &str| {
        cai.get_item(k)?
            .ok_or_else(|| PyValueError::new_err(format!("__cuda_array_interface__ has no {k:?}")))
    };
    let (ptr, readonly): (u64, bool) = get("data")?.extract()?;
    let shape: Vec<u64> = get("shape")?.extract()?;
    let typestr: String = get("typestr")?.extract()?;
    let item: u64 = typestr
        .get(2..)
        .and_then(|n| n.parse().ok())
        .filter(|&n| n > 0)
        .ok_or_else(|| PyValueError::new_err(format!("typestr {typestr:?} has no item size")))?;
    if cai.get_item("mask")?.is_some_and(|m| !m.is_none()) {
        return Err(PyValueError::new_err(
            "masked CUDA arrays are not supported",
        ));
    }
    let elems = shape.iter().try_fold(1u64, |a, &d| a.checked_mul(d));
    let len = elems
        .and_then(|e| e.checked_mul(item))
        .ok_or_else(|| PyValueError::new_err(format!("shape {shape:?} overflows")))?;
    let shape64: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let mut geometry = Geometry::new(&shape64, None, 1, item);
    if let Some(strides) = cai.get_item("strides")?.filter(|s| !s.is_none()) {
        let strides: Vec<i64> = strides.extract()?;
        if strides.len() != shape.len() || !contiguous(&shape64, Some(&strides), item as i64) {
            return Err(PyValueError::new_err(format!(
                "the CUDA array is not contiguous (strides {strides:?} for shape {shape:?})"
            )));
        }
        geometry = Geometry::new(&shape64, Some(&strides), 1, item);
    }
    Ok((ptr, len, readonly, geometry))
}
