//! Every vendored NCCL log (fixtures/nccl) against the per-pair table and finding ids written
//! by hand from its lines (`<name>.expected.json`), and mangled logs parsed within bounds.

use gdpath_nccl::{
    explain, parse_logs, read_logs, Basis, Explanation, Limits, NcclFinding, Topology,
};
use std::collections::BTreeSet;

/// The finding `id` of `e` (the test fails when there is none).
fn finding<'e>(e: &'e Explanation, id: &str) -> &'e NcclFinding {
    e.findings
        .iter()
        .find(|f| f.finding.id.0 == id)
        .unwrap_or_else(|| panic!("no {id} in {:?}", e.finding_ids()))
}

/// The finding `id` of `e`, checked to be stated by the log with `text` in its reason and its
/// evidence starting at line `line`.
fn stated<'e>(e: &'e Explanation, id: &str, text: &str, line: u64) -> &'e NcclFinding {
    let f = finding(e, id);
    assert_eq!(f.basis, Basis::Stated, "{id}");
    assert!(f.reason.contains(text), "{id}: {}", f.reason);
    assert_eq!(f.lines[0].line, line, "{id}: the evidence's first line");
    f
}

/// NCCL's IB device numbers and the RDMA device names the log gives them.
fn ib_names(e: &Explanation) -> Vec<(u32, &str)> {
    e.job
        .ib_devices
        .iter()
        .map(|(n, (name, _))| (*n, name.as_str()))
        .collect()
}

/// Explains one vendored log alone.
fn explain_fixture(name: &str) -> Explanation {
    let log = gdpath_testkit::fixture(&format!("nccl/{name}"));
    explain(read_logs(&[log], Limits::default()).unwrap(), None)
}

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
    assert!(files.len() >= 17, "fixtures/nccl has {} logs", files.len());
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
    let e = explain_fixture("nccl-899-gdr-no-module.log");
    let g = stated(&e, "nccl.gdr-off", "no module", 1);
    assert!(
        g.finding.evidence.contains("nccl-899-gdr-no-module.log:1"),
        "the evidence names the log file as given: {}",
        g.finding.evidence
    );
    // Rank 1 wrote the `0 -> 1 [receive]` lines on 21346d5cefce, rank 0 on 6a5a91752e39.
    assert_eq!(e.job.ranks[&1].host.as_deref(), Some("21346d5cefce"));
    assert_eq!(e.job.ranks[&0].host.as_deref(), Some("6a5a91752e39"));
    assert_eq!(e.job.ranks[&0].pci.as_deref(), Some("0000:1a:00.0"));
    assert!(e.pairs.iter().all(|r| r.same_host == Some(false)));

    let e = explain_fixture("nccl-1537-gdr-disabled.log");
    let g = finding(&e, "nccl.gdr-off");
    assert_eq!(g.basis, Basis::Unknown, "NCCL gave no reason in that log");
    assert_eq!(e.job.ranks[&0].nvml_dev, Some(0));
    assert_eq!(e.job.nranks, Some(16));
    assert!(e.job.networks.contains("IB"));
    // `NET/IB : Using [0]mlx5_0:1/RoCE [1]mlx5_1:1/RoCE [RO]; OOB …`: NCCL's device numbers.
    assert_eq!(ib_names(&e), [(0, "mlx5_0"), (1, "mlx5_1")]);
}

/// NET lines written here in NCCL 2.2x's format (no public log pairs with a vendored
/// topology), against the real p4d.24xlarge NCCL topology file: GPU0 and GPU1 sit under NIC0's
/// switch (PIX), GPU2 and GPU3 under NIC1's, NIC2 and NIC3 are on the other socket (SYS).
const P4D_NET_LINES: &str = "\
node-a:11:21 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/2/GDRDMA
node-a:11:21 [0] NCCL INFO Channel 01/0 : 0[0] -> 8[0] [send] via NET/AWS Libfabric/2/GDRDMA
node-a:12:22 [2] NCCL INFO Channel 00/0 : 2[2] -> 10[2] [send] via NET/AWS Libfabric/1
node-b:13:23 [0] NCCL INFO Channel 00/0 : 0[0] -> 8[0] [receive] via NET/AWS Libfabric/0/GDRDMA
";

fn p4d() -> Topology {
    let source = gdpath_topo::Source::NcclXml(gdpath_testkit::fixture(
        "nccl-xml/nccl-aws-p4d-24xl-topo.xml",
    ));
    Topology::load(&source).unwrap()
}

#[test]
fn net_through_a_sys_nic_while_a_pix_one_exists_is_found() {
    let topo = p4d();
    let job = parse_logs(&[("p4d.log", P4D_NET_LINES.as_bytes())], Limits::default());
    let e = explain(job, Some(&topo));
    let f = finding(&e, "nccl.net-sys-nic");
    assert_eq!(f.basis, Basis::Derived);
    // Rank 0 (GPU0) sends through NIC2, SYS to it, while NIC0 is PIX to it.
    assert!(
        f.reason.contains("GPU0") && f.reason.contains("NIC2") && f.reason.contains("SYS"),
        "{}",
        f.reason
    );
    assert!(f.reason.contains("NIC0 is PIX"), "{}", f.reason);
    assert!(
        f.reason.contains("assumed"),
        "the device-number mapping is said: {}",
        f.reason
    );
    assert_eq!(f.line_count, 1, "one rank↔NIC pair, its first line");
    assert_eq!(f.lines[0].line, 1);
    // Rank 8 receives through NIC0, PIX to its GPU0: no finding for it.
    assert!(
        !f.finding.subject.contains("rank 8"),
        "{}",
        f.finding.subject
    );
    let rows: Vec<(u32, &str, &str, &str)> = e
        .nic_paths
        .iter()
        .map(|p| (p.rank, p.gpu.as_str(), p.nic.as_str(), p.class.as_str()))
        .collect();
    assert_eq!(
        rows,
        [
            (0, "GPU0", "NIC2", "SYS"),
            (2, "GPU2", "NIC1", "PIX"),
            (8, "GPU0", "NIC0", "PIX")
        ]
    );
    // Two hosts, one topology: said.
    assert!(
        e.notes
            .iter()
            .any(|n| n.contains("every one of the job's 2 hosts")),
        "{:?}",
        e.notes
    );
    // The same lines without a topology: nothing is compared.
    let e = explain(
        parse_logs(&[("p4d.log", P4D_NET_LINES.as_bytes())], Limits::default()),
        None,
    );
    assert!(e.nic_paths.is_empty());
    assert!(!e.finding_ids().contains(&"nccl.net-sys-nic".to_owned()));
}

#[test]
fn gdr_off_beside_a_pix_nic_is_derived_with_the_doctor_facts() {
    let mut topo = p4d();
    let job = || parse_logs(&[("p4d.log", P4D_NET_LINES.as_bytes())], Limits::default());
    let e = explain(job(), Some(&topo));
    let g = finding(&e, "nccl.gdr-off");
    assert_eq!(g.basis, Basis::Derived);
    assert!(
        g.reason.contains("GPU2") && g.reason.contains("NIC1") && g.reason.contains("PIX"),
        "{}",
        g.reason
    );
    assert!(
        g.reason.contains("gdr.peermem-missing is Unknown")
            && g.reason.contains("not in the source"),
        "an NCCL XML file has no module list, and the doctor's reason says so: {}",
        g.reason
    );
    // A source whose doctor found peer memory missing: the reason carries the fact.
    topo.gdr_facts.clear();
    topo.gdr_facts.push(gdpath::finding::Finding {
        id: gdpath::finding::FindingId::from(gdpath::finding::ids::GDR_PEERMEM_MISSING),
        path: gdpath::finding::Area::Gdr,
        subject: "machine".into(),
        status: gdpath::finding::Status::Unavailable,
        evidence: "neither nvidia_peermem nor nv_peer_mem is in /proc/modules".into(),
        remedy: "modprobe nvidia_peermem".into(),
    });
    let e = explain(job(), Some(&topo));
    let g = finding(&e, "nccl.gdr-off");
    assert!(
        g.reason.contains("gdr.peermem-missing is Unavailable"),
        "{}",
        g.reason
    );
}

#[test]
fn p2p_pairs_of_one_p4d_get_their_gpus_and_class() {
    // aws-ofi-nccl issue 715: one p4d.24xlarge (its plugin says so earlier in the thread),
    // eight ranks on GPUs 0-7, CloudWatch timestamps on lines of their own between NCCL's.
    let log = gdpath_testkit::fixture("nccl/aws-ofi-nccl-715-p2p-cumem-read-p4d.log");
    let e = explain(read_logs(&[log], Limits::default()).unwrap(), Some(&p4d()));
    assert_eq!(e.job.hosts.iter().collect::<Vec<_>>(), ["algo-1"]);
    assert_eq!(e.pairs.len(), 5);
    for r in &e.pairs {
        assert_eq!(r.same_host, Some(true));
        assert_eq!(r.src_gpu.as_deref(), Some(format!("GPU{}", r.src).as_str()));
        assert_eq!(r.dst_gpu.as_deref(), Some(format!("GPU{}", r.dst).as_str()));
        // The file gives PCIe only (NCCL finds the NVSwitches through NVML at run time).
        assert!(r.topo_class.is_some(), "{} -> {}", r.src, r.dst);
        assert!(
            matches!(&r.transport, gdpath_nccl::parse::Transport::P2p { mode, read: true } if mode == "CUMEM"),
            "{:?}",
            r.transport
        );
    }
    let class = |s: u32| {
        e.pairs
            .iter()
            .find(|r| r.src == s)
            .unwrap()
            .topo_class
            .clone()
    };
    assert_eq!(
        class(0).as_deref(),
        Some("PIX"),
        "GPU0 and GPU1 share a switch"
    );
    assert_eq!(
        class(3).as_deref(),
        Some("SYS"),
        "GPU3 and GPU4 are on two sockets"
    );
    assert!(e.findings.is_empty(), "{:?}", e.finding_ids());
}

#[test]
fn a_pxn_line_puts_the_nic_by_the_proxy_ranks_gpu() {
    // nccl-tests issue 321: rank 1 sends to rank 2 through NET device 0 of proxy rank 0. Its
    // VMs' topology is not public: the p4d's stands in (NIC0 is PIX to GPU0 and GPU1).
    let log = gdpath_testkit::fixture("nccl/nccl-tests-321-pxn-proxy.log");
    let e = explain(read_logs(&[log], Limits::default()).unwrap(), Some(&p4d()));
    let rows: Vec<(u32, Option<u32>, &str, &str)> = e
        .nic_paths
        .iter()
        .map(|p| (p.rank, p.pxn_for, p.gpu.as_str(), p.nic.as_str()))
        .collect();
    // Rank 0 (NVML 1: GPU1) uses NIC0 for its own lines and as rank 1's proxy; rank 2 (GPU1 of
    // the other host) for its own; rank 1 (GPU0) opens no NIC.
    assert_eq!(
        rows,
        [
            (0, None, "GPU1", "NIC0"),
            (0, Some(1), "GPU1", "NIC0"),
            (2, None, "GPU1", "NIC0")
        ]
    );
    let text = gdpath_nccl::explain::render_text(&e, false);
    assert!(text.contains("PXN proxy for rank 1"), "{text}");
    // The P2P pair of vm-host40 has both GPUs; the NET pairs across hosts have none.
    let p2p = e.pairs.iter().find(|r| r.class == "P2P").unwrap();
    assert_eq!(
        (p2p.src_gpu.as_deref(), p2p.dst_gpu.as_deref()),
        (Some("GPU1"), Some("GPU0"))
    );
    assert!(e
        .pairs
        .iter()
        .filter(|r| r.same_host == Some(false))
        .all(|r| r.src_gpu.is_none() && r.topo_class.is_none()));
    // Rank 3 logged nothing: its pair with rank 0 may cross hosts, so it names no GPUs.
    let r30 = e.pairs.iter().find(|r| r.src == 3).unwrap();
    assert_eq!((r30.same_host, r30.src_gpu.as_deref()), (None, None));
}

#[test]
fn p2p_level_loc_and_fused_ib_devices() {
    // nccl-tests issue 373: NCCL_P2P_LEVEL=LOC stated, and NCCL 2.21's fused devices.
    let e = explain_fixture("nccl-tests-373-p2p-level-loc.log");
    stated(&e, "nccl.p2p-disabled-by-env", "NCCL_P2P_LEVEL=LOC", 9);
    assert_eq!(ib_names(&e), [(0, "mlx5_2"), (1, "mlx5_0")]);
    assert_eq!(e.job.ranks[&2].pci.as_deref(), Some("0000:31:00.0"));
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
    // bounded by construction (max_connections distinct connections, max_line_bytes per line).
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

#[test]
fn what_is_kept_grows_with_the_pairs_not_the_log() {
    // Issue 42: 10^6 connection lines of 64 pairs, each line padded to about 200 bytes, gave a
    // JSON document larger than the log; what is kept must not depend on the line count.
    let pad = "x".repeat(120);
    let mut log = Vec::with_capacity(200 << 20);
    for i in 0..1_000_000u32 {
        let (a, b) = (i % 8, (i / 8) % 8);
        log.extend_from_slice(
            format!(
                "algo-1:1:1 [{a}] NCCL INFO Channel {:02}/0 : {a}[{a}] -> {b}[{b}] via P2P/CUMEM/read {pad}\n",
                i % 32
            )
            .as_bytes(),
        );
    }
    let e = explain(parse_logs(&[("million", &log)], Limits::default()), None);
    assert_eq!(e.pairs.len(), 64);
    assert_eq!(
        e.pairs.iter().map(|r| r.lines).sum::<usize>(),
        1_000_000,
        "every line is counted"
    );
    let samples: usize = e.job.connections.iter().map(|c| c.samples.len()).sum();
    assert!(
        samples <= 64 * gdpath_nccl::SAMPLE_LINES,
        "{samples} lines' text kept, not every line's"
    );
    assert!(e
        .pairs
        .iter()
        .all(|r| r.samples.len() == gdpath_nccl::SAMPLE_LINES));
    let json = serde_json::to_string_pretty(&e).unwrap();
    assert!(json.len() < 1 << 20, "JSON of {} bytes", json.len());
    let text = gdpath_nccl::explain::render_text(&e, true);
    assert!(text.len() < 64 << 10, "text of {} bytes", text.len());
}

#[test]
fn channels_listed_per_connection_are_capped() {
    // One connection named on 100,000 lines, each with another channel number, in descending
    // order (the worst case for sorted inserts): at most MAX_CHANNELS are listed.
    let mut log = Vec::new();
    for ch in (0..100_000u32).rev() {
        log.extend_from_slice(
            format!("h:1:2 [0] NCCL INFO Channel {ch:02}/0 : 0[0] -> 1[1] via P2P/CUMEM/read\n")
                .as_bytes(),
        );
    }
    let e = explain(parse_logs(&[("chans", &log)], Limits::default()), None);
    assert_eq!(e.job.connections.len(), 1);
    let c = &e.job.connections[0];
    assert_eq!(c.lines, 100_000, "every line is counted");
    assert_eq!(c.channels.len(), gdpath_nccl::MAX_CHANNELS);
    assert!(c.channels.windows(2).all(|w| w[0] < w[1]), "ascending");
    assert_eq!(e.pairs[0].channels.len(), gdpath_nccl::MAX_CHANNELS);
}

#[test]
fn a_kept_line_is_cut_to_a_sample() {
    // A 4000-byte `via` (the line cap is 4096): its sample and its `via` are cut to 512 bytes.
    let log = format!(
        "h:1:2 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/{}\n",
        "é".repeat(2000)
    );
    let e = explain(
        parse_logs(&[("long", log.as_bytes())], Limits::default()),
        None,
    );
    let c = &e.job.connections[0];
    assert!(c.via.len() <= gdpath_nccl::SAMPLE_BYTES, "{}", c.via.len());
    let first = c.first().unwrap();
    assert!(first.cut && first.text.len() <= gdpath_nccl::SAMPLE_BYTES);
    assert!(first.text.ends_with('é'), "cut at a character boundary");
}

#[test]
fn a_rank_given_two_gpus_keeps_the_first_and_says_so() {
    // Lines of /tmp/review-keep/ranges.log (issue 42): rank 1 is NVML 99 on line 2 and NVML 1
    // on line 4; line 8 gives bus ids no PCI device has.
    let log = "\
algo-1:1:1 [0] NCCL INFO NCCL version 2.21.5+cuda12.4
algo-1:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[99] via P2P/IPC
algo-1:1:1 [0] NCCL INFO Channel 00/0 : 99999[255] -> 0[0] via P2P/IPC
algo-1:1:1 [0] NCCL INFO Channel 00/0 : 4294967295[0] -> 1[1] via P2P/IPC
algo-1:1:1 [0] NCCL INFO Channel 00/0 : 18446744073709551615[1] -> 2[2] via P2P/IPC
algo-1:1:1 [0] NCCL INFO Channel 00/0 : -1[1] -> 2[2] via P2P/IPC
algo-1:1:1 [0] NCCL INFO Channel 00/0 : 5[3] -> 5[3] via P2P/IPC
algo-1:1:1 [0] NCCL INFO Channel 00/0 : 0[ffffffff] -> 1[fffffffffffffff] via P2P/IPC
algo-1:1:1 [0] NCCL INFO comm 0x1 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 4e000 - Init START
algo-1:1:1 [0] NCCL INFO comm 0x1 rank 3 nranks 8 cudaDev 3 nvmlDev 3 busId 4f000 - Init START
";
    let e = explain(
        parse_logs(&[("ranges", log.as_bytes())], Limits::default()),
        None,
    );
    let r1 = &e.job.ranks[&1];
    assert_eq!(r1.nvml_dev, Some(99), "the first kept");
    assert_eq!(r1.pci, None, "fffffffffffffff is no bus id");
    assert_eq!(e.job.ranks[&0].pci, None, "ffffffff is no bus id");
    assert_eq!(e.job.ranks[&3].pci.as_deref(), Some("0000:4e:00.0"));
    let f = finding(&e, "nccl.rank-gpu-conflict");
    assert_eq!(f.basis, Basis::Stated);
    let lines: Vec<u64> = f.lines.iter().map(|l| l.line).collect();
    assert_eq!(lines, [4, 10], "the lines of the other values");
    assert!(
        f.reason
            .contains("rank 1 nvml_dev 99 (line 2, kept) and 1 (line 4)"),
        "{}",
        f.reason
    );
    assert!(
        f.reason
            .contains("rank 3 pci 0000:4e:00.0 (line 9, kept) and 0000:4f:00.0 (line 10)"),
        "{}",
        f.reason
    );
    assert_eq!(f.finding.subject, "rank 1,3");
}

#[test]
fn many_distinct_pairs_are_counted_past_the_first_shown() {
    // Issue 42's manyranks.log: 60000 pairs of one line each, a 4.7 MB log, gave 81 MB of JSON.
    let mut log = String::new();
    for a in 0..60_000u32 {
        log.push_str(&format!(
            "algo-1:1:1 [0] NCCL INFO Channel 00/0 : {a}[{}] -> {}[{}] via P2P/IPC/{a}\n",
            a % 8,
            a + 1,
            (a + 1) % 8
        ));
    }
    let e = explain(
        parse_logs(&[("many", log.as_bytes())], Limits::default()),
        None,
    );
    let shown = gdpath_nccl::explain::MAX_SHOWN;
    assert_eq!(e.pairs.len(), shown);
    assert_eq!(e.pairs_more, 60_000 - shown);
    assert_eq!(e.job.connections.len(), shown);
    assert_eq!(e.connections_more, 60_000 - shown);
    let json = serde_json::to_string_pretty(&e).unwrap();
    assert!(json.len() < 16 << 20, "JSON of {} bytes", json.len());
    let text = gdpath_nccl::explain::render_text(&e, false);
    assert!(text.contains("Pairs (60000)"), "the count of all");
    assert!(text.contains(&format!("… {} more (--verbose lists {shown})", 60_000 - 64)));
}
