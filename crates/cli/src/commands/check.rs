//! `opdump check DUMP`: the calls `OPDUMP_CHECK` found off, read from the
//! dump's `checks/` files (see `opdump_load::tables`), worst first, each with the
//! `opdump repro` command that rebuilds it, and the signatures never
//! checked; exit status 1 when one failed, else 3 when signatures were
//! never checked.

use std::path::Path;

use crate::app::error::{CliError, Result};
use crate::app::output;
use crate::app::print::print_report;
use crate::cli::{CheckArgs, RankChoice};
use crate::report::check::html as check_html;
use crate::report::check::{self, CheckReport};
use opdump_load::tables::{self as checks, CheckFile};

/// Reads the check results of `dump`, of the ranks `rank` chooses
/// (default: every rank).
pub fn run(dump: &Path, rank: Option<&RankChoice>) -> Result<CheckReport> {
    let listed = checks::list_check_files(dump)?;
    if listed.is_empty() {
        return Err(CliError::new(format!(
            "{}: no check results (no checks/rank=<R>/part-*.jsonl): run the job with OPDUMP_CHECK=1",
            dump.display()
        )));
    }
    let present: Vec<u32> = listed.keys().copied().collect();
    let wanted: Vec<u32> = match rank {
        None | Some(RankChoice::All) => present.clone(),
        Some(RankChoice::One(r)) => vec![*r],
        Some(RankChoice::Set(set)) => present
            .iter()
            .copied()
            .filter(|r| set.contains(i64::from(*r)))
            .collect(),
    };
    let missing: Vec<u32> = match rank {
        Some(RankChoice::One(r)) if !listed.contains_key(r) => vec![*r],
        _ => Vec::new(),
    };
    if !missing.is_empty() || wanted.is_empty() {
        // The rank --rank names, or the set's ranks, none of which has any.
        let which = missing
            .first()
            .map_or_else(|| "in the set".to_string(), u32::to_string);
        return Err(CliError::new(format!(
            "{}: no check results of rank {which} (ranks present: {}); choose one of those with --rank, or --rank all",
            dump.display(),
            present
                .iter()
                .map(u32::to_string)
                .collect::<Vec<_>>()
                .join(", ")
        )));
    }
    let mut files: Vec<CheckFile> = Vec::new();
    for r in &wanted {
        for path in &listed[r] {
            files.push(checks::read_check_file(path, *r)?);
        }
    }
    Ok(CheckReport::build(dump, &files, Vec::new()))
}

/// `opdump check`: reads, writes the HTML page when asked, prints the
/// report; returns the exit status.
pub(crate) fn execute(a: CheckArgs) -> Result<u8> {
    let r = run(&a.dump, a.rank.as_ref())?;
    if let Some(path) = &a.html {
        output::write_bytes(path, check_html::render(&r).as_bytes())?;
    }
    print_report(a.json, &r, check::render)?;
    Ok(r.exit_status)
}
