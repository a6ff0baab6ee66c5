//! Why the network devices UCX may use could not be chosen ([`DevicesError`]): an error the
//! engine's [`crate::Error`] carries, so it sits below it and names nothing else of the crate.

#[cfg(doc)]
use crate::net::NetConfig;
use std::net::IpAddr;
use std::sync::Arc;

/// Why the network devices UCX may use could not be chosen, or do not cover a later serve or
/// connect. Each names the remedy: [`NetConfig::devices`] (`--devices`) names the devices
/// outright, and the engine then chooses none.
#[derive(Debug, Clone, thiserror::Error)]
#[non_exhaustive]
pub enum DevicesError {
    /// The host's interfaces could not be listed (`getifaddrs`).
    #[error("cannot list this host's network interfaces: {0}")]
    Interfaces(#[source] Arc<std::io::Error>),
    /// No interface of this host has the address.
    #[error(
        "no network interface of this host has address {addr}; name the devices UCX may use \
         with NetConfig::devices (--devices)"
    )]
    NoInterface {
        /// The local address asked for.
        addr: IpAddr,
    },
    /// UCX's tcp transport has no device on the interfaces that carry the address.
    #[error(
        "UCX's tcp transport has no device on {interfaces}, which carries {addr} (its tcp \
         devices here: {tcp}); name the devices UCX may use with NetConfig::devices (--devices)"
    )]
    NoTcpDevice {
        /// The local address the devices are chosen for.
        addr: IpAddr,
        /// The interfaces that carry it, comma-separated.
        interfaces: String,
        /// The devices UCX's tcp transport has on this host, comma-separated.
        tcp: String,
    },
    /// The agent's UCX context was restricted for its first serve or connect, and a later one
    /// needs another interface: a context's devices cannot change.
    #[error(
        "this agent's UCX context was made for {allowed} ({first}); {what} needs {needed}: \
         name every interface the agent uses with NetConfig::devices (--devices), e.g. \
         {suggest}"
    )]
    Outside {
        /// The tcp devices the context has.
        allowed: String,
        /// What the context was made for (`listening on ADDR`, `connecting to ADDR`).
        first: String,
        /// What needs more.
        what: String,
        /// The interfaces it needs (`every interface` for an unspecified address).
        needed: String,
        /// A `devices` value that covers both.
        suggest: String,
    },
}
