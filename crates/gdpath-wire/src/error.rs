//! Why a connection failed, or a value was refused, in the protocol's terms.

use crate::codec::DecodeError;

/// An error of the protocol. Each variant is the engine's `gdpath::Error` variant of the same
/// name, with the same text, and converts into it (`gdpath::Error: From<Error>`), so that a
/// failure reads the same, and has the same kind, wherever it is reported. Not
/// `#[non_exhaustive]`: that conversion names every variant, so that a new one needs its own.
#[derive(Debug, Clone, thiserror::Error)]
pub enum Error {
    /// An invalid value given to this crate: a token shorter than
    /// [`MIN_TOKEN_LEN`](crate::auth::MIN_TOKEN_LEN) bytes.
    #[error("invalid configuration: {0}")]
    Config(String),
    /// The connection to a peer failed or was lost (closed, a transport that failed, a
    /// deadline passed, a refusal). `peer` is the peer's label (`name@address`) or its
    /// address.
    #[error("peer {peer}: {detail}")]
    PeerFailed {
        /// The peer's label or address.
        peer: String,
        /// What failed (the transport's status, the deadline, the refusal).
        detail: String,
    },
    /// Authentication with a peer failed: wrong or missing token on either side, or the peer
    /// refused the connection (`detail` says why).
    #[error("authentication with {peer} failed: {detail}")]
    AuthFailed {
        /// The peer's label or address.
        peer: String,
        /// Why authentication failed.
        detail: String,
    },
    /// A peer broke the protocol: malformed, oversized, unknown-version or unexpected message.
    /// Nothing it sent was used. `source`: the decoder's refusal, for a malformed message.
    #[error(
        "protocol error from {peer}: {detail}{}",
        source.as_ref().map(|e| format!(": {e}")).unwrap_or_default()
    )]
    Protocol {
        /// The peer's label (`name@address`) or its address.
        peer: String,
        /// What it broke (e.g. "unexpected Welcome").
        detail: String,
        /// The decoder's refusal, for a malformed message; `None` for a well-formed but unexpected
        /// one.
        #[source]
        source: Option<DecodeError>,
    },
}

/// The protocol's result type.
pub type Result<T, E = Error> = std::result::Result<T, E>;
