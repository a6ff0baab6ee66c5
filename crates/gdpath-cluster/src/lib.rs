//! Membership of gdpath agents in etcd (docs/cluster.md).
//!
//! An agent publishes an [`AgentRecord`] at `/<namespace>/agents/<name>` on a lease it keeps
//! alive ([`Membership`]); the name is claimed by a transaction, so two live agents never hold
//! one. Others list the records, resolve a name with a deadline, watch joins, updates and
//! leaves ([`Cluster`]), and connect by name ([`ClusterPeer`]): the incarnation the record
//! names is proven in the authenticated handshake, and a peer whose record goes (its lease
//! expired: a crash or a partition; or it left) fails its transfers with
//! [`ClusterError::PeerGone`]. No secret is written to etcd: the token stays out of band.
//!
//! The crate sits above the engine (`gdpath`) and below the CLI and the Python module; etcd's
//! gRPC client (tokio, tonic) stays out of the engine's build.

#![forbid(unsafe_code)]

mod client;
mod error;
mod member;
mod peer;
pub mod record;
mod url;

pub use client::{Cluster, ClusterEvent, Listed, Watch, DEFAULT_REQUEST_TIMEOUT, MAX_LISTED};
pub use error::{shown, ClusterError, MAX_SHOWN_CHARS};
pub use member::{MemberEvent, Membership, VERDICTS_BOUND};
pub use peer::{ClusterPeer, Gone};
pub use record::{AgentRecord, Incarnation, NodeInfo, RegionKind, RegionRecord, TopologySummary};
pub use url::ClusterUrl;
