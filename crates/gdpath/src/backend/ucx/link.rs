//! The UCX backend as a [`NetworkBackend`]: connections handed out as [`PeerLink`]s, a listener
//! and its serving thread as a [`ServeLink`], exports and notifications.

use super::conn::PeerConn;
use super::control::OnTimeout;
use super::{lock, ucx_err, UcxBackend, CTRL_AM};
use crate::backend::network::{NetworkBackend, NotificationHook, PeerLink, ServeLink};
use crate::error::{Error, Result};
use crate::net::codec::{self, Message, RegionMeta};
use crate::net::devices::Need;
use crate::net::protocol::Role;
use crate::net::{ConnectOptions, NetConfig, NetEvent, Notification, Token};
use crate::region::Region;
use std::net::SocketAddr;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

impl UcxBackend {
    fn this(&self) -> Arc<UcxBackend> {
        self.me
            .upgrade()
            .expect("a backend method runs while the backend is alive")
    }
}

impl NetworkBackend for UcxBackend {
    fn net_config(&self) -> &NetConfig {
        &self.cfg
    }

    fn connect(&self, addr: SocketAddr, opts: &ConnectOptions) -> Result<Arc<dyn PeerLink>> {
        let conn = UcxBackend::connect(self, addr, opts)?;
        Ok(Arc::new(UcxPeer {
            conn,
            backend: self.this(),
        }))
    }

    fn serve(&self, listen: SocketAddr, token: Token) -> Result<Box<dyn ServeLink>> {
        let mut slot = lock(&self.control);
        if slot.is_some() {
            return Err(Error::Config("this agent already listens".into()));
        }
        let listener = super::listen::bind(listen)?;
        let bound = listener.local_addr().map_err(|e| Error::Backend {
            backend: "ucx",
            detail: format!("listener: {e}"),
        })?;
        // UCX's own port listens only where this listener does, when the engine chooses.
        self.core_for(&Need::Listen(bound))?;
        // The token is in place before the first client can answer a challenge.
        lock(&self.state).node.token = Some(token);
        let control = match super::listen::ControlPlane::start(&self.this(), listener) {
            Ok(c) => c,
            Err(e) => {
                lock(&self.state).node.token = None;
                return Err(e);
            }
        };
        let addr = control.local_addr();
        *slot = Some(control);
        drop(slot);
        if self.cfg.keep_freed_memory {
            // Peers' packed writes arrive in an allocation each (see `malloc`).
            let set = super::malloc::keep_freed_memory();
            tracing::debug!("{set} of glibc's trim and mmap thresholds raised");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let (b, s) = (self.this(), stop.clone());
        let thread = std::thread::Builder::new()
            .name("gdpath-net".into())
            .spawn(move || serve_loop(b, s))
            .map_err(|e| Error::Backend {
                backend: "ucx",
                detail: format!("spawning the progress thread: {e}"),
            })?;
        Ok(Box::new(UcxServer {
            backend: self.this(),
            addr,
            stop,
            thread: Some(thread),
        }))
    }

    fn export(&self, region: &Region) -> Result<u64> {
        UcxBackend::export(self, region)
    }

    fn export_info(&self, region: &Region) -> Result<crate::net::RemoteRegionInfo> {
        UcxBackend::export_info(self, region)
    }

    fn unexport(&self, region: &Region) -> Result<()> {
        UcxBackend::unexport(self, region)
    }

    fn is_exported(&self, region: &Region) -> bool {
        UcxBackend::is_exported(self, region)
    }

    fn take_notifications(&self) -> Vec<Notification> {
        lock(&self.notifications).drain(..).collect()
    }

    fn wait_notification(&self, timeout: Duration) -> Option<Notification> {
        let mut got = None;
        self.progress_until(timeout, || {
            got = lock(&self.notifications).pop_front();
            got.is_some()
        });
        got
    }

    fn on_notification(&self, hook: NotificationHook) {
        lock(&self.notification_hooks).push(hook);
    }

    fn ucx_facts(&self) -> Result<gdpath_ucx::UcxFacts> {
        self.facts()
    }
}

/// A client connection handed to a `Peer`.
struct UcxPeer {
    conn: Arc<PeerConn>,
    backend: Arc<UcxBackend>,
}

impl PeerLink for UcxPeer {
    fn name(&self) -> String {
        self.conn.label()
    }

    fn addr(&self) -> Option<SocketAddr> {
        self.conn.addr
    }

    fn regions(&self) -> Vec<RegionMeta> {
        self.conn.live_regions()
    }

    fn transport(&self) -> String {
        self.conn.transport().to_string()
    }

    fn failure(&self) -> Option<String> {
        self.conn.failure()
    }

    fn flush(&self, timeout: Duration) -> Result<()> {
        // One round first: what happened to the connection (its control connection closed, a
        // message from the peer) is known before anything is confirmed.
        self.backend.progress_round();
        // Packed writes (tcp) are in the peer's memory once acknowledged, which an endpoint
        // flush does not wait for: wait for their acknowledgements first.
        let id = self.conn.id;
        let acked = self.backend.progress_until(timeout, || {
            !self.backend.packed_in_flight(id) || self.conn.failure().is_some()
        });
        if !acked {
            return Err(Error::PeerFailed {
                peer: self.conn.label(),
                detail: format!("packed writes not acknowledged within {timeout:?}"),
            });
        }
        // A connection already over (the peer went away, said goodbye) confirms nothing: an
        // endpoint flush with nothing outstanding could still succeed.
        if let Some(e) = self.conn.unusable() {
            return Err(e);
        }
        let r = self
            .conn
            .ep
            .flush(timeout)
            .map_err(|e| ucx_err(&self.conn.label(), "flush", e));
        // The flush progressed the worker outside a progress round: what it received (a
        // control message, a connection request) waits for a round, which a sleeping serving
        // thread would only run after its timeout.
        self.backend.kick();
        r
    }

    fn notify(&self, message: &[u8], timeout: Duration) -> Result<()> {
        self.backend.progress_round();
        if let Some(e) = self.conn.unusable() {
            return Err(e);
        }
        let label = self.conn.label();
        let bytes =
            codec::encode(&Message::Notify(message.to_vec())).map_err(Error::ProtocolLimit)?;
        let label = label.as_str();
        let ucx = |op| move |e| ucx_err(label, op, e);
        let r = (|| {
            self.conn.ep.flush(timeout).map_err(ucx("flush"))?;
            let req = self
                .conn
                .ep
                .am_send(CTRL_AM, &self.conn.route, &bytes)
                .map_err(ucx("notify"))?;
            req.wait(timeout).map_err(ucx("notify"))
        })();
        // As in `flush`: this progressed the worker outside a progress round.
        self.backend.kick();
        r
    }

    fn close(&self, timeout: Duration) -> Result<()> {
        self.backend
            .close_peer(&self.conn, timeout, OnTimeout::Fail)
    }

    fn wait_until(&self, timeout: Duration, done: &mut dyn FnMut() -> bool) -> bool {
        self.backend.progress_until(timeout, done)
    }

    fn release(&self) {
        self.backend.release_peer(&self.conn);
    }
}

/// A listener and its serving thread, handed to a `Server`.
struct UcxServer {
    backend: Arc<UcxBackend>,
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl ServeLink for UcxServer {
    fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    fn next_event(&self, timeout: Duration) -> Option<NetEvent> {
        self.backend.wait_event(timeout)
    }

    fn peers(&self) -> usize {
        lock(&self.backend.state)
            .peers
            .iter()
            .filter(|p| p.role == Role::Server && p.is_ready())
            .count()
    }

    fn withdrawing(&self) -> usize {
        lock(&self.backend.state).node.exports.retiring()
    }

    fn stop(&mut self, timeout: Duration) -> usize {
        self.halt();
        self.backend.leave_clients(timeout)
    }

    fn halt(&mut self) {
        // The control plane first: no new client gets in while the rest stops.
        let control = lock(&self.backend.control).take();
        drop(control);
        // Clients still in the handshake are refused from now on: the server is stopping.
        lock(&self.backend.state).node.token = None;
        self.stop.store(true, Ordering::Release);
        self.backend.kick();
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// Progress loop of a serving agent: spins while there is traffic (over `tcp` the target's
/// worker serves puts and gets), yields for [`SERVE_SPIN`] after the last activity (a peer's
/// next request then finds it awake), then blocks on UCX's event fd until the next goodbye or
/// handshake deadline, [`SERVE_SLEEP`] at most ([`idle_sleep`]).
fn serve_loop(b: Arc<UcxBackend>, stop: Arc<AtomicBool>) {
    let mut last = Instant::now();
    while !stop.load(Ordering::Acquire) {
        let seen = b.wake.seen();
        let Some((_, active)) = b.try_progress_round() else {
            // An application thread is progressing the worker: not idle.
            std::thread::yield_now();
            continue;
        };
        if active {
            last = Instant::now();
            continue;
        }
        let slept = || match b.core() {
            Some(c) => b.wake.sleep(&c.worker, seen, idle_sleep(&b)),
            None => false,
        };
        if last.elapsed() < SERVE_SPIN {
            std::thread::yield_now();
        } else if !slept() {
            std::thread::sleep(Duration::from_micros(500));
        }
    }
}

/// How long the idle serving thread may block: [`SERVE_SLEEP`], or less when a connection's
/// deadline comes sooner. It wakes 1 ms past the deadline: the deadline is exclusive, and the
/// wait on UCX's event fd counts whole milliseconds (a shorter margin would round the last
/// millisecond down to polls that return at once).
fn idle_sleep(b: &UcxBackend) -> Duration {
    let next = b.next_reap_deadline(&lock(&b.state));
    next.and_then(|d| d.checked_add(Duration::from_millis(1)))
        .map_or(SERVE_SLEEP, |d| {
            d.saturating_duration_since(Instant::now()).min(SERVE_SLEEP)
        })
}

/// How long the serving thread keeps polling after the last activity: request/response
/// traffic (latency runs, handshakes) stays on the polling path, whose wake-up is a yield.
const SERVE_SPIN: Duration = Duration::from_millis(5);

/// The longest idle block of the serving thread on UCX's event fd (bounds how late it notices
/// its stop flag; connection deadlines shorten the block, [`idle_sleep`]).
const SERVE_SLEEP: Duration = Duration::from_millis(100);
