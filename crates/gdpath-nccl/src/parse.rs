//! NCCL's log lines, one at a time: the prefix (`host:pid:tid [dev] NCCL INFO`, with or without a
//! launcher's or logger's text before it) and the messages gdpath reads. Every function here is
//! linear in its line and never allocates more than the line; lines are cut at
//! [`crate::Limits::max_line_bytes`] before they reach this module.
//!
//! Formats (NCCL's `src/debug.cc` and the `INFO` calls of `src/transport/*.cc`,
//! `src/transport/net_ib.cc`, `src/init.cc`; see docs/nccl.md for the versions):
//! - prefix `"%s:%d:%d [%d] NCCL INFO "` (host, pid, tid, cudaDev); `NCCL WARN` likewise;
//! - `Ring %02d : %d[%x] -> %d[%x] via …` (2.4; peers without `[…]` for NET in 2.4);
//! - `Channel %02d : %d[%x] -> %d[%x] via …` (2.5–2.11, bus id in brackets) and
//!   `Channel %02d/%d : %d[%d] -> %d[%d] [send|receive] via …` (2.12 on: NVML index);
//! - `via P2P/IPC[/read]`, `P2P/CUMEM[/read]`, `P2P/direct pointer[/read]`, `SHM[/direct/direct]`,
//!   `NET/<name>/<dev>[(<proxy rank>)][/GDRDMA][/Shared]`, `CollNet/…`.

use serde::Serialize;

/// The prefix NCCL writes before a message, as far as it could be read.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Prefix {
    /// Host name as NCCL printed it (`gethostname`, cut at the first dot).
    pub host: Option<String>,
    /// Process id.
    pub pid: Option<u64>,
    /// The CUDA device of the logging thread (`[N]`).
    pub cuda_dev: Option<u32>,
}

/// One line split into prefix and message. `message` is the text after the last
/// `NCCL INFO ` / `NCCL WARN ` marker (lines of several ranks written into one another keep
/// the last one), or the whole line where there is no marker (continuations, quoted lines).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Split<'a> {
    /// The prefix before the message.
    pub prefix: Prefix,
    /// The message text after the NCCL marker.
    pub message: &'a str,
    /// `NCCL WARN` rather than `NCCL INFO`.
    pub warn: bool,
}

/// Splits a line; `None` for text that is no NCCL message (the message is then empty).
pub fn split(line: &str) -> Split<'_> {
    let info = line.rfind("NCCL INFO ");
    let warn = line.rfind("NCCL WARN ");
    let (at, is_warn) = match (info, warn) {
        (Some(i), Some(w)) if w > i => (Some(w), true),
        (Some(i), _) => (Some(i), false),
        (None, Some(w)) => (Some(w), true),
        (None, None) => (None, false),
    };
    let Some(at) = at else {
        return Split {
            prefix: Prefix::default(),
            message: line.trim(),
            warn: false,
        };
    };
    let message = line[at + "NCCL INFO ".len()..].trim();
    Split {
        prefix: prefix(&line[..at]),
        message,
        warn: is_warn,
    }
}

/// Reads `host:pid:tid [dev] ` from the end of `head` (anything before it is a launcher's or
/// logger's: `[1,0]<stdout>:`, a timestamp, `2025-… - INFO - `). A WARN line may carry
/// `file.cc:123 ` between the device and the marker.
fn prefix(head: &str) -> Prefix {
    let head = head.trim_end();
    // The last `[N]` in the head is the device; the word before it is host:pid:tid.
    let Some(close) = head.rfind(']') else {
        return Prefix::default();
    };
    let Some(open) = head[..close].rfind('[') else {
        return Prefix::default();
    };
    let cuda_dev = head[open + 1..close].trim().parse().ok();
    let before = head[..open].trim_end();
    let word = before.rsplit(' ').next().unwrap_or(before);
    // host:pid:tid; the host may itself hold ':' only in odd set-ups, so split from the right.
    let mut parts = word.rsplitn(3, ':');
    let _tid = parts.next();
    let pid = parts.next().and_then(|p| p.parse().ok());
    let host = parts.next().filter(|h| !h.is_empty()).map(|h| {
        // A launcher tag glued to the host (`[1,0]<stdout>:host`) ends at the last '>' or ':'.
        let h = h.rsplit(['>', ':']).next().unwrap_or(h);
        h.to_owned()
    });
    if pid.is_none() {
        return Prefix {
            host: None,
            pid: None,
            cuda_dev,
        };
    }
    Prefix {
        host,
        pid,
        cuda_dev,
    }
}

/// Direction marker of a NET connection line (`[send]`, `[receive]`): which side logged it.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Direction {
    /// `[send]`: the sending rank logged the line.
    Send,
    /// `[receive]`: the receiving rank logged the line.
    Receive,
}

/// A peer as a connection line names it: rank and, where printed, `[x]` (bus id in hex before
/// NCCL 2.12, the NVML/CUDA index after).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct PeerRef {
    /// The rank number.
    pub rank: u32,
    /// The bracketed tag, if printed: bus id in hex before NCCL 2.12, NVML/CUDA index after.
    pub tag: Option<String>,
}

/// One `Ring`/`Channel … via …` line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Connection {
    /// `Ring` (2.4) or `Channel`.
    pub ring_form: bool,
    /// Channel (or ring) number.
    pub channel: u32,
    /// The sending peer.
    pub src: PeerRef,
    /// The receiving peer.
    pub dst: PeerRef,
    /// `[send]` or `[receive]`, on NET lines.
    pub dir: Option<Direction>,
    /// The text after `via `, trimmed.
    pub via: String,
}

/// Parses `Ring NN : a[x] -> b[y] [dir] via T` / `Channel NN[/M] : …`; `None` for anything
/// else (including the ring-order lines `Channel 00 :    0   1   2`).
pub fn connection(msg: &str) -> Option<Connection> {
    let (ring_form, rest) = if let Some(r) = msg.strip_prefix("Ring ") {
        (true, r)
    } else if let Some(r) = msg.strip_prefix("Channel ") {
        (false, r)
    } else {
        return None;
    };
    let (head, rest) = rest.split_once(" : ")?;
    let channel = head.split('/').next()?.trim().parse().ok()?;
    let (pair, via) = rest.split_once(" via ")?;
    let (src, rest) = pair.split_once(" -> ")?;
    let mut words = rest.split_whitespace();
    let dst = words.next()?;
    let dir = match words.next() {
        Some("[send]") => Some(Direction::Send),
        Some("[receive]") => Some(Direction::Receive),
        _ => None,
    };
    let via = via.trim();
    if via.is_empty() {
        return None;
    }
    Some(Connection {
        ring_form,
        channel,
        src: peer(src.trim())?,
        dst: peer(dst)?,
        dir,
        via: via.to_owned(),
    })
}

fn peer(s: &str) -> Option<PeerRef> {
    match s.split_once('[') {
        Some((r, tag)) => Some(PeerRef {
            rank: r.trim().parse().ok()?,
            tag: Some(tag.strip_suffix(']')?.to_owned()).filter(|t| {
                !t.is_empty() && t.len() <= 16 && t.bytes().all(|b| b.is_ascii_hexdigit())
            }),
        }),
        None => Some(PeerRef {
            rank: s.parse().ok()?,
            tag: None,
        }),
    }
}

/// The transport of a `via` text.
#[derive(Debug, Clone, PartialEq, Eq, Serialize)]
#[serde(tag = "kind", rename_all = "lowercase")]
pub enum Transport {
    /// CUDA P2P: `P2P/IPC`, `P2P/CUMEM`, `P2P/direct pointer`, with `/read` where used.
    P2p {
        /// The mode after `P2P/` (`IPC`, `CUMEM`, `direct pointer`).
        mode: String,
        /// `/read`: the receiver reads from the sender's GPU.
        read: bool,
    },
    /// Host shared memory (`SHM`, `SHM/direct/direct`, `SHM/CE`): the intra-node fallback.
    Shm {
        /// The text after `SHM` (`direct/direct`, `CE`), empty for plain `SHM`.
        mode: String,
    },
    /// A network plugin: `NET/IB/0/GDRDMA`, `NET/Socket/1`, `NET/AWS Libfabric/1/GDRDMA`; PXN
    /// lines name the proxy rank in parentheses after the device.
    Net {
        /// The network plugin's name (`IB`, `Socket`, `AWS Libfabric`).
        net: String,
        /// NCCL's device number on it, if printed.
        dev: Option<u32>,
        /// The proxy rank of a PXN line, if any.
        proxy: Option<u32>,
        /// `/GDRDMA`: GPUDirect RDMA is used.
        gdr: bool,
        /// `/Shared`: the connection shares the network resources of another.
        shared: bool,
    },
    /// NCCL's CollNet (SHARP) transport.
    Collnet {
        /// The `via` text.
        text: String,
    },
    /// A transport this reader does not know.
    Other {
        /// The `via` text.
        text: String,
    },
}

impl Transport {
    /// Short class for tables: `P2P`, `SHM`, `NET`, `CollNet`, `?`.
    pub fn class(&self) -> &'static str {
        match self {
            Transport::P2p { .. } => "P2P",
            Transport::Shm { .. } => "SHM",
            Transport::Net { .. } => "NET",
            Transport::Collnet { .. } => "CollNet",
            Transport::Other { .. } => "?",
        }
    }
}

/// Reads a `via` text.
pub fn transport(via: &str) -> Transport {
    if let Some(rest) = via.strip_prefix("P2P/") {
        let read = rest.ends_with("/read");
        let mode = rest.strip_suffix("/read").unwrap_or(rest).to_owned();
        return Transport::P2p { mode, read };
    }
    if via == "SHM" || via.starts_with("SHM/") {
        return Transport::Shm {
            mode: via.strip_prefix("SHM/").unwrap_or("").to_owned(),
        };
    }
    if let Some(rest) = via.strip_prefix("NET/") {
        let mut parts = rest.split('/');
        let net = parts.next().unwrap_or_default().to_owned();
        let devtext = parts.next().unwrap_or_default();
        let (devnum, proxy) = match devtext.split_once('(') {
            Some((d, p)) => (d, p.strip_suffix(')').and_then(|p| p.parse().ok())),
            None => (devtext, None),
        };
        let (mut gdr, mut shared) = (false, false);
        for flag in parts {
            gdr |= flag == "GDRDMA";
            shared |= flag == "Shared";
        }
        return Transport::Net {
            net,
            dev: devnum.parse().ok(),
            proxy,
            gdr,
            shared,
        };
    }
    if via.starts_with("CollNet") {
        return Transport::Collnet {
            text: via.to_owned(),
        };
    }
    Transport::Other {
        text: via.to_owned(),
    }
}

/// `NET/IB : GPU Direct RDMA Disabled for HCA 0 'mlx5_0' (no module)` (2.8 on) or
/// `GPU Direct RDMA Disabled for GPU ca000 / HCA 0 (distance 7 > 4)` (2.4–2.7, and at TRACE
/// level later), and the `Enabled` forms.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct GdrLine {
    /// `Enabled` (true) or `Disabled` (false).
    pub enabled: bool,
    /// The network plugin's name, where the line has a `NET/<net> :` prefix (2.8 on).
    pub net: Option<String>,
    /// NCCL's HCA number.
    pub hca: Option<u32>,
    /// The HCA's RDMA device name (`mlx5_0`), if quoted.
    pub hca_name: Option<String>,
    /// The GPU's bus id as NCCL printed it (`ca000`), if printed.
    pub gpu: Option<String>,
    /// The parenthesised reason NCCL gave (`no module`, `distance 7 > 4`), if any.
    pub reason: Option<String>,
}

/// Parses a GDR decision line.
pub fn gdr(msg: &str) -> Option<GdrLine> {
    let (net, rest) = match msg.split_once(" : ") {
        Some((n, r)) if n.starts_with("NET/") && r.starts_with("GPU Direct RDMA ") => {
            (Some(n.trim_start_matches("NET/").to_owned()), r)
        }
        _ => (None, msg),
    };
    let rest = rest.strip_prefix("GPU Direct RDMA ")?;
    let (enabled, rest) = if let Some(r) = rest.strip_prefix("Disabled for ") {
        (false, r)
    } else if let Some(r) = rest.strip_prefix("Enabled for ") {
        (true, r)
    } else {
        return None;
    };
    let reason = rest.rfind('(').and_then(|o| {
        rest[o + 1..]
            .find(')')
            .map(|c| rest[o + 1..o + 1 + c].to_owned())
    });
    let gpu = rest
        .strip_prefix("GPU ")
        .and_then(|g| g.split(" / ").next())
        .map(|g| g.trim().to_owned());
    let hca_at = rest.find("HCA ")?;
    let after = &rest[hca_at + 4..];
    let hca = after
        .split(|c: char| !c.is_ascii_digit())
        .next()
        .and_then(|d| d.parse().ok());
    let hca_name = after
        .split_once('\'')
        .and_then(|(_, r)| r.split_once('\''))
        .map(|(n, _)| n.to_owned());
    Some(GdrLine {
        enabled,
        net,
        hca,
        hca_name,
        gpu,
        reason,
    })
}

/// `NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/IB [RO]; OOB eth0:10.0.0.1<0>` (`net_ib.cc`):
/// NCCL's IB device numbers and their RDMA device names (`mlx5_0`, port dropped), the number
/// that `via NET/IB/<N>` names. A fused device of NCCL 2.21 on (`[0]={[0] mlx5_2:1/RoCE, [1]
/// mlx5_3:1/RoCE}`, several ports merged into one NCCL device) is named by its first member.
/// `None` for any other line; at most 64 devices are read.
pub fn ib_devices(msg: &str) -> Option<Vec<(u32, String)>> {
    let rest = msg.strip_prefix("NET/IB : Using ")?;
    let mut list = rest.split(';').next().unwrap_or(rest);
    let mut devs: Vec<(u32, String)> = Vec::new();
    // Each pass consumes at least one byte, so the loop ends within the line's length.
    while devs.len() < 64 {
        list = list.trim_start();
        if list.is_empty() {
            break;
        }
        let entry = list.strip_prefix('[').and_then(|r| r.split_once(']'));
        let Some((n, after)) = entry.filter(|(n, _)| n.bytes().all(|b| b.is_ascii_digit())) else {
            // `[RO]`, or text that is no device: skip one word.
            list = list.split_once(char::is_whitespace).map_or("", |(_, r)| r);
            continue;
        };
        let (member, tail) = match after.strip_prefix("={") {
            Some(group) => {
                let (inside, tail) = group.split_once('}').unwrap_or((group, ""));
                // The first member, `[0] mlx5_2:1/RoCE`, without its own bracketed number.
                let first = inside.split(',').next().unwrap_or_default().trim();
                let first = first.split_once(']').map_or(first, |(_, m)| m).trim();
                (first, tail)
            }
            None => after.split_once(char::is_whitespace).unwrap_or((after, "")),
        };
        list = tail;
        let name = member.split([':', '/']).next().unwrap_or_default();
        if let (Ok(n), false) = (n.parse(), name.is_empty()) {
            devs.push((n, name.to_owned()));
        }
    }
    (!devs.is_empty()).then_some(devs)
}

/// `NCCL_X set by environment to V.` (and `NCCL_X set to V` of 2.4), `(name, value)`.
pub fn env(msg: &str) -> Option<(String, String)> {
    let (name, rest) = msg.split_once(' ')?;
    if !name.starts_with("NCCL_")
        || !name
            .bytes()
            .all(|b| b.is_ascii_uppercase() || b.is_ascii_digit() || b == b'_')
    {
        return None;
    }
    let value = rest
        .strip_prefix("set by environment to ")
        .or_else(|| rest.strip_prefix("set to "))?;
    Some((
        name.to_owned(),
        value.trim().trim_end_matches('.').to_owned(),
    ))
}

/// `P2P is disabled between connected GPUs A and B` / `Could not enable P2P between dev A(=x)
/// and dev B(=y)`: the pair NCCL's P2P check refused (CUDA devices).
pub fn p2p_refused(msg: &str) -> Option<(u32, u32)> {
    let rest = msg
        .strip_prefix("P2P is disabled between connected GPUs ")
        .or_else(|| msg.strip_prefix("Could not enable P2P between dev "))?;
    let (a, b) = rest.split_once(" and ")?;
    let num = |s: &str| -> Option<u32> {
        s.trim_start_matches("dev ")
            .split(|c: char| !c.is_ascii_digit())
            .next()?
            .parse()
            .ok()
    };
    Some((num(a)?, num(b)?))
}

/// `comm 0x… rank R nranks N cudaDev C [nvmlDev M] busId B …` (init lines of 2.7 on).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct CommLine {
    /// `rank R`.
    pub rank: Option<u32>,
    /// `nranks N`.
    pub nranks: Option<u32>,
    /// `cudaDev C`.
    pub cuda_dev: Option<u32>,
    /// `nvmlDev M` (where printed).
    pub nvml_dev: Option<u32>,
    /// `busId B`.
    pub bus_id: Option<String>,
}

/// Parses an init line naming a rank's device.
pub fn comm(msg: &str) -> Option<CommLine> {
    let at = msg.find("comm 0x")?;
    let mut c = CommLine::default();
    let mut words = msg[at..].split_whitespace();
    while let Some(w) = words.next() {
        match w {
            "rank" => c.rank = words.next().and_then(|v| v.parse().ok()),
            "nranks" | "nRanks" => c.nranks = words.next().and_then(|v| v.parse().ok()),
            "cudaDev" => c.cuda_dev = words.next().and_then(|v| v.parse().ok()),
            "nvmlDev" => c.nvml_dev = words.next().and_then(|v| v.parse().ok()),
            "busId" => {
                c.bus_id = words
                    .next()
                    .filter(|v| v.len() <= 16 && v.bytes().all(|b| b.is_ascii_hexdigit()))
                    .map(str::to_owned)
            }
            _ => {}
        }
    }
    c.rank.map(|_| c)
}

/// `NCCL version 2.18.1+cuda12.1` (also printed with no prefix by rank 0).
pub fn version(line: &str) -> Option<String> {
    let at = line.find("NCCL version ")?;
    let v = line[at + "NCCL version ".len()..]
        .split_whitespace()
        .next()?;
    (v.starts_with(|c: char| c.is_ascii_digit()) && v.len() <= 40).then(|| v.to_owned())
}

/// `Using network IB` / `Using network AWS Libfabric`.
pub fn network(msg: &str) -> Option<String> {
    msg.strip_prefix("Using network ")
        .map(|n| n.trim().to_owned())
        .filter(|n| !n.is_empty() && n.len() <= 64)
}

/// A NCCL PCI bus id as logged (`c7000`, `100000`: domain << 20 | bus << 12 | dev << 4 | fn)
/// in the `dddd:bb:dd.f` form sysfs uses; `None` for one no PCI device can have (a domain over
/// 32 bits, a device over 31, a function over 7), which is unparsable, not kept.
pub fn bus_id_to_pci(hex: &str) -> Option<String> {
    let v = u64::from_str_radix(hex, 16).ok()?;
    if v >> 20 > u64::from(u32::MAX) || (v >> 4) & 0xff > 0x1f || v & 0xf > 7 {
        return None;
    }
    Some(format!(
        "{:04x}:{:02x}:{:02x}.{:x}",
        v >> 20,
        (v >> 12) & 0xff,
        (v >> 4) & 0xff,
        v & 0xf
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn prefixes_and_interleaving() {
        let s = split("learnfair062:40515:40655 [6] NCCL INFO learnfair062:40517:40631 [7] NCCL INFO Ring 04 : 7[7] -> 3[3] via P2P/IPC");
        assert_eq!(s.prefix.host.as_deref(), Some("learnfair062"));
        assert_eq!(s.prefix.pid, Some(40517));
        assert_eq!(s.prefix.cuda_dev, Some(7));
        assert_eq!(s.message, "Ring 04 : 7[7] -> 3[3] via P2P/IPC");
        let s = split("[1,3]<stdout>:5873af64cf59:10161:10551 [3] NCCL INFO Bootstrap : x");
        assert_eq!(s.prefix.host.as_deref(), Some("5873af64cf59"));
        let s = split("2025-11-12 20:42:20,261 - INFO - g340-cd51:4450:4887 [5] NCCL INFO Channel 31/1 : 5[5] -> 0[0] via P2P/IPC");
        assert_eq!(s.prefix.host.as_deref(), Some("g340-cd51"));
        assert_eq!(s.prefix.cuda_dev, Some(5));
    }

    #[test]
    fn transports() {
        // Written from NCCL's formats (transport/net.cc prints the proxy rank after the device
        // for PXN; transport/p2p.cc prints CUMEM): no public log of these forms was found.
        assert_eq!(
            transport("NET/IB/0(5)/GDRDMA"),
            Transport::Net {
                net: "IB".into(),
                dev: Some(0),
                proxy: Some(5),
                gdr: true,
                shared: false
            }
        );
        assert_eq!(
            transport("P2P/CUMEM/read"),
            Transport::P2p {
                mode: "CUMEM".into(),
                read: true
            }
        );
        assert!(
            matches!(transport("NET/AWS Libfabric/1/GDRDMA"), Transport::Net { gdr: true, ref net, .. } if net == "AWS Libfabric")
        );
        assert!(matches!(
            transport("SHM/direct/direct"),
            Transport::Shm { .. }
        ));
        let c = connection("Ring 00 : 7 -> 8 [receive] via NET/AWS Libfabric/0").unwrap();
        assert_eq!(
            (c.src.rank, c.dst.rank, c.dir),
            (7, 8, Some(Direction::Receive))
        );
        assert!(connection("Channel 00 :    0   1   3   2").is_none());
        let c = connection("Channel 02/0 : 3[3] -> 4[4] via P2P/direct pointer").unwrap();
        assert_eq!(c.via, "P2P/direct pointer");
    }

    #[test]
    fn other_lines() {
        let g = gdr("NET/IB : GPU Direct RDMA Disabled for HCA 1 'mlx5_1' (no module)").unwrap();
        assert_eq!(
            (g.hca, g.hca_name.as_deref(), g.reason.as_deref()),
            (Some(1), Some("mlx5_1"), Some("no module"))
        );
        let g = gdr("GPU Direct RDMA Disabled for GPU ca000 / HCA 0 (distance 7 > 4)").unwrap();
        assert_eq!(
            (g.gpu.as_deref(), g.hca, g.reason.as_deref()),
            (Some("ca000"), Some(0), Some("distance 7 > 4"))
        );
        assert_eq!(
            env("NCCL_IB_DISABLE set by environment to 1."),
            Some(("NCCL_IB_DISABLE".into(), "1".into()))
        );
        assert_eq!(
            p2p_refused("Could not enable P2P between dev 1(=200000) and dev 0(=100000)"),
            Some((1, 0))
        );
        assert_eq!(
            ib_devices(
                "NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB eth0:10.0.0.1<0>"
            ),
            Some(vec![(0, "mlx5_0".into()), (1, "mlx5_1".into())])
        );
        // Fused devices (nccl-tests issue 373): the members' own numbers are not NCCL's.
        assert_eq!(
            ib_devices("NET/IB : Using [0]={[0] mlx5_2:1/RoCE, [1] mlx5_3:1/RoCE} [1]={[2] mlx5_0:1/RoCE, [3] mlx5_1:1/RoCE} [RO]; OOB bond0.526:169.136.106.9<0>"),
            Some(vec![(0, "mlx5_2".into()), (1, "mlx5_0".into())])
        );
        assert_eq!(
            ib_devices("NET/IB : Using [RO]; OOB eno1:10.201.24.89<0>"),
            None
        );
        assert_eq!(bus_id_to_pci("c7000").as_deref(), Some("0000:c7:00.0"));
        assert_eq!(bus_id_to_pci("201c0").as_deref(), Some("0000:20:1c.0"));
        // From a hostile log (issue 42): no PCI device has these.
        for bad in ["fffffffffffffff", "ffffffff", "fff", "c7008"] {
            assert_eq!(bus_id_to_pci(bad), None, "{bad}");
        }
        let c = comm("comm 0x9ffe0160 rank 0 nranks 4 cudaDev 0 nvmlDev 0 busId 100000 commId 0x1e - Init START").unwrap();
        assert_eq!(
            (c.rank, c.nranks, c.bus_id.as_deref()),
            (Some(0), Some(4), Some("100000"))
        );
        assert_eq!(
            version("NCCL version 2.4.7+cuda10.0").as_deref(),
            Some("2.4.7+cuda10.0")
        );
    }
}
