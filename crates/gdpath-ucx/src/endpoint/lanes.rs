//! Which transports an endpoint moves data with: `ucp_ep_query` (UCX >= 1.14) or the lane lines
//! of `ucp_ep_print_info` (UCX 1.13), and which of them carry put/get.

use std::fmt;

use super::Endpoint;
use crate::call;
use crate::error::Result;
use crate::mem_type::MemType;
use crate::sys_ext::{ucp_ep_attr_v114, ucp_transport_entry_t, UCP_EP_ATTR_FIELD_TRANSPORTS};

impl Endpoint {
    /// UCX's description of the endpoint's configuration (`ucp_ep_print_info`): lanes,
    /// transports, devices and protocol thresholds.
    pub fn print_info(&self) -> Result<String> {
        self.ensure_ok()?;
        let w = self.worker();
        let _g = w.guard();
        // SAFETY: live endpoint, serialised.
        unsafe { call::ep_print_info(w.api(), self.inner.raw) }
    }

    /// The transports and devices this endpoint moves data with. UCX >= 1.14: `ucp_ep_query`
    /// with `UCP_EP_ATTR_FIELD_TRANSPORTS` (lanes without usage); UCX 1.13: the lane lines of
    /// [`Endpoint::print_info`], with their usage (`am`, `rma_bw#0`, ...). The
    /// connection-manager lane of a client-server endpoint is left out. Wait until connected
    /// ([`Endpoint::wait_connected`]): lanes are chosen during wire-up.
    pub fn transports(&self) -> Result<EpTransports> {
        if self.worker().context().ucx().has_ep_transport_query() {
            self.query_transports()
        } else {
            Ok(EpTransports {
                source: TransportSource::PrintInfo,
                lanes: parse_lanes(&self.print_info()?),
            })
        }
    }

    fn query_transports(&self) -> Result<EpTransports> {
        self.ensure_ok()?;
        const MAX: usize = 64;
        let mut entries = [ucp_transport_entry_t {
            transport_name: std::ptr::null(),
            device_name: std::ptr::null(),
        }; MAX];
        let mut attr: ucp_ep_attr_v114 = call::unset();
        attr.field_mask = UCP_EP_ATTR_FIELD_TRANSPORTS;
        attr.transports.entries = entries.as_mut_ptr();
        attr.transports.num_entries = MAX as u32;
        attr.transports.entry_size = std::mem::size_of::<ucp_transport_entry_t>();
        let w = self.worker();
        let _g = w.guard();
        // SAFETY: live endpoint, serialised; attr is the 1.14 layout, which the caller checked
        // the loaded UCX has, and only TRANSPORTS is requested; entries has MAX slots.
        unsafe {
            call::ep_query(
                w.api(),
                self.inner.raw,
                (&mut attr as *mut ucp_ep_attr_v114).cast(),
            )
        }?;
        let n = (attr.transports.num_entries as usize).min(MAX);
        let lanes = entries[..n]
            .iter()
            .map(|e| Lane {
                // SAFETY: strings valid until the endpoint closes; copied now.
                transport: unsafe { call::cstr(e.transport_name) },
                // SAFETY: as above.
                device: unsafe { call::cstr(e.device_name) },
                usage: Vec::new(),
            })
            // The connection-manager lane of a client-server endpoint (e.g. `tcp` with no
            // device in UCX 1.22) carries no data; print_info parsing skips it too.
            .filter(|l| !l.device.is_empty())
            .collect();
        Ok(EpTransports {
            source: TransportSource::EpQuery,
            lanes,
        })
    }

    /// Which transports carry put/get of `mem` memory on this endpoint, as far as UCX tells.
    ///
    /// Host memory: the lanes `ucp_ep_print_info` marks for RMA (`rma`, `rma_bw`), or, when
    /// there are none (as over `tcp`), the active-message lanes that UCX emulates put/get with.
    /// Other memory types: the context must support the type; UCX picks their protocol per
    /// operation and reports it nowhere in its API, so the answer is [`RmaBasis::Unknown`]
    /// with the endpoint's lanes.
    ///
    /// Errors: [`crate::UcxError::MemTypeUnsupported`] when the context cannot move `mem`.
    pub fn rma_transports(&self, mem: MemType) -> Result<RmaTransports> {
        self.worker().context().require_mem_type(mem)?;
        let lanes = parse_lanes(&self.print_info()?);
        if mem != MemType::Host {
            return Ok(RmaTransports {
                mem_type: mem,
                basis: RmaBasis::Unknown(format!(
                    "UCX selects the protocol for {mem} memory per operation and does not report it"
                )),
                lanes,
            });
        }
        let has = |l: &Lane, p: &str| {
            l.usage
                .iter()
                .any(|u| u == p || u.starts_with(&format!("{p}#")))
        };
        let rma: Vec<Lane> = lanes
            .iter()
            .filter(|l| has(l, "rma") || has(l, "rma_bw"))
            .cloned()
            .collect();
        if !rma.is_empty() {
            return Ok(RmaTransports {
                mem_type: mem,
                basis: RmaBasis::RmaLanes,
                lanes: rma,
            });
        }
        let am: Vec<Lane> = lanes
            .iter()
            .filter(|l| has(l, "am") || has(l, "am_bw"))
            .cloned()
            .collect();
        Ok(RmaTransports {
            mem_type: mem,
            basis: RmaBasis::AmEmulation,
            lanes: am,
        })
    }
}

/// One lane of an endpoint: a transport on a device, and what UCX uses it for.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Lane {
    /// Transport (`tcp`, `posix`, `cma`, `self`, `rc_mlx5`, `cuda_ipc`, ...).
    pub transport: String,
    /// Device (`lo`, `memory`, `mlx5_0:1`, ...).
    pub device: String,
    /// Uses as `ucp_ep_print_info` lists them (`am`, `am_bw#0`, `rma_bw#0`, `wireup`,
    /// `rkey_ptr`); empty when the lanes came from `ucp_ep_query`.
    pub usage: Vec<String>,
}

impl fmt::Display for Lane {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}/{}", self.transport, self.device)
    }
}

/// Where [`EpTransports`] came from.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum TransportSource {
    /// `ucp_ep_query(UCP_EP_ATTR_FIELD_TRANSPORTS)` (UCX >= 1.14).
    EpQuery,
    /// Parsed from `ucp_ep_print_info` (UCX 1.13).
    PrintInfo,
}

/// The transports of an endpoint.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EpTransports {
    /// How they were found.
    pub source: TransportSource,
    /// One entry per lane.
    pub lanes: Vec<Lane>,
}

/// How [`RmaTransports::lanes`] were decided.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum RmaBasis {
    /// Lanes that UCX assigned to RMA.
    RmaLanes,
    /// No RMA lane: UCX emulates put/get with active messages on these lanes (e.g. `tcp`);
    /// the target's worker must progress for them to complete.
    AmEmulation,
    /// UCX does not say; the lanes are all of the endpoint's.
    Unknown(String),
}

/// Answer of [`Endpoint::rma_transports`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RmaTransports {
    /// The memory type asked about.
    pub mem_type: MemType,
    /// How the lanes were decided.
    pub basis: RmaBasis,
    /// The lanes.
    pub lanes: Vec<Lane>,
}

/// Parses `lane[N]:  IDX:tl/dev.PATH md[M] -> md[M]/tl/sysdev[S] usage...` lines of
/// `ucp_ep_print_info` (UCX 1.13 through 1.22). Lanes that `put[N]:`/`get[N]:` threshold
/// lines refer to (UCX 1.13's short/bcopy RMA protocols, by lane index) get usage `rma`.
pub(crate) fn parse_lanes(text: &str) -> Vec<Lane> {
    let mut lanes: Vec<(usize, Lane)> = Vec::new();
    let mut rma_idx: Vec<usize> = Vec::new();
    for line in text.lines() {
        let line = line.trim_start_matches('#').trim();
        let index_of = |prefix: &str| -> Option<(usize, &str)> {
            let rest = line.strip_prefix(prefix)?;
            let (n, rest) = rest.split_once("]:")?;
            Some((n.trim().parse().ok()?, rest))
        };
        if let Some((i, _)) = index_of("put[").or_else(|| index_of("get[")) {
            rma_idx.push(i);
            continue;
        }
        let Some((idx, rest)) = index_of("lane[") else {
            continue;
        };
        let mut toks = rest.split_whitespace();
        let Some(rsc) = toks.next() else { continue };
        let name = rsc.split_once(':').map_or(rsc, |(_, n)| n);
        let Some((tl, dev)) = name.split_once('/') else {
            continue; // e.g. "lane[0]: cm rdmacm": the connection manager, not a transport
        };
        // Drop the ".<path index>" suffix UCX appends to the device.
        let dev = match dev.rsplit_once('.') {
            Some((d, i)) if !i.is_empty() && i.bytes().all(|b| b.is_ascii_digit()) => d,
            _ => dev,
        };
        let after_arrow: Vec<&str> = rest
            .split_once("->")
            .map(|(_, a)| a.split_whitespace().skip(1).collect())
            .unwrap_or_default();
        let mut usage = Vec::new();
        let mut it = after_arrow.into_iter();
        while let Some(t) = it.next() {
            if t == "seg" {
                it.next(); // segment size
                continue;
            }
            usage.push(t.to_string());
        }
        lanes.push((
            idx,
            Lane {
                transport: tl.to_string(),
                device: dev.to_string(),
                usage,
            },
        ));
    }
    for (idx, lane) in &mut lanes {
        if rma_idx.contains(idx) && !lane.usage.iter().any(|u| u == "rma") {
            lane.usage.push("rma".into());
        }
    }
    lanes.into_iter().map(|(_, l)| l).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_lanes_of_1_13_and_1_22() {
        // As printed by UCX 1.13.1 (tcp; shared memory) and 1.22.0 (shared memory).
        let text = "#\n# UCP endpoint \n#\n#               peer: <no debug data>\n\
            #                 lane[0]:  0:tcp/lo.0 md[0]                -> md[0]/tcp/sysdev[255] am am_bw#0 wireup\n\
            #                 lane[1]:  3:sysv/memory.0 md[2]           -> md[2]/sysv/sysdev[255]\n\
            #                 lane[2]:  0:self/memory0.0 md[0]          -> md[0]/self/sysdev[255] am am_bw#0\n\
            #                 lane[3]:  5:cma/memory.0 md[4]            -> md[4]/cma/sysdev[255] seg 4294967295 rma_bw#0\n\
            #                 lane[4]: cm rdmacm\n\
            #                  put[1]: 0..<short>..4294967296..<bcopy>..(inf)\n\
            #                  get[1]: 0..<bcopy>..(inf)\n\
            #                  rma_bw: mds #\n";
        let l = parse_lanes(text);
        assert_eq!(l.len(), 4);
        assert_eq!(
            (l[0].transport.as_str(), l[0].device.as_str()),
            ("tcp", "lo")
        );
        assert_eq!(l[0].usage, ["am", "am_bw#0", "wireup"]);
        assert_eq!(l[1].to_string(), "sysv/memory");
        assert_eq!(l[1].usage, ["rma"]);
        assert_eq!(l[2].device, "memory0");
        assert_eq!(l[3].usage, ["rma_bw#0"]);
    }
}
