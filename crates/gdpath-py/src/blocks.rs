//! Block transfers (KV caches) from Python: `gdpath.KvLayout` (a registered region plus the
//! engine's [`gdpath::KvLayout`]), `agent.prepare_blocks` → `gdpath.PreparedBlocks` (the
//! engine's [`gdpath::PreparedBlocks`]: layouts checked and path planned once, posted with new
//! ids as often as needed), `agent.transfer_blocks` for one-off lists, and `gdpath.BatchReport`
//! (the copy method and descriptor counts of a block transfer's one pair). Ids come from NumPy
//! arrays and torch CPU tensors of 32/64-bit ints without a copy (DLPack), or from any sequence
//! of ints. Every check is the engine's ([`gdpath::blocks`]); its [`gdpath::BlockError`]s are
//! `gdpath.BlockError` with the fields as attributes.

use crate::agent::Agent;
use crate::dlpack::{KDL_CPU, KDL_CUDA_HOST};
use crate::error;
use crate::geometry::Geometry;
use crate::memory::{resolve, Options};
use crate::region::Region;
use crate::transfer::{seconds, BatchReport, PlannedPair, Transfer};
use gdpath::blocks::BlockError;
use gdpath::{BlockTransfer, CopyMethod, Error};
use pyo3::exceptions::{PyIndexError, PyOverflowError, PyTypeError, PyValueError};
use pyo3::prelude::*;
use pyo3::types::PyDict;
use std::time::Instant;

/// Adds the classes of this module to `gdpath._native`.
pub fn register(m: &Bound<'_, PyModule>) -> PyResult<()> {
    m.add_class::<KvLayout>()?;
    m.add_class::<PreparedBlocks>()?;
    m.add_class::<BatchReport>()?;
    Ok(())
}

// ---------------------------------------------------------------------------------------------
// Errors
// ---------------------------------------------------------------------------------------------

/// An engine error of a block transfer as a Python exception: [`Error::Blocks`] becomes
/// `gdpath.BlockError` (kind `blocks`) with `reason` (the variant, snake case) and the
/// variant's fields as attributes; every other error as the rest of the module raises it.
fn engine_err(py: Python<'_>, e: &Error) -> PyErr {
    let Error::Blocks(b) = e else {
        return error::engine(py, e);
    };
    match block_details(py, b) {
        Ok(d) => error::raise(py, "blocks", &e.to_string(), None, Some(d)),
        Err(err) => err,
    }
}

fn block_details<'py>(py: Python<'py>, b: &BlockError) -> PyResult<Bound<'py, PyDict>> {
    let d = PyDict::new(py);
    let reason = match b {
        BlockError::ZeroBlockSize { side } => {
            d.set_item("side", side.to_string())?;
            "zero_block_size"
        }
        BlockError::ZeroCount { side, dim } => {
            d.set_item("side", side.to_string())?;
            d.set_item("dim", dim.to_string())?;
            "zero_count"
        }
        BlockError::TooManyBlocks { side, blocks, max } => {
            d.set_item("side", side.to_string())?;
            d.set_item("blocks", blocks)?;
            d.set_item("max", max)?;
            "too_many_blocks"
        }
        BlockError::Overflow { side } => {
            d.set_item("side", side.to_string())?;
            "overflow"
        }
        BlockError::Overlap {
            side,
            dim,
            stride,
            needed,
        } => {
            d.set_item("side", side.to_string())?;
            d.set_item("dim", dim.to_string())?;
            d.set_item("stride", stride)?;
            d.set_item("needed", needed)?;
            "overlap"
        }
        BlockError::OutOfBounds {
            side,
            region,
            first_bad,
            blocks,
            needed,
            region_len,
        } => {
            d.set_item("side", side.to_string())?;
            d.set_item("region", region.0)?;
            d.set_item("first_bad", first_bad)?;
            d.set_item("blocks", blocks)?;
            d.set_item("needed", needed)?;
            d.set_item("region_len", region_len)?;
            "out_of_bounds"
        }
        BlockError::Mismatch { what, src, dst } => {
            d.set_item("what", *what)?;
            d.set_item("src", src)?;
            d.set_item("dst", dst)?;
            "mismatch"
        }
        BlockError::SharedRegionLayouts { region } => {
            d.set_item("region", region.0)?;
            "shared_region_layouts"
        }
        BlockError::Empty => "empty",
        BlockError::IdCountMismatch { src, dst } => {
            d.set_item("src", src)?;
            d.set_item("dst", dst)?;
            "id_count_mismatch"
        }
        BlockError::TooManyDescriptors { descriptors, max } => {
            d.set_item("descriptors", descriptors)?;
            d.set_item("max", max)?;
            "too_many_descriptors"
        }
        BlockError::NegativeId {
            side,
            position,
            value,
        } => {
            d.set_item("side", side.to_string())?;
            d.set_item("position", position)?;
            d.set_item("id", value)?;
            "negative_id"
        }
        BlockError::IdOutOfRange {
            side,
            position,
            id,
            blocks,
        } => {
            d.set_item("side", side.to_string())?;
            d.set_item("position", position)?;
            d.set_item("id", id)?;
            d.set_item("blocks", blocks)?;
            "id_out_of_range"
        }
        BlockError::DuplicateDestination { position, id } => {
            d.set_item("side", "destination")?;
            d.set_item("position", position)?;
            d.set_item("id", id)?;
            "duplicate_destination"
        }
        BlockError::SourceIsDestination { position, id } => {
            d.set_item("position", position)?;
            d.set_item("id", id)?;
            "source_is_destination"
        }
        // The engine may name new reasons; the message still says what.
        _ => "other",
    };
    d.set_item("reason", reason)?;
    Ok(d)
}

// ---------------------------------------------------------------------------------------------
// Layouts
// ---------------------------------------------------------------------------------------------

/// Where the blocks of a paged KV cache lie in a registered region (all in bytes).
///
/// `KvLayout(region, block_bytes, num_blocks, *, block_stride=None, num_layers=1,
/// layer_stride=None, kv_planes=1, kv_stride=None, offset=0)`: `num_blocks` slots (ids
/// `0 .. num_blocks`) of `block_bytes` bytes each, per layer and K/V plane. The slot of block
/// `id` in layer `l`, plane `k` starts at
/// `offset + l × layer_stride + k × kv_stride + id × block_stride` bytes into `region`.
/// Defaults lay the cache out as `[num_layers][kv_planes][num_blocks][block_bytes]`:
/// `block_stride = block_bytes`, `kv_stride = num_blocks × block_stride`,
/// `layer_stride = kv_planes × kv_stride`. One id of a transfer is `num_layers × kv_planes`
/// descriptors of `block_bytes`.
///
/// From a tensor's shape instead: `KvLayout.from_tensor(agent_or_region, tensor,
/// block_dim=0, kv_dim=None, layer_dim=None)` (vLLM's FlashAttention layer
/// `[2, num_blocks, block_size, heads, head_dim]` is `kv_dim=0, block_dim=1`; FlashInfer's
/// `[num_blocks, 2, block_size, heads, head_dim]` is `block_dim=0, kv_dim=1`; a CPU tier
/// `[num_blocks, layers, 2, ...]` is `block_dim=0, layer_dim=1, kv_dim=2`).
///
/// The layout is checked against its region when a transfer is prepared
/// (`agent.prepare_blocks`): a layout that reaches past the region, destination slots that
/// overlap, or layouts of different block shapes raise `gdpath.BlockError`.
#[pyclass(module = "gdpath._native", name = "KvLayout", frozen)]
pub struct KvLayout {
    region: Py<Region>,
    layout: gdpath::KvLayout,
}

fn mul(a: u64, b: u64, what: &str) -> PyResult<u64> {
    a.checked_mul(b)
        .ok_or_else(|| PyValueError::new_err(format!("the default {what} overflows 64 bits")))
}

/// Normalises a dimension index as Python indexes (`-1` is the last).
fn dim_index(d: i64, ndim: usize, name: &str) -> PyResult<usize> {
    let n = ndim as i64;
    let i = if d < 0 { d + n } else { d };
    if !(0..n).contains(&i) {
        return Err(PyIndexError::new_err(format!(
            "{name}={d} is not a dimension of a {ndim}-dimensional tensor"
        )));
    }
    Ok(i as usize)
}

/// The engine's layout of a tensor whose leading dimensions are the block, K/V-plane and layer
/// dimensions (in any order) and whose remaining dimensions are one block's contiguous bytes.
fn layout_of(
    g: &Geometry,
    block_dim: i64,
    kv_dim: Option<i64>,
    layer_dim: Option<i64>,
) -> PyResult<gdpath::KvLayout> {
    let ndim = g.shape.len();
    let b = dim_index(block_dim, ndim, "block_dim")?;
    let k = kv_dim.map(|d| dim_index(d, ndim, "kv_dim")).transpose()?;
    let l = layer_dim
        .map(|d| dim_index(d, ndim, "layer_dim"))
        .transpose()?;
    let mut named: Vec<usize> = [Some(b), k, l].into_iter().flatten().collect();
    named.sort_unstable();
    named.dedup();
    let lead = [Some(b), k, l].into_iter().flatten().count();
    if named.len() != lead {
        return Err(PyValueError::new_err(
            "block_dim, kv_dim and layer_dim must be different dimensions",
        ));
    }
    if named.iter().enumerate().any(|(i, &d)| i != d) {
        return Err(PyValueError::new_err(format!(
            "the block, K/V and layer dimensions ({named:?}) must be the leading dimensions of \
             the tensor (shape {:?}), in any order: the dimensions after them are one block's \
             bytes",
            g.shape
        )));
    }
    // One block: the trailing dimensions, dense in C order.
    let mut block = g.itemsize;
    for i in (lead..ndim).rev() {
        let n = u64::try_from(g.shape[i]).unwrap_or(0);
        if n != 1 && g.strides[i] != block as i64 {
            return Err(PyValueError::new_err(format!(
                "dimension {i} of one block is not contiguous (stride {} bytes, {block} \
                 expected; shape {:?}, strides {:?} bytes): a block must be one span",
                g.strides[i], g.shape, g.strides
            )));
        }
        block = block.saturating_mul(n);
    }
    let dim = |i: usize| -> PyResult<(u64, u64)> {
        let n = u64::try_from(g.shape[i]).unwrap_or(0);
        let s = u64::try_from(g.strides[i]).map_err(|_| {
            PyValueError::new_err(format!(
                "dimension {i} has a negative stride ({} bytes)",
                g.strides[i]
            ))
        })?;
        Ok((n, s))
    };
    let (blocks, block_stride) = dim(b)?;
    let mut layout = gdpath::KvLayout::new(block, blocks).block_stride(block_stride);
    if let Some(k) = k {
        let (n, s) = dim(k)?;
        layout = layout.kv(n, s);
    }
    if let Some(l) = l {
        let (n, s) = dim(l)?;
        layout = layout.layers(n, s);
    }
    Ok(layout)
}

#[pymethods]
impl KvLayout {
    #[new]
    #[pyo3(signature = (region, block_bytes, num_blocks, *, block_stride=None, num_layers=1, layer_stride=None, kv_planes=1, kv_stride=None, offset=0))]
    // The arguments are the Python signature's.
    #[allow(clippy::too_many_arguments)]
    fn new(
        region: Py<Region>,
        block_bytes: u64,
        num_blocks: u64,
        block_stride: Option<u64>,
        num_layers: u64,
        layer_stride: Option<u64>,
        kv_planes: u64,
        kv_stride: Option<u64>,
        offset: u64,
    ) -> PyResult<KvLayout> {
        let block_stride = block_stride.unwrap_or(block_bytes);
        let kv_stride = match kv_stride {
            Some(s) => s,
            None if kv_planes > 1 => mul(num_blocks, block_stride, "kv_stride")?,
            None => 0,
        };
        let layer_stride = match layer_stride {
            Some(s) => s,
            None if num_layers > 1 => {
                let plane = if kv_planes > 1 {
                    kv_stride
                } else {
                    mul(num_blocks, block_stride, "layer_stride")?
                };
                mul(kv_planes, plane, "layer_stride")?
            }
            None => 0,
        };
        Ok(KvLayout {
            region,
            layout: gdpath::KvLayout::new(block_bytes, num_blocks)
                .offset(offset)
                .block_stride(block_stride)
                .layers(num_layers, layer_stride)
                .kv(kv_planes, kv_stride),
        })
    }

    /// The layout of a KV-cache tensor (torch, CuPy, NumPy: anything `agent.register` takes),
    /// from its shape and strides: the dimensions `block_dim` (required), `kv_dim` and
    /// `layer_dim` (optional; negative indices count from the end) must be the tensor's leading
    /// dimensions, in any order; the dimensions after them are one block (contiguous, its bytes
    /// the product of their sizes × the element size). `target` is an `Agent` (the tensor is
    /// registered now, with `pinned` and `read_only` as `agent.register` takes them) or the
    /// `Region` the tensor is already registered as (`region.obj is tensor`).
    ///
    /// Errors: `IndexError` for a dimension the tensor does not have, `ValueError` for
    /// dimensions that are not the leading ones, a block that is not contiguous, a negative
    /// stride, a region of another object; `TypeError` for a `gdpath.File`; registration's
    /// errors.
    #[staticmethod]
    #[pyo3(signature = (target, tensor, *, block_dim=0, kv_dim=None, layer_dim=None, pinned=None, read_only=false))]
    // The arguments are the Python signature's.
    #[allow(clippy::too_many_arguments)]
    fn from_tensor(
        py: Python<'_>,
        target: &Bound<'_, PyAny>,
        tensor: Bound<'_, PyAny>,
        block_dim: i64,
        kv_dim: Option<i64>,
        layer_dim: Option<i64>,
        pinned: Option<bool>,
        read_only: bool,
    ) -> PyResult<KvLayout> {
        let r = resolve(
            &tensor,
            &Options {
                pinned,
                read_only,
                gpu: None,
            },
        )?;
        let Some(g) = r.geometry.clone() else {
            return Err(PyTypeError::new_err(
                "a file has no tensor shape: use KvLayout(region, block_bytes, num_blocks, ...)",
            ));
        };
        let layout = layout_of(&g, block_dim, kv_dim, layer_dim)?;
        let region = if let Ok(agent) = target.cast::<Agent>() {
            Py::new(py, agent.get().register_resolved(py, tensor, r)?)?
        } else if let Ok(region) = target.cast::<Region>() {
            let same = region
                .get()
                .obj
                .as_ref()
                .is_some_and(|o| o.bind(py).is(&tensor));
            if !same {
                return Err(PyValueError::new_err(
                    "the region was not registered from this tensor: pass the agent to \
                     register it, or the region agent.register(tensor) returned",
                ));
            }
            region.clone().unbind()
        } else {
            return Err(PyTypeError::new_err(
                "from_tensor's first argument is a gdpath.Agent or a gdpath.Region",
            ));
        };
        Ok(KvLayout { region, layout })
    }

    /// The region the blocks lie in.
    #[getter]
    fn region(&self, py: Python<'_>) -> Py<Region> {
        self.region.clone_ref(py)
    }

    /// Bytes of one block in one layer and plane (one descriptor).
    #[getter]
    fn block_bytes(&self) -> u64 {
        self.layout.block_size
    }

    /// Block slots per layer and plane (ids `0 .. num_blocks`).
    #[getter]
    fn num_blocks(&self) -> u64 {
        self.layout.blocks
    }

    /// Bytes from one block id's slot to the next's.
    #[getter]
    fn block_stride(&self) -> u64 {
        self.layout.block_stride
    }

    /// Layers.
    #[getter]
    fn num_layers(&self) -> u64 {
        self.layout.layers
    }

    /// Bytes from one layer to the next.
    #[getter]
    fn layer_stride(&self) -> u64 {
        self.layout.layer_stride
    }

    /// K/V planes (1: K and V in one block, 2: separate).
    #[getter]
    fn kv_planes(&self) -> u64 {
        self.layout.kv
    }

    /// Bytes from the K plane to the V plane.
    #[getter]
    fn kv_stride(&self) -> u64 {
        self.layout.kv_stride
    }

    /// Bytes from the region's start to block 0 of layer 0, plane 0.
    #[getter]
    fn offset(&self) -> u64 {
        self.layout.offset
    }

    /// Bytes one block id moves: `block_bytes × num_layers × kv_planes`.
    #[getter]
    fn bytes_per_block(&self) -> u64 {
        self.layout
            .block_size
            .saturating_mul(self.layout.descriptors_per_block())
    }

    /// Byte offset in the region of block `id`'s slot in `layer`, `plane` (the formula of the
    /// class). Errors: `IndexError` for an id, layer or plane outside the layout.
    #[pyo3(signature = (id, layer=0, plane=0))]
    fn block_offset(&self, id: u64, layer: u64, plane: u64) -> PyResult<u64> {
        let l = &self.layout;
        for (what, v, n) in [
            ("block id", id, l.blocks),
            ("layer", layer, l.layers),
            ("plane", plane, l.kv),
        ] {
            if v >= n {
                return Err(PyIndexError::new_err(format!(
                    "{what} {v} is outside the layout's {n}"
                )));
            }
        }
        [
            (layer, l.layer_stride),
            (plane, l.kv_stride),
            (id, l.block_stride),
        ]
        .iter()
        .try_fold(l.offset, |acc, &(i, s)| {
            i.checked_mul(s).and_then(|x| acc.checked_add(x))
        })
        .ok_or_else(|| PyValueError::new_err("the offset overflows 64 bits"))
    }

    fn __repr__(&self, py: Python<'_>) -> String {
        let l = &self.layout;
        format!(
            "gdpath.KvLayout(region={}, block_bytes={}, num_blocks={}, block_stride={}, \
             num_layers={}, layer_stride={}, kv_planes={}, kv_stride={}, offset={})",
            self.region.bind(py).get().region.id().0,
            l.block_size,
            l.blocks,
            l.block_stride,
            l.layers,
            l.layer_stride,
            l.kv,
            l.kv_stride,
            l.offset
        )
    }
}

// ---------------------------------------------------------------------------------------------
// Ids
// ---------------------------------------------------------------------------------------------

/// Block ids as a transfer takes them: borrowed from an array's memory (kept alive by its
/// DLPack capsule) in the array's integer type, or owned.
enum Ids {
    Borrowed {
        /// Keeps the memory `ptr` points into.
        _keep: Py<PyAny>,
        ptr: usize,
        len: usize,
        ty: IdType,
    },
    Owned(Owned),
}

/// Ids this module holds, in a type the engine takes: signed ones as `i64`, unsigned ones as
/// `u64`, so that every id keeps its value (a `u64` id above `i64::MAX` too).
enum Owned {
    I64(Vec<i64>),
    U64(Vec<u64>),
}

#[derive(Clone, Copy, PartialEq, Eq)]
enum IdType {
    I32,
    I64,
    U32,
    U64,
}

/// A view of ids in one of the engine's [`gdpath::BlockIndex`] types.
#[derive(Clone, Copy)]
enum IdSlice<'a> {
    I32(&'a [i32]),
    I64(&'a [i64]),
    U32(&'a [u32]),
    U64(&'a [u64]),
}

impl IdSlice<'_> {
    fn len(&self) -> usize {
        match self {
            IdSlice::I32(s) => s.len(),
            IdSlice::I64(s) => s.len(),
            IdSlice::U32(s) => s.len(),
            IdSlice::U64(s) => s.len(),
        }
    }

    /// Id `i`, in a type that holds every value of the four.
    fn get(&self, i: usize) -> i128 {
        match self {
            IdSlice::I32(s) => s[i].into(),
            IdSlice::I64(s) => s[i].into(),
            IdSlice::U32(s) => s[i].into(),
            IdSlice::U64(s) => s[i].into(),
        }
    }

    /// The ids as `i64` ([`unsigned_first`] said which ids must keep their value: those
    /// above `i64::MAX` come after the first error and are never read).
    fn to_i64(self) -> Vec<i64> {
        (0..self.len())
            .map(|i| i64::try_from(self.get(i)).unwrap_or(i64::MAX))
            .collect()
    }

    /// The ids as `u64` (as [`IdSlice::to_i64`]: a negative id, never read, becomes
    /// `u64::MAX`).
    fn to_u64(self) -> Vec<u64> {
        (0..self.len())
            .map(|i| u64::try_from(self.get(i)).unwrap_or(u64::MAX))
            .collect()
    }
}

/// Whether ids in two types (or an owned list of ints) go to the engine as `u64` rather than
/// `i64`: the first id only one of the two holds (a negative id, or one above `i64::MAX`), in
/// the order the engine checks them (position by position, the source's first), decides.
/// Every id before it fits both, and the engine's check stops at it (a negative id, or one
/// out of range: no layout has 2^63 blocks), so the error names its true value.
fn unsigned_first(ids: impl Iterator<Item = i128>) -> bool {
    for v in ids {
        if v < 0 {
            return false;
        }
        if v > i128::from(i64::MAX) {
            return true;
        }
    }
    false
}

/// The ids of a pair of lists in the engine's check order (a count mismatch is found before
/// any id is read).
fn pairwise<'a>(s: IdSlice<'a>, d: IdSlice<'a>) -> impl Iterator<Item = i128> + 'a {
    (0..s.len().min(d.len())).flat_map(move |i| [s.get(i), d.get(i)])
}

impl Ids {
    fn slice(&self) -> IdSlice<'_> {
        match self {
            Ids::Owned(Owned::I64(v)) => IdSlice::I64(v),
            Ids::Owned(Owned::U64(v)) => IdSlice::U64(v),
            &Ids::Borrowed { ptr, len, ty, .. } => {
                // SAFETY: `ptr` is the aligned start of `len` elements of type `ty` in host
                // memory exported by a DLPack producer, valid while `_keep` (its unconsumed
                // capsule) lives, which is as long as `self`.
                unsafe {
                    match ty {
                        IdType::I32 => IdSlice::I32(std::slice::from_raw_parts(ptr as _, len)),
                        IdType::I64 => IdSlice::I64(std::slice::from_raw_parts(ptr as _, len)),
                        IdType::U32 => IdSlice::U32(std::slice::from_raw_parts(ptr as _, len)),
                        IdType::U64 => IdSlice::U64(std::slice::from_raw_parts(ptr as _, len)),
                    }
                }
            }
        }
    }

    /// An owned copy (ids kept by a prepared transfer), signed or unsigned as given.
    fn owned(&self) -> Ids {
        let s = self.slice();
        Ids::Owned(match s {
            IdSlice::I32(_) | IdSlice::I64(_) => Owned::I64(s.to_i64()),
            IdSlice::U32(_) | IdSlice::U64(_) => Owned::U64(s.to_u64()),
        })
    }
}

/// Python ints as block ids (`which`: "src_ids" / "dst_ids"): `i64` unless an id needs `u64`
/// ([`unsigned_first`]). Errors: `OverflowError` naming an int no block id type holds (below
/// `-2^63` or above `2^64 - 1`) and its value.
fn owned_ints(obj: &Bound<'_, PyAny>, which: &str) -> PyResult<Owned> {
    let mut v: Vec<i128> = Vec::new();
    for (i, x) in obj.try_iter()?.enumerate() {
        let x = x?;
        let id = match x.extract::<i64>() {
            Ok(n) => i128::from(n),
            Err(_) => match x.extract::<u64>() {
                Ok(n) => i128::from(n),
                Err(e) if e.is_instance_of::<PyOverflowError>(x.py()) => {
                    return Err(PyOverflowError::new_err(format!(
                        "{which}[{i}] is {x}: no block id (an int from -2^63 to 2^64 - 1 = {})",
                        u64::MAX
                    )))
                }
                Err(e) => return Err(e),
            },
        };
        v.push(id);
    }
    Ok(if unsigned_first(v.iter().copied()) {
        Owned::U64(
            v.iter()
                .map(|&x| u64::try_from(x).unwrap_or(u64::MAX))
                .collect(),
        )
    } else {
        Owned::I64(
            v.iter()
                .map(|&x| i64::try_from(x).unwrap_or(i64::MAX))
                .collect(),
        )
    })
}

/// The ids `obj` holds (`which`: "src_ids" / "dst_ids", for messages): a 1-D array in host
/// memory of 32/64-bit ints through DLPack without a copy (NumPy, torch CPU tensors), else any
/// sequence of ints. Errors: `TypeError` for ids in GPU memory or what holds no ints,
/// `OverflowError` for an int no block id type holds.
fn ids_of(obj: &Bound<'_, PyAny>, which: &str) -> PyResult<Ids> {
    if obj.hasattr("__dlpack__")? {
        if let Ok(t) = crate::dlpack::import(obj) {
            if t.device_type != KDL_CPU && t.device_type != KDL_CUDA_HOST {
                return Err(PyTypeError::new_err(format!(
                    "{which} are in GPU memory: block ids are read on the CPU (pass \
                     ids.cpu() or a NumPy array)"
                )));
            }
            let g = &t.geometry;
            let ty = match (t.dtype_code, g.itemsize) {
                (0, 4) => Some(IdType::I32),
                (0, 8) => Some(IdType::I64),
                (1, 4) => Some(IdType::U32),
                (1, 8) => Some(IdType::U64),
                _ => None,
            };
            // An empty array may have a null data pointer, which no slice may have.
            let aligned = g.itemsize > 0 && t.ptr != 0 && t.ptr % g.itemsize == 0;
            if t.len == 0 && g.shape.len() == 1 {
                return Ok(Ids::Owned(Owned::I64(Vec::new())));
            }
            if let (Some(ty), true, 1) = (ty, aligned, g.shape.len()) {
                return Ok(Ids::Borrowed {
                    _keep: t.capsule,
                    ptr: t.ptr as usize,
                    len: (t.len / g.itemsize) as usize,
                    ty,
                });
            }
        }
    }
    // Other dtypes, strided arrays, lists, ranges: one Python int at a time.
    owned_ints(obj, which).map(Ids::Owned).map_err(|e| {
        if e.is_instance_of::<PyOverflowError>(obj.py()) {
            e
        } else {
            PyTypeError::new_err(format!(
                "{which}: block ids are a 1-D array or a sequence of ints ({e})"
            ))
        }
    })
}

/// A column of unsigned integers (`which` names it in messages): a 1-D NumPy array or torch CPU
/// tensor of 32/64-bit ints read in place, else any sequence of ints. A negative value becomes
/// `u64::MAX`, which no offset, length or index of a real region reaches, so the checks that
/// follow refuse it. Errors: as [`ids_of`].
pub(crate) fn u64_column(obj: &Bound<'_, PyAny>, which: &str) -> PyResult<Vec<u64>> {
    Ok(ids_of(obj, which)?.slice().to_u64())
}

// ---------------------------------------------------------------------------------------------
// Prepared transfers
// ---------------------------------------------------------------------------------------------

/// A block transfer whose layouts are checked and whose path is planned
/// (`agent.prepare_blocks`): post it with new ids as often as needed, from any thread.
///
/// `transfer(src_ids=None, dst_ids=None, *, timeout=None)` copies block `src_ids[i]` of the
/// source layout to block `dst_ids[i]` of the destination, in every layer and plane, and
/// returns the `Transfer` (`wait()`, `await`); without ids it posts those given to
/// `prepare_blocks`. `plan` is the planned path (`PlannedPair`), `is_block_list` whether a
/// backend moves the list in one call (else it is expanded into descriptor pairs: a file, a
/// peer on another host), `src` / `dst` the layouts.
#[pyclass(module = "gdpath._native", name = "PreparedBlocks", frozen)]
pub struct PreparedBlocks {
    inner: gdpath::PreparedBlocks,
    src: Py<KvLayout>,
    dst: Py<KvLayout>,
    ids: Option<(Ids, Ids)>,
    method: Option<CopyMethod>,
}

/// Prepares `src` → `dst` on `agent` (`Agent.prepare_blocks`).
pub fn prepare(
    agent: &gdpath::Agent,
    src: &Bound<'_, KvLayout>,
    dst: &Bound<'_, KvLayout>,
    src_ids: Option<Bound<'_, PyAny>>,
    dst_ids: Option<Bound<'_, PyAny>>,
    method: Option<&str>,
) -> PyResult<PreparedBlocks> {
    let py = src.py();
    let method = method
        .map(|m| {
            CopyMethod::parse(m).ok_or_else(|| {
                PyValueError::new_err(format!(
                    "method {m:?}: one of \"copies\", \"driver-batch\", \"kernel\" (or None)"
                ))
            })
        })
        .transpose()?;
    let ids = match (src_ids, dst_ids) {
        (None, None) => None,
        (Some(s), Some(d)) => Some((
            ids_of(&s, "src_ids")?.owned(),
            ids_of(&d, "dst_ids")?.owned(),
        )),
        _ => {
            return Err(PyTypeError::new_err(
                "give both src_ids and dst_ids, or neither",
            ))
        }
    };
    let (s, d) = (src.get(), dst.get());
    s.region.bind(py).get().check(py)?;
    d.region.bind(py).get().check(py)?;
    let mut t = BlockTransfer::new(
        &s.region.bind(py).get().region,
        s.layout,
        &d.region.bind(py).get().region,
        d.layout,
    );
    if let Some(m) = method {
        t = t.method(m);
    }
    let a = agent.clone();
    let inner = py
        .detach(move || a.prepare_blocks(t))
        .map_err(|e| engine_err(py, &e))?;
    Ok(PreparedBlocks {
        inner,
        src: src.clone().unbind(),
        dst: dst.clone().unbind(),
        ids,
        method,
    })
}

impl PreparedBlocks {
    /// Posts the ids given (or the prepared ones) with the GIL released.
    pub fn post(
        &self,
        py: Python<'_>,
        src_ids: Option<&Bound<'_, PyAny>>,
        dst_ids: Option<&Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Transfer> {
        let deadline = match timeout {
            Some(t) => Instant::now().checked_add(seconds("timeout", t)?),
            None => None,
        };
        let given;
        let (s, d) = match (src_ids, dst_ids, &self.ids) {
            (Some(s), Some(d), _) => {
                given = (ids_of(s, "src_ids")?, ids_of(d, "dst_ids")?);
                (&given.0, &given.1)
            }
            (None, None, Some((s, d))) => (s, d),
            (None, None, None) => {
                return Err(PyTypeError::new_err(
                    "no block ids: pass src_ids and dst_ids (none were given to \
                     prepare_blocks)",
                ))
            }
            _ => {
                return Err(PyTypeError::new_err(
                    "give both src_ids and dst_ids, or neither",
                ))
            }
        };
        for layout in [&self.src, &self.dst] {
            layout.bind(py).get().region.bind(py).get().check(py)?;
        }
        let p = &self.inner;
        let (ss, ds) = (s.slice(), d.slice());
        let r = py.detach(move || match (ss, ds) {
            (IdSlice::I32(a), IdSlice::I32(b)) => p.post_until(a, b, deadline),
            (IdSlice::I64(a), IdSlice::I64(b)) => p.post_until(a, b, deadline),
            (IdSlice::U32(a), IdSlice::U32(b)) => p.post_until(a, b, deadline),
            (IdSlice::U64(a), IdSlice::U64(b)) => p.post_until(a, b, deadline),
            (a, b) if unsigned_first(pairwise(a, b)) => {
                p.post_until(&a.to_u64(), &b.to_u64(), deadline)
            }
            (a, b) => p.post_until(&a.to_i64(), &b.to_i64(), deadline),
        });
        let t = r.map_err(|e| engine_err(py, &e))?;
        Ok(Transfer::new(t, deadline))
    }
}

#[pymethods]
impl PreparedBlocks {
    /// Copies block `src_ids[i]` → `dst_ids[i]` (every layer and plane) for every `i` and
    /// returns the `Transfer`; the ids are checked (in one pass, the layouts are not checked
    /// again) before any byte moves. `src_ids` / `dst_ids`: equal-length 1-D int arrays
    /// (NumPy, torch CPU tensors of int32/int64/uint32/uint64 are read in place; other ints
    /// and sequences are converted) or `None` for the ids given to `prepare_blocks`.
    /// `timeout`: seconds to the transfer's deadline. Host ↔ host lists are copied on the
    /// calling thread (with the GIL released) and are done when this returns.
    ///
    /// Errors: `gdpath.BlockError` (`.reason` `empty`, `id_count_mismatch`, `negative_id`,
    /// `id_out_of_range`, `duplicate_destination`, `source_is_destination`,
    /// `too_many_descriptors`, with `.side`, `.position`, `.id`), `deregistered` /
    /// `region_busy` for a region deregistered or viewed since, `TypeError` for ids that are
    /// not ints or are in GPU memory.
    #[pyo3(signature = (src_ids=None, dst_ids=None, *, timeout=None))]
    fn transfer(
        &self,
        py: Python<'_>,
        src_ids: Option<Bound<'_, PyAny>>,
        dst_ids: Option<Bound<'_, PyAny>>,
        timeout: Option<f64>,
    ) -> PyResult<Transfer> {
        self.post(py, src_ids.as_ref(), dst_ids.as_ref(), timeout)
    }

    /// The planned path every post takes (`backend`, `path`, `finding`).
    #[getter]
    fn plan(&self) -> PlannedPair {
        PlannedPair::from(self.inner.plan())
    }

    /// Whether a backend moves the whole list in one call (`cuda`, `host-copy`), or each post
    /// is expanded into one descriptor pair per merged run.
    #[getter]
    fn is_block_list(&self) -> bool {
        self.inner.is_block_list()
    }

    /// The source layout.
    #[getter]
    fn src(&self, py: Python<'_>) -> Py<KvLayout> {
        self.src.clone_ref(py)
    }

    /// The destination layout.
    #[getter]
    fn dst(&self, py: Python<'_>) -> Py<KvLayout> {
        self.dst.clone_ref(py)
    }

    /// The copy method forced at prepare (`None`: the backend's choice).
    #[getter]
    fn method(&self) -> Option<&'static str> {
        self.method.map(CopyMethod::name)
    }

    fn __repr__(&self) -> String {
        let p = self.inner.plan();
        format!(
            "gdpath.PreparedBlocks(backend={:?}, path={:?}, block_list={}, method={})",
            p.backend,
            p.path.name(),
            if self.inner.is_block_list() {
                "True"
            } else {
                "False"
            },
            match self.method {
                Some(m) => format!("{:?}", m.name()),
                None => "None".into(),
            }
        )
    }
}
