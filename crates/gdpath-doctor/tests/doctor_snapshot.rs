//! A snapshot holds the doctor's reads too: the doctor on a replayed snapshot gives the same
//! findings as on the tree it was captured from.

mod doctor_common;
use doctor_common::*;
use gdpath::topo::{snapshot, sysfs, DirView, Recording, Source};
use gdpath::Finding;
use gdpath_doctor::{self as doctor, DoctorInput, Mode};

/// (id, path, subject, status, remedy) and evidence with the replayed source's name removed,
/// and the machine's source (`sysfs-root`, or `snapshot` for the replay) as `(<kind>)`.
fn comparable(f: &Finding, name: &str, kind: &str) -> String {
    format!(
        "{} {:?} {} {:?} {} | {}",
        f.id,
        f.path,
        f.subject,
        f.status,
        f.remedy,
        f.evidence
            .replace(name, "<source>")
            .replace(&format!("({kind})"), "(<kind>)")
    )
}

#[test]
fn snapshot_replays_the_doctors_reads() {
    let (_t, top) = unpack_sysfs(SANDY);
    // Conditions from /proc and /sys beyond the topology: a peer-memory module without
    // memory_peers, a container sign, a cufile.json, a kernel release.
    mkdir(&top, "sys/module/nvidia_peermem");
    write(&top, ".dockerenv", "");
    write(&top, "proc/sys/kernel/osrelease", "5.4.0-150-generic\n");
    write(
        &top,
        "etc/cufile.json",
        "{ // x\n \"properties\": { \"allow_compat_mode\": true } }\n",
    );

    let rec = Recording::new(DirView::new(&top));
    let machine = sysfs::read_machine(&rec, "sysfs-root").unwrap();
    let tree_name = format!("sysfs tree {}", top.display());
    let direct = doctor::run(&DoctorInput::new(
        &machine,
        &rec,
        Mode::Replay {
            what: tree_name.clone(),
        },
    ));

    let dir = scratch();
    let snap_path = dir.path().join("snap.tar.gz");
    let file = std::fs::File::create(&snap_path).unwrap();
    snapshot::capture(&rec, &machine.source, None, file).unwrap();
    let loaded = doctor::load(&Source::Snapshot(snap_path.clone())).unwrap();
    let snap_name = format!("snapshot {}", snap_path.display());
    assert_eq!(
        loaded.mode,
        Mode::Replay {
            what: snap_name.clone()
        }
    );
    let replay = doctor::run(&DoctorInput::new(
        &loaded.machine,
        loaded.view.as_ref(),
        loaded.mode.clone(),
    ));

    let a: Vec<String> = direct
        .findings
        .iter()
        .map(|f| comparable(f, &tree_name, "sysfs-root"))
        .collect();
    let b: Vec<String> = replay
        .findings
        .iter()
        .map(|f| comparable(f, &snap_name, "snapshot"))
        .collect();
    assert_eq!(a, b);
    // The conditions were really seen (not just equally missing on both sides).
    let text = b.join("\n");
    assert!(
        text.contains("gdr.peermem-unregistered Gdr system Unavailable"),
        "{text}"
    );
    assert!(text.contains("/.dockerenv exists"));
    assert!(text.contains("5.4.0-150-generic"));
    assert!(text.contains("allow_compat_mode true"));
    assert_eq!(direct.exit_code(), replay.exit_code());
}
