//! Filling [`gdpath_topo::facts::DriverFacts`] from the live driver.
//!
//! CUDA gives ordinals, names, memory, the GPUDirect RDMA and dma-buf attributes and the P2P
//! attributes of each ordered pair; NVML gives BAR1, the PCIe link, NVLink and NVML's P2P status.
//! GPUs are matched between the two by PCI address (CUDA's order may differ from NVML's, and
//! `CUDA_VISIBLE_DEVICES` hides GPUs from CUDA only).

use gdpath_topo::facts::{DriverFacts, FactGap, FactSource, GpuFacts, GpuPairFacts, P2pCap};

use crate::cuda::{Cuda, DeviceAttribute};
use crate::error::CudaError;
use crate::nvml::{self, NvmlFacts};
pub use crate::pci::normalize_pci;

/// A P2P code as `nvidia-smi topo -p2p` prints it (`OK`, `CNS`, `GNS`, `TNS`, `NS`, `U`).
pub fn p2p_cap_from_code(code: &str) -> Option<P2pCap> {
    Some(match code.trim() {
        "OK" => P2pCap::Ok,
        "CNS" => P2pCap::Cns,
        "GNS" => P2pCap::Gns,
        "TNS" => P2pCap::Tns,
        "NS" => P2pCap::Ns,
        "U" => P2pCap::U,
        _ => return None,
    })
}

fn gap(source: FactSource, what: impl Into<String>, reason: impl ToString) -> FactGap {
    FactGap {
        source,
        what: what.into(),
        reason: reason.to_string(),
    }
}

/// Read [`DriverFacts`] from the CUDA driver and NVML.
///
/// Degrades: with one of the two missing or failing, the facts of the other are returned and
/// the reason is recorded in `DriverFacts::gaps`; a single failed query leaves that field `None`
/// with a gap. Without CUDA, GPUs are listed in NVML order and `ordinal` is the NVML index.
///
/// Errors: only when neither CUDA nor NVML can be used — the CUDA error is returned (e.g.
/// [`CudaError::LibraryMissing`] for `libcuda.so.1`).
pub fn gather_facts() -> Result<DriverFacts, CudaError> {
    let cuda = Cuda::load();
    let nv = nvml::read();
    let mut facts = DriverFacts::default();
    match (&cuda, &nv) {
        (Err(ce), Err(_)) => return Err(ce.clone()),
        (Err(ce), Ok(_)) => facts.gaps.push(gap(FactSource::Cuda, "all CUDA facts", ce)),
        (Ok(_), Err(ne)) => facts.gaps.push(gap(FactSource::Nvml, "all NVML facts", ne)),
        (Ok(_), Ok(_)) => {}
    }
    if let Ok(cuda) = &cuda {
        cuda_facts(cuda, &mut facts)?;
    }
    if let Ok(nv) = &nv {
        merge_nvml(nv, cuda.is_ok(), &mut facts);
    }
    Ok(facts)
}

fn cuda_facts(cuda: &Cuda, facts: &mut DriverFacts) -> Result<(), CudaError> {
    facts.cuda_driver_version = cuda.driver_version().ok();
    let devices = cuda.devices()?;
    for d in &devices {
        let o = d.ordinal();
        let mut g = GpuFacts {
            ordinal: o,
            ..Default::default()
        };
        let mut note = |what: &str, e: CudaError| {
            facts
                .gaps
                .push(gap(FactSource::Cuda, format!("GPU {o} {what}"), e))
        };
        match d.pci_bus_id() {
            Ok(p) => g.pci = p,
            Err(e) => note("PCI bus id", e),
        }
        match d.name() {
            Ok(n) => g.name = n,
            Err(e) => note("name", e),
        }
        match d.total_memory() {
            Ok(m) => g.memory_bytes = m,
            Err(e) => note("memory", e),
        }
        // Older drivers reject attributes they do not know with CUDA_ERROR_INVALID_VALUE.
        g.gdr_supported = match d.attribute(DeviceAttribute::GPU_DIRECT_RDMA_SUPPORTED) {
            Ok(v) => Some(v != 0),
            Err(e) => {
                note("GPUDirect RDMA attribute", e);
                None
            }
        };
        g.dma_buf_supported = match d.attribute(DeviceAttribute::DMA_BUF_SUPPORTED) {
            Ok(v) => Some(v != 0),
            Err(e) => {
                note("dma-buf attribute", e);
                None
            }
        };
        facts.gpus.push(g);
    }
    for a in &devices {
        for b in &devices {
            if a.ordinal() == b.ordinal() {
                continue;
            }
            let cuda_attrs = match a.p2p_attributes(b) {
                Ok(x) => Some(x),
                Err(e) => {
                    facts.gaps.push(gap(
                        FactSource::Cuda,
                        format!("P2P attributes {}->{}", a.ordinal(), b.ordinal()),
                        e,
                    ));
                    None
                }
            };
            facts.pairs.push(GpuPairFacts {
                a: a.ordinal(),
                b: b.ordinal(),
                nvml: None,
                cuda: cuda_attrs,
            });
        }
    }
    Ok(())
}

/// Merge NVML's facts into `facts`. With `have_cuda`, NVML GPUs are matched to CUDA's by PCI
/// address (NVML GPUs CUDA does not see are left out); without, NVML's list is the GPU list.
pub fn merge_nvml(nv: &NvmlFacts, have_cuda: bool, facts: &mut DriverFacts) {
    facts.driver_version = nv.driver_version.clone();
    if facts.cuda_driver_version.is_none() {
        facts.cuda_driver_version = nv.cuda_driver_version;
    }
    if !have_cuda {
        for n in &nv.gpus {
            facts.gpus.push(GpuFacts {
                ordinal: n.index,
                pci: n.pci.clone(),
                name: n.name.clone().unwrap_or_default(),
                memory_bytes: n.memory_bytes.unwrap_or(0),
                ..Default::default()
            });
        }
        for (a, b, _) in &nv.p2p {
            facts.pairs.push(GpuPairFacts {
                a: *a,
                b: *b,
                nvml: None,
                cuda: None,
            });
        }
    }
    // NVML index -> our ordinal, by PCI address.
    let ordinal_of = |nvml_index: u32| -> Option<u32> {
        let pci = &nv.gpus.iter().find(|g| g.index == nvml_index)?.pci;
        facts.gpus.iter().find(|g| &g.pci == pci).map(|g| g.ordinal)
    };
    let ordinals: Vec<(u32, Option<u32>)> = nv
        .gpus
        .iter()
        .map(|g| (g.index, ordinal_of(g.index)))
        .collect();
    let map = |i: u32| ordinals.iter().find(|(n, _)| *n == i).and_then(|(_, o)| *o);
    for n in &nv.gpus {
        let Some(o) = map(n.index) else { continue };
        let Some(g) = facts.gpus.iter_mut().find(|g| g.ordinal == o) else {
            continue;
        };
        g.bar1_total_bytes = n.bar1_total_bytes;
        g.bar1_used_bytes = n.bar1_used_bytes;
        g.pcie = n.pcie;
        g.nvlinks = n.nvlinks.clone();
        if g.name.is_empty() {
            g.name = n.name.clone().unwrap_or_default();
        }
        for (what, reason) in &n.gaps {
            facts
                .gaps
                .push(gap(FactSource::Nvml, format!("GPU {o} {what}"), reason));
        }
    }
    for (a, b, s) in &nv.p2p {
        let (Some(oa), Some(ob)) = (map(*a), map(*b)) else {
            continue;
        };
        if let Some(p) = facts.pairs.iter_mut().find(|p| p.a == oa && p.b == ob) {
            p.nvml = Some(*s);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn p2p_codes_round_trip() {
        for c in [
            P2pCap::Ok,
            P2pCap::Cns,
            P2pCap::Gns,
            P2pCap::Tns,
            P2pCap::Ns,
            P2pCap::U,
        ] {
            assert_eq!(p2p_cap_from_code(c.code()), Some(c));
        }
        assert_eq!(p2p_cap_from_code("X"), None);
    }
}
