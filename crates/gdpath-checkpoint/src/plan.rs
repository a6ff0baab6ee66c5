//! The load plan: one file read, one allocation, each tensor at its offset in it.

use super::header::{Header, TensorEntry};

/// A tensor's place in the loaded allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlannedTensor {
    /// The header's entry for it (name, dtype, shape, byte range in the file).
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

/// `align` as a usable alignment: a power of two, else 1 (no realignment).
fn usable(align: u64) -> u64 {
    if align.is_power_of_two() {
        align
    } else {
        1
    }
}

impl LoadPlan {
    /// The plan for `header` with reads aligned to `align` bytes (a power of two; other values
    /// are treated as 1, i.e. no realignment).
    pub fn new(header: &Header, align: u64) -> LoadPlan {
        let align = usable(align);
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

/// One read of a [`CheckpointPlan`]: bytes `offset .. offset + len` of file `file` go to
/// allocation bytes `at .. at + len`.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct PlannedRead {
    /// Index of the file in the checkpoint's list.
    pub file: usize,
    /// File offset (bytes), a multiple of the plan's alignment.
    pub offset: u64,
    /// Bytes read.
    pub len: u64,
    /// Allocation offset (bytes), a multiple of the plan's alignment.
    pub at: u64,
}

/// A tensor's place in a [`CheckpointPlan`]'s allocation.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PlacedTensor {
    /// The header's entry for it (name, dtype, shape, byte range in its file).
    pub entry: TensorEntry,
    /// Index of its file in the checkpoint's list.
    pub file: usize,
    /// Byte offset of the tensor in the allocation.
    pub offset: u64,
}

/// How to load tensors of one or several files (a sharded checkpoint) into one allocation: one
/// read per run of adjacent tensors of a file (for whole files, one read per file, as
/// [`LoadPlan`]), each starting at a file offset rounded down to the alignment and placed at
/// the next aligned allocation offset, so every read is aligned at both ends' starts and
/// tensors keep the alignment their offsets have in the file.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CheckpointPlan {
    /// Reads in allocation order (pair `i` of the load's transfer is `reads[i]`).
    pub reads: Vec<PlannedRead>,
    /// The allocation's length in bytes (at least 1: CUDA refuses empty allocations).
    pub len: u64,
    /// Bytes of the tensors placed.
    pub tensor_bytes: u64,
    /// Tensors in plan order (file by file, in file order within each).
    pub tensors: Vec<PlacedTensor>,
}

impl CheckpointPlan {
    /// Places `picks` — (file index, tensor) in file order within each file — with reads
    /// aligned to `align` bytes (a power of two; other values are treated as 1). Tensors of one
    /// file whose byte ranges follow each other share a read; tensors of no bytes need none.
    pub fn new<'a>(
        picks: impl IntoIterator<Item = (usize, &'a TensorEntry)>,
        align: u64,
    ) -> CheckpointPlan {
        let align = usable(align);
        let round_up = |x: u64| x.div_ceil(align) * align;
        let mut plan = CheckpointPlan {
            reads: Vec::new(),
            len: 0,
            tensor_bytes: 0,
            tensors: Vec::new(),
        };
        // The read being built: its planned read and the file offset its lead ends at.
        let mut open: Option<PlannedRead> = None;
        let mut cursor = 0u64;
        for (file, entry) in picks {
            let (start, end) = (entry.file_range.start, entry.file_range.end);
            plan.tensor_bytes += end - start;
            let extends = open.is_some_and(|r| r.file == file && r.offset + r.len == start);
            if start == end && !extends {
                // No bytes to read: place it at the cursor, outside any read.
                plan.tensors.push(PlacedTensor {
                    entry: entry.clone(),
                    file,
                    offset: cursor,
                });
                continue;
            }
            if !extends {
                if let Some(r) = open.take() {
                    plan.reads.push(r);
                }
                let offset = start & !(align - 1);
                open = Some(PlannedRead {
                    file,
                    offset,
                    len: start - offset,
                    at: round_up(cursor),
                });
            }
            let r = open.as_mut().expect("a read is open");
            r.len += end - start;
            cursor = r.at + r.len;
            plan.tensors.push(PlacedTensor {
                entry: entry.clone(),
                file,
                offset: r.at + (start - r.offset),
            });
        }
        plan.reads.extend(open);
        plan.len = cursor.max(1);
        plan
    }

    /// Every tensor of every header, one read per file (a file of no tensor bytes reads none).
    pub fn whole(headers: &[&Header], align: u64) -> CheckpointPlan {
        Self::new(
            headers
                .iter()
                .enumerate()
                .flat_map(|(i, h)| h.tensors.iter().map(move |t| (i, t))),
            align,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::Dtype;

    fn entry(name: &str, start: u64, end: u64) -> TensorEntry {
        TensorEntry {
            name: name.into(),
            dtype: Dtype::U8,
            shape: vec![end - start],
            file_range: start..end,
        }
    }

    #[test]
    fn adjacent_tensors_share_a_read_and_reads_are_aligned() {
        let f0 = [
            entry("a", 104, 200),
            entry("b", 200, 5000),
            entry("z", 5000, 5000),
        ];
        let f1 = [entry("c", 72, 80), entry("d", 9000, 9010)];
        let picks = f0.iter().map(|t| (0, t)).chain(f1.iter().map(|t| (1, t)));
        let p = CheckpointPlan::new(picks, 4096);
        // File 0: one read from 0 (104 rounded down) to 5000; file 1: c, then d (not adjacent).
        assert_eq!(
            p.reads,
            vec![
                PlannedRead {
                    file: 0,
                    offset: 0,
                    len: 5000,
                    at: 0
                },
                PlannedRead {
                    file: 1,
                    offset: 0,
                    len: 80,
                    at: 8192
                },
                PlannedRead {
                    file: 1,
                    offset: 8192,
                    len: 818,
                    at: 12288
                },
            ]
        );
        let at: Vec<u64> = p.tensors.iter().map(|t| t.offset).collect();
        assert_eq!(at, vec![104, 200, 5000, 8192 + 72, 12288 + 808]);
        assert_eq!(p.len, 12288 + 818);
        assert_eq!(p.tensor_bytes, 96 + 4800 + 8 + 10);
        // Every tensor keeps its file offset modulo the alignment.
        for t in &p.tensors {
            assert_eq!(
                t.offset % 4096,
                t.entry.file_range.start % 4096,
                "{}",
                t.entry.name
            );
        }
    }

    #[test]
    fn tensors_of_no_bytes_need_no_read_and_an_empty_plan_has_one_byte() {
        let e = [entry("e", 64, 64), entry("f", 64, 64)];
        let p = CheckpointPlan::new(e.iter().map(|t| (0, t)), 4096);
        assert!(p.reads.is_empty());
        assert_eq!(p.len, 1);
        assert_eq!(p.tensors.len(), 2);
        let p = CheckpointPlan::new(std::iter::empty(), 4096);
        assert_eq!((p.reads.len(), p.len, p.tensor_bytes), (0, 1, 0));
    }
}
