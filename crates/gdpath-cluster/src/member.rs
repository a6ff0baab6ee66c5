//! Publishing this agent: the name claimed by a transaction, the record kept on a lease, and
//! re-published after etcd comes back or the lease was lost.

use crate::client::Cluster;
use crate::error::ClusterError;
use crate::record::{AgentRecord, TTL_RANGE_S};
use etcd_client::{Client, Compare, CompareOp, GetOptions, PutOptions, Txn, TxnOp, TxnOpResponse};
use std::collections::VecDeque;
use std::sync::{Arc, Mutex, PoisonError};
use std::time::{Duration, Instant};

/// How long [`Membership::publish_verdicts`] waits for the doctor by default: on a machine
/// without GPUs it answers in milliseconds; reading a large machine's driver facts takes seconds.
pub const VERDICTS_BOUND: Duration = Duration::from_secs(30);

/// Most events kept for [`Membership::take_events`] (the oldest go first).
const MAX_EVENTS: usize = 256;

/// What happened to this agent's publication, for the log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum MemberEvent {
    /// etcd stopped answering keep-alives or the lease expired: the record may be gone.
    Lost {
        /// etcd's error, or that the lease expired.
        detail: String,
    },
    /// The record is published again, on a new lease.
    Republished {
        /// The new etcd lease id.
        lease: i64,
    },
    /// The record at this agent's key is no longer on its lease while the lease lives: someone
    /// deleted it or wrote over it (`etcdctl put` of another record). The name is claimed
    /// again by the rules of [`Membership::join`]: at once when the key is gone or on no
    /// lease, else [`MemberEvent::NameTaken`] and retried until the other lease ends.
    Replaced {
        /// What etcd showed at the key.
        detail: String,
    },
    /// Re-publishing found the name held by another incarnation (retried until it goes).
    NameTaken {
        /// The holder's incarnation id.
        incarnation: String,
        /// The holder's host name.
        hostname: String,
    },
    /// The record was updated in place (same lease, same incarnation): watchers see
    /// [`crate::ClusterEvent::Updated`].
    Updated {
        /// What changed (`doctor verdicts p2p unavailable, ...`).
        detail: String,
    },
    /// An update was not made (the doctor failed or outlasted its bound; etcd refused): the
    /// record stays as it was.
    NotUpdated {
        /// Why.
        detail: String,
    },
}

/// This agent's membership: its record, published on a lease a background task keeps alive.
/// Dropping it (or [`Membership::leave`]) deletes the record at once (a revoked lease).
pub struct Membership {
    cluster: Cluster,
    shared: Arc<Shared>,
    task: Option<tokio::task::JoinHandle<()>>,
}

struct Shared {
    lease: Mutex<Option<i64>>,
    events: Mutex<VecDeque<MemberEvent>>,
    /// The record as published now: updates change it, and a re-claim after a lost lease
    /// writes it.
    record: Mutex<AgentRecord>,
    /// The record's key.
    key: String,
}

impl Shared {
    fn push(&self, e: MemberEvent) {
        match &e {
            MemberEvent::Lost { detail } => tracing::warn!("cluster: record may be gone: {detail}"),
            MemberEvent::Republished { lease } => {
                tracing::warn!("cluster: record published again (lease {lease:x})")
            }
            MemberEvent::NameTaken { incarnation, .. } => {
                tracing::warn!("cluster: name now held by incarnation {incarnation}")
            }
            MemberEvent::Replaced { detail } => {
                tracing::warn!("cluster: record replaced by someone else: {detail}")
            }
            MemberEvent::Updated { detail } => tracing::info!("cluster: record updated: {detail}"),
            MemberEvent::NotUpdated { detail } => {
                tracing::warn!("cluster: record not updated: {detail}")
            }
        }
        let mut q = self.events.lock().unwrap_or_else(PoisonError::into_inner);
        if q.len() == MAX_EVENTS {
            q.pop_front();
        }
        q.push_back(e);
    }
}

impl Membership {
    /// Claims `record.name` and publishes `record` on a lease of `ttl` (within
    /// [`TTL_RANGE_S`]), kept alive every third of it from the cluster's thread.
    ///
    /// The claim is a transaction: the record is written only if no key of that name exists,
    /// or if the one there is on no lease (no live agent's: every agent writes its record on
    /// its lease, so it was written by hand), this incarnation's, or a dead process's of this
    /// node (a restart on the same node takes its name back at once). A record on another
    /// live lease is never written over. While published, the key is checked every third of
    /// the TTL: a record deleted or written over is told ([`MemberEvent::Replaced`]) and
    /// claimed again. Errors: [`ClusterError::NameTaken`] naming the holder;
    /// [`ClusterError::InvalidRecord`] for an invalid record on a live lease (saying how to
    /// clear it); [`ClusterError::Config`] for a TTL out of range; etcd's errors.
    pub fn join(
        cluster: &Cluster,
        mut record: AgentRecord,
        ttl: Duration,
    ) -> Result<Membership, ClusterError> {
        if !TTL_RANGE_S.contains(&ttl.as_secs()) {
            return Err(ClusterError::Config(format!(
                "lease TTL {ttl:?}: must be {}..={} s",
                TTL_RANGE_S.start(),
                TTL_RANGE_S.end()
            )));
        }
        record.lease_ttl_s = ttl.as_secs();
        let key = cluster.url.agent_key(&record.name);
        let json = record.to_json();
        let timeout = cluster.timeout;
        let lease = cluster.rt.block_on(async {
            tokio::time::timeout(
                timeout,
                claim(cluster.client.clone(), &key, &json, &record, ttl),
            )
            .await
        });
        let lease = lease.map_err(|_| ClusterError::Unreachable {
            endpoints: cluster.url.endpoints.join(","),
            detail: format!("no answer within {timeout:?}"),
        })??;
        let shared = Arc::new(Shared {
            lease: Mutex::new(Some(lease)),
            events: Mutex::new(VecDeque::new()),
            record: Mutex::new(record),
            key,
        });
        let task = cluster.rt.spawn(keep_task(
            cluster.client.clone(),
            ttl,
            lease,
            shared.clone(),
        ));
        Ok(Membership {
            cluster: cluster.clone(),
            shared,
            task: Some(task),
        })
    }

    /// The record as published now (after any [`Membership::update`]).
    pub fn record(&self) -> AgentRecord {
        self.shared
            .record
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .clone()
    }

    /// Changes the published record with `change` and writes it on the same lease, the name,
    /// incarnation, node and lease TTL kept: watchers see [`crate::ClusterEvent::Updated`].
    /// Returns false when the lease is being renewed now (the re-claim then writes the changed
    /// record). Errors: [`ClusterError::InvalidRecord`] for a change that breaks the rules of a
    /// record (nothing is written), etcd's errors.
    pub fn update(&self, change: impl FnOnce(&mut AgentRecord)) -> Result<bool, ClusterError> {
        update(&self.cluster, &self.shared, change)
    }

    /// Runs `doctor` on a thread of its own and, when it returns within `bound`, publishes its
    /// verdicts per data path (`p2p` → `unavailable`, ...) in the record's topology by an
    /// [`Membership::update`], told as [`MemberEvent::Updated`]. A doctor that fails, panics
    /// or outlasts `bound` leaves the verdicts empty, told as [`MemberEvent::NotUpdated`] (and
    /// logged); one that outlasts it runs on, its answer unused. Returns at once. Errors: the
    /// threads could not be started ([`ClusterError::Config`]).
    pub fn publish_verdicts<F>(&self, bound: Duration, doctor: F) -> Result<(), ClusterError>
    where
        F: FnOnce() -> Result<std::collections::BTreeMap<String, String>, String> + Send + 'static,
    {
        let (tx, rx) = std::sync::mpsc::channel();
        let spawn_error = |e: std::io::Error| {
            ClusterError::Config(format!("cannot start the doctor's thread: {e}"))
        };
        std::thread::Builder::new()
            .name("gdpath-doctor".into())
            .spawn(move || {
                let _ = tx.send(doctor());
            })
            .map_err(spawn_error)?;
        let (cluster, shared) = (self.cluster.clone(), self.shared.clone());
        std::thread::Builder::new()
            .name("gdpath-verdicts".into())
            .spawn(move || {
                let verdicts = match rx.recv_timeout(bound) {
                    Ok(Ok(v)) => v,
                    Ok(Err(why)) => {
                        shared.push(MemberEvent::NotUpdated {
                            detail: format!("the doctor failed: {why}"),
                        });
                        return;
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Timeout) => {
                        shared.push(MemberEvent::NotUpdated {
                            detail: format!("the doctor gave no verdict within {bound:?}"),
                        });
                        return;
                    }
                    Err(std::sync::mpsc::RecvTimeoutError::Disconnected) => {
                        shared.push(MemberEvent::NotUpdated {
                            detail: "the doctor's thread ended without a verdict".into(),
                        });
                        return;
                    }
                };
                let verdicts: std::collections::BTreeMap<String, String> = verdicts
                    .into_iter()
                    .filter(|(k, v)| crate::record::verdict_fits(k, v))
                    .take(crate::record::MAX_VERDICTS)
                    .collect();
                let detail = verdicts
                    .iter()
                    .map(|(k, v)| format!("{k} {v}"))
                    .collect::<Vec<_>>()
                    .join(", ");
                let done = update(&cluster, &shared, |r| r.topology.verdicts = verdicts);
                shared.push(match done {
                    Ok(_) => MemberEvent::Updated {
                        detail: format!("doctor verdicts {detail}"),
                    },
                    Err(e) => MemberEvent::NotUpdated {
                        detail: format!("doctor verdicts {detail}: {e}"),
                    },
                });
            })
            .map_err(spawn_error)?;
        Ok(())
    }

    /// The lease the record is on now (`None` while it is being re-published).
    pub fn lease(&self) -> Option<i64> {
        *self
            .shared
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
    }

    /// Events since the last call, oldest first.
    pub fn take_events(&self) -> Vec<MemberEvent> {
        let mut q = self
            .shared
            .events
            .lock()
            .unwrap_or_else(PoisonError::into_inner);
        q.drain(..).collect()
    }

    /// Leaves the cluster: keep-alives stop and the lease is revoked, which deletes the record
    /// (watchers see [`crate::ClusterEvent::Left`] at once). Errors: etcd's, when it could not
    /// be told (the record then goes when its lease expires).
    pub fn leave(mut self) -> Result<(), ClusterError> {
        self.revoke()
    }

    /// Stops keeping the lease alive without deleting the record, as a crash would: the record
    /// goes when its lease expires. For tests and measurements of failure detection.
    pub fn abandon(mut self) {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        *self
            .shared
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner) = None;
    }

    fn revoke(&mut self) -> Result<(), ClusterError> {
        if let Some(t) = self.task.take() {
            t.abort();
        }
        let lease = self
            .shared
            .lease
            .lock()
            .unwrap_or_else(PoisonError::into_inner)
            .take();
        match lease {
            Some(id) => {
                let mut c = self.cluster.client.clone();
                self.cluster.call(c.lease_revoke(id)).map(|_| ())
            }
            None => Ok(()),
        }
    }
}

impl Drop for Membership {
    fn drop(&mut self) {
        let _ = self.revoke();
    }
}

/// [`Membership::update`], from a handle or the doctor's thread.
fn update(
    cluster: &Cluster,
    shared: &Shared,
    change: impl FnOnce(&mut AgentRecord),
) -> Result<bool, ClusterError> {
    let mut held = shared.record.lock().unwrap_or_else(PoisonError::into_inner);
    let mut next = held.clone();
    change(&mut next);
    // What names this start of the agent is not the change's to make.
    next.name.clone_from(&held.name);
    next.incarnation = held.incarnation.clone();
    next.node = held.node.clone();
    next.lease_ttl_s = held.lease_ttl_s;
    let json = next.to_json();
    AgentRecord::from_etcd(shared.key.as_bytes(), &json)?;
    *held = next;
    // Not held across the etcd call: the keep-alive task on the client's one thread takes it.
    drop(held);
    let lease = *shared.lease.lock().unwrap_or_else(PoisonError::into_inner);
    let Some(lease) = lease else {
        return Ok(false);
    };
    let key = shared.key.clone();
    // Only onto this agent's own key on its lease: a record gone (left, expired, replaced)
    // is not written back.
    let txn = Txn::new()
        .when([Compare::lease(key.clone(), CompareOp::Equal, lease)])
        .and_then([TxnOp::put(
            key,
            json,
            Some(PutOptions::new().with_lease(lease)),
        )]);
    let mut c = cluster.client.clone();
    Ok(cluster.call(c.txn(txn))?.succeeded())
}

/// Grants a lease and writes the record on it if the name is free, ours, or a dead process's
/// of this node. Returns the lease.
async fn claim(
    mut c: Client,
    key: &str,
    json: &[u8],
    record: &AgentRecord,
    ttl: Duration,
) -> Result<i64, ClusterError> {
    let etcd = |e| ClusterError::from_etcd("etcd", e);
    let ttl_s = i64::try_from(ttl.as_secs()).unwrap_or(i64::MAX);
    let lease = c.lease_grant(ttl_s, None).await.map_err(etcd)?.id();
    let put = || {
        TxnOp::put(
            key,
            json.to_vec(),
            Some(PutOptions::new().with_lease(lease)),
        )
    };
    let txn = Txn::new()
        .when([Compare::create_revision(key, CompareOp::Equal, 0)])
        .and_then([put()])
        .or_else([TxnOp::get(key, None)]);
    let resp = c.txn(txn).await.map_err(etcd)?;
    if resp.succeeded() {
        return Ok(lease);
    }
    let held = resp.op_responses().into_iter().find_map(|r| match r {
        TxnOpResponse::Get(g) => g.kvs().first().cloned(),
        _ => None,
    });
    // Deleted between the two steps: the next attempt creates it.
    let Some(kv) = held else {
        let _ = c.lease_revoke(lease).await;
        return Err(ClusterError::Etcd(
            "the name changed hands during the claim; retry".into(),
        ));
    };
    let holder = AgentRecord::from_etcd(kv.key(), kv.value());
    // A key on no lease is no live agent's (each writes its record on its lease): a record
    // put by hand, valid or not, does not keep the name.
    let free = kv.lease() == 0
        || match &holder {
            Ok(h) => h.incarnation == record.incarnation || h.node.is_dead_here(),
            Err(_) => false,
        };
    if free {
        let txn = Txn::new()
            .when([Compare::mod_revision(
                key,
                CompareOp::Equal,
                kv.mod_revision(),
            )])
            .and_then([put()]);
        if c.txn(txn).await.map_err(etcd)?.succeeded() {
            if kv.lease() != 0 && kv.lease() != lease {
                // The old lease holds nothing now; revoking it saves etcd a timer.
                let _ = c.lease_revoke(kv.lease()).await;
            }
            return Ok(lease);
        }
    }
    let _ = c.lease_revoke(lease).await;
    match holder {
        Ok(h) => Err(ClusterError::NameTaken {
            name: record.name.clone(),
            incarnation: h.incarnation.to_string(),
            hostname: gdpath::topo::text::escape(&h.node.hostname).to_string(),
        }),
        Err(ClusterError::InvalidRecord { key, detail }) => Err(ClusterError::InvalidRecord {
            detail: format!(
                "{detail}; it is on live lease {:x}, which keeps the name until it ends \
                 (if no agent of yours wrote it, clear it with `etcdctl del {key}`)",
                kv.lease()
            ),
            key,
        }),
        Err(e) => Err(e),
    }
}

/// Keeps `lease` alive every third of `ttl`; when it is lost (expired, or etcd silent for a
/// whole TTL), re-claims the name on a new lease, retrying every second until it succeeds.
async fn keep_task(client: Client, ttl: Duration, mut lease: i64, shared: Arc<Shared>) {
    loop {
        let lost = keep_alive(client.clone(), &shared.key, lease, ttl).await;
        *shared.lease.lock().unwrap_or_else(PoisonError::into_inner) = None;
        match lost {
            Lost::Lease(detail) => shared.push(MemberEvent::Lost { detail }),
            Lost::Key(detail) => {
                shared.push(MemberEvent::Replaced { detail });
                // The lease holds nothing of ours now; the claim grants a new one.
                let _ = tokio::time::timeout(ttl, client.clone().lease_revoke(lease)).await;
            }
        }
        let mut told_taken = false;
        loop {
            tokio::time::sleep(Duration::from_secs(1)).await;
            let record = shared
                .record
                .lock()
                .unwrap_or_else(PoisonError::into_inner)
                .clone();
            let json = record.to_json();
            let attempt =
                tokio::time::timeout(ttl, claim(client.clone(), &shared.key, &json, &record, ttl))
                    .await;
            match attempt {
                Ok(Ok(id)) => {
                    // From here on an update writes onto the new lease itself. One made while
                    // the claim was on its way is written here; the record is read again after
                    // each put, so that a put of an older record racing an update's own write
                    // is followed by the newer one.
                    *shared.lease.lock().unwrap_or_else(PoisonError::into_inner) = Some(id);
                    let mut written = record;
                    for _ in 0..8 {
                        let now = shared
                            .record
                            .lock()
                            .unwrap_or_else(PoisonError::into_inner)
                            .clone();
                        if now == written {
                            break;
                        }
                        let opts = PutOptions::new().with_lease(id);
                        let mut c = client.clone();
                        let put = c.put(shared.key.clone(), now.to_json(), Some(opts));
                        let _ = tokio::time::timeout(ttl, put).await;
                        written = now;
                    }
                    lease = id;
                    shared.push(MemberEvent::Republished { lease: id });
                    break;
                }
                Ok(Err(ClusterError::NameTaken {
                    incarnation,
                    hostname,
                    ..
                })) if !told_taken => {
                    told_taken = true;
                    shared.push(MemberEvent::NameTaken {
                        incarnation,
                        hostname,
                    });
                }
                _ => {}
            }
        }
    }
}

/// Why [`keep_alive`] stopped.
enum Lost {
    /// The lease expired or etcd went unanswered for a whole TTL.
    Lease(String),
    /// The lease lives but the key is no longer on it (deleted, or written over).
    Key(String),
}

/// Sends keep-alives for `lease` until it is lost, and after each answer checks that `key`
/// is still on it; returns why it stopped.
async fn keep_alive(mut client: Client, key: &str, lease: i64, ttl: Duration) -> Lost {
    let period = ttl / 3;
    let mut last_ok = Instant::now();
    loop {
        if last_ok.elapsed() >= ttl {
            return Lost::Lease(format!(
                "etcd unanswered for the lease's whole TTL ({ttl:?})"
            ));
        }
        let (mut keeper, mut stream) =
            match tokio::time::timeout(period, client.lease_keep_alive(lease)).await {
                Ok(Ok(s)) => s,
                _ => {
                    tokio::time::sleep(Duration::from_millis(500)).await;
                    continue;
                }
            };
        loop {
            if last_ok.elapsed() >= ttl {
                break;
            }
            if keeper.keep_alive().await.is_err() {
                break;
            }
            // The next keep-alive is due one period after this ack, whatever the check of the
            // key below costs, so that a slow etcd cannot stretch the gap to the whole TTL.
            let next =
                tokio::time::Instant::now() + period.saturating_sub(Duration::from_millis(10));
            match tokio::time::timeout(period, stream.message()).await {
                Ok(Ok(Some(r))) if r.ttl() > 0 => last_ok = Instant::now(),
                Ok(Ok(Some(_))) => {
                    return Lost::Lease("the lease expired (etcd answered TTL 0)".into())
                }
                Ok(Ok(None)) | Ok(Err(_)) => break,
                Err(_) => continue,
            }
            let opts = GetOptions::new().with_keys_only();
            let check = next.saturating_duration_since(tokio::time::Instant::now());
            if let Ok(Ok(resp)) = tokio::time::timeout(check, client.get(key, Some(opts))).await {
                match resp.kvs().first() {
                    None => {
                        return Lost::Key("the record was deleted while its lease lives".into())
                    }
                    Some(kv) if kv.lease() != lease => {
                        return Lost::Key(format!(
                            "the record was written over (now on lease {:x}, not {lease:x})",
                            kv.lease()
                        ))
                    }
                    Some(_) => {}
                }
            }
            tokio::time::sleep_until(next).await;
        }
        tokio::time::sleep(Duration::from_millis(500)).await;
    }
}
