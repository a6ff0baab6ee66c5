//! UCX ABI added after 1.13 that gdpath uses, declared by hand (the generated `sys.rs`
//! follows the 1.13 headers, gdpath's floor). Source: `ucp/api/ucp.h` and `ucp_def.h` of UCX
//! 1.22.0 (the PyPI wheel `libucx-cu13`), where these appear unchanged since 1.14.
//! Only used after checking the loaded library's version at run time.
#![allow(non_camel_case_types)]

use std::os::raw::{c_char, c_uint};

use crate::sys;

/// `UCP_EP_ATTR_FIELD_TRANSPORTS` (`UCS_BIT(3)`), UCX >= 1.14.
pub const UCP_EP_ATTR_FIELD_TRANSPORTS: u64 = 1 << 3;

/// `ucp_transport_entry_t`: a transport name and device name pair of an endpoint lane.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ucp_transport_entry_t {
    /// Transport name, valid until the endpoint closes.
    pub transport_name: *const c_char,
    /// Device name, valid until the endpoint closes.
    pub device_name: *const c_char,
}

/// `ucp_transports_t`: caller-allocated array of entries.
#[repr(C)]
#[derive(Debug, Clone, Copy)]
pub struct ucp_transports_t {
    /// The array.
    pub entries: *mut ucp_transport_entry_t,
    /// In: capacity; out: entries filled.
    pub num_entries: c_uint,
    /// `sizeof(ucp_transport_entry_t)` as the caller knows it.
    pub entry_size: usize,
}

/// `ucp_ep_attr_t` as of UCX 1.14: the 1.13 fields followed by `transports`. (1.16 appends
/// `user_data`, which gdpath neither requests nor needs room for: UCX writes only requested
/// fields.)
#[repr(C)]
#[derive(Clone, Copy)]
pub struct ucp_ep_attr_v114 {
    /// Which fields to fill.
    pub field_mask: u64,
    /// `UCP_EP_ATTR_FIELD_NAME`.
    pub name: [c_char; sys::UCP_ENTITY_NAME_MAX as usize],
    /// `UCP_EP_ATTR_FIELD_LOCAL_SOCKADDR`.
    pub local_sockaddr: sys::sockaddr_storage,
    /// `UCP_EP_ATTR_FIELD_REMOTE_SOCKADDR`.
    pub remote_sockaddr: sys::sockaddr_storage,
    /// `UCP_EP_ATTR_FIELD_TRANSPORTS`.
    pub transports: ucp_transports_t,
}

// The 1.14 struct must extend the 1.13 one: same prefix offsets, and `transports` placed
// where the 1.13 struct ends (rounded to its alignment).
const _: () = {
    use std::mem::{align_of, offset_of, size_of};
    assert!(offset_of!(ucp_ep_attr_v114, name) == offset_of!(sys::ucp_ep_attr, name));
    assert!(
        offset_of!(ucp_ep_attr_v114, local_sockaddr)
            == offset_of!(sys::ucp_ep_attr, local_sockaddr)
    );
    assert!(
        offset_of!(ucp_ep_attr_v114, remote_sockaddr)
            == offset_of!(sys::ucp_ep_attr, remote_sockaddr)
    );
    assert!(offset_of!(ucp_ep_attr_v114, transports) == size_of::<sys::ucp_ep_attr>());
    assert!(size_of::<ucp_transport_entry_t>() == 16);
    assert!(size_of::<ucp_transports_t>() == 24 && align_of::<ucp_transports_t>() == 8);
};
