//! glibc's allocator parameters (`mallopt`); elsewhere than glibc the setters do nothing.

/// Sets `M_TRIM_THRESHOLD` (freed bytes glibc keeps at the top of a heap) to `bytes`, capped at
/// `c_int::MAX`. Returns whether glibc accepted it; `false` off glibc.
pub fn set_trim_threshold(bytes: usize) -> bool {
    imp::set(imp::TRIM, bytes)
}

/// Sets `M_MMAP_THRESHOLD` (allocations from this many bytes get a `mmap` of their own) to
/// `bytes`, capped at `c_int::MAX`. Returns whether glibc accepted it; `false` off glibc.
pub fn set_mmap_threshold(bytes: usize) -> bool {
    imp::set(imp::MMAP, bytes)
}

#[cfg(all(target_os = "linux", target_env = "gnu"))]
mod imp {
    pub(super) const TRIM: libc::c_int = libc::M_TRIM_THRESHOLD;
    pub(super) const MMAP: libc::c_int = libc::M_MMAP_THRESHOLD;

    pub(super) fn set(param: libc::c_int, bytes: usize) -> bool {
        let v = libc::c_int::try_from(bytes).unwrap_or(libc::c_int::MAX);
        // SAFETY: mallopt only changes the allocator's parameters; 1 means it accepted them.
        unsafe { libc::mallopt(param, v) == 1 }
    }
}

#[cfg(not(all(target_os = "linux", target_env = "gnu")))]
mod imp {
    pub(super) const TRIM: i32 = 0;
    pub(super) const MMAP: i32 = 0;

    pub(super) fn set(_param: i32, _bytes: usize) -> bool {
        false
    }
}
