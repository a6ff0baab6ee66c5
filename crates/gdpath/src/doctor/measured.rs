//! `--measure`: flags a path that is reported available but runs at fallback speed — P2P "OK"
//! yet GPU↔GPU at staged bandwidth, GDR at bounce-buffer speed, GDS at POSIX speed.
//!
//! The rule: with `direct` the measured bandwidth of the direct path and `fallback` that of its
//! fallback (same sizes, same direction), the direct path is a silent fallback when
//! `direct ≤ 1.2 × fallback`. A real direct path beats its fallback by far more: on the H200
//! machine P2P over NVLink ran at ≈ 394 GB/s against ≈ 55 GB/s for a pinned host copy, one
//! direction of the staged path (fixtures/device/h200x2-probe-2026-11-30.txt). The 20 % margin
//! absorbs run-to-run noise on machines where the two are close by nature (PCIe P2P vs. pinned
//! staging through the same root complex), so it flags only paths that gain nothing.
//!
//! [`probe_p2p`] measures P2P against the staged path with the `gdpath bench p2p` harness;
//! GDR and GDS have no probe yet and are listed `not-run`.

use super::finding;
use crate::finding::{ids, Area, Finding, Status};

/// The factor by which a direct path must beat its fallback.
pub const MIN_SPEEDUP: f64 = 1.2;

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
/// when `direct ≤ 1.2 × fallback`; `Ok` above; `Unknown` when either figure is not a positive
/// finite number. `None` for an area without a direct path.
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
            "",
        ));
    }
    let ratio = direct_gbps / fallback_gbps;
    let ev = format!(
        "measured direct {direct_gbps:.2} GB/s vs fallback {fallback_gbps:.2} GB/s ({ratio:.2}×; \
         threshold {MIN_SPEEDUP}×)"
    );
    Some(if ratio <= MIN_SPEEDUP {
        finding(
            id,
            area,
            subject,
            Status::Degraded,
            ev,
            "the path reports available but gains nothing over its fallback: the driver is \
             probably routing it through host memory (ACS, IOMMU, a root complex that forwards \
             P2P slowly); see the other findings for this subject",
        )
    } else {
        finding(id, area, subject, Status::Ok, ev, "")
    })
}

/// The finding `--measure` gives in a build without transfer backends: `not-run`, saying so.
pub fn not_available(area: Area) -> Option<Finding> {
    let id = id_for(area)?;
    Some(finding(
        id,
        area,
        "system",
        Status::NotRun,
        "no bandwidth probe for this path yet (P2P has one)",
        "",
    ))
}

/// Bytes per copy of the P2P probe: large enough to reach the link's plateau (≥ 64 MiB on
/// NVLink, see docs/benchmarks.md), small enough to take well under a second per pair.
const PROBE_BYTES: u64 = 64 << 20;

/// Measures every ordered GPU pair with P2P on and with P2P off (the staged path) through the
/// `gdpath bench p2p` harness (64 MiB copies, median of 3, data verified) and applies
/// [`compare`] to each pair. A machine without a GPU driver gives one `Unknown` finding with the
/// reason; one without two GPUs gives none.
pub fn probe_p2p() -> Vec<Finding> {
    use crate::bench::gpu::{run, GpuBenchConfig, GpuBenchKind};
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
                "",
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rule() {
        // H200 figures: NVLink P2P 394 GB/s against 55.5 GB/s pinned staging: a real direct path.
        let f = compare(Area::P2p, "GPU0-GPU1", 394.16, 55.48).unwrap();
        assert_eq!(
            (f.id.as_str(), f.status),
            (ids::P2P_MEASURED_FALLBACK, Status::Ok)
        );
        // Exactly at the threshold counts as a fallback; just above does not.
        assert_eq!(
            compare(Area::Gds, "/data", 12.0, 10.0).unwrap().status,
            Status::Degraded
        );
        assert_eq!(
            compare(Area::Gds, "/data", 12.01, 10.0).unwrap().status,
            Status::Ok
        );
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
        assert_eq!(not_available(Area::P2p).unwrap().status, Status::NotRun);
    }
}
