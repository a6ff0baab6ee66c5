//! Conversions between `std::net::SocketAddr` and C socket addresses.

use std::net::{Ipv4Addr, Ipv6Addr, SocketAddr, SocketAddrV4, SocketAddrV6};

/// A C socket address with its length, ready for `ucs_sock_addr_t`.
pub(crate) struct CSockAddr {
    storage: libc::sockaddr_storage,
    len: libc::socklen_t,
}

impl CSockAddr {
    pub(crate) fn new(addr: &SocketAddr) -> CSockAddr {
        // SAFETY: an all-zero sockaddr_storage is valid.
        let mut storage: libc::sockaddr_storage = unsafe { std::mem::zeroed() };
        let len = match addr {
            SocketAddr::V4(a) => {
                // SAFETY: sockaddr_storage is larger and at least as aligned as sockaddr_in.
                let sin = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in) };
                sin.sin_family = libc::AF_INET as libc::sa_family_t;
                sin.sin_port = a.port().to_be();
                sin.sin_addr.s_addr = u32::from(*a.ip()).to_be();
                std::mem::size_of::<libc::sockaddr_in>()
            }
            SocketAddr::V6(a) => {
                // SAFETY: as above, for sockaddr_in6.
                let sin6 = unsafe { &mut *(&mut storage as *mut _ as *mut libc::sockaddr_in6) };
                sin6.sin6_family = libc::AF_INET6 as libc::sa_family_t;
                sin6.sin6_port = a.port().to_be();
                sin6.sin6_addr.s6_addr = a.ip().octets();
                sin6.sin6_flowinfo = a.flowinfo();
                sin6.sin6_scope_id = a.scope_id();
                std::mem::size_of::<libc::sockaddr_in6>()
            }
        };
        CSockAddr {
            storage,
            len: len as libc::socklen_t,
        }
    }

    pub(crate) fn as_ucs(&self) -> crate::sys::ucs_sock_addr_t {
        crate::sys::ucs_sock_addr_t {
            addr: &self.storage as *const _ as *const crate::sys::sockaddr,
            addrlen: self.len,
        }
    }
}

/// Reads a `sockaddr_storage` UCX filled in; `None` for families other than IPv4/IPv6.
///
/// # Safety
/// `ss` points to a `sockaddr_storage` (UCX's bindgen type has the same layout as libc's).
pub(crate) unsafe fn from_storage(ss: *const libc::sockaddr_storage) -> Option<SocketAddr> {
    // SAFETY: the caller's contract.
    let family = unsafe { (*ss).ss_family };
    match family as libc::c_int {
        libc::AF_INET => {
            // SAFETY: an AF_INET address in a sockaddr_storage is a sockaddr_in.
            let sin = unsafe { &*(ss as *const libc::sockaddr_in) };
            Some(SocketAddr::V4(SocketAddrV4::new(
                Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr)),
                u16::from_be(sin.sin_port),
            )))
        }
        libc::AF_INET6 => {
            // SAFETY: an AF_INET6 address in a sockaddr_storage is a sockaddr_in6.
            let sin6 = unsafe { &*(ss as *const libc::sockaddr_in6) };
            Some(SocketAddr::V6(SocketAddrV6::new(
                Ipv6Addr::from(sin6.sin6_addr.s6_addr),
                u16::from_be(sin6.sin6_port),
                sin6.sin6_flowinfo,
                sin6.sin6_scope_id,
            )))
        }
        _ => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_v4_and_v6() {
        for s in ["127.0.0.1:13337", "[::1]:8080"] {
            let a: SocketAddr = s.parse().unwrap();
            let c = CSockAddr::new(&a);
            // SAFETY: c.storage is a filled sockaddr_storage.
            let back = unsafe { from_storage(&c.storage) };
            assert_eq!(back, Some(a));
        }
    }
}
