//! A serving agent's control plane: a TCP listener gdpath owns, and the thread that runs the
//! handshakes on it (a `poll` loop over the listener and every connection, non-blocking).
//!
//! Nothing a client sends reaches UCX before it authenticated: the challenge, the client's
//! answer and the welcome cross this TCP connection, driven by the connection's protocol state
//! machine, and only a verified answer makes this agent create a UCX endpoint, from the UCX
//! worker address the client sent ([`Action::Connect`]). What keeps an unauthenticated client
//! from holding the server:
//!
//! - a handshake deadline (`NetConfig::connect_timeout`): a connection that has not finished
//!   the handshake by then is dropped ([`NetEvent::Lost`], "no handshake within");
//! - a cap on connections in the handshake ([`Admission`], from the process's file-descriptor
//!   limit, at most [`MAX_PENDING`]): past it the oldest one is dropped to make room, without
//!   an event, so that a client that answers at once still gets in;
//! - a frame's header checked, and its body bounded ([`tcp::MAX_SERVER_READ`]), before any byte
//!   of it is allocated;
//! - at the file-descriptor limit, an accept that fails is answered by closing a spare
//!   descriptor, taking the connection and closing it (no spinning on `accept`), and the
//!   warning is rate-limited ([`super::ratelog`]).
//!
//! After the handshake the TCP connection stays open: its end (EOF, reset) means the peer went
//! away ([`protocol::Conn::transport_failed`]), however UCX learns of it. The listener binds
//! with `SO_REUSEADDR` (as `std::net::TcpListener::bind` does on Unix), so a restarted server
//! binds its port at once.

use super::conn::PeerConn;
use super::tcp::{self, FrameReader, ReadError};
use super::{export, lock, next, State, UcxBackend};
use crate::error::{Error, Result};
use crate::net::codec::{self, RefuseCode, NONCE_LEN};
use crate::net::protocol::{self, Action, Limits, Role};
#[cfg(doc)]
use crate::net::NetEvent;
use gdpath_ucx::{Endpoint, WorkerAddress};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use std::io;
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::os::unix::net::UnixDatagram;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Most connections in the handshake at once, whatever the descriptor limit allows.
pub(crate) const MAX_PENDING: usize = 64;
/// File descriptors left to UCX and the rest of the process (UCX's own connections, files).
const FD_RESERVE: usize = 16;
/// Descriptors one authenticated peer costs a server: the TCP connection (and its duplicate)
/// and UCX's connections to and from the peer's worker.
const FDS_PER_PEER: usize = 4;
/// How long a refused or ended connection may take to get its last message out.
const LINGER: Duration = Duration::from_secs(1);
/// Longest poll: bounds how late a deadline of a connection in the handshake is seen.
const POLL_MAX: Duration = Duration::from_millis(100);

/// How many connections the control plane holds, from the descriptors the process may open.
#[derive(Debug, Clone, Copy)]
pub(crate) struct Admission {
    /// Connections in the handshake at once.
    pub(crate) max_pending: usize,
    /// Descriptors the control plane may account for: one per connection in the handshake,
    /// [`FDS_PER_PEER`] per authenticated peer.
    pub(crate) fd_budget: usize,
}

impl Admission {
    /// From `RLIMIT_NOFILE`'s soft limit and the descriptors open now (`/proc/self/fd`).
    fn now() -> Admission {
        let soft = nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE)
            .map(|(soft, _)| usize::try_from(soft).unwrap_or(usize::MAX))
            .unwrap_or(1024);
        let open = std::fs::read_dir("/proc/self/fd").map_or(32, |d| d.count());
        let free = soft.saturating_sub(open).saturating_sub(FD_RESERVE);
        Admission {
            max_pending: (free / 4).clamp(1, MAX_PENDING),
            fd_budget: free.max(1),
        }
    }
}

/// The running control plane of a serving agent.
pub(crate) struct ControlPlane {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    wake: UnixDatagram,
    thread: Option<JoinHandle<()>>,
}

/// Binds the control plane's listener on `listen` (`SO_REUSEADDR`, as
/// `std::net::TcpListener::bind` sets on Unix). Errors: [`Error::Config`] for an address in
/// use, [`Error::Backend`] for another bind failure.
pub(crate) fn bind(listen: SocketAddr) -> Result<TcpListener> {
    TcpListener::bind(listen).map_err(|e| match e.kind() {
        io::ErrorKind::AddrInUse => Error::Config(format!(
            "cannot listen on {listen}: address already in use (another `gdpath serve`?); \
             choose another port with --listen"
        )),
        _ => Error::Backend {
            backend: "ucx",
            detail: format!("cannot listen on {listen}: {e}"),
        },
    })
}

impl ControlPlane {
    /// Starts the control thread on `listener` ([`bind`]). Errors: [`Error::Backend`] for a
    /// listener or thread failure.
    pub(crate) fn start(b: &Arc<UcxBackend>, listener: TcpListener) -> Result<ControlPlane> {
        let os = |what: &str, e: io::Error| Error::Backend {
            backend: "ucx",
            detail: format!("{what}: {e}"),
        };
        listener
            .set_nonblocking(true)
            .map_err(|e| os("listener", e))?;
        let addr = listener.local_addr().map_err(|e| os("listener", e))?;
        let (wake, wake_rx) = UnixDatagram::pair().map_err(|e| os("wake pair", e))?;
        wake_rx
            .set_nonblocking(true)
            .map_err(|e| os("wake pair", e))?;
        let stop = Arc::new(AtomicBool::new(false));
        let mut run = Run {
            b: b.clone(),
            listener,
            wake: wake_rx,
            stop: stop.clone(),
            slots: Vec::new(),
            admission: Admission::now(),
            spare: std::fs::File::open("/dev/null").ok(),
        };
        tracing::debug!(?run.admission, "control plane admission");
        let thread = std::thread::Builder::new()
            .name("gdpath-ctl".into())
            .spawn(move || run.run())
            .map_err(|e| os("spawning the control thread", e))?;
        Ok(ControlPlane {
            addr,
            stop,
            wake,
            thread: Some(thread),
        })
    }

    pub(crate) fn local_addr(&self) -> SocketAddr {
        self.addr
    }

    /// Stops the thread and closes the listener and the connections in the handshake (once).
    /// Authenticated peers keep their control connections (their duplicates).
    pub(crate) fn halt(&mut self) {
        self.stop.store(true, Ordering::Release);
        let _ = self.wake.send(&[1]);
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

impl Drop for ControlPlane {
    fn drop(&mut self) {
        self.halt();
    }
}

/// One TCP connection of the control plane.
struct Slot {
    stream: TcpStream,
    reader: FrameReader,
    /// Bytes not yet written.
    out: Vec<u8>,
    state: SlotState,
    /// When it was accepted (the oldest in the handshake is dropped first).
    since: Instant,
}

enum SlotState {
    /// In the handshake: its protocol state (taken out while the endpoint is made).
    Pending(Option<Box<protocol::Conn>>),
    /// Authenticated: the connection, whose control connection this is.
    Ready(Arc<PeerConn>),
    /// Over: closed once its last bytes are out, or at the instant given.
    Done(Instant),
}

/// The control thread's state.
struct Run {
    b: Arc<UcxBackend>,
    listener: TcpListener,
    wake: UnixDatagram,
    stop: Arc<AtomicBool>,
    slots: Vec<Slot>,
    admission: Admission,
    /// A descriptor kept to be closed when `accept` hits the descriptor limit.
    spare: Option<std::fs::File>,
}

fn limits(b: &UcxBackend) -> Limits {
    Limits {
        handshake: b.cfg.connect_timeout,
        goodbye: b.cfg.connect_timeout,
        ack: b.cfg.op_timeout,
    }
}

/// A nonce for a handshake ([`crate::net::auth`]): 32 bytes from the operating system's CSPRNG
/// (`getrandom`). Errors with [`Error::Backend`] if the OS has none.
pub(crate) fn nonce() -> Result<[u8; NONCE_LEN]> {
    let mut n = [0u8; NONCE_LEN];
    getrandom::fill(&mut n).map_err(|e| Error::Backend {
        backend: "ucx",
        detail: format!("getrandom: {e}"),
    })?;
    Ok(n)
}

/// A routing id for a new connection: random, non-zero, unused by `st`'s connections.
pub(crate) fn new_session(st: &State) -> Result<u64> {
    loop {
        let n = nonce()?;
        let s = u64::from_le_bytes(n[..8].try_into().expect("8 of 32 bytes"));
        if s != 0 && !st.peers.iter().any(|p| p.session == s) && !st.early.contains_key(&s) {
            return Ok(s);
        }
    }
}

impl Run {
    fn run(&mut self) {
        while !self.stop.load(Ordering::Acquire) {
            let timeout = self.poll_timeout();
            let (wake, listen, ready) = match self.poll(timeout) {
                Ok(r) => r,
                Err(e) => {
                    self.b
                        .log
                        .warn("ctl-poll", || format!("control plane poll: {e}"));
                    std::thread::sleep(Duration::from_millis(10));
                    continue;
                }
            };
            if wake {
                let mut buf = [0u8; 16];
                while self.wake.recv(&mut buf).is_ok() {}
            }
            if self.stop.load(Ordering::Acquire) {
                break;
            }
            for i in ready {
                self.service(i);
            }
            if listen {
                self.accept_all();
            }
            self.deadlines();
        }
    }

    /// Until the next deadline of a connection in the handshake or a lingering one, at most
    /// [`POLL_MAX`].
    fn poll_timeout(&self) -> Duration {
        let now = Instant::now();
        let next = self
            .slots
            .iter()
            .filter_map(|s| match &s.state {
                SlotState::Pending(Some(c)) => c.next_deadline(),
                SlotState::Done(at) => Some(*at),
                _ => None,
            })
            .min();
        next.map_or(POLL_MAX, |d| {
            (d + Duration::from_millis(1))
                .saturating_duration_since(now)
                .min(POLL_MAX)
        })
    }

    /// Polls the wake descriptor, the listener and every connection: (woken, a connection to
    /// accept, the connections with something to read or write or that ended).
    fn poll(&self, timeout: Duration) -> nix::Result<(bool, bool, Vec<usize>)> {
        let mut fds = Vec::with_capacity(self.slots.len() + 2);
        fds.push(PollFd::new(self.wake.as_fd(), PollFlags::POLLIN));
        fds.push(PollFd::new(self.listener.as_fd(), PollFlags::POLLIN));
        for s in &self.slots {
            let mut ev = PollFlags::POLLIN;
            if !s.out.is_empty() {
                ev |= PollFlags::POLLOUT;
            }
            fds.push(PollFd::new(s.stream.as_fd(), ev));
        }
        let t = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
        match nix::poll::poll(&mut fds, t) {
            Ok(_) => {}
            Err(nix::errno::Errno::EINTR) => return Ok((false, false, Vec::new())),
            Err(e) => return Err(e),
        }
        let hit = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
        let ready = fds[2..]
            .iter()
            .enumerate()
            .filter(|(_, f)| hit(f))
            .map(|(i, _)| i)
            .collect();
        Ok((hit(&fds[0]), hit(&fds[1]), ready))
    }

    fn counts(&self) -> (usize, usize) {
        let pending = self
            .slots
            .iter()
            .filter(|s| matches!(s.state, SlotState::Pending(_)))
            .count();
        let ready = self
            .slots
            .iter()
            .filter(|s| matches!(s.state, SlotState::Ready(_)))
            .count();
        (pending, ready)
    }

    /// Accepts every queued connection (see the module docs for the caps).
    fn accept_all(&mut self) {
        loop {
            match self.listener.accept() {
                Ok((stream, addr)) => self.admit(stream, addr),
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => return,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if matches!(e.raw_os_error(), Some(libc::EMFILE | libc::ENFILE)) => {
                    self.b.log.warn("ctl-fd-limit", || {
                        format!(
                            "accepting a connection failed at the file-descriptor limit ({e}): \
                             refusing connections until descriptors are free"
                        )
                    });
                    // Take the connection with the spare descriptor and close it: it would
                    // otherwise wake every poll again.
                    self.spare = None;
                    if let Ok((s, _)) = self.listener.accept() {
                        drop(s);
                    }
                    self.spare = std::fs::File::open("/dev/null").ok();
                    return;
                }
                Err(e) => {
                    self.b.log.warn("ctl-accept", || {
                        format!("accepting a connection failed: {e}")
                    });
                    return;
                }
            }
        }
    }

    /// Takes a new connection in, within the caps, and challenges it (or refuses it when the
    /// agent serves as many peers as it accepts).
    fn admit(&mut self, stream: TcpStream, addr: SocketAddr) {
        let (pending, ready) = self.counts();
        let over_fds = pending + 1 + FDS_PER_PEER * ready > self.admission.fd_budget;
        if pending >= self.admission.max_pending || over_fds {
            let oldest = self
                .slots
                .iter()
                .enumerate()
                .filter(|(_, s)| matches!(s.state, SlotState::Pending(_)))
                .min_by_key(|(_, s)| s.since)
                .map(|(i, _)| i);
            let cap = self.admission.max_pending;
            match oldest {
                Some(i) => {
                    self.slots.swap_remove(i);
                    self.b.log.warn("ctl-evict", || {
                        format!(
                            "dropped the oldest connection still in the handshake to make room \
                             (at most {cap} at once, from the file-descriptor limit)"
                        )
                    });
                }
                None => {
                    self.b.log.warn("ctl-full", || {
                        format!("refused a connection from {addr}: no file descriptors to spare")
                    });
                    return;
                }
            }
        }
        if stream.set_nonblocking(true).is_err() {
            return;
        }
        let _ = stream.set_nodelay(true);
        let b = self.b.clone();
        let mut guard = lock(&b.state);
        let st = &mut *guard;
        let (Ok(server_nonce), Ok(session)) = (nonce(), new_session(st)) else {
            return;
        };
        let now = Instant::now();
        let mut proto = protocol::Conn::server(
            next(&b.next_peer),
            Some(addr),
            server_nonce,
            session,
            now,
            limits(&b),
        );
        let serving = st
            .peers
            .iter()
            .filter(|p| p.role == Role::Server && !lock(&p.inner).proto.is_leaving())
            .count();
        let mut out = Vec::new();
        if serving >= b.cfg.max_peers {
            let reason = format!("server has its maximum of {} peers", b.cfg.max_peers);
            proto.refuse(&mut st.node, RefuseCode::Busy, reason, &mut out);
        } else {
            proto.challenge(&mut out);
        }
        let mut slot = Slot {
            stream,
            reader: FrameReader::new(tcp::MAX_SERVER_READ),
            out: Vec::new(),
            state: SlotState::Pending(Some(Box::new(proto))),
            since: now,
        };
        perform(&b, st, &mut slot, out);
        self.slots.push(slot);
    }

    /// Reads and writes what connection `i` has, and feeds its state machine.
    fn service(&mut self, i: usize) {
        let b = self.b.clone();
        let Some(slot) = self.slots.get_mut(i) else {
            return;
        };
        if !slot.out.is_empty() {
            if let Err(e) = tcp::write_some(&mut slot.stream, &mut slot.out) {
                slot.out.clear();
                failed(&b, slot, format!("the control connection failed: {e}"));
            }
        }
        loop {
            if matches!(slot.state, SlotState::Done(_)) {
                // Nothing more is read from a connection that ended; its end is awaited.
                let mut sink = [0u8; 512];
                match io::Read::read(&mut slot.stream, &mut sink) {
                    Ok(0) | Err(_) => slot.state = SlotState::Done(Instant::now()),
                    Ok(_) => continue,
                }
                return;
            }
            match slot.reader.read(&mut slot.stream) {
                Ok(Some(frame)) => {
                    let decoded = codec::decode_owned(frame);
                    let mut guard = lock(&b.state);
                    let st = &mut *guard;
                    let now = Instant::now();
                    let mut out = Vec::new();
                    match &mut slot.state {
                        SlotState::Pending(Some(c)) => match decoded {
                            Ok(m) => c.handle(&mut st.node, m, now, &mut out),
                            Err(e) => c.decode_failed(&mut st.node, e, &mut out),
                        },
                        SlotState::Ready(p) => {
                            let p = p.clone();
                            {
                                let mut g = lock(&p.inner);
                                match decoded {
                                    Ok(m) => g.proto.handle(&mut st.node, m, now, &mut out),
                                    Err(e) => g.proto.decode_failed(&mut st.node, e, &mut out),
                                }
                            }
                            b.perform(st, &p, out);
                            continue;
                        }
                        _ => return,
                    }
                    perform(&b, st, slot, out);
                }
                Ok(None) => return,
                Err(ReadError::Bad(e)) => {
                    let mut guard = lock(&b.state);
                    let st = &mut *guard;
                    let mut out = Vec::new();
                    match &mut slot.state {
                        SlotState::Pending(Some(c)) => {
                            c.decode_failed(&mut st.node, e, &mut out);
                            perform(&b, st, slot, out);
                        }
                        SlotState::Ready(p) => {
                            let p = p.clone();
                            lock(&p.inner)
                                .proto
                                .decode_failed(&mut st.node, e, &mut out);
                            b.perform(st, &p, out);
                        }
                        _ => {}
                    }
                    // Nothing after a refused frame is read: the stream is out of step.
                    slot.state = SlotState::Done(Instant::now() + LINGER);
                    return;
                }
                Err(ReadError::Closed(how)) => {
                    let detail = if matches!(slot.state, SlotState::Ready(_)) {
                        format!("the peer went away (it closed the control connection: {how})")
                    } else {
                        format!("the client closed the connection in the handshake ({how})")
                    };
                    failed(&b, slot, detail);
                    return;
                }
                Err(ReadError::Io(e)) => {
                    failed(&b, slot, format!("the control connection failed: {e}"));
                    return;
                }
            }
        }
    }

    /// Handshake deadlines; connections whose peer ended elsewhere (UCX, a goodbye) or whose
    /// last bytes are out are dropped.
    fn deadlines(&mut self) {
        let b = self.b.clone();
        let now = Instant::now();
        for slot in &mut self.slots {
            if let SlotState::Pending(Some(c)) = &mut slot.state {
                if c.next_deadline().is_some_and(|d| now > d) {
                    let mut guard = lock(&b.state);
                    let st = &mut *guard;
                    let mut out = Vec::new();
                    c.poll(&mut st.node, now, &mut out);
                    perform(&b, st, slot, out);
                }
            }
        }
        self.slots.retain(|s| match &s.state {
            SlotState::Ready(p) => !lock(&p.inner).proto.is_over(),
            SlotState::Done(at) => !s.out.is_empty() && now < *at,
            SlotState::Pending(c) => c.is_some(),
        });
    }
}

/// The connection's transport failed (`detail`): its state machine is told.
fn failed(b: &Arc<UcxBackend>, slot: &mut Slot, detail: String) {
    let mut guard = lock(&b.state);
    let st = &mut *guard;
    let mut out = Vec::new();
    match &mut slot.state {
        SlotState::Pending(Some(c)) => {
            c.transport_failed(&mut st.node, detail, &mut out);
            perform(b, st, slot, out);
        }
        SlotState::Ready(p) => {
            let p = p.clone();
            lock(&p.inner)
                .proto
                .transport_failed(&mut st.node, detail, &mut out);
            b.perform(st, &p, out);
        }
        _ => {}
    }
    slot.state = SlotState::Done(Instant::now());
}

/// Performs what a connection's state machine asked while it was in the handshake: messages go
/// over the TCP connection, `Connect` makes its UCX endpoint and registers it with the backend
/// (before the welcome is written, so that what the client sends over UCX once welcomed finds
/// it), the end closes the TCP connection once its last bytes are out.
fn perform(b: &Arc<UcxBackend>, st: &mut State, slot: &mut Slot, out: Vec<Action>) {
    for a in out {
        match a {
            Action::Send(m) => match codec::encode(&m) {
                Ok(bytes) => {
                    slot.out.extend_from_slice(&bytes);
                    if let Err(e) = tcp::write_some(&mut slot.stream, &mut slot.out) {
                        slot.out.clear();
                        tracing::debug!("control connection: {e}");
                    }
                }
                Err(e) => tracing::warn!("{:?} not encoded: {e}", m.kind()),
            },
            Action::Event(e) => b.push_event(e),
            Action::Connect {
                worker_address,
                session: _,
            } => {
                let SlotState::Pending(proto) = &mut slot.state else {
                    continue;
                };
                let Some(mut c) = proto.take() else { continue };
                // The core was made before the control plane started (`serve`).
                let made = b.made().map_err(|e| e.to_string()).and_then(|core| {
                    Endpoint::connect_address_with(
                        &core.worker,
                        &WorkerAddress(worker_address),
                        b.cfg.failure_mode.ucx(),
                    )
                    .map_err(|e| e.to_string())
                });
                match made {
                    Ok(ep) => {
                        let peer = Arc::new(PeerConn::new(ep, *c, slot.stream.try_clone().ok()));
                        st.peers.push(peer.clone());
                        slot.state = SlotState::Ready(peer);
                        b.kick();
                    }
                    Err(e) => {
                        let mut more = Vec::new();
                        c.transport_failed(
                            &mut st.node,
                            format!("cannot connect to the peer's UCX worker: {e}"),
                            &mut more,
                        );
                        slot.state = SlotState::Pending(Some(c));
                        perform(b, st, slot, more);
                        return;
                    }
                }
            }
            Action::Release(id) => export::release(st, id),
            Action::End(r) => {
                if let Err(e) = r {
                    tracing::debug!("connection ended in the handshake: {e}");
                }
                slot.state = SlotState::Done(Instant::now() + LINGER);
            }
            // Nothing else comes before the handshake is over; once it is, the backend does it.
            other => {
                if let SlotState::Ready(p) = &slot.state {
                    let p = p.clone();
                    b.perform(st, &p, vec![other]);
                }
            }
        }
    }
}
