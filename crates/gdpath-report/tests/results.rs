//! Reports from recorded bench results: the storage bench recorded on the development machine
//! (`fixtures/bench/`, how it was made is in fixtures/README.md) charted beside a machine, its
//! command line and date shown; documents that are not bench results refused with the file
//! named; `--measure` on this machine, where the storage bench runs for real and the GPU
//! benches say why they could not.

mod common;
use common::*;
use gdpath_report::{Options, ReportError, ResultsError};
use gdpath_testkit::fixture;
use gdpath_topo::Source;
use std::path::PathBuf;

fn opts(source: Source, from: Vec<PathBuf>, dir: &std::path::Path) -> Options {
    Options {
        source,
        paths: vec![dir.to_owned()],
        from,
        measure: false,
        argv: vec!["gdpath".into(), "report".into()],
        nccl_logs: Vec::new(),
    }
}

fn h200x1() -> Source {
    Source::Snapshot(fixture("device/h200x1-capture-2026-12-01.tar.gz"))
}

/// Every chart of a page, each checked for overlapping labels; returns their label texts.
fn charts(html: &str) -> Vec<Vec<String>> {
    let doc = parse(html);
    doc.descendants()
        .filter(|n| n.has_tag_name("svg") && n.attribute("class") == Some("chart"))
        .map(|c| {
            assert_no_overlap(c, "chart");
            labels(c).into_iter().map(|l| l.text).collect()
        })
        .collect()
}

#[test]
fn the_recorded_storage_bench_is_charted_with_its_command_line() {
    let dir = tempfile::tempdir().unwrap();
    let doc = fixture("bench/storage-var-tmp-2026-12-01.json");
    let html = gdpath_report::report(&opts(h200x1(), vec![doc.clone()], dir.path())).unwrap();
    let cs = charts(&html);
    assert_eq!(cs.len(), 1);
    // A line per path, labelled at its end; the size axis in powers of two.
    for want in ["posix-direct", "read-loop", "64 KiB", "1 MiB", "4 MiB"] {
        assert!(cs[0].iter().any(|t| t == want), "{want} not in {:?}", cs[0]);
    }
    // Storage rows carry no link limit, and the chart says so rather than drawing one.
    assert!(
        cs[0].iter().any(|t| t.contains("no link limit")),
        "{:?}",
        cs[0]
    );
    // The command line behind the numbers, its date, and the file it came from.
    assert!(html.contains(
        "gdpath bench storage --file /var/tmp/gdpath-bench-record.bin --size 256MiB --block \
         64KiB..4MiB --compare --json"
    ));
    assert!(html.contains("2026-12-01 20:4"), "the run's date");
    assert!(html.contains(&doc.display().to_string()));
    // Host ↔ file rows belong to no drawn path: no rate on the drawing.
    let d = parse(&html);
    assert!(!labels(machine_svg(&d))
        .iter()
        .any(|l| l.text.contains("GB/s")));
}

/// The recorded `bench h2d` document ([`gdpath_testkit::h2d_bench_json`]) as a file in `dir`.
fn h2d_doc(dir: &std::path::Path) -> PathBuf {
    let path = dir.join("h2d.json");
    std::fs::write(&path, gdpath_testkit::h2d_bench_json()).unwrap();
    path
}

#[test]
fn each_chart_labels_its_lines_in_their_own_colours() {
    // Two charts on one page: each line-end label must take its own line's colour, not the
    // colour another chart gives the same place in its list.
    let dir = tempfile::tempdir().unwrap();
    let docs = vec![
        fixture("bench/storage-var-tmp-2026-12-01.json"),
        h2d_doc(dir.path()),
    ];
    let html = gdpath_report::report(&opts(h200x1(), docs, dir.path())).unwrap();
    let doc = parse(&html);
    let charts: Vec<_> = doc
        .descendants()
        .filter(|n| n.has_tag_name("svg") && n.attribute("class") == Some("chart"))
        .collect();
    assert_eq!(charts.len(), 2);
    let style = |n: roxmltree::Node, prop: &str| -> String {
        n.attribute("style")
            .and_then(|s| s.strip_prefix(&format!("{prop}:")))
            .unwrap_or_else(|| panic!("no inline {prop} on {n:?}"))
            .to_owned()
    };
    let mut seen = 0;
    for c in charts {
        assert!(
            !c.descendants().any(|n| n.has_tag_name("style")),
            "a chart brings a style sheet of its own"
        );
        let lines: Vec<(String, String)> = c
            .descendants()
            .filter(|n| n.attribute("class") == Some("series"))
            .map(|g| {
                let title = g
                    .children()
                    .find(|n| n.has_tag_name("title"))
                    .and_then(|t| t.text())
                    .unwrap();
                let line = g
                    .children()
                    .find(|n| n.attribute("class") == Some("line"))
                    .unwrap();
                (
                    title.lines().next().unwrap().to_owned(),
                    style(line, "stroke"),
                )
            })
            .collect();
        for t in c
            .descendants()
            .filter(|n| n.attribute("class") == Some("series-t"))
        {
            let text = t.text().unwrap();
            let name = text.split(" (×").next().unwrap();
            let (_, stroke) = lines
                .iter()
                .find(|(n, _)| n == name)
                .unwrap_or_else(|| panic!("no line named {name:?} in {lines:?}"));
            assert_eq!(&style(t, "fill"), stroke, "label {text:?}");
            seen += 1;
        }
    }
    assert_eq!(seen, 4, "posix-direct, read-loop, h2d-pinned, h2d-pageable");
}

#[test]
fn documents_that_are_not_bench_results_are_refused_naming_the_file() {
    let dir = tempfile::tempdir().unwrap();
    let topo = gdpath_testkit::repo_root().join("crates/gdpath-cli/tests/golden/topo-h200x2.json");
    let e = gdpath_report::report(&opts(h200x1(), vec![topo.clone()], dir.path())).unwrap_err();
    assert!(
        matches!(e, ReportError::Results(ResultsError::NotBench { ref found, .. }) if found == "gdpath.topo/1"),
        "{e}"
    );
    assert!(e.to_string().contains("topo-h200x2.json"), "{e}");
    // A truncated document: the line and column of the fault.
    let text = std::fs::read_to_string(fixture("bench/storage-var-tmp-2026-12-01.json")).unwrap();
    let cut = dir.path().join("cut.json");
    std::fs::write(&cut, &text[..text.len() / 2]).unwrap();
    let e = gdpath_report::report(&opts(h200x1(), vec![cut], dir.path())).unwrap_err();
    assert!(
        matches!(e, ReportError::Results(ResultsError::Json { line, .. }) if line > 1),
        "{e}"
    );
    // A missing one.
    let e = gdpath_report::report(&opts(
        h200x1(),
        vec![dir.path().join("none.json")],
        dir.path(),
    ))
    .unwrap_err();
    assert!(e.to_string().contains("none.json"), "{e}");
}

#[test]
fn measure_here_runs_the_storage_bench_and_says_what_it_could_not() {
    // This machine has no GPU: the GPU benches cannot run and the report says why; the storage
    // bench reads a scratch file in the --path directory for real.
    let dir = tempfile::tempdir_in(std::env::temp_dir()).unwrap();
    let mut o = opts(Source::Live, Vec::new(), dir.path());
    o.measure = true;
    let html = gdpath_report::report(&o).unwrap();
    if !html.contains("bench h2d: not measured") {
        // A GPU machine (the GPU suite may run this crate's tests too): its benches ran.
        assert!(
            charts(&html).len() >= 4,
            "h2d, d2h, p2p and storage charted"
        );
        return;
    }
    assert!(html.contains("Not measured:"));
    assert!(
        html.contains("bench h2d: not measured: "),
        "the reason is given"
    );
    assert!(html.contains("bench storage --gpu 0: not measured"));
    let cs = charts(&html);
    assert!(
        cs.iter().any(|c| c.iter().any(|t| t == "posix-direct")),
        "the storage bench ran and is charted"
    );
    // The scratch file is gone.
    let left: Vec<_> = std::fs::read_dir(dir.path()).unwrap().collect();
    assert!(left.is_empty(), "left behind: {left:?}");
}
