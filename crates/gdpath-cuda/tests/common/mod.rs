//! Reading the H200 probe fixture (`fixtures/device/h200x2-probe-2026-11-30.txt`):
//! what `nvidia-smi` printed on the device machine, used as the expected values of the CPU
//! conversion tests and of the GPU suite.
#![allow(dead_code)]

use std::path::PathBuf;

use gdpath_cuda::facts::p2p_cap_from_code;
use gdpath_topo::facts::P2pCap;

/// The shared fixture folder ([`gdpath_testkit::fixtures`]).
pub fn fixtures_dir() -> PathBuf {
    gdpath_testkit::fixtures()
}

pub fn probe_text() -> String {
    let p = fixtures_dir().join("device/h200x2-probe-2026-11-30.txt");
    std::fs::read_to_string(&p).unwrap_or_else(|e| panic!("reading {}: {e}", p.display()))
}

/// What the probe says about the machine.
#[derive(Debug)]
pub struct Probe {
    /// `Bus Id` lines of `nvidia-smi -q`, NVML form, in GPU order.
    pub nvml_bus_ids: Vec<String>,
    /// sysfs PCI addresses of display controllers of vendor 0x10de (class 0x0302xx).
    pub sysfs_gpus: Vec<String>,
    /// `nvidia-smi topo -p2p X` matrices: (column letter, GPU0->GPU1 code, GPU1->GPU0 code).
    pub p2p: Vec<(char, P2pCap, P2pCap)>,
    /// Codes listed in the p2p legend.
    pub p2p_legend: Vec<String>,
    /// Per GPU, the `Link N: R GB/s` lines of `nvidia-smi nvlink -s`.
    pub nvlinks: Vec<Vec<(u32, f64)>>,
    /// BAR1 `Total` per GPU, MiB.
    pub bar1_total_mib: Vec<u64>,
    /// PCIe (max, current) generation per GPU.
    pub pcie_gen: Vec<(u32, u32)>,
    /// `Driver Version:` and `CUDA Version:` of the nvidia-smi banner.
    pub driver_version: String,
    pub cuda_version: String,
}

pub fn probe() -> Probe {
    let text = probe_text();
    let lines: Vec<&str> = text.lines().collect();
    let field = |l: &str| l.split_once(':').map(|(_, v)| v.trim().to_string());
    let nvml_bus_ids = lines
        .iter()
        .filter(|l| l.trim_start().starts_with("Bus Id"))
        .filter_map(|l| field(l))
        .collect();
    let sysfs_gpus = lines
        .iter()
        .filter(|l| l.starts_with("/sys/bus/pci/devices/"))
        .filter(|l| l.contains(" 0x0302") && l.contains("0x10de:"))
        .map(|l| {
            l.trim_start_matches("/sys/bus/pci/devices/")
                .split_whitespace()
                .next()
                .unwrap()
                .to_string()
        })
        .collect();
    let mut p2p = Vec::new();
    let mut p2p_legend = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if let Some(c) = l.strip_prefix("+ nvidia-smi topo -p2p ") {
            let col = c.trim().chars().next().unwrap();
            let row = |name: &str| -> Vec<String> {
                lines[i..]
                    .iter()
                    .find(|r| r.trim_start().starts_with(name))
                    .unwrap()
                    .split_whitespace()
                    .skip(1)
                    .map(str::to_string)
                    .collect()
            };
            let g0 = row("GPU0\tX");
            let g1 = row("GPU1\t");
            p2p.push((
                col,
                p2p_cap_from_code(&g0[1]).unwrap_or_else(|| panic!("code {:?}", g0[1])),
                p2p_cap_from_code(&g1[0]).unwrap_or_else(|| panic!("code {:?}", g1[0])),
            ));
        }
        if let Some((code, _)) = l.trim().split_once(" = ") {
            let code = code.trim();
            if lines[i.saturating_sub(16)..i]
                .iter()
                .any(|x| x.contains("topo -p2p"))
                && !p2p_legend.iter().any(|c| c == code)
            {
                p2p_legend.push(code.to_string());
            }
        }
    }
    let mut nvlinks: Vec<Vec<(u32, f64)>> = Vec::new();
    for l in &lines {
        if l.starts_with("GPU ") && l.contains("(UUID:") {
            nvlinks.push(Vec::new());
        } else if let Some(rest) = l.trim().strip_prefix("Link ") {
            let (n, r) = rest.split_once(':').unwrap();
            let gbps = r.trim().trim_end_matches("GB/s").trim().parse().unwrap();
            nvlinks.last_mut().unwrap().push((n.parse().unwrap(), gbps));
        }
    }
    let mut bar1_total_mib = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() == "BAR1 Memory Usage" {
            let total = field(lines[i + 1]).unwrap();
            bar1_total_mib.push(total.trim_end_matches("MiB").trim().parse().unwrap());
        }
    }
    let mut pcie_gen = Vec::new();
    for (i, l) in lines.iter().enumerate() {
        if l.trim() == "PCIe Generation" {
            let max = field(lines[i + 1]).unwrap().parse().unwrap();
            let cur = field(lines[i + 2]).unwrap().parse().unwrap();
            pcie_gen.push((max, cur));
        }
    }
    let banner = lines
        .iter()
        .find(|l| l.contains("Driver Version:"))
        .unwrap();
    let after = |key: &str| {
        banner
            .split(key)
            .nth(1)
            .unwrap()
            .split_whitespace()
            .next()
            .unwrap()
            .to_string()
    };
    Probe {
        nvml_bus_ids,
        sysfs_gpus,
        p2p,
        p2p_legend,
        nvlinks,
        bar1_total_mib,
        pcie_gen,
        driver_version: after("Driver Version:"),
        cuda_version: after("CUDA Version:"),
    }
}
