//! `opdump compare --rank all` (or `--rank 0-7,37`): compares each rank
//! pair both dumps have, `--jobs` pairs at a time, and reports per rank and
//! over the fleet.
//!
//! Each job loads one pair, judges it, keeps the pair's row and drops the
//! rest before taking the next, so the peak memory stays near `--jobs`
//! pairs whatever the number of ranks.

use std::collections::BTreeSet;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use std::time::Instant;

use opdump_format::ranges::IntSet;
use opdump_load::{scan, DumpIndex};

use crate::app::error::{CliError, Result};
use crate::app::output;
use crate::app::print::print_report;
use crate::app::progress::Progress;
use crate::cli::{CompareArgs, RankChoice};
use crate::commands::compare;
use crate::report::compare::model::CompareReport;
use crate::report::fleet::{self, FleetReport, RankRow};

/// The arguments, and both dumps' files (scanned once for every rank).
struct Scanned<'a> {
    args: &'a CompareArgs,
    a: DumpIndex,
    b: DumpIndex,
}

/// The ranks to compare, and those asked for that one dump lacks.
struct RankPlan {
    common: Vec<u32>,
    only_in_a: Vec<u32>,
    only_in_b: Vec<u32>,
}

fn plan(ra: &BTreeSet<u32>, rb: &BTreeSet<u32>, wanted: Option<&IntSet>) -> RankPlan {
    let keep = |r: &&u32| wanted.is_none_or(|set| set.contains(i64::from(**r)));
    RankPlan {
        common: ra.intersection(rb).filter(keep).copied().collect(),
        only_in_a: ra.difference(rb).filter(keep).copied().collect(),
        only_in_b: rb.difference(ra).filter(keep).copied().collect(),
    }
}

/// Compares one rank pair the way `compare --rank N` does and keeps its row.
fn judge_rank(dumps: &Scanned, rank: u32, progress: &Progress) -> RankRow {
    let a = dumps.args;
    let judged = a.options().and_then(|mut opts| {
        opts.rank = Some(rank);
        compare::run_scanned(&dumps.a, &dumps.b, opts, progress, Instant::now())
    });
    match judged {
        Ok(c) => RankRow::of(
            rank,
            &CompareReport::build(&c, a.steps.clone(), a.ignore.clone()),
        ),
        Err(e) => RankRow::failed(rank, e.to_string()),
    }
}

/// Runs `judge_rank` over `ranks` on `jobs` threads taking ranks from a
/// shared counter; rows come back in any order.
fn judge_all(dumps: &Scanned, ranks: &[u32], jobs: usize) -> Vec<RankRow> {
    let next = AtomicUsize::new(0);
    let rows = Mutex::new(Vec::with_capacity(ranks.len()));
    // Several pairs at once would interleave their progress lines.
    let progress = Progress::new(false);
    std::thread::scope(|s| {
        for _ in 0..jobs.min(ranks.len()) {
            s.spawn(|| {
                while let Some(&rank) = ranks.get(next.fetch_add(1, Ordering::Relaxed)) {
                    let row = judge_rank(dumps, rank, &progress);
                    rows.lock().unwrap_or_else(|p| p.into_inner()).push(row);
                }
            });
        }
    });
    rows.into_inner().unwrap_or_else(|p| p.into_inner())
}

fn default_jobs() -> usize {
    std::thread::available_parallelism().map_or(1, |n| n.get())
}

/// `opdump compare --rank all|SET`: returns the exit status.
pub(crate) fn execute(a: CompareArgs) -> Result<u8> {
    if a.out.is_some() {
        return Err(CliError::new(
            "--out writes one rank pair's tables: with --rank all or a set of ranks use --json or --html, or choose one rank with --rank N",
        ));
    }
    // Parse the options once up front, so a bad one is one usage error, not
    // an error row per rank.
    a.options()?;
    let wanted = match &a.rank {
        Some(RankChoice::Set(set)) => Some(set),
        _ => None,
    };
    let dumps = Scanned {
        args: &a,
        a: scan(&a.dump_a)?,
        b: scan(&a.dump_b)?,
    };
    let p = plan(&dumps.a.ranks(), &dumps.b.ranks(), wanted);
    if p.common.is_empty() {
        return Err(CliError::new(format!(
            "the dumps share no rank{} (A has {}, B has {}); dump the same ranks on both sides (OPDUMP_RANKS), or name ranks both have with --rank",
            if wanted.is_some() { " in --rank" } else { "" },
            crate::report::format::rank_list(&p.only_in_a),
            crate::report::format::rank_list(&p.only_in_b)
        )));
    }
    let jobs = a.jobs.map_or_else(default_jobs, |n| n as usize);
    let rows = judge_all(&dumps, &p.common, jobs);
    let report = FleetReport::build(
        a.dump_a.display().to_string(),
        a.dump_b.display().to_string(),
        rows,
        p.only_in_a,
        p.only_in_b,
        wanted.is_some(),
    );
    if let Some(path) = &a.html {
        output::write_bytes(path, fleet::html::render(&report).as_bytes())?;
    }
    print_report(a.json, &report, fleet::render)?;
    Ok(report.exit_status)
}
