//! `gdpath report --nccl-log`: NCCL's pairs of one machine are marked on the drawing, each with
//! its two GPUs and NCCL's transport, read back from the page as a browser gets it.

mod common;
use common::*;
use gdpath_report::Options;
use gdpath_testkit::fixture;
use gdpath_topo::Source;

/// The page for the p4d.24xlarge's NCCL topology with one vendored log.
fn page(log: &str) -> String {
    page_of(fixture(&format!("nccl/{log}")))
}

/// The page for the p4d.24xlarge's NCCL topology with the log at `log`.
fn page_of(log: std::path::PathBuf) -> String {
    let dir = tempfile::tempdir().unwrap();
    let opts = Options {
        source: Source::NcclXml(fixture("nccl-xml/nccl-aws-p4d-24xl-topo.xml")),
        paths: vec![dir.path().to_owned()],
        from: Vec::new(),
        measure: false,
        argv: vec!["gdpath".into(), "report".into()],
        nccl_logs: vec![log],
    };
    gdpath_report::report(&opts).unwrap()
}

/// Every mark: (ranks, GPUs, via, bar class, label text).
fn marks(html: &str) -> Vec<(String, String, String, String, String)> {
    let doc = parse(html);
    machine_svg(&doc)
        .descendants()
        .filter(|n| n.attribute("class") == Some("nccl-mark"))
        .map(|g| {
            let bar = g
                .children()
                .find(|c| c.has_tag_name("path"))
                .expect("a bar in each mark");
            let label = g
                .children()
                .find(|c| c.has_tag_name("text"))
                .and_then(|t| t.text())
                .unwrap_or_default();
            (
                g.attribute("data-ranks").unwrap().to_owned(),
                g.attribute("data-gpus").unwrap().to_owned(),
                g.attribute("data-via").unwrap().to_owned(),
                bar.attribute("class").unwrap().to_owned(),
                label.to_owned(),
            )
        })
        .collect()
}

#[test]
fn the_p4d_logs_pairs_are_marked_between_their_gpus() {
    // aws-ofi-nccl issue 715: ranks 0-7 on GPUs 0-7 of one p4d, P2P/CUMEM/read.
    let html = page("aws-ofi-nccl-715-p2p-cumem-read-p4d.log");
    let got = marks(&html);
    let want = [(0, 1), (3, 4), (4, 5), (5, 6), (6, 7)];
    assert_eq!(got.len(), want.len(), "{got:?}");
    for ((ranks, gpus, via, class, label), (a, b)) in got.iter().zip(want) {
        assert_eq!(ranks, &format!("{a} {b}"));
        assert_eq!(gpus, &format!("GPU{a} GPU{b}"));
        assert_eq!(via, "P2P/CUMEM/read");
        assert_eq!(class, "nccl-bar nccl-p2p");
        assert!(
            label.contains(&format!("GPU{a} → GPU{b}"))
                && label.contains(&format!("rank {a} → {b}"))
                && label.contains("P2P/CUMEM/read"),
            "{label}"
        );
    }
    // Each bar runs from its sender's GPU box to its receiver's, at their centres.
    let doc = parse(&html);
    let svg = machine_svg(&doc);
    let centre = |id: &str| {
        let g = svg
            .descendants()
            .find(|n| n.attribute("class") == Some("node") && n.attribute("data-id") == Some(id))
            .unwrap();
        let r = g.children().find(|c| c.has_tag_name("rect")).unwrap();
        let f = |a: &str| r.attribute(a).unwrap().parse::<f64>().unwrap();
        f("x") + f("width") / 2.0
    };
    for g in svg
        .descendants()
        .filter(|n| n.attribute("class") == Some("nccl-mark"))
    {
        let gpus: Vec<&str> = g.attribute("data-gpus").unwrap().split(' ').collect();
        let d = g
            .children()
            .find(|c| c.has_tag_name("path"))
            .unwrap()
            .attribute("d")
            .unwrap();
        let xs: Vec<f64> = segments(d).iter().flat_map(|(a, b)| [a.0, b.0]).collect();
        for id in gpus {
            assert!(
                xs.iter().any(|x| (x - centre(id)).abs() < 0.1),
                "{id} at {} not an end of {d}",
                centre(id)
            );
        }
    }
    // The marks keep the drawing's rules: no label over another, no line over a label.
    assert_no_overlap(svg, "p4d + issue 715");
    assert_lines_clear(svg, "p4d + issue 715");
    assert!(
        html.contains("5 pair(s) of one machine are marked"),
        "the section says so"
    );
}

#[test]
fn pairs_between_hosts_are_not_drawn_on_one_machine() {
    // nccl-tests issue 321: only the P2P pair of vm-host40 (rank 0 on GPU1, rank 1 on GPU0)
    // is of one machine; its NET pairs cross hosts or may.
    let html = page("nccl-tests-321-pxn-proxy.log");
    let got = marks(&html);
    assert_eq!(got.len(), 1, "{got:?}");
    assert_eq!(
        (got[0].0.as_str(), got[0].1.as_str(), got[0].2.as_str()),
        ("0 1", "GPU1 GPU0", "P2P/CUMEM")
    );
    // The GPU ↔ NIC table names the PXN proxy.
    assert!(html.contains("(PXN proxy for rank 1)"), "PXN row");
    let doc = parse(&html);
    assert_lines_clear(machine_svg(&doc), "p4d + issue 321");
}

#[test]
fn format_characters_from_the_log_are_shown_not_obeyed() {
    // Issue 42: a right-to-left override and an isolate in a `via` (and in the log's name)
    // reached the mark's data-via, tooltip and label raw, reordering what the label shows.
    let dir = tempfile::tempdir().unwrap();
    let log = dir.path().join("rank\u{202e}gol.txt");
    std::fs::write(
        &log,
        "h:1:1 [0] NCCL INFO Channel 00/0 : 0[0] -> 1[1] via P2P/\u{202e}\u{2066}bidi\u{200b}/read\n",
    )
    .unwrap();
    let html = page_of(log);
    for c in ['\u{202e}', '\u{2066}', '\u{200b}'] {
        assert!(!html.contains(c), "{:?} raw in the page", c);
    }
    let got = marks(&html);
    assert_eq!(got.len(), 1, "{got:?}");
    let shown = r"P2P/\u{202e}\u{2066}bidi\u{200b}/read";
    assert_eq!(got[0].2, shown, "data-via");
    assert!(got[0].4.contains(shown), "label {}", got[0].4);
    let doc = parse(&html);
    let title = machine_svg(&doc)
        .descendants()
        .find(|n| n.attribute("class") == Some("nccl-mark"))
        .and_then(|g| g.children().find(|c| c.has_tag_name("title")))
        .and_then(|t| t.text())
        .unwrap_or_default()
        .to_owned();
    assert!(title.contains(shown), "tooltip {title}");
    assert!(
        html.contains(r"rank\u{202e}gol.txt"),
        "the log's name shown escaped"
    );
}
