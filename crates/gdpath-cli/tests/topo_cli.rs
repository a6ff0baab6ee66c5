//! `gdpath topo` end to end: JSON schema on a fixture, capture and replay through the binary,
//! and the live machine.

use gdpath_testkit::fixtures;

mod common;

use common::gdpath;

#[test]
fn json_from_nccl_xml() {
    let f = fixtures().join("nccl-xml/nccl-aws-p4d-24xl-topo.xml");
    let (ok, out, err) = gdpath(&["topo", "--nccl-xml", f.to_str().unwrap(), "--json"]);
    assert!(ok, "{err}");
    let v: serde_json::Value = serde_json::from_str(&out).unwrap();
    assert_eq!(v["schema"], "gdpath.topo/1");
    assert_eq!(v["matrix"]["GPU0"]["NIC0"], "PIX");
    assert_eq!(v["matrix"]["GPU0"]["GPU0"], "X");
    assert_eq!(
        v["devices"]
            .as_array()
            .unwrap()
            .iter()
            .filter(|d| d["kind"] == "gpu")
            .count(),
        8
    );
    assert_eq!(v["nearest"][0]["nic"]["class"], "PIX");
    // The matrix keeps GPU order (GPU0, GPU1, ... not sorted as text).
    let rows: Vec<&String> = v["matrix"].as_object().unwrap().keys().collect();
    assert_eq!(rows[0], "GPU0");
}

#[test]
fn human_output_and_errors() {
    let f = fixtures().join("hwloc-xml/hwloc-xml-power8gpudistances.xml");
    let (ok, out, err) = gdpath(&["topo", "--hwloc-xml", f.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        out.contains("NV2") && out.contains("Legend:") && out.contains("Devices"),
        "{out}"
    );
    let (ok, _, err) = gdpath(&["topo", "--snapshot", f.to_str().unwrap()]);
    assert!(!ok);
    assert!(err.contains("is not a gdpath snapshot"), "{err}");
    let (ok, _, _) = gdpath(&["topo", "--snapshot", "a", "--nccl-xml", "b"]);
    assert!(!ok, "two sources are refused");
}

#[test]
fn capture_and_replay_the_live_machine() {
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("snap.tar.gz");
    let (ok, out, err) = gdpath(&["topo", "capture", "-o", snap.to_str().unwrap()]);
    if !std::path::Path::new("/sys/bus/pci/devices").is_dir() {
        eprintln!("skipped: this machine has no /sys/bus/pci/devices");
        assert!(!ok);
        return;
    }
    assert!(ok, "{err}");
    assert!(out.contains("wrote"), "{out}");
    let (ok1, live, e1) = gdpath(&["topo", "--json"]);
    let (ok2, replay, e2) = gdpath(&["topo", "--json", "--snapshot", snap.to_str().unwrap()]);
    assert!(ok1 && ok2, "{e1}{e2}");
    // The replay names itself and the source it was captured from; without driver facts it
    // gives the snapshot as the reason NVLink is unknown. All else is the live document.
    let strip = |text: &str| {
        let mut v: serde_json::Value = serde_json::from_str(text).unwrap();
        let (source, from) = (v["source"].clone(), v["captured_from"].clone());
        let o = v.as_object_mut().unwrap();
        o.remove("source");
        o.remove("captured_from");
        v["coverage"]["nvlink"] = serde_json::Value::Null;
        for w in v["warnings"].as_array_mut().unwrap() {
            if w["id"] == "topo.nvlink-unknown" {
                w["message"] = serde_json::Value::Null;
            }
        }
        (v, source, from)
    };
    let (l, l_source, l_from) = strip(&live);
    let (r, r_source, r_from) = strip(&replay);
    assert_eq!((l_source.as_str(), l_from.is_null()), (Some("live"), true));
    assert_eq!(
        (r_source.as_str(), r_from.as_str()),
        (Some("snapshot"), Some("live"))
    );
    assert_eq!(l, r);
    let (ok, text, _) = gdpath(&["topo"]);
    assert!(ok);
    let v: serde_json::Value = serde_json::from_str(&live).unwrap();
    let gpus = v["devices"]
        .as_array()
        .unwrap()
        .iter()
        .filter(|d| d["kind"] == "gpu")
        .count();
    if gpus == 0 {
        assert!(text.contains("No GPU"), "{text}");
    }
}

/// A replay does not speak of "here"; footnotes appear only for what the device list shows;
/// counts are in the singular where they are one.
#[test]
fn replay_wording_footnotes_and_plurals() {
    let (_t, root) = gdpath_testkit::unpack_sysfs("hwloc-sysfs-2pa-pcidomain32bits.tar.bz2");
    let r = root.to_str().unwrap();
    let (ok, out, err) = gdpath(&["topo", "--sysfs-root", r]);
    assert!(ok, "{err}");
    assert!(
        out.contains("No GPU: the source shows no NVIDIA GPU; it shows NIC0")
            && !out.contains(" here"),
        "{out}"
    );
    assert!(
        out.contains("(0 GPUs, 1 NIC, 0 NVMe; 9 PCI functions; 1 NUMA node)"),
        "{out}"
    );
    // NUMA inferred (sysfs -1) but no link speeds in this dump: only the NUMA footnote.
    assert!(
        out.contains("NUMA in parentheses") && !out.contains("Bandwidth:"),
        "{out}"
    );
    let dir = tempfile::tempdir().unwrap();
    let snap = dir.path().join("s.tar.gz");
    let (ok, out, err) = gdpath(&[
        "topo",
        "capture",
        "--sysfs-root",
        r,
        "-o",
        snap.to_str().unwrap(),
    ]);
    assert!(ok, "{err}");
    assert!(
        out.contains("(0 GPUs, 1 NIC, 0 NVMe, 9 PCI functions)"),
        "{out}"
    );

    // NCCL XML: NUMA nodes stated, no current link speed: neither footnote.
    let f = fixtures().join("nccl-xml/nccl-aws-p4d-24xl-topo.xml");
    let (ok, out, _) = gdpath(&["topo", "--nccl-xml", f.to_str().unwrap()]);
    assert!(ok);
    assert!(
        !out.contains("NUMA in parentheses") && !out.contains("Bandwidth:"),
        "{out}"
    );
    assert!(out.contains("[topo.nvlink-unknown]"), "{out}");
    // The H200 snapshot: NUMA -1 and trained links: both.
    let snap = gdpath_testkit::h200x2_snapshot();
    let (ok, out, _) = gdpath(&["topo", "--snapshot", snap]);
    assert!(ok);
    assert!(
        out.contains("NUMA in parentheses") && out.contains("Bandwidth:"),
        "{out}"
    );
}

/// The words must match the doctor's and the text's own content: an EFA NIC of an NCCL file (which names no RDMA devices) is what the
/// doctor calls it, RDMA-capable by PCI identity (the legend said "no RDMA device"); the header
/// of `nvidia-smi topo -m` text counts the NUMA nodes its NUMA Affinity column names (it said
/// "0 NUMA nodes" beside a filled column) and does not call its devices PCI functions.
#[test]
fn legends_and_headers_say_what_the_source_says() {
    let f = fixtures().join("nccl-xml/nccl-aws-p4d-24xl-topo.xml");
    let (ok, out, err) = gdpath(&["topo", "--nccl-xml", f.to_str().unwrap()]);
    assert!(ok, "{err}");
    assert!(
        out.contains(
            "(Amazon Elastic Fabric Adapter (EFA), RDMA-capable by PCI identity, no RDMA device \
             named in the source)"
        ),
        "{out}"
    );
    assert!(!out.contains(", no RDMA device)"), "{out}");
    let f = fixtures().join("nvidia-smi/topo-nccl-1264-hgx-h100-sxm-10nic.txt");
    let (ok, out, err) = gdpath(&["topo", "--smi-topo", f.to_str().unwrap()]);
    assert!(ok, "{err}");
    let header = out.lines().next().unwrap();
    assert!(
        header.ends_with(
            "(8 GPUs, 10 NICs, 0 NVMe; 18 devices (no PCI addresses in the source); 2 NUMA nodes)"
        ),
        "{header}"
    );
}
