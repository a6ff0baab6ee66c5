//! `gdpath topo` and `gdpath topo capture`: the machine as a matrix, nearest devices, warnings
//! and a device list; `--json` for scripts (schema `gdpath.topo/1`).

use crate::source::SourceArgs;
use anyhow::{Context, Result};
use clap::{Args, Subcommand};
use gdpath::topo::smi::{legend_lines, SmiMatrix};
use gdpath::topo::text::escape;
use gdpath::topo::{Device, DeviceKind, Machine, Source};
use std::fmt::Write as _;
use std::path::PathBuf;
use std::process::ExitCode;

#[derive(Debug, Args)]
#[command(args_conflicts_with_subcommands = true)]
pub struct TopoArgs {
    #[command(subcommand)]
    action: Option<TopoAction>,
    #[command(flatten)]
    source: SourceArgs,
    /// Print JSON (schema gdpath.topo/1) instead of text.
    #[arg(long)]
    pub(crate) json: bool,
    /// List every PCI function, not only GPUs, NICs, NVMe and the bridges above them (--json
    /// always lists every one).
    #[arg(long)]
    all: bool,
    /// Write the machine drawing (SVG: the tree, its links and the paths as the doctor finds
    /// them, as in `gdpath report`) to FILE instead of printing (an existing one is replaced
    /// only with --overwrite, whole).
    #[arg(long, value_name = "FILE", conflicts_with_all = ["json", "all"])]
    svg: Option<PathBuf>,
    /// Replace an existing --svg file.
    #[arg(long)]
    overwrite: bool,
}

#[derive(Debug, Subcommand)]
enum TopoAction {
    /// Write a tar.gz of exactly the sysfs files gdpath reads, for `--snapshot` replay.
    Capture {
        /// Output file (written whole or not at all; an existing one is replaced only with
        /// --overwrite).
        #[arg(short, long, default_value = "gdpath-snapshot.tar.gz")]
        output: PathBuf,
        /// Capture a copied sysfs tree instead of the live one.
        #[arg(long, value_name = "DIR")]
        sysfs_root: Option<PathBuf>,
        /// Replace an existing output file.
        #[arg(long)]
        overwrite: bool,
        /// Do not fsync the output before it takes its name, nor its directory after.
        #[arg(long)]
        no_fsync: bool,
    },
}

/// Runs `gdpath topo`.
pub fn run(args: TopoArgs) -> Result<ExitCode> {
    if let Some(TopoAction::Capture {
        output,
        sysfs_root,
        overwrite,
        no_fsync,
    }) = args.action
    {
        let replace = gdpath::file::ReplaceOptions {
            overwrite,
            fsync: !no_fsync,
        };
        let c = gdpath_doctor::machine::capture(sysfs_root.as_deref(), &output, replace)
            .with_context(|| format!("capturing into {}", escape(&output)))?;
        let (m, s, why) = (c.machine, c.summary, c.no_facts);
        outln!(
            "wrote {}: {}, {}, {} ({}, {}, {}, {})",
            crate::output::written_target(&output, &c.file),
            plural(s.files, "file", "files"),
            plural(s.links, "link", "links"),
            plural(s.listings, "directory listing", "directory listings"),
            plural(m.gpus().count(), "GPU", "GPUs"),
            plural(m.nics().count(), "NIC", "NICs"),
            plural(m.nvmes().count(), "NVMe", "NVMe"),
            plural(m.devices.len(), "PCI function", "PCI functions"),
        );
        if !s.refused.is_empty() {
            outln!("left out as private: {}", escape(&s.refused.join(", ")));
        }
        match &m.driver {
            Some(d) => outln!(
                "driver facts stored: {} GPUs, {} GPU pairs (NVLink, P2P status)",
                d.gpus.len(),
                d.pairs.len()
            ),
            None => {
                if let Some(why) = why {
                    outln!(
                        "no driver facts stored: NVLink facts unavailable: {}",
                        escape(&why)
                    );
                }
            }
        }
        return Ok(ExitCode::SUCCESS);
    }
    crate::args::refuse_if(
        args.overwrite && args.svg.is_none(),
        "--overwrite",
        "applies to --svg FILE (and to `topo capture`)",
    )?;
    let source = args.source.source();
    if let Some(file) = &args.svg {
        let context = || format!("writing the drawing to {}", escape(&file));
        // What the save would refuse, said before the machine is read.
        gdpath::file::check_target(file, args.overwrite).with_context(context)?;
        let svg = gdpath_report::drawing(&source, &[]).map_err(crate::source::report_error)?;
        let t = gdpath_report::save(file, svg.as_bytes(), args.overwrite).with_context(context)?;
        outln!("wrote {}", crate::output::written_target(file, &t));
        return Ok(ExitCode::SUCCESS);
    }
    let (machine, no_facts) = gdpath_doctor::document::topo(&source)?;
    if args.json {
        outln!("{}", gdpath_doctor::document::topo_json(&machine));
    } else {
        out!("{}", render(&machine, &source, args.all));
        // With two GPUs or more the topo.nvlink-unknown warning says it already.
        if let (Some(why), 1) = (no_facts, machine.gpus().count()) {
            outln!("NVLink facts unavailable: {}", escape(&why));
        }
    }
    Ok(ExitCode::SUCCESS)
}

fn plural(n: usize, one: &str, many: &str) -> String {
    format!("{n} {}", if n == 1 { one } else { many })
}

/// Aligned text table: columns padded to their widest cell, two spaces apart; every cell
/// escaped ([`escape`]: names and ids come from the source).
fn table(rows: &[Vec<String>]) -> String {
    let rows: Vec<Vec<String>> = rows
        .iter()
        .map(|r| r.iter().map(escape).collect())
        .collect();
    let ncols = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..ncols)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for r in &rows {
        let line: Vec<String> = r
            .iter()
            .enumerate()
            .map(|(i, cell)| format!("{cell:<w$}", w = widths[i]))
            .collect();
        out.push_str(line.join("  ").trim_end());
        out.push('\n');
    }
    out
}

fn indent(text: &str, by: &str) -> String {
    text.lines().map(|l| format!("{by}{l}\n")).collect()
}

fn link_text(d: &Device) -> String {
    let l = &d.link;
    let mut s = format!("{} / {}", l.cur_text(), l.max_text());
    if let Some(bw) = l.limit_gbps() {
        let _ = write!(s, " ({bw:.2} GB/s)");
    }
    s
}

/// The human output: summary, matrix, legends, nearest devices, warnings, device list.
fn render(m: &Machine, source: &Source, all: bool) -> String {
    let mut o = String::new();
    let (g, n, v) = (m.gpus().count(), m.nics().count(), m.nvmes().count());
    // A source without PCI addresses (nvidia-smi text) has devices, not PCI functions.
    let functions = if !m.devices.is_empty() && m.devices.iter().all(|d| d.synthetic) {
        format!(
            "{} (no PCI addresses in the source)",
            plural(m.devices.len(), "device", "devices")
        )
    } else {
        plural(m.devices.len(), "PCI function", "PCI functions")
    };
    let _ = writeln!(
        o,
        "gdpath topo: {} ({}, {}, {}; {functions}; {})",
        escape(&source.describe()),
        plural(g, "GPU", "GPUs"),
        plural(n, "NIC", "NICs"),
        plural(v, "NVMe", "NVMe"),
        plural(m.numa_node_ids().len(), "NUMA node", "NUMA nodes"),
    );
    if g == 0 {
        let others: Vec<String> = m
            .nics()
            .chain(m.nvmes())
            .map(|d| escape(&format!("{} {}", d.id, d.display_name())))
            .collect();
        let _ = writeln!(
            o,
            "\nNo GPU: {}{}.",
            match source {
                Source::Live => "gdpath sees no NVIDIA GPU here",
                _ => "the source shows no NVIDIA GPU",
            },
            match (others.is_empty(), source) {
                (true, _) => String::new(),
                (false, Source::Live) => format!("; it sees {}", others.join(", ")),
                (false, _) => format!("; it shows {}", others.join(", ")),
            }
        );
    }

    // Past the limit the pairs are counted per class: the matrix grows with the square.
    let summary = m.pair_summary();
    let smi = match &summary {
        None => SmiMatrix::from_machine(m),
        Some(_) => SmiMatrix::default(),
    };
    if let Some(s) = &summary {
        let _ = writeln!(
            o,
            "\nPairs per class, not a matrix ({}; {} pairs; `pair_classes` in --json):\n",
            s.reason, s.counts.pairs
        );
        let rows: Vec<Vec<String>> = s
            .counts
            .classes
            .iter()
            .map(|(class, n)| vec![class.to_string(), n.to_string()])
            .collect();
        o.push_str(&indent(&table(&rows), "  "));
    }
    if !smi.ids.is_empty() {
        let mut rows = vec![{
            let mut h = vec![String::new()];
            h.extend(smi.ids.iter().cloned());
            if g > 0 {
                h.extend(["CPU Affinity", "NUMA Affinity", "GPU NUMA ID"].map(String::from));
            }
            h
        }];
        for r in &smi.rows {
            let mut row = vec![r.id.clone()];
            row.extend(r.cells.iter().map(|c| c.to_string()));
            if g > 0 {
                for cell in [&r.cpu_affinity, &r.numa_affinity, &r.gpu_numa_id] {
                    row.push(cell.clone().unwrap_or_default());
                }
            }
            rows.push(row);
        }
        let _ = write!(o, "\n{}", table(&rows));
    }
    if !smi.ids.is_empty() || summary.is_some() {
        let _ = writeln!(o, "\nLegend:\n");
        for l in legend_lines() {
            let _ = writeln!(o, "{l}");
        }
        if n + v > 0 {
            let _ = writeln!(o, "\nNIC and NVMe Legend:\n");
            let legend: Vec<Vec<String>> = m
                .nics()
                .chain(m.nvmes())
                .map(|d| {
                    let mut names = d.rdma.clone();
                    names.extend(d.netdevs.iter().cloned());
                    names.extend(d.block.iter().cloned());
                    let rdma = if d.kind == DeviceKind::Nic && d.rdma.is_empty() {
                        // As the doctor judges it: a source that names no RDMA devices leaves
                        // the NIC's PCI identity to say whether it can do RDMA.
                        let by_id = if d.rdma_capable_by_id().is_some() {
                            ", RDMA-capable by PCI identity"
                        } else {
                            ""
                        };
                        let named = if m.coverage.rdma.is_described() {
                            ""
                        } else {
                            " named in the source"
                        };
                        format!("{by_id}, no RDMA device{named}")
                    } else {
                        String::new()
                    };
                    vec![
                        format!("{}:", d.id),
                        if names.is_empty() {
                            d.pci.to_string()
                        } else {
                            names.join(", ")
                        },
                        format!("({}{rdma})", d.display_name()),
                    ]
                })
                .collect();
            o.push_str(&indent(&table(&legend), "  "));
        }
    }

    let nearest = m.nearest();
    if !nearest.is_empty() && n + v > 0 {
        let _ = writeln!(o, "\nNearest NIC and NVMe per GPU:\n");
        let by_id: std::collections::HashMap<&str, &Device> =
            m.devices.iter().map(|d| (d.id.as_str(), d)).collect();
        let peer = |p: &Option<gdpath::topo::Peer>| match p {
            Some(p) => {
                let os = by_id
                    .get(p.id.as_str())
                    .map(|d| d.os_name())
                    .unwrap_or_default();
                format!("{} ({os}) {}", p.id, p.class)
            }
            None => "-".to_owned(),
        };
        let rows: Vec<Vec<String>> = nearest
            .iter()
            .map(|x| {
                vec![
                    x.gpu.clone(),
                    format!("NIC {}", peer(&x.nic)),
                    format!("NVMe {}", peer(&x.nvme)),
                ]
            })
            .collect();
        o.push_str(&indent(&table(&rows), "  "));
    }

    let warnings = m.warnings();
    let _ = writeln!(o, "\nWarnings:");
    if warnings.is_empty() {
        let _ = writeln!(o, "  none");
    }
    for w in &warnings {
        let _ = writeln!(o, "  [{}] {}", w.id, escape(&w.message));
    }
    for note in &m.notes {
        let _ = writeln!(o, "  [note] {}", escape(note));
    }

    let iommu = match m.iommu.enabled() {
        None => "unknown (the source has no /sys/class/iommu)".to_owned(),
        Some(false) => "off (no IOMMU units or groups)".to_owned(),
        Some(true) => {
            let mut types: Vec<&str> = m
                .iommu
                .groups
                .iter()
                .filter_map(|g| g.domain_type.as_deref())
                .collect();
            types.sort();
            types.dedup();
            format!(
                "on: {}, {} (default domain {})",
                plural(m.iommu.units.len(), "unit", "units"),
                plural(m.iommu.groups.len(), "group", "groups"),
                if types.is_empty() {
                    "unknown".to_owned()
                } else {
                    types.join(", ")
                }
            )
        }
    };
    let _ = writeln!(o, "\nIOMMU: {iommu}");

    // Each device once by identity: two functions at one address (an hwloc export that lost
    // the PCI domain) are two rows, as they are two in the matrix.
    let mut shown: Vec<&Device> = if all {
        m.devices.iter().collect()
    } else {
        m.link_checked_devices()
    };
    shown.sort_by_key(|d| d.pci);
    let _ = writeln!(
        o,
        "\nDevices{}:\n",
        if all {
            ""
        } else {
            " (GPUs, NICs, NVMe and the bridges above them; --all for every function)"
        }
    );
    let mut rows = vec![["ID", "PCI", "NAME", "NUMA", "LINK cur / max", "NOTES"]
        .map(String::from)
        .to_vec()];
    // Footnotes only for what the rows show.
    let (mut inferred, mut bandwidth) = (false, false);
    for d in shown {
        let numa = match (d.numa, m.numa_of(d)) {
            (Some(x), _) => x.to_string(),
            (None, Some(x)) => {
                inferred = true;
                format!("({x})")
            }
            (None, None) => "?".to_owned(),
        };
        bandwidth |= d.link.limit_gbps().is_some();
        let mut notes = Vec::new();
        if let Some(p) = d.parent {
            notes.push(format!("under {p}"));
        } else if let Some(h) = &d.host_bridge {
            notes.push(format!("on {h}"));
        }
        if d.kind == DeviceKind::Bridge {
            notes.push(match d.acs {
                None => "ACS unknown".to_owned(),
                Some(gdpath::topo::AcsState::Absent) => "no ACS".to_owned(),
                Some(gdpath::topo::AcsState::Present { control, .. }) => {
                    let on = control.names();
                    if on.is_empty() {
                        "ACS off".to_owned()
                    } else {
                        format!("ACS {}", on.join(" "))
                    }
                }
            });
        }
        if d.synthetic {
            notes.push("synthetic address".to_owned());
        }
        rows.push(vec![
            if d.id == d.pci.to_string() {
                "-".to_owned()
            } else {
                d.id.clone()
            },
            d.pci.to_string(),
            d.display_name(),
            numa,
            link_text(d),
            notes.join(", "),
        ]);
    }
    if rows.len() == 1 {
        let _ = writeln!(o, "  none");
    } else {
        o.push_str(&indent(&table(&rows), "  "));
    }
    let mut notes = Vec::new();
    if inferred {
        notes.push(format!(
            "NUMA in parentheses: inferred from local CPUs ({}).",
            match source {
                Source::Live | Source::SysfsRoot(_) | Source::Snapshot(_) => "sysfs says -1",
                _ => "the source gives none",
            }
        ));
    }
    if bandwidth {
        notes.push(
            "Bandwidth: usable PCIe per direction after line encoding, GB/s = 1e9 B/s.".to_owned(),
        );
    }
    if !notes.is_empty() {
        let _ = writeln!(o, "\n{}", notes.join(" "));
    }
    o
}
