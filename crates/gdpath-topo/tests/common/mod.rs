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

/// A snapshot replay's JSON is the original's, except that it names the replayed source
/// (`"source": "snapshot"`) and the one it was captured from (`"captured_from"`), and, when the
/// capture had no driver facts, gives the snapshot as the reason NVLink is unknown.
pub fn assert_replay_matches(original: &Machine, replay: &Machine) {
    assert_eq!(replay.source, "snapshot");
    assert_eq!(
        replay.captured_from.as_deref(),
        Some(original.source.as_str())
    );
    let mut a = serde_json::to_value(original.report()).unwrap();
    let mut b = serde_json::to_value(replay.report()).unwrap();
    assert!(a.get("captured_from").is_none());
    assert_eq!(b["captured_from"], original.source.as_str());
    if original.driver.is_none() {
        let why = replay.coverage.nvlink.gap().unwrap();
        assert!(why.contains("snapshot holds no driver facts"), "{why}");
        b["coverage"]["nvlink"] = a["coverage"]["nvlink"].clone();
        // The NVLink warning names the source and its reason.
        let pos = |v: &serde_json::Value| {
            v["warnings"]
                .as_array()
                .unwrap()
                .iter()
                .position(|w| w["id"] == "topo.nvlink-unknown")
        };
        if let (Some(i), Some(j)) = (pos(&a), pos(&b)) {
            assert!(b["warnings"][j]["message"]
                .as_str()
                .unwrap()
                .contains("this source (snapshot)"));
            b["warnings"][j] = a["warnings"][i].clone();
        }
    }
    for v in [&mut a, &mut b] {
        let o = v.as_object_mut().unwrap();
        o.remove("source");
        o.remove("captured_from");
    }
    if a != b {
        let (a, b) = (
            serde_json::to_string_pretty(&a).unwrap(),
            serde_json::to_string_pretty(&b).unwrap(),
        );
        let first = a.lines().zip(b.lines()).position(|(x, y)| x != y);
        panic!("snapshot replay differs from line {first:?} of the original's JSON");
    }
}
