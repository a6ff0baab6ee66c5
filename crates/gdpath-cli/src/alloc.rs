//! The allocator policy of a serving process (glibc only): keep freed memory instead of giving
//! it back to the kernel after every message.

/// Freed bytes glibc may keep at the top of a heap before it returns them to the kernel
/// (`M_TRIM_THRESHOLD`, glibc's default 128 KiB). A server that receives packed writes
/// allocates and frees a buffer of up to 64 KiB per message in its progress thread's arena
/// (UCX assembles each multi-fragment message in a fresh allocation); at the default glibc
/// trims the heap and faults the pages back in per message. Measured on loopback tcp, 64 KiB
/// writes (`bench net --size 64KiB --qd 64 --batch 16`, server and client pinned to one CPU
/// each, 2026-11-30): 0.84–0.97 GB/s at the default against 1.57–1.90 with 64 MiB.
pub const TRIM_THRESHOLD: usize = 64 << 20;

/// Raises glibc's trim threshold to [`TRIM_THRESHOLD`], unless the user chose one
/// (`MALLOC_TRIM_THRESHOLD_`, or `GLIBC_TUNABLES` naming `malloc.trim_threshold`). Returns
/// whether it was set. Call before the threads that allocate start; elsewhere than glibc it
/// does nothing.
pub fn keep_freed_memory() -> bool {
    let chosen = std::env::var_os("MALLOC_TRIM_THRESHOLD_").is_some()
        || std::env::var("GLIBC_TUNABLES").is_ok_and(|t| t.contains("malloc.trim_threshold"));
    if chosen {
        return false;
    }
    set_trim_threshold(TRIM_THRESHOLD)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
fn set_trim_threshold(bytes: usize) -> bool {
    let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
    // SAFETY: mallopt only changes the allocator's parameters; 1 means it accepted them.
    unsafe { libc::mallopt(libc::M_TRIM_THRESHOLD, v) == 1 }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
fn set_trim_threshold(_bytes: usize) -> bool {
    false
}
