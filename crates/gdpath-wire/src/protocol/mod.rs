//! The agent-to-agent control protocol as a state machine, without I/O.
//!
//! One [`Conn`] per connection, one [`Node`] per agent (its name, the token it serves with, the
//! regions it exports). Inputs: decoded messages ([`Conn::handle`]) or the decoder's refusal
//! ([`Conn::decode_failed`]), local requests (close, withdraw, metadata, a flush that finished,
//! writes sent or applied), a transport that failed, and the clock: every input that depends on
//! time takes `now`, and [`Conn::poll`] checks the deadlines ([`Conn::next_deadline`] says when
//! the next one falls). Nothing inside reads a clock, draws a random number (the nonces come in
//! and the routing ids come in with the constructors), or touches UCX, a socket or a thread. Outputs are [`Action`]s pushed
//! onto the caller's list, in the order they must be performed: send this message, flush the
//! data channel, copy these packed writes, complete these writes, release this export, report
//! this event, forget this connection.
//!
//! The engine's network backend (`backend::ucx` of `gdpath`) feeds it what UCX delivers and
//! performs what it asks; the unit tests (`tests.rs`) and the fuzz target
//! (`fuzz/fuzz_targets/protocol.rs`) wire two state machines together in memory. What is sent on which channel, and why, is in
//! `docs/network.md` ("Protocol").
//!
//! Phases of a connection. Client: awaiting the challenge → awaiting the welcome → ready →
//! closing (goodbye flush, then `Bye`) → closed by the server's answering `Bye`; or, when the
//! server says goodbye first, ready → answering (operations in flight failed, flush, then `Bye`
//! in answer) → over. Server: awaiting the client's answer → ready → leaving (the client said
//! goodbye, or this server is stopping and waits for the client's answer) → over. Any phase can end failed ([`Action::End`] with the error): a refusal, a
//! protocol error, a deadline passed, a transport that failed.

mod conn;
mod exports;
#[cfg(test)]
mod tests;

pub use conn::{Conn, Role};
pub use exports::Exports;

use crate::auth::Token;
use crate::codec::{Message, WriteBytes, WritesStatus};
use crate::error::Error;
use crate::{NetEvent, Notification};
use std::time::Duration;

/// The time bounds of a connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// Bound on the handshake, from the connection's start (`NetConfig::connect_timeout`, or
    /// `ConnectOptions::timeout` for a client). A bound too long to represent as an `Instant`
    /// is no bound.
    pub handshake: Duration,
    /// Bound on a goodbye, from its start: a client's answered, a leaving server connection
    /// dropped (`NetConfig::connect_timeout`).
    pub goodbye: Duration,
    /// Bound on an acknowledgement the peer owes (of packed writes, of a withdrawal):
    /// `NetConfig::op_timeout`. Past it the connection fails. Zero: no bound.
    pub ack: Duration,
}

/// What one agent knows that its connections need: its name, its UCX worker address, the token
/// it serves with, the regions it exports.
#[derive(Debug, Clone, Default)]
pub struct Node {
    /// The agent's name, as `Auth` and the metadata carry it (cut to the protocol's limits).
    pub name: String,
    /// The agent's UCX worker address (`Auth` and `Welcome` carry it): peers connect their
    /// data channel to it once they authenticated this agent.
    pub worker_address: Vec<u8>,
    /// The token clients must prove, while this agent serves; `None` when it does not (a
    /// client answering a challenge then is refused: the server is stopping).
    pub token: Option<Token>,
    /// The regions this agent exports.
    pub exports: Exports,
}

impl Node {
    /// A node named `name`, not serving, exporting nothing.
    pub fn new(name: &str) -> Node {
        Node {
            name: name.to_owned(),
            ..Node::default()
        }
    }
}

/// Why the data channel is flushed ([`Action::Flush`]); given back with [`Conn::flushed`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Flush {
    /// The peer withdrew these regions: acknowledge once every operation posted on them so
    /// far completed.
    WithdrawAck(Vec<u64>),
    /// This agent closes the connection: `Bye` goes once every operation posted so far
    /// completed (and nothing else is in flight to the peer).
    Goodbye,
}

/// What the caller of a [`Conn`] method must do, in order.
#[derive(Debug, Clone)]
pub enum Action {
    /// Send this message to the peer.
    Send(Message),
    /// The peer authenticated: connect the data channel to its UCX worker at `worker_address`,
    /// putting `session` on every message sent over it (the peer routes them by it). Comes
    /// before anything is sent over that channel.
    Connect {
        /// The peer's UCX worker address (opaque bytes from its `Auth` or `Welcome`).
        worker_address: Vec<u8>,
        /// The routing id to put on every message sent to the peer over the data channel.
        session: u64,
    },
    /// Flush the connection's data channel, then report it with [`Conn::flushed`].
    Flush(Flush),
    /// The operations in flight on the connection fail with this error now: the peer will not
    /// complete them (it said goodbye). The connection itself ends later.
    Fail(Error),
    /// The peer withdrew these regions (client): posts on regions made from them fail from
    /// now on.
    Withdrawn(Vec<u64>),
    /// Copy these writes into export `region` (server; checked against the export already),
    /// then answer with [`Conn::writes_applied`].
    ApplyWrites {
        /// The client's sequence number of the packed-writes message, echoed in the
        /// acknowledgement.
        seq: u64,
        /// The id of the exported host region written.
        region: u64,
        /// The writes: `(offset, length)` in bytes from the region's start, checked against its
        /// end.
        records: Vec<(u64, u32)>,
        /// The writes' bytes back to back, as many as the lengths add up to.
        data: WriteBytes,
    },
    /// The peer answered packed writes `seq` (client): complete their pairs.
    WritesAcked {
        /// The `seq` of the packed-writes message answered.
        seq: u64,
        /// Whether its writes were made.
        status: WritesStatus,
    },
    /// A notification for the application.
    Notification(Notification),
    /// Report this event (a serving agent's connections).
    Event(NetEvent),
    /// Release exported region `id` (withdrawn, and no peer holds it any more): its memory and
    /// registration may go.
    Release(u64),
    /// The connection is over: forget it, once the messages sent before this are on their
    /// way. `Ok` for a clean end (a goodbye answered), else why it failed.
    End(Result<(), Error>),
}
