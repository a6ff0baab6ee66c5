//! The load plan: one file read, one allocation, each tensor at its offset in it.

use super::header::{Header, TensorEntry};

/// A tensor's place in the loaded allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTensor {
    pub entry: TensorEntry,
    /// Byte offset of the tensor in the allocation.
    pub offset: u64,
}

/// How to load a checkpoint with one read: file bytes `read_offset .. read_offset + read_len`
/// go to allocation bytes `0 .. read_len`.
///
/// `read_offset` is the data section's start rounded down to `align` (the O_DIRECT / cuFile
/// alignment, 4096 bytes by default), so the one read is aligned at its start and needs no
/// unaligned head: the few header bytes before the data ride along. A tensor at data-section
/// offset `begin` lands at allocation offset `data_start - read_offset + begin`; safetensors
/// writers pad the header so `data_start` is a multiple of 8, hence tensors keep the alignment
/// their offsets have in the file (the allocation itself is 256-byte aligned, `cuMemAlloc`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LoadPlan {
    /// File offset of the read (bytes).
    pub read_offset: u64,
    /// Bytes read, and the allocation's length (at least 1: CUDA refuses empty allocations).
    pub read_len: u64,
    /// Bytes of tensor data (`Header::data_len`).
    pub tensor_bytes: u64,
    /// Tensors in file order.
    pub tensors: Vec<PlannedTensor>,
}

impl LoadPlan {
    /// The plan for `header` with reads aligned to `align` bytes (a power of two; other values
    /// are treated as 1, i.e. no realignment).
    pub fn new(header: &Header, align: u64) -> LoadPlan {
        let align = if align.is_power_of_two() { align } else { 1 };
        let read_offset = header.data_start & !(align - 1);
        let lead = header.data_start - read_offset;
        let read_len = (lead + header.data_len).max(1);
        let tensors = header
            .tensors
            .iter()
            .map(|t| PlannedTensor {
                offset: lead + (t.file_range.start - header.data_start),
                entry: t.clone(),
            })
            .collect();
        LoadPlan {
            read_offset,
            read_len,
            tensor_bytes: header.data_len,
            tensors,
        }
    }
}
