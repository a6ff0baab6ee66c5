//! GPU suite of the doctor: `doctor --measure`'s probes on a machine with a GPU. Ignored
//! without one; run with `--ignored` through `scripts/gpu-suite.sh`. `GDPATH_GDS_DIRS`
//! (colon-separated) overrides the directories tested (default `/dev/shm` and `/var/tmp`), as
//! in the engine's `gds_gpu` suite.

/// `doctor --measure`'s GDS probe in each test directory: one finding per directory, `ok` or
/// `degraded` where cuFile took its GDS path (both figures in the evidence), `not-run` where it
/// did not (cuFile's reason and the staged figure), never `unknown` on a machine with a GPU;
/// and no probe file left behind.
#[test]
#[ignore = "needs an NVIDIA GPU: run the GPU suite"]
fn doctor_gds_probe_measures_each_directory() {
    use gdpath::Status;
    let dirs = gdpath_testkit::gds_dirs();
    let fs = gdpath_doctor::measured::probe_gds(&dirs);
    assert_eq!(fs.len(), dirs.len(), "{fs:?}");
    for (f, d) in fs.iter().zip(&dirs) {
        eprintln!("{}: {:?} {}", d.display(), f.status, f.evidence);
        assert_eq!(f.id.as_str(), "gds.measured-fallback");
        assert_eq!(f.subject, d.display().to_string());
        match f.status {
            Status::Ok | Status::Degraded => {
                assert!(f.evidence.contains("gds-native"), "{}", f.evidence);
                assert!(f.evidence.contains("posix-"), "{}", f.evidence);
            }
            Status::NotRun => {
                assert!(f.evidence.contains("cuFile did not take"), "{}", f.evidence);
                assert!(f.evidence.contains("posix-"), "{}", f.evidence);
            }
            s => panic!("{}: {s:?} {}", d.display(), f.evidence),
        }
        let left: Vec<_> = std::fs::read_dir(d)
            .unwrap()
            .filter_map(|e| e.ok())
            .filter(|e| {
                e.file_name()
                    .to_string_lossy()
                    .starts_with(".gdpath-doctor-gds")
            })
            .collect();
        assert!(left.is_empty(), "probe file left in {}", d.display());
    }
}
