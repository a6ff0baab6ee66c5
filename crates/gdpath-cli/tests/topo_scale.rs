//! Topology input costs no more than its size. Files of 500, 1,000 and 4,000 flat GPUs (one
//! CPU, no switches), made here, go through every command that reads a topology — `topo`,
//! `topo --json`, `topo --svg`, `doctor`, `report -o`, and `p2p` for driver facts — each run
//! under a time and an address-space bound, with what it must do past the limits: the pairs
//! counted per class instead of listed (more than 256 GPUs, NICs and NVMe), no drawing (more
//! than 256: `topo --svg` refuses, `report` says why), output that grows with the devices.
//!
//! Before, 500 GPUs in a 56 KB NCCL file made `report` run for 53 s (a release build) and write
//! 119 MB, and 4,000 made `topo --json` print 140 MB from 1.3 GB of memory.

mod common;

use std::io::Read;
use std::os::unix::process::CommandExt;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

/// Wall-clock bound of each run: ample for a debug build on a busy machine (each takes well under
/// a second where this was written, but `nvidia-smi` text of 1,000 GPUs, 4 MB, a few seconds).
const TIME: Duration = Duration::from_secs(60);

/// Address-space bound of each run (`RLIMIT_AS`): 1 GiB, some ten times what a debug build maps
/// for these inputs (its binary and libraries included).
const MEMORY: u64 = 1 << 30;

/// Output allowed per GPU, NIC or NVMe (a device's entry in `topo --json` is about 600 bytes,
/// its three GDR findings in `doctor --json` about 1,100), and once per run.
const BYTES_PER_DEVICE: usize = 2048;
const BYTES_FIXED: usize = 64 << 10;

/// The limits the commands name (gdpath_topo::input::MAX_LISTED_PAIR_DEVICES,
/// gdpath_report::MAX_DRAWN_DEVICES, gdpath_doctor::PER_PAIR_GPUS).
const LISTED: usize = 256;
const DRAWN: usize = 256;
const PER_PAIR: usize = 64;

/// A finished (or killed) run.
struct Run {
    what: String,
    /// Exit code; `None` when killed (by the time bound, or by a signal: memory).
    code: Option<i32>,
    stdout: Vec<u8>,
    /// Bytes written to stdout (more than kept, past 64 MiB).
    stdout_len: usize,
    stderr: String,
    took: Duration,
}

impl Run {
    fn text(&self) -> String {
        String::from_utf8_lossy(&self.stdout).into_owned()
    }

    fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.stdout)
            .unwrap_or_else(|e| panic!("{}: stdout is not JSON ({e})", self.what))
    }

    /// Finished within the bounds with `code`, and printed at most what `devices` allow.
    fn check(&self, code: i32, devices: usize) -> &Self {
        assert!(
            self.took < TIME,
            "{}: still running after {:?}, killed",
            self.what,
            TIME
        );
        assert_eq!(
            self.code,
            Some(code),
            "{}: exit status (None: killed, e.g. out of memory); stderr: {}",
            self.what,
            self.stderr
        );
        let most = BYTES_PER_DEVICE * devices + BYTES_FIXED;
        assert!(
            self.stdout_len <= most,
            "{}: {} bytes of output for {devices} devices (at most {most})",
            self.what,
            self.stdout_len
        );
        eprintln!(
            "{}: {:.2} s, {} bytes out",
            self.what,
            self.took.as_secs_f64(),
            self.stdout_len
        );
        self
    }
}

/// Runs `gdpath ARGS` with [`MEMORY`] of address space, killed after [`TIME`].
fn run(args: &[&str]) -> Run {
    let what = format!("gdpath {}", args.join(" "));
    let mut cmd = Command::new(common::bin());
    cmd.args(args)
        .stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    // SAFETY: the closure runs in the child between fork and exec; it only calls setrlimit,
    // which is async-signal-safe, and allocates nothing.
    unsafe {
        cmd.pre_exec(|| {
            let lim = libc::rlimit {
                rlim_cur: MEMORY,
                rlim_max: MEMORY,
            };
            if libc::setrlimit(libc::RLIMIT_AS, &lim) != 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    let t = Instant::now();
    let mut child = cmd.spawn().expect("spawn gdpath");
    let mut out = child.stdout.take().unwrap();
    let mut err = child.stderr.take().unwrap();
    let reader = std::thread::spawn(move || {
        let (mut kept, mut total, mut buf) = (Vec::new(), 0usize, vec![0u8; 1 << 16]);
        while let Ok(n @ 1..) = out.read(&mut buf) {
            total += n;
            if kept.len() < 64 << 20 {
                kept.extend_from_slice(&buf[..n]);
            }
        }
        (kept, total)
    });
    let err_reader = std::thread::spawn(move || {
        let mut s = String::new();
        let _ = err.read_to_string(&mut s);
        s
    });
    let status = loop {
        if let Some(s) = child.try_wait().expect("wait") {
            break Some(s);
        }
        if t.elapsed() > TIME {
            let _ = child.kill();
            let _ = child.wait();
            break None;
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let took = t.elapsed();
    let (stdout, stdout_len) = reader.join().unwrap();
    Run {
        what,
        code: status.and_then(|s| s.code()),
        stdout,
        stdout_len,
        stderr: err_reader.join().unwrap(),
        took,
    }
}

/// Bus id of the `i`-th generated GPU: 256 per PCI domain.
fn busid(i: usize) -> String {
    format!("{:04x}:{:02x}:00.0", i / 256, i % 256)
}

/// NCCL XML of `n` GPUs under one CPU, no switches (the file: 500 of them are 56 KB).
fn nccl_xml(n: usize) -> String {
    let mut s = String::from("<system version=\"1\">\n<cpu numaid=\"0\" affinity=\"ff\">\n");
    for i in 0..n {
        s.push_str(&format!(
            "<pci busid=\"{}\" class=\"0x030200\" vendor=\"0x10de\" device=\"0x2330\" \
             link_speed=\"32.0 GT/s PCIe\" link_width=\"16\"><gpu dev=\"{i}\"/></pci>\n",
            busid(i)
        ));
    }
    s.push_str("</cpu>\n</system>\n");
    s
}

/// hwloc XML of `n` GPUs on one host bridge of one NUMA node.
fn hwloc_xml(n: usize) -> String {
    let mut s = String::from(
        "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n<object type=\"Machine\" \
         os_index=\"0\" cpuset=\"0x000000ff\" nodeset=\"0x00000001\">\n<object type=\"Bridge\" \
         bridge_type=\"0-1\" bridge_pci=\"0000:[00-ff]\">\n",
    );
    for i in 0..n {
        s.push_str(&format!(
            "<object type=\"PCIDev\" pci_busid=\"{}\" pci_type=\"0302 [10de:2330] [0000:0000] \
             a1\"/>\n",
            busid(i)
        ));
    }
    s.push_str("</object>\n</object>\n</topology>\n");
    s
}

/// `nvidia-smi topo -m` text of `n` GPUs, every pair PHB (tab-separated, as nvidia-smi prints).
fn smi_text(n: usize) -> String {
    let ids: Vec<String> = (0..n).map(|i| format!("GPU{i}")).collect();
    let mut s = format!(
        "\t{}\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n",
        ids.join("\t")
    );
    for (i, id) in ids.iter().enumerate() {
        s.push_str(id);
        for j in 0..n {
            s.push_str(if i == j { "\t X " } else { "\tPHB" });
        }
        s.push_str("\t0-7\t0\t\tN/A\n");
    }
    s
}

/// Driver facts (a snapshot's `driver.json`) of `n` GPUs, with one pair described both ways.
fn driver_facts(n: usize) -> String {
    let gpus: Vec<serde_json::Value> = (0..n)
        .map(|i| {
            serde_json::json!({
                "ordinal": i, "pci": busid(i), "name": "NVIDIA H100 80GB HBM3",
                "memory_bytes": 85_899_345_920u64, "bar1_total_bytes": null,
                "bar1_used_bytes": null, "pcie": null, "nvlinks": [],
                "gdr_supported": null, "dma_buf_supported": null
            })
        })
        .collect();
    let pair = |a: usize, b: usize| {
        serde_json::json!({
            "a": a, "b": b,
            "nvml": {"read": "OK", "write": "OK", "nvlink": "NS", "atomics": "OK", "pci": "OK"},
            "cuda": {"access_supported": true, "native_atomics": false,
                     "cuda_array_access": true, "performance_rank": 0}
        })
    };
    serde_json::json!({
        "driver_version": "580.159.04", "cuda_driver_version": 13000,
        "gpus": gpus, "pairs": [pair(0, 1), pair(1, 0)]
    })
    .to_string()
}

fn pairs_of(n: usize) -> u64 {
    (n * (n - 1) / 2) as u64
}

/// `topo`, `topo --json`, `doctor`, `topo --svg` and `report -o` on a file of `n` flat GPUs
/// read with `flag`; `name` names the file.
fn every_command(dir: &Path, flag: &str, file: &Path, n: usize) {
    let f = file.to_str().unwrap();
    let r = run(&["topo", flag, f]);
    r.check(0, n);
    let text = r.text();
    assert!(
        text.contains(&format!(
            "Pairs per class, not a matrix ({n} GPUs, NICs and NVMe, more than the {LISTED} \
             whose pairs are listed one by one"
        )),
        "{}: {text:.600}",
        r.what
    );
    assert!(
        text.contains(&format!("  PHB  {}\n", pairs_of(n))),
        "{}: {text:.600}",
        r.what
    );
    assert!(!text.contains("CPU Affinity"), "{}: a matrix", r.what);
    // The device list stays whole: one row per GPU.
    assert_eq!(text.matches("NVIDIA H100").count(), n, "{}", r.what);

    let r = run(&["topo", "--json", flag, f]);
    let doc = r.check(0, n).json();
    assert!(doc.get("matrix").is_none(), "{}: a matrix", r.what);
    let pc = &doc["pair_classes"];
    assert_eq!(pc["limit"], LISTED, "{}", r.what);
    assert_eq!(pc["devices"], n, "{}", r.what);
    assert_eq!(pc["pairs"], pairs_of(n), "{}", r.what);
    assert_eq!(pc["classes"], serde_json::json!({"PHB": pairs_of(n)}));
    assert_eq!(doc["devices"].as_array().unwrap().len(), n);

    // Nothing decided (a file describes too little): 4, in bounded time and output.
    run(&["doctor", flag, f]).check(4, n);
    run(&["doctor", "--json", flag, f]).check(4, n);

    let svg = dir.join(format!("{n}.svg"));
    let r = run(&["topo", flag, f, "--svg", svg.to_str().unwrap()]);
    r.check(1, n);
    assert!(
        r.stderr.contains(&format!(
            "{n} GPUs, NICs and NVMe: more than the {DRAWN} gdpath draws"
        )),
        "{}: {}",
        r.what,
        r.stderr
    );
    assert!(!svg.exists(), "{}: wrote a drawing", r.what);

    let page = dir.join(format!("{n}.html"));
    run(&["report", flag, f, "-o", page.to_str().unwrap()]).check(0, n);
    let html = std::fs::read_to_string(&page).unwrap();
    let most = BYTES_PER_DEVICE * n + BYTES_FIXED;
    assert!(html.len() <= most, "report: {} bytes", html.len());
    assert!(
        html.contains(&format!(
            "more than the {DRAWN} GPUs, NICs and NVMe gdpath draws"
        )),
        "report of {n} GPUs does not say why it has no drawing"
    );
    assert!(html.contains(&format!("pairs by class: PHB {}", pairs_of(n))));
    assert!(!html.contains("<svg"), "report of {n} GPUs: a drawing");
}

fn write(dir: &Path, name: &str, text: &str) -> std::path::PathBuf {
    let p = dir.join(name);
    std::fs::write(&p, text).unwrap();
    p
}

/// The NCCL files (500 GPUs: 53 s and 119 MB of report; 4,000: 140 MB of `topo`).
#[test]
fn nccl_xml_of_many_flat_gpus() {
    let tmp = tempfile::tempdir().unwrap();
    for n in [500, 1000, 4000] {
        let file = write(tmp.path(), &format!("{n}.xml"), &nccl_xml(n));
        every_command(tmp.path(), "--nccl-xml", &file, n);
    }
}

/// The same machines as hwloc exports.
#[test]
fn hwloc_xml_of_many_flat_gpus() {
    let tmp = tempfile::tempdir().unwrap();
    for n in [500, 1000, 4000] {
        let file = write(tmp.path(), &format!("{n}.xml"), &hwloc_xml(n));
        every_command(tmp.path(), "--hwloc-xml", &file, n);
    }
}

/// `nvidia-smi topo -m` text holds every pair, so it is itself the square of the GPUs: 500 and
/// 1,000 GPUs (1 and 4 MB) are read; 4,000 (64 MB) are past the 32 MiB a topology file may be
/// and refused by the reader as any such file is (input_limits.rs), not generated here.
#[test]
fn smi_text_of_many_gpus() {
    let tmp = tempfile::tempdir().unwrap();
    for n in [500, 1000] {
        let file = write(tmp.path(), &format!("{n}.txt"), &smi_text(n));
        let f = file.to_str().unwrap();
        let r = run(&["topo", "--smi-topo", f]);
        assert!(r
            .check(0, n)
            .text()
            .contains(&format!("  PHB  {}\n", pairs_of(n))));
        let doc = run(&["topo", "--json", "--smi-topo", f]).check(0, n).json();
        assert_eq!(doc["pair_classes"]["classes"]["PHB"], pairs_of(n));
        assert!(doc.get("matrix").is_none());
        // The text describes NVLink (none here): NCCL would stage PHB pairs, degraded (1).
        run(&["doctor", "--smi-topo", f]).check(1, n);
        let page = tmp.path().join(format!("{n}.html"));
        run(&["report", "--smi-topo", f, "-o", page.to_str().unwrap()]).check(0, n);
        let html = std::fs::read_to_string(&page).unwrap();
        assert!(html.len() <= BYTES_PER_DEVICE * n + BYTES_FIXED);
        assert!(html.contains("gdpath draws"));
    }
}

/// `gdpath p2p` on driver facts of many GPUs: its seven matrices (of the square of the GPUs,
/// 16 million cells each for 4,000) become counts per code.
#[test]
fn p2p_of_many_gpus_counts_codes() {
    let tmp = tempfile::tempdir().unwrap();
    for n in [500, 1000, 4000] {
        let file = write(tmp.path(), &format!("{n}.json"), &driver_facts(n));
        let f = file.to_str().unwrap();
        let ordered = (n * (n - 1)) as u64;
        let r = run(&["p2p", "--facts", f]);
        let text = r.check(0, n).text();
        assert!(
            text.contains(&format!(
                "Ordered pairs per code, not matrices ({n} GPUs, more than the {LISTED} whose \
                 pairs are listed one by one; {ordered} ordered pairs"
            )),
            "{text}"
        );
        assert!(text.contains(&format!("OK 2, U {}", ordered - 2)), "{text}");
        let doc = run(&["p2p", "--json", "--facts", f]).check(0, n).json();
        assert!(doc.get("capabilities").is_none() && doc.get("paths").is_none());
        let pc = &doc["pair_counts"];
        assert_eq!(pc["ordered_pairs"], ordered);
        assert_eq!(pc["limit"], LISTED);
        assert_eq!(pc["paths"]["p2p-pcie"], 2);
        assert_eq!(pc["cuda_access"]["?"], ordered - 2);
    }
}

/// Past the doctor's 64 GPUs (whose findings then name groups of pairs) and within the drawing's
/// 256: the machine is drawn, its P2P matrix counted per class; before, a matrix of 40,000
/// cells each with its own tooltip (19 MB for 200 GPUs) found each cell by a search of every
/// route.
#[test]
fn a_report_of_200_gpus_counts_its_pairs() {
    let tmp = tempfile::tempdir().unwrap();
    let n = 200;
    let file = write(tmp.path(), "200.xml", &nccl_xml(n));
    let page = tmp.path().join("200.html");
    let f = file.to_str().unwrap();
    run(&["report", "--nccl-xml", f, "-o", page.to_str().unwrap()]).check(0, n);
    let html = std::fs::read_to_string(&page).unwrap();
    assert!(
        html.len() <= BYTES_PER_DEVICE * n + BYTES_FIXED,
        "{}",
        html.len()
    );
    assert!(html.contains("<svg") && !html.contains("class=\"mx-cell\""));
    assert!(html.contains(&format!(
        "{n} GPUs, more than the {PER_PAIR} whose pairs are drawn cell by cell"
    )));
    assert!(html.contains("19900 GPU pairs (PHB 19900), judged in groups"));
    let svg = tmp.path().join("200.svg");
    run(&["topo", "--nccl-xml", f, "--svg", svg.to_str().unwrap()]).check(0, n);
    assert!(std::fs::metadata(&svg).unwrap().len() as usize <= BYTES_PER_DEVICE * n + BYTES_FIXED);
}

/// Functions at one bus id: refused by the NCCL reader, naming the bus id and both lines (before:
/// three GPUs in the matrix, one in the device list, no warning); in an hwloc export, refused
/// under one host bridge, and kept under two (an export that lost the PCI domain, as one of
/// hwloc's own does), where the device list shows both, as the matrix does.
#[test]
fn repeated_bus_ids() {
    let tmp = tempfile::tempdir().unwrap();
    let gpu = "<pci busid=\"0000:01:00.0\" class=\"0x030200\" vendor=\"0x10de\" \
               device=\"0x2330\"><gpu dev=\"0\"/></pci>";
    let nccl = write(
        tmp.path(),
        "dup.xml",
        &format!(
            "<system version=\"1\">\n<cpu numaid=\"0\" affinity=\"ff\">\n{gpu}\n{gpu}\n{gpu}\n\
             </cpu>\n</system>\n"
        ),
    );
    let f = nccl.to_str().unwrap();
    let msg = "PCI bus id 0000:01:00.0 appears twice (line 3 and line 4)";
    let r = run(&["topo", "--nccl-xml", f]);
    r.check(1, 3);
    assert!(r.stderr.contains(msg), "{}", r.stderr);
    let r = run(&["doctor", "--nccl-xml", f]);
    r.check(3, 3);
    assert!(r.stderr.contains(msg), "{}", r.stderr);
    let r = run(&["topo", "--json", "--nccl-xml", f]);
    let doc = r.check(1, 3).json();
    assert!(doc["error"].as_str().unwrap().contains(msg), "{doc}");

    let hwloc = |bridges: [&str; 2]| {
        let mut s = String::from(
            "<?xml version=\"1.0\"?>\n<topology version=\"2.0\">\n<object type=\"Machine\" \
             cpuset=\"0xff\" nodeset=\"0x1\">\n",
        );
        for b in bridges {
            s.push_str(&format!(
                "<object type=\"Bridge\" bridge_type=\"0-1\" bridge_pci=\"{b}\">\n<object \
                 type=\"PCIDev\" pci_busid=\"0000:01:00.0\" pci_type=\"0302 [10de:2330] \
                 [0000:0000] a1\"/>\n</object>\n"
            ));
        }
        s.push_str("</object>\n</topology>\n");
        s
    };
    let one = write(
        tmp.path(),
        "one.xml",
        &hwloc(["0000:[00-0f]", "0000:[00-0f]"]),
    );
    let r = run(&["topo", "--hwloc-xml", one.to_str().unwrap()]);
    r.check(1, 2);
    assert!(
        r.stderr
            .contains("PCI bus id 0000:01:00.0 appears twice (line 5 and line 8)"),
        "{}",
        r.stderr
    );
    let two = write(
        tmp.path(),
        "two.xml",
        &hwloc(["0000:[00-0f]", "0001:[00-0f]"]),
    );
    let r = run(&["topo", "--hwloc-xml", two.to_str().unwrap()]);
    let text = r.check(0, 2).text();
    assert!(text.contains("(2 GPUs,"), "{text}");
    assert!(text.contains("GPU0  X     NODE"), "{text}");
    let rows: Vec<&str> = text
        .lines()
        .filter(|l| l.contains("0000:01:00.0") && l.contains("NVIDIA"))
        .collect();
    assert_eq!(
        rows.len(),
        2,
        "the device list and the matrix disagree: {text}"
    );
    assert!(
        text.contains("0000:01:00.0 appears 2 times in the file"),
        "{text}"
    );
}
