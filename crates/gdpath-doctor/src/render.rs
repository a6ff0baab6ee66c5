//! The doctor's report as text for people (`gdpath doctor` without `--json`).
//!
//! By default one line per finding: its status, id, the subjects in few words
//! ([`crate::subjects::compress`]) and a short summary — the evidence's first clause, up to its
//! first `; ` outside parentheses (the doctor's evidence leads with it). Findings of one id and
//! status whose summaries agree are one line; a finding that several paths share (`system.no-gpu`
//! under GDR, GDS and system) is said once, naming the others. Passed and not-run checks are
//! counted (`--all` lists them). `verbose` adds every evidence text, with the subjects it holds
//! for, and the remedies; `--json` ([`crate::Report`]) keeps everything. Every text that came
//! from the source (evidence, subjects, remedies, the source's name) is written through
//! [`gdpath_topo::text::escape`]: a snapshot's or XML's strings reach the terminal escaped.

use crate::{Mode, Report};
use gdpath::finding::{ids, Area, Finding, Status};
use gdpath_topo::text::escape;
use std::collections::HashMap;
use std::fmt::Write as _;

/// Summaries longer than this many characters are cut (with "…"); `verbose` shows them whole.
const SUMMARY_CHARS: usize = 110;

/// Subject lists longer than this are cut too (several groups of pairs of a large machine).
const SUBJECT_CHARS: usize = 100;

/// What to show.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct TextOptions {
    /// Every evidence text and remedy under its line.
    pub verbose: bool,
    /// Passed (`ok`) and `not-run` checks too, not only counted.
    pub all: bool,
    /// `--measure` was asked for: measured findings are listed even when `ok` or `not-run`,
    /// and a closing line says what was measured.
    pub measure: bool,
    /// The paths the exit status is judged on (`--need`; empty: all), as
    /// [`Report::exit_code_for`] judges them.
    pub need: Vec<Area>,
}

/// The report as text: a header naming what was examined (`mode`), what the source does not
/// describe, the findings per path, the verdicts and the exit status.
pub fn text(r: &Report, mode: &Mode, opts: TextOptions) -> String {
    let mut o = String::new();
    let replay = matches!(mode, Mode::Replay { .. });
    let _ = writeln!(
        o,
        "gdpath doctor: {}",
        match mode {
            Mode::Live => "this machine (live)".to_owned(),
            Mode::Replay { what } => format!("{} (replay: live-only checks not run)", escape(what)),
        }
    );
    if r.findings
        .iter()
        .any(|f| f.id.as_str() == ids::SYSTEM_NO_GPU && f.status == Status::Unavailable)
    {
        let _ = writeln!(
            o,
            "No GPU: {}; checking what can be checked without one.",
            if replay {
                "the source shows no NVIDIA GPU"
            } else {
                "there is no NVIDIA GPU here"
            }
        );
    }
    coverage(&mut o, r, opts.verbose);

    let lines = lines(r, &opts);
    let width = lines
        .iter()
        .flat_map(|(_, ls, _)| ls.iter().map(|l| l.id.chars().count()))
        .max()
        .unwrap_or(0);
    for (area, ls, (ok, not_run)) in &lines {
        let verdict = r.verdict(*area).map_or("no checks", |v| word(v.status));
        let _ = writeln!(o, "\n{}: {verdict}", title(*area));
        for l in ls {
            l.write(&mut o, width, opts.verbose);
        }
        if ok + not_run > 0 {
            let _ = writeln!(
                o,
                "  ({ok} passed, {not_run} not run{})",
                if opts.all { "" } else { ": --all lists them" }
            );
        }
    }

    if opts.verbose {
        let _ = writeln!(o, "\nVerdict:");
        for v in &r.verdicts {
            let _ = writeln!(
                o,
                "  {} {:<6} {}",
                mark(v.status),
                name(v.path),
                escape(&v.summary)
            );
        }
    } else {
        let v: Vec<String> = r
            .verdicts
            .iter()
            .map(|v| format!("{} {}", name(v.path), word(v.status)))
            .collect();
        let _ = writeln!(o, "\nVerdict: {}", v.join(", "));
    }
    if opts.measure {
        let _ = writeln!(
            o,
            "--measure: {}",
            if replay {
                "a replay has no GPU or file to measure: nothing was measured."
            } else {
                "P2P was measured against the staged path (64 MiB copies per GPU pair), GDS \
                 against it in each --path (256 MiB reads into GPU 0); GDR has no probe yet and \
                 is listed as not-run."
            }
        );
    }
    let code = r.exit_code_for(&opts.need);
    let judged_on = if opts.need.is_empty() {
        String::new()
    } else {
        let names: Vec<&str> = opts.need.iter().map(|a| a.as_str()).collect();
        format!(" (judged on --need {})", names.join(","))
    };
    let _ = writeln!(
        o,
        "exit status {code}{judged_on}: {}",
        exit_meaning(r, code, &opts.need)
    );
    if !opts.verbose {
        let _ = writeln!(o, "Evidence and remedies: --verbose (or --json).");
    }
    o
}

/// What an exit status means for this report.
fn exit_meaning(r: &Report, code: u8, need: &[Area]) -> &'static str {
    match code {
        crate::exit::OK
            if r.verdicts
                .iter()
                .filter(|v| crate::judged(need, v.path))
                .all(|v| v.status == Status::Ok) =>
        {
            "every checked path available"
        }
        crate::exit::OK => "nothing degraded or unavailable, but some verdicts are unknown",
        crate::exit::DEGRADED => "some path degraded",
        crate::exit::UNAVAILABLE => "some path unavailable",
        crate::exit::UNDECIDED => {
            "no verdict could be decided (every path unknown or not run): do not read this as \
             ready"
        }
        _ => "the doctor failed",
    }
}

/// What the source does not describe: one line naming the aspects, or one line each with the
/// reason when verbose.
fn coverage(o: &mut String, r: &Report, verbose: bool) {
    let gaps = r.coverage.gaps();
    if gaps.is_empty() {
        return;
    }
    if verbose {
        let _ = writeln!(
            o,
            "Not described by the source (checks that need them are unknown):"
        );
        for (a, why) in gaps {
            let _ = writeln!(o, "  {}: {}", a.describe(), escape(why));
        }
        return;
    }
    let (none, part): (Vec<_>, Vec<_>) = gdpath_topo::Aspect::ALL
        .iter()
        .filter(|a| r.coverage.get(**a).gap().is_some())
        .partition(|a| r.coverage.get(**a).is_unknown());
    let names = |v: &[&gdpath_topo::Aspect]| {
        v.iter()
            .map(|a| a.describe())
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut text = String::new();
    if !none.is_empty() {
        text.push_str(&names(&none));
    }
    if !part.is_empty() {
        if !text.is_empty() {
            text.push_str("; ");
        }
        let _ = write!(text, "in part: {}", names(&part));
    }
    let _ = writeln!(
        o,
        "Not described by the source: {text} (checks that need them are unknown)."
    );
}

/// One line of output: findings of one id and status with the same summary.
struct Line<'r> {
    id: &'r str,
    status: Status,
    summary: &'r str,
    subjects: Vec<&'r str>,
    /// Each distinct evidence with the subjects it holds for.
    evidence: Vec<(&'r str, Vec<&'r str>)>,
    remedies: Vec<&'r str>,
    /// Other paths the same findings were listed under.
    also: Vec<Area>,
}

impl Line<'_> {
    fn write(&self, o: &mut String, width: usize, verbose: bool) {
        let subjects = escape(&crate::subjects::compress(&self.subjects));
        let also = if self.also.is_empty() {
            String::new()
        } else {
            let names: Vec<&str> = self.also.iter().map(|a| name(*a)).collect();
            format!(" (also for {})", names.join(", "))
        };
        let what = if subjects == "system" {
            String::new()
        } else if verbose {
            format!("{subjects}: ")
        } else {
            format!("{}: ", cut(&subjects, SUBJECT_CHARS))
        };
        let id = format!("{:<width$}", self.id);
        if !verbose {
            let _ = writeln!(
                o,
                "  {} {id}  {what}{}{also}",
                mark(self.status),
                cut(&escape(self.summary), SUMMARY_CHARS)
            );
            return;
        }
        let head = format!(
            "  {} {id}  {}{also}",
            mark(self.status),
            what.trim_end_matches(": ")
        );
        let _ = writeln!(o, "{}", head.trim_end());
        match self.evidence.as_slice() {
            [(ev, _)] => {
                let _ = writeln!(o, "      {}", escape(ev));
            }
            many => {
                for (ev, subs) in many {
                    let _ = writeln!(
                        o,
                        "      {}: {}",
                        escape(&crate::subjects::compress(subs)),
                        escape(ev)
                    );
                }
            }
        }
        if !matches!(self.status, Status::Ok | Status::NotRun) {
            for r in &self.remedies {
                let _ = writeln!(o, "      → {}", escape(r));
            }
        }
    }
}

/// Per path: its lines, and how many checks passed and were not run without being listed.
type Section<'r> = (Area, Vec<Line<'r>>, (usize, usize));

fn lines<'a>(r: &'a Report, opts: &TextOptions) -> Vec<Section<'a>> {
    let mut out: Vec<Section> = Vec::new();
    // (id, status, summary, evidence) of lines already made → (section, line).
    let mut said: HashMap<(&str, Status, &str, &str), (usize, usize)> = HashMap::new();
    for area in [Area::P2p, Area::Gdr, Area::Gds, Area::System] {
        let (mut ok, mut not_run) = (0, 0);
        let mut ls: Vec<Line> = Vec::new();
        let mut index: HashMap<(&str, Status, &str), usize> = HashMap::new();
        for f in r.of(area) {
            let measured = opts.measure && f.id.as_str().ends_with(".measured-fallback");
            match f.status {
                Status::Ok if !opts.all && !measured => ok += 1,
                Status::NotRun if !opts.all && !measured => not_run += 1,
                _ => {
                    let summary = summary(&f.evidence);
                    let shared = (f.id.as_str(), f.status, summary, f.evidence.as_str());
                    if let Some(&(s, l)) = said.get(&shared) {
                        if s < out.len() {
                            let line: &mut Line = &mut out[s].1[l];
                            if line.subjects.contains(&f.subject.as_str()) {
                                if !line.also.contains(&area) {
                                    line.also.push(area);
                                }
                                if !f.remedy.is_empty()
                                    && !line.remedies.contains(&f.remedy.as_str())
                                {
                                    line.remedies.push(&f.remedy);
                                }
                                continue;
                            }
                        }
                    }
                    let key = (f.id.as_str(), f.status, summary);
                    let i = *index.entry(key).or_insert_with(|| {
                        ls.push(Line {
                            id: f.id.as_str(),
                            status: f.status,
                            summary,
                            subjects: Vec::new(),
                            evidence: Vec::new(),
                            remedies: Vec::new(),
                            also: Vec::new(),
                        });
                        ls.len() - 1
                    });
                    add(&mut ls[i], f);
                    said.entry(shared).or_insert((out.len(), i));
                }
            }
        }
        // Lines of one id together, in the order the ids first appear.
        let mut first: HashMap<&str, usize> = HashMap::new();
        for (i, l) in ls.iter().enumerate() {
            first.entry(l.id).or_insert(i);
        }
        let mut order: Vec<usize> = (0..ls.len()).collect();
        order.sort_by_key(|&i| first[ls[i].id]);
        let mut at = vec![0; ls.len()];
        for (new, &old) in order.iter().enumerate() {
            at[old] = new;
        }
        let mut slots: Vec<Option<Line>> = ls.into_iter().map(Some).collect();
        let sorted: Vec<Line> = order
            .iter()
            .map(|&old| slots[old].take().expect("each line once"))
            .collect();
        for v in said.values_mut() {
            if v.0 == out.len() {
                v.1 = at[v.1];
            }
        }
        out.push((area, sorted, (ok, not_run)));
    }
    out
}

fn add<'r>(l: &mut Line<'r>, f: &'r Finding) {
    l.subjects.push(&f.subject);
    match l.evidence.iter_mut().find(|(e, _)| *e == f.evidence) {
        Some((_, subs)) => subs.push(&f.subject),
        None => l.evidence.push((&f.evidence, vec![&f.subject])),
    }
    if !f.remedy.is_empty() && !l.remedies.contains(&f.remedy.as_str()) {
        l.remedies.push(&f.remedy);
    }
}

/// The evidence's first clause: up to its first `; ` outside parentheses.
pub fn summary(evidence: &str) -> &str {
    let mut depth = 0i32;
    let b = evidence.as_bytes();
    for (i, c) in evidence.char_indices() {
        match c {
            '(' | '[' => depth += 1,
            ')' | ']' => depth -= 1,
            ';' if depth <= 0 && b.get(i + 1) == Some(&b' ') => return &evidence[..i],
            _ => {}
        }
    }
    evidence
}

/// `text` cut to at most `max` characters at a word boundary, ending in "…" when cut.
fn cut(text: &str, max: usize) -> String {
    if text.chars().count() <= max {
        return text.to_owned();
    }
    let end = text
        .char_indices()
        .nth(max - 1)
        .map_or(text.len(), |(i, _)| i);
    let head = &text[..end];
    let head = head.rfind(' ').map_or(head, |i| &head[..i]);
    format!("{}…", head.trim_end_matches([',', ':', ';']))
}

fn mark(s: Status) -> &'static str {
    match s {
        Status::Ok => "✔ ok         ",
        Status::Degraded => "▲ degraded   ",
        Status::Unavailable => "✘ unavailable",
        Status::Unknown => "? unknown    ",
        Status::NotRun => "- not-run    ",
    }
}

fn word(s: Status) -> &'static str {
    match s {
        Status::Ok => "available",
        Status::Degraded => "degraded",
        Status::Unavailable => "unavailable",
        Status::Unknown => "unknown",
        Status::NotRun => "not run",
    }
}

fn title(a: Area) -> &'static str {
    match a {
        Area::P2p => "P2P (GPU ↔ GPU)",
        Area::Gdr => "GDR (GPU ↔ RDMA NIC)",
        Area::Gds | Area::Storage => "GDS (file ↔ GPU)",
        Area::System => "System",
    }
}

fn name(a: Area) -> &'static str {
    match a {
        Area::P2p => "P2P",
        Area::Gdr => "GDR",
        Area::Gds | Area::Storage => "GDS",
        Area::System => "system",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn summaries_and_cuts() {
        assert_eq!(
            summary("ACS unknown (readable only as root; see lspci); on 0000:00:1c.0"),
            "ACS unknown (readable only as root; see lspci)"
        );
        assert_eq!(summary("no separator: whole"), "no separator: whole");
        assert_eq!(cut("short", 10), "short");
        assert_eq!(cut("one two three four", 12), "one two…");
    }
}
