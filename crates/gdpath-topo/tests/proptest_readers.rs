//! Fuzz-like property tests over the readers: the vendored hwloc XML, NCCL XML and
//! `nvidia-smi topo -m` texts, cut, repeated and spliced with fragments chosen to hit edge cases
//! (huge counts, infinite speeds, bridges without a host bridge, NVLink to nowhere), and a small
//! sysfs tree whose attribute files hold random bytes. Whatever the input, a reader returns a
//! machine or a typed error, and everything built from a machine (matrix, nearest devices,
//! warnings, JSON, nvidia-smi text) is produced without a panic.

mod common;
use common::*;
use gdpath_topo::smi::SmiMatrix;
use gdpath_topo::{hwloc, nccl, Machine};
use proptest::prelude::*;
use std::path::Path;
use std::sync::OnceLock;

/// Fragments spliced into the texts.
const FRAGMENTS: [&str; 28] = [
    "<pci busid=\"0000:01:00.0\">",
    "<pci busid=\"ffff:ff:1f.7\" class=\"0x060400\">",
    "</pci>",
    "<gpu dev=\"0\" sm=\"90\">",
    "</gpu>",
    "<nvlink target=\"0000:01:00.0\" count=\"4294967295\" tclass=\"0x068000\"/>",
    "<nvlink target=\"0000:99:00.0\" count=\"18\"/>",
    "<nic><net name=\"mlx5_0\" gdr=\"1\"/></nic>",
    "<cpu numaid=\"4294967296\" affinity=\"ffffffff,ffffffff,,0x\">",
    "</cpu>",
    " link_speed=\"1e308 GT/s\" link_width=\"4294967295\"",
    " class=\"0x\" vendor=\"0x1ffff\"",
    "<object type=\"Bridge\" bridge_type=\"0-1\" bridge_pci=\"0000:[00-ff]\">",
    "<object type=\"Bridge\" bridge_type=\"1-1\" pci_busid=\"0000:00:01.0\" \
     pci_type=\"0604 [8086:1234] [0000:0000] 00 00\" pci_link_speed=\"inf\">",
    "<object type=\"PCIDev\" pci_busid=\"0000:02:00.0\" pci_type=\"0302 [10de:20b2] [0:0] a1\" \
     pci_link_speed=\"126.030769\">",
    "</object>",
    "<object type=\"OSDev\" gp_index=\"9\" name=\"mlx5_0\" osdev_type=\"48\"/>",
    "<object type=\"OSDev\" gp_index=\"8\" name=\"nvml0\" subtype=\"NVML\" osdev_type=\"12\">\
     <info name=\"GPUModel\" value=\"NVIDIA A100-SXM4-80GB\"/></object>",
    "<distances2 type=\"OSDev\" nbobjs=\"2\" name=\"NVLinkBandwidth\"><indexes length=\"3\">8 9\
     </indexes><u64values length=\"9\">18446744073709551615 1 1 18446744073709551615</u64values>\
     </distances2>",
    " nodeset=\"0xffffffff\" cpuset=\"0x0,,,,0x1\"",
    "\tGPU0\tGPU1\tNIC0\tCPU Affinity\tNUMA Affinity\tGPU NUMA ID\n",
    "GPU0\t X \tNV4294967295\tSOC\t0-4294967295\t-1\t\tN/A\n",
    "NIC0\tPIX\tN/A\t X \t\t\t\t\n",
    "NIC Legend:\n\n  NIC0: mlx5_0\n  NIC9: \n",
    "\u{1b}[4m",
    "<!DOCTYPE x [<!ENTITY a \"&#60;pci busid='0000:05:00.0'/&#62;\">]>",
    "&a;",
    "\n",
];

fn texts() -> &'static [(String, &'static str)] {
    static T: OnceLock<Vec<(String, &'static str)>> = OnceLock::new();
    T.get_or_init(|| {
        let mut v = Vec::new();
        for (dir, kind) in [
            ("nccl-xml", "nccl"),
            ("hwloc-xml", "hwloc"),
            ("nvidia-smi", "smi"),
        ] {
            let mut files: Vec<_> = std::fs::read_dir(fixtures().join(dir))
                .unwrap()
                .map(|e| e.unwrap().path())
                .collect();
            files.sort();
            for f in files {
                v.push((std::fs::read_to_string(f).unwrap(), kind));
            }
        }
        v
    })
}

/// One edit: 0 delete a range, 1 repeat a range, 2 insert a fragment.
type Edit = (u8, usize, usize, usize);

fn apply(text: &str, edits: &[Edit]) -> String {
    let mut b = text.as_bytes().to_vec();
    for &(op, pos, len, frag) in edits {
        let at = pos % (b.len() + 1);
        let end = (at + len).min(b.len());
        match op {
            0 => {
                b.drain(at..end);
            }
            1 => {
                let piece: Vec<u8> = b[at..end].to_vec();
                for _ in 0..3 {
                    b.splice(at..at, piece.iter().copied());
                }
            }
            _ => {
                let f = FRAGMENTS[frag % FRAGMENTS.len()].as_bytes();
                b.splice(at..at, f.iter().copied());
            }
        }
    }
    String::from_utf8_lossy(&b).into_owned()
}

/// Everything built from a machine, as `topo`, `--json` and the doctor use it.
fn exercise(m: &Machine) {
    let mx = m.matrix();
    let n = mx.ids.len();
    for i in 0..n {
        assert_eq!(mx.cells[i][i], gdpath_topo::LinkClass::X);
        for j in 0..n {
            assert_eq!(mx.cells[i][j], mx.cells[j][i], "symmetric");
        }
    }
    let _ = m.nearest();
    let _ = m.warnings();
    serde_json::to_string(&m.report()).unwrap();
    let smi = SmiMatrix::from_machine(m);
    let again = SmiMatrix::parse(&smi.to_text());
    if n > 0 && mx.ids[0] == "GPU0" {
        // Compared without printing both: a failing case can be large.
        assert!(
            again.as_ref() == Ok(&smi),
            "gdpath's smi text does not parse back"
        );
    }
    for d in m.matrix_devices() {
        for e in m.matrix_devices() {
            let _ = m.pair(d, e);
            let _ = m.bridges_between(d, e);
        }
        let _ = d.rdma_capable();
    }
}

fn read_all(text: &str) {
    let p = Path::new("fuzz.xml");
    for m in [hwloc::parse(text, p), nccl::parse(text, p)]
        .iter()
        .flatten()
    {
        exercise(m);
    }
    if let Ok(s) = SmiMatrix::parse(text) {
        exercise(&s.to_machine());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(192))]

    #[test]
    fn edited_fixtures_never_panic(
        which in 0usize..64,
        edits in prop::collection::vec((0u8..3, any::<usize>(), 0usize..400, any::<usize>()), 0..8),
    ) {
        let all = texts();
        let (text, _) = &all[which % all.len()];
        read_all(&apply(text, &edits));
    }

    /// A switch with a GPU and a NIC under it, every attribute file random bytes.
    #[test]
    fn random_sysfs_attributes_never_panic(
        files in prop::collection::vec(prop::collection::vec(any::<u8>(), 0..48), 40),
        config in prop::collection::vec(any::<u8>(), 0..4200),
    ) {
        let dir = tempdir();
        let root = dir.path();
        let devs = [
            ("0000:00:01.0", ""),
            ("0000:01:00.0", "0000:00:01.0/"),
            ("0000:02:00.0", "0000:00:01.0/0000:01:00.0/"),
            ("0000:02:01.0", "0000:00:01.0/0000:01:00.0/"),
            ("0000:03:00.0", "0000:00:01.0/0000:01:00.0/0000:02:00.0/"),
        ];
        let names = ["class", "vendor", "device", "numa_node", "local_cpulist", "local_cpus",
            "current_link_speed", "max_link_speed"];
        let mut k = 0;
        for (bdf, above) in devs {
            let d = format!("sys/devices/pci0000:00/{above}{bdf}");
            for n in names {
                std::fs::create_dir_all(root.join(&d)).unwrap();
                std::fs::write(root.join(format!("{d}/{n}")), &files[k % files.len()]).unwrap();
                k += 1;
            }
            std::fs::write(root.join(format!("{d}/config")), &config).unwrap();
            symlink(root, &format!("sys/bus/pci/devices/{bdf}"), &format!("../../../devices/pci0000:00/{above}{bdf}"));
        }
        write(root, "sys/devices/system/node/node0/cpulist",
            std::str::from_utf8(&files[39]).unwrap_or("0-3"));
        let m = gdpath_topo::load(&gdpath_topo::Source::SysfsRoot(root.to_owned())).unwrap();
        prop_assert_eq!(m.devices.len(), 5);
        exercise(&m);
    }
}
