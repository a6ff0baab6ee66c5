//! `gdpath.Region` and `gdpath.Descriptor`: registered memory and the spans of it that posts
//! move, bound to the engine's `Region` and `Descriptor`. Below [`crate::agent`], which makes
//! regions, and [`crate::blocks`] and [`crate::net`], which take them.

use crate::error::IntoPy;
use gdpath::MemoryKind;
use pyo3::exceptions::{PyIndexError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::{PySlice, PySliceMethods};

/// Registered memory. `len(region)` is its length in bytes (a file's current size);
/// `region.desc(offset, length)` and `region[a:b]` give descriptors. Keeps the registered
/// object (`region.obj`) alive, and with it the memory.
#[pyclass(module = "gdpath._native", name = "Region", frozen)]
pub struct Region {
    pub(crate) region: gdpath::Region,
    pub(crate) obj: Option<Py<PyAny>>,
    pub(crate) via: &'static str,
    /// The owners of registered buffer memory that no pin holds (ctypes objects, NumPy arrays).
    pub(crate) guard: crate::buffer::Guard,
}

impl Region {
    /// A region the module made itself (remote memory, a checkpoint allocation).
    pub fn made(region: gdpath::Region, via: &'static str) -> Region {
        Region {
            region,
            obj: None,
            via,
            guard: Default::default(),
        }
    }

    /// Fails with kind `memory_moved` when the registered object's memory moved or was freed
    /// since registration ([`crate::buffer::Guard`]); every post that uses the region calls it
    /// first.
    pub(crate) fn check(&self, py: Python<'_>) -> PyResult<()> {
        self.guard.check(py, self.region.id().0)
    }

    fn length(&self, py: Python<'_>) -> PyResult<u64> {
        self.region.len().py_err(py)
    }
}

/// `(offset, length)` of `slice` over `len` bytes, as Python slices clip; step must be 1.
fn slice_range(slice: &Bound<'_, PySlice>, len: u64) -> PyResult<(u64, u64)> {
    let len_isize = isize::try_from(len).map_err(|_| PyValueError::new_err("region too large"))?;
    let ix = slice.indices(len_isize)?;
    if ix.step != 1 {
        return Err(PyValueError::new_err(
            "descriptors are contiguous: slice step must be 1",
        ));
    }
    let start = ix.start.max(0) as u64;
    let stop = (ix.stop.max(ix.start)).max(0) as u64;
    Ok((start, stop - start))
}

#[pymethods]
impl Region {
    /// A descriptor of `length` bytes at `offset` (default: from `offset` to the end). Bounds
    /// are checked at post (`out_of_bounds`), as the engine does.
    #[pyo3(signature = (offset=0, length=None))]
    fn desc(slf: &Bound<'_, Self>, offset: u64, length: Option<u64>) -> PyResult<Descriptor> {
        let py = slf.py();
        let length = match length {
            Some(l) => l,
            None => slf.get().length(py)?.saturating_sub(offset),
        };
        Ok(Descriptor {
            region: slf.clone().unbind(),
            offset,
            length,
        })
    }

    /// `region[a:b]`: the descriptor of bytes `a..b` (clipped as Python slices are).
    fn __getitem__(slf: &Bound<'_, Self>, key: &Bound<'_, PyAny>) -> PyResult<Descriptor> {
        let slice = key
            .cast::<PySlice>()
            .map_err(|_| PyTypeError::new_err("a region is sliced with [start:stop]"))?;
        let (offset, length) = slice_range(slice, slf.get().length(slf.py())?)?;
        Ok(Descriptor {
            region: slf.clone().unbind(),
            offset,
            length,
        })
    }

    /// Length in bytes (a file's current size).
    fn __len__(&self, py: Python<'_>) -> PyResult<usize> {
        Ok(self.length(py)? as usize)
    }

    /// Length in bytes, as an int of any size.
    #[getter]
    fn nbytes(&self, py: Python<'_>) -> PyResult<u64> {
        self.length(py)
    }

    /// The region's id, unique within the process.
    #[getter]
    fn id(&self) -> u64 {
        self.region.id().0
    }

    /// The memory kind: `"host (pageable)"`, `"host (pinned)"`, `"GPU 0"`, `"file"`,
    /// `"remote (name@address)"`.
    #[getter]
    fn kind(&self) -> String {
        self.region.kind().to_string()
    }

    /// `"cpu"` for host memory, `"cuda:N"` for GPU N, `"file"`, `"remote"`.
    #[getter]
    fn device(&self) -> String {
        match self.region.kind() {
            MemoryKind::Host { .. } => "cpu".into(),
            MemoryKind::Gpu { ordinal } => format!("cuda:{ordinal}"),
            MemoryKind::File => "file".into(),
            MemoryKind::Remote { .. } => "remote".into(),
        }
    }

    /// Whether host memory is page-locked (registered with CUDA).
    #[getter]
    fn pinned(&self) -> bool {
        matches!(self.region.kind(), MemoryKind::Host { pinned: true })
    }

    /// Whether the region is read-only memory (never written by a transfer).
    #[getter]
    fn read_only(&self) -> bool {
        self.region.is_read_only()
    }

    /// How the object was registered: `"buffer"`, `"dlpack"`, `"cuda_array_interface"`,
    /// `"file"`, `"remote"`, `"checkpoint"`.
    #[getter]
    fn source(&self) -> &'static str {
        self.via
    }

    /// The registered object (`None` for files and memory gdpath made).
    #[getter]
    fn obj(&self, py: Python<'_>) -> Option<Py<PyAny>> {
        self.obj.as_ref().map(|o| o.clone_ref(py))
    }

    /// The file's path, for file regions.
    #[getter]
    fn path(&self) -> Option<std::path::PathBuf> {
        self.region.file().map(|f| f.path().to_owned())
    }

    /// Descriptor pairs in flight on the region now.
    #[getter]
    fn in_flight(&self) -> usize {
        self.region.in_flight()
    }

    fn __repr__(&self) -> String {
        let len = self
            .region
            .len()
            .map(|l| l.to_string())
            .unwrap_or_else(|_| "?".into());
        format!(
            "gdpath.Region(id={}, kind={:?}, bytes={len}{})",
            self.region.id().0,
            self.region.kind().to_string(),
            if self.region.is_read_only() {
                ", read_only"
            } else {
                ""
            }
        )
    }
}

/// `length` bytes at `offset` of a region (bytes). Slicing a descriptor gives one relative to
/// it; bounds are checked at post.
#[pyclass(module = "gdpath._native", name = "Descriptor", frozen)]
pub struct Descriptor {
    region: Py<Region>,
    offset: u64,
    length: u64,
}

impl Descriptor {
    /// The engine's descriptor, once the region's memory is checked ([`Region::check`]).
    pub(crate) fn engine(&self, py: Python<'_>) -> PyResult<gdpath::Descriptor> {
        let r = self.region.bind(py).get();
        r.check(py)?;
        Ok(r.region.desc(self.offset, self.length))
    }
}

#[pymethods]
impl Descriptor {
    #[new]
    #[pyo3(signature = (region, offset=0, length=None))]
    fn new(region: Bound<'_, Region>, offset: u64, length: Option<u64>) -> PyResult<Descriptor> {
        Region::desc(&region, offset, length)
    }

    /// The region.
    #[getter]
    fn region(&self, py: Python<'_>) -> Py<Region> {
        self.region.clone_ref(py)
    }

    /// Offset in the region (bytes).
    #[getter]
    fn offset(&self) -> u64 {
        self.offset
    }

    /// Length (bytes).
    #[getter]
    fn length(&self) -> u64 {
        self.length
    }

    fn __len__(&self) -> usize {
        self.length as usize
    }

    /// `d[a:b]`: bytes `a..b` of this descriptor (clipped as Python slices are).
    fn __getitem__(&self, py: Python<'_>, key: &Bound<'_, PyAny>) -> PyResult<Descriptor> {
        let slice = key
            .cast::<PySlice>()
            .map_err(|_| PyTypeError::new_err("a descriptor is sliced with [start:stop]"))?;
        let (offset, length) = slice_range(slice, self.length)?;
        let offset = self
            .offset
            .checked_add(offset)
            .ok_or_else(|| PyIndexError::new_err("offset overflows"))?;
        Ok(Descriptor {
            region: self.region.clone_ref(py),
            offset,
            length,
        })
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        format!(
            "gdpath.Descriptor(region={}, offset={}, length={})",
            self.region.bind(py).get().region.id().0,
            self.offset,
            self.length
        )
    }
}
