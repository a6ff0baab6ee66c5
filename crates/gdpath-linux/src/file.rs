//! What the kernel says about files: O_DIRECT alignment (`statx(STATX_DIOALIGN)`), the page
//! size, and the open flag for O_DIRECT. Safe calls through `rustix` and `std`.

use std::fs::File;

/// The `open(2)` flag for O_DIRECT, for `crate::file::open_regular`'s `flags` (which sets a
/// file's custom flags once, with its own `O_NONBLOCK | O_NOCTTY`).
pub const O_DIRECT: i32 = libc::O_DIRECT;

/// The O_DIRECT alignments of an open file from `statx(STATX_DIOALIGN)` (Linux 6.1+):
/// `(file offset and length alignment, memory address alignment)` in bytes, or `None` when the
/// kernel or the file system does not report them (or reports O_DIRECT unsupported: offset
/// alignment 0).
pub fn dio_align(f: &File) -> Option<(u32, u32)> {
    use rustix::fs::{statx, AtFlags, StatxFlags};
    let stx = statx(f, "", AtFlags::EMPTY_PATH, StatxFlags::DIOALIGN).ok()?;
    (stx.stx_mask & StatxFlags::DIOALIGN.bits() != 0 && stx.stx_dio_offset_align != 0)
        .then_some((stx.stx_dio_offset_align, stx.stx_dio_mem_align))
}

/// The page size in bytes (`AT_PAGESZ` from the auxiliary vector).
pub fn page_size() -> usize {
    rustix::param::page_size()
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_page_is_a_power_of_two_of_at_least_4_kib() {
        let p = super::page_size();
        assert!(p.is_power_of_two() && p >= 4096, "{p}");
    }

    #[test]
    fn dio_alignment_when_reported_is_a_power_of_two() {
        let f = tempfile::tempfile().unwrap();
        // Kernels before 6.1 and some file systems report nothing: None is a valid answer.
        if let Some((off, mem)) = super::dio_align(&f) {
            assert!(off.is_power_of_two(), "{off}");
            assert!(mem == 0 || mem.is_power_of_two(), "{mem}");
        }
    }
}
