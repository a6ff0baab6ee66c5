//! A `/metrics` endpoint over HTTP/1.1, on std's TCP listener: one thread, one request per
//! connection, bounded in size and time, `GET /metrics` only. The workspace has no HTTP
//! server crate, and a scrape endpoint needs no more than this.

use crate::{text, MetricsError, CONTENT_TYPE};
use std::io::{Read, Write};
use std::net::{Shutdown, SocketAddr, TcpListener, TcpStream};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::Arc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

/// Largest request head read, bytes: a scraper's request is a few hundred; past this the
/// connection gets 431 and is closed.
pub const MAX_REQUEST_BYTES: usize = 8 << 10;
/// Longest a connection may take to send its request head and take the answer; past this it
/// is closed. Connections are served one at a time, so this bounds how long one client can
/// hold up the next.
pub const REQUEST_TIMEOUT: Duration = Duration::from_secs(2);

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
        if !addr.ip().is_loopback() {
            tracing::warn!(%addr, "metrics served on a non-loopback address, without authentication: anyone who reaches it reads this machine's peers, paths and findings");
        }
        let stop = Arc::new(AtomicBool::new(false));
        let flag = stop.clone();
        let thread = std::thread::Builder::new()
            .name("gdpath-metrics".into())
            .spawn(move || {
                for conn in listener.incoming() {
                    if flag.load(Ordering::Acquire) {
                        break;
                    }
                    match conn {
                        Ok(s) => {
                            if let Err(e) = serve_one(s) {
                                tracing::debug!(error = %e, "metrics request dropped");
                            }
                        }
                        // Out of descriptors and the like: wait rather than spin.
                        Err(e) => {
                            tracing::debug!(error = %e, "metrics accept failed");
                            std::thread::sleep(Duration::from_millis(50));
                        }
                    }
                }
            })
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
        // Wakes the accept; if the connection fails the thread is left to the process's end
        // rather than waited for.
        let woke = TcpStream::connect_timeout(&wake_addr(self.addr), REQUEST_TIMEOUT).is_ok();
        if let (true, Some(t)) = (woke, self.thread.take()) {
            let _ = t.join();
        }
    }
}

/// Where to connect to wake a listener bound to `addr` (a wildcard address through loopback).
fn wake_addr(addr: SocketAddr) -> SocketAddr {
    let mut a = addr;
    if a.ip().is_unspecified() {
        a.set_ip(match a {
            SocketAddr::V4(_) => std::net::Ipv4Addr::LOCALHOST.into(),
            SocketAddr::V6(_) => std::net::Ipv6Addr::LOCALHOST.into(),
        });
    }
    a
}

/// Reads one request head and answers it.
fn serve_one(mut s: TcpStream) -> std::io::Result<()> {
    let deadline = Instant::now() + REQUEST_TIMEOUT;
    s.set_write_timeout(Some(REQUEST_TIMEOUT))?;
    let mut head = Vec::with_capacity(512);
    let mut buf = [0u8; 1024];
    let complete = loop {
        if head.windows(4).any(|w| w == b"\r\n\r\n") {
            break true;
        }
        if head.len() >= MAX_REQUEST_BYTES {
            break false;
        }
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Err(std::io::ErrorKind::TimedOut.into());
        }
        s.set_read_timeout(Some(left))?;
        let n = s.read(&mut buf)?;
        if n == 0 {
            return Err(std::io::ErrorKind::UnexpectedEof.into());
        }
        head.extend_from_slice(&buf[..n]);
    };
    let (status, body) = if complete {
        route(&head)
    } else {
        ("431 Request Header Fields Too Large", String::new())
    };
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
    let response = format!(
        "HTTP/1.1 {status}\r\nContent-Type: {content_type}\r\nContent-Length: {}\r\n{allow}Connection: close\r\n\r\n{body}",
        body.len()
    );
    s.write_all(response.as_bytes())?;
    let _ = s.shutdown(Shutdown::Write);
    Ok(())
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
}
