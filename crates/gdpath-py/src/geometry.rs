//! An array's shape and strides as its exporter describes them (buffer protocol, DLPack,
//! `__cuda_array_interface__`), and whether they make one dense span: below [`crate::buffer`],
//! [`crate::dlpack`] and [`crate::memory`], which all read arrays.

/// An array's shape, strides in bytes (C order filled in where the producer gave none) and
/// element size in bytes, as its exporter described it (buffer protocol, DLPack,
/// `__cuda_array_interface__`): what `gdpath.KvLayout.from_tensor` computes a layout from.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Geometry {
    pub shape: Vec<i64>,
    pub strides: Vec<i64>,
    pub itemsize: u64,
}

impl Geometry {
    /// `shape` with `strides` given in units of `unit` bytes (1 for the buffer protocol's and
    /// the CUDA array interface's byte strides, the item size for DLPack's element strides),
    /// or C-order strides when `None`.
    pub fn new(shape: &[i64], strides: Option<&[i64]>, unit: i64, itemsize: u64) -> Geometry {
        let strides = match strides {
            Some(s) => s.iter().map(|&x| x.saturating_mul(unit)).collect(),
            None => {
                let mut out = vec![0i64; shape.len()];
                let mut step = itemsize as i64;
                for i in (0..shape.len()).rev() {
                    out[i] = step;
                    step = step.saturating_mul(shape[i].max(1));
                }
                out
            }
        };
        Geometry {
            shape: shape.to_vec(),
            strides,
            itemsize,
        }
    }
}

/// Whether `shape` with `strides` (in multiples of `unit`: bytes with `unit` the item size, or
/// elements with `unit` 1; `None` means C order) is one dense span, in C or in Fortran order:
/// the memory of the buffer protocol, DLPack and `__cuda_array_interface__` alike.
pub fn contiguous(shape: &[i64], strides: Option<&[i64]>, unit: i64) -> bool {
    let Some(strides) = strides else { return true };
    if shape.contains(&0) {
        return true; // no bytes
    }
    let dense = |order: &mut dyn Iterator<Item = usize>| {
        let mut expect = unit;
        for i in order {
            if shape[i] != 1 && strides[i] != expect {
                return false;
            }
            expect = expect.saturating_mul(shape[i]);
        }
        true
    };
    dense(&mut (0..shape.len()).rev()) || dense(&mut (0..shape.len()))
}
