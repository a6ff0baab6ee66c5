//! A connection to the cluster's etcd: listing, resolving by name, watching.
//!
//! The engine works with threads, not async: a [`Cluster`] owns a small tokio runtime (one
//! worker thread) for etcd's gRPC client and offers blocking calls, each bounded in time.

use crate::error::ClusterError;
use crate::record::{check_name, AgentRecord};
use crate::url::ClusterUrl;
use etcd_client::{Client, ConnectOptions, EventType, GetOptions, WatchOptions};
use std::sync::Arc;
use std::time::{Duration, Instant, SystemTime};

/// Bound on one etcd request (connect, get, txn, grant), unless told otherwise.
pub const DEFAULT_REQUEST_TIMEOUT: Duration = Duration::from_secs(5);
/// Interval of the HTTP/2 pings on the etcd connection while a watch or keep-alive stream is
/// open: above etcd's default `--grpc-keepalive-min-time` of 5 s, which a client pinging more
/// often breaks (etcd then ends the connection with `too_many_pings`).
const KEEPALIVE_INTERVAL: Duration = Duration::from_secs(6);
/// How long a ping may go unanswered before the connection is taken for dead.
const KEEPALIVE_TIMEOUT: Duration = Duration::from_secs(3);
/// Most records one listing reads.
pub const MAX_LISTED: i64 = 100_000;

/// A handle on the cluster's etcd. Cheap to clone.
#[derive(Clone)]
pub struct Cluster {
    pub(crate) rt: Arc<tokio::runtime::Runtime>,
    pub(crate) client: Client,
    pub(crate) url: ClusterUrl,
    pub(crate) timeout: Duration,
}

impl std::fmt::Debug for Cluster {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Cluster").field("url", &self.url).finish()
    }
}

/// A record as listed, with what etcd says of its lease.
#[derive(Debug, Clone)]
pub struct Listed {
    /// The key (as read; escape it to show it).
    pub key: String,
    /// The record, or why it is invalid (escaped, at most
    /// [`crate::error::MAX_SHOWN_CHARS`] characters and `…`).
    pub record: Result<AgentRecord, String>,
    /// Seconds left on its lease (`None`: no lease, or it could not be read).
    pub ttl_left: Option<i64>,
}

/// A change seen by a watch.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum ClusterEvent {
    /// A record appeared (a start, or a return after its lease was lost), or replaced one of
    /// another incarnation (then right after that one's [`ClusterEvent::Left`]).
    Joined(AgentRecord),
    /// A record changed, same incarnation (regions, verdicts, a new lease after etcd came
    /// back).
    Updated(AgentRecord),
    /// A record went: its lease expired (a crash, a partition), it was deleted (a clean
    /// stop), or a record of another incarnation was written over it (a [`ClusterEvent::Joined`]
    /// follows). `incarnation` is the one that left; `at` when this watcher learnt it.
    Left {
        /// The agent's name.
        name: String,
        /// The incarnation that left, where the watcher had seen its record.
        incarnation: Option<String>,
        /// When this watcher learnt it.
        at: SystemTime,
    },
    /// A record that breaks the rules was written (key escaped, reason).
    Invalid {
        /// The etcd key, escaped for a terminal.
        key: String,
        /// Which rule it breaks.
        detail: String,
    },
    /// The watch lost etcd and resumed (no event was lost: it resumes from the last revision
    /// it saw) or could not (`detail`).
    Reconnected {
        /// What happened: resumed from a revision, or why it could not.
        detail: String,
    },
}

impl Cluster {
    /// Connects to the cluster at `url` (every endpoint; credentials and TLS as the URL says),
    /// waiting up to [`DEFAULT_REQUEST_TIMEOUT`]. Errors: [`ClusterError::Unreachable`],
    /// [`ClusterError::Denied`] (auth), [`ClusterError::Url`] (an unreadable CA or client
    /// certificate file).
    pub fn connect(url: &ClusterUrl) -> Result<Cluster, ClusterError> {
        Self::connect_with(url, DEFAULT_REQUEST_TIMEOUT)
    }

    /// As [`Cluster::connect`], with `timeout` bounding the connection and every later unary
    /// request (get, txn, lease grant); watches and lease keep-alives run unbounded, watched
    /// by HTTP/2 pings and the lease's TTL.
    pub fn connect_with(url: &ClusterUrl, timeout: Duration) -> Result<Cluster, ClusterError> {
        let rt = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .thread_name("gdpath-etcd")
            .enable_all()
            .build()
            .map_err(|e| ClusterError::Etcd(format!("cannot start the etcd client thread: {e}")))?;
        // No channel-wide request timeout: it would also end the long-lived streams (watches,
        // lease keep-alives); unary calls are bounded one by one (`Cluster::call`).
        let mut opts = ConnectOptions::new()
            .with_connect_timeout(timeout)
            // HTTP/2 pings find a dead etcd connection in seconds, not TCP's minutes; they go
            // no more often than etcd allows (`--grpc-keepalive-min-time`, 5 s by default) and
            // only while a stream is open, else etcd closes the connection for too many pings.
            .with_keep_alive(KEEPALIVE_INTERVAL, KEEPALIVE_TIMEOUT)
            .with_keep_alive_while_idle(false);
        if let Some(u) = &url.user {
            opts = opts.with_user(u.clone(), url.password.clone().unwrap_or_default());
        }
        if url.tls {
            opts = opts.with_tls(tls_options(url)?);
        }
        let endpoints = url.endpoint_urls();
        let shown = url.endpoints.join(",");
        let client = rt.block_on(async {
            tokio::time::timeout(timeout, Client::connect(endpoints, Some(opts)))
                .await
                .map_err(|_| ClusterError::Unreachable {
                    endpoints: shown.clone(),
                    detail: format!("no connection within {timeout:?}"),
                })?
                .map_err(|e| ClusterError::from_etcd(&shown, e))
        })?;
        if url.tls {
            probe_tls(&rt, &client, url, &shown, timeout)?;
        }
        Ok(Cluster {
            rt: Arc::new(rt),
            client,
            url: url.clone(),
            timeout,
        })
    }

    /// The URL this handle was made with.
    pub fn url(&self) -> &ClusterUrl {
        &self.url
    }

    /// Runs one etcd request, bounded by the handle's timeout.
    pub(crate) fn call<T, F>(&self, f: F) -> Result<T, ClusterError>
    where
        F: std::future::Future<Output = Result<T, etcd_client::Error>>,
    {
        let timeout = self.timeout;
        let shown = self.url.endpoints.join(",");
        self.rt.block_on(async {
            match tokio::time::timeout(timeout, f).await {
                Ok(r) => r.map_err(|e| ClusterError::from_etcd(&shown, e)),
                Err(_) => Err(ClusterError::Unreachable {
                    endpoints: shown,
                    detail: format!("no answer within {timeout:?}"),
                }),
            }
        })
    }

    /// Every agent record of the namespace (at most [`MAX_LISTED`]), sorted by name, with the
    /// seconds left on each lease. Invalid records are listed with the reason, not dropped.
    pub fn list(&self) -> Result<Vec<Listed>, ClusterError> {
        let (raws, _) = self.get_paged(&self.url.agents_prefix())?;
        // One lookup per distinct lease: records written on one lease (by one agent, or by
        // someone writing many keys) cost one round trip, not one each.
        let mut ttls: std::collections::HashMap<i64, Option<i64>> = Default::default();
        let mut out = Vec::with_capacity(raws.len());
        for raw in raws {
            let ttl_left = if raw.lease != 0 {
                *ttls.entry(raw.lease).or_insert_with(|| {
                    let mut c = self.client.clone();
                    self.call(c.lease_time_to_live(raw.lease, None))
                        .ok()
                        .map(|r| r.ttl())
                })
            } else {
                None
            };
            out.push(Listed {
                key: String::from_utf8_lossy(&raw.key).into_owned(),
                record: raw.record().map_err(|e| match e {
                    // The key is beside it: the reason alone.
                    ClusterError::InvalidRecord { detail, .. } => detail,
                    other => other.to_string(),
                }),
                ttl_left,
            });
        }
        Ok(out)
    }

    /// The record of agent `name` with its etcd mod revision, waiting up to `wait` for it to
    /// appear (a watch, not polling). Errors: [`ClusterError::NotFound`] after `wait`,
    /// [`ClusterError::InvalidRecord`], [`ClusterError::InvalidName`], etcd's errors.
    pub fn resolve(&self, name: &str, wait: Duration) -> Result<(AgentRecord, i64), ClusterError> {
        check_name(name)?;
        let key = self.url.agent_key(name);
        let mut c = self.client.clone();
        let resp = self.call(c.get(key.clone(), None))?;
        if let Some(kv) = resp.kvs().first() {
            return Ok((
                AgentRecord::from_etcd(kv.key(), kv.value())?,
                kv.mod_revision(),
            ));
        }
        let from = resp.header().map(|h| h.revision()).unwrap_or(0) + 1;
        let deadline = Instant::now() + wait;
        let not_found = || ClusterError::NotFound {
            name: name.into(),
            waited: wait,
        };
        let shown = self.url.endpoints.join(",");
        self.rt.block_on(async {
            let mut c = self.client.clone();
            let fut = async {
                let mut stream = c
                    .watch(key, Some(WatchOptions::new().with_start_revision(from)))
                    .await
                    .map_err(|e| ClusterError::from_etcd(&shown, e))?;
                while let Some(resp) = stream
                    .message()
                    .await
                    .map_err(|e| ClusterError::from_etcd(&shown, e))?
                {
                    for ev in resp.events() {
                        if let (EventType::Put, Some(kv)) = (ev.event_type(), ev.kv()) {
                            return Ok((
                                AgentRecord::from_etcd(kv.key(), kv.value())?,
                                kv.mod_revision(),
                            ));
                        }
                    }
                }
                Err(not_found())
            };
            match tokio::time::timeout_at(deadline.into(), fut).await {
                Ok(r) => r,
                Err(_) => Err(not_found()),
            }
        })
    }

    /// Watches the namespace: first a [`ClusterEvent::Joined`] for each agent present, then
    /// every change. The watch resumes by itself after etcd comes back. Dropping the
    /// [`Watch`] ends it.
    pub fn watch(&self) -> Result<Watch, ClusterError> {
        self.watch_prefix(self.url.agents_prefix())
    }

    /// A watch of the prefix `key` from now, the present records first.
    pub(crate) fn watch_prefix(&self, key: String) -> Result<Watch, ClusterError> {
        let (raws, rev) = self.get_paged(&key)?;
        let (tx, rx) = std::sync::mpsc::channel();
        for raw in raws {
            let _ = tx.send(match raw.record() {
                Ok(r) => ClusterEvent::Joined(r),
                Err(e) => invalid(&raw.key, e),
            });
        }
        let task = self
            .rt
            .spawn(watch_task(self.client.clone(), key, true, rev + 1, tx));
        Ok(Watch { rx, task })
    }

    /// A watch of exactly the key `key` (not the keys it is a prefix of: `/ns/agents/p` must
    /// not see `/ns/agents/p0`), from now.
    pub(crate) fn watch_key(&self, key: String) -> Result<Watch, ClusterError> {
        let mut c = self.client.clone();
        let resp = self.call(c.get(key.clone(), Some(GetOptions::new().with_keys_only())))?;
        let from = resp.header().map(|h| h.revision()).unwrap_or(0) + 1;
        let (tx, rx) = std::sync::mpsc::channel();
        let task = self
            .rt
            .spawn(watch_task(self.client.clone(), key, false, from, tx));
        Ok(Watch { rx, task })
    }

    /// Every key under `prefix` (at most [`MAX_LISTED`]) at one revision, returned with it.
    /// Read in pages, because one gRPC response is at most 4 MiB (tonic's default) while a
    /// value written by someone else may be as large as etcd accepts (1.5 MiB by default): a
    /// page too large is read again in halves, and a single value too large is returned as
    /// such, by its key, rather than failing the whole listing.
    fn get_paged(&self, prefix: &str) -> Result<(Vec<RawKv>, i64), ClusterError> {
        let end = prefix_end(prefix.as_bytes());
        let mut from = prefix.as_bytes().to_vec();
        let mut out: Vec<RawKv> = Vec::new();
        let mut rev = 0i64;
        let mut page = LIST_PAGE;
        while (out.len() as i64) < MAX_LISTED {
            let limit = page.min(MAX_LISTED - out.len() as i64);
            let mut opts = GetOptions::new().with_range(end.clone()).with_limit(limit);
            if rev > 0 {
                opts = opts.with_revision(rev);
            }
            let mut c = self.client.clone();
            let mut resp = match self.call(c.get(from.clone(), Some(opts))) {
                Ok(r) => r,
                Err(e) if too_large(&e) && page > 1 => {
                    page /= 2;
                    continue;
                }
                Err(e) if too_large(&e) => {
                    // One value alone is too large: learn its key and list it as such.
                    let mut opts = GetOptions::new()
                        .with_range(end.clone())
                        .with_limit(1)
                        .with_keys_only();
                    if rev > 0 {
                        opts = opts.with_revision(rev);
                    }
                    let mut c = self.client.clone();
                    let mut resp = self.call(c.get(from.clone(), Some(opts)))?;
                    let Some(kv) = resp.take_kvs().into_iter().next() else {
                        break;
                    };
                    from = [kv.key(), b"\0"].concat();
                    out.push(RawKv {
                        key: kv.key().to_vec(),
                        value: None,
                        lease: kv.lease(),
                    });
                    continue;
                }
                Err(e) => return Err(e),
            };
            if rev == 0 {
                rev = resp.header().map(|h| h.revision()).unwrap_or(0);
            }
            let more = resp.more();
            let kvs = resp.take_kvs();
            if let Some(last) = kvs.last() {
                from = [last.key(), b"\0"].concat();
            }
            out.extend(kvs.into_iter().map(|kv| RawKv {
                key: kv.key().to_vec(),
                value: Some(kv.value().to_vec()),
                lease: kv.lease(),
            }));
            if !more {
                break;
            }
            page = (page * 2).min(LIST_PAGE);
        }
        Ok((out, rev))
    }
}

/// Records asked for in one page of a listing: 64 valid records (256 KiB at most each) fit
/// one gRPC response; a page of larger values is halved until it fits.
const LIST_PAGE: i64 = 64;

/// A key as listed: its value (`None`: larger than one gRPC response may carry) and lease.
struct RawKv {
    key: Vec<u8>,
    value: Option<Vec<u8>>,
    lease: i64,
}

impl RawKv {
    fn record(&self) -> Result<AgentRecord, ClusterError> {
        match &self.value {
            Some(v) => AgentRecord::from_etcd(&self.key, v),
            None => Err(ClusterError::invalid_record(
                &self.key,
                "larger than one etcd response may carry (4 MiB)",
            )),
        }
    }
}

/// The end of etcd's range of keys starting with `prefix` (its last byte below 0xff plus one).
fn prefix_end(prefix: &[u8]) -> Vec<u8> {
    let mut end = prefix.to_vec();
    while let Some(last) = end.pop() {
        if last < 0xff {
            end.push(last + 1);
            return end;
        }
    }
    vec![0]
}

/// Whether a request failed because its response was larger than the client decodes
/// (tonic's `OutOfRange` "decoded message length too large").
fn too_large(e: &ClusterError) -> bool {
    matches!(e, ClusterError::Etcd(d) if d.contains("message length too large"))
}

/// The watch event for the record at `key` that `e` refused, its texts as the error made them.
fn invalid(key: &[u8], e: ClusterError) -> ClusterEvent {
    match e {
        ClusterError::InvalidRecord { key, detail } => ClusterEvent::Invalid { key, detail },
        other => ClusterEvent::Invalid {
            key: crate::error::shown(&String::from_utf8_lossy(key), crate::error::MAX_SHOWN_CHARS),
            detail: other.to_string(),
        },
    }
}

/// Follows `key` (a prefix when `prefix`, else that key alone) from revision `from`, re-opening the watch after a failure from
/// the last revision seen, until the receiver is dropped.
async fn watch_task(
    mut client: Client,
    key: String,
    prefix: bool,
    mut from: i64,
    tx: std::sync::mpsc::Sender<ClusterEvent>,
) {
    let mut failed: Option<String> = None;
    loop {
        let mut opts = WatchOptions::new()
            .with_prev_key()
            .with_start_revision(from);
        if prefix {
            opts = opts.with_prefix();
        }
        let mut stream = match client.watch(key.clone(), Some(opts)).await {
            Ok(s) => s,
            Err(e) => {
                failed.get_or_insert(e.to_string());
                tokio::time::sleep(Duration::from_millis(500)).await;
                continue;
            }
        };
        if let Some(detail) = failed.take() {
            if tx
                .send(ClusterEvent::Reconnected {
                    detail: gdpath::topo::text::escape(&detail).to_string(),
                })
                .is_err()
            {
                return;
            }
        }
        loop {
            let msg = match stream.message().await {
                Ok(Some(m)) => m,
                Ok(None) => {
                    failed = Some("the watch stream ended".into());
                    break;
                }
                Err(e) => {
                    failed = Some(e.to_string());
                    break;
                }
            };
            if msg.canceled() {
                // A compacted start revision: the events between are gone; say so.
                failed = Some(format!(
                    "watch cancelled by etcd (compact revision {}): events may be missed",
                    msg.compact_revision()
                ));
                from = msg.compact_revision().max(from);
                break;
            }
            for ev in msg.events() {
                let Some(kv) = ev.kv() else { continue };
                from = from.max(kv.mod_revision() + 1);
                let before = ev
                    .prev_kv()
                    .and_then(|p| AgentRecord::from_etcd(p.key(), p.value()).ok());
                let left = |incarnation: Option<String>| ClusterEvent::Left {
                    name: crate::error::shown(
                        &String::from_utf8_lossy(
                            kv.key().rsplit(|&b| b == b'/').next().unwrap_or_default(),
                        ),
                        crate::error::MAX_SHOWN_CHARS,
                    ),
                    incarnation,
                    at: SystemTime::now(),
                };
                let out = match ev.event_type() {
                    EventType::Put => match AgentRecord::from_etcd(kv.key(), kv.value()) {
                        Err(e) => vec![invalid(kv.key(), e)],
                        Ok(r) => match before {
                            Some(b) if b.incarnation == r.incarnation => {
                                vec![ClusterEvent::Updated(r)]
                            }
                            // Another start under the name is a new agent, not a change of
                            // the old one: peers of the old one must see it go.
                            Some(b) => vec![
                                left(Some(b.incarnation.to_string())),
                                ClusterEvent::Joined(r),
                            ],
                            None => vec![ClusterEvent::Joined(r)],
                        },
                    },
                    EventType::Delete => vec![left(before.map(|b| b.incarnation.to_string()))],
                };
                for e in out {
                    if tx.send(e).is_err() {
                        return;
                    }
                }
            }
        }
        tokio::time::sleep(Duration::from_millis(200)).await;
    }
}

/// A running watch: its events, in etcd's order.
pub struct Watch {
    rx: std::sync::mpsc::Receiver<ClusterEvent>,
    task: tokio::task::JoinHandle<()>,
}

impl Watch {
    /// The next event, waiting up to `timeout`; `None` when none came.
    pub fn next(&self, timeout: Duration) -> Option<ClusterEvent> {
        self.rx.recv_timeout(timeout).ok()
    }
}

impl Drop for Watch {
    fn drop(&mut self) {
        self.task.abort();
    }
}

/// One request over the new TLS connection, so that a refused client certificate is told at
/// connect as [`ClusterError::Denied`]. etcd refuses a certificate (or its absence, under
/// `--client-cert-auth`) with an alert after the handshake, then closes the connection; the
/// request written meanwhile often fails on the closed connection (a broken pipe or a reset)
/// before the alert is read, which on a connection whose handshake succeeded means that
/// refusal. Errors: [`ClusterError::Denied`], else what the request met.
fn probe_tls(
    rt: &tokio::runtime::Runtime,
    client: &Client,
    url: &ClusterUrl,
    shown: &str,
    timeout: Duration,
) -> Result<(), ClusterError> {
    let mut c = client.clone();
    let e = match rt.block_on(async { tokio::time::timeout(timeout, c.status()).await }) {
        Ok(Ok(_)) => return Ok(()),
        Ok(Err(e)) => e,
        Err(_) => {
            return Err(ClusterError::Unreachable {
                endpoints: shown.into(),
                detail: format!("no answer within {timeout:?}"),
            })
        }
    };
    let text = e.to_string();
    if ["kind: BrokenPipe", "kind: ConnectionReset"]
        .iter()
        .any(|k| text.contains(k))
    {
        let given = match &url.client_cert {
            Some(_) => "the client certificate given (is it signed by a CA etcd trusts?)",
            None => "no client certificate, which etcd asks for (?cert=FILE&key=FILE)",
        };
        return Err(ClusterError::Denied(format!(
            "etcd closed the TLS connection after the handshake: {given}; {}",
            gdpath::topo::text::escape(&text)
        )));
    }
    Err(ClusterError::from_etcd(shown, e))
}

/// TLS settings of an `etcds://` URL: its CA and client certificate files, each checked to
/// hold what it is named for, since a wrong file otherwise fails later as an unexplained
/// `tls handshake eof` or `transport error`. Errors: [`ClusterError::Url`] naming the file
/// (unreadable, no `CERTIFICATE` PEM block in the CA or certificate, no `PRIVATE KEY` block
/// in the key).
fn tls_options(url: &ClusterUrl) -> Result<etcd_client::TlsOptions, ClusterError> {
    let read = |p: &std::path::Path, what: &str, block: &str| {
        let shown = gdpath::topo::text::escape(&p.display().to_string());
        let pem = gdpath::file::read_bounded(p, 1 << 20)
            .map_err(|e| ClusterError::Url(format!("cannot read {shown}: {e}")))?;
        if !holds_pem_block(&pem, block) {
            return Err(ClusterError::Url(format!(
                "{shown} holds no {what} (a PEM \"-----BEGIN {block}-----\" block)"
            )));
        }
        Ok(pem)
    };
    let mut tls = etcd_client::TlsOptions::new();
    if let Some(ca) = &url.ca_file {
        let pem = read(ca, "certificate", "CERTIFICATE")?;
        tls = tls.ca_certificate(etcd_client::Certificate::from_pem(pem));
    }
    if let Some((cert, key)) = &url.client_cert {
        let cert = read(cert, "certificate", "CERTIFICATE")?;
        let key = read(key, "private key", "PRIVATE KEY")?;
        tls = tls.identity(etcd_client::Identity::from_pem(cert, key));
    }
    Ok(tls)
}

/// Whether `pem` holds a block whose label ends with `label` (`PRIVATE KEY` also matches
/// PKCS#1's `RSA PRIVATE KEY` and SEC1's `EC PRIVATE KEY`, RFC 7468 section 2).
fn holds_pem_block(pem: &[u8], label: &str) -> bool {
    let text = String::from_utf8_lossy(pem);
    text.lines().any(|l| {
        l.trim_end()
            .strip_prefix("-----BEGIN ")
            .and_then(|rest| rest.strip_suffix("-----"))
            .is_some_and(|l| l == label || l.ends_with(&format!(" {label}")))
    })
}
