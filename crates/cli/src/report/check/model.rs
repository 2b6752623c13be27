//! The report of `opdump check`: its model (the JSON of `--json`), built
//! from the check results the plugin wrote, and its text.
//!
//! Verdicts are the plugin's: this only groups the failed calls by
//! signature, orders them worst first and counts.

use std::collections::BTreeMap;
use std::path::Path;

use serde::Serialize;

use opdump_format::tables::check::{CheckLine, CheckedCall, SkipCause, Verdict};
use opdump_load::tables::{capture_parts, CheckFile};

/// Version of the JSON layout; bumped when a field changes meaning or goes.
/// 2: `exit_status` 3 (signatures never checked), `unchecked`.
pub const CHECK_REPORT_VERSION: u32 = 2;

/// The exit status when no check failed but signatures were met and never
/// checked (the time budget spent, or the checking thread's queue full at
/// each call): not 0, since a signature never checked may hide a fault;
/// not 1, since none was found. As `opdump compare`'s 3, a verdict that is
/// neither a pass nor a fault.
pub const EXIT_UNCHECKED: u8 = 3;

/// A failed check's ratio at or below this is not a fail (the plugin's rule,
/// printed beside the ratio; not applied here).
pub const FAIL_RATIO: f64 = opdump_judge::check::OFF_FACTOR;

/// What `opdump check` found (the JSON of `--json`).
#[derive(Serialize, Debug)]
pub struct CheckReport {
    pub format: &'static str,
    pub version: u32,
    pub path: String,
    /// The ranks read.
    pub ranks: Vec<u32>,
    pub counts: Counts,
    /// What the processes skipped, from their summary lines.
    pub skipped: Skipped,
    /// The signatures the processes met and never checked, from their
    /// summary lines, each once per cause with the ranks that skipped it,
    /// in the order read.
    pub unchecked: Vec<UncheckedSignature>,
    /// Why calls had no reference, with how many, most first.
    pub no_reference_reasons: Vec<ReasonCount>,
    /// One per failing signature, the worst ratio first.
    pub failures: Vec<Failure>,
    /// One per file read.
    pub processes: Vec<ProcessInfo>,
    pub notes: Vec<String>,
    /// 1 a check failed; else 3 ([`EXIT_UNCHECKED`]) signatures were never
    /// checked; else 0.
    pub exit_status: u8,
}

/// A signature met and never checked.
#[derive(Serialize, Debug, Clone)]
pub struct UncheckedSignature {
    pub signature: String,
    pub op: String,
    pub overload: String,
    /// `budget` (OPDUMP_CHECK_SECONDS spent) or `busy` (the checking
    /// thread's queue full at each call).
    pub why: SkipCause,
    pub ranks: Vec<u32>,
}

/// Checked calls (lines read), by verdict.
#[derive(Serialize, Debug, Default, Clone, Copy)]
pub struct Counts {
    /// Calls judged: passed and failed (as the plugin's summary counts).
    pub checked: u64,
    pub passed: u64,
    pub failed: u64,
    /// Calls with no reference to judge them by (not in `checked`).
    pub no_reference: u64,
    /// Distinct signatures among the failed calls.
    pub failed_signatures: u64,
}

#[derive(Serialize, Debug, Default, Clone, Copy)]
pub struct Skipped {
    /// Over OPDUMP_CHECK_MAX_BYTES.
    pub bytes: u64,
    /// Past the time budget.
    pub budget: u64,
    /// The checking threads were busy.
    pub busy: u64,
}

#[derive(Serialize, Debug, Clone)]
pub struct ReasonCount {
    pub reason: String,
    pub count: u64,
}

#[derive(Serialize, Debug, Clone)]
pub struct ProcessInfo {
    pub rank: u32,
    pub file: String,
    pub pid: Option<i64>,
    /// The process wrote its summary line at exit (false: killed).
    pub finished: bool,
    /// Its lines of passed and failed calls.
    pub checked: u64,
}

/// A failing signature: its worst call (the largest ratio), as its line
/// holds it, and how many calls of it failed, on which ranks.
#[derive(Serialize, Debug, Clone)]
pub struct Failure {
    #[serde(flatten)]
    pub call: CheckedCall,
    /// The `opdump repro` command that rebuilds the call from its capture;
    /// null when there is no capture file.
    pub repro: Option<String>,
    pub calls_failed: u64,
    pub ranks_failed: Vec<u32>,
    /// For a list op (`_foreach_*`, `_fused_adamw_`): the list indices
    /// that failed, in order, each with its parameter's name where known.
    pub elements_failed: Vec<FailedElement>,
}

/// A failed list index of a list op.
#[derive(Serialize, Debug, Clone, PartialEq, Eq, PartialOrd, Ord)]
pub struct FailedElement {
    pub element: u32,
    pub name: Option<String>,
}

/// A failure reads as its worst call.
impl std::ops::Deref for Failure {
    type Target = CheckedCall;

    fn deref(&self) -> &CheckedCall {
        &self.call
    }
}

/// A failed row's place in the order: the larger ratio first; a fail with
/// no ratio (the plugin had none to give, e.g. NaN where the reference is
/// finite) counts as the worst.
fn badness(r: &CheckLine) -> f64 {
    match r.call.ratio {
        Some(x) if !x.is_nan() => x,
        _ => f64::INFINITY,
    }
}

/// `s` quoted for a POSIX shell, when it needs it.
pub fn shell_quote(s: &str) -> String {
    let plain = !s.is_empty()
        && s.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"-_./=:@,+%".contains(&b));
    if plain {
        s.to_string()
    } else {
        format!("'{}'", s.replace('\'', r"'\''"))
    }
}

/// The command that rebuilds a call from the capture file at `path`.
pub fn repro_command(path: &Path) -> String {
    format!(
        "opdump repro --check {}",
        shell_quote(&path.display().to_string())
    )
}

impl Failure {
    fn of(dump: &Path, r: &CheckLine, notes: &mut Vec<String>) -> Self {
        let repro = match r.call.capture.as_deref() {
            Some(c) if capture_parts(c).is_some() => {
                let path = dump.join(c);
                if !path.is_file() {
                    notes.push(format!(
                        "{}: the capture file of {} is missing",
                        path.display(),
                        r.call.signature
                    ));
                }
                Some(repro_command(&path))
            }
            Some(c) => {
                notes.push(format!(
                    "the capture {c:?} of {} is not a path checks/rank=<R>/<file> in the dump: no repro command",
                    r.call.signature
                ));
                None
            }
            None => None,
        };
        Failure {
            call: r.call.clone(),
            repro,
            calls_failed: 0,
            ranks_failed: Vec::new(),
            elements_failed: Vec::new(),
        }
    }
}

/// Per failing signature: its worst row, its failed calls, its ranks, its
/// failed list indices.
type BySignature<'a> = BTreeMap<&'a str, (&'a CheckLine, u64, Vec<u32>, Vec<FailedElement>)>;

impl CheckReport {
    /// The report of the files read from `dump`.
    pub fn build(dump: &Path, files: &[CheckFile], mut notes: Vec<String>) -> Self {
        let mut counts = Counts::default();
        let mut skipped = Skipped::default();
        let mut reasons: BTreeMap<String, u64> = BTreeMap::new();
        let mut by_sig: BySignature = BTreeMap::new();
        let mut processes = Vec::new();
        let mut unchecked: Vec<UncheckedSignature> = Vec::new();
        let mut ranks: Vec<u32> = files.iter().map(|f| f.rank).collect();
        ranks.dedup();
        for f in files {
            for r in &f.rows {
                count_row(r, &mut counts, &mut reasons, &mut by_sig);
            }
            let file = f.path.display().to_string();
            file_notes(f, &file, &mut skipped, &mut notes);
            add_unchecked(f, &mut unchecked);
            processes.push(ProcessInfo {
                rank: f.rank,
                file,
                pid: f
                    .summary
                    .as_ref()
                    .map(|s| s.pid)
                    .or_else(|| pid_of(&f.path)),
                finished: f.summary.is_some(),
                checked: f
                    .rows
                    .iter()
                    .filter(|r| r.verdict != Verdict::NoReference)
                    .count() as u64,
            });
        }
        let failures = failures_of(dump, by_sig, &mut notes);
        counts.failed_signatures = failures.len() as u64;
        let mut no_reference_reasons: Vec<ReasonCount> = reasons
            .into_iter()
            .map(|(reason, count)| ReasonCount { reason, count })
            .collect();
        no_reference_reasons.sort_by_key(|x| std::cmp::Reverse(x.count));
        CheckReport {
            format: "opdump-check",
            version: CHECK_REPORT_VERSION,
            path: dump.display().to_string(),
            ranks,
            counts,
            skipped,
            unchecked,
            no_reference_reasons,
            failures,
            processes,
            notes,
            exit_status: if counts.failed > 0 {
                1
            } else if skipped.budget + skipped.busy > 0 {
                EXIT_UNCHECKED
            } else {
                0
            },
        }
    }
}

/// Counts a row by its verdict: a reason for no reference, a failed row
/// under its signature.
fn count_row<'a>(
    r: &'a CheckLine,
    counts: &mut Counts,
    reasons: &mut BTreeMap<String, u64>,
    by_sig: &mut BySignature<'a>,
) {
    // As the plugin counts: checked is judged, pass or fail.
    if r.verdict != Verdict::NoReference {
        counts.checked += 1;
    }
    match r.verdict {
        Verdict::Pass => counts.passed += 1,
        Verdict::NoReference => {
            counts.no_reference += 1;
            let why = r
                .call
                .reason
                .clone()
                .unwrap_or_else(|| "no reason given".into());
            *reasons.entry(why).or_default() += 1;
        }
        Verdict::Fail => {
            counts.failed += 1;
            let e =
                by_sig
                    .entry(r.call.signature.as_str())
                    .or_insert((r, 0, Vec::new(), Vec::new()));
            if badness(r) > badness(e.0) {
                e.0 = r;
            }
            e.1 += 1;
            if !e.2.contains(&r.call.rank) {
                e.2.push(r.call.rank);
            }
            if let Some(element) = r.call.element {
                let failed = FailedElement {
                    element,
                    name: r.call.name.clone(),
                };
                if !e.3.contains(&failed) {
                    e.3.push(failed);
                }
            }
        }
    }
}

/// Adds the signatures a file's summary line lists as never checked.
fn add_unchecked(f: &CheckFile, out: &mut Vec<UncheckedSignature>) {
    let Some(s) = &f.summary else { return };
    for u in &s.unchecked {
        match out
            .iter_mut()
            .find(|x| x.signature == u.signature && x.why == u.why)
        {
            Some(x) => {
                if !x.ranks.contains(&f.rank) {
                    x.ranks.push(f.rank);
                    x.ranks.sort_unstable();
                }
            }
            None => out.push(UncheckedSignature {
                signature: u.signature.clone(),
                op: u.op.clone(),
                overload: u.overload.clone(),
                why: u.why,
                ranks: vec![f.rank],
            }),
        }
    }
}

/// Adds a file's skipped calls, from its summary line, and notes what is
/// wrong with the file.
fn file_notes(f: &CheckFile, file: &str, skipped: &mut Skipped, notes: &mut Vec<String>) {
    match &f.summary {
        Some(s) => {
            skipped.bytes += s.skipped_bytes;
            skipped.budget += s.skipped_budget;
            skipped.busy += s.skipped_busy;
            let held = |v: Verdict| f.rows.iter().filter(|r| r.verdict == v).count() as u64;
            let lines = (
                held(Verdict::Pass),
                held(Verdict::Fail),
                held(Verdict::NoReference),
            );
            if (s.passed, s.failed, s.no_reference) != lines {
                notes.push(format!(
                    "{file}: the summary line counts {} passed, {} failed, {} no_reference; the file's lines hold {}, {}, {}",
                    s.passed, s.failed, s.no_reference, lines.0, lines.1, lines.2
                ));
            }
            let counted = s.skipped_budget + s.skipped_busy;
            let listed = s.unchecked.len() as u64;
            if listed < counted {
                notes.push(format!(
                    "{file}: {} of its {counted} signatures never checked are not named: its summary line lists {listed} (a plugin before the list names none)",
                    counted - listed
                ));
            }
            if let n @ 1.. = s.unfinished {
                notes.push(format!(
                    "{file}: {n} checks were still queued when the process exited and have no line"
                ));
            }
            if let n @ 1.. = s.write_failures {
                notes.push(format!(
                    "{file}: {n} lines or capture files could not be written"
                ));
            }
        }
        None => notes.push(format!(
            "{file}: no summary line: the process ended before exit (killed?); its checks so far are counted, its skipped calls are not known"
        )),
    }
    if f.torn_last_line {
        notes.push(format!(
            "{file}: its last line was cut short (the process was killed while writing it) and is left out"
        ));
    }
    if f.unknown_kinds > 0 {
        notes.push(format!(
            "{file}: {} lines of a kind this opdump does not know are left out (written by a newer opdump?)",
            f.unknown_kinds
        ));
    }
}

/// One failure per signature, worst first (ties in the order of the
/// signature, `by_sig`'s).
fn failures_of(dump: &Path, by_sig: BySignature, notes: &mut Vec<String>) -> Vec<Failure> {
    let mut failures: Vec<Failure> = by_sig
        .into_values()
        .map(|(r, n, mut rk, mut el)| {
            rk.sort_unstable();
            el.sort_unstable();
            let mut fl = Failure::of(dump, r, notes);
            fl.calls_failed = n;
            fl.ranks_failed = rk;
            fl.elements_failed = el;
            fl
        })
        .collect();
    failures.sort_by(|a, b| {
        let key = |f: &Failure| f.ratio.unwrap_or(f64::INFINITY);
        key(b).total_cmp(&key(a))
    });
    failures
}

/// `part-<pid>.jsonl`'s pid.
fn pid_of(path: &Path) -> Option<i64> {
    path.file_name()?
        .to_str()?
        .strip_prefix("part-")?
        .strip_suffix(".jsonl")?
        .parse()
        .ok()
}

#[cfg(test)]
mod tests {
    use super::*;
    use opdump_load::tables::parse_check_file as parse;

    fn line(sig: &str, verdict: &str, ratio: &str, rank: u32, reason: &str) -> String {
        format!(
            r#"{{"kind":"check","signature":"{sig}","op":"aten::x","overload":"default","args":"","module":null,"phase":"forward","step":0,"seq":1,"rank":{rank},"device":"cpu","dtype":"float32","device_err":null,"cpu_err":null,"ratio":{ratio},"device_ulp":null,"cpu_ulp":null,"reduction_len":null,"verdict":"{verdict}","reason":{reason},"capture":null}}"#
        )
    }

    #[test]
    fn worst_first_grouped_by_signature_and_counted() {
        let text = [
            line("a", "fail", "20.0", 0, "null"),
            line("b", "fail", "3000.0", 0, "null"),
            line("a", "fail", "50.0", 1, "null"),
            line("c", "fail", "null", 0, "null"),
            line("d", "pass", "1.0", 0, "null"),
            line("e", "no_reference", "null", 0, "\"random op\""),
            line("f", "no_reference", "null", 0, "\"random op\""),
            line("g", "no_reference", "null", 0, "\"no CPU kernel\""),
        ]
        .join("\n")
            + "\n";
        let f = parse(&text, Path::new("part-7.jsonl"), 0).unwrap();
        let r = CheckReport::build(Path::new("d"), &[f], Vec::new());
        let sigs: Vec<&str> = r.failures.iter().map(|f| f.signature.as_str()).collect();
        assert_eq!(sigs, ["c", "b", "a"]);
        let a = &r.failures[2];
        assert_eq!((a.ratio, a.calls_failed, a.rank), (Some(50.0), 2, 1));
        assert_eq!(a.ranks_failed, [0, 1]);
        assert_eq!(
            (
                r.counts.checked,
                r.counts.passed,
                r.counts.failed,
                r.counts.no_reference
            ),
            (5, 1, 4, 3)
        );
        assert_eq!(r.no_reference_reasons[0].reason, "random op");
        assert_eq!(r.no_reference_reasons[0].count, 2);
        assert_eq!(r.exit_status, 1);
        // No summary line: said, with the pid from the file name.
        assert!(r.notes.iter().any(|n| n.contains("no summary line")));
        assert_eq!(r.processes[0].pid, Some(7));
    }

    #[test]
    fn quoting() {
        assert_eq!(
            shell_quote("d/checks/rank=0/c-1-0.safetensors"),
            "d/checks/rank=0/c-1-0.safetensors"
        );
        assert_eq!(shell_quote("a b"), "'a b'");
        assert_eq!(shell_quote("it's"), r"'it'\''s'");
    }
}
