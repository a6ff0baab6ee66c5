//! Host memory through the buffer protocol (PEP 3118): `bytearray`, `bytes`, `memoryview`,
//! NumPy arrays, `mmap`, `array.array`.
//!
//! The region keeps a `memoryview` of the object: it holds one export of the buffer for as
//! long as the engine holds the memory (the region, its transfers and exports), and an exporter
//! that counts its exports then refuses to free or move the memory (`bytearray`, `array.array`
//! and `mmap.mmap` raise `BufferError` on a resize or close). The address, length and read-only
//! flag are read once, through a second, short-lived export of that memoryview.
//!
//! Along the object's owner chain ([`owners`]: a memoryview's `.obj`, an array's `.base`, a
//! ctypes object's `_b_base_`) the registration also holds an export of every other exporter
//! (the `mmap` an `np.memmap` lies in, of which NumPy holds none). Two exporters do not count
//! exports, and [`export`] covers them:
//! - a NumPy array frees its memory on `resize(..., refcheck=False)` whatever views it has
//!   out, but refuses any resize while it has a weak reference (`PyArray_Resize` in NumPy's
//!   `shape.c`: `weakreflist != NULL`): the registration holds a `weakref.ref` to every array
//!   in the chain, which pins them;
//! - `ctypes.resize` reallocates a ctypes object's memory with nothing to refuse it, and an
//!   array's `__setstate__` frees it: no pin exists, so the registration records each array's
//!   and ctypes object's address and length ([`Guard`]), and every post re-reads them first and
//!   fails with kind `memory_moved` when they changed.
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

/// `PyBUF_INDIRECT` without `PyBUF_FORMAT`: the request every exporter answers (any strides,
/// suboffsets allowed, no format to describe), which [`Guard`] re-reads an owner's address
/// and length with.
const PYBUF_INDIRECT: c_int = 0x0100 | 0x0010 | 0x0008;

/// The memory a buffer-protocol object exports, and what keeps it in place.
pub struct HostExport {
    pub ptr: *mut u8,
    pub len: usize,
    pub readonly: bool,
    /// What the engine keeps for the registration's whole life: a tuple of the memoryview that
    /// holds the export, then the pins ([`hold`]: a `weakref.ref` to each NumPy array of the
    /// owner chain, a memoryview of each other exporter in it).
    pub keep: Py<PyAny>,
    /// The owners no pin holds, checked before every post.
    pub guard: Guard,
    /// Shape, strides (bytes) and item size as the exporter describes them.
    pub geometry: crate::geometry::Geometry,
}

/// An owner of registered memory that can free or move it while it is exported (a NumPy array,
/// a ctypes object), with the address and length (bytes) it exported at registration.
struct Watched {
    obj: Py<PyAny>,
    addr: usize,
    len: isize,
}

/// The owners of a registered buffer that can move or free its memory with nothing to refuse
/// it (see the module doc); [`Guard::check`] runs before every post that uses the region.
#[derive(Default)]
pub struct Guard {
    watched: Vec<Watched>,
}

impl Guard {
    /// Fails when an owner's memory moved or changed length since registration: kind
    /// `memory_moved` (`gdpath.DescriptorError`), naming region `region`. A change made while a
    /// transfer is in flight is not seen by this check (nothing can refuse it).
    pub fn check(&self, py: Python<'_>, region: u64) -> PyResult<()> {
        for w in &self.watched {
            let obj = w.obj.bind(py);
            let now = span(obj).ok();
            if now != Some((w.addr, w.len)) {
                let was = format!("{} bytes at {:#x}", w.len, w.addr);
                let is = now.map_or_else(
                    || "no buffer".to_owned(),
                    |(a, l)| format!("{l} bytes at {a:#x}"),
                );
                return Err(crate::error::raise(
                    py,
                    "memory_moved",
                    &format!(
                        "region {region}: the memory of the {} it was registered from moved or \
                         was freed since registration (was {was}, now {is}: ctypes.resize, or \
                         an array's __setstate__); nothing was moved: register the object again",
                        crate::error::type_name(obj)
                    ),
                    None,
                    None,
                ));
            }
        }
        Ok(())
    }
}

/// The address and length (bytes) `obj` exports now, through a short-lived export.
fn span(obj: &Bound<'_, PyAny>) -> PyResult<(usize, isize)> {
    // SAFETY: a zeroed Py_buffer is what PyObject_GetBuffer fills; the GIL is held.
    let mut b: PyBufferView = unsafe { std::mem::zeroed() };
    // SAFETY: `obj` is a live object (a Bound), the GIL is held and `b` is a Py_buffer to fill.
    if unsafe { PyObject_GetBuffer(obj.as_ptr(), &mut b, PYBUF_INDIRECT) } != 0 {
        return Err(PyErr::fetch(obj.py()));
    }
    let out = (b.buf as usize, b.len);
    // SAFETY: filled by the successful call above, released once, not read after.
    unsafe { PyBuffer_Release(&mut b) };
    Ok(out)
}

/// `obj` and the objects that own its memory, nearest first: a memoryview's `.obj`, a NumPy
/// array's `.base`, a ctypes object's `_b_base_` (the object whose memory it lies in).
fn owners<'py>(obj: &Bound<'py, PyAny>) -> Vec<Bound<'py, PyAny>> {
    let mut chain = vec![obj.clone()];
    // Owner chains are short; the bound only guards against a cycle.
    while chain.len() < 32 {
        let cur = &chain[chain.len() - 1];
        let next = if let Ok(v) = cur.cast::<PyMemoryView>() {
            v.getattr("obj").ok()
        } else if is_ndarray(cur) {
            cur.getattr("base").ok()
        } else if is_ctypes(cur) {
            cur.getattr("_b_base_").ok()
        } else {
            None
        };
        match next {
            Some(n) if !n.is_none() => chain.push(n),
            _ => break,
        }
    }
    chain
}

/// Whether `obj` is a NumPy array (a subclass too); false when NumPy was never imported, as
/// then none exists.
fn is_ndarray(obj: &Bound<'_, PyAny>) -> bool {
    loaded_type(obj.py(), "numpy", &["ndarray"])
        .is_some_and(|t| t.iter().any(|t| obj.is_instance(t).unwrap_or(false)))
}

/// Whether `obj` is a ctypes data object (simple, array, structure, union, pointer, function
/// pointer); false when ctypes was never imported.
fn is_ctypes(obj: &Bound<'_, PyAny>) -> bool {
    const KINDS: [&str; 6] = [
        "_SimpleCData",
        "Array",
        "Structure",
        "Union",
        "_Pointer",
        "CFuncPtr",
    ];
    loaded_type(obj.py(), "_ctypes", &KINDS)
        .is_some_and(|t| t.iter().any(|t| obj.is_instance(t).unwrap_or(false)))
}

/// Attributes `names` of module `module` where it is already imported (`sys.modules`), without
/// importing it.
fn loaded_type<'py>(
    py: Python<'py>,
    module: &str,
    names: &[&str],
) -> Option<Vec<Bound<'py, PyAny>>> {
    let m = py
        .import("sys")
        .and_then(|s| s.getattr("modules"))
        .and_then(|m| m.get_item(module))
        .ok()?;
    Some(names.iter().filter_map(|n| m.getattr(*n).ok()).collect())
}

/// The pins and the guard of `obj`'s memory: a `weakref.ref` to each NumPy array of its owner
/// chain (a weakly referenced array refuses to resize), a buffer export of each other owner
/// past `obj` itself (NumPy keeps none of the `mmap` an `np.memmap` or `ndarray(buffer=...)`
/// lies in, which would otherwise close under it), and each array and ctypes object of the
/// chain watched at the address and length it exports now.
fn hold<'py>(obj: &Bound<'py, PyAny>) -> PyResult<(Vec<Bound<'py, PyAny>>, Guard)> {
    let py = obj.py();
    let mut pins = Vec::new();
    let mut guard = Guard::default();
    for (i, o) in owners(obj).into_iter().enumerate() {
        let array = is_ndarray(&o);
        if array {
            pins.push(py.import("weakref")?.getattr("ref")?.call1((&o,))?);
        } else if i > 0 && !o.is_instance_of::<PyMemoryView>() {
            // An owner that is no exporter has nothing to hold.
            if let Ok(v) = PyMemoryView::from(&o) {
                pins.push(v.into_any());
            }
        }
        if array || is_ctypes(&o) {
            let (addr, len) = span(&o)?;
            guard.watched.push(Watched {
                obj: o.unbind(),
                addr,
                len,
            });
        }
    }
    Ok((pins, guard))
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
    // SAFETY: `view` is a live object, the GIL is held and `b` is a Py_buffer to fill.
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
    let dense = crate::geometry::contiguous(&shape64, strides64.as_deref(), b.itemsize as i64);
    let geometry =
        crate::geometry::Geometry::new(&shape64, strides64.as_deref(), 1, b.itemsize.max(1) as u64);
    let (ptr, len, readonly) = (b.buf as *mut u8, b.len.max(0) as usize, b.readonly != 0);
    let format = if b.format.is_null() {
        Vec::new()
    } else {
        // SAFETY: with PyBUF_FORMAT the format is null (meaning "B") or a C string valid until
        // the release below.
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
    let (pins, guard) = hold(obj)?;
    let mut items = vec![view.into_any()];
    items.extend(pins);
    let keep = pyo3::types::PyTuple::new(obj.py(), items)?;
    Ok(Some(HostExport {
        ptr,
        len,
        readonly,
        keep: keep.into_any().unbind(),
        guard,
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
