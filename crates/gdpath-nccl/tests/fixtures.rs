//! Every vendored NCCL log (fixtures/nccl) against the per-pair table and finding ids written
//! by hand from its lines (`<name>.expected.json`), and mangled logs parsed within bounds.

use gdpath_nccl::{explain, parse_logs, read_logs, Limits};
use std::collections::BTreeSet;

type Row = (u32, u32, String, usize);

fn expected(path: &std::path::Path) -> (BTreeSet<Row>, Vec<String>) {
    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(path).unwrap()).unwrap();
    let rows = v["pairs"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["src"].as_u64().unwrap() as u32,
                r["dst"].as_u64().unwrap() as u32,
                r["via"].as_str().unwrap().to_owned(),
                r["lines"].as_u64().unwrap() as usize,
            )
        })
        .collect();
    let mut ids: Vec<String> = v["findings"]
        .as_array()
        .unwrap()
        .iter()
        .map(|s| s.as_str().unwrap().to_owned())
        .collect();
    ids.sort();
    (rows, ids)
}

#[test]
fn every_fixture_matches_its_hand_written_table() {
    let files = gdpath_testkit::fixture_files("nccl", "log");
    assert!(files.len() >= 14, "fixtures/nccl has {} logs", files.len());
    for log in files {
        let exp = log.with_extension("expected.json");
        let (rows, ids) = expected(&exp);
        let e = explain(
            read_logs(std::slice::from_ref(&log), Limits::default()).unwrap(),
            None,
        );
        let got: BTreeSet<Row> = e
            .pairs
            .iter()
            .map(|r| (r.src, r.dst, r.via.clone(), r.lines))
            .collect();
        assert_eq!(got, rows, "{}: pairs", log.display());
        assert_eq!(e.finding_ids(), ids, "{}: findings", log.display());
        for f in &e.findings {
            assert!(
                !f.reason.is_empty() && !f.finding.remedy.is_empty(),
                "{}: {}",
                log.display(),
                f.finding.id
            );
        }
    }
}

#[test]
fn stated_reasons_and_ranks() {
    let log = gdpath_testkit::fixture("nccl/nccl-899-gdr-no-module.log");
    let e = explain(read_logs(&[log], Limits::default()).unwrap(), None);
    let g = e
        .findings
        .iter()
        .find(|f| f.finding.id.0 == "nccl.gdr-off")
        .unwrap();
    assert_eq!(g.basis, gdpath_nccl::Basis::Stated);
    assert!(g.reason.contains("no module"), "{}", g.reason);
    assert_eq!(
        g.lines[0].line, 1,
        "evidence starts at the first (no module) line"
    );
    // Rank 1 wrote the `0 -> 1 [receive]` lines on 21346d5cefce, rank 0 on 6a5a91752e39.
    assert_eq!(e.job.ranks[&1].host.as_deref(), Some("21346d5cefce"));
    assert_eq!(e.job.ranks[&0].host.as_deref(), Some("6a5a91752e39"));
    assert_eq!(e.job.ranks[&0].pci.as_deref(), Some("0000:1a:00.0"));
    assert!(e.pairs.iter().all(|r| r.same_host == Some(false)));

    let log = gdpath_testkit::fixture("nccl/nccl-1537-gdr-disabled.log");
    let e = explain(read_logs(&[log], Limits::default()).unwrap(), None);
    let g = e
        .findings
        .iter()
        .find(|f| f.finding.id.0 == "nccl.gdr-off")
        .unwrap();
    assert_eq!(
        g.basis,
        gdpath_nccl::Basis::Unknown,
        "NCCL gave no reason in that log"
    );
    assert_eq!(e.job.ranks[&0].nvml_dev, Some(0));
    assert_eq!(e.job.nranks, Some(16));
    assert!(e.job.networks.contains("IB"));
}

#[test]
fn truncated_binary_and_interleaved_logs_parse() {
    let good = b"h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n";
    // Cut mid-line, then binary junk, then a line again.
    let mut log = good.to_vec();
    log.extend_from_slice(b"h:1:2 [0] NCCL INFO Channel 01/0 : 0[0] -> 1[");
    log.extend_from_slice(&[0xff, 0x00, 0xfe, b'\n', 0x1b, b'[', b'2', b'J', b'\n']);
    log.extend_from_slice(good);
    let e = explain(parse_logs(&[("mangled", &log)], Limits::default()), None);
    assert_eq!(e.pairs.len(), 1);
    assert_eq!(e.pairs[0].lines, 2, "the cut line is no connection");
    assert_eq!(e.job.binary_lines, 2);
    assert!(gdpath_nccl::explain::render_text(&e, true).contains("P2P/CUMEM/read"));
    assert!(
        !gdpath_nccl::explain::render_text(&e, true).contains('\u{1b}'),
        "escape sequences are escaped"
    );
}

#[test]
fn a_million_lines_stay_within_the_caps() {
    // 10^6 lines generated here; the caps are reported as a finding, and what is kept is
    // bounded by construction (max_connections rows, max_line_bytes per line).
    let mut log = Vec::with_capacity(80 << 20);
    for i in 0..1_000_000u32 {
        log.extend_from_slice(
            format!(
                "h{}:1:2 [0] NCCL INFO Channel {:02}/0 : {}[0] -> {}[1] via NET/IB/0/GDRDMA\n",
                i % 7,
                i % 32,
                i % 5000,
                (i + 1) % 5000
            )
            .as_bytes(),
        );
    }
    let long = vec![b'x'; 1 << 20];
    log.extend_from_slice(&long);
    log.push(b'\n');
    let limits = Limits {
        max_connections: 1000,
        max_lines: 900_000,
        max_ranks: 100,
        ..Limits::default()
    };
    let job = parse_logs(&[("big", &log)], limits);
    assert_eq!(job.lines_read, 900_000, "the line cap stopped reading");
    assert_eq!(job.connections.len(), 1000);
    assert!(job.ranks.len() <= 100);
    let e = explain(job, None);
    assert!(e.finding_ids().contains(&"nccl.log-truncated".to_owned()));

    let limits = Limits {
        max_bytes_per_file: 1000,
        ..Limits::default()
    };
    let job = parse_logs(&[("big", &log)], limits);
    assert!(job.bytes_read <= 1000);
    assert!(!job.truncated.is_empty());
    // A line of 1 MiB keeps max_line_bytes of it.
    let job = parse_logs(&[("long", &long)], Limits::default());
    assert_eq!(job.lines_read, 1);
}
