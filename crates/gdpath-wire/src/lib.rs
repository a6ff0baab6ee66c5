//! The agent-to-agent control protocol of gdpath, without I/O: the wire format ([`codec`]), the
//! mutual authentication ([`auth`]: HMAC-SHA256 over nonces; the token never crosses the wire)
//! and one state machine per connection ([`protocol`]: messages, local requests and the clock
//! in, actions out). What a connection reports to the application ([`NetEvent`],
//! [`Notification`]) and why it failed ([`Error`]) are defined here too.
//!
//! Nothing here opens a socket, reads a clock, draws a random number or touches UCX: the
//! engine's network backend (`gdpath`, `backend::ucx`) feeds the state machine what arrives and
//! performs what it asks, and re-exports this crate under `gdpath::net`. The in-memory tests
//! (`protocol/tests.rs`) and the fuzz targets (`fuzz/`) drive it alone. The format and the
//! phases of a connection are in `docs/network.md` ("Protocol").

#![forbid(unsafe_code)]

pub mod auth;
pub mod codec;
mod error;
mod event;
pub mod protocol;

pub use error::{Error, Result};
pub use event::{EventKind, NetEvent, Notification};
