//! `opdump compare`: finds both dumps' files, picks the rank, loads both in
//! parallel, and hands them to the judge.

use opdump_judge::{compare_dumps, CompareSettings, Compared, Dump};
use opdump_load::{load, scan, DumpIndex};

use crate::app::error::{CliError, Result};
use crate::app::output;
use crate::app::print::print_report;
use crate::app::progress::{timing, Progress};
use crate::cli::{CompareArgs, CompareOptions};
use crate::report::compare::model::{AlignedPairs, CompareReport};
use crate::report::compare::{html, parquet, text as terminal};
use crate::report::json;

/// Picks the rank to compare.
fn choose_rank(
    ia: &DumpIndex,
    ib: &DumpIndex,
    want: Option<u32>,
    notes: &mut Vec<String>,
) -> Result<(u32, u32)> {
    let (ra, rb) = (ia.ranks(), ib.ranks());
    let list = |s: &std::collections::BTreeSet<u32>| {
        s.iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(r) = want {
        for (idx, ranks) in [(ia, &ra), (ib, &rb)] {
            if !ranks.contains(&r) {
                return Err(CliError::new(format!(
                    "{}: no rank {r} (ranks present: {}); choose one of those with --rank",
                    idx.dir.display(),
                    list(ranks)
                )));
            }
        }
        return Ok((r, r));
    }
    let common: Vec<u32> = ra.intersection(&rb).copied().collect();
    if let Some(&r) = common.first() {
        if common.len() > 1 {
            notes.push(format!(
                "comparing rank {r}; both dumps also have ranks {} (choose with --rank)",
                {
                    common[1..]
                        .iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
        return Ok((r, r));
    }
    if ra.len() == 1 && rb.len() == 1 {
        let (x, y) = (
            *ra.iter().next().unwrap_or(&0),
            *rb.iter().next().unwrap_or(&0),
        );
        notes.push(format!("comparing rank {x} of A with rank {y} of B"));
        return Ok((x, y));
    }
    Err(CliError::new(format!(
        "the dumps share no rank (A has {}, B has {}); choose one with --rank",
        list(&ra),
        list(&rb)
    )))
}

pub(crate) fn run(opts: CompareOptions, progress: &Progress) -> Result<Compared> {
    let t0 = std::time::Instant::now();
    progress.phase("reading footers");
    let ia = scan(&opts.dump_a)?;
    let ib = scan(&opts.dump_b)?;
    run_scanned(&ia, &ib, opts, progress, t0)
}

/// As [`run`], on dumps already scanned (a fleet compare scans each dump
/// once for all its ranks).
pub(crate) fn run_scanned(
    ia: &DumpIndex,
    ib: &DumpIndex,
    opts: CompareOptions,
    progress: &Progress,
    t0: std::time::Instant,
) -> Result<Compared> {
    let mut notes = Vec::new();
    let (rank_a, rank_b) = choose_rank(ia, ib, opts.rank, &mut notes)?;
    let (a, b) = std::thread::scope(|s| {
        let ha = s.spawn(|| load(ia, rank_a, progress, "A"));
        let b = load(ib, rank_b, progress, "B");
        (ha.join(), b)
    });
    let a = match a {
        Ok(r) => r?,
        Err(e) => std::panic::resume_unwind(e),
    };
    let b = b?;
    // Each dump's decoding thread allocated the batches that the reading
    // thread freed: glibc keeps that memory in the decoding threads'
    // arenas, free but resident, unless told to give it back.
    #[cfg(all(target_os = "linux", target_env = "gnu"))]
    // SAFETY: malloc_trim only returns free memory to the system.
    unsafe {
        libc::malloc_trim(0);
    }
    timing("read", t0);
    for d in [&a, &b] {
        notes.extend(d.schema_note());
    }
    if a.has_modules != b.has_modules {
        let (with, without) = if a.has_modules { (&a, &b) } else { (&b, &a) };
        notes.push(format!(
            "{} has module paths and {} has none: calls are aligned without them",
            with.path.display(),
            without.path.display()
        ));
    }
    for d in [&a, &b] {
        if d.skipped_other_pids > 0 {
            notes.push(format!(
                "{}: left out {} op calls of other processes of rank {} (kept pid {})",
                d.path.display(),
                d.skipped_other_pids,
                d.rank,
                d.pid.map_or("?".into(), |p| p.to_string())
            ));
        }
    }
    for d in [&a, &b] {
        notes.extend(online_verdict(d));
    }
    let settings = CompareSettings {
        filter: opts.filter,
        tol: opts.tol,
        top: opts.top,
        force: opts.force,
        context_before: None,
    };
    Ok(compare_dumps(a, b, settings, notes, progress)?)
}

/// What a run judged against a reference while it ran (OPDUMP_REFERENCE)
/// stored in its dump: the `final` line of
/// `verdicts/rank=<R>/part-<pid>.jsonl` of the process loaded, as a note.
fn online_verdict(d: &Dump) -> Option<String> {
    let (file, last) = opdump_load::tables::final_verdict(&d.path, d.rank, d.pid?)?;
    let named = last
        .headline
        .map(|h| format!(" at {} (step {}, seq {})", h.op, h.step, h.seq_b))
        .unwrap_or_default();
    Some(format!(
        "{} was judged against a reference dump while it ran (OPDUMP_REFERENCE): {}{named}; see {}",
        d.path.display(),
        last.outcome,
        file.display()
    ))
}

/// `opdump compare`: compares, writes the report files asked for, prints
/// the report; returns the exit status.
pub(crate) fn execute(a: CompareArgs) -> Result<u8> {
    let opts = a.options()?;
    let progress = Progress::auto();
    let t0 = std::time::Instant::now();
    let c = run(opts, &progress)?;
    timing("total compare", t0);
    let t0 = std::time::Instant::now();
    let report = CompareReport::build(&c, a.steps.clone(), a.ignore.clone());
    let pairs = AlignedPairs::of(&c);
    timing("report", t0);
    // Report files: written beside their target and renamed over it, mode
    // 0600, never through a planted symlink (see `output`).
    if let Some(dir) = &a.out {
        parquet::write(&pairs, dir, &progress)?;
        let mut buf = Vec::new();
        json::write(&report, &mut buf)?;
        output::write_bytes_in(dir, "compare.json", &buf)?;
    }
    if let Some(path) = &a.html {
        output::write_bytes(path, html::render(&report, &pairs).as_bytes())?;
    }
    progress.finish();
    print_report(a.json, &report, terminal::render)?;
    Ok(report.exit_status)
}
