//! A peer found by name: connected with its incarnation proven in the handshake, and watched,
//! so that transfers to it end with [`ClusterError::PeerGone`] when its record goes.

use crate::client::{Cluster, ClusterEvent, Watch};
use crate::error::ClusterError;
use crate::record::AgentRecord;
use gdpath::net::{ConnectOptions, Peer, Token};
use gdpath::{Agent, Transfer, TransferReport, TransferRequest};
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant, SystemTime};

/// Why and since when a peer is gone.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Gone {
    /// When this side learnt it.
    pub since: SystemTime,
    /// What etcd said: the record deleted (lease expired or a clean stop) or replaced by
    /// another incarnation.
    pub reason: String,
}

/// A connection to an agent found by name in the cluster.
pub struct ClusterPeer {
    peer: Peer,
    record: AgentRecord,
    gone: Arc<Mutex<Option<Gone>>>,
    _watch: Arc<WatchThread>,
    ttl_hint: Duration,
}

struct WatchThread {
    stop: Arc<std::sync::atomic::AtomicBool>,
    thread: Option<std::thread::JoinHandle<()>>,
}

impl Drop for WatchThread {
    fn drop(&mut self) {
        self.stop.store(true, std::sync::atomic::Ordering::Relaxed);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// How long a transfer that failed on the network waits for etcd to say the peer is gone, so
/// that a crash reads as [`ClusterError::PeerGone`] rather than a transport error: the TTL its
/// record states (plus etcd's half-second expiry scan), else the default TTL.
fn gone_grace(record: &AgentRecord) -> Duration {
    let ttl = if crate::record::TTL_RANGE_S.contains(&record.lease_ttl_s) {
        Duration::from_secs(record.lease_ttl_s)
    } else {
        crate::record::DEFAULT_TTL
    };
    ttl + Duration::from_secs(1)
}

impl ClusterPeer {
    /// Resolves `name` (waiting up to `wait` for its record), connects to its address with
    /// `token` and checks that the agent answering is that record's incarnation (its engine
    /// name, `NAME#INCARNATION`, comes in the authenticated handshake); then watches its
    /// record. Errors: [`ClusterError::NotFound`], [`ClusterError::IncarnationMismatch`] (a
    /// stale record: the connection is closed, its metadata unused), [`ClusterError::PeerGone`]
    /// when the record went while connecting, the engine's errors of `connect_with`.
    pub fn connect(
        cluster: &Cluster,
        agent: &Agent,
        name: &str,
        token: Token,
        wait: Duration,
    ) -> Result<ClusterPeer, ClusterError> {
        let (record, _rev) = cluster.resolve(name, wait)?;
        // Watch first: a change between the resolution and the check below is not missed.
        let watch = cluster.watch_key(cluster.url.agent_key(name))?;
        let addr = record.socket_addr()?;
        let opts = ConnectOptions {
            token,
            timeout: cluster.timeout.max(Duration::from_secs(1)),
        };
        let peer = agent.connect_with(addr, &opts)?;
        let expected = format!("{}@", record.engine_name());
        let found = peer.name();
        if !found.starts_with(&expected) {
            let _ = peer.close(Duration::from_millis(200));
            return Err(ClusterError::IncarnationMismatch {
                name: record.name.clone(),
                addr: addr.to_string(),
                expected: record.incarnation.to_string(),
                found: gdpath::topo::text::escape(&found).to_string(),
            });
        }
        let gone = Arc::new(Mutex::new(None));
        let watch = spawn_watch(watch, record.clone(), gone.clone())
            .map_err(|e| ClusterError::Etcd(format!("cannot start the peer's watch: {e}")))?;
        let p = ClusterPeer {
            ttl_hint: gone_grace(&record),
            peer,
            record,
            gone,
            _watch: Arc::new(watch),
        };
        p.check()?;
        Ok(p)
    }

    /// The engine's connection (register its regions with [`Peer::memory`]).
    pub fn peer(&self) -> &Peer {
        &self.peer
    }

    /// The record it was found by.
    pub fn record(&self) -> &AgentRecord {
        &self.record
    }

    /// Why the peer is gone, once its record went.
    pub fn gone(&self) -> Option<Gone> {
        self.gone
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// `Ok` while the peer's record is the one connected to; else [`ClusterError::PeerGone`].
    pub fn check(&self) -> Result<(), ClusterError> {
        match self.gone() {
            None => Ok(()),
            Some(g) => Err(self.gone_error(g)),
        }
    }

    fn gone_error(&self, g: Gone) -> ClusterError {
        ClusterError::PeerGone {
            name: self.record.name.clone(),
            incarnation: self.record.incarnation.to_string(),
            since: g.since,
            reason: g.reason,
        }
    }

    /// After a network failure: waits up to the peer's lease TTL (at most `max`) for etcd to
    /// say the peer is gone, so that a crash reads as gone; `None` when it did not.
    pub fn confirm_gone(&self, max: Duration) -> Option<Gone> {
        let until = Instant::now() + self.ttl_hint.min(max);
        loop {
            if let Some(g) = self.gone() {
                return Some(g);
            }
            if Instant::now() >= until {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    /// Posts `req` on `agent` unless the peer is gone ([`ClusterError::PeerGone`] at once).
    pub fn post(&self, agent: &Agent, req: TransferRequest) -> Result<Transfer, ClusterError> {
        self.check()?;
        Ok(agent.post(req)?)
    }

    /// Waits for `t` up to `timeout`. When the peer's record goes meanwhile, the transfer is
    /// cancelled and the error is [`ClusterError::PeerGone`]; a transfer that failed on the
    /// network waits a lease TTL at most for etcd to confirm it, so a crashed peer reads as
    /// gone. Other failures are the engine's ([`ClusterError::Engine`]).
    pub fn wait(&self, t: Transfer, timeout: Duration) -> Result<TransferReport, ClusterError> {
        let end = Instant::now() + timeout;
        loop {
            if let Some(g) = self.gone() {
                t.cancel();
                return Err(self.gone_error(g));
            }
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                t.cancel();
                return Err(ClusterError::Engine(gdpath::Error::DeadlineExceeded));
            }
            match t.wait_shared_for(left.min(Duration::from_millis(20))) {
                Ok(Some(r)) => return Ok(r),
                Ok(None) => {}
                Err(e) => {
                    if matches!(e.error, gdpath::Error::PeerFailed { .. }) {
                        if let Some(g) = self.confirm_gone(left) {
                            return Err(self.gone_error(g));
                        }
                    }
                    return Err(ClusterError::Engine(e.error));
                }
            }
        }
    }
}

/// How long after a leave the peer's watch looks for the join that says the record was
/// replaced rather than deleted (both are sent at once by the watch).
const REPLACED_WITHIN: Duration = Duration::from_millis(100);

/// Marks `gone` when the watched record is deleted or replaced by another incarnation.
fn spawn_watch(
    watch: Watch,
    record: AgentRecord,
    gone: Arc<Mutex<Option<Gone>>>,
) -> std::io::Result<WatchThread> {
    let stop = Arc::new(std::sync::atomic::AtomicBool::new(false));
    let s = stop.clone();
    let thread = std::thread::Builder::new()
        .name("gdpath-peer-watch".into())
        .spawn(move || {
            while !s.load(std::sync::atomic::Ordering::Relaxed) {
                let reason = match watch.next(Duration::from_millis(100)) {
                    // A record of another incarnation written over this one comes as a leave
                    // and a join, sent together: the join, when it follows, says by whom.
                    Some(ClusterEvent::Left { .. }) => match watch.next(REPLACED_WITHIN) {
                        Some(ClusterEvent::Joined(r)) => {
                            format!("replaced by incarnation {}", r.incarnation)
                        }
                        _ => {
                            "its record was deleted (lease expired or the agent stopped)".to_owned()
                        }
                    },
                    Some(ClusterEvent::Joined(r) | ClusterEvent::Updated(r))
                        if r.incarnation != record.incarnation =>
                    {
                        format!("replaced by incarnation {}", r.incarnation)
                    }
                    _ => continue,
                };
                *gone.lock().unwrap_or_else(PoisonError::into_inner) = Some(Gone {
                    since: SystemTime::now(),
                    reason,
                });
                return;
            }
        })?;
    Ok(WatchThread {
        stop,
        thread: Some(thread),
    })
}
