//! File access for every read gdpath makes of `/sys` and `/proc`.
//!
//! All readers (the sysfs reader here, the doctor in the engine) go through a [`SysView`], so
//! the same code reads the live machine ([`DirView::live`]), a copied tree ([`DirView::new`],
//! e.g. hwloc's test dumps), or a captured snapshot ([`crate::snapshot::SnapshotView`]).
//! Wrapping any of them in a [`Recording`] logs what was read: that is what
//! `gdpath topo capture` writes out.
//!
//! Paths are absolute-style (`/sys/bus/pci/devices`) and are resolved under the view's root.
//! Symbolic links are followed by the view itself ([`SysView::resolve`]), one component at a
//! time, so that links inside a copied tree never escape it and a snapshot can replay them.

use std::collections::{BTreeMap, BTreeSet};
use std::io;
use std::path::{Path, PathBuf};
use std::sync::{Mutex, MutexGuard};

/// Most links followed while resolving one path (Linux's `MAXSYMLINKS`).
const MAX_LINK_HOPS: usize = 40;

/// Read-only access to a `/sys` + `/proc` tree.
///
/// Implementations provide three primitives on *canonical* paths (no link in any component but
/// possibly the last, for [`SysView::link_canonical`]); callers use the provided methods, which
/// take any absolute-style path and follow links.
pub trait SysView: Send + Sync {
    /// Contents of the file at canonical `path`.
    fn read_canonical(&self, path: &str) -> io::Result<Vec<u8>>;
    /// Entry names of the directory at canonical `path`, sorted.
    fn list_canonical(&self, path: &str) -> io::Result<Vec<String>>;
    /// Target of the symbolic link at `path` as stored (`../../devices/...`); `path`'s parent is
    /// canonical. An error when `path` is not a link.
    fn link_canonical(&self, path: &str) -> io::Result<String>;

    /// `path` with every symbolic link along it replaced by its target, e.g.
    /// `/sys/bus/pci/devices/0000:00:06.0` → `/sys/devices/pci0000:00/0000:00:06.0`.
    /// Components that do not exist are kept as they are. Errors only on a link loop.
    fn resolve(&self, path: &str) -> io::Result<String> {
        let mut done: Vec<String> = Vec::new();
        let mut todo: Vec<String> = components(path).into_iter().rev().collect();
        let mut hops = 0;
        while let Some(c) = todo.pop() {
            match c.as_str() {
                "." => continue,
                ".." => {
                    done.pop();
                    continue;
                }
                _ => done.push(c),
            }
            if let Ok(target) = self.link_canonical(&join(&done)) {
                hops += 1;
                if hops > MAX_LINK_HOPS {
                    return Err(io::Error::other(format!("link loop resolving {path}")));
                }
                done.pop();
                if target.starts_with('/') {
                    done.clear();
                }
                todo.extend(components(&target).into_iter().rev());
            }
        }
        Ok(join(&done))
    }

    /// Contents of the file at `path`.
    fn read(&self, path: &str) -> io::Result<Vec<u8>> {
        self.read_canonical(&self.resolve(path)?)
    }

    /// Entry names of the directory at `path`, sorted.
    fn read_dir(&self, path: &str) -> io::Result<Vec<String>> {
        self.list_canonical(&self.resolve(path)?)
    }

    /// Target of the symbolic link at `path`, as stored.
    fn read_link(&self, path: &str) -> io::Result<String> {
        let norm = normalize(path);
        let (parent, name) = norm.rsplit_once('/').unwrap_or(("", norm.as_str()));
        let parent = self.resolve(if parent.is_empty() { "/" } else { parent })?;
        self.link_canonical(&format!("{}/{name}", parent.trim_end_matches('/')))
    }

    /// Contents of a file as trimmed UTF-8 text; `None` when unreadable or not UTF-8.
    fn read_text(&self, path: &str) -> Option<String> {
        let bytes = self.read(path).ok()?;
        String::from_utf8(bytes).ok().map(|s| s.trim().to_owned())
    }
}

impl<V: SysView + ?Sized> SysView for &V {
    fn read_canonical(&self, path: &str) -> io::Result<Vec<u8>> {
        (**self).read_canonical(path)
    }
    fn list_canonical(&self, path: &str) -> io::Result<Vec<String>> {
        (**self).list_canonical(path)
    }
    fn link_canonical(&self, path: &str) -> io::Result<String> {
        (**self).link_canonical(path)
    }
}

fn components(path: &str) -> Vec<String> {
    path.split('/')
        .filter(|c| !c.is_empty() && *c != ".")
        .map(str::to_owned)
        .collect()
}

fn join(parts: &[String]) -> String {
    format!("/{}", parts.join("/"))
}

/// Normalises an absolute-style path: one leading `/`, no empty or `.` components.
pub fn normalize(path: &str) -> String {
    join(&components(path))
}

/// A real directory tree: the live root `/` or a copy of one (`--sysfs-root DIR`).
#[derive(Debug, Clone)]
pub struct DirView {
    root: PathBuf,
}

impl DirView {
    /// The live machine.
    pub fn live() -> Self {
        DirView::new("/")
    }

    /// A copied tree: `/sys/...` is read from `root/sys/...`.
    pub fn new(root: impl Into<PathBuf>) -> Self {
        DirView { root: root.into() }
    }

    /// The directory this view reads under.
    pub fn root(&self) -> &Path {
        &self.root
    }

    fn host_path(&self, path: &str) -> PathBuf {
        let mut p = self.root.clone();
        p.extend(components(path));
        p
    }
}

impl SysView for DirView {
    /// At most [`crate::input::MAX_SYSFS_FILE_BYTES`], opened non-blocking (a FIFO placed in a
    /// copied tree reads as empty instead of hanging; `/dev/zero` stops at the limit).
    fn read_canonical(&self, path: &str) -> io::Result<Vec<u8>> {
        crate::input::read_limited(&self.host_path(path), crate::input::MAX_SYSFS_FILE_BYTES)
    }

    fn list_canonical(&self, path: &str) -> io::Result<Vec<String>> {
        let mut names = Vec::new();
        for e in std::fs::read_dir(self.host_path(path))? {
            names.push(e?.file_name().to_string_lossy().into_owned());
        }
        names.sort();
        Ok(names)
    }

    fn link_canonical(&self, path: &str) -> io::Result<String> {
        Ok(std::fs::read_link(self.host_path(path))?
            .to_string_lossy()
            .into_owned())
    }
}

/// What a [`Recording`] saw: every file read, link followed and directory listed, by canonical
/// path. Failed reads are not kept (replaying them fails the same way: the entry is absent).
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Record {
    /// Every file read: canonical path → its bytes.
    pub files: BTreeMap<String, Vec<u8>>,
    /// Every link followed: canonical path → its target.
    pub links: BTreeMap<String, String>,
    /// Every directory listed: canonical path → its entries' names.
    pub listings: BTreeMap<String, Vec<String>>,
}

impl Record {
    /// All paths touched, sorted.
    pub fn paths(&self) -> BTreeSet<&str> {
        self.files
            .keys()
            .chain(self.links.keys())
            .chain(self.listings.keys())
            .map(String::as_str)
            .collect()
    }
}

/// A view that logs every successful read of the view it wraps. Readers above gdpath-topo (the
/// doctor) read through the same recording, so `capture` holds their files too.
#[derive(Debug)]
pub struct Recording<V> {
    inner: V,
    record: Mutex<Record>,
}

impl<V: SysView> Recording<V> {
    /// Starts recording reads of `inner`.
    pub fn new(inner: V) -> Self {
        Recording {
            inner,
            record: Mutex::new(Record::default()),
        }
    }

    /// A copy of what has been read so far.
    pub fn record(&self) -> Record {
        self.lock().clone()
    }

    /// The wrapped view.
    pub fn inner(&self) -> &V {
        &self.inner
    }

    fn lock(&self) -> MutexGuard<'_, Record> {
        // A panic while holding the lock cannot leave a Record half-updated in a harmful way
        // (each update is one insert), so a poisoned lock is still usable.
        self.record.lock().unwrap_or_else(|e| e.into_inner())
    }
}

impl<V: SysView> SysView for Recording<V> {
    fn read_canonical(&self, path: &str) -> io::Result<Vec<u8>> {
        let data = self.inner.read_canonical(path)?;
        self.lock().files.insert(normalize(path), data.clone());
        Ok(data)
    }

    fn list_canonical(&self, path: &str) -> io::Result<Vec<String>> {
        let names = self.inner.list_canonical(path)?;
        self.lock().listings.insert(normalize(path), names.clone());
        Ok(names)
    }

    fn link_canonical(&self, path: &str) -> io::Result<String> {
        let target = self.inner.link_canonical(path)?;
        self.lock().links.insert(normalize(path), target.clone());
        Ok(target)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn resolves_links_inside_the_root() {
        let dir = tempfile::tempdir().unwrap();
        let root = dir.path();
        std::fs::create_dir_all(root.join("sys/devices/pci0000:00/0000:00:06.0")).unwrap();
        std::fs::write(
            root.join("sys/devices/pci0000:00/0000:00:06.0/class"),
            "0x030200\n",
        )
        .unwrap();
        std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
        std::os::unix::fs::symlink(
            "../../../devices/pci0000:00/0000:00:06.0",
            root.join("sys/bus/pci/devices/0000:00:06.0"),
        )
        .unwrap();
        // An absolute link must stay inside the root.
        std::os::unix::fs::symlink("/sys/devices", root.join("sys/abs")).unwrap();

        let v = Recording::new(DirView::new(root));
        assert_eq!(
            v.resolve("/sys/bus/pci/devices/0000:00:06.0").unwrap(),
            "/sys/devices/pci0000:00/0000:00:06.0"
        );
        assert_eq!(
            v.read_text("/sys/bus/pci/devices/0000:00:06.0/class")
                .as_deref(),
            Some("0x030200")
        );
        assert_eq!(
            v.read_dir("/sys/abs").unwrap(),
            vec!["pci0000:00".to_owned()]
        );
        let rec = v.record();
        assert!(rec
            .files
            .contains_key("/sys/devices/pci0000:00/0000:00:06.0/class"));
        assert!(rec.links.contains_key("/sys/bus/pci/devices/0000:00:06.0"));
        assert!(v.read("/sys/nope").is_err());
    }

    #[test]
    fn link_loop_is_an_error() {
        let dir = tempfile::tempdir().unwrap();
        std::os::unix::fs::symlink("b", dir.path().join("a")).unwrap();
        std::os::unix::fs::symlink("a", dir.path().join("b")).unwrap();
        let v = DirView::new(dir.path());
        assert!(v.resolve("/a/x").is_err());
    }
}
