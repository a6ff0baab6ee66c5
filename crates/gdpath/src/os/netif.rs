//! This host's network interfaces and their addresses (`getifaddrs(3)`), for the choice of the
//! devices UCX's tcp transport may listen on ([`crate::net::DevicesError`]).

use std::io;
use std::net::{IpAddr, Ipv4Addr, Ipv6Addr};

/// One IP address of a network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct InterfaceAddr {
    /// The interface's name (`lo`, `eth0`), without an address label's `:N` suffix: UCX names
    /// devices by interface.
    pub(crate) name: String,
    /// The address.
    pub(crate) addr: IpAddr,
    /// The interface is a loopback one (`IFF_LOOPBACK`).
    pub(crate) loopback: bool,
}

/// Every IPv4 and IPv6 address of every interface, in the order the kernel lists them.
/// Errors: `getifaddrs`'s.
pub(crate) fn interface_addrs() -> io::Result<Vec<InterfaceAddr>> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs writes a list it allocated into `head`, or fails and writes nothing.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return Err(io::Error::last_os_error());
    }
    let mut out = Vec::new();
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: `cur` is a node of the list getifaddrs made, alive until freeifaddrs below.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        // SAFETY: a non-null ifa_addr points to a sockaddr of the family it names, as large as
        // that family's sockaddr type.
        let addr = unsafe { ip_of(ifa.ifa_addr) };
        let (Some(addr), false) = (addr, ifa.ifa_name.is_null()) else {
            continue;
        };
        // SAFETY: ifa_name is a NUL-terminated string of the node.
        let name = unsafe { std::ffi::CStr::from_ptr(ifa.ifa_name) }.to_string_lossy();
        let name = name.split(':').next().unwrap_or_default().to_owned();
        out.push(InterfaceAddr {
            name,
            addr,
            loopback: ifa.ifa_flags & libc::IFF_LOOPBACK as libc::c_uint != 0,
        });
    }
    // SAFETY: `head` came from getifaddrs and is freed once; no reference into it survives.
    unsafe { libc::freeifaddrs(head) };
    Ok(out)
}

/// The IP address of `sa`, when it is an IPv4 or IPv6 one.
///
/// # Safety
/// `sa` is null or points to a sockaddr as large as its family's type.
unsafe fn ip_of(sa: *const libc::sockaddr) -> Option<IpAddr> {
    if sa.is_null() {
        return None;
    }
    // SAFETY: the caller's promise; the family decides which type it is.
    unsafe {
        match i32::from((*sa).sa_family) {
            libc::AF_INET => {
                let v4 = &*sa.cast::<libc::sockaddr_in>();
                Some(IpAddr::V4(Ipv4Addr::from(u32::from_be(v4.sin_addr.s_addr))))
            }
            libc::AF_INET6 => {
                let v6 = &*sa.cast::<libc::sockaddr_in6>();
                Some(IpAddr::V6(Ipv6Addr::from(v6.sin6_addr.s6_addr)))
            }
            _ => None,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_loopback_interface_carries_127_0_0_1() {
        let all = interface_addrs().unwrap();
        assert!(
            all.iter()
                .any(|i| i.loopback && i.addr == IpAddr::V4(Ipv4Addr::LOCALHOST)),
            "{all:?}"
        );
        assert!(all
            .iter()
            .all(|i| !i.name.is_empty() && !i.name.contains(':')));
    }
}
