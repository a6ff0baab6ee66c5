//! Captures what a UCX `*_print_info(…, FILE *)` function writes, through `open_memstream(3)`.

use std::sync::Arc;

use crate::error::{Result, UcxError};

/// Runs `print` with a memory-backed `FILE *` and returns what it wrote (lossy UTF-8).
///
/// # Safety
/// `print` must only write to the stream it is given and not keep it.
pub(crate) unsafe fn capture(print: impl FnOnce(*mut libc::FILE)) -> Result<String> {
    let os_error = |op| UcxError::Os {
        op,
        source: Arc::new(std::io::Error::last_os_error()),
    };
    let mut buf: *mut libc::c_char = std::ptr::null_mut();
    let mut size: libc::size_t = 0;
    // SAFETY: both out-pointers are live; libc updates them until the stream is closed below.
    let stream = unsafe { libc::open_memstream(&mut buf, &mut size) };
    if stream.is_null() {
        return Err(os_error("open_memstream"));
    }
    print(stream);
    // SAFETY: the stream is open and `print` kept it not; fclose flushes and sets buf/size for
    // the final time.
    let rc = unsafe { libc::fclose(stream) };
    let text = if buf.is_null() {
        String::new()
    } else {
        // SAFETY: after fclose, `buf` holds `size` bytes written through the stream.
        let bytes = unsafe { std::slice::from_raw_parts(buf as *const u8, size) };
        String::from_utf8_lossy(bytes).into_owned()
    };
    // SAFETY: `buf` was allocated by open_memstream (or is NULL) and is not used after.
    unsafe { libc::free(buf.cast()) };
    if rc != 0 {
        return Err(os_error("fclose(memstream)"));
    }
    Ok(text)
}

#[cfg(test)]
mod tests {
    #[test]
    fn captures_what_is_written() {
        // SAFETY: fputs writes a static string into the stream only.
        let text = unsafe {
            super::capture(|f| {
                libc::fputs(c"lane[0]: tcp/lo\n".as_ptr(), f);
            })
        }
        .unwrap();
        assert_eq!(text, "lane[0]: tcp/lo\n");
    }
}
