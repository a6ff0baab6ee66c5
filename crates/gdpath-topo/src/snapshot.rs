//! Snapshots: a tar.gz of exactly the sysfs and procfs files gdpath read, replayable with
//! `--snapshot`.
//!
//! Layout of the archive:
//! - `manifest.json`: [`Manifest`] — schema id [`SNAPSHOT_SCHEMA`], gdpath version, the source
//!   the machine was read from, and the directory listings the readers made;
//! - `driver.json` (optional): the [`DriverFacts`] known at capture time;
//! - `fs/<path>`: each file read (`fs/sys/devices/pci0000:00/0000:00:06.0/class`) and each
//!   symbolic link followed (as a tar symlink with its original target).
//!
//! Nothing else is stored: no host name, and files that carry serial numbers or other
//! identities (`serial`, `vpd`, `product_uuid`, ...) are refused even when a reader asked for
//! them. Entries are written in sorted order with zero timestamps, so the same reads give the
//! same bytes.

use crate::facts::DriverFacts;
use crate::machine::Machine;
use crate::view::{normalize, Record, Recording, SysView};
use crate::TopoError;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::io::{self, Read, Write};
use std::path::{Path, PathBuf};

/// Schema id in `manifest.json`.
pub const SNAPSHOT_SCHEMA: &str = "gdpath.snapshot/1";

/// Largest single entry accepted when reading a snapshot (sysfs files are at most a few KiB).
const MAX_ENTRY_BYTES: u64 = crate::input::MAX_SYSFS_FILE_BYTES;
/// Largest total of entry sizes accepted (stops decompression bombs).
const MAX_TOTAL_BYTES: u64 = 512 << 20;
/// Most entries accepted.
const MAX_ENTRIES: usize = 1 << 20;

/// File names never written into a snapshot: they identify a machine or a person.
const PRIVATE_NAMES: [&str; 10] = [
    "serial",
    "product_serial",
    "board_serial",
    "chassis_serial",
    "product_uuid",
    "vpd",
    "hostname",
    "machine-id",
    "node_guid",
    "sys_image_guid",
];

/// The kernel command line, which is stored redacted: see [`redact_cmdline`].
const CMDLINE: &str = "/proc/cmdline";

/// Parameters of the kernel command line kept in a snapshot: those that decide IOMMU and PCIe
/// behaviour for P2P and GDR (kernel-parameters.txt: `iommu`, `intel_iommu`, `amd_iommu`,
/// `iommu.passthrough`, `iommu.strict`, `pci`, `pcie_acs_override`). Everything else (root
/// device UUIDs, console settings, custom tokens) can identify a machine and is dropped.
const CMDLINE_KEPT: [&str; 7] = [
    "iommu",
    "intel_iommu",
    "amd_iommu",
    "iommu.passthrough",
    "iommu.strict",
    "pci",
    "pcie_acs_override",
];

/// `cmdline` with only the [`CMDLINE_KEPT`] parameters, space-separated, newline-terminated.
pub fn redact_cmdline(cmdline: &[u8]) -> Vec<u8> {
    let text = String::from_utf8_lossy(cmdline);
    let kept: Vec<&str> = text
        .split_whitespace()
        .filter(|t| CMDLINE_KEPT.contains(&t.split('=').next().unwrap_or("")))
        .collect();
    let mut out = kept.join(" ").into_bytes();
    out.push(b'\n');
    out
}

/// `manifest.json` of a snapshot.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Manifest {
    /// [`SNAPSHOT_SCHEMA`].
    pub schema: String,
    /// Version of gdpath that wrote it.
    pub gdpath_version: String,
    /// Source the machine was read from (`live` or `sysfs-root`).
    pub source: String,
    /// Number of files and links stored under `fs/`.
    pub files: usize,
    /// Number of symbolic links stored under `fs/`.
    pub links: usize,
    /// Directory listings made while reading, by path.
    pub listings: BTreeMap<String, Vec<String>>,
}

/// What [`capture`] wrote.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct CaptureSummary {
    /// Files stored.
    pub files: usize,
    /// Symbolic links stored.
    pub links: usize,
    /// Directory listings stored.
    pub listings: usize,
    /// Paths read but refused as private (see the module docs).
    pub refused: Vec<String>,
}

fn is_private(path: &str) -> bool {
    path.rsplit('/')
        .next()
        .is_some_and(|n| PRIVATE_NAMES.contains(&n))
}

/// Writes a snapshot of everything `recording` has read (by gdpath-topo and by any reader above
/// it that used the same recording), plus `driver` facts when given, as tar.gz to `out`.
/// `source` is the [`Machine::source`] of the recorded machine.
pub fn capture<V: SysView>(
    recording: &Recording<V>,
    source: &str,
    driver: Option<&DriverFacts>,
    out: impl Write,
) -> Result<CaptureSummary, TopoError> {
    let Record {
        mut files,
        mut links,
        mut listings,
    } = recording.record();
    let mut refused: Vec<String> = files
        .keys()
        .chain(links.keys())
        .filter(|p| is_private(p))
        .cloned()
        .collect();
    refused.sort();
    files.retain(|p, _| !is_private(p));
    if let Some(cmdline) = files.get_mut(CMDLINE) {
        *cmdline = redact_cmdline(cmdline);
    }
    links.retain(|p, _| !is_private(p));
    for names in listings.values_mut() {
        names.retain(|n| !PRIVATE_NAMES.contains(&n.as_str()));
    }
    let manifest = Manifest {
        schema: SNAPSHOT_SCHEMA.to_owned(),
        gdpath_version: env!("CARGO_PKG_VERSION").to_owned(),
        source: source.to_owned(),
        files: files.len(),
        links: links.len(),
        listings: std::mem::take(&mut listings),
    };
    let gz = flate2::write::GzEncoder::new(out, flate2::Compression::default());
    let mut tar = tar::Builder::new(gz);
    let w = |e| TopoError::Write(e);
    let json = serde_json::to_vec_pretty(&manifest)
        .map_err(io::Error::from)
        .map_err(w)?;
    append_file(&mut tar, "manifest.json", &json).map_err(w)?;
    if let Some(d) = driver {
        let json = serde_json::to_vec_pretty(d)
            .map_err(io::Error::from)
            .map_err(w)?;
        append_file(&mut tar, "driver.json", &json).map_err(w)?;
    }
    for (path, data) in &files {
        append_file(&mut tar, &format!("fs{path}"), data).map_err(w)?;
    }
    for (path, target) in &links {
        let mut h = header(tar::EntryType::Symlink, 0);
        tar.append_link(&mut h, format!("fs{path}"), target)
            .map_err(w)?;
    }
    tar.into_inner()
        .map_err(w)?
        .finish()
        .map_err(w)?
        .flush()
        .map_err(w)?;
    Ok(CaptureSummary {
        files: manifest.files,
        links: manifest.links,
        listings: manifest.listings.len(),
        refused,
    })
}

fn header(kind: tar::EntryType, size: u64) -> tar::Header {
    let mut h = tar::Header::new_gnu();
    h.set_entry_type(kind);
    h.set_size(size);
    h.set_mode(if kind == tar::EntryType::Symlink {
        0o777
    } else {
        0o444
    });
    h.set_mtime(0);
    h.set_uid(0);
    h.set_gid(0);
    h
}

fn append_file<W: Write>(tar: &mut tar::Builder<W>, name: &str, data: &[u8]) -> io::Result<()> {
    let mut h = header(tar::EntryType::Regular, data.len() as u64);
    tar.append_data(&mut h, name, data)
}

/// The files of a snapshot, served as a [`SysView`].
#[derive(Debug, Clone, Default)]
pub struct SnapshotView {
    files: BTreeMap<String, Vec<u8>>,
    links: BTreeMap<String, String>,
    listings: BTreeMap<String, Vec<String>>,
}

fn not_found(path: &str) -> io::Error {
    io::Error::new(
        io::ErrorKind::NotFound,
        format!("{path}: not in the snapshot"),
    )
}

impl SysView for SnapshotView {
    fn read_canonical(&self, path: &str) -> io::Result<Vec<u8>> {
        self.files
            .get(&normalize(path))
            .cloned()
            .ok_or_else(|| not_found(path))
    }

    fn list_canonical(&self, path: &str) -> io::Result<Vec<String>> {
        self.listings
            .get(&normalize(path))
            .cloned()
            .ok_or_else(|| not_found(path))
    }

    fn link_canonical(&self, path: &str) -> io::Result<String> {
        self.links
            .get(&normalize(path))
            .cloned()
            .ok_or_else(|| io::Error::new(io::ErrorKind::InvalidInput, "not a link"))
    }
}

/// A snapshot loaded into memory.
#[derive(Debug, Clone)]
pub struct Snapshot {
    /// The snapshot's manifest: versions, source and listings.
    pub manifest: Manifest,
    /// Driver facts captured with it (`driver.json`); `None` when none were.
    pub driver: Option<DriverFacts>,
    /// The stored files, read as a sysfs tree.
    pub view: SnapshotView,
    /// The file it was read from.
    pub path: PathBuf,
}

impl Snapshot {
    /// Opens and checks a snapshot file. A file that is not gzip, not tar, has no
    /// `manifest.json` of schema [`SNAPSHOT_SCHEMA`], or exceeds the size limits is
    /// [`TopoError::NotSnapshot`].
    ///
    /// The file is read through [`crate::input::Bounded`]: at most
    /// [`crate::input::MAX_SNAPSHOT_FILE_BYTES`] ([`TopoError::TooLarge`] past that), opened
    /// non-blocking so that a FIFO without a writer ends instead of hanging.
    pub fn open(path: &Path) -> Result<Snapshot, TopoError> {
        let file = crate::input::open(path).map_err(|e| crate::input::io_error(path, e))?;
        let bounded = crate::input::Bounded::new(file, crate::input::MAX_SNAPSHOT_FILE_BYTES);
        Self::from_reader(io::BufReader::new(bounded), path)
    }

    /// Reads a snapshot from `reader`; `path` names it in errors.
    pub fn from_reader(reader: impl Read, path: &Path) -> Result<Snapshot, TopoError> {
        let bad = |reason: String| TopoError::NotSnapshot {
            path: path.to_owned(),
            reason,
        };
        // A read limit hit under the gzip and tar layers is said as such, not as "damaged".
        let io_bad = |e: io::Error, what: String| match crate::input::limit_of(&e) {
            Some(_) => crate::input::io_error(path, e),
            None => bad(format!("{what} ({e})")),
        };
        let mut archive = tar::Archive::new(flate2::read::GzDecoder::new(reader));
        let mut view = SnapshotView::default();
        let mut manifest: Option<Manifest> = None;
        let mut driver = None;
        let (mut total, mut count) = (0u64, 0usize);
        let entries = archive
            .entries()
            .map_err(|e| io_bad(e, "not a tar.gz archive".into()))?;
        for entry in entries {
            let mut entry = entry.map_err(|e| io_bad(e, "not a tar.gz archive".into()))?;
            count += 1;
            let size = entry.header().size().unwrap_or(u64::MAX);
            total = total.saturating_add(size);
            if count > MAX_ENTRIES || size > MAX_ENTRY_BYTES || total > MAX_TOTAL_BYTES {
                return Err(bad(
                    "larger than any sysfs snapshot (size limits exceeded)".into()
                ));
            }
            let name = entry
                .path()
                .map_err(|e| bad(format!("bad entry name ({e})")))?
                .to_string_lossy()
                .into_owned();
            if name.split('/').any(|c| c == "..") || name.starts_with('/') {
                return Err(bad(format!("unsafe entry name {name:?}")));
            }
            let kind = entry.header().entry_type();
            if kind == tar::EntryType::Symlink {
                if let Some(rest) = name.strip_prefix("fs/") {
                    let target = entry
                        .link_name()
                        .ok()
                        .flatten()
                        .ok_or_else(|| bad(format!("link {name} has no target")))?;
                    view.links
                        .insert(normalize(rest), target.to_string_lossy().into_owned());
                }
                continue;
            }
            if kind != tar::EntryType::Regular {
                continue;
            }
            let mut data = Vec::with_capacity(size as usize);
            entry
                .read_to_end(&mut data)
                .map_err(|e| io_bad(e, format!("damaged entry {name}")))?;
            match name.as_str() {
                "manifest.json" => {
                    let m: Manifest = serde_json::from_slice(&data).map_err(|e| {
                        bad(format!("manifest.json is not a gdpath manifest ({e})"))
                    })?;
                    manifest = Some(m);
                }
                "driver.json" => {
                    driver = Some(
                        serde_json::from_slice(&data)
                            .map_err(|e| bad(format!("driver.json is damaged ({e})")))?,
                    );
                }
                _ => {
                    if let Some(rest) = name.strip_prefix("fs/") {
                        view.files.insert(normalize(rest), data);
                    }
                }
            }
        }
        let manifest = manifest.ok_or_else(|| bad("no manifest.json in the archive".into()))?;
        if manifest.schema != SNAPSHOT_SCHEMA {
            return Err(bad(format!(
                "manifest schema is {:?}, expected {SNAPSHOT_SCHEMA:?}",
                manifest.schema
            )));
        }
        view.listings = manifest.listings.clone();
        Ok(Snapshot {
            manifest,
            driver,
            view,
            path: path.to_owned(),
        })
    }

    /// The machine the snapshot holds, read exactly as the original was, with its driver facts.
    /// Its [`Machine::source`] is `snapshot` (a replay never claims to be the machine it runs
    /// on) and [`Machine::captured_from`] the manifest's source. Without `driver.json`, NVLink
    /// is unknown because the capture had no driver facts.
    pub fn machine(&self) -> Result<Machine, TopoError> {
        let mut m = crate::sysfs::read_machine(&self.view, "snapshot")?;
        m.captured_from = Some(self.manifest.source.clone());
        match &self.driver {
            Some(d) => m.set_driver(d.clone()),
            None => {
                m.coverage.nvlink = crate::coverage::Facet::unknown(
                    "the snapshot holds no driver facts (driver.json): it was captured without \
                     the NVIDIA driver, and sysfs does not describe NVLink",
                )
            }
        }
        Ok(m)
    }
}

#[cfg(test)]
mod tests {
    use super::redact_cmdline;

    #[test]
    fn cmdline_keeps_only_iommu_and_pci_parameters() {
        let line = b"BOOT_IMAGE=/vmlinuz-6.8 root=UUID=1234-abcd ro quiet intel_iommu=on iommu=pt \
                     pci=realloc console=ttyS0 hostname=gpu-node-17\n";
        assert_eq!(
            redact_cmdline(line),
            b"intel_iommu=on iommu=pt pci=realloc\n".to_vec()
        );
        assert_eq!(redact_cmdline(b""), b"\n".to_vec());
    }
}
