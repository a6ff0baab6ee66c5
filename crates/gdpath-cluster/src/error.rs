//! What goes wrong in the cluster layer, each with a stable kind for `--json` and Python.

use std::time::{Duration, SystemTime};

/// An error of the cluster layer. Every text that came from etcd (a record, a name, another
/// agent's node) is escaped with [`gdpath::topo::text::escape`] before it is put in a message.
#[derive(Debug, thiserror::Error)]
pub enum ClusterError {
    /// The cluster URL does not parse (`etcd://host:port[,host:port…]/namespace`).
    #[error("cluster URL: {0}")]
    Url(String),
    /// A setting out of its range (the lease TTL).
    #[error("{0}")]
    Config(String),
    /// An agent name outside the rules of [`crate::record::valid_name`].
    #[error("agent name {0}")]
    InvalidName(String),
    /// etcd did not answer within the bound (every endpoint tried), or the connection failed.
    #[error("etcd at {endpoints} unreachable: {detail}")]
    Unreachable {
        /// The endpoints tried, comma-separated.
        endpoints: String,
        /// The last failure.
        detail: String,
    },
    /// etcd refused the credentials or the operation (auth enabled, wrong user or password,
    /// no permission on the namespace).
    #[error("etcd refused: {0}")]
    Denied(String),
    /// Any other error etcd returned.
    #[error("etcd: {0}")]
    Etcd(String),
    /// The name is held by another live agent (its incarnation and node are named).
    #[error(
        "agent name {name} is taken by incarnation {incarnation} on {hostname}: stop that agent \
         or choose another --name (a crashed holder's record goes when its lease expires)"
    )]
    NameTaken {
        /// The name asked for.
        name: String,
        /// The holder's incarnation id.
        incarnation: String,
        /// The holder's host name.
        hostname: String,
    },
    /// No record of that name appeared within the wait.
    #[error("no agent named {name} in the cluster after waiting {waited:?}")]
    NotFound {
        /// The name asked for.
        name: String,
        /// How long it waited.
        waited: Duration,
    },
    /// A record read from etcd that breaks the rules (size, JSON, fields, key). Made by
    /// [`ClusterError::invalid_record`], which escapes and bounds both texts.
    #[error("invalid record at {key}: {detail}")]
    InvalidRecord {
        /// The etcd key, escaped for a terminal, at most [`MAX_SHOWN_CHARS`]
        /// characters and `…`.
        key: String,
        /// Which rule it breaks, escaped and bounded as `key` (a serde error quotes the
        /// record's own bytes).
        detail: String,
    },
    /// The peer's lease expired or its record was deleted or replaced: transfers to it end
    /// and later posts are refused.
    #[error("peer {name} (incarnation {incarnation}) gone since {}: {reason}", since_text(*since))]
    PeerGone {
        /// The peer's agent name.
        name: String,
        /// The incarnation that went.
        incarnation: String,
        /// When this agent learnt it.
        since: SystemTime,
        /// Why: lease expired, record deleted or replaced.
        reason: String,
    },
    /// The agent reached at the record's address is not the incarnation the record names (a
    /// restarted agent, or another agent on that port): its metadata is not used.
    #[error(
        "the agent at {addr} is {found}, not {name} incarnation {expected}: stale record, not used"
    )]
    IncarnationMismatch {
        /// The agent name the record is under.
        name: String,
        /// The address the record gives.
        addr: String,
        /// The incarnation the record names.
        expected: String,
        /// The agent found at that address.
        found: String,
    },
    /// An error of the engine (connect, register, post, wait).
    #[error(transparent)]
    Engine(#[from] gdpath::Error),
}

/// Most characters of a text built from a record that a message shows (its key, why it is
/// invalid): a hostile record's 200 KB stay out of terminals and logs.
pub const MAX_SHOWN_CHARS: usize = 200;

/// `raw` escaped with [`gdpath::topo::text::escape`] (the project's one rule for untrusted
/// text on a terminal), then cut to `max_chars` characters, `…` marking a cut.
pub fn shown(raw: &str, max_chars: usize) -> String {
    let escaped = gdpath::topo::text::escape(raw);
    match escaped.char_indices().nth(max_chars) {
        Some((at, _)) => format!("{}…", &escaped[..at]),
        None => escaped,
    }
}

/// Seconds since the Unix epoch, what a log line can be matched with.
fn since_text(t: SystemTime) -> String {
    match t.duration_since(SystemTime::UNIX_EPOCH) {
        Ok(d) => format!("{:.3} s after the epoch", d.as_secs_f64()),
        Err(_) => "an unknown time".into(),
    }
}

impl ClusterError {
    /// The error for an invalid record at `key`: the key and `detail` (raw text, which may
    /// quote the record's bytes) escaped once with [`gdpath::topo::text::escape`] and cut to
    /// [`MAX_SHOWN_CHARS`] characters, so that every front end shows the same
    /// bounded, terminal-safe text.
    pub fn invalid_record(key: &[u8], detail: &str) -> ClusterError {
        ClusterError::InvalidRecord {
            key: shown(&String::from_utf8_lossy(key), MAX_SHOWN_CHARS),
            detail: shown(detail, MAX_SHOWN_CHARS),
        }
    }

    /// The machine-readable kind (`peer_gone`, `name_taken`, ...); an engine error gives its own
    /// [`gdpath::Error::kind`].
    pub fn kind(&self) -> &'static str {
        match self {
            ClusterError::Url(_) => "cluster_url",
            ClusterError::Config(_) => "config",
            ClusterError::InvalidName(_) => "usage",
            ClusterError::Unreachable { .. } => "cluster_unreachable",
            ClusterError::Denied(_) => "cluster_denied",
            ClusterError::Etcd(_) => "cluster",
            ClusterError::NameTaken { .. } => "name_taken",
            ClusterError::NotFound { .. } => "not_found",
            ClusterError::InvalidRecord { .. } => "invalid_record",
            ClusterError::PeerGone { .. } => "peer_gone",
            ClusterError::IncarnationMismatch { .. } => "incarnation_mismatch",
            ClusterError::Engine(e) => e.kind(),
        }
    }

    /// etcd's error as this layer's: refusals of credentials or permission apart.
    pub(crate) fn from_etcd(endpoints: &str, e: etcd_client::Error) -> ClusterError {
        use gdpath::topo::text::escape;
        let text = e.to_string();
        if refused_certificate(&text) {
            return ClusterError::Denied(escape(&text).to_string());
        }
        match e {
            // etcd 3.4 answers a request without credentials on an auth-enabled server with
            // InvalidArgument "user name is empty".
            etcd_client::Error::GRpcStatus(s)
                if matches!(
                    s.code(),
                    tonic::Code::Unauthenticated | tonic::Code::PermissionDenied
                ) || s.message().contains("user name is empty") =>
            {
                ClusterError::Denied(escape(s.message()).to_string())
            }
            etcd_client::Error::GRpcStatus(s) if s.code() == tonic::Code::Unavailable => {
                ClusterError::Unreachable {
                    endpoints: endpoints.into(),
                    detail: escape(s.message()).to_string(),
                }
            }
            etcd_client::Error::TransportError(_) | etcd_client::Error::IoError(_) => {
                ClusterError::Unreachable {
                    endpoints: endpoints.into(),
                    detail: escape(&text).to_string(),
                }
            }
            _ => ClusterError::Etcd(escape(&text).to_string()),
        }
    }
}

/// Whether etcd's TLS layer refused this client's certificate (or its lack of one): an alert
/// from the server about the certificate, as rustls words it (`received fatal alert:
/// BadCertificate` from etcd run with `--client-cert-auth` and no client certificate).
fn refused_certificate(text: &str) -> bool {
    const ALERTS: [&str; 7] = [
        "BadCertificate",
        "CertificateRequired",
        "CertificateUnknown",
        "CertificateExpired",
        "CertificateRevoked",
        "UnknownCA",
        "AccessDenied",
    ];
    text.split("received fatal alert: ")
        .skip(1)
        .any(|rest| ALERTS.iter().any(|a| rest.starts_with(a)))
}

#[cfg(test)]
mod tests {
    #[test]
    fn a_server_alert_about_the_certificate_is_a_refusal_and_other_failures_are_not() {
        let refused = r#"grpc request error: code: 'Unknown error', message: "transport error", source: tonic::transport::Error(Transport, hyper::Error(Io, Custom { kind: InvalidData, error: "received fatal alert: BadCertificate" }))"#;
        assert!(super::refused_certificate(refused));
        assert!(super::refused_certificate(
            "received fatal alert: CertificateRequired"
        ));
        // The client not trusting the server is not the server refusing the client.
        assert!(!super::refused_certificate(
            "invalid peer certificate: UnknownIssuer"
        ));
        assert!(!super::refused_certificate(
            "received fatal alert: HandshakeFailure"
        ));
    }
}
