//! Layer 2: one checked function per libucp function, named after it without the `ucp_`/`ucs_`
//! prefix. Each turns what UCX returns (a `ucs_status_t`, or a status encoded in a pointer as
//! `UCS_PTR_IS_ERR`/`UCS_PTR_STATUS` define it) into [`UcxError::Status`] naming the symbol
//! actually loaded. The functions whose arguments UCX dereferences or keeps (handles, parameter
//! structs, buffers) are `unsafe`; the safe types of layer 3 hold what makes each call sound.
//!
//! Every function goes through `ucp!`, which names its symbol in [`Symbol`]: the list
//! [`check_symbols`] checks at load. The compiler refuses a call of a function not on the list
//! and flags one listed but never called, so the list and the calls cannot drift apart, and the
//! generated bindings (which panic on a missing symbol) never panic.

use std::ffi::{c_char, c_int, c_uint, c_void, CStr};

use crate::capture::capture;
use crate::error::{Result, Status, UcxError};
use crate::sys::{self, Ucp};

macro_rules! symbols {
    ($($sym:ident),* $(,)?) => {
        /// The libucp functions this crate calls; all exist since UCX 1.13.
        // Variants carry the C names so that one identifier is both the symbol and the variant.
        #[allow(non_camel_case_types)]
        enum Symbol {
            $($sym),*
        }

        /// Checks that `api` resolved every function of [`Symbol`].
        ///
        /// Errors: [`UcxError::SymbolMissing`] naming `library` and the first function it lacks.
        pub(crate) fn check_symbols(api: &Ucp, library: &str) -> Result<()> {
            $(
                if api.$sym.is_err() {
                    return Err(UcxError::SymbolMissing {
                        library: library.to_string(),
                        symbol: stringify!($sym),
                    });
                }
            )*
            Ok(())
        }
    };
}

symbols!(
    ucp_get_version,
    ucp_get_version_string,
    ucs_status_string,
    ucp_config_read,
    ucp_config_release,
    ucp_config_modify,
    ucp_init_version,
    ucp_cleanup,
    ucp_context_query,
    ucp_context_print_info,
    ucp_worker_create,
    ucp_worker_destroy,
    ucp_worker_progress,
    ucp_worker_get_efd,
    ucp_worker_arm,
    ucp_worker_signal,
    ucp_worker_set_am_recv_handler,
    ucp_worker_get_address,
    ucp_worker_release_address,
    ucp_listener_create,
    ucp_listener_destroy,
    ucp_listener_query,
    ucp_listener_reject,
    ucp_conn_request_query,
    ucp_ep_create,
    ucp_ep_close_nbx,
    ucp_ep_query,
    ucp_ep_print_info,
    ucp_ep_flush_nbx,
    ucp_mem_map,
    ucp_mem_unmap,
    ucp_mem_query,
    ucp_rkey_pack,
    ucp_rkey_buffer_release,
    ucp_ep_rkey_unpack,
    ucp_rkey_destroy,
    ucp_put_nbx,
    ucp_get_nbx,
    ucp_am_send_nbx,
    ucp_am_data_release,
    ucp_request_check_status,
    ucp_request_free,
    ucp_request_query,
);

/// Calls the libucp function `$sym` through the generated bindings and returns its name with
/// what it returned. Naming `Symbol::$sym` ties the call to the list checked at load.
macro_rules! ucp {
    ($api:ident . $sym:ident ( $($arg:expr),* $(,)? )) => {{
        let _checked_at_load = Symbol::$sym;
        (stringify!($sym), $api.$sym($($arg),*))
    }};
}

/// What a call that returns a status returned: `Ok` for `UCS_OK`, else [`UcxError::Status`].
fn status((op, st): (&'static str, sys::ucs_status_t)) -> Result<()> {
    if st == sys::UCS_OK {
        Ok(())
    } else {
        Err(UcxError::Status {
            op,
            status: Status(st),
        })
    }
}

/// What an `*_nbx` call returned short of an error: finished at post, or a request to poll
/// ([`request_check_status`]) and free ([`request_free`]).
#[derive(Debug, Clone, Copy)]
pub(crate) struct Posted {
    /// The function that posted the operation, to name when it fails later.
    pub(crate) op: &'static str,
    /// The request; NULL when the operation finished at post.
    pub(crate) req: *mut c_void,
}

/// What an `*_nbx` call returned: a request, NULL (done), or an error status encoded in the
/// pointer, which is [`UcxError::Status`].
fn posted((op, p): (&'static str, sys::ucs_status_ptr_t)) -> Result<Posted> {
    if ptr_is_err(p) {
        return Err(UcxError::Status {
            op,
            status: ptr_status(p),
        });
    }
    Ok(Posted { op, req: p })
}

/// `UCS_PTR_IS_ERR`: UCX encodes an error status in a returned pointer as the small negative
/// integer `(uintptr_t)ptr >= (uintptr_t)UCS_ERR_LAST` (see `ucs/type/status.h`).
fn ptr_is_err(p: *const c_void) -> bool {
    (p as usize) >= (sys::UCS_ERR_LAST as isize as usize)
}

/// `UCS_PTR_STATUS`: the status encoded in a pointer that [`ptr_is_err`] accepted.
fn ptr_status(p: *const c_void) -> Status {
    Status(p as isize as i8)
}

/// UCX's parameter and attribute structs, which UCX reads with every field zero as "nothing
/// set": the caller sets `field_mask` and the fields it flags.
///
/// # Safety
/// Implemented only for C structs made of integers, raw pointers, optional function pointers,
/// and arrays and structs of those, for which all-zero bytes are a value.
pub(crate) unsafe trait Zeroable: Sized {}

macro_rules! zeroable {
    ($($t:ty),* $(,)?) => {
        $(
            // SAFETY: a C struct of `sys.rs`/`sys_ext.rs` made only of integers, raw pointers,
            // optional function pointers and nested such structs.
            unsafe impl Zeroable for $t {}
        )*
    };
}

zeroable!(
    sys::ucp_params_t,
    sys::ucp_context_attr_t,
    sys::ucp_worker_params_t,
    sys::ucp_listener_params_t,
    sys::ucp_listener_attr_t,
    sys::ucp_conn_request_attr_t,
    sys::ucp_ep_params_t,
    sys::ucp_mem_map_params_t,
    sys::ucp_mem_attr_t,
    sys::ucp_request_param_t,
    sys::ucp_request_attr_t,
    sys::ucp_am_handler_param_t,
    crate::sys_ext::ucp_ep_attr_v114,
);

/// A parameter or attribute struct with no field set (see [`Zeroable`]).
pub(crate) fn unset<T: Zeroable>() -> T {
    // SAFETY: all-zero bytes are a value of every `Zeroable` type.
    unsafe { std::mem::zeroed() }
}

/// Copies a C string UCX returned; empty for NULL.
///
/// # Safety
/// `p` is NULL or points to a NUL-terminated string.
pub(crate) unsafe fn cstr(p: *const c_char) -> String {
    if p.is_null() {
        String::new()
    } else {
        // SAFETY: the caller's contract.
        unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
    }
}

// ---- library ----------------------------------------------------------------------------

/// `ucp_get_version`: (major, minor, release).
pub(crate) fn get_version(api: &Ucp) -> (u32, u32, u32) {
    let (mut major, mut minor, mut release): (c_uint, c_uint, c_uint) = (0, 0, 0);
    // SAFETY: writes three unsigned ints through live pointers.
    unsafe { ucp!(api.ucp_get_version(&mut major, &mut minor, &mut release)) };
    (major, minor, release)
}

/// `ucp_get_version_string` (e.g. `1.13.1`).
pub(crate) fn get_version_string(api: &Ucp) -> String {
    // SAFETY: returns a static NUL-terminated string.
    unsafe { cstr(ucp!(api.ucp_get_version_string()).1) }
}

/// `ucs_status_string`: UCX's description of a status.
pub(crate) fn status_string(api: &Ucp, st: Status) -> String {
    // SAFETY: returns a static NUL-terminated string for any code.
    unsafe { cstr(ucp!(api.ucs_status_string(st.0)).1) }
}

// ---- configuration and context ----------------------------------------------------------

/// `ucp_config_read` of the defaults and the `UCX_*` environment (no prefix, no file).
pub(crate) fn config_read(api: &Ucp) -> Result<*mut sys::ucp_config_t> {
    let mut config = std::ptr::null_mut();
    // SAFETY: NULL prefix and file name are allowed; the out-pointer is live.
    status(unsafe { ucp!(api.ucp_config_read(std::ptr::null(), std::ptr::null(), &mut config)) })?;
    Ok(config)
}

/// `ucp_config_modify`: sets `UCX_<name>` to `value` in `config`.
///
/// # Safety
/// `config` came from [`config_read`] and is not yet released.
pub(crate) unsafe fn config_modify(
    api: &Ucp,
    config: *mut sys::ucp_config_t,
    name: &CStr,
    value: &CStr,
) -> Result<()> {
    // SAFETY: the caller's contract; both strings are NUL-terminated.
    status(unsafe { ucp!(api.ucp_config_modify(config, name.as_ptr(), value.as_ptr())) })
}

/// `ucp_config_release`.
///
/// # Safety
/// `config` came from [`config_read`], is released once and not used after.
pub(crate) unsafe fn config_release(api: &Ucp, config: *mut sys::ucp_config_t) {
    // SAFETY: the caller's contract.
    unsafe { ucp!(api.ucp_config_release(config)) };
}

/// `ucp_init_version` with the API version of the headers `sys.rs` was made from (what the
/// header inline `ucp_init` passes).
///
/// # Safety
/// `config` is live; `params` flags only fields UCX 1.13 knows.
pub(crate) unsafe fn init_version(
    api: &Ucp,
    params: &sys::ucp_params_t,
    config: *const sys::ucp_config_t,
) -> Result<sys::ucp_context_h> {
    let mut ctx = std::ptr::null_mut();
    // SAFETY: the caller's contract; the out-pointer is live.
    status(unsafe {
        ucp!(api.ucp_init_version(
            sys::UCP_API_MAJOR,
            sys::UCP_API_MINOR,
            params,
            config,
            &mut ctx
        ))
    })?;
    Ok(ctx)
}

/// `ucp_cleanup`.
///
/// # Safety
/// `ctx` is live, and no worker or mapping of it remains; it is not used after.
pub(crate) unsafe fn cleanup(api: &Ucp, ctx: sys::ucp_context_h) {
    // SAFETY: the caller's contract.
    unsafe { ucp!(api.ucp_cleanup(ctx)) };
}

/// `ucp_context_query` of the attributes flagged in `fields` (`UCP_ATTR_FIELD_*`).
///
/// # Safety
/// `ctx` is live; `fields` are known to UCX 1.13 (the struct is its layout).
pub(crate) unsafe fn context_query(
    api: &Ucp,
    ctx: sys::ucp_context_h,
    fields: u64,
) -> Result<sys::ucp_context_attr_t> {
    let mut attr: sys::ucp_context_attr_t = unset();
    attr.field_mask = fields;
    // SAFETY: the caller's contract; UCX fills only the flagged fields.
    status(unsafe { ucp!(api.ucp_context_query(ctx, &mut attr)) })?;
    Ok(attr)
}

/// `ucp_context_print_info`, captured as text.
///
/// # Safety
/// `ctx` is live.
pub(crate) unsafe fn context_print_info(api: &Ucp, ctx: sys::ucp_context_h) -> Result<String> {
    // SAFETY: the caller's contract; UCX writes to the stream only and does not keep it.
    unsafe { capture(|f| ucp!(api.ucp_context_print_info(ctx, f)).1) }
}

// ---- worker -----------------------------------------------------------------------------

/// `ucp_worker_create`.
///
/// # Safety
/// `ctx` is live; `params` flags only fields UCX 1.13 knows.
pub(crate) unsafe fn worker_create(
    api: &Ucp,
    ctx: sys::ucp_context_h,
    params: &sys::ucp_worker_params_t,
) -> Result<sys::ucp_worker_h> {
    let mut worker = std::ptr::null_mut();
    // SAFETY: the caller's contract; the out-pointer is live.
    status(unsafe { ucp!(api.ucp_worker_create(ctx, params, &mut worker)) })?;
    Ok(worker)
}

/// `ucp_worker_destroy`.
///
/// # Safety
/// `worker` is live; nothing of it (endpoint, listener, key, request, held payload) remains,
/// and it is not used after.
pub(crate) unsafe fn worker_destroy(api: &Ucp, worker: sys::ucp_worker_h) {
    // SAFETY: the caller's contract.
    unsafe { ucp!(api.ucp_worker_destroy(worker)) };
}

/// `ucp_worker_progress`: the number of events processed (0 when idle).
///
/// # Safety
/// `worker` is live and no other thread is in a call on it.
pub(crate) unsafe fn worker_progress(api: &Ucp, worker: sys::ucp_worker_h) -> u32 {
    // SAFETY: the caller's contract.
    unsafe { ucp!(api.ucp_worker_progress(worker)) }.1
}

/// `ucp_worker_get_efd`: the event fd to poll (needs `UCP_FEATURE_WAKEUP`).
///
/// # Safety
/// `worker` is live.
pub(crate) unsafe fn worker_get_efd(api: &Ucp, worker: sys::ucp_worker_h) -> Result<c_int> {
    let mut fd: c_int = -1;
    // SAFETY: the caller's contract; the out-pointer is live.
    status(unsafe { ucp!(api.ucp_worker_get_efd(worker, &mut fd)) })?;
    Ok(fd)
}

/// `ucp_worker_arm`: `Ok(true)` when armed, `Ok(false)` when events are already pending
/// (`UCS_ERR_BUSY`: progress first).
///
/// # Safety
/// `worker` is live.
pub(crate) unsafe fn worker_arm(api: &Ucp, worker: sys::ucp_worker_h) -> Result<bool> {
    // SAFETY: the caller's contract.
    let (op, st) = unsafe { ucp!(api.ucp_worker_arm(worker)) };
    if st == sys::UCS_ERR_BUSY {
        return Ok(false);
    }
    status((op, st)).map(|()| true)
}

/// `ucp_worker_signal`: wakes a thread polling the worker's event fd.
///
/// # Safety
/// `worker` is live.
pub(crate) unsafe fn worker_signal(api: &Ucp, worker: sys::ucp_worker_h) -> Result<()> {
    // SAFETY: the caller's contract.
    status(unsafe { ucp!(api.ucp_worker_signal(worker)) })
}

/// `ucp_worker_get_address`: the address UCX allocated and its length in bytes, to give back
/// with [`worker_release_address`].
///
/// # Safety
/// `worker` is live.
pub(crate) unsafe fn worker_get_address(
    api: &Ucp,
    worker: sys::ucp_worker_h,
) -> Result<(*mut sys::ucp_address_t, usize)> {
    let (mut addr, mut len) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the caller's contract; the out-pointers are live.
    status(unsafe { ucp!(api.ucp_worker_get_address(worker, &mut addr, &mut len)) })?;
    Ok((addr, len))
}

/// `ucp_worker_release_address`.
///
/// # Safety
/// `addr` came from [`worker_get_address`] of this live `worker`, is released once and not used
/// after.
pub(crate) unsafe fn worker_release_address(
    api: &Ucp,
    worker: sys::ucp_worker_h,
    addr: *mut sys::ucp_address_t,
) {
    // SAFETY: the caller's contract.
    unsafe { ucp!(api.ucp_worker_release_address(worker, addr)) };
}

/// `ucp_worker_set_am_recv_handler`.
///
/// # Safety
/// `worker` is live; the callback argument in `param` outlives the worker.
pub(crate) unsafe fn worker_set_am_recv_handler(
    api: &Ucp,
    worker: sys::ucp_worker_h,
    param: &sys::ucp_am_handler_param_t,
) -> Result<()> {
    // SAFETY: the caller's contract.
    status(unsafe { ucp!(api.ucp_worker_set_am_recv_handler(worker, param)) })
}

/// `ucp_am_data_release`: gives back a payload UCX let the receiver keep.
///
/// # Safety
/// `data` is a payload of this live `worker` kept from its active-message callback, given back
/// once and not read after.
pub(crate) unsafe fn am_data_release(api: &Ucp, worker: sys::ucp_worker_h, data: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { ucp!(api.ucp_am_data_release(worker, data)) };
}

// ---- listener ---------------------------------------------------------------------------

/// `ucp_listener_create`.
///
/// # Safety
/// `worker` is live; the socket address in `params` is valid for the call, and the callback
/// argument outlives the listener.
pub(crate) unsafe fn listener_create(
    api: &Ucp,
    worker: sys::ucp_worker_h,
    params: &sys::ucp_listener_params_t,
) -> Result<sys::ucp_listener_h> {
    let mut listener = std::ptr::null_mut();
    // SAFETY: the caller's contract; the out-pointer is live.
    status(unsafe { ucp!(api.ucp_listener_create(worker, params, &mut listener)) })?;
    Ok(listener)
}

/// `ucp_listener_query` of the attributes flagged in `fields` (`UCP_LISTENER_ATTR_FIELD_*`).
///
/// # Safety
/// `listener` is live; `fields` are known to UCX 1.13.
pub(crate) unsafe fn listener_query(
    api: &Ucp,
    listener: sys::ucp_listener_h,
    fields: u64,
) -> Result<sys::ucp_listener_attr_t> {
    let mut attr: sys::ucp_listener_attr_t = unset();
    attr.field_mask = fields;
    // SAFETY: the caller's contract; UCX fills only the flagged fields.
    status(unsafe { ucp!(api.ucp_listener_query(listener, &mut attr)) })?;
    Ok(attr)
}

/// `ucp_listener_reject`: refuses a connection request not yet accepted.
///
/// # Safety
/// `listener` is live; `conn` is an unconsumed request of it, not used after.
pub(crate) unsafe fn listener_reject(
    api: &Ucp,
    listener: sys::ucp_listener_h,
    conn: sys::ucp_conn_request_h,
) -> Result<()> {
    // SAFETY: the caller's contract.
    status(unsafe { ucp!(api.ucp_listener_reject(listener, conn)) })
}

/// `ucp_listener_destroy`: no connection callback runs after it returns.
///
/// # Safety
/// `listener` is live and not used after.
pub(crate) unsafe fn listener_destroy(api: &Ucp, listener: sys::ucp_listener_h) {
    // SAFETY: the caller's contract.
    unsafe { ucp!(api.ucp_listener_destroy(listener)) };
}

/// `ucp_conn_request_query` of the attributes flagged in `fields`
/// (`UCP_CONN_REQUEST_ATTR_FIELD_*`).
///
/// # Safety
/// `conn` is a live, unconsumed connection request; `fields` are known to UCX 1.13.
pub(crate) unsafe fn conn_request_query(
    api: &Ucp,
    conn: sys::ucp_conn_request_h,
    fields: u64,
) -> Result<sys::ucp_conn_request_attr_t> {
    let mut attr: sys::ucp_conn_request_attr_t = unset();
    attr.field_mask = fields;
    // SAFETY: the caller's contract; UCX fills only the flagged fields.
    status(unsafe { ucp!(api.ucp_conn_request_query(conn, &mut attr)) })?;
    Ok(attr)
}

// ---- endpoint ---------------------------------------------------------------------------

/// `ucp_ep_create`.
///
/// # Safety
/// `worker` is live; what `params` points to (address, socket address, connection request) is
/// valid for the call, and the error callback's argument outlives the endpoint.
pub(crate) unsafe fn ep_create(
    api: &Ucp,
    worker: sys::ucp_worker_h,
    params: &sys::ucp_ep_params_t,
) -> Result<sys::ucp_ep_h> {
    let mut ep = std::ptr::null_mut();
    // SAFETY: the caller's contract; the out-pointer is live.
    status(unsafe { ucp!(api.ucp_ep_create(worker, params, &mut ep)) })?;
    Ok(ep)
}

/// `ucp_ep_close_nbx` with `flags` (`UCP_EP_CLOSE_FLAG_FORCE` or 0 for a flush close).
///
/// # Safety
/// `ep` is live and not used after; a force close needs peer error handling.
pub(crate) unsafe fn ep_close_nbx(api: &Ucp, ep: sys::ucp_ep_h, flags: u32) -> Result<Posted> {
    let mut param: sys::ucp_request_param_t = unset();
    if flags != 0 {
        param.op_attr_mask = sys::UCP_OP_ATTR_FIELD_FLAGS;
        param.flags = flags;
    }
    // SAFETY: the caller's contract; UCX reads the parameters during the call only.
    posted(unsafe { ucp!(api.ucp_ep_close_nbx(ep, &param)) })
}

/// `ucp_ep_flush_nbx` without callback (completion is polled).
///
/// # Safety
/// `ep` is live.
pub(crate) unsafe fn ep_flush_nbx(api: &Ucp, ep: sys::ucp_ep_h) -> Result<Posted> {
    let param: sys::ucp_request_param_t = unset();
    // SAFETY: the caller's contract; UCX reads the parameters during the call only.
    posted(unsafe { ucp!(api.ucp_ep_flush_nbx(ep, &param)) })
}

/// `ucp_ep_query` into `attr`, which may be a later UCX's longer layout (`sys_ext`).
///
/// # Safety
/// `ep` is live; `attr` points to a struct that holds every field its `field_mask` flags, in
/// the loaded UCX's layout, with room for what those fields point to.
pub(crate) unsafe fn ep_query(
    api: &Ucp,
    ep: sys::ucp_ep_h,
    attr: *mut sys::ucp_ep_attr,
) -> Result<()> {
    // SAFETY: the caller's contract.
    status(unsafe { ucp!(api.ucp_ep_query(ep, attr)) })
}

/// `ucp_ep_print_info`, captured as text.
///
/// # Safety
/// `ep` is live.
pub(crate) unsafe fn ep_print_info(api: &Ucp, ep: sys::ucp_ep_h) -> Result<String> {
    // SAFETY: the caller's contract; UCX writes to the stream only and does not keep it.
    unsafe { capture(|f| ucp!(api.ucp_ep_print_info(ep, f)).1) }
}

/// `ucp_ep_rkey_unpack` of a packed key.
///
/// # Safety
/// `ep` is live; `packed` is readable as far as UCX parses it (it takes no length).
pub(crate) unsafe fn ep_rkey_unpack(
    api: &Ucp,
    ep: sys::ucp_ep_h,
    packed: *const c_void,
) -> Result<sys::ucp_rkey_h> {
    let mut rkey = std::ptr::null_mut();
    // SAFETY: the caller's contract; the out-pointer is live.
    status(unsafe { ucp!(api.ucp_ep_rkey_unpack(ep, packed, &mut rkey)) })?;
    Ok(rkey)
}

/// `ucp_rkey_destroy`.
///
/// # Safety
/// `rkey` is live, no pending operation uses it, and it is not used after.
pub(crate) unsafe fn rkey_destroy(api: &Ucp, rkey: sys::ucp_rkey_h) {
    // SAFETY: the caller's contract.
    unsafe { ucp!(api.ucp_rkey_destroy(rkey)) };
}

/// `ucp_put_nbx` of `len` bytes at `buffer` to `remote_addr` (the buffer is only read).
///
/// # Safety
/// `ep` and `rkey` are live, the key unpacked on `ep`; `[buffer, buffer + len)` is memory of
/// the kind `param` declares and stays valid until the operation completes.
pub(crate) unsafe fn put_nbx(
    api: &Ucp,
    ep: sys::ucp_ep_h,
    buffer: *mut c_void,
    len: usize,
    remote_addr: u64,
    rkey: sys::ucp_rkey_h,
    param: &sys::ucp_request_param_t,
) -> Result<Posted> {
    // SAFETY: the caller's contract.
    posted(unsafe { ucp!(api.ucp_put_nbx(ep, buffer, len, remote_addr, rkey, param)) })
}

/// `ucp_get_nbx` of `len` bytes from `remote_addr` into `buffer`.
///
/// # Safety
/// As [`put_nbx`], and nothing else writes `[buffer, buffer + len)` until the operation
/// completes.
pub(crate) unsafe fn get_nbx(
    api: &Ucp,
    ep: sys::ucp_ep_h,
    buffer: *mut c_void,
    len: usize,
    remote_addr: u64,
    rkey: sys::ucp_rkey_h,
    param: &sys::ucp_request_param_t,
) -> Result<Posted> {
    // SAFETY: the caller's contract.
    posted(unsafe { ucp!(api.ucp_get_nbx(ep, buffer, len, remote_addr, rkey, param)) })
}

/// `ucp_am_send_nbx` of a header and `count` payload elements at `data` (bytes, or IOV entries
/// when `param` says so) to the active-message id `id`.
///
/// # Safety
/// `ep` is live; the header, `data` and what IOV entries point to stay valid until the
/// operation completes.
#[allow(clippy::too_many_arguments)] // one argument per C parameter, plus the library
pub(crate) unsafe fn am_send_nbx(
    api: &Ucp,
    ep: sys::ucp_ep_h,
    id: u16,
    header: *const c_void,
    header_len: usize,
    data: *const c_void,
    count: usize,
    param: &sys::ucp_request_param_t,
) -> Result<Posted> {
    // SAFETY: the caller's contract.
    posted(unsafe {
        ucp!(api.ucp_am_send_nbx(ep, c_uint::from(id), header, header_len, data, count, param))
    })
}

// ---- memory -----------------------------------------------------------------------------

/// `ucp_mem_map`.
///
/// # Safety
/// `ctx` is live; `params` flags only fields UCX 1.13 knows; memory it names (not allocated by
/// UCX) stays valid until [`mem_unmap`].
pub(crate) unsafe fn mem_map(
    api: &Ucp,
    ctx: sys::ucp_context_h,
    params: &sys::ucp_mem_map_params_t,
) -> Result<sys::ucp_mem_h> {
    let mut memh = std::ptr::null_mut();
    // SAFETY: the caller's contract; the out-pointer is live.
    status(unsafe { ucp!(api.ucp_mem_map(ctx, params, &mut memh)) })?;
    Ok(memh)
}

/// `ucp_mem_unmap` (frees the memory when UCX allocated it).
///
/// # Safety
/// `memh` is a live mapping of `ctx` that no pending operation uses; it is not used after.
pub(crate) unsafe fn mem_unmap(
    api: &Ucp,
    ctx: sys::ucp_context_h,
    memh: sys::ucp_mem_h,
) -> Result<()> {
    // SAFETY: the caller's contract.
    status(unsafe { ucp!(api.ucp_mem_unmap(ctx, memh)) })
}

/// `ucp_mem_query` of the attributes flagged in `fields` (`UCP_MEM_ATTR_FIELD_*`).
///
/// # Safety
/// `memh` is live; `fields` are known to UCX 1.13.
pub(crate) unsafe fn mem_query(
    api: &Ucp,
    memh: sys::ucp_mem_h,
    fields: u64,
) -> Result<sys::ucp_mem_attr_t> {
    let mut attr: sys::ucp_mem_attr_t = unset();
    attr.field_mask = fields;
    // SAFETY: the caller's contract; UCX fills only the flagged fields.
    status(unsafe { ucp!(api.ucp_mem_query(memh, &mut attr)) })?;
    Ok(attr)
}

/// `ucp_rkey_pack`: the packed key UCX allocated and its length in bytes, to give back with
/// [`rkey_buffer_release`].
///
/// # Safety
/// `memh` is a live mapping of the live `ctx`.
pub(crate) unsafe fn rkey_pack(
    api: &Ucp,
    ctx: sys::ucp_context_h,
    memh: sys::ucp_mem_h,
) -> Result<(*mut c_void, usize)> {
    let (mut buf, mut len) = (std::ptr::null_mut(), 0usize);
    // SAFETY: the caller's contract; the out-pointers are live.
    status(unsafe { ucp!(api.ucp_rkey_pack(ctx, memh, &mut buf, &mut len)) })?;
    Ok((buf, len))
}

/// `ucp_rkey_buffer_release`.
///
/// # Safety
/// `buf` came from [`rkey_pack`], is released once and not read after.
pub(crate) unsafe fn rkey_buffer_release(api: &Ucp, buf: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { ucp!(api.ucp_rkey_buffer_release(buf)) };
}

// ---- requests ---------------------------------------------------------------------------

/// `ucp_request_check_status`: the operation's own status (`UCS_INPROGRESS` while in flight),
/// which is the operation's result, not a failure of this call.
///
/// # Safety
/// `req` is a live request (from a [`Posted`], not yet freed).
pub(crate) unsafe fn request_check_status(api: &Ucp, req: *mut c_void) -> Status {
    // SAFETY: the caller's contract.
    Status(unsafe { ucp!(api.ucp_request_check_status(req)) }.1)
}

/// `ucp_request_free`: releases a request; UCX frees a pending one when it completes.
///
/// # Safety
/// `req` is a live request, released once and not used after.
pub(crate) unsafe fn request_free(api: &Ucp, req: *mut c_void) {
    // SAFETY: the caller's contract.
    unsafe { ucp!(api.ucp_request_free(req)) };
}

/// `ucp_request_query` into `attr`.
///
/// # Safety
/// `req` is a live request; what `attr` points to (the info string buffer) holds the sizes it
/// declares.
pub(crate) unsafe fn request_query(
    api: &Ucp,
    req: *mut c_void,
    attr: &mut sys::ucp_request_attr_t,
) -> Result<()> {
    // SAFETY: the caller's contract.
    status(unsafe { ucp!(api.ucp_request_query(req, attr)) })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pointer_status_encoding() {
        let err = sys::UCS_ERR_UNREACHABLE as isize as *const c_void;
        assert!(ptr_is_err(err));
        assert_eq!(ptr_status(err), Status(sys::UCS_ERR_UNREACHABLE));
        let real = 0x7f00_0000_1000usize as *const c_void;
        assert!(!ptr_is_err(real));
        assert!(!ptr_is_err(std::ptr::null()));
    }

    #[test]
    fn posted_and_status_name_the_call() {
        let err = sys::UCS_ERR_CANCELED as isize as sys::ucs_status_ptr_t;
        match posted(("ucp_put_nbx", err)) {
            Err(UcxError::Status { op, status }) => {
                assert_eq!((op, status), ("ucp_put_nbx", Status(sys::UCS_ERR_CANCELED)));
            }
            other => panic!("expected a status error, got {other:?}"),
        }
        let done = posted(("ucp_ep_flush_nbx", std::ptr::null_mut())).unwrap();
        assert!(done.req.is_null());
        assert!(status(("ucp_worker_signal", sys::UCS_OK)).is_ok());
        assert!(matches!(
            status(("ucp_mem_map", sys::UCS_ERR_NO_MEMORY)),
            Err(UcxError::Status {
                op: "ucp_mem_map",
                ..
            })
        ));
    }
}
