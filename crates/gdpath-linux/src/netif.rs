//! This host's network interfaces and their addresses (`getifaddrs(3)`), for the choice of the
//! devices UCX's tcp transport may listen on ([`crate::net::DevicesError`]).

use std::io;
use std::net::IpAddr;
#[cfg(test)]
use std::net::Ipv4Addr;

/// One IP address of a network interface.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct InterfaceAddr {
    /// The interface's name (`lo`, `eth0`), without an address label's `:N` suffix: UCX names
    /// devices by interface.
    pub name: String,
    /// The address.
    pub addr: IpAddr,
    /// The interface is a loopback one (`IFF_LOOPBACK`).
    pub loopback: bool,
}

/// Every IPv4 and IPv6 address of every interface, in the order the kernel lists them.
/// Errors: `getifaddrs`'s.
pub fn interface_addrs() -> io::Result<Vec<InterfaceAddr>> {
    let list = nix::ifaddrs::getifaddrs().map_err(io::Error::from)?;
    Ok(list
        .filter_map(|ifa| {
            let sa = ifa.address?;
            let addr = if let Some(v4) = sa.as_sockaddr_in() {
                IpAddr::V4(v4.ip())
            } else {
                IpAddr::V6(sa.as_sockaddr_in6()?.ip())
            };
            let name = ifa.interface_name.split(':').next().unwrap_or_default();
            Some(InterfaceAddr {
                name: name.to_owned(),
                addr,
                loopback: ifa
                    .flags
                    .contains(nix::net::if_::InterfaceFlags::IFF_LOOPBACK),
            })
        })
        .collect())
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
