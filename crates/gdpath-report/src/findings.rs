//! The doctor's findings as an HTML table: one row per id, status and remedy, with the
//! devices it affects written as ranges and counts (`all 28 pairs of GPU0–7`,
//! `GPU0–3 ↔ GPU4–7`, `NIC0–3`) rather than a row per subject.

use crate::svg::esc;
use gdpath::finding::{Area, Finding, Status};
use gdpath_doctor::routes::{DeviceIds, Subject};
use gdpath_doctor::Report;
use gdpath_topo::Machine;
use std::collections::BTreeSet;
use std::fmt::Write as _;
use std::path::PathBuf;

/// `GPU3` → (`GPU`, 3).
fn split_id(id: &str) -> Option<(&str, u32)> {
    let digits = id.trim_start_matches(|c: char| !c.is_ascii_digit());
    let prefix = &id[..id.len() - digits.len()];
    Some((prefix, digits.parse().ok()?))
}

/// Ids as ranges per kind: `GPU0–3, GPU5, NIC0–1`; ids that are not `PREFIXn` as they are.
pub fn ranges(ids: &[&str]) -> String {
    let mut by: Vec<(String, Vec<u32>)> = Vec::new();
    let mut other: Vec<String> = Vec::new();
    for id in ids {
        match split_id(id) {
            Some((p, n)) => match by.iter_mut().find(|(q, _)| q == p) {
                Some((_, v)) => v.push(n),
                None => by.push((p.to_owned(), vec![n])),
            },
            None => other.push((*id).to_owned()),
        }
    }
    let mut parts = Vec::new();
    for (p, mut v) in by {
        v.sort_unstable();
        v.dedup();
        let mut i = 0;
        while i < v.len() {
            let mut j = i;
            while j + 1 < v.len() && v[j + 1] == v[j] + 1 {
                j += 1;
            }
            parts.push(if j == i {
                format!("{p}{}", v[i])
            } else {
                format!("{p}{}–{}", v[i], v[j])
            });
            i = j + 1;
        }
    }
    parts.extend(other);
    parts.join(", ")
}

/// The subjects of a group of findings, compressed (see the module docs).
pub fn affected(subjects: &[&str], m: &Machine, dirs: &[PathBuf]) -> String {
    affected_in(subjects, &DeviceIds::of(m), dirs)
}

/// [`affected`] with the machine's ids looked up once for many groups.
fn affected_in(subjects: &[&str], ids: &DeviceIds, dirs: &[PathBuf]) -> String {
    let mut system = false;
    let mut singles: Vec<&str> = Vec::new();
    let mut pairs: Vec<(&str, &str)> = Vec::new();
    let mut dirs_seen: Vec<String> = Vec::new();
    let mut other: Vec<&str> = Vec::new();
    for s in subjects {
        match Subject::parse_with(s, &|id| ids.contains(id), dirs) {
            Subject::System => system = true,
            Subject::Devices(d) if d.len() == 1 => singles.push(d[0]),
            Subject::Devices(d) if d.len() == 2 => pairs.push((d[0], d[1])),
            Subject::Dir { dir, devices } if devices.is_empty() => dirs_seen.push(dir.to_owned()),
            Subject::Dir { dir, devices } => {
                dirs_seen.push(format!("{dir}: {}", devices.join("–")))
            }
            _ => other.push(s),
        }
    }
    let mut parts = Vec::new();
    if system {
        parts.push("the machine".to_owned());
    }
    if !singles.is_empty() {
        parts.push(ranges(&singles));
    }
    if !pairs.is_empty() {
        parts.push(pair_text(&pairs));
    }
    parts.extend(dirs_seen);
    parts.extend(other.iter().map(|s| (*s).to_owned()));
    parts.join("; ")
}

/// Pairs: `all 28 pairs of GPU0–7` when they are every pair of a set, else the partners of
/// each first device, merged where they repeat (`GPU0–3 ↔ GPU4–7`).
fn pair_text(pairs: &[(&str, &str)]) -> String {
    let set: BTreeSet<&str> = pairs.iter().flat_map(|(a, b)| [*a, *b]).collect();
    let n = set.len();
    let distinct: BTreeSet<(&str, &str)> = pairs
        .iter()
        .map(|&(a, b)| if a <= b { (a, b) } else { (b, a) })
        .collect();
    let same_kind = set
        .iter()
        .filter_map(|s| split_id(s).map(|x| x.0))
        .collect::<BTreeSet<_>>()
        .len()
        == 1;
    if same_kind && n >= 3 && distinct.len() == n * (n - 1) / 2 {
        let ids: Vec<&str> = set.into_iter().collect();
        return format!("all {} pairs of {}", distinct.len(), ranges(&ids));
    }
    // First device → partners, in first-seen order; then runs of firsts with equal partners.
    let mut by: Vec<(&str, Vec<&str>)> = Vec::new();
    for &(a, b) in pairs {
        match by.iter_mut().find(|(x, _)| *x == a) {
            Some((_, v)) if !v.contains(&b) => v.push(b),
            Some(_) => {}
            None => by.push((a, vec![b])),
        }
    }
    let mut groups: Vec<(Vec<&str>, Vec<&str>)> = Vec::new();
    for (a, mut bs) in by {
        bs.sort_unstable();
        match groups.last_mut() {
            Some((firsts, partners)) if *partners == bs => firsts.push(a),
            _ => groups.push((vec![a], bs)),
        }
    }
    let text: Vec<String> = groups
        .iter()
        .map(|(a, b)| format!("{} ↔ {}", ranges(a), ranges(b)))
        .collect();
    let count = distinct.len();
    let joined = text.join("; ");
    if text.len() > 4 {
        format!("{count} pairs: {}; …", text[..3].join("; "))
    } else if count > 1 {
        format!("{joined} ({count} pairs)")
    } else {
        joined
    }
}

/// `P2P`, `GDR`, `GDS` or `system`.
pub fn area_name(a: Area) -> &'static str {
    match a {
        Area::P2p => "P2P",
        Area::Gdr => "GDR",
        Area::Gds | Area::Storage => "GDS",
        Area::System => "system",
    }
}

/// The status as a chip: `<span class="st st-degraded">▲ degraded</span>`.
pub fn chip(s: Status) -> String {
    let (class, text) = match s {
        Status::Ok => ("ok", "✔ ok"),
        Status::Degraded => ("degraded", "▲ degraded"),
        Status::Unavailable => ("unavailable", "✘ unavailable"),
        Status::Unknown => ("unknown", "? unknown"),
        Status::NotRun => ("not-run", "– not run"),
    };
    format!("<span class=\"st st-{class}\">{text}</span>")
}

/// A row of the table: findings of one path, id, status and remedy, and the other paths that
/// report the very same findings.
struct Group {
    members: Vec<usize>,
    areas: Vec<Area>,
}

/// Findings grouped by what a reader acts on: path, id, status, remedy; in report order. A
/// finding the doctor reports under several paths with the same subject and evidence
/// (`system.no-gpu` under GDR, GDS and system) is one row naming each path, as the doctor's
/// text lists it once.
fn groups(findings: &[&Finding]) -> Vec<Group> {
    let mut groups: Vec<Group> = Vec::new();
    for (i, f) in findings.iter().enumerate() {
        let same = |h: &Finding| {
            h.id == f.id
                && h.status == f.status
                && h.subject == f.subject
                && h.evidence == f.evidence
        };
        if let Some(g) = groups
            .iter_mut()
            .find(|g| g.members.len() == 1 && same(findings[g.members[0]]))
        {
            if !g.areas.contains(&f.path) {
                g.areas.push(f.path);
            }
            continue;
        }
        match groups.iter_mut().find(|g| {
            let h = findings[g.members[0]];
            g.areas.len() == 1
                && h.path == f.path
                && h.id == f.id
                && h.status == f.status
                && h.remedy == f.remedy
        }) {
            Some(g) => g.members.push(i),
            None => groups.push(Group {
                members: vec![i],
                areas: vec![f.path],
            }),
        }
    }
    groups
}

/// Most subjects listed with their own evidence under a group.
const MAX_EVIDENCE_ROWS: usize = 40;

fn table(o: &mut String, fs: &[&Finding], m: &Machine, dirs: &[PathBuf], remedies: bool) {
    o.push_str(
        "<table class=\"findings\"><thead><tr><th>status</th><th>path</th><th>id</th>\
         <th>affects</th><th>evidence</th>",
    );
    if remedies {
        o.push_str("<th>remedy</th>");
    }
    o.push_str("</tr></thead><tbody>");
    let ids = DeviceIds::of(m);
    for group in groups(fs) {
        let g = &group.members;
        let first = fs[g[0]];
        let subjects: Vec<&str> = g.iter().map(|&i| fs[i].subject.as_str()).collect();
        let all_same = g.iter().all(|&i| fs[i].evidence == first.evidence);
        let evidence = if all_same {
            esc(&first.evidence)
        } else {
            let mut e = format!(
                "<details><summary>{} (and {} more, each its own)</summary><ul>",
                esc(&first.evidence),
                g.len() - 1
            );
            for &i in g.iter().take(MAX_EVIDENCE_ROWS) {
                let _ = write!(
                    e,
                    "<li><b>{}</b>: {}</li>",
                    esc(&fs[i].subject),
                    esc(&fs[i].evidence)
                );
            }
            if g.len() > MAX_EVIDENCE_ROWS {
                let _ = write!(e, "<li>… {} more</li>", g.len() - MAX_EVIDENCE_ROWS);
            }
            e.push_str("</ul></details>");
            e
        };
        let _ = write!(
            o,
            "<tr class=\"row-{}\"><td>{}</td><td>{}</td><td><code>{}</code></td><td>{}</td><td>{}</td>",
            match first.status {
                Status::Ok => "ok",
                Status::Degraded => "degraded",
                Status::Unavailable => "unavailable",
                Status::Unknown => "unknown",
                Status::NotRun => "not-run",
            },
            chip(first.status),
            group
                .areas
                .iter()
                .map(|a| area_name(*a))
                .collect::<Vec<_>>()
                .join(", "),
            esc(first.id.as_str()),
            esc(&affected_in(&subjects, &ids, dirs)),
            evidence
        );
        if remedies {
            // The remedy of the row's findings (one finding of a merged row may have none).
            let remedy = g
                .iter()
                .map(|&i| fs[i].remedy.as_str())
                .find(|r| !r.is_empty())
                .unwrap_or_default();
            let _ = write!(o, "<td>{}</td>", esc(remedy));
        }
        o.push_str("</tr>");
    }
    o.push_str("</tbody></table>");
}

/// The findings section's HTML: the findings that need attention (degraded, unavailable,
/// unknown) with remedies, and the passed and not-run checks folded away below (the checks not
/// run with what would run them).
pub fn html(r: &Report, m: &Machine, dirs: &[PathBuf]) -> String {
    let mut o = String::new();
    let order = |s: Status| match s {
        Status::Unavailable => 0,
        Status::Degraded => 1,
        Status::Unknown => 2,
        Status::Ok => 3,
        Status::NotRun => 4,
    };
    let mut attention: Vec<&Finding> = r
        .findings
        .iter()
        .filter(|f| {
            matches!(
                f.status,
                Status::Unavailable | Status::Degraded | Status::Unknown
            )
        })
        .collect();
    attention.sort_by_key(|f| order(f.status));
    let rest: Vec<&Finding> = r
        .findings
        .iter()
        .filter(|f| matches!(f.status, Status::Ok | Status::NotRun))
        .collect();
    if attention.is_empty() {
        o.push_str("<p>Nothing degraded, unavailable or unknown.</p>");
    } else {
        table(&mut o, &attention, m, dirs, true);
    }
    if !rest.is_empty() {
        let ok = rest.iter().filter(|f| f.status == Status::Ok).count();
        let _ = write!(
            o,
            "<details class=\"passed\"><summary>{ok} check(s) passed, {} not run</summary>",
            rest.len() - ok
        );
        table(&mut o, &rest, m, dirs, ok < rest.len());
        o.push_str("</details>");
    }
    o
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_and_pairs() {
        assert_eq!(
            ranges(&["GPU0", "GPU1", "GPU2", "GPU5", "NIC1", "NIC0"]),
            "GPU0–2, GPU5, NIC0–1"
        );
        let all: Vec<(String, String)> = (0..8)
            .flat_map(|a| (a + 1..8).map(move |b| (format!("GPU{a}"), format!("GPU{b}"))))
            .collect();
        let all: Vec<(&str, &str)> = all.iter().map(|(a, b)| (a.as_str(), b.as_str())).collect();
        assert_eq!(pair_text(&all), "all 28 pairs of GPU0–7");
        let cross: Vec<(String, String)> = (0..4)
            .flat_map(|a| (4..8).map(move |b| (format!("GPU{a}"), format!("GPU{b}"))))
            .collect();
        let cross: Vec<(&str, &str)> = cross
            .iter()
            .map(|(a, b)| (a.as_str(), b.as_str()))
            .collect();
        assert_eq!(pair_text(&cross), "GPU0–3 ↔ GPU4–7 (16 pairs)");
        assert_eq!(
            pair_text(&[("GPU0", "NIC0"), ("GPU1", "NIC0"), ("GPU2", "NIC1")]),
            "GPU0–1 ↔ NIC0; GPU2 ↔ NIC1 (3 pairs)"
        );
    }
}
