//! Helpers shared by the fixture tests.
#![allow(dead_code, unused_imports)]

pub use gdpath_testkit::{fixture, fixtures, scratch as tempdir, symlink, unpack_sysfs, write};
use gdpath_topo::{Device, Machine, PciAddr};
use std::path::{Path, PathBuf};

pub fn pci(s: &str) -> PciAddr {
    s.parse().unwrap()
}

pub fn dev<'a>(m: &'a Machine, s: &str) -> &'a Device {
    m.device(&pci(s))
        .unwrap_or_else(|| panic!("no device {s} in {}", m.source))
}

pub fn class(m: &Machine, a: &str, b: &str) -> String {
    m.classify(dev(m, a), dev(m, b)).to_string()
}

pub fn ids(m: &Machine, f: impl Fn(&Device) -> bool) -> Vec<String> {
    m.devices
        .iter()
        .filter(|d| f(d))
        .map(|d| d.pci.to_string())
        .collect()
}
