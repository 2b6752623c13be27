//! `opdump summary DUMP`: what one dump holds, and where NaN or Inf first
//! appeared from finite inputs (often the whole answer, no second run
//! needed).

use std::path::Path;

use crate::app::error::EXIT_SAME;
use crate::app::error::{CliError, Result};
use crate::app::output;
use crate::app::print::print_report;
use crate::app::progress::Progress;
use crate::cli::SummaryArgs;
use crate::report::summary::text as summary_text;
use crate::report::summary::{self, summarize, SummaryReport};
use opdump_load::read::{load, scan};

/// Loads each rank (or only `rank`) of the dump in `dir` and summarizes it.
pub fn run(dir: &Path, rank: Option<u32>, progress: &Progress) -> Result<SummaryReport> {
    let index = scan(dir)?;
    let ranks: Vec<u32> = match rank {
        Some(r) if index.ranks().contains(&r) => vec![r],
        Some(r) => {
            return Err(CliError::new(format!(
                "{}: no rank {r} (ranks present: {}); choose one of those with --rank",
                dir.display(),
                index
                    .ranks()
                    .iter()
                    .map(|r| r.to_string())
                    .collect::<Vec<_>>()
                    .join(", ")
            )))
        }
        None => index.ranks().into_iter().collect(),
    };
    let mut out = Vec::new();
    let mut notes = Vec::new();
    for r in ranks {
        let d = load(&index, r, progress, &format!("rank {r}"))?;
        if let Some(n) = d.schema_note() {
            if !notes.contains(&n) {
                notes.push(n);
            }
        }
        if d.skipped_other_pids > 0 {
            notes.push(format!(
                "rank {r}: left out {} op calls of other processes (kept pid {})",
                d.skipped_other_pids,
                d.pid.map_or("?".into(), |p| p.to_string())
            ));
        }
        out.push(summarize(&d));
    }
    progress.finish();
    Ok(SummaryReport {
        format: "opdump-summary",
        version: 1,
        path: dir.display().to_string(),
        ranks: out,
        notes,
    })
}

/// `opdump summary`: describes one dump.
pub(crate) fn execute(a: SummaryArgs) -> Result<u8> {
    let progress = Progress::auto();
    let s = run(&a.dump, a.rank, &progress)?;
    progress.finish();
    // Written beside its target and renamed over it (see `output`).
    if let Some(path) = &a.html {
        output::write_bytes(path, summary::html::render(&s).as_bytes())?;
    }
    print_report(a.json, &s, summary_text::render)?;
    Ok(EXIT_SAME)
}
