//! Whether a shared library loads and exports a symbol, without calling it: for facts such as
//! "rdma-core is new enough to register GPU memory through dma-buf".

#![allow(unsafe_code)]

use std::ffi::CString;

/// Loads the shared library `library` (a name the dynamic loader resolves, such as
/// `libibverbs.so.1`, or a path) with `RTLD_NOW | RTLD_LOCAL`, looks up `symbol`, and unloads
/// it again. `None` when the library does not load (missing, wrong architecture, unresolved
/// dependencies) or a name contains a NUL byte; `Some(true)` when it exports `symbol`.
///
/// Loading runs the library's initialisers in this process; call it only for libraries whose
/// initialisers are harmless (rdma-core's `libibverbs` reads its configuration directories),
/// never for arbitrary paths.
pub fn library_exports(library: &str, symbol: &str) -> Option<bool> {
    let lib = CString::new(library).ok()?;
    let sym = CString::new(symbol).ok()?;
    // SAFETY: dlopen with a valid C string; RTLD_LOCAL keeps the library's symbols out of the
    // global namespace. What its initialisers do is the caller's contract (see above).
    let h = unsafe { libc::dlopen(lib.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        return None;
    }
    // SAFETY: `h` is a live handle; the address is only compared with null, never called.
    let f = unsafe { libc::dlsym(h, sym.as_ptr()) };
    // SAFETY: `h` came from dlopen above and is closed once; nothing from it is kept.
    unsafe { libc::dlclose(h) };
    Some(!f.is_null())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn libc_exports_malloc_and_not_a_made_up_name() {
        assert_eq!(library_exports("libc.so.6", "malloc"), Some(true));
        assert_eq!(
            library_exports("libc.so.6", "gdpath_no_such_symbol"),
            Some(false)
        );
        assert_eq!(library_exports("libgdpath-no-such-library.so.1", "x"), None);
        assert_eq!(library_exports("libc.so.6", "ma\0lloc"), None);
    }
}
