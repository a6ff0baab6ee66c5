//! The report in a real browser: Debian's chromium opens it headless from disk, with the
//! network off, takes a screenshot and prints the page's console. The page must log nothing
//! (no script, and its content security policy turns any attempt to load something into a
//! console error), the DOM must hold the drawing, and the screenshot must show it: many
//! colours, neither blank nor a solid block, and the colours of the paths the doctor judged.
//!
//! chromium comes from `scripts/setup.sh`. Without it this test fails when `CI` or
//! `GDPATH_REQUIRE_BROWSER=1` is set (`.ci/run` sets the latter), and is skipped with a
//! message otherwise.

use gdpath_report::Options;
use gdpath_testkit::fixture;
use gdpath_topo::Source;
use std::collections::HashSet;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

fn chromium() -> Option<PathBuf> {
    let path = std::env::var_os("PATH")?;
    for dir in std::env::split_paths(&path) {
        for name in ["chromium", "chromium-browser"] {
            let p = dir.join(name);
            if p.is_file() {
                return Some(p);
            }
        }
    }
    None
}

fn required() -> bool {
    std::env::var_os("CI").is_some_and(|v| !v.is_empty() && v != "false")
        || std::env::var("GDPATH_REQUIRE_BROWSER").as_deref() == Ok("1")
}

/// Runs chromium headless on `page` with `args`; returns its stdout and stderr. Killed after
/// 90 s (a hung browser fails the test rather than the CI run).
fn run(bin: &Path, page: &Path, work: &Path, args: &[&str]) -> (String, String) {
    let (out, err) = (work.join("stdout"), work.join("stderr"));
    let mut child = Command::new(bin)
        .args([
            "--headless",
            "--no-sandbox",
            "--disable-gpu",
            "--disable-background-networking",
            "--disable-component-update",
            "--disable-sync",
            "--no-first-run",
            "--hide-scrollbars",
            "--enable-logging=stderr",
            "--v=0",
        ])
        .arg(format!(
            "--user-data-dir={}",
            work.join("profile").display()
        ))
        .args(args)
        .arg(format!("file://{}", page.display()))
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out).unwrap())
        .stderr(std::fs::File::create(&err).unwrap())
        .spawn()
        .expect("start chromium");
    let start = Instant::now();
    loop {
        match child.try_wait().unwrap() {
            Some(st) => {
                let stderr = std::fs::read_to_string(&err).unwrap_or_default();
                assert!(st.success(), "chromium exited {st}: {stderr}");
                break;
            }
            None if start.elapsed() > Duration::from_secs(90) => {
                let _ = child.kill();
                let _ = child.wait();
                panic!("chromium did not finish within 90 s");
            }
            None => std::thread::sleep(Duration::from_millis(100)),
        }
    }
    (
        std::fs::read_to_string(&out).unwrap_or_default(),
        std::fs::read_to_string(&err).unwrap_or_default(),
    )
}

/// RGB pixels of a PNG.
fn pixels(png_file: &Path) -> (u32, u32, Vec<[u8; 3]>) {
    let file = std::io::BufReader::new(std::fs::File::open(png_file).unwrap());
    let mut reader = png::Decoder::new(file).read_info().unwrap();
    let mut buf = vec![0; reader.output_buffer_size().unwrap()];
    let info = reader.next_frame(&mut buf).unwrap();
    let step = match info.color_type {
        png::ColorType::Rgba => 4,
        png::ColorType::Rgb => 3,
        other => panic!("screenshot in {other:?}"),
    };
    assert_eq!(info.bit_depth, png::BitDepth::Eight);
    let px = buf[..info.buffer_size()]
        .chunks_exact(step)
        .map(|c| [c[0], c[1], c[2]])
        .collect();
    (info.width, info.height, px)
}

fn near(a: [u8; 3], b: [u8; 3]) -> bool {
    a.iter().zip(b).all(|(x, y)| x.abs_diff(y) <= 6)
}

/// How much of a colour a drawing must show.
enum Count {
    /// At least this many pixels (lines).
    AtLeast(usize),
    /// At most this many pixels.
    AtMost(usize),
    /// At most this many pixels inside a solid 5×5 block of it: no filled area (a line of the
    /// drawing is at most 3.2 px wide, a matrix cell 62 × 30).
    FilledAtMost(usize),
}

/// Pixels whose 5×5 neighbourhood is all near `c`.
fn filled(w: u32, h: u32, px: &[[u8; 3]], c: [u8; 3]) -> usize {
    let (w, h) = (w as usize, h as usize);
    let on: Vec<bool> = px.iter().map(|p| near(*p, c)).collect();
    (2..h.saturating_sub(2))
        .flat_map(|y| (2..w.saturating_sub(2)).map(move |x| (x, y)))
        .filter(|&(x, y)| (y - 2..=y + 2).all(|yy| (x - 2..=x + 2).all(|xx| on[yy * w + xx])))
        .count()
}

/// Renders the report of `source` and checks it; each of `colours` must cover as much of the
/// drawing as its [`Count`] says. (The legend alone shows each path colour on about a hundred
/// pixels, so the counts are set above that.)
fn check(bin: &Path, source: Source, from: Vec<PathBuf>, colours: &[(&str, [u8; 3], Count)]) {
    let work = tempfile::tempdir().unwrap();
    let html = gdpath_report::report(&Options {
        source: source.clone(),
        paths: vec![work.path().to_owned()],
        from,
        measure: false,
        argv: vec!["gdpath".into(), "report".into()],
        nccl_logs: Vec::new(),
    })
    .unwrap();
    let page = work.path().join("report.html");
    gdpath_report::save(&page, html.as_bytes(), true).unwrap();
    let shot = work.path().join("shot.png");
    let (_, stderr) = run(
        bin,
        &page,
        work.path(),
        &[
            &format!("--screenshot={}", shot.display()),
            "--window-size=1400,1200",
        ],
    );
    let console: Vec<&str> = stderr.lines().filter(|l| l.contains(":CONSOLE")).collect();
    assert!(console.is_empty(), "the page logged: {console:#?}");
    let (dom, stderr) = run(bin, &page, work.path(), &["--dump-dom"]);
    assert!(
        dom.contains("class=\"machine\"") && dom.contains("data-id=\"GPU0\""),
        "the DOM has no drawing: {}",
        &dom[..dom.len().min(400)]
    );
    assert!(!stderr.contains(":CONSOLE"), "the page logged: {stderr}");
    let (w, h, px) = pixels(&shot);
    assert_eq!((w, h), (1400, 1200));
    let white = px.iter().filter(|p| p.iter().all(|c| *c >= 250)).count();
    let share = 1.0 - white as f64 / px.len() as f64;
    assert!(
        (0.02..0.9).contains(&share),
        "{:.1} % of the screenshot is not white",
        100.0 * share
    );
    let distinct: HashSet<[u8; 3]> = px.iter().copied().collect();
    assert!(distinct.len() >= 64, "{} colours only", distinct.len());
    // The colours of the paths, counted on the drawing alone (the page uses them elsewhere).
    let svg = gdpath_report::drawing(&source, &[work.path().to_owned()]).unwrap();
    let size = |a: &str| -> u32 {
        let i = svg.find(&format!(" {a}=\"")).unwrap() + a.len() + 3;
        let j = svg[i..].find('"').unwrap();
        svg[i..i + j].parse::<f64>().unwrap().ceil() as u32
    };
    let (sw, sh) = (size("width"), size("height"));
    let file = work.path().join("drawing.svg");
    gdpath_report::save(&file, svg.as_bytes(), true).unwrap();
    let shot = work.path().join("drawing.png");
    let (_, stderr) = run(
        bin,
        &file,
        work.path(),
        &[
            &format!("--screenshot={}", shot.display()),
            &format!("--window-size={sw},{sh}"),
        ],
    );
    assert!(!stderr.contains(":CONSOLE"), "the drawing logged: {stderr}");
    let (w, h, px) = pixels(&shot);
    for (name, c, want) in colours {
        let n = px.iter().filter(|p| near(**p, *c)).count();
        match *want {
            Count::AtLeast(k) => {
                assert!(n >= k, "{name} ({c:?}): {n} pixels, expected at least {k}")
            }
            Count::AtMost(k) => assert!(n <= k, "{name} ({c:?}): {n} pixels, expected at most {k}"),
            Count::FilledAtMost(k) => {
                let f = filled(w, h, &px, *c);
                assert!(
                    f <= k,
                    "{name} ({c:?}): {f} pixels in filled areas, expected at most {k}"
                );
            }
        }
    }
}

#[test]
fn the_report_renders_in_chromium_from_disk() {
    let Some(bin) = chromium() else {
        assert!(
            !required(),
            "chromium not found: run scripts/setup.sh, which installs Debian's chromium (CI \
             must run this test)"
        );
        eprintln!(
            "SKIPPED the_report_renders_in_chromium_from_disk: chromium not found (run \
             scripts/setup.sh; set GDPATH_REQUIRE_BROWSER=1 to make this a failure)"
        );
        return;
    };
    const RED: [u8; 3] = [0xdc, 0x26, 0x26];
    const BLUE: [u8; 3] = [0x25, 0x63, 0xeb];
    const VIOLET: [u8; 3] = [0x7c, 0x3a, 0xed];
    const ORANGE: [u8; 3] = [0xea, 0x58, 0x0c];
    const GREEN: [u8; 3] = [0x16, 0xa3, 0x4a];
    // The H200 pair: P2P over NVLink direct (blue, and the matrix cells), GDR staged (red),
    // NVLink (violet); with the recorded storage bench charted.
    check(
        &bin,
        Source::Snapshot(PathBuf::from(gdpath_testkit::h200x2_snapshot())),
        vec![fixture("bench/storage-var-tmp-2026-12-01.json")],
        &[
            ("staged red", RED, Count::AtLeast(400)),
            ("P2P blue", BLUE, Count::AtLeast(1000)),
            ("NVLink violet", VIOLET, Count::AtLeast(250)),
            // No NVMe: no GDS path, only the legend's sample.
            ("GDS orange", ORANGE, Count::AtMost(250)),
        ],
    );
    // The p4d: four switches, eight GPUs; nothing is known from the file (dotted green GDR,
    // the matrix's blue dotted borders).
    check(
        &bin,
        Source::NcclXml(fixture("nccl-xml/nccl-aws-p4d-24xl-topo.xml")),
        Vec::new(),
        &[
            ("GDR green", GREEN, Count::AtLeast(400)),
            // No pair known to work: no solid blue cell, only the legend's line and the
            // cells' dotted borders.
            ("P2P blue", BLUE, Count::FilledAtMost(0)),
        ],
    );
}
