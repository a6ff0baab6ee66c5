//! Ending the process at once.

#![allow(unsafe_code)]

/// Ends the process now with exit status `status`, as `_exit(2)`: no `atexit` handlers, no
/// destructors, no flushing of stdio buffers. For a second interrupt while the main thread may
/// be inside a library whose exit handlers must not run concurrently with it (UCX's).
pub fn exit_immediately(status: i32) -> ! {
    // SAFETY: _exit takes no pointers and does not return; nothing of this process runs after.
    unsafe { libc::_exit(status) }
}
