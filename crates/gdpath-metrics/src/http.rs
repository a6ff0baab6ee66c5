//! A `/metrics` endpoint over HTTP/1.1, on std's TCP listener: one thread polling every open
//! connection (non-blocking, `poll(2)`), one request per connection, bounded in size, time and
//! number, `GET /metrics` only. The workspace has no HTTP server crate, and a scrape endpoint
//! needs no more than this.
//!
//! Why a poll loop rather than a connection at a time: an idle connection must not hold up a
//! scrape. At most [`MAX_CONNECTIONS`] are held; a new one past that closes the oldest, so a
//! flood of idle connections costs each of them its place, never the scraper that just
//! arrived and sends its request at once.

use crate::{text, MetricsError, CONTENT_TYPE};
use nix::poll::{PollFd, PollFlags, PollTimeout};
use std::io::{ErrorKind, Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::os::fd::AsFd;
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest request head read, bytes: a scraper's request is a few hundred; past this the
/// connection gets 431 and is closed.
pub const MAX_REQUEST_BYTES: usize = 8 << 10;
/// Longest a connection may stay open, from its accept to the last byte of the answer (one
/// deadline for the whole exchange, not per read); past this it is closed.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);
/// Connections held open at once. A connection accepted past this closes the oldest held one
/// (the one nearest its deadline), so idle connections cannot lock a scraper out.
pub const MAX_CONNECTIONS: usize = 64;
/// Longest one poll waits, so that a stopped server's thread ends this soon.
const POLL_MAX: Duration = Duration::from_millis(100);

/// A running endpoint; stopped (its thread joined) when dropped.
#[derive(Debug)]
pub struct MetricsServer {
    addr: SocketAddr,
    stop: Arc<AtomicBool>,
    thread: Option<JoinHandle<()>>,
}

impl MetricsServer {
    /// Listens on `addr` and serves `GET /metrics` from a thread of its own. A non-loopback
    /// address is logged as a warning: the metrics name peers, paths and findings of this
    /// machine, with no authentication (docs/metrics.md, "Security"). Errors:
    /// [`MetricsError::Bind`].
    pub fn bind(addr: SocketAddr) -> Result<MetricsServer, MetricsError> {
        let listener =
            TcpListener::bind(addr).map_err(|source| MetricsError::Bind { addr, source })?;
        let addr = listener
            .local_addr()
            .map_err(|source| MetricsError::Bind { addr, source })?;
        listener
            .set_nonblocking(true)
            .map_err(|source| MetricsError::Bind { addr, source })?;
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "metrics served on a non-loopback address, without authentication: anyone who reaches it reads this machine's peers, paths and findings");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gdpath-metrics".into())
            .spawn(move || serve(&listener, &flag))
            .map_err(|source| MetricsError::Bind { addr, source })?;
        Ok(MetricsServer {
            addr,
            stop,
            thread: Some(thread),
        })
    }

    /// The address it listens on (the port chosen, for port 0).
    pub fn local_addr(&self) -> SocketAddr {
        self.addr
    }
}

impl Drop for MetricsServer {
    fn drop(&mut self) {
        self.stop.store(true, Ordering::Release);
        // The loop sees the flag within one poll (POLL_MAX).
        if let Some(t) = self.thread.take() {
            let _ = t.join();
        }
    }
}

/// One open connection: reading its head, then writing its answer.
struct Conn {
    stream: TcpStream,
    deadline: Instant,
    head: Vec<u8>,
    /// The answer once the head is complete, and how much of it is written.
    out: Option<(Vec<u8>, usize)>,
    /// The answer is written: what the client still sends (pipelined requests) is read and
    /// dropped until it closes, because closing a socket with unread input resets it and can
    /// lose the answer on its way.
    draining: bool,
}

/// What to do with a connection after it was served a poll event.
enum Next {
    Keep,
    Close,
}

/// The server's loop: accept, read heads, write answers, close what is done or late, until
/// `stop` is set.
fn serve(listener: &TcpListener, stop: &AtomicBool) {
    let mut conns: Vec<Conn> = Vec::with_capacity(MAX_CONNECTIONS);
    while !stop.load(Ordering::Acquire) {
        let now = Instant::now();
        conns.retain(|c| c.deadline > now);
        let timeout = conns
            .iter()
            .map(|c| c.deadline.saturating_duration_since(now))
            .min()
            .unwrap_or(POLL_MAX)
            .min(POLL_MAX);
        let (accept, ready) = match poll(listener, &conns, timeout) {
            Ok(r) => r,
            Err(e) => {
                tracing::debug!(error = %e, "metrics poll failed");
                std::thread::sleep(POLL_MAX);
                continue;
            }
        };
        // Served before accepting, so the indices still hold.
        let mut done = Vec::new();
        for i in ready {
            if let Next::Close = step(&mut conns[i]) {
                done.push(i);
            }
        }
        for i in done.into_iter().rev() {
            conns.swap_remove(i);
        }
        if accept {
            accept_all(listener, &mut conns);
        }
    }
}

/// Polls the listener and every connection: (a connection to accept, the connections with
/// something to read or write or that ended).
fn poll(
    listener: &TcpListener,
    conns: &[Conn],
    timeout: Duration,
) -> nix::Result<(bool, Vec<usize>)> {
    let mut fds = Vec::with_capacity(conns.len() + 1);
    fds.push(PollFd::new(listener.as_fd(), PollFlags::POLLIN));
    for c in conns {
        let ev = if c.out.is_some() && !c.draining {
            PollFlags::POLLOUT
        } else {
            PollFlags::POLLIN
        };
        fds.push(PollFd::new(c.stream.as_fd(), ev));
    }
    let t = PollTimeout::try_from(timeout).unwrap_or(PollTimeout::MAX);
    match nix::poll::poll(&mut fds, t) {
        Ok(_) => {}
        Err(nix::errno::Errno::EINTR) => return Ok((false, Vec::new())),
        Err(e) => return Err(e),
    }
    let hit = |f: &PollFd| f.revents().is_some_and(|r| !r.is_empty());
    let ready = fds[1..]
        .iter()
        .enumerate()
        .filter(|(_, f)| hit(f))
        .map(|(i, _)| i)
        .collect();
    Ok((hit(&fds[0]), ready))
}

/// Accepts every queued connection; past [`MAX_CONNECTIONS`] the oldest held one is closed.
fn accept_all(listener: &TcpListener, conns: &mut Vec<Conn>) {
    loop {
        match listener.accept() {
            Ok((stream, _)) => {
                if stream.set_nonblocking(true).is_err() {
                    continue;
                }
                if conns.len() >= MAX_CONNECTIONS {
                    // All share one timeout, so the earliest deadline is the oldest.
                    if let Some((i, _)) = conns.iter().enumerate().min_by_key(|(_, c)| c.deadline) {
                        conns.swap_remove(i);
                    }
                }
                conns.push(Conn {
                    stream,
                    deadline: Instant::now() + REQUEST_TIMEOUT,
                    head: Vec::with_capacity(512),
                    out: None,
                    draining: false,
                });
            }
            Err(e) if e.kind() == ErrorKind::WouldBlock => return,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            // Out of descriptors and the like: the listener stays readable, so wait rather
            // than spin.
            Err(e) => {
                tracing::debug!(error = %e, "metrics accept failed");
                std::thread::sleep(Duration::from_millis(50));
                return;
            }
        }
    }
}

/// Reads what a connection sent, or writes what is left of its answer.
fn step(c: &mut Conn) -> Next {
    let mut buf = [0u8; 1024];
    if c.draining {
        loop {
            match c.stream.read(&mut buf) {
                Ok(0) => return Next::Close,
                Ok(_) => {}
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Next::Close,
            }
        }
    }
    if let Some((out, sent)) = &mut c.out {
        loop {
            match c.stream.write(&out[*sent..]) {
                Ok(0) => return Next::Close,
                Ok(n) => {
                    *sent += n;
                    if *sent == out.len() {
                        let _ = c.stream.shutdown(Shutdown::Write);
                        c.draining = true;
                        return step(c);
                    }
                }
                Err(e) if e.kind() == ErrorKind::WouldBlock => return Next::Keep,
                Err(e) if e.kind() == ErrorKind::Interrupted => {}
                Err(_) => return Next::Close,
            }
        }
    }
    loop {
        let room = MAX_REQUEST_BYTES
            .saturating_sub(c.head.len())
            .min(buf.len());
        if room == 0 {
            break;
        }
        match c.stream.read(&mut buf[..room]) {
            Ok(0) => return Next::Close,
            Ok(n) => c.head.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::WouldBlock => break,
            Err(e) if e.kind() == ErrorKind::Interrupted => {}
            Err(_) => return Next::Close,
        }
    }
    if let Some((status, body)) = answer(&c.head) {
        c.out = Some((response(status, &body), 0));
        // The answer usually fits the socket's buffer: write it now.
        return step(c);
    }
    Next::Keep
}

/// The answer to a request head read so far, or `None` while more is needed: a request line
/// that is not `METHOD TARGET HTTP/1.x` is 400 as soon as it ends (HTTP/0.9's bare
/// `GET /metrics` included), a head past [`MAX_REQUEST_BYTES`] 431, a complete head routed.
fn answer(head: &[u8]) -> Option<(&'static str, String)> {
    if let Some(end) = head.windows(2).position(|w| w == b"\r\n") {
        let mut parts = head[..end].split(|&b| b == b' ');
        let version = parts.nth(2);
        if parts.next().is_some() || !matches!(version, Some(b"HTTP/1.0" | b"HTTP/1.1")) {
            return Some((
                "400 Bad Request",
                "a request line of HTTP/1.0 or 1.1 is served here\n".into(),
            ));
        }
    }
    if head.windows(4).any(|w| w == b"\r\n\r\n") {
        return Some(route(head));
    }
    if head.len() >= MAX_REQUEST_BYTES {
        return Some(("431 Request Header Fields Too Large", String::new()));
    }
    None
}

/// The whole response for `status` and `body`; always `Connection: close` (one request per
/// connection: bytes pipelined after the first request are not read).
fn response(status: &str, body: &str) -> Vec<u8> {
    let content_type = if status.starts_with("200") {
        CONTENT_TYPE
    } else {
        "text/plain; charset=utf-8"
    };
    let allow = if status.starts_with("405") {
        "Allow: GET\r\n"
    } else {
        ""
    };
    format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    )
    .into_bytes()
}

/// The status and body for a request head: `GET /metrics` (with or without a query) is the
/// metrics, any other target 404, any other method 405.
fn route(head: &[u8]) -> (&'static str, String) {
    let line = head.split(|&b| b == b'\r').next().unwrap_or_default();
    let mut parts = line.split(|&b| b == b' ');
    let (method, target) = (
        parts.next().unwrap_or_default(),
        parts.next().unwrap_or_default(),
    );
    let path = target.split(|&b| b == b'?').next().unwrap_or_default();
    match (method, path) {
        (b"GET", b"/metrics") => match text() {
            Ok(t) => ("200 OK", t),
            Err(e) => ("500 Internal Server Error", format!("{e}\n")),
        },
        (b"GET", _) => ("404 Not Found", "only /metrics is served here\n".into()),
        _ => ("405 Method Not Allowed", "only GET is served here\n".into()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(route(b"GET /metrics HTTP/1.1\r\n\r\n").0, "200 OK");
        assert_eq!(route(b"GET /metrics?x=1 HTTP/1.1\r\n\r\n").0, "200 OK");
        assert_eq!(route(b"GET / HTTP/1.1\r\n\r\n").0, "404 Not Found");
        assert_eq!(
            route(b"POST /metrics HTTP/1.1\r\n\r\n").0,
            "405 Method Not Allowed"
        );
        assert_eq!(route(b"\r\n\r\n").0, "405 Method Not Allowed");
    }

    #[test]
    fn request_lines_that_are_not_http_1_are_refused_when_they_end() {
        assert_eq!(answer(b"GET /metrics\r\n").unwrap().0, "400 Bad Request");
        assert_eq!(
            answer(b"GET /metrics HTTP/2.0\r\n").unwrap().0,
            "400 Bad Request"
        );
        assert_eq!(
            answer(b"GET /a b HTTP/1.1\r\n").unwrap().0,
            "400 Bad Request"
        );
        assert!(answer(b"GET /metrics HTTP/1.1\r\nHost: x\r\n").is_none());
        assert!(answer(b"GET /metr").is_none());
        assert_eq!(
            answer(&[b'a'; MAX_REQUEST_BYTES]).unwrap().0,
            "431 Request Header Fields Too Large"
        );
    }
}
