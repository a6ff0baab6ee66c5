//! P2P checks, per GPU pair (and NVLink per GPU).
//!
//! The pair checks are worked out once per distinct [`key::PairKey`] (class, ACS, IOMMU,
//! visibility, driver facts), not once per pair ([`key::Plan`]); the rules, and how a source
//! that does not describe NVLink is judged, are in [`rules`]. A machine with at most
//! [`PER_PAIR_GPUS`] GPUs gets each pair's findings with the pair as subject (`GPU0-GPU1`); a
//! larger one gets one finding per key and check, its subject the pairs in few words (`all
//! 8,386,560 pairs of GPU0–GPU4095`), so that the report stays small at the model's device
//! limit.

mod key;
mod rules;

pub(crate) use key::acs_of;
pub(crate) use rules::acs_finding;

use super::{finding, DoctorInput};
use crate::subjects::blocks_text;
use gdpath::finding::{ids, Area, Finding, Status};
use gdpath_topo::facts::DriverFacts;
use gdpath_topo::Device;

const A: Area = Area::P2p;

/// Machines with at most this many GPUs (2,016 pairs) get one finding per pair and check;
/// larger ones one per group of pairs with the same facts.
pub const PER_PAIR_GPUS: usize = 64;

pub(super) fn check(input: &DoctorInput) -> Vec<Finding> {
    let m = input.machine;
    let gpus: Vec<&Device> = m.gpus().collect();
    let mut out = Vec::new();
    if gpus.len() < 2 {
        // GPUs the source cannot show (unclassified PCI entries) are unknown, not absent.
        let status = match super::gpu_absence(input) {
            Some((s @ Status::Unknown, _)) => s,
            _ => Status::Unavailable,
        };
        out.push(finding(
            ids::P2P_UNSUPPORTED,
            A,
            "system",
            status,
            format!(
                "{} in the PCI device list ({}): P2P needs two",
                match gpus.len() {
                    0 => "no GPU".to_owned(),
                    n => super::plural(n, "GPU", "GPUs"),
                },
                m.source
            ),
            if status == Status::Unknown {
                crate::read_the_machine("the PCI device list names each GPU")
            } else {
                "P2P needs two GPUs: run the doctor on a machine with two or more".to_owned()
            },
        ));
        return out;
    }
    let facts = input.driver.got();
    for g in &gpus {
        out.extend(nvlink_per_gpu(g, facts));
    }
    // Which GPUs CUDA_VISIBLE_DEVICES hides, by CUDA ordinal.
    let ordinals = key::ordinals(&gpus, facts);
    let visible = input.env("CUDA_VISIBLE_DEVICES").map(visible_ordinals);
    let hidden: Vec<bool> = ordinals
        .iter()
        .map(|o| matches!(&visible, Some(Some(vis)) if !vis.contains(o)))
        .collect();
    let hidden_ids: Vec<&str> = gpus
        .iter()
        .zip(&hidden)
        .filter(|(_, h)| **h)
        .map(|(g, _)| g.id.as_str())
        .collect();
    let rules = rules::Rules::new(input, &hidden_ids, matches!(visible, Some(Some(_))));
    let per_pair = gpus.len() <= PER_PAIR_GPUS;
    let plan = key::Plan::new(input, &gpus, &hidden, per_pair);
    let per_key: Vec<Vec<Finding>> = plan.keys.iter().map(|k| rules.findings(k)).collect();
    if per_pair {
        for (i, a) in gpus.iter().enumerate() {
            for (j, b) in gpus.iter().enumerate().skip(i + 1) {
                let subject = format!("{}-{}", a.id, b.id);
                for f in &per_key[plan.key_of(i, j)] {
                    out.push(Finding {
                        subject: subject.clone(),
                        ..f.clone()
                    });
                }
            }
        }
    } else {
        let ids: Vec<&str> = gpus.iter().map(|g| g.id.as_str()).collect();
        for (k, fs) in per_key.into_iter().enumerate() {
            let subject = blocks_text(&ids, &plan.members, &plan.blocks[k], plan.apart[k]);
            out.extend(fs.into_iter().map(|f| Finding {
                subject: subject.clone(),
                ..f
            }));
        }
    }
    out
}

/// The GPU indices that `CUDA_VISIBLE_DEVICES` leaves visible, as ordinals; `None` when it does
/// not name plain ordinals (UUIDs, MIG devices) or is unset.
fn visible_ordinals(v: &str) -> Option<Vec<u32>> {
    let mut out = Vec::new();
    for part in v.split(',') {
        let p = part.trim();
        if p.is_empty() {
            break;
        }
        match p.parse::<i64>() {
            // CUDA stops at the first invalid ordinal.
            Ok(n) if n < 0 => break,
            Ok(n) => out.push(u32::try_from(n).ok()?),
            Err(_) => return None,
        }
    }
    Some(out)
}

/// NVLink links a GPU model has, from NVIDIA's data sheets: H100/H200 SXM and B200 18 (NVLink
/// 4/5), A100 SXM4 12 (NVLink 3), V100 SXM2 6 (NVLink 2), P100 SXM2 4 (NVLink 1). PCIe and NVL
/// cards (bridged) are not listed: their count depends on the bridges fitted.
pub fn nvlink_norm(name: &str) -> Option<u32> {
    // NVML names (`NVIDIA A100-SXM4-40GB`) and PCI ID names (`A100 SXM4 40GB`) alike.
    let n = name.to_ascii_uppercase().replace(' ', "-");
    if n.contains("PCIE") || n.contains("-NVL") {
        return None;
    }
    let table: [(&str, u32); 7] = [
        ("GH200", 18),
        ("H200", 18),
        ("H100", 18),
        ("B200", 18),
        ("A100-SXM", 12),
        ("V100-SXM2", 6),
        ("P100-SXM2", 4),
    ];
    table.iter().find(|(k, _)| n.contains(k)).map(|&(_, v)| v)
}

fn nvlink_per_gpu(g: &Device, facts: Option<&DriverFacts>) -> Option<Finding> {
    let gf = key::gpu_facts(facts, g)?;
    let up = gf.nvlinks.len() as u32;
    let norm = nvlink_norm(&gf.name);
    let id = ids::P2P_NVLINK_DEGRADED;
    let s = g.id.clone();
    match norm {
        Some(n) if up < n => Some(finding(
            id,
            A,
            s,
            Status::Degraded,
            format!(
                "{}: {up} of {n} NVLinks up (NVML nvmlDeviceGetNvLinkState){}",
                gf.name,
                if up == 0 {
                    ""
                } else {
                    "; links down lower NV# and P2P bandwidth"
                }
            ),
            format!(
                "check `nvidia-smi nvlink -s` and `nvidia-smi -q -d NVLINK` for links down or \
                 with errors; reseat or service the baseboard; on NVSwitch systems check \
                 nvidia-fabricmanager{}",
                if up == 0 {
                    ". Until a link is up, UCX's default also turns cuda_ipc's GPU → GPU reads \
                     (gets) between processes off on this GPU and emulates them in software \
                     (openucx/ucx PR #7566; seen with UCX 1.22 on a one-GPU H200 VM): gdpath \
                     sets UCX_CUDA_IPC_ENABLE_GET_ZCOPY=y unless the environment sets it; \
                     other UCX applications need that setting, or post writes"
                } else {
                    ""
                }
            ),
        )),
        Some(n) => Some(finding(
            id,
            A,
            s,
            Status::Ok,
            format!("{}: {up} of {n} NVLinks up (NVML)", gf.name),
            "",
        )),
        None if up > 0 => Some(finding(
            id,
            A,
            s,
            Status::Ok,
            format!(
                "{}: {up} NVLinks up (NVML); no reference count for this model",
                gf.name
            ),
            "",
        )),
        None => None,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn norms_and_visible() {
        assert_eq!(nvlink_norm("NVIDIA H200"), Some(18));
        assert_eq!(nvlink_norm("NVIDIA H200 NVL"), None);
        assert_eq!(nvlink_norm("NVIDIA H100 PCIe"), None);
        assert_eq!(nvlink_norm("NVIDIA A100-SXM4-80GB"), Some(12));
        // PCI ID names (gdpath-topo's table) as well as NVML's.
        assert_eq!(nvlink_norm("A100 SXM4 40GB"), Some(12));
        assert_eq!(nvlink_norm("A100 PCIe 80GB"), None);
        assert_eq!(nvlink_norm("Tesla V100-SXM2-32GB"), Some(6));
        assert_eq!(nvlink_norm("NVIDIA L4"), None);
        assert_eq!(visible_ordinals("0,1"), Some(vec![0, 1]));
        assert_eq!(visible_ordinals("1,-1,0"), Some(vec![1]));
        assert_eq!(visible_ordinals(""), Some(vec![]));
        assert_eq!(visible_ordinals("GPU-972c1a7c"), None);
    }
}
