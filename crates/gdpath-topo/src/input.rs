//! Bounds on what the readers accept, and the bounded reads that enforce them.
//!
//! Every input is untrusted: a topology file may be `/dev/zero`, a FIFO without a writer, 50,000
//! nested elements or a million GPUs. Each reader therefore reads through [`Bounded`] (a size
//! cap, and a stall limit for pipes that stop delivering), opens regular files only, by their
//! type ([`open`]: `stat` before the open, so a device is never opened and a FIFO never
//! blocks, then a non-blocking open and `fstat` of the descriptor), and checks the device
//! counts below before any work that grows with the square of them. The limits, and why each is far
//! above any real machine, are in docs/topology.md ("Input limits").

use std::io::{self, Read};
use std::path::Path;
use std::time::{Duration, Instant};

/// Largest topology file read (hwloc XML, NCCL XML, `nvidia-smi topo -m` text): 32 MiB. hwloc's
/// export of a 2-socket, 384-thread server is about 0.5 MB and NCCL files are a few KB; the cap
/// also bounds the parsed tree (at most a few hundred MB for a hostile file of this size).
pub const MAX_TOPOLOGY_FILE_BYTES: u64 = 32 << 20;

/// Largest single sysfs or procfs file read through a [`crate::DirView`] (16 MiB, the same as a
/// snapshot's largest entry): sysfs attributes are at most a page, `config` 4 KiB.
pub const MAX_SYSFS_FILE_BYTES: u64 = 16 << 20;

/// Largest snapshot file read (compressed): 512 MiB, the limit its entries may unpack to.
pub const MAX_SNAPSHOT_FILE_BYTES: u64 = 512 << 20;

/// Deepest XML element nesting accepted: 256. hwloc nests Machine → Package → caches → Core →
/// PU (under 16 levels) with the PCI tree beside it, NCCL nests `<system>` → `<cpu>` → `<pci>`
/// per bridge; a real machine's PCI tree is fewer than 32 bridges deep.
pub const MAX_XML_DEPTH: usize = 256;

/// Most XML nodes (elements, text, comments) parsed from one file: 2²¹ (about 2 million); a
/// large hwloc export has tens of thousands.
pub const MAX_XML_NODES: u32 = 1 << 21;

/// Most PCI functions in one machine: 65,536 (every function of one PCI domain; real servers,
/// SR-IOV virtual functions included, have a few thousand).
pub const MAX_PCI_FUNCTIONS: usize = 65_536;

/// Most devices of the pair matrix (GPUs, NICs and NVMe together): 4,096. The matrix, nearest
/// devices and ACS checks grow with the square of this count; an 8-GPU server with one NIC per
/// GPU and SR-IOV functions has a few hundred.
pub const MAX_MATRIX_DEVICES: usize = 4096;

/// Most GPUs, NICs and NVMe whose pairs are listed one by one: 256. Up to it `gdpath topo`
/// prints the pair matrix (text, and `matrix` in `--json`); past it the pairs are counted per
/// class instead ([`crate::Machine::pair_counts`], `pair_classes` in `--json`) with a line
/// saying why, so that what is printed grows with the devices, not with their square. The
/// largest single-node machines have a few dozen (AWS p5.48xlarge: 8 GPUs, 32 EFA NICs and 8
/// NVMe; DGX-2: 16 GPUs and 10 NICs); 256 leaves room for SR-IOV virtual functions, and a full
/// matrix of it is 65,536 cells (about 0.4 MB of text).
pub const MAX_LISTED_PAIR_DEVICES: usize = 256;

/// Most GPUs joined through NVSwitches whose pairs are each recorded as an NVLink bond: 256.
/// A GPU's links to a switch join it to every other GPU on a switch, so the bonds grow with the
/// square of these GPUs; an NVSwitch node has 8 (HGX) or 16 (DGX-2) GPUs, and an NVL72 rack
/// shows 4 to each operating system. Past it NVLink is left unknown, with the reason
/// ([`crate::Coverage::nvlink`]), rather than recorded pair by pair.
pub const MAX_NVSWITCH_GPUS: usize = 256;

/// How long a read may wait for a pipe or FIFO that delivers nothing before it fails: 30 s.
pub const STALL_LIMIT: Duration = Duration::from_secs(30);

/// A byte count for messages: `32 MiB (33554432 bytes)`, or `1000 bytes`.
pub fn size_text(bytes: u64) -> String {
    if bytes >= 1 << 20 && bytes % (1 << 20) == 0 {
        format!("{} MiB ({bytes} bytes)", bytes >> 20)
    } else {
        format!("{bytes} bytes")
    }
}

/// Why a bounded read stopped: carried inside an [`io::Error`] (find it with [`limit_of`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
pub enum ReadLimit {
    /// More than `limit` bytes.
    #[error("larger than {limit} bytes")]
    TooLarge {
        /// The most bytes the read accepts.
        limit: u64,
    },
    /// No data for `seconds` seconds from a pipe or FIFO that is still open.
    #[error("no data for {seconds} s")]
    Stalled {
        /// How long the read waited for data, seconds.
        seconds: u64,
    },
}

/// The [`ReadLimit`] an error (or one of its sources) carries, if any.
pub fn limit_of(err: &(dyn std::error::Error + 'static)) -> Option<ReadLimit> {
    let mut cur: Option<&(dyn std::error::Error + 'static)> = Some(err);
    while let Some(e) = cur {
        if let Some(l) = e.downcast_ref::<ReadLimit>() {
            return Some(*l);
        }
        if let Some(io) = e.downcast_ref::<io::Error>() {
            if let Some(l) = io.get_ref().and_then(|i| i.downcast_ref::<ReadLimit>()) {
                return Some(*l);
            }
        }
        cur = e.source();
    }
    None
}

/// A reader that fails past `limit` bytes, and that waits at most [`STALL_LIMIT`] for a
/// non-blocking source (a FIFO opened with [`open`]) that has no data yet.
#[derive(Debug)]
pub struct Bounded<R> {
    inner: R,
    limit: u64,
    read: u64,
    stall: Duration,
}

impl<R: Read> Bounded<R> {
    /// Reads at most `limit` bytes of `inner`.
    pub fn new(inner: R, limit: u64) -> Self {
        Bounded {
            inner,
            limit,
            read: 0,
            stall: STALL_LIMIT,
        }
    }

    /// The same reader with another stall limit (tests use a short one).
    pub fn with_stall(mut self, stall: Duration) -> Self {
        self.stall = stall;
        self
    }
}

impl<R: Read> Read for Bounded<R> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        if buf.is_empty() {
            return Ok(0);
        }
        // One byte past the limit is allowed in, so that "exactly the limit" still ends cleanly.
        let room = (self.limit + 1).saturating_sub(self.read);
        let want = buf.len().min(usize::try_from(room).unwrap_or(usize::MAX));
        if want == 0 {
            return Err(too_large(self.limit));
        }
        let start = Instant::now();
        loop {
            match self.inner.read(&mut buf[..want]) {
                Ok(n) => {
                    self.read += n as u64;
                    if self.read > self.limit {
                        return Err(too_large(self.limit));
                    }
                    return Ok(n);
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    if start.elapsed() >= self.stall {
                        return Err(io::Error::new(
                            io::ErrorKind::TimedOut,
                            ReadLimit::Stalled {
                                seconds: self.stall.as_secs(),
                            },
                        ));
                    }
                    std::thread::sleep(Duration::from_millis(10));
                }
                Err(e) => return Err(e),
            }
        }
    }
}

fn too_large(limit: u64) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidData, ReadLimit::TooLarge { limit })
}

/// What a file that is not a regular file is ("a directory", "a block device", "a character
/// device", "a FIFO", "a socket", "a special file"); `None` for a regular file. The one
/// classification of gdpath's file inputs and outputs (the engine's `gdpath::file` uses it).
pub fn special_kind(md: &std::fs::Metadata) -> Option<&'static str> {
    use std::os::unix::fs::FileTypeExt;
    let ft = md.file_type();
    if ft.is_file() {
        None
    } else if ft.is_dir() {
        Some("a directory")
    } else if ft.is_block_device() {
        Some("a block device")
    } else if ft.is_char_device() {
        Some("a character device")
    } else if ft.is_fifo() {
        Some("a FIFO")
    } else if ft.is_socket() {
        Some("a socket")
    } else {
        Some("a special file")
    }
}

/// A file of the wrong type, as the I/O error [`open`] returns (kind `InvalidInput`).
#[derive(Debug, Clone, Copy, PartialEq, Eq, thiserror::Error)]
#[error("{what}, not a regular file")]
pub struct NotRegular {
    /// What it is, as [`special_kind`] names it.
    pub what: &'static str,
}

/// Opens the regular file `path` for reading. What is not a regular file is refused by its
/// type before it is opened (`stat`, following symbolic links: a device is never opened, a FIFO
/// never waits for a writer), and again on the open descriptor (`fstat`: a FIFO swapped in
/// between cannot block either, since the open is `O_NONBLOCK | O_NOCTTY`).
///
/// Errors: the OS error of `stat` or `open`; [`NotRegular`] inside an
/// [`io::ErrorKind::InvalidInput`] error for a directory, device, FIFO or socket.
pub fn open(path: &Path) -> io::Result<std::fs::File> {
    use std::os::unix::fs::OpenOptionsExt;
    let refuse = |md: &std::fs::Metadata| match special_kind(md) {
        None => Ok(()),
        Some(what) => Err(io::Error::new(
            io::ErrorKind::InvalidInput,
            NotRegular { what },
        )),
    };
    refuse(&std::fs::metadata(path)?)?;
    let f = std::fs::OpenOptions::new()
        .read(true)
        .custom_flags(libc::O_NONBLOCK | libc::O_NOCTTY)
        .open(path)?;
    refuse(&f.metadata()?)?;
    Ok(f)
}

/// The whole of `path`, at most `limit` bytes ([`ReadLimit`] inside the error past that).
pub fn read_limited(path: &Path, limit: u64) -> io::Result<Vec<u8>> {
    let file = open(path)?;
    let hint = file
        .metadata()
        .ok()
        .filter(|m| m.is_file())
        .map_or(0, |m| m.len().min(limit) as usize);
    let mut data = Vec::with_capacity(hint);
    Bounded::new(file, limit).read_to_end(&mut data)?;
    Ok(data)
}

/// A topology file as UTF-8 text, at most [`MAX_TOPOLOGY_FILE_BYTES`]. Errors:
/// [`crate::TopoError::TooLarge`], [`crate::TopoError::Stalled`], or [`crate::TopoError::Io`]
/// (unreadable, not UTF-8), each naming the file.
pub(crate) fn read_topology_text(path: &Path) -> Result<String, crate::TopoError> {
    let data = read_limited(path, MAX_TOPOLOGY_FILE_BYTES).map_err(|e| io_error(path, e))?;
    String::from_utf8(data).map_err(|e| crate::TopoError::Io {
        path: path.to_owned(),
        source: io::Error::new(io::ErrorKind::InvalidData, format!("not UTF-8 text ({e})")),
    })
}

/// [`crate::TopoError`] for a failed read of `path`: the typed limit when one was hit.
pub(crate) fn io_error(path: &Path, e: io::Error) -> crate::TopoError {
    match limit_of(&e) {
        Some(ReadLimit::TooLarge { limit }) => crate::TopoError::TooLarge {
            path: path.to_owned(),
            limit_bytes: limit,
        },
        Some(ReadLimit::Stalled { seconds }) => crate::TopoError::Stalled {
            path: path.to_owned(),
            seconds,
        },
        None => crate::TopoError::Io {
            path: path.to_owned(),
            source: e,
        },
    }
}

/// [`crate::TopoError::TooManyDevices`] when a reader of `path` that holds `held` PCI functions
/// would go past [`MAX_PCI_FUNCTIONS`] with one more (checked as they are read, so that a file of
/// millions stops early).
pub(crate) fn check_one_more_function(held: usize, path: &Path) -> Result<(), crate::TopoError> {
    if held < MAX_PCI_FUNCTIONS {
        return Ok(());
    }
    Err(crate::TopoError::TooManyDevices {
        source_name: crate::text::escape(path),
        what: "PCI functions",
        count: held + 1,
        limit: MAX_PCI_FUNCTIONS,
    })
}

/// [`crate::TopoError::DuplicatePci`] for the first address that `found` holds twice with the
/// same `scope` (for hwloc, the host bridge; `()` where one address anywhere is one function).
/// `found` is in source order; `place(i)` says where the source gives entry `i` (`line 12`),
/// and is asked only for the two entries named in the error. O(n log n).
pub(crate) fn check_unique_pci<K: Ord>(
    found: &[(crate::PciAddr, K)],
    source_name: &str,
    place: impl Fn(usize) -> String,
) -> Result<(), crate::TopoError> {
    let mut order: Vec<usize> = (0..found.len()).collect();
    order.sort_by(|&a, &b| (found[a].0, &found[a].1, a).cmp(&(found[b].0, &found[b].1, b)));
    // The repeat that comes first in the source, with the entry it repeats.
    let repeat = order
        .windows(2)
        .filter(|w| found[w[0]].0 == found[w[1]].0 && found[w[0]].1 == found[w[1]].1)
        .map(|w| (w[0], w[1]))
        .min_by_key(|&(_, second)| second);
    match repeat {
        None => Ok(()),
        Some((first, second)) => Err(crate::TopoError::DuplicatePci {
            source_name: source_name.to_owned(),
            pci: found[first].0,
            first: place(first),
            second: place(second),
        }),
    }
}

/// Checks a reader's device counts against [`MAX_PCI_FUNCTIONS`] and [`MAX_MATRIX_DEVICES`]
/// before any pairwise work. `what` names the source in the error.
pub(crate) fn check_device_counts(
    devices: &[crate::Device],
    what: &str,
) -> Result<(), crate::TopoError> {
    use crate::DeviceKind::{Gpu, Nic, Nvme};
    if devices.len() > MAX_PCI_FUNCTIONS {
        return Err(crate::TopoError::TooManyDevices {
            source_name: what.to_owned(),
            what: "PCI functions",
            count: devices.len(),
            limit: MAX_PCI_FUNCTIONS,
        });
    }
    let matrix = devices
        .iter()
        .filter(|d| matches!(d.kind, Gpu | Nic | Nvme))
        .count();
    if matrix > MAX_MATRIX_DEVICES {
        return Err(crate::TopoError::TooManyDevices {
            source_name: what.to_owned(),
            what: "GPUs, NICs and NVMe",
            count: matrix,
            limit: MAX_MATRIX_DEVICES,
        });
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn bounded_stops_one_byte_past_the_limit() {
        let data = [7u8; 100];
        let mut out = Vec::new();
        Bounded::new(&data[..], 100).read_to_end(&mut out).unwrap();
        assert_eq!(out.len(), 100);
        let mut out = Vec::new();
        let err = Bounded::new(&data[..], 99)
            .read_to_end(&mut out)
            .unwrap_err();
        assert_eq!(limit_of(&err), Some(ReadLimit::TooLarge { limit: 99 }));
    }

    #[test]
    fn dev_zero_is_refused_by_its_type() {
        let err = read_limited(Path::new("/dev/zero"), 1 << 20).unwrap_err();
        assert_eq!(err.kind(), io::ErrorKind::InvalidInput);
        let nr = err.get_ref().and_then(|e| e.downcast_ref::<NotRegular>());
        assert_eq!(
            nr,
            Some(&NotRegular {
                what: "a character device"
            })
        );
        assert_eq!(err.to_string(), "a character device, not a regular file");
    }

    #[test]
    fn an_endless_reader_ends_at_the_limit() {
        // What /dev/zero did before it was refused by type: the size cap still holds for any
        // reader.
        let err = Bounded::new(io::repeat(0), 1 << 20)
            .read_to_end(&mut Vec::new())
            .unwrap_err();
        assert_eq!(limit_of(&err), Some(ReadLimit::TooLarge { limit: 1 << 20 }));
    }
}
