//! Property tests on random PCIe trees built the way PCIe allows: host bridges with root ports,
//! each port holding one device (possibly multi-function) or a switch (an upstream port with
//! downstream ports, each again holding one device or a switch). The classes must match an
//! oracle written in terms of that structure, the matrix must be symmetric with X exactly on the
//! diagonal.

use gdpath_topo::{Device, DeviceKind, IommuState, LinkClass, Machine, NumaNode, PciAddr};
use proptest::prelude::*;

/// Where an endpoint sits, as the generator built it.
#[derive(Clone, Debug)]
struct Place {
    hb: usize,
    numa: Option<u32>,
    root_port: usize,
    switches: Vec<usize>,
    slot: usize,
}

struct Gen {
    state: u64,
    next_bus: u32,
    /// One PCI domain per host bridge, so bus numbers (at most ~160 per host bridge here) never wrap.
    domain: u32,
    devices: Vec<Device>,
    places: Vec<(PciAddr, Place)>,
    ids: usize,
}

impl Gen {
    fn rand(&mut self, n: u64) -> u64 {
        // xorshift64*
        self.state ^= self.state >> 12;
        self.state ^= self.state << 25;
        self.state ^= self.state >> 27;
        (self.state.wrapping_mul(0x2545_f491_4f6c_dd1d) >> 33) % n
    }

    fn fresh(&mut self) -> usize {
        self.ids += 1;
        self.ids
    }

    fn bus(&mut self) -> u8 {
        self.next_bus += 1;
        self.next_bus as u8
    }

    fn device(
        &mut self,
        pci: PciAddr,
        class: u32,
        parent: Option<PciAddr>,
        hb: &str,
        numa: Option<u32>,
    ) {
        let mut d = Device::new(pci);
        d.class = class;
        d.vendor = 0x10de;
        d.device = 0x2330;
        d.kind = DeviceKind::decide(class, d.vendor, false, false);
        d.parent = parent;
        d.host_bridge = Some(hb.to_owned());
        d.numa = numa;
        self.devices.push(d);
    }

    /// Fills the bus below `bridge` (a root port or downstream port) with a device or a switch.
    fn below(&mut self, bridge: PciAddr, place: Place, hbname: &str, depth: usize) {
        let bus = self.bus();
        if depth < 3 && self.rand(2) == 0 {
            let usp = PciAddr {
                domain: self.domain,
                bus,
                device: 0,
                function: 0,
            };
            self.device(usp, 0x060400, Some(bridge), hbname, place.numa);
            let inner = self.bus();
            let sw = self.fresh();
            for dsp_no in 0..1 + self.rand(3) as u8 {
                let dsp = PciAddr {
                    domain: self.domain,
                    bus: inner,
                    device: dsp_no,
                    function: 0,
                };
                self.device(dsp, 0x060400, Some(usp), hbname, place.numa);
                let mut p = place.clone();
                p.switches.push(sw);
                self.below(dsp, p, hbname, depth + 1);
            }
        } else {
            let slot = self.fresh();
            for f in 0..1 + self.rand(3) as u8 {
                let class = [0x030200, 0x020000, 0x010802][self.rand(3) as usize];
                let pci = PciAddr {
                    domain: self.domain,
                    bus,
                    device: 0,
                    function: f,
                };
                self.device(pci, class, Some(bridge), hbname, place.numa);
                self.places.push((
                    pci,
                    Place {
                        slot,
                        ..place.clone()
                    },
                ));
            }
        }
    }
}

fn build(seed: u64) -> (Machine, Vec<(PciAddr, Place)>) {
    let mut g = Gen {
        state: seed | 1,
        next_bus: 0,
        domain: 0,
        devices: Vec::new(),
        places: Vec::new(),
        ids: 0,
    };
    let hbs = 1 + g.rand(3) as usize;
    for hb in 0..hbs {
        let numa = match g.rand(3) {
            0 => None,
            n => Some((hb as u32 + n as u32) % 2),
        };
        g.domain = hb as u32;
        g.next_bus = 0;
        let name = format!("pci{:04x}:00", hb);
        let root_bus = g.bus();
        for rp in 0..1 + g.rand(3) as usize {
            let port = PciAddr {
                domain: g.domain,
                bus: root_bus,
                device: rp as u8,
                function: 0,
            };
            g.device(port, 0x060400, None, &name, numa);
            let place = Place {
                hb,
                numa,
                root_port: rp,
                switches: Vec::new(),
                slot: 0,
            };
            g.below(port, place, &name, 0);
        }
    }
    let nodes = (0..2)
        .map(|id| NumaNode {
            id,
            cpus: String::new(),
        })
        .collect();
    let m = Machine::assemble(g.devices, nodes, IommuState::default(), true, "proptest");
    (m, g.places)
}

fn oracle(a: &Place, b: &Place) -> LinkClass {
    if a.hb != b.hb {
        return match (a.numa, b.numa) {
            (Some(x), Some(y)) if x != y => LinkClass::Sys,
            _ => LinkClass::Node,
        };
    }
    if a.root_port != b.root_port {
        return LinkClass::Phb;
    }
    if a.slot == b.slot {
        return LinkClass::Pix; // functions of one device, under one bridge
    }
    let common = a
        .switches
        .iter()
        .zip(&b.switches)
        .take_while(|(x, y)| x == y)
        .count();
    if a.switches.len() == common && b.switches.len() == common {
        LinkClass::Pix // each directly under a downstream port of the same switch
    } else {
        LinkClass::Pxb
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn classes_follow_the_tree(seed in any::<u64>()) {
        let (m, places) = build(seed);
        let mx = m.matrix();
        let n = mx.ids.len();
        for i in 0..n {
            for j in 0..n {
                prop_assert_eq!(mx.cells[i][j], mx.cells[j][i], "symmetric");
                prop_assert_eq!(mx.cells[i][j] == LinkClass::X, i == j, "X exactly on the diagonal");
            }
        }
        let place = |d: &Device| places.iter().find(|(p, _)| *p == d.pci).map(|(_, pl)| pl.clone()).unwrap();
        let devs = m.matrix_devices();
        for a in &devs {
            for b in &devs {
                if a.pci == b.pci { continue; }
                let want = oracle(&place(a), &place(b));
                prop_assert_eq!(m.classify(a, b), want, "{} {}", a.pci, b.pci);
                // Every bridge between a pair is an ancestor of one of the two.
                for br in m.bridges_between(a, b) {
                    prop_assert_eq!(br.kind, DeviceKind::Bridge);
                }
            }
        }
    }
}
