//! Helpers shared by the fixture tests.
#![allow(dead_code)]

use gdpath_topo::{Device, Machine, PciAddr};
use std::path::{Path, PathBuf};

/// `../shared/fixtures` from the workspace root, or `$GDPATH_FIXTURES`. Missing is a failure.
pub fn fixtures() -> PathBuf {
    let dir = std::env::var_os("GDPATH_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| {
            PathBuf::from(concat!(
                env!("CARGO_MANIFEST_DIR"),
                "/../../../shared/fixtures"
            ))
        });
    assert!(
        dir.join("INDEX.md").is_file(),
        "fixture directory {} not found (set GDPATH_FIXTURES to the shared/fixtures folder)",
        dir.display()
    );
    dir
}

pub fn fixture(rel: &str) -> PathBuf {
    let p = fixtures().join(rel);
    assert!(p.is_file(), "fixture {} missing", p.display());
    p
}

/// Unpacks a hwloc sysfs tarball (.tar.bz2) into a temp dir; returns the dir guard and the one
/// top folder inside it.
pub fn unpack_sysfs(name: &str) -> (tempfile::TempDir, PathBuf) {
    let file = std::fs::File::open(fixture(&format!("hwloc-sysfs/{name}"))).unwrap();
    let tmp = tempdir();
    let mut ar = tar::Archive::new(bzip2::read::BzDecoder::new(file));
    ar.set_preserve_permissions(false);
    ar.unpack(tmp.path()).unwrap();
    let tops: Vec<PathBuf> = std::fs::read_dir(tmp.path())
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.is_dir())
        .collect();
    assert_eq!(tops.len(), 1, "{name}: expected one top folder");
    let top = tops[0].clone();
    (tmp, top)
}

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

pub fn write(root: &Path, rel: &str, text: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::fs::write(p, text).unwrap();
}

pub fn symlink(root: &Path, rel: &str, target: &str) {
    let p = root.join(rel);
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, p).unwrap();
}

/// A temp dir, in /dev/shm when there is one (the dumps hold thousands of small files, which a
/// virtual disk unpacks slowly).
pub fn tempdir() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(t) = tempfile::Builder::new()
            .prefix("gdpath-test")
            .tempdir_in(shm)
        {
            return t;
        }
    }
    tempfile::tempdir().unwrap()
}
