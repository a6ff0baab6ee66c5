//! `gdpath doctor` as a script runs it: exit status and JSON.

use std::process::Command;

/// The snapshot of the two-GPU H200 machine shipped with gdpath.
const H200_SNAPSHOT: &str = concat!(
    env!("CARGO_MANIFEST_DIR"),
    "/../../assets/snapshots/h200x2.tar.gz"
);

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
        .args(["doctor", "--json", "--snapshot", H200_SNAPSHOT])
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
        .args(["doctor", "--json", "--measure", "--snapshot", H200_SNAPSHOT])
        .output()
        .unwrap();
    let v: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let finding = |id: &str| {
        v["findings"]
            .as_array()
            .unwrap()
            .iter()
            .find(|f| f["id"] == id)
            .unwrap_or_else(|| panic!("no {id} in {v}"))
            .clone()
    };
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
