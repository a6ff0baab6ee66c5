//! The doctor at the machine model's device limit: NCCL topology files derived from AWS p4d's
//! (its PCIe switch of two A100 and one EFA repeated under its two CPUs, with new bus ids), up
//! to 4,095 GPUs, NICs and NVMe (2,730 GPUs: 3,725,085 GPU pairs). The pair checks are worked
//! out per pair key, so this takes seconds, and the report names groups of pairs instead of
//! listing millions.

mod doctor_common;
use doctor_common::*;
use gdpath::finding::ids;
use gdpath::{Area, Status};
use gdpath_doctor::render::{self, TextOptions};
use std::time::Instant;

/// The p4d file with its first PCIe switch (two GPUs and a NIC) repeated `switches` times,
/// half under each of its two CPUs.
fn derived_p4d(switches: usize) -> String {
    let text = std::fs::read_to_string(fixture("nccl-xml/nccl-aws-p4d-24xl-topo.xml")).unwrap();
    let start = text.find(r#"<pci busid="ffff:ff:01.0""#).unwrap();
    let end = text[start..].find("<!-- Switch 0 ends -->").unwrap() + start;
    let switch = &text[start..end];
    let cpu = |numa: usize| {
        let tag = format!(r#"<cpu numaid="{numa}""#);
        let at = text.find(&tag).unwrap();
        let close = text[at..].find('>').unwrap() + at + 1;
        text[at..close].to_owned()
    };
    let mut out = String::from("<system version=\"1\">\n");
    for numa in 0..2 {
        out.push_str(&cpu(numa));
        out.push('\n');
        for k in (0..switches).filter(|k| k % 2 == numa) {
            let (domain, bus) = (k / 256 + 1, k % 256);
            out.push_str(
                &switch
                    .replace(
                        "ffff:ff:01.0",
                        &format!("ffff:{:02x}:{:02x}.0", k / 32, k % 32),
                    )
                    .replace("0000:10:", &format!("{domain:04x}:{bus:02x}:")),
            );
            out.push('\n');
        }
        out.push_str("</cpu>\n");
    }
    out.push_str("</system>\n");
    out
}

/// Runs the doctor on a derived file; the report and the seconds it took.
fn doctor_on_derived(switches: usize) -> (gdpath_doctor::Report, f64, usize) {
    let tmp = scratch();
    let file = tmp.path().join(format!("p4d-x{switches}.xml"));
    std::fs::write(&file, derived_p4d(switches)).unwrap();
    let t = Instant::now();
    let loaded = gdpath_doctor::load(&gdpath::topo::Source::NcclXml(file)).unwrap();
    let gpus = loaded.machine.gpus().count();
    let input =
        gdpath_doctor::DoctorInput::new(&loaded.machine, loaded.view.as_ref(), loaded.mode.clone());
    let r = gdpath_doctor::run(&input);
    let text = render::text(&r, &loaded.mode, TextOptions::default());
    assert!(text.lines().count() < 40, "{text}");
    (r, t.elapsed().as_secs_f64(), gpus)
}

/// How many pairs a P2P subject stands for: `GPU0-GPU1`, `all N pairs of …`, `N pairs: …`.
fn pairs_in(subject: &str) -> usize {
    let mut w = subject.split_whitespace();
    match w.next() {
        Some("all") => w.next().unwrap().parse().unwrap(),
        Some(n) if n.chars().all(|c| c.is_ascii_digit()) => n.parse().unwrap(),
        _ => {
            assert!(
                subject.starts_with("GPU") && !subject.contains(' '),
                "{subject}"
            );
            1
        }
    }
}

#[test]
fn at_the_device_limit_the_doctor_takes_seconds_and_names_groups_of_pairs() {
    // 1,365 switches: 2,730 GPUs and 1,365 NICs, 4,095 devices of the 4,096 the model allows.
    let (r, secs, gpus) = doctor_on_derived(1365);
    eprintln!("doctor on {gpus} GPUs: {secs:.2} s");
    assert_eq!(gpus, 2730);
    assert!(secs < 60.0, "{secs:.1} s");
    let pairs = gpus * (gpus - 1) / 2;
    for id in [
        ids::P2P_UNSUPPORTED,
        ids::P2P_ACS_ENABLED,
        ids::P2P_IOMMU_TRANSLATED,
        ids::P2P_CROSS_SOCKET,
        ids::P2P_DISABLED,
        ids::P2P_NCCL_LEVEL,
    ] {
        let of: Vec<_> = r
            .findings
            .iter()
            .filter(|f| f.id.as_str() == id && f.path == Area::P2p)
            .collect();
        assert!(of.len() <= 8, "{id}: {} findings", of.len());
        let covered: usize = of.iter().map(|f| pairs_in(&f.subject)).sum();
        assert_eq!(covered, pairs, "{id}: every pair once");
    }
    // NVLink is not in the file: the SYS pairs (across the two CPUs) are unknown, not degraded.
    let sys = r
        .findings
        .iter()
        .find(|f| f.id.as_str() == ids::P2P_CROSS_SOCKET && f.status == Status::Unknown)
        .unwrap();
    // 683 switches under the first CPU, 682 under the second.
    assert_eq!(pairs_in(&sys.subject), 1366 * 1364);
    assert!(r
        .findings
        .iter()
        .all(|f| f.path != Area::P2p || f.status != Status::Degraded));
    // Per GPU and NIC (GDR) the findings stay one each.
    assert!(r.findings.len() < 6 * 4096, "{} findings", r.findings.len());
}

/// Up to 64 GPUs each pair has its own findings (`GPU0-GPU1`); from 65 on, groups of pairs.
#[test]
fn per_pair_findings_up_to_64_gpus() {
    let (r, _, gpus) = doctor_on_derived(32);
    assert_eq!(gpus, 64);
    let acs: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.id.as_str() == ids::P2P_ACS_ENABLED && f.path == Area::P2p)
        .collect();
    assert_eq!(acs.len(), 64 * 63 / 2);
    assert!(acs.iter().all(|f| pairs_in(&f.subject) == 1));
    assert_eq!(status(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU1"), Status::Ok);
    assert_eq!(
        status(&r, ids::P2P_CROSS_SOCKET, "GPU0-GPU2"),
        Status::Unknown
    );

    let (r, _, gpus) = doctor_on_derived(33);
    assert_eq!(gpus, 66);
    let acs: Vec<_> = r
        .findings
        .iter()
        .filter(|f| f.id.as_str() == ids::P2P_ACS_ENABLED && f.path == Area::P2p)
        .collect();
    assert!(acs.len() < 10, "{}", acs.len());
    assert_eq!(
        acs.iter().map(|f| pairs_in(&f.subject)).sum::<usize>(),
        66 * 65 / 2
    );
}
