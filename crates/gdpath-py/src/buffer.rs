//! Host memory through the buffer protocol (PEP 3118): `bytearray`, `bytes`, `memoryview`,
//! NumPy arrays, `mmap`, `array.array`.
//!
//! The region keeps a `memoryview` of the object: it holds one export of the buffer for as
//! long as it lives, so the exporter can neither free nor move the memory (a `bytearray` with a
//! view out refuses to resize, "BufferError: Existing exports of data"). The address, length
//! and read-only flag are read once, through a second, short-lived export of that memoryview.
//!
//! `PyObject_GetBuffer` / `PyBuffer_Release` and `Py_buffer` joined the limited API in Python
//! 3.11 (PEP 688 era), and so are not in PyO3's `abi3-py39` bindings; they are exported by
//! every CPython 3 and `Py_buffer`'s layout has not changed since 3.3, which is why 3.11 could
//! declare it stable. They are declared here for the one use above.

use pyo3::exceptions::{PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyMemoryView;
use std::ffi::{c_char, c_int, c_void, CStr};

/// CPython's `Py_buffer` (Include/pybuffer.h, unchanged since 3.3).
#[repr(C)]
struct PyBufferView {
    buf: *mut c_void,
    obj: *mut pyo3::ffi::PyObject,
    len: isize,
    itemsize: isize,
    readonly: c_int,
    ndim: c_int,
    format: *mut c_char,
    shape: *mut isize,
    strides: *mut isize,
    suboffsets: *mut isize,
    internal: *mut c_void,
}

/// `PyBUF_STRIDES | PyBUF_FORMAT` (= `PyBUF_RECORDS_RO`): shape and strides, read-only allowed,
/// no suboffsets (an exporter that needs them refuses).
const PYBUF_RECORDS_RO: c_int = 0x0010 | 0x0008 | 0x0004;

extern "C" {
    fn PyObject_GetBuffer(
        obj: *mut pyo3::ffi::PyObject,
        view: *mut PyBufferView,
        flags: c_int,
    ) -> c_int;
    fn PyBuffer_Release(view: *mut PyBufferView);
}

/// The memory a buffer-protocol object exports, and the memoryview that keeps it exported.
pub struct HostExport {
    pub ptr: *mut u8,
    pub len: usize,
    pub readonly: bool,
    pub view: Py<PyMemoryView>,
    /// Shape, strides (bytes) and item size as the exporter describes them.
    pub geometry: crate::memory::Geometry,
}

/// Exports `obj`'s memory through the buffer protocol. `Ok(None)` when `obj` does not support
/// it. Errors: `ValueError` for memory that is not one contiguous span (a strided NumPy view:
/// copy it with `numpy.ascontiguousarray`, or register its base).
pub fn export(obj: &Bound<'_, PyAny>) -> PyResult<Option<HostExport>> {
    let view = match PyMemoryView::from(obj) {
        Ok(v) => v,
        Err(e) if e.is_instance_of::<PyTypeError>(obj.py()) => return Ok(None),
        Err(e) => return Err(e),
    };
    // SAFETY: a zeroed Py_buffer is what PyObject_GetBuffer fills; `view` is a live object and
    // the GIL is held (we have a Bound).
    let mut b: PyBufferView = unsafe { std::mem::zeroed() };
    let rc = unsafe { PyObject_GetBuffer(view.as_ptr(), &mut b, PYBUF_RECORDS_RO) };
    if rc != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    let ndim = b.ndim.max(0) as usize;
    // SAFETY: with PyBUF_STRIDES the exporter fills `shape` and `strides` with `ndim` entries
    // (or leaves them null for ndim 0), valid until the release below.
    let (shape, strides) = unsafe {
        let shape = if b.shape.is_null() || ndim == 0 {
            &[][..]
        } else {
            std::slice::from_raw_parts(b.shape, ndim)
        };
        let strides =
            (!b.strides.is_null() && ndim > 0).then(|| std::slice::from_raw_parts(b.strides, ndim));
        (shape, strides)
    };
    let shape64: Vec<i64> = shape.iter().map(|&d| d as i64).collect();
    let strides64: Option<Vec<i64>> = strides.map(|s| s.iter().map(|&d| d as i64).collect());
    let dense = crate::memory::contiguous(&shape64, strides64.as_deref(), b.itemsize as i64);
    let geometry =
        crate::memory::Geometry::new(&shape64, strides64.as_deref(), 1, b.itemsize.max(1) as u64);
    let (ptr, len, readonly) = (b.buf as *mut u8, b.len.max(0) as usize, b.readonly != 0);
    // SAFETY: with PyBUF_FORMAT the format is null (meaning "B") or a C string valid until the
    // release below.
    let format = if b.format.is_null() {
        Vec::new()
    } else {
        unsafe { CStr::from_ptr(b.format) }.to_bytes().to_vec()
    };
    // SAFETY: `b` was filled by a successful PyObject_GetBuffer and is released once; nothing
    // it points to is read after this.
    unsafe { PyBuffer_Release(&mut b) };
    if holds_objects(&format, obj)? {
        return Err(PyTypeError::new_err(format!(
            "the {} object holds Python object references (a NumPy dtype with objects, a \
             ctypes py_object, buffer format 'O'), or views memory that does: gdpath moves \
             raw bytes, and bytes written over object references would crash the interpreter; \
             register numeric or byte memory",
            crate::error::type_name(obj)
        )));
    }
    if !dense {
        return Err(PyValueError::new_err(format!(
            "the {} object's memory is not contiguous (strides {:?} for shape {:?}): \
             register a contiguous copy (numpy.ascontiguousarray) or the array it views",
            obj.get_type().name()?,
            strides64.unwrap_or_default(),
            shape64
        )));
    }
    Ok(Some(HostExport {
        ptr,
        len,
        readonly,
        view: view.unbind(),
        geometry,
    }))
}

/// Whether the memory `obj` exports with buffer format `format` holds Python object
/// references, shown by the format ([`format_has_objects`]) or hidden from it
/// ([`hides_objects`]): bytes moved over them would crash the interpreter.
pub(crate) fn holds_objects(format: &[u8], obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    Ok(format_has_objects(format) || hides_objects(obj)?)
}

/// Whether a buffer-protocol format string (the `struct` module's syntax, with NumPy's `T{...}`
/// records) has an object-reference item (`O`), outside the `:name:` of a record's fields.
fn format_has_objects(format: &[u8]) -> bool {
    let mut in_name = false;
    format.iter().any(|&c| {
        if c == b':' {
            in_name = !in_name;
        }
        !in_name && c == b'O'
    })
}

/// Whether `obj`'s memory may hold Python object references that its buffer format does not
/// show: a NumPy array that is, or views along `.base`, an array whose dtype holds objects (a
/// multi-field view of a record with an object field shows only the other fields, its items
/// still spanning the references); a `memoryview` of such an exporter (`.obj`, a cast to
/// bytes included); a ctypes instance whose type has a `py_object` anywhere in it (a `Union`
/// reports format `B`).
fn hides_objects(obj: &Bound<'_, PyAny>) -> PyResult<bool> {
    let mut cur = obj.clone();
    // Owner chains are short; the bound only guards against a cycle.
    for _ in 0..32 {
        let has = cur
            .getattr("dtype")
            .and_then(|d| d.getattr("hasobject"))
            .and_then(|h| h.is_truthy())
            .unwrap_or(false);
        if has || ctypes_objects(&cur.get_type().into_any(), 0) {
            return Ok(true);
        }
        let next = if let Ok(v) = cur.cast::<PyMemoryView>() {
            v.getattr("obj").ok()
        } else {
            cur.getattr("base").ok()
        };
        match next {
            Some(n) if !n.is_none() => cur = n,
            _ => break,
        }
    }
    Ok(false)
}

/// Whether the ctypes type `t` has a `py_object` in it: its own `_type_` `"O"`, or in an
/// array's or pointer's element type or a structure's or union's fields, within a few levels
/// (a self-referencing structure ends there).
fn ctypes_objects(t: &Bound<'_, PyAny>, depth: usize) -> bool {
    if depth > 8 {
        return false;
    }
    if let Ok(ty) = t.getattr("_type_") {
        if ty.extract::<String>().is_ok_and(|c| c == "O") {
            return true;
        }
        if ty.is_instance_of::<pyo3::types::PyType>() && ctypes_objects(&ty, depth + 1) {
            return true;
        }
    }
    let Ok(fields) = t.getattr("_fields_") else {
        return false;
    };
    let Ok(iter) = fields.try_iter() else {
        return false;
    };
    iter.flatten()
        .any(|f| f.get_item(1).is_ok_and(|ty| ctypes_objects(&ty, depth + 1)))
}
