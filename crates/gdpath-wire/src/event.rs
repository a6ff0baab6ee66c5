//! What a connection reports to the application: a serving agent's connection events and the
//! notifications peers send.

use std::net::SocketAddr;

/// Something that happened to a serving agent's connections.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum NetEvent {
    /// A peer authenticated; `peer` is `name@address`.
    Connected {
        /// The peer's label, `name@address`.
        peer: String,
    },
    /// A connection was refused (wrong token, protocol error, too many peers).
    Refused {
        /// The peer's address, where the transport gave one.
        addr: Option<SocketAddr>,
        /// Why it was refused, as logged.
        reason: String,
    },
    /// A connection failed or its handshake timed out: the peer died, was killed, or its
    /// network went away, without saying goodbye. `detail` says why (e.g. `connection
    /// failed: UCS_ERR_ENDPOINT_TIMEOUT (-80)`, `no handshake within 10s`). `authenticated`:
    /// the peer had proved the token (`peer` is then `name@address`; before, its address),
    /// so that a connection lost in its handshake, which anyone who reaches the port can
    /// cause, is told apart.
    Lost {
        /// The peer's label: `name@address` once authenticated, its address before.
        peer: String,
        /// Why the connection was lost.
        detail: String,
        /// Whether the peer had proved the token before the connection was lost.
        authenticated: bool,
    },
    /// A peer closed its connection cleanly (`gdpath::net::Peer::close`, its last `Peer`
    /// handle or its agent dropped, a `gdpath bench net` run ending): it said goodbye after
    /// its operations completed, and what the server held for it was released. `peer` is
    /// `name@address`.
    Left {
        /// The peer's label, `name@address`.
        peer: String,
    },
}

/// A notification from a peer (`gdpath::TransferRequest::notify`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Notification {
    /// The sender, `name@address`.
    pub from: String,
    /// The bytes it sent (at most [`MAX_NOTIFY`](crate::codec::MAX_NOTIFY)).
    pub message: Vec<u8>,
}

/// What kind of thing a [`NetEvent`] says happened, for logs and counts.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub enum EventKind {
    /// [`NetEvent::Connected`].
    Connected,
    /// [`NetEvent::Refused`]: anyone reaching the port can cause it.
    Refused,
    /// [`NetEvent::Lost`] of a connection still in its handshake (silent, closed, or reset
    /// before it proved the token): anyone reaching the port can cause it.
    LostInHandshake,
    /// [`NetEvent::Lost`] of an authenticated peer.
    Lost,
    /// [`NetEvent::Left`].
    Left,
}

impl EventKind {
    /// A stable name: `connected`, `refused`, `lost-in-handshake`, `lost`, `left`.
    pub fn as_str(self) -> &'static str {
        match self {
            EventKind::Connected => "connected",
            EventKind::Refused => "refused",
            EventKind::LostInHandshake => "lost-in-handshake",
            EventKind::Lost => "lost",
            EventKind::Left => "left",
        }
    }

    /// The kind whose [`EventKind::as_str`] is `name`, if any.
    pub fn from_name(name: &str) -> Option<EventKind> {
        [
            EventKind::Connected,
            EventKind::Refused,
            EventKind::LostInHandshake,
            EventKind::Lost,
            EventKind::Left,
        ]
        .into_iter()
        .find(|k| k.as_str() == name)
    }

    /// Whether a log bounds the rate of this kind (`gdpath::net::EventLog`): refused and lost
    /// connections, which a peer can repeat as fast as it connects (a lost authenticated
    /// peer too: a client killed in a loop is no reason to flood the log either).
    pub fn is_rate_limited(self) -> bool {
        matches!(
            self,
            EventKind::Refused | EventKind::LostInHandshake | EventKind::Lost
        )
    }
}

impl std::fmt::Display for EventKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl NetEvent {
    /// The event's [`EventKind`].
    pub fn kind(&self) -> EventKind {
        match self {
            NetEvent::Connected { .. } => EventKind::Connected,
            NetEvent::Refused { .. } => EventKind::Refused,
            NetEvent::Lost {
                authenticated: false,
                ..
            } => EventKind::LostInHandshake,
            NetEvent::Lost { .. } => EventKind::Lost,
            NetEvent::Left { .. } => EventKind::Left,
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lost(authenticated: bool) -> NetEvent {
        NetEvent::Lost {
            peer: "p".into(),
            detail: "d".into(),
            authenticated,
        }
    }

    #[test]
    fn kinds_have_stable_names() {
        for k in [
            EventKind::Connected,
            EventKind::Refused,
            EventKind::LostInHandshake,
            EventKind::Lost,
            EventKind::Left,
        ] {
            assert_eq!(EventKind::from_name(k.as_str()), Some(k));
        }
        assert_eq!(EventKind::from_name("lost in handshake"), None);
        assert_eq!(lost(false).kind(), EventKind::LostInHandshake);
        assert_eq!(lost(true).kind(), EventKind::Lost);
    }
}
