//! The allocator policy of a serving agent (glibc only): keep freed memory instead of giving it
//! back to the kernel after every message. Applied when an agent starts serving, unless
//! `NetConfig::keep_freed_memory` is off or the environment chose the thresholds; the settings
//! are the process's (`mallopt`), so they stay after the agent is gone.
//!
//! A server that receives packed writes (docs/network.md, "Packed writes over tcp") gets each
//! message of more than one tcp segment assembled by UCX in a fresh allocation of up to 512 KiB,
//! freed when the writes are applied. At glibc's defaults that memory goes back to the kernel
//! per message and its pages fault back in on the next: a 64 KiB allocation trims the heap
//! (`M_TRIM_THRESHOLD`, 128 KiB), a 256 KiB one is a `mmap` of its own (`M_MMAP_THRESHOLD`,
//! 128 KiB at start), which cost packed writes of 64 KiB and more about half their rate
//! (docs/benchmarks.md, "Measurements behind the defaults", `AM_HOLD_MIN`, `TRIM_THRESHOLD` /
//! `MMAP_THRESHOLD`).

/// Freed bytes glibc may keep at the top of a heap before returning them (`M_TRIM_THRESHOLD`).
pub(crate) const TRIM_THRESHOLD: usize = 64 << 20;
/// Allocations from this many bytes on get a `mmap` of their own (`M_MMAP_THRESHOLD`): above
/// the largest control message (`gdpath_ucx::AM_MAX_MESSAGE`, 1 MiB).
pub(crate) const MMAP_THRESHOLD: usize = 4 << 20;

/// Sets glibc's trim and mmap thresholds to [`TRIM_THRESHOLD`] and [`MMAP_THRESHOLD`], each
/// unless the user chose it (`MALLOC_TRIM_THRESHOLD_` / `MALLOC_MMAP_THRESHOLD_`, or
/// `GLIBC_TUNABLES` naming `malloc.trim_threshold` / `malloc.mmap_threshold`). Returns how many
/// it set. Elsewhere than glibc it does nothing.
pub(crate) fn keep_freed_memory() -> usize {
    let chosen = |env: &str, tunable: &str| {
        std::env::var_os(env).is_some()
            || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains(tunable))
    };
    let mut set = 0;
    if !chosen("MALLOC_TRIM_THRESHOLD_", "malloc.trim_threshold") {
        set += usize::from(crate::os::malloc::set_trim_threshold(TRIM_THRESHOLD));
    }
    if !chosen("MALLOC_MMAP_THRESHOLD_", "malloc.mmap_threshold") {
        set += usize::from(crate::os::malloc::set_mmap_threshold(MMAP_THRESHOLD));
    }
    set
}
