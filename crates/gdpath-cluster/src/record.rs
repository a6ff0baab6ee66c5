//! The record an agent publishes at `/<namespace>/agents/<name>`, and the rules a record read
//! from etcd must pass: anyone who can write the namespace can put anything there, so a record
//! is bounded in size, parsed, checked field by field and escaped when shown.

use crate::error::ClusterError;
use serde::{Deserialize, Serialize};
use std::time::Duration;

/// Schema name of a record (its `schema` field).
pub const RECORD_SCHEMA: &str = "gdpath.agent/1";
/// Default lease TTL: 10 s. A crashed or partitioned agent's record goes within it; a
/// keep-alive every third of it costs etcd one small write per agent per 3.3 s.
pub const DEFAULT_TTL: Duration = Duration::from_secs(10);
/// Shortest and longest TTL accepted, in seconds (etcd's own minimum is a few seconds; its
/// leader elections take about one).
pub const TTL_RANGE_S: std::ops::RangeInclusive<u64> = 2..=3600;
/// Largest record read, in bytes: a record lists regions, and 4096 of them fit well below it.
pub const MAX_RECORD_BYTES: usize = 256 << 10;
/// Most regions a record may list.
pub const MAX_REGIONS: usize = 4096;
/// Longest agent or namespace name, in characters. With `#` and the 32-hex-digit incarnation
/// the engine's agent name then fits the wire protocol's 64 characters
/// (`gdpath::net::codec::AGENT_NAME_CHARS`), which is how the handshake proves the
/// incarnation.
pub const MAX_NAME_CHARS: usize = 31;

/// Most doctor verdicts a record holds.
pub const MAX_VERDICTS: usize = 16;
/// Longest area or status of a verdict, in bytes.
pub const MAX_VERDICT_BYTES: usize = 32;

/// At most `n` bytes and no control character: a field shown on terminals.
fn short(s: &str, n: usize) -> bool {
    s.len() <= n && !s.chars().any(char::is_control)
}

/// A verdict (`area`, `status`) a record may hold.
pub(crate) fn verdict_fits(area: &str, status: &str) -> bool {
    short(area, MAX_VERDICT_BYTES) && short(status, MAX_VERDICT_BYTES)
}

/// A name (agent or namespace): 1 to [`MAX_NAME_CHARS`] characters of `A-Z a-z 0-9 . _ -`,
/// not `.` or `..`: it is a path component of an etcd key and is shown on terminals.
pub fn valid_name(s: &str) -> bool {
    !s.is_empty()
        && s.len() <= MAX_NAME_CHARS
        && s != "."
        && s != ".."
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b == b'.' || b == b'_' || b == b'-')
}

/// [`valid_name`] as a typed error naming the rule.
pub fn check_name(s: &str) -> Result<(), ClusterError> {
    if valid_name(s) {
        Ok(())
    } else {
        Err(ClusterError::InvalidName(format!(
            "{:?}: 1 to {MAX_NAME_CHARS} characters of A-Z a-z 0-9 . _ -",
            gdpath::topo::text::escape(s).to_string()
        )))
    }
}

/// One start of an agent: 128 random bits, as 32 lowercase hex digits. A new one on every
/// start, so that a restarted agent is never taken for the one before.
#[derive(Debug, Clone, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Incarnation(String);

impl Incarnation {
    /// A fresh incarnation from the operating system's random source.
    pub fn new() -> Incarnation {
        let mut b = [0u8; 16];
        // getrandom fails only where the kernel has no random source at all; a clock and pid
        // then still make two starts differ.
        if getrandom::fill(&mut b).is_err() {
            let t = std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_nanos())
                .unwrap_or(0);
            b = (t ^ (u128::from(std::process::id()) << 64)).to_le_bytes();
        }
        Incarnation(b.iter().map(|x| format!("{x:02x}")).collect())
    }

    /// The 32 hex digits.
    pub fn as_str(&self) -> &str {
        &self.0
    }

    fn valid(&self) -> bool {
        self.0.len() == 32
            && self
                .0
                .bytes()
                .all(|b| b.is_ascii_digit() || (b'a'..=b'f').contains(&b))
    }
}

impl Default for Incarnation {
    fn default() -> Self {
        Incarnation::new()
    }
}

impl std::fmt::Display for Incarnation {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(&self.0)
    }
}

/// The node an agent runs on.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct NodeInfo {
    /// Host name (`uname -n`).
    pub hostname: String,
    /// `/proc/sys/kernel/random/boot_id`: two agents with the same one share a kernel (and may
    /// use node-local shortcuts such as shared memory and CUDA IPC).
    pub boot_id: String,
    /// Process id of the agent, on that boot.
    pub pid: u32,
    /// The process's start time in clock ticks after boot (`/proc/PID/stat` field 22): with
    /// `pid` and `boot_id` it names one process, so a restarted agent can tell its dead
    /// predecessor's record from a live one's.
    pub start_ticks: u64,
}

impl NodeInfo {
    /// This process's node facts (empty strings where `/proc` cannot be read).
    pub fn this_process() -> NodeInfo {
        let pid = std::process::id();
        NodeInfo {
            hostname: rustix::system::uname()
                .nodename()
                .to_string_lossy()
                .into_owned(),
            boot_id: boot_id(),
            pid,
            start_ticks: start_ticks(pid).unwrap_or(0),
        }
    }

    /// True when this record's process is known to have ended: same boot and same host name as
    /// this process, and no process `pid` started at `start_ticks`. The host name is compared
    /// too because containers of one host share its boot id but not their PID namespaces: there
    /// a live agent's pid would look dead from the next container.
    pub fn is_dead_here(&self) -> bool {
        let here = NodeInfo::this_process();
        !self.boot_id.is_empty()
            && self.boot_id == here.boot_id
            && self.hostname == here.hostname
            && start_ticks(self.pid) != Some(self.start_ticks)
    }
}

fn boot_id() -> String {
    std::fs::read_to_string("/proc/sys/kernel/random/boot_id")
        .map(|s| s.trim().chars().take(64).collect())
        .unwrap_or_default()
}

/// Field 22 of `/proc/PID/stat` (after the command name, which may hold spaces and `)`);
/// `None` for no such process or one that has ended but not been reaped (a zombie, state `Z`
/// or `X`: a killed agent whose parent has not waited for it yet).
fn start_ticks(pid: u32) -> Option<u64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let mut fields = stat[stat.rfind(')')? + 1..].split_whitespace();
    if matches!(fields.next(), Some("Z" | "X")) {
        return None;
    }
    fields.nth(18)?.parse().ok()
}

/// Memory kind of an exported region.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RegionKind {
    /// Host memory.
    Host,
    /// GPU memory.
    Gpu,
}

/// One exported region, as peers will find it in the handshake's metadata.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct RegionRecord {
    /// The exporter's id of the region.
    pub id: u64,
    /// Host or GPU memory.
    pub kind: RegionKind,
    /// CUDA ordinal for GPU memory.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub gpu: Option<u32>,
    /// Length in bytes.
    pub len: u64,
    /// Host memory shared through a sealed memfd: an agent of the same node (same boot id)
    /// may map it instead of using UCX.
    #[serde(default)]
    pub shm: bool,
    /// GPU memory with a CUDA IPC handle: an agent of the same node may open it.
    #[serde(default)]
    pub cuda_ipc: bool,
}

impl RegionRecord {
    /// The record of `region`, exported by `agent`, as the engine describes it to peers
    /// ([`gdpath::Agent::export_info`]): the id, kind, GPU, length and same-node shortcuts are
    /// those of the metadata peers receive, never a guess. Errors: the engine's
    /// ([`ClusterError::Engine`]: `config` when the region is not exported).
    pub fn exported(
        agent: &gdpath::Agent,
        region: &gdpath::Region,
    ) -> Result<RegionRecord, ClusterError> {
        Ok(RegionRecord::from(&agent.export_info(region)?))
    }
}

impl From<&gdpath::net::RemoteRegionInfo> for RegionRecord {
    fn from(i: &gdpath::net::RemoteRegionInfo) -> RegionRecord {
        let (kind, gpu) = match i.kind {
            gdpath::net::codec::WireKind::Host => (RegionKind::Host, None),
            gdpath::net::codec::WireKind::Gpu(n) => (RegionKind::Gpu, Some(n)),
        };
        RegionRecord {
            id: i.id,
            kind,
            gpu,
            len: i.len,
            shm: i.shm,
            cuda_ipc: i.cuda_ipc,
        }
    }
}

/// A summary of the agent's machine.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct TopologySummary {
    /// GPUs seen.
    pub gpus: u32,
    /// Network interfaces with an RDMA device, or every non-loopback one where none has.
    pub nics: u32,
    /// The doctor's status per data path (`p2p`, `gdr`, `gds` → `ok`, `degraded`,
    /// `unavailable`, `unknown`, `not-run`; at most [`MAX_VERDICTS`]): empty until the agent's
    /// doctor answered ([`crate::Membership::publish_verdicts`]).
    #[serde(default)]
    pub verdicts: std::collections::BTreeMap<String, String>,
}

impl TopologySummary {
    /// GPUs and NICs of this machine as the live `/sys` shows them (gdpath-topo's reader: a
    /// few milliseconds); zeros where it cannot be read. The doctor's verdicts are left empty:
    /// they take the driver's facts, which an agent publishing at start should not wait for
    /// (they follow by an update, [`crate::Membership::publish_verdicts`]).
    pub fn of_this_machine() -> TopologySummary {
        match gdpath::topo::load(&gdpath::topo::Source::Live) {
            Ok(m) => TopologySummary {
                gpus: u32::try_from(m.gpus().count()).unwrap_or(u32::MAX),
                nics: u32::try_from(m.nics().count()).unwrap_or(u32::MAX),
                verdicts: Default::default(),
            },
            Err(_) => TopologySummary::default(),
        }
    }
}

/// What an agent publishes about itself. It holds no secret: reading it grants nothing, since
/// connecting still takes the token's HMAC handshake (docs/cluster.md, "Trust").
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct AgentRecord {
    /// [`RECORD_SCHEMA`].
    pub schema: String,
    /// The agent's name, equal to the last component of its key.
    pub name: String,
    /// This start of the agent.
    pub incarnation: Incarnation,
    /// Where it runs.
    pub node: NodeInfo,
    /// Its control-plane address (`gdpath serve`'s listener), `IP:PORT`.
    pub addr: String,
    /// The regions it exports.
    pub regions: Vec<RegionRecord>,
    /// Its machine.
    pub topology: TopologySummary,
    /// When it started, seconds after the Unix epoch.
    pub started: u64,
    /// The TTL of its lease in seconds (set when it joins): how long after its death a peer
    /// may wait for etcd to say so.
    #[serde(default)]
    pub lease_ttl_s: u64,
}

impl AgentRecord {
    /// A record for agent `name` listening on `addr`, with a fresh incarnation and this
    /// process's node facts.
    pub fn new(name: &str, addr: std::net::SocketAddr) -> Result<AgentRecord, ClusterError> {
        check_name(name)?;
        Ok(AgentRecord {
            schema: RECORD_SCHEMA.into(),
            name: name.into(),
            incarnation: Incarnation::new(),
            node: NodeInfo::this_process(),
            addr: addr.to_string(),
            regions: Vec::new(),
            topology: TopologySummary::default(),
            started: std::time::SystemTime::now()
                .duration_since(std::time::UNIX_EPOCH)
                .map(|d| d.as_secs())
                .unwrap_or(0),
            lease_ttl_s: 0,
        })
    }

    /// The engine agent name that proves the incarnation in the handshake: `NAME#INCARNATION`
    /// (at most 64 characters by [`MAX_NAME_CHARS`]).
    pub fn engine_name(&self) -> String {
        format!("{}#{}", self.name, self.incarnation)
    }

    /// The control-plane address.
    pub fn socket_addr(&self) -> Result<std::net::SocketAddr, ClusterError> {
        self.addr
            .parse()
            .map_err(|_| ClusterError::invalid_record(self.name.as_bytes(), "addr is not IP:PORT"))
    }

    /// The record as stored: compact JSON.
    pub fn to_json(&self) -> Vec<u8> {
        // A record of strings and numbers always serializes.
        serde_json::to_vec(self).unwrap_or_default()
    }

    /// Parses and checks a record read from etcd at `key` (`/NAMESPACE/agents/NAME`, NAME
    /// being its name). Errors: [`ClusterError::InvalidRecord`] naming the rule broken (key
    /// and reason escaped and bounded by [`ClusterError::invalid_record`]).
    pub fn from_etcd(key: &[u8], value: &[u8]) -> Result<AgentRecord, ClusterError> {
        let bad = |detail: String| ClusterError::invalid_record(key, &detail);
        if value.len() > MAX_RECORD_BYTES {
            return Err(bad(format!(
                "{} bytes; at most {MAX_RECORD_BYTES}",
                value.len()
            )));
        }
        // `/NAMESPACE/agents/NAME`: a key below a name (`/ns/agents/x/y`) is no agent's, since
        // resolving `y` looks up `/ns/agents/y`.
        let parts: Vec<&[u8]> = key.splitn(5, |&b| b == b'/').collect();
        if parts.len() != 4 || !parts[0].is_empty() || parts[2] != b"agents" {
            return Err(bad(
                "the key is not /NAMESPACE/agents/NAME (a key below a name is no agent's)".into(),
            ));
        }
        let r: AgentRecord =
            serde_json::from_slice(value).map_err(|e| bad(format!("not a record: {e}")))?;
        if r.schema != RECORD_SCHEMA {
            // Raw here: `bad` escapes the whole detail once.
            return Err(bad(format!(
                "schema \"{}\", expected {RECORD_SCHEMA}",
                r.schema
            )));
        }
        if !valid_name(&r.name) || r.name.as_bytes() != parts[3] {
            return Err(bad("its name is invalid or differs from its key".into()));
        }
        if !r.incarnation.valid() {
            return Err(bad("incarnation is not 32 hex digits".into()));
        }
        r.socket_addr()
            .map_err(|_| bad("addr is not IP:PORT".into()))?;
        if r.lease_ttl_s > *TTL_RANGE_S.end() {
            return Err(bad("lease_ttl_s above the longest TTL".into()));
        }
        if r.regions.len() > MAX_REGIONS {
            return Err(bad(format!("more than {MAX_REGIONS} regions")));
        }
        if !short(&r.node.hostname, 255)
            || !short(&r.node.boot_id, 64)
            || r.topology.verdicts.len() > MAX_VERDICTS
            || !r.topology.verdicts.iter().all(|(k, v)| verdict_fits(k, v))
        {
            return Err(bad(
                "a node or topology field is too long or holds control characters".into(),
            ));
        }
        Ok(r)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn record() -> AgentRecord {
        AgentRecord::new("decode-3", "127.0.0.1:18515".parse().unwrap()).unwrap()
    }

    #[test]
    fn a_record_round_trips_and_names_its_incarnation() {
        let r = record();
        let back = AgentRecord::from_etcd(b"/ns/agents/decode-3", &r.to_json()).unwrap();
        assert_eq!(back, r);
        assert_eq!(r.incarnation.as_str().len(), 32);
        assert_ne!(r.incarnation, record().incarnation);
        assert!(r.engine_name().chars().count() <= gdpath::net::codec::AGENT_NAME_CHARS);
        assert!(!r.node.is_dead_here(), "this process is alive");
    }

    #[test]
    fn bad_records_are_refused() {
        let r = record();
        // Key and name differ: a record cannot claim another agent's name.
        assert!(AgentRecord::from_etcd(b"/ns/agents/other", &r.to_json()).is_err());
        assert!(AgentRecord::from_etcd(b"/ns/agents/decode-3", b"{").is_err());
        let big = vec![b' '; MAX_RECORD_BYTES + 1];
        assert!(AgentRecord::from_etcd(b"/ns/agents/decode-3", &big).is_err());
        let mut v = r.clone();
        v.node.hostname = "h\u{1b}[2J".into();
        assert!(AgentRecord::from_etcd(b"/ns/agents/decode-3", &v.to_json()).is_err());
        let mut v = r.clone();
        v.addr = "nowhere".into();
        assert!(AgentRecord::from_etcd(b"/ns/agents/decode-3", &v.to_json()).is_err());
        let mut v = r.clone();
        v.lease_ttl_s = 1 << 40;
        assert!(AgentRecord::from_etcd(b"/ns/agents/decode-3", &v.to_json()).is_err());
        let mut v = r;
        v.incarnation = Incarnation("x".into());
        assert!(AgentRecord::from_etcd(b"/ns/agents/decode-3", &v.to_json()).is_err());
        for n in ["", ".", "..", "a/b", "a b", &"x".repeat(32)] {
            assert!(!valid_name(n), "{n}");
        }
    }
}
