//! The `/metrics` endpoint against hostile clients over real TCP: a flood of idle connections
//! must not hold up a scrape, and malformed, oversized, pipelined and rapid-fire requests get
//! a bounded answer (or a close) without stopping the endpoint.

use gdpath_metrics::{MetricsServer, MAX_CONNECTIONS, REQUEST_TIMEOUT};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpStream};
use std::time::{Duration, Instant};

fn server() -> MetricsServer {
    MetricsServer::bind("127.0.0.1:0".parse().unwrap()).unwrap()
}

/// Sends `request` and returns the whole answer and how long it took.
fn exchange(addr: SocketAddr, request: &[u8]) -> (String, Duration) {
    let t0 = Instant::now();
    let mut s = TcpStream::connect(addr).unwrap();
    s.set_read_timeout(Some(Duration::from_secs(10))).unwrap();
    let _ = s.write_all(request);
    let mut out = Vec::new();
    let _ = s.read_to_end(&mut out);
    (String::from_utf8_lossy(&out).into_owned(), t0.elapsed())
}

fn scrape(addr: SocketAddr) -> (String, Duration) {
    exchange(addr, b"GET /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
}

/// Lets this process hold a few thousand descriptors (the soft limit is often 1,024).
fn raise_fd_limit() {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    let _ = setrlimit(Resource::RLIMIT_NOFILE, hard.min(8192), hard);
}

#[test]
fn a_thousand_idle_connections_do_not_hold_up_a_scrape() {
    raise_fd_limit();
    let m = server();
    let addr = m.local_addr();
    const _: () = assert!(MAX_CONNECTIONS < 1000, "the test must overflow the bound");
    let idle: Vec<TcpStream> = (0..1000)
        .map(|_| TcpStream::connect(addr).unwrap())
        .collect();
    // Give the endpoint time to accept them all, so they are held when the scrape comes.
    std::thread::sleep(Duration::from_millis(200));
    let (answer, took) = scrape(addr);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer:?}");
    assert!(took < Duration::from_secs(1), "scrape took {took:?}");
    // More than MAX_CONNECTIONS were opened, so the oldest were closed; the newest is still
    // held and answered when it sends its request within its deadline.
    let mut last = idle.into_iter().last().unwrap();
    last.set_read_timeout(Some(Duration::from_secs(5))).unwrap();
    last.write_all(b"GET /metrics HTTP/1.1\r\n\r\n").unwrap();
    let mut out = Vec::new();
    let _ = last.read_to_end(&mut out);
    assert!(
        out.starts_with(b"HTTP/1.1 200 OK"),
        "{:?}",
        String::from_utf8_lossy(&out)
    );
}

#[test]
fn malformed_requests_get_a_bounded_answer() {
    let m = server();
    let addr = m.local_addr();
    let cases: [(&[u8], &str); 6] = [
        // HTTP/0.9: no version, no headers; answered when the line ends, not at the deadline.
        (b"GET /metrics\r\n", "HTTP/1.1 400 "),
        (b"GET /../metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 404 "),
        (b"GET /metrics/../metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 404 "),
        (b"GET /metrics?x HTTP/1.1\r\n\r\n", "HTTP/1.1 200 "),
        (b"DELETE /metrics HTTP/1.1\r\n\r\n", "HTTP/1.1 405 "),
        (b"\x00\xff\xfe garbage\r\n\r\n", "HTTP/1.1 400 "),
    ];
    for (req, want) in cases {
        let (answer, took) = exchange(addr, req);
        assert!(answer.starts_with(want), "{req:?}: {answer:?}");
        assert!(took < Duration::from_secs(1), "{req:?} took {took:?}");
    }
    // A head of a megabyte of headers: 431 after 8 KiB, the rest never read.
    let mut huge = b"GET /metrics HTTP/1.1\r\n".to_vec();
    huge.extend(
        std::iter::repeat_n(
            b"X-A: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa\r\n".as_slice(),
            1 << 15,
        )
        .flatten(),
    );
    let (answer, _) = exchange(addr, &huge);
    assert!(answer.starts_with("HTTP/1.1 431 "), "{answer:?}");
}

#[test]
fn pipelined_requests_get_the_first_answer_whole() {
    let m = server();
    let req = b"GET /metrics HTTP/1.1\r\n\r\n".repeat(50);
    let (answer, _) = exchange(m.local_addr(), &req);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer:?}");
    let (head, body) = answer.split_once("\r\n\r\n").unwrap();
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("Content-Length: "))
        .unwrap()
        .parse()
        .unwrap();
    // One answer, whole, and nothing after it (Connection: close).
    assert_eq!(body.len(), len);
}

#[test]
fn ten_thousand_connections_opened_and_closed_leave_the_endpoint_serving() {
    let m = server();
    let addr = m.local_addr();
    for i in 0..10_000 {
        let mut s = TcpStream::connect(addr).unwrap();
        if i % 2 == 0 {
            let _ = s.write_all(b"GET /met");
        }
        drop(s);
    }
    let (answer, took) = scrape(addr);
    assert!(answer.starts_with("HTTP/1.1 200 OK"), "{answer:?}");
    assert!(took < REQUEST_TIMEOUT, "scrape took {took:?}");
}
