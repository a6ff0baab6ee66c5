//! DLPack (dmlc/dlpack, `include/dlpack/dlpack.h`, v1.0): tensors in from any producer
//! (`__dlpack__` / `__dlpack_device__`: PyTorch, CuPy, JAX, NumPy) and out to any consumer
//! (`torch.from_dlpack`, `numpy.from_dlpack`, `cupy.from_dlpack`).
//!
//! In: the capsule a producer returns is kept unconsumed for as long as the region lives; its
//! own destructor then calls the producer's deleter (the producer keeps the memory until
//! then). Out: [`View`] exports `len` bytes of a registered region as a 1-D `uint8` tensor; the
//! managed tensor holds a handle of the region, dropped by its deleter, so the memory lives as
//! long as the last tensor made from it. Dtypes are applied by the consumer (`.view(dtype)`),
//! which makes every dtype a framework knows (bf16, fp8) work whatever its DLPack code.

use gdpath::Region;
use pyo3::exceptions::{PyBufferError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PyCapsule, PyTuple};
use std::ffi::{c_void, CStr};
use std::ptr::NonNull;

/// `DLDeviceType` values gdpath handles.
pub const KDL_CPU: i32 = 1;
pub const KDL_CUDA: i32 = 2;
pub const KDL_CUDA_HOST: i32 = 3;
pub const KDL_CUDA_MANAGED: i32 = 13;
/// `DLDataTypeCode::kDLUInt`.
const KDL_UINT: u8 = 1;
/// `DLPACK_FLAG_BITMASK_READ_ONLY`.
const FLAG_READ_ONLY: u64 = 1;

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDevice {
    device_type: i32,
    device_id: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct DLDataType {
    code: u8,
    bits: u8,
    lanes: u16,
}

#[repr(C)]
struct DLTensor {
    data: *mut c_void,
    device: DLDevice,
    ndim: i32,
    dtype: DLDataType,
    shape: *mut i64,
    strides: *mut i64,
    byte_offset: u64,
}

#[repr(C)]
struct DLManagedTensor {
    dl_tensor: DLTensor,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensor)>,
}

#[repr(C)]
struct DLPackVersion {
    major: u32,
    minor: u32,
}

#[repr(C)]
struct DLManagedTensorVersioned {
    version: DLPackVersion,
    manager_ctx: *mut c_void,
    deleter: Option<unsafe extern "C" fn(*mut DLManagedTensorVersioned)>,
    flags: u64,
    dl_tensor: DLTensor,
}

const LEGACY: &CStr = c"dltensor";
const VERSIONED: &CStr = c"dltensor_versioned";

// ---------------------------------------------------------------------------------------------
// In
// ---------------------------------------------------------------------------------------------

/// Memory a DLPack producer exports.
pub struct Imported {
    pub ptr: u64,
    pub len: u64,
    pub device_type: i32,
    pub device_id: i32,
    pub readonly: bool,
    /// The unconsumed capsule: dropping it lets the producer free the memory.
    pub capsule: Py<PyAny>,
    /// Shape, strides (bytes) and element size: what a KV layout is computed from.
    pub geometry: crate::geometry::Geometry,
    /// `DLDataTypeCode` of the elements (0 int, 1 uint, 2 float, ...).
    pub dtype_code: u8,
}

/// Calls `obj.__dlpack__()` (asking for a versioned capsule first, as the array API standard
/// has it) and reads the tensor it describes. Errors: `TypeError` for a capsule of another
/// kind or a sub-byte dtype, `ValueError` for a tensor that is not one contiguous span.
pub fn import(obj: &Bound<'_, PyAny>) -> PyResult<Imported> {
    let py = obj.py();
    let kwargs = pyo3::types::PyDict::new(py);
    kwargs.set_item("max_version", (1, 0))?;
    let capsule = match obj.call_method("__dlpack__", (), Some(&kwargs)) {
        Ok(c) => c,
        Err(e) if e.is_instance_of::<PyTypeError>(py) => obj.call_method0("__dlpack__")?,
        Err(e) => return Err(e),
    };
    let cap = capsule
        .cast::<PyCapsule>()
        .map_err(|_| PyTypeError::new_err("__dlpack__ did not return a capsule"))?;
    let name = cap.name()?;
    // SAFETY: the capsule's name says which struct its pointer is (the DLPack protocol); it is
    // alive (we hold it) and unconsumed, so the producer keeps the tensor valid.
    let (t, readonly) = unsafe {
        let name = name.map(|n| n.as_cstr());
        if name == Some(VERSIONED) {
            let m = pyo3::ffi::PyCapsule_GetPointer(cap.as_ptr(), VERSIONED.as_ptr())
                as *const DLManagedTensorVersioned;
            if m.is_null() {
                return Err(PyErr::fetch(py));
            }
            (&(*m).dl_tensor, (*m).flags & FLAG_READ_ONLY != 0)
        } else if name == Some(LEGACY) {
            let m = pyo3::ffi::PyCapsule_GetPointer(cap.as_ptr(), LEGACY.as_ptr())
                as *const DLManagedTensor;
            if m.is_null() {
                return Err(PyErr::fetch(py));
            }
            (&(*m).dl_tensor, false)
        } else {
            return Err(PyTypeError::new_err(format!(
                "__dlpack__ returned a capsule named {name:?}, not a DLPack tensor"
            )));
        }
    };
    let dtype = t.dtype;
    let bits = u64::from(dtype.bits) * u64::from(dtype.lanes);
    if bits % 8 != 0 {
        return Err(PyTypeError::new_err(format!(
            "DLPack dtype of {} bits per element: only whole bytes can be registered",
            bits
        )));
    }
    let item = bits / 8;
    let ndim = t.ndim.max(0) as usize;
    // SAFETY: `shape` (and `strides` when not null) hold `ndim` entries while the capsule lives.
    let (shape, strides) = unsafe {
        let shape: &[i64] = if ndim == 0 || t.shape.is_null() {
            &[]
        } else {
            std::slice::from_raw_parts(t.shape, ndim)
        };
        let strides =
            (!t.strides.is_null() && ndim > 0).then(|| std::slice::from_raw_parts(t.strides, ndim));
        (shape, strides)
    };
    let elems = shape.iter().try_fold(1u64, |acc, &d| {
        u64::try_from(d).ok().and_then(|d| acc.checked_mul(d))
    });
    let len = elems
        .and_then(|e| e.checked_mul(item))
        .ok_or_else(|| PyValueError::new_err(format!("DLPack shape {shape:?} is invalid")))?;
    if !crate::geometry::contiguous(shape, strides, 1) {
        return Err(PyValueError::new_err(format!(
            "the tensor's memory is not contiguous (strides {:?} for shape {shape:?}): register \
             a contiguous copy (.contiguous()) or the tensor it views",
            strides.map(<[i64]>::to_vec).unwrap_or_default()
        )));
    }
    let ptr = (t.data as u64).wrapping_add(t.byte_offset);
    let geometry = crate::geometry::Geometry::new(shape, strides, item as i64, item);
    Ok(Imported {
        ptr,
        len,
        device_type: t.device.device_type,
        device_id: t.device.device_id,
        readonly,
        capsule: capsule.clone().unbind(),
        geometry,
        dtype_code: dtype.code,
    })
}

// ---------------------------------------------------------------------------------------------
// Out
// ---------------------------------------------------------------------------------------------

/// What a managed tensor made by [`View`] owns: its shape, and a handle of the region.
struct Holder {
    shape: [i64; 1],
    _region: Region,
}

unsafe extern "C" fn delete_legacy(m: *mut DLManagedTensor) {
    if m.is_null() {
        return;
    }
    // SAFETY: made by `View::legacy` from boxes, deleted once (the consumer calls the deleter
    // once, or the capsule destructor does for an unconsumed capsule).
    unsafe {
        let m = Box::from_raw(m);
        drop(Box::from_raw(m.manager_ctx as *mut Holder));
    }
}

unsafe extern "C" fn delete_versioned(m: *mut DLManagedTensorVersioned) {
    if m.is_null() {
        return;
    }
    // SAFETY: as `delete_legacy`.
    unsafe {
        let m = Box::from_raw(m);
        drop(Box::from_raw(m.manager_ctx as *mut Holder));
    }
}

/// The destructor of a capsule nobody consumed: its tensor is ours to delete. A consumed one
/// was renamed `used_…` and its consumer calls the deleter.
unsafe extern "C" fn capsule_destructor(capsule: *mut pyo3::ffi::PyObject) {
    // SAFETY: the interpreter calls this with the capsule being destroyed (GIL held).
    unsafe {
        if pyo3::ffi::PyCapsule_IsValid(capsule, LEGACY.as_ptr()) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule, LEGACY.as_ptr());
            delete_legacy(p as *mut DLManagedTensor);
        } else if pyo3::ffi::PyCapsule_IsValid(capsule, VERSIONED.as_ptr()) == 1 {
            let p = pyo3::ffi::PyCapsule_GetPointer(capsule, VERSIONED.as_ptr());
            delete_versioned(p as *mut DLManagedTensorVersioned);
        }
        // Neither name: consumed (renamed `used_dltensor…`); the consumer deletes it.
    }
}

/// `len` bytes at `addr` of a registered region (host or GPU memory), exported through
/// `__dlpack__` as a 1-D `uint8` tensor. Each capsule it makes holds a handle of the region, so
/// the region's memory is freed only after the last tensor made from it (and this view) is.
#[pyclass(module = "gdpath._native", name = "DLPackView", frozen)]
pub struct View {
    region: Region,
    addr: u64,
    len: u64,
    device: (i32, i32),
}

impl View {
    /// A view of `len` bytes at `addr`, inside `region`'s memory on `device` (DLPack type, id).
    pub fn new(region: Region, addr: u64, len: u64, device: (i32, i32)) -> View {
        View {
            region,
            addr,
            len,
            device,
        }
    }

    fn tensor(&self, holder: &mut Holder) -> DLTensor {
        DLTensor {
            data: self.addr as *mut c_void,
            device: DLDevice {
                device_type: self.device.0,
                device_id: self.device.1,
            },
            ndim: 1,
            dtype: DLDataType {
                code: KDL_UINT,
                bits: 8,
                lanes: 1,
            },
            shape: holder.shape.as_mut_ptr(),
            strides: std::ptr::null_mut(),
            byte_offset: 0,
        }
    }

    fn holder(&self) -> Box<Holder> {
        Box::new(Holder {
            shape: [self.len as i64],
            _region: self.region.clone(),
        })
    }
}

#[pymethods]
impl View {
    fn __repr__(&self) -> String {
        let (kind, id) = self.device;
        format!(
            "DLPackView(len={}, addr={:#x}, device=({kind}, {id}))",
            self.len, self.addr
        )
    }

    /// A DLPack capsule of the bytes (`dltensor_versioned` when `max_version` allows 1.x, else
    /// the legacy `dltensor`). `stream` is accepted and ignored: the bytes are in place when
    /// the view is made (the load or transfer that wrote them has completed). `copy=True` and
    /// another `dl_device` are refused (`BufferError`): a view never copies.
    #[pyo3(signature = (*, stream=None, max_version=None, dl_device=None, copy=None))]
    fn __dlpack__<'py>(
        &self,
        py: Python<'py>,
        stream: Option<Bound<'py, PyAny>>,
        max_version: Option<(u32, u32)>,
        dl_device: Option<(i32, i32)>,
        copy: Option<bool>,
    ) -> PyResult<Bound<'py, PyCapsule>> {
        let _ = stream;
        if copy == Some(true) {
            return Err(PyBufferError::new_err(
                "a gdpath view exports its memory in place; it cannot copy",
            ));
        }
        if let Some(d) = dl_device {
            if d != self.device {
                return Err(PyBufferError::new_err(format!(
                    "the memory is on DLPack device {:?}, not {d:?}",
                    self.device
                )));
            }
        }
        let holder = self.holder();
        let holder = Box::into_raw(holder);
        // SAFETY: `holder` is a live box owned by the managed tensor from here on.
        let dl_tensor = self.tensor(unsafe { &mut *holder });
        let (ptr, name): (*mut c_void, &'static CStr) = if max_version.is_some_and(|v| v.0 >= 1) {
            let m = Box::new(DLManagedTensorVersioned {
                version: DLPackVersion { major: 1, minor: 0 },
                manager_ctx: holder as *mut c_void,
                deleter: Some(delete_versioned),
                flags: 0,
                dl_tensor,
            });
            (Box::into_raw(m) as *mut c_void, VERSIONED)
        } else {
            let m = Box::new(DLManagedTensor {
                dl_tensor,
                manager_ctx: holder as *mut c_void,
                deleter: Some(delete_legacy),
            });
            (Box::into_raw(m) as *mut c_void, LEGACY)
        };
        let nn = NonNull::new(ptr).expect("a box is not null");
        // SAFETY: `ptr` is the managed tensor named by `name`; the destructor deletes it when
        // the capsule dies unconsumed.
        let made = unsafe {
            PyCapsule::new_with_pointer_and_destructor(py, nn, name, Some(capsule_destructor))
        };
        if made.is_err() {
            // SAFETY: the capsule was not made, so the tensor is still ours alone.
            unsafe {
                if name == VERSIONED {
                    delete_versioned(ptr as *mut DLManagedTensorVersioned);
                } else {
                    delete_legacy(ptr as *mut DLManagedTensor);
                }
            }
        }
        made
    }

    /// `(device_type, device_id)`: `(1, 0)` for host memory (kDLCPU), `(2, N)` for GPU N
    /// (kDLCUDA).
    fn __dlpack_device__<'py>(&self, py: Python<'py>) -> PyResult<Bound<'py, PyTuple>> {
        PyTuple::new(py, [self.device.0, self.device.1])
    }

    /// Length in bytes.
    fn __len__(&self) -> usize {
        self.len as usize
    }

    /// The address of the first byte (a device pointer for GPU memory).
    #[getter]
    fn address(&self) -> u64 {
        self.addr
    }
}
