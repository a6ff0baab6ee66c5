//! The control connection's framing: codec frames over a TCP stream gdpath owns (the handshake,
//! then the connection's liveness). A frame's header is checked, and its body length bounded,
//! before anything is allocated for the body ([`codec::body_len`]); a reader never holds more
//! than one frame.

use crate::net::codec::{self, DecodeError, HEADER_LEN};
use std::io::{self, Read, Write};
use std::net::TcpStream;
use std::time::{Duration, Instant};

/// Largest frame body a server reads from a connection: an `Auth` with the longest name and
/// worker address the codec allows fits, with room to spare; anything longer is refused from
/// its header.
pub(crate) const MAX_SERVER_READ: usize = 2 * codec::MAX_WORKER_ADDRESS;

/// Why no frame came.
#[derive(Debug)]
pub(crate) enum ReadError {
    /// The peer closed its end (orderly or by reset).
    Closed(String),
    /// The bytes are not a frame this side accepts (header refused, body over the bound).
    Bad(DecodeError),
    /// Another I/O error, or (blocking reads) the deadline passed.
    Io(io::Error),
}

impl std::fmt::Display for ReadError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            ReadError::Closed(how) => write!(f, "the peer closed the control connection ({how})"),
            ReadError::Bad(e) => write!(f, "{e}"),
            ReadError::Io(e) => write!(f, "{e}"),
        }
    }
}

/// Reads whole frames from a stream, in pieces as they arrive.
#[derive(Debug)]
pub(crate) struct FrameReader {
    head: [u8; HEADER_LEN],
    /// Header bytes read so far.
    got: usize,
    /// The frame (header included) once its header was accepted, filled up to its length.
    frame: Option<(Vec<u8>, usize)>,
    /// Longest body accepted.
    max: usize,
}

impl FrameReader {
    /// A reader accepting bodies of at most `max` bytes (and at most the codec's limit).
    pub(crate) fn new(max: usize) -> Self {
        FrameReader {
            head: [0; HEADER_LEN],
            got: 0,
            frame: None,
            max,
        }
    }

    /// Reads what `s` has: `Ok(Some(frame))` once a whole frame (header and body) arrived,
    /// `Ok(None)` when more must come first (a non-blocking stream would block). A zero-length
    /// read is [`ReadError::Closed`].
    pub(crate) fn read(&mut self, s: &mut impl Read) -> Result<Option<Vec<u8>>, ReadError> {
        loop {
            if let Some((buf, filled)) = self.frame.as_mut() {
                if *filled == buf.len() {
                    let (buf, _) = self.frame.take().expect("checked");
                    self.got = 0;
                    return Ok(Some(buf));
                }
                match s.read(&mut buf[*filled..]) {
                    Ok(0) => return Err(ReadError::Closed("end of stream".into())),
                    Ok(n) => *filled += n,
                    Err(e) => return Self::would_block(e),
                }
                continue;
            }
            match s.read(&mut self.head[self.got..]) {
                Ok(0) => return Err(ReadError::Closed("end of stream".into())),
                Ok(n) => self.got += n,
                Err(e) => return Self::would_block(e),
            }
            if self.got == HEADER_LEN {
                let body = codec::body_len(&self.head, self.max).map_err(ReadError::Bad)?;
                let mut buf = vec![0u8; HEADER_LEN + body];
                buf[..HEADER_LEN].copy_from_slice(&self.head);
                self.frame = Some((buf, HEADER_LEN));
            }
        }
    }

    fn would_block(e: io::Error) -> Result<Option<Vec<u8>>, ReadError> {
        match e.kind() {
            io::ErrorKind::WouldBlock => Ok(None),
            io::ErrorKind::Interrupted => Ok(None),
            io::ErrorKind::ConnectionReset | io::ErrorKind::ConnectionAborted => {
                Err(ReadError::Closed(e.to_string()))
            }
            _ => Err(ReadError::Io(e)),
        }
    }
}

/// The time left until `deadline` (none: no bound), or a timed-out error once it passed.
fn left(deadline: Option<Instant>) -> io::Result<Option<Duration>> {
    match deadline {
        None => Ok(None),
        Some(d) => match d.checked_duration_since(Instant::now()) {
            Some(t) if !t.is_zero() => Ok(Some(t)),
            _ => Err(io::Error::new(io::ErrorKind::TimedOut, "no answer in time")),
        },
    }
}

/// Reads one frame from blocking stream `s` before `deadline`.
pub(crate) fn read_frame(
    s: &mut TcpStream,
    reader: &mut FrameReader,
    deadline: Option<Instant>,
) -> Result<Vec<u8>, ReadError> {
    loop {
        s.set_read_timeout(left(deadline).map_err(ReadError::Io)?)
            .map_err(ReadError::Io)?;
        match reader.read(s) {
            Ok(Some(f)) => return Ok(f),
            // The read timed out (WouldBlock on a socket with a read timeout): check the time.
            Ok(None) => continue,
            Err(e) => return Err(e),
        }
    }
}

/// Writes all of `bytes` to blocking stream `s` before `deadline`.
pub(crate) fn write_frame(
    s: &mut TcpStream,
    bytes: &[u8],
    deadline: Option<Instant>,
) -> io::Result<()> {
    s.set_write_timeout(left(deadline)?)?;
    s.write_all(bytes)
}

/// Writes what it can of `out` to non-blocking stream `s`, keeping the rest. Errors: the
/// stream failed.
pub(crate) fn write_some(s: &mut TcpStream, out: &mut Vec<u8>) -> io::Result<()> {
    while !out.is_empty() {
        match s.write(out) {
            Ok(0) => return Err(io::ErrorKind::WriteZero.into()),
            Ok(n) => {
                out.drain(..n);
            }
            Err(e) if e.kind() == io::ErrorKind::WouldBlock => return Ok(()),
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::net::codec::{encode, Message};

    /// A reader over chunks, as a non-blocking stream delivers them, `WouldBlock` between.
    struct Chunks(Vec<Vec<u8>>, bool);
    impl Read for Chunks {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            if self.1 {
                self.1 = false;
                return Err(io::ErrorKind::WouldBlock.into());
            }
            self.1 = true;
            let Some(c) = self.0.first_mut() else {
                return Ok(0);
            };
            let n = c.len().min(buf.len());
            buf[..n].copy_from_slice(&c[..n]);
            c.drain(..n);
            if c.is_empty() {
                self.0.remove(0);
            }
            Ok(n)
        }
    }

    #[test]
    fn frames_come_whole_from_pieces_and_a_huge_length_is_refused_first() {
        let a = encode(&Message::Notify(b"hello".to_vec())).unwrap();
        let b = encode(&Message::Bye).unwrap();
        let mut bytes = a.clone();
        bytes.extend_from_slice(&b);
        // One byte at a time, with a would-block between each.
        let mut s = Chunks(bytes.iter().map(|&x| vec![x]).collect(), false);
        let mut r = FrameReader::new(1024);
        let mut got = Vec::new();
        loop {
            match r.read(&mut s) {
                Ok(Some(f)) => got.push(f),
                Ok(None) => {}
                Err(ReadError::Closed(_)) => break,
                Err(e) => panic!("{e}"),
            }
        }
        assert_eq!(got, [a, b]);
        // A header claiming 4 GiB: refused before any body is read or allocated.
        let mut huge = encode(&Message::Bye).unwrap();
        huge[8..12].copy_from_slice(&u32::MAX.to_le_bytes());
        let mut s = Chunks(vec![huge], false);
        let mut r = FrameReader::new(1024);
        loop {
            match r.read(&mut s) {
                Ok(None) => continue,
                Err(ReadError::Bad(DecodeError::TooLarge { .. })) => break,
                other => panic!("{other:?}"),
            }
        }
        // Garbage: refused by its magic once the header's 12 bytes are in.
        let mut s = Chunks(vec![vec![0xff; 16]], false);
        let mut r = FrameReader::new(1024);
        loop {
            match r.read(&mut s) {
                Ok(None) => continue,
                Err(ReadError::Bad(DecodeError::BadMagic(_))) => break,
                other => panic!("{other:?}"),
            }
        }
    }
}
