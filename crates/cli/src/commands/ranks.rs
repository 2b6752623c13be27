//! `opdump ranks DUMP`: the ranks of one data-parallel job against each
//! other, by fingerprint: read through the loader
//! ([`opdump_load::rank_keys`]), voted by the judge
//! ([`opdump_judge::vote`]), reported by [`crate::report::ranks`].
//!
//! Memory: the dump is read in windows of whole steps, chosen from the row
//! groups' `step` statistics so that the rows of one window stay under a
//! budget; only the voting rows of a window are held, as small entries.
//! Nothing outside the window is held but the counts and the first
//! findings.

use std::path::Path;

use opdump_judge::vote::{number_occurrences, Entry, Keys, Tally};
use opdump_load::rank_keys::{index_ranks, read_rank_window, windows, RankIndex, Seen, Sink};
use opdump_load::scan;

use crate::app::error::{CliError, Result};
use crate::app::print::print_report;
use crate::app::progress::Progress;
use crate::cli::RanksArgs;
use crate::report::format::{plural, rank_list};
use crate::report::ranks::{render, Finding, RanksReport};

/// Rows (of every kind) of the row groups one window reads, summed over
/// ranks. Only voting rows become entries (48 bytes), so a window holds far
/// less than this many; a single step larger than the budget is still read
/// whole, since a step is never split.
const WINDOW_ROWS: u64 = 8 << 20;

/// How many findings the report lists.
const LISTED: usize = 10;

/// Compares the ranks of the dump at `dir`.
pub fn run(dir: &Path, progress: &Progress) -> Result<RanksReport> {
    run_with_budget(dir, progress, WINDOW_ROWS)
}

/// What the windows read: the vote, the keys it names, the rows seen and
/// the steps.
struct Read {
    tally: Tally,
    keys: Keys,
    seen: Seen,
    steps: Option<(i64, i64)>,
}

/// [`run`] with another window budget (tests read many small windows).
pub fn run_with_budget(dir: &Path, progress: &Progress, budget: u64) -> Result<RanksReport> {
    let index = index_ranks(&scan(dir)?)?;
    check_readable(dir, &index)?;
    let read = vote_windows(&index, budget, progress)?;
    let mut notes: Vec<String> = index
        .other_processes
        .iter()
        .map(|o| {
            format!(
                "rank {}: {} processes wrote into it; only pid {} (the most op calls) was read",
                o.rank, o.processes, o.pid_read
            )
        })
        .collect();
    let Read {
        tally,
        keys,
        seen,
        steps,
    } = read;
    check_seen(dir, &seen)?;
    let unmeasured: Vec<u32> = index
        .ranks
        .iter()
        .map(|r| r.rank)
        .filter(|r| !seen.ranks_with_fp.contains(r))
        .collect();
    check_compared(dir, &unmeasured, &tally)?;
    notes.extend(notes_on(&unmeasured, &seen, &tally));
    let findings: Vec<Finding> = tally.first.iter().map(|d| Finding::of(d, &keys)).collect();
    Ok(RanksReport {
        format: "opdump-ranks",
        version: 1,
        path: dir.display().to_string(),
        ranks: index.ranks.iter().map(|r| r.rank).collect(),
        step_first: steps.map(|s| s.0),
        step_last: steps.map(|s| s.1),
        tensors: tally.counts.into(),
        by_rank: tally.by_rank.into_values().map(Into::into).collect(),
        first: findings.first().cloned(),
        findings,
        exit_status: u8::from(tally.total > 0),
        notes,
    })
}

/// Reads the dump window by window, every rank's voting rows of the
/// window's steps, and votes on them.
fn vote_windows(index: &RankIndex, budget: u64, progress: &Progress) -> Result<Read> {
    let wins = windows(&index.groups(), budget);
    let mut read = Read {
        tally: Tally::new(LISTED),
        keys: Keys::default(),
        seen: Seen::default(),
        steps: None,
    };
    for (w, &win) in wins.iter().enumerate() {
        let mut entries: Vec<Entry> = Vec::new();
        for r in &index.ranks {
            progress.update(|| format!("ranks: window {}/{}, rank {}", w + 1, wins.len(), r.rank));
            let start = entries.len();
            let mut sink = Sink {
                keys: &mut read.keys,
                seen: &mut read.seen,
                out: &mut entries,
            };
            read_rank_window(r, win, &mut sink)?;
            number_occurrences(&mut entries[start..]);
        }
        if let (Some(a), Some(b)) = (
            entries.iter().map(|e| e.step).min(),
            entries.iter().map(|e| e.step).max(),
        ) {
            read.steps = Some(read.steps.map_or((a, b), |(lo, hi)| (lo.min(a), hi.max(b))));
        }
        read.tally.vote_window(&mut entries, &read.keys);
    }
    Ok(read)
}

/// Two ranks or more, with names and fingerprints in their schema.
fn check_readable(dir: &Path, index: &RankIndex) -> Result<()> {
    let shown = dir.display();
    if index.ranks.len() < 2 {
        let r = index.ranks.first().map_or(0, |r| r.rank);
        return Err(CliError::new(format!(
            "{shown}: only rank {r} has files; opdump ranks compares the ranks of one data-parallel job (at least 2)"
        )));
    }
    if !index.any_name {
        return Err(CliError::new(format!(
            "{shown}: no name column: this dump's schema names no parameters (a newer opdump writes it); dump the job again with this opdump"
        )));
    }
    if !index.any_fingerprint {
        return Err(CliError::new(format!(
            "{shown}: no fingerprints: the dump has no fingerprint column (written by an opdump before schema 4); run the job again with this version"
        )));
    }
    Ok(())
}

/// Some voting row, and some with a fingerprint, were read.
fn check_seen(dir: &Path, seen: &Seen) -> Result<()> {
    let shown = dir.display();
    if seen.named == 0 {
        return Err(CliError::new(format!(
            "{shown}: no parameter or gradient rows (the name column is empty: the job ran without OPDUMP_MODULES, outside Python, or recorded no optimizer step or forward); run the Python job again with OPDUMP_MODULES=1 over steps that include a forward and an optimizer step"
        )));
    }
    if seen.with_fp == 0 {
        return Err(CliError::new(format!(
            "{shown}: no fingerprints: {} parameter and gradient rows, none with a fingerprint (written with OPDUMP_SKETCH=0, or by an opdump that does not compute them yet); run the job again with OPDUMP_SKETCH=16",
            seen.named
        )));
    }
    Ok(())
}

/// The notes on what was left out or not judged.
fn notes_on(unmeasured: &[u32], seen: &Seen, tally: &Tally) -> Vec<String> {
    let mut notes = Vec::new();
    if !unmeasured.is_empty() {
        notes.push(format!(
            "rank{} {} not compared: no fingerprints",
            plural(unmeasured.len()),
            rank_list(unmeasured)
        ));
    }
    if seen.with_fp < seen.named {
        notes.push(format!(
            "{} of {} parameter and gradient rows have no fingerprint (not measured): left out",
            seen.named - seen.with_fp,
            seen.named
        ));
    }
    let c = &tally.counts;
    if c.not_judged > 0 {
        notes.push(format!(
            "{} tensor{} read in forward differ with no majority: not judged (buffers such as running statistics may differ per rank)",
            c.not_judged,
            if c.not_judged == 1 { "" } else { "s" }
        ));
    }
    if c.one_rank > 0 {
        notes.push(format!(
            "{} tensor{} measured on one rank only: nothing to compare with",
            c.one_rank,
            if c.one_rank == 1 { "" } else { "s" }
        ));
    }
    if tally.total > tally.first.len() as u64 {
        notes.push(format!(
            "{} tensors differ in all; the first {} are listed",
            tally.total,
            tally.first.len()
        ));
    }
    notes
}

/// The verdict "ranks agree" needs every rank compared: a rank without
/// fingerprints, or no tensor measured on two ranks, is an error unless a
/// finding among the others already stands (`unmeasured` is then a note).
fn check_compared(dir: &Path, unmeasured: &[u32], tally: &Tally) -> Result<()> {
    let shown = dir.display();
    if tally.counts.compared == 0 && unmeasured.is_empty() {
        return Err(CliError::new(format!(
            "{shown}: nothing compared: no parameter or gradient was measured on two ranks at the same step and call; record the same steps on every rank (OPDUMP_STEPS, OPDUMP_RANKS)"
        )));
    }
    if tally.total == 0 && !unmeasured.is_empty() {
        let n = unmeasured.len();
        return Err(CliError::new(format!(
            "{shown}: rank{} {} cannot be compared: {} no fingerprints (written with OPDUMP_SKETCH=0, or recorded no optimizer step or forward); no verdict on the ranks: run the job again with OPDUMP_SKETCH=16 on every rank",
            plural(n),
            rank_list(unmeasured),
            if n == 1 { "it has" } else { "they have" }
        )));
    }
    Ok(())
}

/// `opdump ranks`: compares the ranks of one dump and prints the report.
pub(crate) fn execute(a: RanksArgs) -> Result<u8> {
    let progress = Progress::auto();
    let r = run(&a.dump, &progress)?;
    progress.finish();
    print_report(a.json, &r, render)?;
    Ok(r.exit_status)
}

#[cfg(test)]
mod tests {
    use super::*;
    use opdump_testkit::ranks_job::{write_job, Flip, Job};

    #[test]
    fn small_windows_find_the_same() {
        let t = tempfile::tempdir().unwrap();
        write_job(
            t.path(),
            &Job {
                ranks: 4,
                flip: Some(Flip {
                    rank: 3,
                    step: 1,
                    layer: 0,
                }),
                ..Job::default()
            },
        )
        .unwrap();
        let whole = run_with_budget(t.path(), &Progress::new(false), u64::MAX).unwrap();
        let small = run_with_budget(t.path(), &Progress::new(false), 1).unwrap();
        let a = serde_json::to_value(&whole).unwrap();
        let b = serde_json::to_value(&small).unwrap();
        assert_eq!(a, b);
        assert_eq!(a["first"]["odd_ranks"], serde_json::json!([3]));
    }
}
