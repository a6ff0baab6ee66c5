//! Which network devices UCX may use when [`NetConfig::devices`] is not given: the engine's
//! policy that UCX's own tcp port, which has no authentication of its own, listens only on
//! the interfaces the agent needs (docs/network.md, "UCX's own port").
//!
//! A UCX worker opens a listening tcp socket on every network device of its context, and the
//! devices are fixed when the context is made (`UCX_NET_DEVICES` at `ucp_init`). So the
//! network backend makes its context and worker when the first [`Agent::serve`] or
//! [`Agent::connect`] says which interfaces the agent needs ([`Reach`]): a server the
//! interface carrying its listen address (the loopback interface for a loopback address, every
//! interface for `0.0.0.0` or `::`), a client the interface its connection to the server left
//! from. Only tcp's devices are chosen; RDMA devices (which open no socket) stay.
//!
//! [`Agent::serve`]: crate::Agent::serve
//! [`Agent::connect`]: crate::Agent::connect

use super::DevicesError;
#[cfg(doc)]
use crate::net::NetConfig;
use crate::os::netif::InterfaceAddr;
use gdpath_ucx::Resource;
use std::collections::BTreeSet;
use std::net::{IpAddr, SocketAddr};
use std::sync::Arc;

/// UCX transports that move data through an RDMA NIC (`ucx_info -d`), for the planned path of
/// GPU memory (an endpoint lane on one of them: the NIC would read or write GPU memory).
pub(crate) const RDMA_TRANSPORTS: &[&str] = &[
    "rc_mlx5", "dc_mlx5", "gga_mlx5", "ud_mlx5", "rc_verbs", "ud_verbs", "srd",
];

/// The interfaces an agent needs UCX to listen on.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) enum Reach {
    /// Every interface: a server listening on the unspecified address.
    All,
    /// These interfaces (kernel names).
    Only(BTreeSet<String>),
}

impl std::fmt::Display for Reach {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Reach::All => f.write_str("every interface"),
            Reach::Only(s) => f.write_str(&names(s)),
        }
    }
}

fn names(s: &BTreeSet<String>) -> String {
    s.iter().cloned().collect::<Vec<_>>().join(",")
}

/// What a serve or connect needs of the network devices, and says in errors.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Need {
    /// A server listening on this address.
    Listen(SocketAddr),
    /// A client whose connection to `peer` left from local address `local`.
    Connect { peer: SocketAddr, local: IpAddr },
}

impl Need {
    /// The interfaces needed, from the host's (`getifaddrs`). Errors:
    /// [`DevicesError::Interfaces`], [`DevicesError::NoInterface`].
    pub(crate) fn reach(&self) -> Result<Reach, DevicesError> {
        let ifs = crate::os::netif::interface_addrs()
            .map_err(|e| DevicesError::Interfaces(Arc::new(e)))?;
        match self {
            Need::Listen(a) => reach_of_listen(a.ip(), &ifs),
            Need::Connect { local, .. } => reach_of_local(*local, &ifs),
        }
    }

    /// The local address the interfaces are for.
    pub(crate) fn addr(&self) -> IpAddr {
        match self {
            Need::Listen(a) => a.ip(),
            Need::Connect { local, .. } => *local,
        }
    }
}

impl std::fmt::Display for Need {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Need::Listen(a) => write!(f, "listening on {a}"),
            Need::Connect { peer, local } => write!(f, "connecting to {peer} from {local}"),
        }
    }
}

/// The interfaces a server listening on `ip` needs: every one for an unspecified address, the
/// loopback ones for a loopback address (any of 127.0.0.0/8 is on them), else those that
/// carry `ip`. Errors: [`DevicesError::NoInterface`].
pub(crate) fn reach_of_listen(ip: IpAddr, ifs: &[InterfaceAddr]) -> Result<Reach, DevicesError> {
    if ip.to_canonical().is_unspecified() {
        return Ok(Reach::All);
    }
    reach_of_local(ip, ifs)
}

/// The interfaces that carry local address `ip` (a client's end of its connection to a
/// server): the loopback ones for a loopback address, else those that have `ip`. A
/// non-loopback address that only a loopback interface carries (a service address bound to
/// `lo`) is reached by peers through the others, which UCX must then advertise: every
/// interface. Errors: [`DevicesError::NoInterface`] for a loopback address on no interface.
pub(crate) fn reach_of_local(ip: IpAddr, ifs: &[InterfaceAddr]) -> Result<Reach, DevicesError> {
    let ip = ip.to_canonical();
    let on: Vec<&InterfaceAddr> = ifs
        .iter()
        .filter(|i| {
            if ip.is_loopback() {
                i.loopback
            } else {
                i.addr == ip
            }
        })
        .collect();
    if on.is_empty() && ip.is_loopback() {
        return Err(DevicesError::NoInterface { addr: ip });
    }
    if !ip.is_loopback() && on.iter().all(|i| i.loopback) {
        // Also an address on no interface (routed here, bound with IP_FREEBIND): the
        // interfaces it arrives by are not known.
        return Ok(Reach::All);
    }
    Ok(Reach::Only(on.iter().map(|i| i.name.clone()).collect()))
}

/// How the backend's UCX context is made for a [`Reach`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Plan {
    /// `UCX_NET_DEVICES` for the context; `None`: the context made without it serves (nothing
    /// to leave out).
    pub(crate) devices: Option<String>,
    /// The tcp devices the context keeps when it leaves some out; `None`: all of them.
    pub(crate) allowed: Option<BTreeSet<String>>,
}

impl Plan {
    /// No restriction.
    pub(crate) const ALL: Plan = Plan {
        devices: None,
        allowed: None,
    };
}

/// The tcp devices among UCX's resources.
pub(crate) fn tcp_devices(resources: &[Resource]) -> BTreeSet<String> {
    resources
        .iter()
        .filter(|r| r.transport == "tcp")
        .map(|r| r.device.clone())
        .collect()
}

/// The network devices of UCX's other network transports (RDMA ports, named `DEVICE:PORT`),
/// which open no socket and are kept whatever the reach.
fn other_network_devices(resources: &[Resource]) -> BTreeSet<String> {
    resources
        .iter()
        .filter(|r| {
            r.transport != "tcp"
                && (RDMA_TRANSPORTS.contains(&r.transport.as_str()) || r.device.contains(':'))
        })
        .map(|r| r.device.clone())
        .collect()
}

/// The context for `reach`, given the `resources` of a context made without `UCX_NET_DEVICES`
/// (`addr`: the address the reach is for, for the error): tcp's devices on the interfaces
/// reached plus every other network device, or no restriction when none of tcp's devices is
/// left out; the other network devices alone when tcp has none on the interfaces reached
/// (an RDMA machine's data then moves over RDMA only). Errors: [`DevicesError::NoTcpDevice`]
/// when tcp has devices but none on the interfaces reached, and there is no other network
/// device.
pub(crate) fn plan(
    reach: &Reach,
    resources: &[Resource],
    addr: IpAddr,
) -> Result<Plan, DevicesError> {
    let tcp = tcp_devices(resources);
    let Reach::Only(ifs) = reach else {
        return Ok(Plan::ALL);
    };
    if tcp.is_empty() {
        return Ok(Plan::ALL);
    }
    let keep: BTreeSet<String> = tcp.intersection(ifs).cloned().collect();
    let other = other_network_devices(resources);
    if keep.is_empty() && !other.is_empty() {
        // The RDMA devices carry the data; UCX's tcp gets no device, so no port of its listens.
        return Ok(Plan {
            devices: Some(names(&other)),
            allowed: Some(keep),
        });
    }
    if keep.is_empty() {
        return Err(DevicesError::NoTcpDevice {
            addr,
            interfaces: names(ifs),
            tcp: names(&tcp),
        });
    }
    if keep == tcp {
        return Ok(Plan::ALL);
    }
    let mut devices = keep.clone();
    devices.extend(other);
    Ok(Plan {
        devices: Some(names(&devices)),
        allowed: Some(keep),
    })
}

/// Checks that a context made with `allowed` tcp devices (`None`: all) covers `reach`
/// (`what` needs it; the context was made for `first`; `tcp`: every tcp device UCX has).
/// Errors: [`DevicesError::Outside`].
pub(crate) fn check_covered(
    reach: &Reach,
    allowed: Option<&BTreeSet<String>>,
    tcp: &BTreeSet<String>,
    first: &str,
    what: &str,
) -> Result<(), DevicesError> {
    let Some(allowed) = allowed else {
        return Ok(());
    };
    let (needed, suggest) = match reach {
        Reach::All => (None, "all".to_owned()),
        Reach::Only(ifs) => {
            let needed: BTreeSet<String> = tcp.intersection(ifs).cloned().collect();
            if !needed.is_empty() && needed.is_subset(allowed) {
                return Ok(());
            }
            let mut both = allowed.clone();
            both.extend(ifs.iter().cloned());
            (Some(ifs), names(&both))
        }
    };
    Err(DevicesError::Outside {
        allowed: names(allowed),
        first: first.to_owned(),
        what: what.to_owned(),
        needed: needed.map_or_else(|| "every interface".to_owned(), names),
        suggest,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn ifs() -> Vec<InterfaceAddr> {
        let i = |name: &str, addr: &str, loopback| InterfaceAddr {
            name: name.into(),
            addr: addr.parse().unwrap(),
            loopback,
        };
        vec![
            i("lo", "127.0.0.1", true),
            i("lo", "::1", true),
            i("eth0", "192.0.2.2", false),
            i("eth0", "fe80::1", false),
            i("ib0", "10.1.0.5", false),
        ]
    }

    fn res(list: &[(&str, &str)]) -> Vec<Resource> {
        list.iter()
            .map(|(t, d)| Resource {
                transport: (*t).into(),
                device: (*d).into(),
            })
            .collect()
    }

    fn only(names: &[&str]) -> Reach {
        Reach::Only(names.iter().map(|s| (*s).to_owned()).collect())
    }

    #[test]
    fn a_listen_address_reaches_the_interface_that_carries_it() {
        let ifs = ifs();
        let at = |s: &str| reach_of_listen(s.parse().unwrap(), &ifs);
        assert_eq!(at("127.0.0.1").unwrap(), only(&["lo"]));
        // Any loopback address is on the loopback interface, which lists only 127.0.0.1.
        assert_eq!(at("127.0.0.2").unwrap(), only(&["lo"]));
        assert_eq!(at("::1").unwrap(), only(&["lo"]));
        assert_eq!(at("::ffff:127.0.0.1").unwrap(), only(&["lo"]));
        assert_eq!(at("192.0.2.2").unwrap(), only(&["eth0"]));
        assert_eq!(at("10.1.0.5").unwrap(), only(&["ib0"]));
        assert_eq!(at("0.0.0.0").unwrap(), Reach::All);
        assert_eq!(at("::").unwrap(), Reach::All);
        // An address on no interface (routed here), or only on `lo` (a service address bound
        // there): peers arrive by interfaces not known, so UCX keeps them all.
        assert_eq!(at("192.0.2.9").unwrap(), Reach::All);
        let mut vip = ifs.clone();
        vip.push(InterfaceAddr {
            name: "lo".into(),
            addr: "198.51.100.7".parse().unwrap(),
            loopback: true,
        });
        assert_eq!(
            reach_of_listen("198.51.100.7".parse().unwrap(), &vip).unwrap(),
            Reach::All
        );
        // A loopback address is always on a loopback interface; none listed is an error.
        let no_lo: Vec<InterfaceAddr> = ifs.iter().filter(|i| !i.loopback).cloned().collect();
        assert!(matches!(
            at_in("127.0.0.1", &no_lo),
            Err(DevicesError::NoInterface { .. })
        ));
    }

    fn at_in(s: &str, ifs: &[InterfaceAddr]) -> Result<Reach, DevicesError> {
        reach_of_listen(s.parse().unwrap(), ifs)
    }

    #[test]
    fn only_tcp_devices_outside_the_reach_are_left_out() {
        let a: IpAddr = "127.0.0.1".parse().unwrap();
        let debian = res(&[
            ("self", "memory0"),
            ("tcp", "eth0"),
            ("tcp", "lo"),
            ("sysv", "memory"),
            ("posix", "memory"),
            ("cma", "memory"),
        ]);
        let p = plan(&only(&["lo"]), &debian, a).unwrap();
        assert_eq!(p.devices.as_deref(), Some("lo"));
        assert_eq!(p.allowed, Some(["lo".to_owned()].into()));
        // Serving everywhere, or nothing to leave out: the context as UCX makes it.
        assert_eq!(plan(&Reach::All, &debian, a).unwrap(), Plan::ALL);
        let lo_only = res(&[("tcp", "lo"), ("posix", "memory")]);
        assert_eq!(plan(&only(&["lo"]), &lo_only, a).unwrap(), Plan::ALL);
        assert_eq!(
            plan(&only(&["lo"]), &res(&[("rc_mlx5", "mlx5_0:1")]), a).unwrap(),
            Plan::ALL
        );
        // RDMA devices stay: they open no socket, and GPUDirect RDMA needs them.
        let rdma = res(&[
            ("tcp", "eth0"),
            ("tcp", "ib0"),
            ("tcp", "lo"),
            ("rc_mlx5", "mlx5_0:1"),
            ("ud_verbs", "mlx5_0:1"),
            ("dc_mlx5", "mlx5_1:1"),
            ("cuda_ipc", "cuda"),
            ("gdr_copy", "gdr"),
        ]);
        let p = plan(&only(&["ib0"]), &rdma, a).unwrap();
        assert_eq!(p.devices.as_deref(), Some("ib0,mlx5_0:1,mlx5_1:1"));
        // An interface tcp has no device on: the RDMA devices alone, where there are some ...
        let p = plan(&only(&["docker0"]), &rdma, a).unwrap();
        assert_eq!(p.devices.as_deref(), Some("mlx5_0:1,mlx5_1:1"));
        assert_eq!(p.allowed, Some(BTreeSet::new()));
        // ... else it is named, with the devices tcp has.
        let e = plan(&only(&["docker0"]), &debian, a).unwrap_err();
        assert!(e.to_string().contains("no device on docker0"), "{e}");
        assert!(e.to_string().contains("eth0,lo"), "{e}");
    }

    #[test]
    fn a_later_need_outside_the_first_is_named_with_a_remedy() {
        let tcp: BTreeSet<String> = ["eth0".to_owned(), "lo".to_owned()].into();
        let lo: BTreeSet<String> = ["lo".to_owned()].into();
        let first = "listening on 127.0.0.1:18515";
        assert!(check_covered(&only(&["lo"]), Some(&lo), &tcp, first, "x").is_ok());
        assert!(check_covered(&only(&["eth0"]), None, &tcp, first, "x").is_ok());
        let e = check_covered(
            &only(&["eth0"]),
            Some(&lo),
            &tcp,
            first,
            "connecting to 192.0.2.9:1",
        )
        .unwrap_err()
        .to_string();
        assert!(
            e.contains("made for lo (listening on 127.0.0.1:18515)"),
            "{e}"
        );
        assert!(e.contains("connecting to 192.0.2.9:1 needs eth0"), "{e}");
        assert!(e.contains("e.g. eth0,lo"), "{e}");
        let e = check_covered(&Reach::All, Some(&lo), &tcp, first, "y").unwrap_err();
        assert!(e.to_string().contains("needs every interface"), "{e}");
    }
}
