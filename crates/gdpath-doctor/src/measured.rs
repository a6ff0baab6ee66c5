//! `--measure`: flags a path that is reported available but runs at fallback speed — P2P "OK"
//! yet GPU↔GPU at staged bandwidth, GDR at bounce-buffer speed — and GDS that reads slower
//! than the CPU path it replaces.
//!
//! The rule for P2P and GDR: with `direct` the measured bandwidth of the direct path and
//! `fallback` that of its fallback (same sizes, same direction), the direct path is a silent
//! fallback when `direct ≤ 1.2 × fallback`. A real direct path beats its fallback by far more
//! (docs/benchmarks.md, "Measurements behind the defaults", the measured-fallback rule). The
//! 20 % margin absorbs run-to-run noise on machines where the two are close by nature (PCIe P2P
//! vs. pinned staging through the same root complex), so it flags only paths that gain nothing.
//!
//! GDS is held to a different rule: on one NVMe drive both paths are bound by the drive, and
//! GDS's gain there is the CPU and host-memory bandwidth it does not use, not throughput
//! (NVIDIA's GPUDirect Storage design guide, "Bandwidth from Storage"). So GDS counts as
//! degraded only when it loses to its own fallback: `direct < 0.8 × fallback` ([`GDS_MIN_SHARE`]),
//! which a direct DMA path through a root complex that forwards P2P slowly, or across sockets,
//! shows.
//!
//! [`probe_p2p`] measures P2P against the staged path with the `gdpath bench p2p` harness;
//! [`probe_gds`] reads a file into GPU memory through cuFile's GDS path and through gdpath's
//! staged path with the `gdpath bench storage --gpu` harness. GDR has no probe yet (neither
//! machine here has an RDMA NIC) and is listed `not-run`.

use super::finding;
use gdpath::finding::{ids, Area, Finding, Status};

/// The factor by which a direct P2P or GDR path must beat its fallback.
pub const MIN_SPEEDUP: f64 = 1.2;
/// The share of its fallback's bandwidth below which GDS counts as degraded (see the module
/// docs: a drive bounds both paths).
pub const GDS_MIN_SHARE: f64 = 0.8;

/// How `area`'s measurement is judged: the ratio direct ÷ fallback, whether being at it is
/// already degraded (P2P, GDR: `≤ 1.2`) or only being below it (GDS: `< 0.8`), the words for
/// the evidence, and the remedy when degraded.
fn rule(area: Area) -> (f64, bool, &'static str, &'static str) {
    match area {
        Area::Gds => (
            GDS_MIN_SHARE,
            false,
            "degraded below",
            "GDS reads slower than the CPU path it replaces: its DMA probably crosses a root \
             complex that forwards P2P slowly, or another socket (see gds.nvme-far for the \
             GPU measured, p2p.acs-enabled and system.iommu); read with the GPU nearest the \
             drive",
        ),
        _ => (
            MIN_SPEEDUP,
            true,
            "degraded at or below",
            "the path reports available but gains nothing over its fallback: the driver is \
             probably routing it through host memory (ACS, IOMMU, a root complex that forwards \
             P2P slowly); see the other findings for this subject",
        ),
    }
}

/// The finding id for a measured fallback on `area`; `None` for areas without a direct path
/// (storage, system).
pub fn id_for(area: Area) -> Option<&'static str> {
    match area {
        Area::P2p => Some(ids::P2P_MEASURED_FALLBACK),
        Area::Gdr => Some(ids::GDR_MEASURED_FALLBACK),
        Area::Gds => Some(ids::GDS_MEASURED_FALLBACK),
        Area::Storage | Area::System => None,
    }
}

/// Compares measured bandwidths (GB/s = 1e9 B/s) of a direct path and its fallback. `Degraded`
/// when `direct ≤ 1.2 × fallback` (P2P, GDR) or `direct < 0.8 × fallback` (GDS); `Ok` otherwise;
/// `Unknown` when either figure is not a positive finite number. `None` for an area without a
/// direct path.
pub fn compare(area: Area, subject: &str, direct_gbps: f64, fallback_gbps: f64) -> Option<Finding> {
    let id = id_for(area)?;
    let valid = |x: f64| x.is_finite() && x > 0.0;
    if !valid(direct_gbps) || !valid(fallback_gbps) {
        return Some(finding(
            id,
            area,
            subject,
            Status::Unknown,
            format!(
                "measurement invalid: direct {direct_gbps} GB/s, fallback {fallback_gbps} GB/s"
            ),
            "measure again: `gdpath doctor --measure`",
        ));
    }
    let ratio = direct_gbps / fallback_gbps;
    let (limit, at_limit_too, words, remedy) = rule(area);
    let ev = format!(
        "measured direct {direct_gbps:.2} GB/s vs fallback {fallback_gbps:.2} GB/s ({ratio:.2}×; \
         {words} {limit}×)"
    );
    let degraded = ratio < limit || (at_limit_too && ratio == limit);
    Some(if degraded {
        finding(id, area, subject, Status::Degraded, ev, remedy)
    } else {
        finding(id, area, subject, Status::Ok, ev, "")
    })
}

/// The finding `--measure` gives for an area without a probe (GDR): `not-run`, saying so.
pub fn not_available(area: Area) -> Option<Finding> {
    not_run(
        area,
        "no bandwidth probe for this path yet (P2P and GDS have one)",
        "measure GDR with `gdpath bench net` between two machines",
    )
}

/// The finding `--measure` gives in a replay (a snapshot or a published topology): `not-run`,
/// since there is no GPU or file to measure.
pub fn not_live(area: Area) -> Option<Finding> {
    not_run(
        area,
        "a replay has nothing to measure: run --measure on the machine itself",
        "run `gdpath doctor --measure` on the machine itself",
    )
}

fn not_run(area: Area, why: &str, remedy: &str) -> Option<Finding> {
    let id = id_for(area)?;
    Some(finding(id, area, "system", Status::NotRun, why, remedy))
}

/// Bytes per copy of the P2P probe: large enough to reach the link's plateau (≥ 64 MiB on
/// NVLink, see docs/benchmarks.md), small enough to take well under a second per pair.
const PROBE_BYTES: u64 = 64 << 20;

/// Measures every ordered GPU pair with P2P on and with P2P off (the staged path) through the
/// `gdpath bench p2p` harness (64 MiB copies, median of 3, data verified) and applies
/// [`compare`] to each pair. A machine without a GPU driver gives one `Unknown` finding with the
/// reason; one without two GPUs gives none.
pub fn probe_p2p() -> Vec<Finding> {
    use gdpath_bench::gpu::{run, GpuBenchConfig, GpuBenchKind};
    let cfg = GpuBenchConfig {
        kind: GpuBenchKind::P2p,
        sizes: vec![PROBE_BYTES],
        runs: 3,
        gpus: None,
    };
    let report = match run(&cfg) {
        Ok(r) => r,
        Err(e) => {
            return vec![finding(
                ids::P2P_MEASURED_FALLBACK,
                Area::P2p,
                "system",
                Status::Unknown,
                format!("P2P probe could not run: {e}"),
                "check that CUDA works here: `gdpath bench p2p` runs the same copies and says why it cannot",
            )]
        }
    };
    let one_way = |staged: bool| {
        report.rows.iter().filter(move |r| {
            r.verified
                && !r.path.ends_with("-bidir")
                && (r.path == "staged") == staged
                && (staged || r.path.starts_with("p2p-"))
        })
    };
    let mut out = Vec::new();
    for direct in one_way(false) {
        let (Some(src), Some(dst)) = (&direct.src, &direct.dst) else {
            continue;
        };
        let staged =
            one_way(true).find(|r| r.src.as_ref() == Some(src) && r.dst.as_ref() == Some(dst));
        if let Some(staged) = staged {
            let subject = format!("{src}-{dst}");
            out.extend(
                compare(Area::P2p, &subject, direct.gbps_median, staged.gbps_median).map(
                    |mut f| {
                        f.evidence = format!(
                            "{} ({} path, 64 MiB, median of 3, verified; gdpath bench p2p)",
                            f.evidence, direct.path
                        );
                        f
                    },
                ),
            );
        }
    }
    out
}

/// Bytes the GDS probe reads per run: enough for a drive to reach its sequential rate, a
/// fraction of a second on an NVMe drive.
const GDS_PROBE_BYTES: u64 = 256 << 20;
/// What the GDS probe needs of a directory.
const GDS_PROBE_NEEDS: &str = "--measure needs a writable --path with 256 MiB free";

/// Measures, in each directory of `dirs`, a read of a 256 MiB file (created there with an
/// unpredictable `.gdpath-doctor-gds*` name, filled with a pattern, removed afterwards; an
/// interrupted doctor can leave it behind) into GPU 0
/// through cuFile's GDS path and through gdpath's staged path (O_DIRECT into pinned bounce
/// buffers, then copies to the GPU), with the `gdpath bench storage --gpu` harness (page cache
/// dropped before each run, median of 3, data verified), and applies [`compare`]. Per
/// directory, one finding:
/// - `ok` / `degraded` when both paths ran;
/// - `not-run` when cuFile did not take its GDS path there (nvidia-fs missing, a file system
///   it refuses; the evidence names cuFile's reason and the staged figure; the static `gds.*`
///   findings say why);
/// - `unavailable` when a path's data did not verify;
/// - `unknown` when the probe could not run (no GPU or CUDA driver, a directory not writable
///   or without 256 MiB free, a failed transfer), with the reason.
pub fn probe_gds(dirs: &[std::path::PathBuf]) -> Vec<Finding> {
    // Without a GPU no file is written: the reason is the same for every directory.
    let gpu = match gdpath_cuda::Cuda::load() {
        Err(e) => Err(e.to_string()),
        Ok(c) => match c.device_count() {
            Ok(0) => Err("the CUDA driver sees no GPU".to_owned()),
            Ok(_) => Ok(()),
            Err(e) => Err(e.to_string()),
        },
    };
    dirs.iter()
        .map(|d| match &gpu {
            Ok(()) => probe_gds_in(d),
            Err(why) => gds_finding(
                d,
                Status::Unknown,
                format!("GDS probe could not run: {why}"),
                "check that CUDA and cuFile work here: `gdpath bench storage --gpu 0` runs the same reads and says why it cannot",
            ),
        })
        .collect()
}

/// A `gds.measured-fallback` finding for `dir`.
fn gds_finding(dir: &std::path::Path, status: Status, evidence: String, remedy: &str) -> Finding {
    finding(
        ids::GDS_MEASURED_FALLBACK,
        Area::Gds,
        dir.display().to_string(),
        status,
        evidence,
        remedy,
    )
}

fn probe_gds_in(dir: &std::path::Path) -> Finding {
    use gdpath::GdsConfig;
    use gdpath_bench::gds::{run, GdsBenchConfig, GdsPathChoice};
    let unknown = |why: String, remedy: &str| {
        gds_finding(
            dir,
            Status::Unknown,
            format!("GDS probe could not run: {why}"),
            remedy,
        )
    };
    // Created exclusively (O_EXCL) under a random name: nothing that already exists there,
    // a link included, is opened or written. Removed when the guard drops.
    let file = match tempfile::Builder::new()
        .prefix(".gdpath-doctor-gds")
        .tempfile_in(dir)
    {
        Ok(f) => f,
        Err(e) => {
            return unknown(
                format!("no file can be created in {}: {e}", dir.display()),
                GDS_PROBE_NEEDS,
            )
        }
    };
    // An interrupt ends the process without running destructors: the CLI's handler removes
    // what is registered here (`gdpath::file::remove_live_temporaries`).
    let _interrupted = gdpath::file::Temporary::adopt(file.path());
    let defaults = GdsConfig::default();
    let runs = 3;
    let cfg = GdsBenchConfig {
        file: file.path().to_owned(),
        size: GDS_PROBE_BYTES,
        gpu: 0,
        blocks: vec![defaults.chunk],
        threads: vec![defaults.threads],
        slabs: None,
        op: gdpath::Op::Read,
        runs,
        paths: vec![GdsPathChoice::Gds, GdsPathChoice::Staged],
        cold: true,
        // The file exists (empty): the harness fills it.
        overwrite: true,
    };
    let result = run(&cfg, &gdpath_bench::NoProgress);
    let removed = file.close();
    let report = match result {
        Ok(r) => r,
        // Writing the pattern file (no space, a quota) is the probe's own doing.
        Err(e @ (gdpath::Error::Io { op: "write", .. } | gdpath::Error::NoSpace { .. })) => {
            return unknown(e.to_string(), GDS_PROBE_NEEDS)
        }
        Err(e) => return unknown(e.to_string(), ""),
    };
    let mut left = String::new();
    if let Err(e) = removed {
        left = format!("; the probe file could not be removed: {e}");
    }
    if let Some(bad) = report.rows.iter().find(|r| !r.verified) {
        return gds_finding(
            dir,
            Status::Unavailable,
            format!(
                "the {} read of {} into GPU 0 did not match the file{left}",
                bad.path,
                gdpath::units::format_size(GDS_PROBE_BYTES)
            ),
            "do not use this path for this directory: data read through it is wrong",
        );
    }
    // Rows follow the order of `cfg.paths` for the choices that were not skipped.
    let skipped = |c: GdsPathChoice| report.skipped.iter().find(|s| s.path == c);
    let mut rows = report.rows.iter();
    let native = skipped(GdsPathChoice::Gds)
        .is_none()
        .then(|| rows.next())
        .flatten();
    let staged = skipped(GdsPathChoice::Staged)
        .is_none()
        .then(|| rows.next())
        .flatten();
    let how = |r: &gdpath_bench::BenchRow| {
        format!(
            "{} {:.2} GB/s ({} into GPU 0, median of {runs}, verified)",
            r.path,
            r.gbps_median,
            gdpath::units::format_size(GDS_PROBE_BYTES)
        )
    };
    let why_skipped = |c: GdsPathChoice| {
        skipped(c).map_or_else(
            || "no row".to_owned(),
            |s| match &s.finding {
                Some(id) => format!("{id}: {}", s.detail),
                None => s.detail.clone(),
            },
        )
    };
    match (native, staged) {
        (Some(n), Some(st)) => {
            let mut f = compare(
                Area::Gds,
                &dir.display().to_string(),
                n.gbps_median,
                st.gbps_median,
            )
            .expect("GDS has a direct path");
            f.evidence = format!("{}: {}; {}{left}", f.evidence, how(n), how(st));
            f
        }
        (None, st) => {
            let staged = st.map_or_else(
                || {
                    format!(
                        "the staged path did not run either ({})",
                        why_skipped(GdsPathChoice::Staged)
                    )
                },
                how,
            );
            gds_finding(
                dir,
                Status::NotRun,
                format!(
                    "cuFile did not take its GDS path here ({}); {staged}{left}",
                    why_skipped(GdsPathChoice::Gds)
                ),
                "the gds.* findings for this directory say what keeps cuFile off its GDS path, each with its remedy",
            )
        }
        (Some(n), None) => unknown(
            format!(
                "{}, but the staged path did not run ({}){left}",
                how(n),
                why_skipped(GdsPathChoice::Staged)
            ),
            "",
        ),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule() {
        // An NVLink pair against its pinned staging leg (docs/benchmarks.md, the
        // measured-fallback row): a real direct path.
        let f = compare(Area::P2p, "GPU0-GPU1", 394.16, 55.48).unwrap();
        assert_eq!(
            (f.id.as_str(), f.status),
            (ids::P2P_MEASURED_FALLBACK, Status::Ok)
        );
        // P2P and GDR: exactly at the threshold counts as a fallback; just above does not.
        assert_eq!(
            compare(Area::P2p, "GPU0-GPU1", 12.0, 10.0).unwrap().status,
            Status::Degraded
        );
        assert_eq!(
            compare(Area::P2p, "GPU0-GPU1", 12.01, 10.0).unwrap().status,
            Status::Ok
        );
        // GDS: level with the staged path is fine (one drive bounds both); below 0.8× is not.
        assert_eq!(
            compare(Area::Gds, "/data", 10.0, 10.0).unwrap().status,
            Status::Ok
        );
        assert_eq!(
            compare(Area::Gds, "/data", 8.0, 10.0).unwrap().status,
            Status::Ok
        );
        let slow = compare(Area::Gds, "/data", 7.99, 10.0).unwrap();
        assert_eq!(slow.status, Status::Degraded);
        assert!(slow.remedy.contains("nearest the drive"), "{}", slow.remedy);
        assert_eq!(
            compare(Area::Gdr, "GPU0-NIC0", 10.0, 11.0).unwrap().status,
            Status::Degraded
        );
        assert_eq!(
            compare(Area::Gdr, "x", f64::NAN, 1.0).unwrap().status,
            Status::Unknown
        );
        assert_eq!(
            compare(Area::Gdr, "x", 1.0, 0.0).unwrap().status,
            Status::Unknown
        );
        assert!(compare(Area::System, "x", 1.0, 1.0).is_none());
        assert_eq!(not_available(Area::Gdr).unwrap().status, Status::NotRun);
        assert!(not_live(Area::P2p).unwrap().evidence.contains("replay"));
    }
}
