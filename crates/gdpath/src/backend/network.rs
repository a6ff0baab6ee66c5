//! The network extension of a backend: connections to peer agents, the regions this agent
//! exports to them, notifications.
//!
//! A backend that reaches peer agents answers [`super::Backend::network`] with itself as a
//! [`NetworkBackend`]; every other backend answers `None`. The agent keeps no network field of
//! its own: `Agent::connect`, `serve`, `export`, `wait_notification` and the rest find the
//! first backend of its list that answers, and delegate to it (as NIXL's backend interface
//! carries connect, remote metadata and notifications beside the data path). Data moves through
//! the ordinary [`super::Backend`] methods: remote memory is materialised by
//! [`super::Backend::materialize`], and pairs touching it are planned and submitted like any
//! other. The one implementation is the UCX backend (`backend::ucx`).
//!
//! A connection and a listener are handed back as [`PeerLink`] and [`ServeLink`] objects, which
//! the user types `crate::net::Peer` and `crate::net::Server` wrap.

use crate::error::Result;
use crate::net::codec::RegionMeta;
use crate::net::{ConnectOptions, NetConfig, NetEvent, Notification, Token};
use crate::region::Region;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A hook run after each notification is queued ([`NetworkBackend::on_notification`]); it must
/// not block.
pub type NotificationHook = Arc<dyn Fn() + Send + Sync>;

/// What a backend that reaches peer agents offers besides moving data.
pub trait NetworkBackend: Send + Sync {
    /// The settings it was created with.
    fn net_config(&self) -> &NetConfig;

    /// Connects to a serving agent at `addr`: handshake (mutual authentication with
    /// `opts.token`) and metadata. Errors: `Error::AuthFailed`, `Error::PeerFailed`,
    /// `Error::Protocol`, `Error::Ucx`.
    fn connect(&self, addr: SocketAddr, opts: &ConnectOptions) -> Result<Arc<dyn PeerLink>>;

    /// Listens on `listen` and serves peers (handshakes, metadata, withdrawals, their
    /// operations) until the returned link is halted. Errors: `Error::Config` (address in use,
    /// already listening), `Error::Ucx`.
    fn serve(&self, listen: SocketAddr, token: Token) -> Result<Box<dyn ServeLink>>;

    /// Exports `region` to peers; returns the id they know it by.
    fn export(&self, region: &Region) -> Result<u64>;

    /// What peers learn of exported `region` from the metadata (id, kind, length, and the
    /// same-node shortcuts offered). Errors: `Error::Config` when it is not exported,
    /// `Error::ForeignRegion`.
    fn export_info(&self, region: &Region) -> Result<crate::net::RemoteRegionInfo>;

    /// Withdraws an exported region (kept alive until every peer acknowledged).
    fn unexport(&self, region: &Region) -> Result<()>;

    /// Whether `region` is exported, or withdrawn and still held for a peer.
    fn is_exported(&self, region: &Region) -> bool;

    /// Notifications received so far, oldest first.
    fn take_notifications(&self) -> Vec<Notification>;

    /// Waits up to `timeout` for a notification, progressing the backend meanwhile.
    fn wait_notification(&self, timeout: Duration) -> Option<Notification>;

    /// Runs `hook` after each notification is queued, on the thread that progressed the
    /// backend (see `Agent::on_notification`).
    fn on_notification(&self, hook: NotificationHook);

    /// Facts about the UCX library under it (version, transports, CUDA support).
    fn ucx_facts(&self) -> Result<gdpath_ucx::UcxFacts>;
}

/// One connection to a serving agent, as `crate::net::Peer` uses it.
pub trait PeerLink: Send + Sync {
    /// `name@address` once authenticated.
    fn name(&self) -> String;
    /// The server's socket address.
    fn addr(&self) -> Option<SocketAddr>;
    /// The regions the peer exports now, withdrawn ones left out.
    fn regions(&self) -> Vec<RegionMeta>;
    /// The transport(s) moving host memory to and from the peer, as reports name them.
    fn transport(&self) -> String;
    /// Why the connection is unusable, if it is.
    fn failure(&self) -> Option<String>;
    /// Waits until every write posted so far is in the peer's memory.
    fn flush(&self, timeout: Duration) -> Result<()>;
    /// Sends a notification after every write posted so far completed at the peer.
    fn notify(&self, message: &[u8], timeout: Duration) -> Result<()>;
    /// Closes the connection cleanly (a goodbye the peer answers), waiting up to `timeout`.
    fn close(&self, timeout: Duration) -> Result<()>;
    /// Progresses the connection until `done()` or `timeout`; returns `done()`.
    fn wait_until(&self, timeout: Duration, done: &mut dyn FnMut() -> bool) -> bool;
    /// The last user handle is gone: close without keeping the caller waiting long.
    fn release(&self);
}

/// A listener and what serves its peers, as `crate::net::Server` uses it.
pub trait ServeLink: Send + Sync {
    /// The bound address.
    fn local_addr(&self) -> SocketAddr;
    /// The next connection event, waiting up to `timeout`.
    fn next_event(&self, timeout: Duration) -> Option<NetEvent>;
    /// Authenticated peers connected now.
    fn peers(&self) -> usize;
    /// Withdrawn regions still held for peers.
    fn withdrawing(&self) -> usize;
    /// Stops listening and serving, then tells every connected client goodbye, waiting up to
    /// `timeout`; returns how many were told.
    fn stop(&mut self, timeout: Duration) -> usize;
    /// Stops listening and serving (once), telling nobody.
    fn halt(&mut self);
}
