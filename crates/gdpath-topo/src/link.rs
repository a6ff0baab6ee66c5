//! PCIe link speed and width, and the bandwidth a link can carry.

use serde::{Deserialize, Serialize};

/// A PCIe link as the device reports it: current (trained) and maximum (capable) speed and
/// width. Speeds are in GT/s per lane (sysfs `current_link_speed`, `max_link_speed`), widths in
/// lanes (`current_link_width`, `max_link_width`). `None` means the value could not be read or
/// the source does not give it (a virtual device, an old kernel, hwloc XML) — never zero.
#[derive(Debug, Clone, Copy, Default, PartialEq, Serialize, Deserialize)]
pub struct PcieLink {
    /// Current (trained) speed, GT/s per lane (2.5, 5, 8, 16, 32, 64 for Gen1..Gen6).
    pub cur_gts: Option<f64>,
    /// Current (trained) width, lanes.
    pub cur_width: Option<u32>,
    /// Highest speed the link supports, GT/s per lane.
    pub max_gts: Option<f64>,
    /// Widest width the link supports, lanes.
    pub max_width: Option<u32>,
    /// Usable bandwidth of the current link per direction in GB/s (1e9 B/s) as the source
    /// states it, for sources that give the bandwidth rather than speed and width: hwloc's
    /// `pci_link_speed`. Absent from JSON when the source does not state it.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub stated_gbps: Option<f64>,
}

impl PcieLink {
    /// PCIe generation of a per-lane rate in GT/s, per the PCI Express Base Specification:
    /// 2.5 → 1, 5 → 2, 8 → 3, 16 → 4, 32 → 5, 64 → 6 (and 128 → 7). Other rates → `None`.
    pub fn gen_of(gts: f64) -> Option<u32> {
        const RATES: [(f64, u32); 7] = [
            (2.5, 1),
            (5.0, 2),
            (8.0, 3),
            (16.0, 4),
            (32.0, 5),
            (64.0, 6),
            (128.0, 7),
        ];
        RATES
            .iter()
            .find(|(r, _)| (gts - r).abs() < 0.01)
            .map(|&(_, g)| g)
    }

    /// Generation of the current link (see [`PcieLink::gen_of`]). Named `cur_gen` rather than
    /// `gen` because `gen` is a reserved word from Rust 2024 on.
    pub fn cur_gen(&self) -> Option<u32> {
        self.cur_gts.and_then(Self::gen_of)
    }

    /// Generation the device is capable of.
    pub fn max_gen(&self) -> Option<u32> {
        self.max_gts.and_then(Self::gen_of)
    }

    /// True when the link trained below what it is capable of, in speed or in width (e.g. x8 of
    /// x16, or Gen3 of Gen5). False when either side is unknown. Note that NVIDIA GPUs lower their
    /// link speed when idle to save power, so a GPU's speed is only meaningful under load.
    pub fn is_degraded(&self) -> bool {
        self.speed_degraded() || self.width_degraded()
    }

    /// Current speed below the maximum speed (both known).
    pub fn speed_degraded(&self) -> bool {
        matches!((self.cur_gts, self.max_gts), (Some(c), Some(m)) if c + 0.01 < m)
    }

    /// Current width below the maximum width (both known).
    pub fn width_degraded(&self) -> bool {
        matches!((self.cur_width, self.max_width), (Some(c), Some(m)) if c < m)
    }

    /// Usable bandwidth of the current link, per direction, in GB/s (1e9 B/s), after line
    /// encoding: `GT/s × lanes × efficiency / 8`. See [`encoding_efficiency`] for the efficiency
    /// of each generation. This is the physical limit a benchmark compares against; TLP headers
    /// and flow control take a further 5–15 % in practice. `None` when speed or width is unknown.
    ///
    /// Examples: Gen5 x16 = 32 × 16 × 128/130 / 8 = 63.02 GB/s; Gen3 x16 = 15.75 GB/s;
    /// Gen1 x1 = 0.25 GB/s.
    /// Without speed or width, the bandwidth the source states ([`PcieLink::stated_gbps`]).
    pub fn limit_gbps(&self) -> Option<f64> {
        match (self.cur_gts, self.cur_width) {
            (Some(g), Some(w)) => Self::bandwidth_gbps(g, w),
            _ => self.stated_gbps,
        }
    }

    /// As [`PcieLink::limit_gbps`], for the maximum speed and width the device is capable of.
    pub fn max_limit_gbps(&self) -> Option<f64> {
        Self::bandwidth_gbps(self.max_gts?, self.max_width?)
    }

    /// The current link as text: `Gen5 x16`, with `?` for an unknown part, or `?` alone.
    pub fn cur_text(&self) -> String {
        Self::text(self.cur_gts, self.cur_width)
    }

    /// The maximum link as text, as [`PcieLink::cur_text`].
    pub fn max_text(&self) -> String {
        Self::text(self.max_gts, self.max_width)
    }

    fn text(gts: Option<f64>, width: Option<u32>) -> String {
        if gts.is_none() && width.is_none() {
            return "?".to_owned();
        }
        let g = gts
            .and_then(Self::gen_of)
            .map_or_else(|| "Gen?".to_owned(), |g| format!("Gen{g}"));
        let w = width.map_or_else(|| "x?".to_owned(), |w| format!("x{w}"));
        format!("{g} {w}")
    }

    /// Per-direction bandwidth in GB/s of `lanes` lanes at `gts` GT/s after line encoding.
    pub fn bandwidth_gbps(gts: f64, lanes: u32) -> Option<f64> {
        if gts <= 0.0 || lanes == 0 {
            return None;
        }
        Some(gts * f64::from(lanes) * encoding_efficiency(gts) / 8.0)
    }
}

/// The link widths PCIe defines (lanes).
pub const WIDTHS: [u32; 7] = [1, 2, 4, 8, 12, 16, 32];

/// The per-lane rate in GT/s of PCIe generation `gen` (1 → 2.5, 2 → 5, ... 7 → 128).
pub fn gen_gts(gen: u32) -> Option<f64> {
    match gen {
        1 => Some(2.5),
        2..=7 => Some(2.5 * f64::from(1u32 << (gen - 1)) * if gen >= 3 { 0.8 } else { 1.0 }),
        _ => None,
    }
}

/// Fraction of the raw bit rate that carries data, by per-lane rate:
/// - up to 5 GT/s (Gen1, Gen2): 8b/10b encoding, 0.8;
/// - 8 to 32 GT/s (Gen3 to Gen5): 128b/130b encoding, 128/130;
/// - 64 GT/s and up (Gen6, Gen7): PAM4 signalling in FLIT mode, no line code; each 256-byte FLIT
///   carries 236 bytes of TLP data beside 6 bytes of DLLP, 8 of CRC and 6 of FEC (PCI Express
///   Base Specification 6.0, FLIT mode), so 236/256. This counts the DLLP bytes as overhead, as
///   the 8b/10b and 128b/130b figures above do not count DLLPs at all: Gen6 figures are
///   therefore slightly more conservative than the older ones.
pub fn encoding_efficiency(gts: f64) -> f64 {
    if gts < 6.0 {
        0.8
    } else if gts < 48.0 {
        128.0 / 130.0
    } else {
        236.0 / 256.0
    }
}

/// Parses a sysfs link speed such as `8 GT/s`, `8.0 GT/s PCIe`, `2.5 GT/s`. `Unknown speed`,
/// `0 GT/s` or anything else → `None`. Also accepts NCCL XML's `16 GT/s`.
pub fn parse_speed(text: &str) -> Option<f64> {
    let t = text.trim();
    let num = t.split("GT/s").next()?.trim();
    if !t.contains("GT/s") {
        return None;
    }
    let v: f64 = num.parse().ok()?;
    (v > 0.0 && v.is_finite()).then_some(v)
}

/// Parses a sysfs link width (`16`, or `x16`). 0 (link down) and values above 32 (255 is what
/// some virtual devices report) → `None`.
pub fn parse_width(text: &str) -> Option<u32> {
    let t = text.trim().trim_start_matches(['x', 'X']);
    let v: u32 = t.parse().ok()?;
    (1..=32).contains(&v).then_some(v)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn generations() {
        assert_eq!(PcieLink::gen_of(2.5), Some(1));
        assert_eq!(PcieLink::gen_of(5.0), Some(2));
        assert_eq!(PcieLink::gen_of(8.0), Some(3));
        assert_eq!(PcieLink::gen_of(16.0), Some(4));
        assert_eq!(PcieLink::gen_of(32.0), Some(5));
        assert_eq!(PcieLink::gen_of(64.0), Some(6));
        assert_eq!(PcieLink::gen_of(3.0), None);
    }

    #[test]
    fn limits() {
        let gen5x16 = PcieLink::bandwidth_gbps(32.0, 16).unwrap();
        assert!((gen5x16 - 63.015).abs() < 0.01, "{gen5x16}");
        let gen3x16 = PcieLink::bandwidth_gbps(8.0, 16).unwrap();
        assert!((gen3x16 - 15.754).abs() < 0.01, "{gen3x16}");
        assert_eq!(PcieLink::bandwidth_gbps(2.5, 1), Some(0.25));
        assert_eq!(PcieLink::bandwidth_gbps(5.0, 8), Some(4.0));
        let gen6x16 = PcieLink::bandwidth_gbps(64.0, 16).unwrap();
        assert!((gen6x16 - 118.0).abs() < 0.01, "{gen6x16}");
        assert_eq!(PcieLink::bandwidth_gbps(8.0, 0), None);
    }

    #[test]
    fn degraded() {
        let l = PcieLink {
            cur_gts: Some(8.0),
            cur_width: Some(8),
            max_gts: Some(32.0),
            max_width: Some(16),
            stated_gbps: None,
        };
        assert!(l.speed_degraded() && l.width_degraded() && l.is_degraded());
        assert_eq!((l.cur_gen(), l.max_gen()), (Some(3), Some(5)));
        let full = PcieLink {
            cur_gts: Some(32.0),
            cur_width: Some(16),
            ..l
        };
        assert!(!full.is_degraded());
        assert!(!PcieLink::default().is_degraded());
    }

    #[test]
    fn parsing() {
        assert_eq!(parse_speed("8 GT/s\n"), Some(8.0));
        assert_eq!(parse_speed("32.0 GT/s PCIe"), Some(32.0));
        assert_eq!(parse_speed("2.5 GT/s"), Some(2.5));
        assert_eq!(parse_speed("Unknown speed"), None);
        assert_eq!(parse_speed(""), None);
        assert_eq!(parse_width("16\n"), Some(16));
        assert_eq!(parse_width("0"), None);
        assert_eq!(parse_width("255"), None);
    }
}
