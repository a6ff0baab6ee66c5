//! Test helpers shared by the test suites of gdpath's crates (a dev-dependency only; nothing
//! here ships): where the shared fixtures are, unpacking the hwloc sysfs tarballs, scratch
//! directories and small file trees.
//!
//! Fixtures: `$GDPATH_FIXTURES` when set (test binaries copied to another machine carry them
//! beside themselves), else the repository's own `fixtures/` folder (vendored with their
//! sources and licences, `fixtures/README.md`). A missing folder or file is a test failure that
//! names the path, never a silent skip.

use std::path::{Path, PathBuf};

#[cfg(feature = "agent")]
pub mod gpu;

/// The root of the checkout under test: from the tested crate's folder, which `cargo test`
/// sets as CARGO_MANIFEST_DIR for the test process; else where this crate was compiled; else
/// the current directory (a test binary copied to a GPU machine runs from a checkout's root).
/// The first that holds `Cargo.lock`. A path compiled into a test (`env!`) is not enough:
/// `.ci/run` shares one target folder between the checkout and its fresh clone, so a binary
/// cargo does not rebuild keeps the other checkout's paths.
pub fn repo_root() -> PathBuf {
    let candidates = [
        std::env::var_os("CARGO_MANIFEST_DIR").map(|m| PathBuf::from(m).join("../..")),
        Some(PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../.."))),
        std::env::current_dir().ok(),
    ];
    candidates
        .into_iter()
        .flatten()
        .find(|d| d.join("Cargo.lock").is_file())
        .unwrap_or_else(|| PathBuf::from(concat!(env!("CARGO_MANIFEST_DIR"), "/../..")))
}

/// `rel` under [`repo_root`], as text (for command lines), made once per path.
pub fn repo_path(rel: &str) -> &'static str {
    use std::collections::HashMap;
    use std::sync::{Mutex, OnceLock};
    static PATHS: OnceLock<Mutex<HashMap<String, &'static str>>> = OnceLock::new();
    let mut m = PATHS
        .get_or_init(Default::default)
        .lock()
        .unwrap_or_else(|p| p.into_inner());
    m.entry(rel.to_owned()).or_insert_with(|| {
        Box::leak(
            repo_root()
                .join(rel)
                .to_string_lossy()
                .into_owned()
                .into_boxed_str(),
        )
    })
}

/// The embedded snapshot of the two-GPU H200 machine (`assets/snapshots/h200x2.tar.gz`).
pub fn h200x2_snapshot() -> &'static str {
    repo_path("assets/snapshots/h200x2.tar.gz")
}

/// The fixture folder (see the crate docs). Panics, naming the path, when it does not exist.
pub fn fixtures() -> PathBuf {
    let dir = std::env::var_os("GDPATH_FIXTURES")
        .map(PathBuf::from)
        .unwrap_or_else(|| repo_root().join("fixtures"));
    assert!(
        dir.is_dir(),
        "fixture directory {} not found (set GDPATH_FIXTURES to the repository's fixtures folder)",
        dir.display()
    );
    dir
}

/// The fixture files in folder `dir` whose names end with `ext`, sorted. Panics when there are
/// none (a test over every fixture of a kind must not pass over none).
pub fn fixture_files(dir: &str, ext: &str) -> Vec<PathBuf> {
    let mut v: Vec<PathBuf> = std::fs::read_dir(fixtures().join(dir))
        .unwrap()
        .map(|e| e.unwrap().path())
        .filter(|p| p.to_string_lossy().ends_with(ext))
        .collect();
    v.sort();
    assert!(!v.is_empty(), "no {ext} fixtures in {dir}");
    v
}

/// A `bench h2d --json` document (schema `gdpath.bench/1`) of recorded figures, for drawing:
/// the medians of docs/benchmarks.md's H2D rows of the two-GPU H200 machine (pinned and
/// pageable at 64 MiB / 256 MiB / 1 GiB), each as its own min and max, with the Gen5 x16 limit,
/// so that drawings are tested on figures a real machine gave.
pub fn h2d_bench_json() -> String {
    let row = |path: &str, bytes: u64, g: f64| {
        format!(
            r#"{{"path":"{path}","op":"copy","bytes":{bytes},"block":{bytes},"qd":1,"gbps_min":{g},"gbps_median":{g},"gbps_max":{g},"iops":0,"latency_us_p50":0,"latency_us_p99":0,"verified":true,"src":"host","dst":"GPU0","limit_gbps":63.015}}"#
        )
    };
    let rows: Vec<String> = [
        (64u64 << 20, 54.58, 30.71),
        (256 << 20, 54.59, 41.30),
        (1 << 30, 55.18, 45.95),
    ]
    .iter()
    .flat_map(|&(b, p, q)| [row("h2d-pinned", b, p), row("h2d-pageable", b, q)])
    .collect();
    format!(
        r#"{{"schema":"gdpath.bench/1","command":"bench h2d","rows":[{}]}}"#,
        rows.join(",")
    )
}

/// The fixture file `rel` (e.g. `nccl-xml/nccl-aws-p4d-24xl-topo.xml`). Panics when missing.
pub fn fixture(rel: &str) -> PathBuf {
    let p = fixtures().join(rel);
    assert!(p.is_file(), "fixture {} missing", p.display());
    p
}

/// Driver facts of the two-GPU H200 machine (nvidia-h200-x2) as its probe
/// (`device/h200x2-probe-2026-11-30.txt`) and gdpath-cuda's device run on it show them,
/// as `gdpath_topo::facts::DriverFacts` JSON (`gdpath p2p --facts` reads the same form):
/// driver 580.159.04, CUDA 13.0 (13000); two NVIDIA H200 at 0000:00:06.0 and 0000:00:07.0 with
/// 143771 MiB, BAR1 262144 MiB (1 MiB used), PCIe Gen5 x16 of Gen5 x16; 18 NVLinks 4.0 of
/// 26.562 GB/s each, whose remote end NVML reports as an NVSwitch at `ffffffff:ff:ff.0` that
/// the VM does not see; `topo -p2p` OK for read, write, NVLink and atomics, NS for PCIe; CUDA
/// peer access, native atomics and array access, performance rank 0. The CUDA GDR and dma-buf
/// attributes are not in the probe (`null`). One copy for every crate's tests.
pub const H200_DRIVER_FACTS_JSON: &str = include_str!("../data/h200x2-driver-facts.json");

/// A temporary directory on tmpfs (`/dev/shm`) when there is one, else in the system temp
/// folder: unpacking a sysfs dump of ~9000 small files takes ~14 s on this machine's virtual
/// disk and well under a second on tmpfs.
pub fn scratch() -> tempfile::TempDir {
    let shm = Path::new("/dev/shm");
    if shm.is_dir() {
        if let Ok(t) = tempfile::Builder::new()
            .prefix("gdpath-test")
            .tempdir_in(shm)
        {
            return t;
        }
    }
    tempfile::tempdir().expect("temporary directory")
}

/// Unpacks the hwloc sysfs tarball `hwloc-sysfs/<name>` (`.tar.bz2`) into a [`scratch`]
/// directory; returns its guard and the one top folder inside (the dump's root).
pub fn unpack_sysfs(name: &str) -> (tempfile::TempDir, PathBuf) {
    let file = std::fs::File::open(fixture(&format!("hwloc-sysfs/{name}"))).unwrap();
    let tmp = scratch();
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

/// Writes `data` at `root/rel`, creating the folders above it. An existing file is replaced,
/// not opened for writing (the sysfs dumps' files are read-only).
pub fn write(root: &Path, rel: &str, data: impl AsRef<[u8]>) {
    let p = root.join(rel.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    let _ = std::fs::remove_file(&p);
    std::fs::write(p, data).unwrap();
}

/// Makes `root/rel` a symbolic link to `target`, creating the folders above it.
pub fn symlink(root: &Path, rel: &str, target: &str) {
    let p = root.join(rel.trim_start_matches('/'));
    std::fs::create_dir_all(p.parent().unwrap()).unwrap();
    std::os::unix::fs::symlink(target, p).unwrap();
}

/// The directories the GPU suites test the file ↔ GPU paths in: `$GDPATH_GDS_DIRS`
/// (colon-separated) when set, else `/dev/shm` (tmpfs) and `/var/tmp` (usually the root disk).
pub fn gds_dirs() -> Vec<PathBuf> {
    std::env::var("GDPATH_GDS_DIRS")
        .unwrap_or_else(|_| "/dev/shm:/var/tmp".into())
        .split(':')
        .map(PathBuf::from)
        .collect()
}

/// Serialises the tests of one test binary that use UCX: Debian's UCX 1.13 (CI) aborts on
/// `async.c: Assertion handler->async == async` when several UCX contexts in one process create
/// and close endpoints from different threads at once (a socket number reused by another
/// context while UCX still tracks it; seen in CI). Hold the guard for the whole test.
pub fn ucx_serial() -> std::sync::MutexGuard<'static, ()> {
    static LOCK: std::sync::Mutex<()> = std::sync::Mutex::new(());
    LOCK.lock().unwrap_or_else(|p| p.into_inner())
}

/// An IPv4 address of this host's interfaces that is not a loopback one, if there is any: the
/// address a test of what listens beyond loopback needs (none: nothing to leave out, skip).
pub fn external_ipv4() -> Option<std::net::Ipv4Addr> {
    let mut head: *mut libc::ifaddrs = std::ptr::null_mut();
    // SAFETY: getifaddrs fills `head` with a list this function frees below.
    if unsafe { libc::getifaddrs(&mut head) } != 0 {
        return None;
    }
    let mut found = None;
    let mut cur = head;
    while !cur.is_null() {
        // SAFETY: a node of the list, alive until freeifaddrs.
        let ifa = unsafe { &*cur };
        cur = ifa.ifa_next;
        if ifa.ifa_addr.is_null() {
            continue;
        }
        // SAFETY: ifa_addr is a sockaddr of the family it names.
        if i32::from(unsafe { (*ifa.ifa_addr).sa_family }) != libc::AF_INET {
            continue;
        }
        // SAFETY: an AF_INET sockaddr is a sockaddr_in.
        let sin = unsafe { &*ifa.ifa_addr.cast::<libc::sockaddr_in>() };
        let a = std::net::Ipv4Addr::from(u32::from_be(sin.sin_addr.s_addr));
        if !a.is_loopback() {
            found = Some(a);
            break;
        }
    }
    // SAFETY: freed once; nothing points into it any more.
    unsafe { libc::freeifaddrs(head) };
    found
}

/// The uid and gid of `nobody` / `nogroup` on Debian and most distributions: the other user
/// the symbolic-link and ownership tests act as.
pub const NOBODY: u32 = 65534;

/// What [`PlantedLink::victim`] holds: any change to it is a write through the link.
pub const VICTIM_BYTES: &[u8] = b"root's secret, mode 0600\n";

/// The scene of the kernel's `protected_symlinks` rule, made for real: a sticky,
/// world-writable directory (mode 1777, like `/tmp`, inside a scratch directory) where the
/// user `nobody` planted a symbolic link to a file of root's (mode 0600), and root, the writer,
/// is asked to write to the link's name.
pub struct PlantedLink {
    _dir: tempfile::TempDir,
    /// The sticky, world-writable directory the links are in.
    pub sticky: PathBuf,
    /// Root's file (mode 0600, [`VICTIM_BYTES`]) beside `sticky`.
    pub victim: PathBuf,
    /// `sticky/model.safetensors`, a link to `victim` that `nobody` made: refused.
    pub link: PathBuf,
    /// `sticky/own.link`, a link to `victim` that root made: followed.
    pub own_link: PathBuf,
}

impl PlantedLink {
    /// Whether `victim` is as it was: its bytes, owner and mode.
    pub fn victim_untouched(&self) -> bool {
        use std::os::unix::fs::MetadataExt;
        let md = std::fs::metadata(&self.victim).unwrap();
        std::fs::read(&self.victim).unwrap() == VICTIM_BYTES
            && md.uid() == 0
            && md.mode() & 0o7777 == 0o600
    }

    /// gdpath's temporaries (`.NAME.gdpath-tmp-…`) left in `sticky` or beside `victim`.
    pub fn temporaries(&self) -> Vec<PathBuf> {
        [self.sticky.as_path(), self.victim.parent().unwrap()]
            .iter()
            .flat_map(|d| temporaries(d).into_iter().map(|n| d.join(n)))
            .collect()
    }
}

/// The names of gdpath's temporaries (`.NAME.gdpath-tmp-…`, the file crate's `TEMP_MARKER`) in
/// `dir`. Panics when `dir` cannot be listed.
pub fn temporaries(dir: &Path) -> Vec<String> {
    std::fs::read_dir(dir)
        .unwrap()
        .flatten()
        .map(|e| e.file_name().to_string_lossy().into_owned())
        .filter(|n| n.contains(".gdpath-tmp-"))
        .collect()
}

/// Makes a [`PlantedLink`] scene, or `None` (saying so on stderr, naming `test`) when this
/// process is not root: planting as another user and owning the victim need root. Panics when
/// root cannot plant the link as `nobody` (`setpriv` from util-linux).
pub fn planted_link(test: &str) -> Option<PlantedLink> {
    use std::os::unix::fs::PermissionsExt;
    if !is_root() {
        eprintln!("skipped {test}: needs root (to plant a link as another user)");
        return None;
    }
    let dir = tempfile::tempdir().expect("temporary directory");
    // `nobody` must reach the sticky directory through it.
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let sticky = dir.path().join("S");
    std::fs::create_dir(&sticky).unwrap();
    std::fs::set_permissions(&sticky, std::fs::Permissions::from_mode(0o1777)).unwrap();
    let victim = dir.path().join("P");
    std::fs::write(&victim, VICTIM_BYTES).unwrap();
    std::fs::set_permissions(&victim, std::fs::Permissions::from_mode(0o600)).unwrap();
    let link = sticky.join("model.safetensors");
    as_nobody(&["ln", "-s", victim.to_str().unwrap(), link.to_str().unwrap()]);
    let own_link = sticky.join("own.link");
    std::os::unix::fs::symlink(&victim, &own_link).unwrap();
    Some(PlantedLink {
        _dir: dir,
        sticky,
        victim,
        link,
        own_link,
    })
}

/// Runs `argv` as `nobody` (uid and gid [`NOBODY`], no supplementary groups) through
/// `setpriv`; panics when it fails.
pub fn as_nobody(argv: &[&str]) {
    let id = NOBODY.to_string();
    let st = std::process::Command::new("setpriv")
        .args(["--reuid", &id, "--regid", &id, "--clear-groups", "--"])
        .args(argv)
        .status()
        .expect("setpriv (util-linux)");
    assert!(st.success(), "as nobody: {argv:?}: {st}");
}

/// Whether this process runs as root (effective uid 0).
pub fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions.
    unsafe { libc::geteuid() == 0 }
}

/// The file `name` in the first folder of `$PATH` that has it; `None` when none does.
pub fn on_path(name: &str) -> Option<PathBuf> {
    std::env::var_os("PATH").and_then(|p| {
        std::env::split_paths(&p)
            .map(|d| d.join(name))
            .find(|f| f.is_file())
    })
}

/// Says on stderr that the metrics test `test` is skipped and why. Panics instead under
/// `GDPATH_REQUIRE_PROMETHEUS=1` (CI, which installs Debian's `prometheus` and is root), where
/// every test of the metrics against a real Prometheus must run.
pub fn skip_prometheus_test(test: &str, why: &str) {
    assert!(
        std::env::var_os("GDPATH_REQUIRE_PROMETHEUS").is_none_or(|v| v != "1"),
        "GDPATH_REQUIRE_PROMETHEUS=1 but {test} cannot run: {why}"
    );
    eprintln!("SKIPPED {test}: {why}");
}

/// The Prometheus program `name` (`prometheus`, `promtool`: Debian's `prometheus` package,
/// which `scripts/setup.sh` installs) on `$PATH`; `None`, after [`skip_prometheus_test`] for
/// `test`, when it is not there.
pub fn prometheus_tool(name: &str, test: &str) -> Option<PathBuf> {
    let found = on_path(name);
    if found.is_none() {
        skip_prometheus_test(
            test,
            &format!("no {name} on PATH (apt-get install prometheus)"),
        );
    }
    found
}

/// `promtool check metrics` on the exposition `text` (Prometheus text format): `Err` with
/// promtool's output when it finds a fault, or when it cannot be run.
pub fn promtool_check_metrics(promtool: &Path, text: &str) -> Result<(), String> {
    use std::io::Write;
    use std::process::{Command, Stdio};
    let mut child = Command::new(promtool)
        .args(["check", "metrics"])
        .stdin(Stdio::piped())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|e| format!("{}: {e}", promtool.display()))?;
    let written = child.stdin.take().map(|mut i| i.write_all(text.as_bytes()));
    let out = child.wait_with_output().map_err(|e| e.to_string())?;
    if out.status.success() && matches!(written, Some(Ok(()))) {
        Ok(())
    } else {
        Err(format!(
            "promtool check metrics: {}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ))
    }
}
