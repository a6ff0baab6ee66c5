//! `gdpath doctor` as a script runs it: exit status and JSON.

mod common;

use std::process::Command;

/// The snapshot of the two-GPU H200 machine shipped with gdpath.
fn h200_snapshot() -> &'static str {
    gdpath_testkit::h200x2_snapshot()
}

fn gdpath() -> Command {
    Command::new(env!("CARGO_BIN_EXE_gdpath"))
}

#[test]
fn a_missing_path_is_a_failure_of_the_doctor_not_a_finding() {
    let out = gdpath()
        .args(["doctor", "--path", "/nonexistent/gdpath-doctor-test"])
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(3),
        "exit 3: the doctor itself failed"
    );
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("not a directory"), "stderr: {err}");
}

#[test]
fn snapshot_of_the_h200_machine_gives_json_and_the_unavailable_exit_status() {
    let out = gdpath()
        .args(["doctor", "--json", "--snapshot", h200_snapshot()])
        .output()
        .unwrap();
    // GDR is unavailable there (no RDMA device): exit status 2.
    assert_eq!(out.status.code(), Some(2));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["schema"], "gdpath.doctor/1");
    let p2p = v["verdicts"]
        .as_array()
        .unwrap()
        .iter()
        .find(|x| x["path"] == "p2p")
        .unwrap();
    assert_eq!(p2p["status"], "ok");
}

/// `--measure` on a replay measures nothing: P2P and GDS say a replay has nothing to measure,
/// GDR that it has no probe; all three `not-run`.
#[test]
fn measure_on_a_snapshot_is_not_run_with_the_reason() {
    let out = gdpath()
        .args([
            "doctor",
            "--json",
            "--measure",
            "--snapshot",
            h200_snapshot(),
        ])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let finding = |id: &str| common::finding(&v, id).clone();
    for id in ["p2p.measured-fallback", "gds.measured-fallback"] {
        let f = finding(id);
        assert_eq!(f["status"], "not-run", "{f}");
        assert!(f["evidence"].as_str().unwrap().contains("replay"), "{f}");
    }
    let gdr = finding("gdr.measured-fallback");
    assert_eq!(gdr["status"], "not-run", "{gdr}");
    assert!(
        gdr["evidence"]
            .as_str()
            .unwrap()
            .contains("no bandwidth probe"),
        "{gdr}"
    );
}

fn in_dir(dir: &std::path::Path, args: &[&str]) -> std::process::Output {
    gdpath().args(args).current_dir(dir).output().unwrap()
}

/// A replayed snapshot's JSON names the snapshot (and what it was captured from) and judges no
/// directory of the machine the doctor runs on: no `--path` given, no GDS path findings.
#[test]
fn snapshot_json_names_the_snapshot_and_has_no_cwd_finding() {
    let cwd = tempfile::tempdir().unwrap();
    let out = in_dir(
        cwd.path(),
        &["doctor", "--json", "--all", "--snapshot", h200_snapshot()],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    assert_eq!(v["source"], "snapshot");
    assert_eq!(v["captured_from"], "live");
    assert_eq!(v["mode"], "replay");
    assert_eq!(v["coverage"]["nvlink"]["state"], "described");
    let cwd_text = cwd.path().to_str().unwrap();
    for f in v["findings"].as_array().unwrap() {
        let text = f.to_string();
        assert!(!text.contains(cwd_text), "{f}");
        assert!(
            f["path"] != "gds" || f["subject"] == "system",
            "a GDS path finding in a replay without --path: {f}"
        );
    }
    // The text says so too: no current directory, no "here".
    let out = in_dir(
        cwd.path(),
        &["doctor", "--verbose", "--snapshot", h200_snapshot()],
    );
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(
        !text.contains(cwd_text) && !text.contains(" here"),
        "{text}"
    );
    // A --path given explicitly is judged from what the capture holds (not probed).
    let out = in_dir(
        cwd.path(),
        &[
            "doctor",
            "--json",
            "--snapshot",
            h200_snapshot(),
            "--path",
            cwd_text,
        ],
    );
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let compat = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .find(|f| f["id"] == "gds.compat-mode")
        .expect("the given path is judged");
    assert_eq!(compat["subject"], cwd_text);
}

/// A `--sysfs-root` whose devices cannot be read leaves every verdict unknown: exit status 4,
/// so that `gdpath doctor && launch` does not go ahead. An empty device list is as unknown.
#[test]
fn a_broken_sysfs_root_exits_4() {
    let dir = tempfile::tempdir().unwrap();
    let root = dir.path();
    std::fs::create_dir_all(root.join("sys/bus/pci/devices")).unwrap();
    let empty = gdpath()
        .args(["doctor", "--sysfs-root", root.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(
        empty.status.code(),
        Some(4),
        "{}",
        String::from_utf8_lossy(&empty.stdout)
    );
    // A device entry whose link leads nowhere: its class and vendor cannot be read.
    std::os::unix::fs::symlink(
        "../../../devices/pci0000:00/0000:00:01.0",
        root.join("sys/bus/pci/devices/0000:00:01.0"),
    )
    .unwrap();
    let out = gdpath()
        .args(["doctor", "--sysfs-root", root.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert_eq!(out.status.code(), Some(4), "{text}");
    assert!(text.contains("exit status 4"), "{text}");
    let out = gdpath()
        .args(["doctor", "--json", "--sysfs-root", root.to_str().unwrap()])
        .output()
        .unwrap();
    assert_eq!(out.status.code(), Some(4));
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    for verdict in v["verdicts"].as_array().unwrap() {
        assert!(
            ["unknown", "not-run"].contains(&verdict["status"].as_str().unwrap()),
            "{verdict}"
        );
    }
    // The help names the status.
    let help = gdpath().args(["doctor", "--help"]).output().unwrap();
    assert!(String::from_utf8_lossy(&help.stdout).contains("4 no verdict could be decided"));
}

/// The default output is one line per finding: under 40 lines on every vendored topology file
/// (the 8-GPU NCCL files among them), where it listed every pair and its evidence before; a
/// machine without a GPU says so once.
#[test]
fn default_output_stays_short_on_the_vendored_sources() {
    let mut sources: Vec<(&str, std::path::PathBuf)> = Vec::new();
    sources.extend(
        gdpath_testkit::fixture_files("nccl-xml", ".xml")
            .into_iter()
            .map(|p| ("--nccl-xml", p)),
    );
    sources.extend(
        gdpath_testkit::fixture_files("hwloc-xml", ".xml")
            .into_iter()
            .map(|p| ("--hwloc-xml", p)),
    );
    sources.extend(
        gdpath_testkit::fixture_files("nvidia-smi", ".txt")
            .into_iter()
            .map(|p| ("--smi-topo", p)),
    );
    for (flag, p) in &sources {
        let out = gdpath()
            .args(["doctor", flag, p.to_str().unwrap()])
            .output()
            .unwrap();
        let text = String::from_utf8_lossy(&out.stdout);
        let n = text.lines().count();
        assert!(n < 40, "{}: {n} lines\n{text}", p.display());
        assert!(!text.contains(" here"), "{}: {text}", p.display());
        // --verbose keeps the evidence: longer, and holds every evidence text of the JSON.
        let verbose = gdpath()
            .args(["doctor", "--verbose", "--all", flag, p.to_str().unwrap()])
            .output()
            .unwrap();
        let verbose = String::from_utf8_lossy(&verbose.stdout);
        let json = gdpath()
            .args(["doctor", "--json", flag, p.to_str().unwrap()])
            .output()
            .unwrap();
        let v: serde_json::Value = serde_json::from_slice(&json.stdout).unwrap();
        for f in v["findings"].as_array().unwrap() {
            let ev = f["evidence"].as_str().unwrap();
            assert!(
                verbose.contains(ev),
                "{}: {ev} not in\n{verbose}",
                p.display()
            );
        }
    }
    // On the 8-GPU NCCL files the pairs are named as sets, not 28 times.
    let p4d = gdpath_testkit::fixture("nccl-xml/nccl-aws-p4d-24xl-topo.xml");
    let out = gdpath()
        .args(["doctor", "--nccl-xml", p4d.to_str().unwrap()])
        .output()
        .unwrap();
    let text = String::from_utf8_lossy(&out.stdout);
    assert!(text.contains("all 28 pairs of GPU0–GPU7"), "{text}");
    assert!(text.contains("GPU0–GPU3 ↔ GPU4–GPU7"), "{text}");
    assert!(!text.contains("GPU0-GPU3, GPU0-GPU4"), "{text}");
}

/// `--smi-topo` reads every vendored `nvidia-smi topo -m` text through `topo` and `doctor`:
/// the source is the matrix itself (NVLink described, the PCI tree not), NV# pairs are judged
/// over NVLink.
#[test]
fn smi_topo_texts_through_topo_and_doctor() {
    let texts = gdpath_testkit::fixture_files("nvidia-smi", ".txt");
    assert!(texts.len() >= 6);
    for p in &texts {
        let f = p.to_str().unwrap();
        let (ok, out, err) = common_run(&["topo", "--smi-topo", f]);
        assert!(ok, "{f}: {err}");
        assert!(
            out.starts_with("gdpath topo: nvidia-smi topo -m text"),
            "{out}"
        );
        let (ok, out, err) = common_run(&["topo", "--json", "--smi-topo", f]);
        assert!(ok, "{f}: {err}");
        let topo: serde_json::Value = serde_json::from_str(&out).unwrap();
        assert_eq!(topo["source"], "smi-topo");
        assert_eq!(topo["coverage"]["nvlink"]["state"], "described");
        assert_eq!(topo["coverage"]["pci-tree"]["state"], "unknown");

        let out = gdpath()
            .args(["doctor", "--json", "--smi-topo", f])
            .output()
            .unwrap();
        let code = out.status.code().unwrap();
        assert!(matches!(code, 0..=2 | 4), "{f}: exit {code}");
        let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
        assert_eq!(v["source"], "smi-topo");
        assert_eq!(v["mode"], "replay");
        // Each GPU pair the matrix states as NV# is judged over NVLink.
        let matrix = topo["matrix"].as_object().unwrap();
        for (a, row) in matrix {
            for (b, class) in row.as_object().unwrap() {
                let class = class.as_str().unwrap();
                if !(a.starts_with("GPU") && b.starts_with("GPU") && a < b) {
                    continue;
                }
                let pair = format!("{a}-{b}");
                let cross = v["findings"]
                    .as_array()
                    .unwrap()
                    .iter()
                    .find(|x| x["id"] == "p2p.cross-socket" && x["subject"] == pair)
                    .unwrap_or_else(|| panic!("{f}: no p2p.cross-socket for {pair}"));
                if class.starts_with("NV") {
                    assert_eq!(cross["status"], "ok", "{f}: {cross}");
                    assert!(cross["evidence"].as_str().unwrap().starts_with(class));
                } else if class == "SYS" {
                    assert_eq!(cross["status"], "degraded", "{f}: {cross}");
                }
            }
        }
        let out = gdpath().args(["doctor", "--smi-topo", f]).output().unwrap();
        assert_eq!(out.status.code(), Some(code));
        let text = String::from_utf8_lossy(&out.stdout);
        assert!(
            text.starts_with("gdpath doctor: nvidia-smi topo -m text"),
            "{text}"
        );
    }
}

fn common_run(args: &[&str]) -> (bool, String, String) {
    let out = gdpath().args(args).output().unwrap();
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// `--need` judges the paths a node needs: the one-GPU H200 capture is `unavailable` (exit 2)
/// for P2P, which one GPU cannot have, so `gdpath doctor && launch` could never pass there;
/// `--need gds` judges GDS and the system findings (GDS through staging: degraded, 1) and
/// still reports every finding, its closing line saying so; `--need p2p` keeps the 2; an
/// unknown name is refused.
#[test]
fn need_judges_only_the_paths_named() {
    let snap = gdpath_testkit::fixture("device/h200x1-capture-2026-12-01.tar.gz");
    let snap = snap.to_str().unwrap();
    let run = |extra: &[&str]| {
        gdpath()
            .args(["doctor", "--snapshot", snap])
            .args(extra)
            .output()
            .unwrap()
    };
    let all = run(&[]);
    assert_eq!(all.status.code(), Some(2));
    let gds = run(&["--need", "gds"]);
    assert_eq!(
        gds.status.code(),
        Some(1),
        "{}",
        String::from_utf8_lossy(&gds.stdout)
    );
    assert!(String::from_utf8_lossy(&gds.stdout).contains("p2p.unsupported"));
    // The closing line says the status the process returns, and on what it was judged.
    assert!(
        String::from_utf8_lossy(&gds.stdout)
            .contains("exit status 1 (judged on --need gds): some path degraded"),
        "{}",
        String::from_utf8_lossy(&gds.stdout)
    );
    assert!(String::from_utf8_lossy(&all.stdout).contains("exit status 2: some path unavailable"));
    assert_eq!(run(&["--need", "p2p,gds"]).status.code(), Some(2));
    let bad = run(&["--need", "nvme"]);
    assert_eq!(bad.status.code(), Some(3));
    assert!(String::from_utf8_lossy(&bad.stderr).contains("expected p2p, gdr or gds"));
}
