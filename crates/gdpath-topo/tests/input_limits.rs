//! Hostile input to every reader ends with a typed error naming the limit, in bounded time and
//! memory: deeply nested XML (which overflowed the stack before), `/dev/zero` and FIFOs (which
//! grew without bound or blocked forever: now refused by their type before they are opened),
//! more devices than the pairwise work is bounded for, a
//! sysfs tree with a huge or FIFO attribute, and a snapshot read past its limit. Each input is
//! made in the test; the limits are those of `gdpath_topo::input`.

mod common;
use common::*;
use gdpath_topo::input::{self, Bounded, ReadLimit};
use gdpath_topo::smi::{SmiError, SmiMatrix};
use gdpath_topo::snapshot::Snapshot;
use gdpath_topo::{load, DirView, Source, TopoError};
use std::io::{Read, Write};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

fn file(dir: &Path, name: &str, text: &str) -> PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// NCCL XML with `pcis` nested `<pci>` elements under one `<cpu>`: bridges, then a GPU at the
/// bottom (its `<gpu>` one level deeper still).
fn nested_nccl(pcis: usize) -> String {
    let mut s = String::from("<system version=\"1\">\n<cpu numaid=\"0\" affinity=\"ff\">\n");
    for i in 0..pcis - 1 {
        s.push_str(&format!(
            "<pci busid=\"{:04x}:{:02x}:00.0\" class=\"0x060400\">",
            i / 256,
            i % 256
        ));
    }
    s.push_str("<pci busid=\"ffff:00:00.0\"><gpu dev=\"0\"/></pci>");
    s.push_str(&"</pci>".repeat(pcis - 1));
    s.push_str("\n</cpu>\n</system>\n");
    s
}

/// hwloc XML with `depth` nested Group objects.
fn nested_hwloc(depth: usize) -> String {
    format!(
        "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n{}{}\n</topology>\n",
        "<object type=\"Group\">".repeat(depth),
        "</object>".repeat(depth)
    )
}

/// The inputs: 10,000 nested `<pci>` (about 480 KB) and hwloc XML 50,000 levels deep
/// overflowed the stack (rc 134). Both now stop at the depth limit, at the line of the first
/// element too deep, through either XML reader.
#[test]
fn deep_xml_is_a_typed_error() {
    let dir = tempdir();
    let nccl = file(dir.path(), "deep-nccl.xml", &nested_nccl(10_000));
    let hwloc = file(dir.path(), "deep-hwloc.xml", &nested_hwloc(50_000));
    for p in [&nccl, &hwloc] {
        for src in [Source::NcclXml(p.clone()), Source::HwlocXml(p.clone())] {
            let err = load(&src).unwrap_err();
            match &err {
                TopoError::TooDeep { line: 3, limit, .. } => {
                    assert_eq!(*limit, input::MAX_XML_DEPTH)
                }
                e => panic!("{src:?}: {e}"),
            }
            assert!(err.to_string().contains("nested deeper than 256"), "{err}");
        }
    }
}

/// Nesting just inside the limit is read in full (the readers recurse only that deep, which fits
/// a test thread's 2 MiB stack).
#[test]
fn nesting_within_the_limit_is_read() {
    let dir = tempdir();
    // <system>, <cpu> and the <gpu> take three levels.
    let depth = input::MAX_XML_DEPTH - 3;
    let p = file(dir.path(), "ok.xml", &nested_nccl(depth));
    let m = load(&Source::NcclXml(p)).unwrap();
    assert_eq!(m.devices.len(), depth);
    let gpu = m.gpus().next().expect("the GPU at the bottom");
    assert_eq!(
        m.ancestors(gpu).len(),
        64,
        "ancestor walk stops at its own bound"
    );
    let p = file(
        dir.path(),
        "ok-hwloc.xml",
        &nested_hwloc(input::MAX_XML_DEPTH - 1),
    );
    assert!(load(&Source::HwlocXml(p)).unwrap().devices.is_empty());
}

/// The file type in `err` (an [`TopoError::Io`] whose source is [`input::NotRegular`]).
fn not_regular(err: &TopoError) -> Option<&'static str> {
    match err {
        TopoError::Io { source, .. } => source
            .get_ref()
            .and_then(|e| e.downcast_ref::<input::NotRegular>())
            .map(|n| n.what),
        _ => None,
    }
}

fn every_reader(p: &Path) -> [Source; 4] {
    [
        Source::NcclXml(p.to_owned()),
        Source::HwlocXml(p.to_owned()),
        Source::SmiTopo(p.to_owned()),
        Source::Snapshot(p.to_owned()),
    ]
}

/// `/dev/zero` (which grew to 24 GB before) is refused by its type, at once, by every reader;
/// the size cap still names its limit for a regular file past it.
#[test]
fn dev_zero_is_refused_by_every_reader() {
    let zero = PathBuf::from("/dev/zero");
    for src in every_reader(&zero) {
        let t = Instant::now();
        let err = load(&src).unwrap_err();
        assert_eq!(
            not_regular(&err),
            Some("a character device"),
            "{src:?}: {err}"
        );
        assert!(err.to_string().contains("/dev/zero"), "{err}");
        assert!(t.elapsed() < Duration::from_secs(5), "{src:?} took long");
    }
    let dir = tempdir();
    let big = dir.path().join("big.xml");
    let f = std::fs::File::create(&big).unwrap();
    f.set_len(input::MAX_TOPOLOGY_FILE_BYTES + 1).unwrap();
    match load(&Source::NcclXml(big.clone())).unwrap_err() {
        TopoError::TooLarge { path, limit_bytes } => {
            assert_eq!(path, big);
            assert_eq!(limit_bytes, input::MAX_TOPOLOGY_FILE_BYTES);
        }
        e => panic!("{e}"),
    }
    let msg = TopoError::TooLarge {
        path: "/dev/zero".into(),
        limit_bytes: input::MAX_TOPOLOGY_FILE_BYTES,
    }
    .to_string();
    assert!(msg.contains("32 MiB (33554432 bytes)"), "{msg}");
}

fn mkfifo(path: &Path) {
    let st = std::process::Command::new("mkfifo")
        .arg(path)
        .status()
        .unwrap();
    assert!(st.success(), "mkfifo {}", path.display());
}

/// Sets `O_NONBLOCK` on `f`.
fn nonblocking(f: &std::fs::File) {
    use std::os::fd::AsRawFd;
    // SAFETY: fcntl on a descriptor the caller owns.
    unsafe {
        let fl = libc::fcntl(f.as_raw_fd(), libc::F_GETFL);
        assert_eq!(
            libc::fcntl(f.as_raw_fd(), libc::F_SETFL, fl | libc::O_NONBLOCK),
            0
        );
    }
}

/// A FIFO, with no writer, with a writer that writes without end and with one that stays silent
/// (which blocked `--snapshot` forever), is refused by its type by every reader, at once, and
/// nothing is read from it.
#[test]
fn fifos_are_refused_at_once_whoever_writes() {
    let dir = tempdir();
    let fifo = dir.path().join("fifo");
    mkfifo(&fifo);
    let refused_at_once = |what: &str| {
        for src in every_reader(&fifo) {
            let t = Instant::now();
            let err = load(&src).unwrap_err();
            assert_eq!(not_regular(&err), Some("a FIFO"), "{what}, {src:?}: {err}");
            assert!(err.to_string().contains("fifo"), "{err}");
            assert!(
                t.elapsed() < Duration::from_secs(5),
                "{what}, {src:?} took long"
            );
        }
    };
    refused_at_once("no writer");
    // Read and write on one descriptor: a writer that is there and never writes.
    let hold = std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open(&fifo)
        .unwrap();
    refused_at_once("a silent writer");
    // A writer that fills the pipe: it stays full, so nobody read from it.
    let mut w = std::fs::OpenOptions::new().write(true).open(&fifo).unwrap();
    nonblocking(&w);
    let mut filled = 0usize;
    while let Ok(n) = w.write(&[b'<'; 4096]) {
        filled += n;
    }
    refused_at_once("a full pipe");
    let mut r = hold;
    nonblocking(&r);
    let mut left = Vec::new();
    let _ = r.read_to_end(&mut left);
    assert_eq!(left.len(), filled, "a reader took bytes from the FIFO");
}

/// The stall limit of [`Bounded`] on a non-blocking pipe whose writer stays silent (no reader
/// of gdpath's opens one now; the bound stays for any reader that is given one).
#[test]
fn a_silent_nonblocking_source_stalls_out() {
    let dir = tempdir();
    let silent = dir.path().join("silent");
    mkfifo(&silent);
    let mut o = std::fs::OpenOptions::new();
    o.read(true).write(true);
    std::os::unix::fs::OpenOptionsExt::custom_flags(&mut o, libc::O_NONBLOCK);
    let pipe = o.open(&silent).unwrap();
    let t = Instant::now();
    let mut out = Vec::new();
    let err = Bounded::new(pipe, 1 << 20)
        .with_stall(Duration::from_millis(300))
        .read_to_end(&mut out)
        .unwrap_err();
    assert_eq!(
        input::limit_of(&err),
        Some(ReadLimit::Stalled { seconds: 0 })
    );
    assert!(t.elapsed() >= Duration::from_millis(300));
    assert!(t.elapsed() < Duration::from_secs(10));
}

/// NCCL XML with `n` GPUs under one CPU.
fn many_gpus_nccl(n: usize) -> String {
    let mut s = String::from("<system version=\"1\">\n<cpu numaid=\"0\" affinity=\"ff\">\n");
    for i in 0..n {
        s.push_str(&format!(
            "<pci busid=\"{:04x}:{:02x}:00.0\" class=\"0x030200\" vendor=\"0x10de\" \
             device=\"0x2330\"><gpu dev=\"{i}\"/></pci>\n",
            i / 256,
            i % 256
        ));
    }
    s.push_str("</cpu>\n</system>\n");
    s
}

/// The 200 MB file of 1.19 M GPUs is over the size limit; below it, more GPUs than the
/// matrix limit are refused before any pairwise work, at once.
#[test]
fn device_count_limit_is_checked_before_pairwise_work() {
    let dir = tempdir();
    let n = input::MAX_MATRIX_DEVICES + 1;
    let p = file(dir.path(), "many.xml", &many_gpus_nccl(n));
    let t = Instant::now();
    match load(&Source::NcclXml(p)).unwrap_err() {
        TopoError::TooManyDevices {
            count, limit, what, ..
        } => {
            assert_eq!((count, limit), (n, input::MAX_MATRIX_DEVICES));
            assert_eq!(what, "GPUs, NICs and NVMe");
        }
        e => panic!("{e}"),
    }
    assert!(t.elapsed() < Duration::from_secs(20));

    // The same through hwloc XML: PCIDev GPUs under one host bridge.
    let mut h = String::from(
        "<topology version=\"2.0\"><object type=\"Machine\"><object type=\"Bridge\" \
         bridge_type=\"0-1\" bridge_pci=\"0000:[00-ff]\">",
    );
    for i in 0..n {
        h.push_str(&format!(
            "<object type=\"PCIDev\" pci_busid=\"{:04x}:{:02x}:00.0\" \
             pci_type=\"0302 [10de:2330] [0000:0000] a1\"/>",
            i / 256,
            i % 256
        ));
    }
    h.push_str("</object></object></topology>");
    let p = file(dir.path(), "many-hwloc.xml", &h);
    let err = load(&Source::HwlocXml(p)).unwrap_err();
    assert!(matches!(err, TopoError::TooManyDevices { .. }), "{err}");

    // And an nvidia-smi header of that many ids.
    let ids: Vec<String> = (0..n).map(|i| format!("GPU{i}")).collect();
    let text = format!("\t{}\tCPU Affinity\n", ids.join("\t"));
    assert_eq!(
        SmiMatrix::parse(&text).unwrap_err(),
        SmiError::TooManyDevices {
            count: n,
            limit: input::MAX_MATRIX_DEVICES
        }
    );
}

/// More PCI functions than the limit (bridges here, none of them a matrix device) stop the
/// reader as they are read.
#[test]
fn pci_function_limit() {
    let dir = tempdir();
    let n = input::MAX_PCI_FUNCTIONS + 1;
    let mut s = String::from("<system version=\"1\">\n<cpu numaid=\"0\">\n");
    for i in 0..n {
        s.push_str(&format!(
            "<pci busid=\"{:04x}:{:02x}:{:02x}.0\" class=\"0x060400\"/>\n",
            i >> 13,
            (i >> 5) & 0xff,
            i & 31
        ));
    }
    s.push_str("</cpu>\n</system>\n");
    let p = file(dir.path(), "bridges.xml", &s);
    match load(&Source::NcclXml(p)).unwrap_err() {
        TopoError::TooManyDevices { what, count, .. } => {
            assert_eq!((what, count), ("PCI functions", n))
        }
        e => panic!("{e}"),
    }
}

/// A sysfs tree with more matrix devices than the limit is refused the same way.
#[test]
fn sysfs_device_count_limit() {
    let dir = tempdir();
    let root = dir.path();
    for i in 0..=input::MAX_MATRIX_DEVICES {
        let bdf = format!("{:04x}:{:02x}:00.0", i / 256, i % 256);
        let d = format!("sys/devices/pci{:04x}:00/{bdf}", i / 256);
        write(root, &format!("{d}/class"), "0x020000\n");
        symlink(
            root,
            &format!("sys/bus/pci/devices/{bdf}"),
            &format!("../../../devices/pci{:04x}:00/{bdf}", i / 256),
        );
    }
    let err = load(&Source::SysfsRoot(root.to_owned())).unwrap_err();
    match err {
        TopoError::TooManyDevices { count, .. } => {
            assert_eq!(count, input::MAX_MATRIX_DEVICES + 1)
        }
        e => panic!("{e}"),
    }
}

/// A thousand GPUs: the matrix, nearest devices and warnings are worked out (each device placed
/// once, not once per pair).
#[test]
fn a_large_machine_is_classified() {
    let dir = tempdir();
    let p = file(dir.path(), "k.xml", &many_gpus_nccl(1000));
    let m = load(&Source::NcclXml(p)).unwrap();
    let mx = m.matrix();
    assert_eq!(mx.ids.len(), 1000);
    // All under one CPU, no bridge in common: PHB, and NVLink unknown for the file.
    assert_eq!(mx.get("GPU0", "GPU999"), Some(gdpath_topo::LinkClass::Phb));
    assert!(m.pair(&m.devices[0], &m.devices[999]).nvlink_unknown());
    let w = m.warnings();
    assert_eq!(
        w.iter().filter(|w| w.id == "topo.nvlink-unknown").count(),
        1
    );
}

/// A copied tree whose `class` is 20 MiB, or a FIFO: the field is unknown, nothing hangs.
#[test]
fn sysfs_files_are_bounded() {
    let dir = tempdir();
    let root = dir.path();
    let d = "sys/devices/pci0000:00/0000:00:06.0";
    std::fs::create_dir_all(root.join(d)).unwrap();
    std::fs::write(root.join(d).join("class"), vec![b'3'; 20 << 20]).unwrap();
    mkfifo(&root.join(d).join("vendor"));
    symlink(
        root,
        "sys/bus/pci/devices/0000:00:06.0",
        "../../../devices/pci0000:00/0000:00:06.0",
    );
    let v = DirView::new(root);
    use gdpath_topo::SysView;
    let err = v.read(&format!("/{d}/class")).unwrap_err();
    assert_eq!(
        input::limit_of(&err),
        Some(ReadLimit::TooLarge {
            limit: input::MAX_SYSFS_FILE_BYTES
        })
    );
    let m = load(&Source::SysfsRoot(root.to_owned())).unwrap();
    let dev = dev(&m, "0000:00:06.0");
    assert_eq!(dev.class, gdpath_topo::names::UNKNOWN_CLASS);
    assert_eq!(dev.vendor, gdpath_topo::names::UNKNOWN_ID);
}

/// More XML nodes than the limit (here empty elements) is a typed error, not gigabytes.
#[test]
fn too_many_xml_nodes() {
    let dir = tempdir();
    let n = input::MAX_XML_NODES as usize + 10;
    let p = file(
        dir.path(),
        "nodes.xml",
        &format!("<system>{}</system>", "<a/>".repeat(n)),
    );
    let err = load(&Source::NcclXml(p)).unwrap_err();
    assert!(matches!(err, TopoError::TooManyNodes { .. }), "{err}");
}

/// A snapshot read past its limit says so (here through a small limit on a real capture).
#[test]
fn snapshot_read_limit_is_typed() {
    let path = fixture("device/h200x1-capture-2026-12-01.tar.gz");
    let f = std::fs::File::open(&path).unwrap();
    let err = Snapshot::from_reader(Bounded::new(f, 4096), &path).unwrap_err();
    assert!(
        matches!(
            err,
            TopoError::TooLarge {
                limit_bytes: 4096,
                ..
            }
        ),
        "{err}"
    );
    // Whole, it opens.
    assert!(Snapshot::open(&path).is_ok());
}

/// One bus id twice: the NCCL reader refuses it, naming the bus id and both lines (before, the
/// matrix had three GPUs and the device list one, without a word); a copied sysfs tree with
/// two entries for one address is refused the same way; an hwloc export is refused when both
/// sit under one host bridge, and keeps both (with a note) under two, as one of hwloc's own
/// test exports has them.
#[test]
fn repeated_bus_ids_are_refused_with_where_they_are() {
    let dir = tempdir();
    let gpu = |dev: u32| {
        format!(
            "<pci busid=\"0000:01:00.0\" class=\"0x030200\" vendor=\"0x10de\" \
             device=\"0x2330\"><gpu dev=\"{dev}\"/></pci>\n"
        )
    };
    let text = format!(
        "<system version=\"1\">\n<cpu numaid=\"0\" affinity=\"ff\">\n{}{}{}</cpu>\n</system>\n",
        gpu(0),
        gpu(1),
        gpu(2)
    );
    let p = file(dir.path(), "dup.xml", &text);
    let err = load(&Source::NcclXml(p.clone())).unwrap_err();
    match &err {
        TopoError::DuplicatePci {
            source_name,
            pci,
            first,
            second,
        } => {
            assert_eq!(source_name, &p.display().to_string());
            assert_eq!(pci.to_string(), "0000:01:00.0");
            assert_eq!((first.as_str(), second.as_str()), ("line 3", "line 4"));
        }
        e => panic!("{e}"),
    }
    assert!(
        err.to_string()
            .contains("PCI bus id 0000:01:00.0 appears twice (line 3 and line 4)"),
        "{err}"
    );
    // A bridge and a GPU below it at one address: refused too.
    let nested = "<system version=\"1\">\n<cpu numaid=\"0\">\n<pci busid=\"0000:01:00.0\" \
                  class=\"0x060400\">\n<pci busid=\"0000:01:00.0\" class=\"0x030200\"><gpu \
                  dev=\"0\"/></pci>\n</pci>\n</cpu>\n</system>\n";
    let p = file(dir.path(), "nested.xml", nested);
    assert!(matches!(
        load(&Source::NcclXml(p)).unwrap_err(),
        TopoError::DuplicatePci { .. }
    ));

    // sysfs: `0000:00:6.0` reads as `0000:00:06.0`.
    let root = dir.path().join("sys-root");
    for name in ["0000:00:06.0", "0000:00:6.0"] {
        write(
            &root,
            &format!("sys/devices/pci0000:00/{name}/class"),
            "0x030200\n",
        );
        symlink(
            &root,
            &format!("sys/bus/pci/devices/{name}"),
            &format!("../../../devices/pci0000:00/{name}"),
        );
    }
    let err = load(&Source::SysfsRoot(root)).unwrap_err();
    assert!(matches!(err, TopoError::DuplicatePci { .. }), "{err}");
    let msg = err.to_string();
    assert!(
        msg.contains("PCI bus id 0000:00:06.0 appears twice"),
        "{msg}"
    );
    assert!(
        msg.contains("\"0000:00:06.0\"") && msg.contains("\"0000:00:6.0\""),
        "{msg}"
    );

    let hwloc = |domains: [&str; 2]| {
        let mut s =
            String::from("<topology version=\"2.0\">\n<object type=\"Machine\" nodeset=\"0x1\">\n");
        for d in domains {
            s.push_str(&format!(
                "<object type=\"Bridge\" bridge_type=\"0-1\" bridge_pci=\"{d}:[00-0f]\">\n\
                 <object type=\"PCIDev\" pci_busid=\"0000:01:00.0\" \
                 pci_type=\"0302 [10de:2330] [0000:0000] a1\"/>\n</object>\n"
            ));
        }
        s.push_str("</object>\n</topology>\n");
        s
    };
    let p = file(dir.path(), "one.xml", &hwloc(["0000", "0000"]));
    let err = load(&Source::HwlocXml(p)).unwrap_err();
    assert!(
        err.to_string()
            .contains("PCI bus id 0000:01:00.0 appears twice (line 4 and line 7)"),
        "{err}"
    );
    let p = file(dir.path(), "two.xml", &hwloc(["0000", "0001"]));
    let m = load(&Source::HwlocXml(p)).unwrap();
    assert_eq!(m.gpus().count(), 2);
    assert_eq!(m.matrix().ids.len(), 2);
    assert_eq!(m.link_checked_devices().len(), 2, "both in the device list");
    assert!(m.notes.iter().any(|n| n.contains("appears 2 times")));
}

/// NICs directly under a `<cpu>` (no PCI address) each get an address of their own, past the
/// 256 of the first synthetic bus (before, the 257th and later all had `ffff:fe:1f.7`); more
/// than the matrix device limit of them is refused.
#[test]
fn nics_without_an_address_get_distinct_ones() {
    let dir = tempdir();
    let nics = |n: usize| {
        let mut s = String::from("<system version=\"1\">\n<cpu numaid=\"0\">\n");
        for i in 0..n {
            s.push_str(&format!("<nic><net name=\"mlx5_{i}\"/></nic>\n"));
        }
        s.push_str("</cpu>\n</system>\n");
        s
    };
    let p = file(dir.path(), "600.xml", &nics(600));
    let m = load(&Source::NcclXml(p)).unwrap();
    let mut addrs: Vec<_> = m.nics().map(|d| d.pci).collect();
    assert_eq!(addrs.len(), 600);
    addrs.dedup();
    assert_eq!(addrs.len(), 600, "addresses repeat");
    let n = input::MAX_MATRIX_DEVICES + 1;
    let p = file(dir.path(), "many.xml", &nics(n));
    match load(&Source::NcclXml(p)).unwrap_err() {
        TopoError::TooManyDevices { what, count, .. } => {
            assert_eq!((what, count), ("NICs without a PCI address", n))
        }
        e => panic!("{e}"),
    }
}

/// GPUs linked to NVSwitches are joined pair by pair, so their bonds grow with the square of
/// them: up to `input::MAX_NVSWITCH_GPUS` they are recorded, past it NVLink is unknown with the
/// reason, from an NCCL file or from driver facts alike (before, 4,000 such GPUs made 8 million
/// bonds).
#[test]
fn nvswitch_pairs_are_recorded_up_to_the_limit() {
    let dir = tempdir();
    let switched = |n: usize| {
        let mut s = String::from("<system version=\"1\">\n<cpu numaid=\"0\" affinity=\"ff\">\n");
        for i in 0..n {
            s.push_str(&format!(
                "<pci busid=\"{:04x}:{:02x}:00.0\" class=\"0x030200\" vendor=\"0x10de\" \
                 device=\"0x2330\"><gpu dev=\"{i}\"><nvlink target=\"ffff:fe:00.0\" \
                 count=\"18\" tclass=\"0x068000\"/></gpu></pci>\n",
                i / 256,
                i % 256
            ));
        }
        s.push_str("</cpu>\n</system>\n");
        s
    };
    let limit = input::MAX_NVSWITCH_GPUS;
    let p = file(dir.path(), "in.xml", &switched(limit));
    let m = load(&Source::NcclXml(p)).unwrap();
    assert_eq!(m.nvlinks.len(), limit * (limit - 1) / 2);
    assert!(m.coverage.nvlink.is_described());
    let t = Instant::now();
    let p = file(dir.path(), "past.xml", &switched(4000));
    let m = load(&Source::NcclXml(p)).unwrap();
    assert!(m.nvlinks.is_empty());
    let why = m.coverage.nvlink.gap().expect("NVLink unknown");
    assert!(
        why.contains("4000 GPUs have <nvlink> entries to NVSwitches, more than the 256"),
        "{why}"
    );
    assert!(m.warnings().iter().any(|w| w.message.contains(why)));
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());

    // Driver facts: every GPU with its links up to NVSwitches.
    use gdpath_topo::facts::{DriverFacts, GpuFacts, NvLinkFacts};
    let facts = |m: &gdpath_topo::Machine| DriverFacts {
        gpus: m
            .gpus()
            .enumerate()
            .map(|(i, g)| GpuFacts {
                ordinal: i as u32,
                pci: g.pci.to_string(),
                nvlinks: (0..18)
                    .map(|l| NvLinkFacts {
                        link: l,
                        remote_pci: "0000:ff:00.0".into(),
                        remote_is_switch: true,
                        ..NvLinkFacts::default()
                    })
                    .collect(),
                ..GpuFacts::default()
            })
            .collect(),
        ..DriverFacts::default()
    };
    let mut small = load(&Source::NcclXml(fixture(
        "nccl-xml/nccl-aws-p4d-24xl-topo.xml",
    )))
    .unwrap();
    small.set_driver(facts(&small));
    assert_eq!(small.nvlinks.len(), 28);
    assert!(small.nvlinks.iter().all(|b| b.links == 18));
    let mut big = m.clone();
    let f = facts(&big);
    let t = Instant::now();
    big.set_driver(f);
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert!(big.nvlinks.is_empty());
    let why = big.coverage.nvlink.gap().expect("NVLink unknown");
    assert!(
        why.contains("4000 GPUs have NVLinks up to NVSwitches"),
        "{why}"
    );
}

/// ACS redirect on a bridge above many GPUs: one warning that names a few pairs and counts the
/// rest (before, it listed every pair: 500,000 of them for 1,000 GPUs).
#[test]
fn acs_redirect_warning_counts_its_pairs() {
    use gdpath_topo::{AcsFlags, AcsState, Device, DeviceKind, IommuState, Machine};
    let bridge_pci = pci("0000:00:01.0");
    let mut bridge = Device::new(bridge_pci);
    bridge.kind = DeviceKind::Bridge;
    bridge.class = 0x060400;
    bridge.host_bridge = Some("pci0000:00".into());
    bridge.acs = Some(AcsState::Present {
        capability: AcsFlags::from_bits(0x1f),
        control: AcsFlags::from_bits(0x0c),
    });
    let mut devices = vec![bridge];
    for i in 0..1000u32 {
        let mut d = Device::new(gdpath_topo::PciAddr {
            domain: 0,
            bus: 2 + (i / 32) as u8,
            device: (i % 32) as u8,
            function: 0,
        });
        d.kind = DeviceKind::Gpu;
        d.class = 0x030200;
        d.vendor = 0x10de;
        d.parent = Some(bridge_pci);
        d.host_bridge = Some("pci0000:00".into());
        devices.push(d);
    }
    let m = Machine::assemble(devices, Vec::new(), IommuState::default(), true, "test");
    let t = Instant::now();
    let w: Vec<_> = m
        .warnings()
        .into_iter()
        .filter(|w| w.id == "topo.acs-redirect")
        .collect();
    assert!(t.elapsed() < Duration::from_secs(20), "{:?}", t.elapsed());
    assert_eq!(w.len(), 1);
    let msg = &w[0].message;
    assert!(msg.len() < 1000, "{} bytes", msg.len());
    assert!(
        msg.contains("GPU0↔GPU1") && msg.contains(" more pairs"),
        "{msg}"
    );
    let named = msg.matches('↔').count() as u64;
    assert!(
        msg.contains(&format!("and {} more pairs", 1000 * 999 / 2 - named)),
        "{msg}"
    );
}
