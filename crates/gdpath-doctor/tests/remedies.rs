//! Every finding that is not `ok` says what to do about it: on every vendored machine (the
//! published NCCL and hwloc topologies, the hwloc sysfs dumps, the `nvidia-smi topo -m` texts,
//! the H200 snapshots) and on the machine the test runs on, each degraded, unavailable, unknown
//! or not-run finding carries a remedy (the report's findings table shows one on every row).

use gdpath::Status;
use gdpath_testkit::{fixture, fixture_files, unpack_sysfs};
use gdpath_topo::Source;
use std::path::PathBuf;

/// The findings of `source` that are not ok and have no remedy, as `id (status) subject`.
fn without_remedy(source: &Source, paths: &[PathBuf]) -> Vec<String> {
    let ex =
        gdpath_doctor::examine(source, paths, false).unwrap_or_else(|e| panic!("{source:?}: {e}"));
    ex.report
        .findings
        .iter()
        .filter(|f| f.status != Status::Ok && f.remedy.trim().is_empty())
        .map(|f| format!("{} ({:?}) {}: {}", f.id, f.status, f.subject, f.evidence))
        .collect()
}

#[test]
fn every_finding_that_is_not_ok_has_a_remedy() {
    let mut sources: Vec<Source> = Vec::new();
    sources.extend(
        fixture_files("nccl-xml", ".xml")
            .into_iter()
            .map(Source::NcclXml),
    );
    sources.extend(
        fixture_files("hwloc-xml", ".xml")
            .into_iter()
            .map(Source::HwlocXml),
    );
    sources.extend(
        fixture_files("nvidia-smi", ".txt")
            .into_iter()
            .map(Source::SmiTopo),
    );
    sources.push(Source::Snapshot(fixture(
        "device/h200x1-capture-2026-12-01.tar.gz",
    )));
    sources.push(Source::Snapshot(PathBuf::from(
        gdpath_testkit::h200x2_snapshot(),
    )));
    let mut missing = Vec::new();
    for s in &sources {
        missing.extend(
            without_remedy(s, &[])
                .into_iter()
                .map(|m| format!("{s:?}: {m}")),
        );
    }
    let mut guards = Vec::new();
    for p in fixture_files("hwloc-sysfs", ".tar.bz2") {
        let (guard, top) = unpack_sysfs(p.file_name().unwrap().to_str().unwrap());
        let s = Source::SysfsRoot(top);
        missing.extend(
            without_remedy(&s, &[])
                .into_iter()
                .map(|m| format!("{s:?}: {m}")),
        );
        guards.push(guard);
    }
    // This machine, live, with GDS checked in a scratch directory.
    let dir = tempfile::tempdir().unwrap();
    missing.extend(
        without_remedy(&Source::Live, &[dir.path().to_owned()])
            .into_iter()
            .map(|m| format!("live: {m}")),
    );
    assert!(
        missing.is_empty(),
        "{} findings without a remedy:\n{}",
        missing.len(),
        missing.join("\n")
    );
}
