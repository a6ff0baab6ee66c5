//! The handles of a connection ([`Peer`]) and of a listening agent ([`Server`]): the user's
//! side of the network backend's links, above them.

use super::{NetEvent, RemoteRegionInfo};
use crate::backend::network::{PeerLink, ServeLink};
use crate::error::{Error, Result};
use crate::memory::{Memory, RemoteMemory};
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;

/// A connection to a serving agent. Cheap to clone.
///
/// The connection closes cleanly (the server reports [`NetEvent::Left`]) on [`Peer::close`],
/// when the last clone is dropped (the drop waits up to 100 ms for the goodbye; one not
/// finished by then finishes in later progress rounds or when the agent is dropped; while
/// regions made from the peer's regions are alive, the goodbye starts once they are dropped
/// too, or when the agent is dropped), or when the agent is dropped.
#[derive(Clone)]
pub struct Peer {
    link: Arc<dyn PeerLink>,
    _last: Arc<LastHandle>,
}

/// Shared by the clones of one [`Peer`]: dropping the last says goodbye.
struct LastHandle(Arc<dyn PeerLink>);

impl Drop for LastHandle {
    fn drop(&mut self) {
        self.0.release();
    }
}

impl std::fmt::Debug for Peer {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Peer").field("name", &self.name()).finish()
    }
}

impl Peer {
    /// The user handle of a connection a network backend made.
    pub(crate) fn new(link: Arc<dyn PeerLink>) -> Peer {
        Peer {
            _last: Arc::new(LastHandle(link.clone())),
            link,
        }
    }

    /// `name@address`: what [`RemoteMemory::agent`] and [`crate::MemoryKind::Remote`] name.
    pub fn name(&self) -> String {
        self.link.name()
    }

    /// Waits until every put posted to this peer so far is in its memory (an endpoint flush;
    /// packed writes: their acknowledgements): the confirmation [`PutCompletion::Local`] leaves
    /// to the application.
    ///
    /// Errors: [`Error::PeerFailed`] when the connection failed or `timeout` passed first.
    ///
    /// [`PutCompletion::Local`]: crate::net::PutCompletion::Local
    pub fn flush(&self, timeout: Duration) -> Result<()> {
        self.link.flush(timeout)
    }

    /// The server's socket address.
    pub fn addr(&self) -> Option<SocketAddr> {
        self.link.addr()
    }

    /// The regions the peer exports now (its latest metadata), withdrawn ones left out.
    pub fn regions(&self) -> Vec<RemoteRegionInfo> {
        self.link
            .regions()
            .into_iter()
            .map(|m| RemoteRegionInfo::of(&m))
            .collect()
    }

    /// The whole of exported region `id`, to pass to [`Agent::register`](crate::Agent::register).
    /// Errors: [`Error::Config`] when the peer does not export `id`.
    pub fn memory(&self, id: u64) -> Result<Memory> {
        self.memory_range(id, 0, u64::MAX)
    }

    /// `len` bytes at `offset` of exported region `id` (`len` is cut to the region's end when
    /// it is `u64::MAX`). Errors: [`Error::Config`] for an unknown id or a range outside it.
    pub fn memory_range(&self, id: u64, offset: u64, len: u64) -> Result<Memory> {
        let m = self
            .link
            .regions()
            .into_iter()
            .find(|m| m.id == id)
            .ok_or_else(|| {
                Error::Config(format!("agent {} exports no region {id}", self.name()))
            })?;
        let len = if len == u64::MAX {
            m.len.saturating_sub(offset)
        } else {
            len
        };
        match offset.checked_add(len) {
            Some(end) if end <= m.len && len > 0 => {}
            _ => {
                return Err(Error::Config(format!(
                    "range {offset}+{len} is outside region {id} of {} bytes",
                    m.len
                )))
            }
        }
        Ok(Memory::Remote(RemoteMemory {
            agent: self.name(),
            addr: m.addr + offset,
            len,
            rkey: m.rkey,
        }))
    }

    /// The UCX transport(s) that move host memory to and from this peer (`tcp`, `sysv+cma`,
    /// ...), as transfer reports name them in `DataPath::Ucx { transport }`; packed writes over
    /// tcp report `tcp (packed writes)`.
    pub fn transport(&self) -> String {
        self.link.transport()
    }

    /// Why the connection is unusable, if it is.
    pub fn failure(&self) -> Option<String> {
        self.link.failure()
    }

    /// Sends a notification on its own, after every write posted to this peer so far has
    /// completed at the peer (endpoint flush first). Waits up to `timeout`.
    pub fn notify(&self, message: &[u8], timeout: Duration) -> Result<()> {
        self.link.notify(message, timeout)
    }

    /// Closes the connection cleanly, for every clone of this handle: new transfers to the
    /// peer are refused, those in flight complete (an endpoint flush), then a goodbye goes to
    /// the server, which reports [`NetEvent::Left`] (not [`NetEvent::Lost`]) and answers.
    /// Waits up to `timeout` for all of it. Regions made from the peer's regions can no longer
    /// be used: posts on them are [`Error::Refused`] with finding `net.peer-failed` ("this
    /// agent closed the connection"); they hold nothing up (a new connect to the same server,
    /// or their own drop, waits for nothing of this connection). Closing a closed peer is `Ok`.
    ///
    /// Errors: [`Error::PeerFailed`] when the connection had already failed, failed while
    /// closing, or the server did not answer within `timeout` (it may then report this agent
    /// as lost).
    pub fn close(self, timeout: Duration) -> Result<()> {
        self.link.close(timeout)
    }

    /// Progresses the connection until `done(self)` or `timeout` (control messages such as
    /// metadata updates and withdrawals arrive while the backend progresses). Returns `done`.
    pub fn wait_until(&self, timeout: Duration, mut done: impl FnMut(&Peer) -> bool) -> bool {
        self.link.wait_until(timeout, &mut || done(self))
    }
}

/// A serving agent's listener and progress thread. Dropping it stops both (connections stay
/// open until the agent is dropped).
pub struct Server {
    link: Box<dyn ServeLink>,
}

impl std::fmt::Debug for Server {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Server")
            .field("addr", &self.local_addr())
            .finish()
    }
}

impl Server {
    /// The user handle of a listener a network backend made.
    pub(crate) fn new(link: Box<dyn ServeLink>) -> Server {
        Server { link }
    }

    /// The bound address (with the port chosen for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.link.local_addr()
    }

    /// The next connection event, waiting up to `timeout`.
    pub fn next_event(&self, timeout: Duration) -> Option<NetEvent> {
        self.link.next_event(timeout)
    }

    /// Authenticated peers connected now.
    pub fn peers(&self) -> usize {
        self.link.peers()
    }

    /// Unexported regions still waiting for peers' acknowledgements (their memory is alive).
    pub fn withdrawing(&self) -> usize {
        self.link.withdrawing()
    }

    /// Stops serving on purpose: the listener and the progress thread stop, then every
    /// connected client is told goodbye (its connection fails with [`Error::PeerFailed`],
    /// "the peer closed the connection", rather than with a transport error some time later),
    /// waiting up to `timeout` for each to answer once it flushed what it still had on its way.
    /// Returns how many clients were told.
    /// Dropping a `Server` stops it without telling anyone.
    pub fn stop(mut self, timeout: Duration) -> usize {
        self.link.stop(timeout)
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        self.link.halt();
    }
}
