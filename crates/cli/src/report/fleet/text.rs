//! The fleet report as text.

use std::fmt::Write as _;

use super::model::{FirstFault, FleetReport, RankRow, Site};
use crate::report::format::{self, rank_list};

/// `rank 5 only`, `all 8 ranks`, `ranks 2, 5 (2 of 8)`.
fn where_it_shows(f: &FirstFault, judged: usize) -> String {
    if f.on_every_rank {
        format!("on all {judged} ranks")
    } else if f.ranks.len() == 1 {
        format!("on rank {} only", f.ranks[0])
    } else {
        format!(
            "on ranks {} ({} of {judged})",
            rank_list(&f.ranks),
            f.ranks.len()
        )
    }
}

fn site_text(s: &Site) -> String {
    let module = s
        .module
        .as_deref()
        .map_or(String::new(), |m| format!(" in {m}"));
    format!("{}{module} at step {} (seq {})", s.op, s.step, s.seq_a)
}

fn error_text(s: &Site) -> String {
    format!("error {:.3e} vs tolerance {:.3e}", s.rel_err, s.tolerance)
}

/// `width`: the digits of the largest rank, so the verdicts line up.
fn row_line(r: &RankRow, width: usize) -> String {
    let mut line = format!("rank {:>width$}  {:<10}", r.rank, r.verdict);
    if let Some(s) = &r.headline {
        let _ = write!(line, "  {}  {}", site_text(s), error_text(s));
        if r.introduced_by_calls_only_in_b && r.first_introduced.is_none() {
            line.push_str("  (introduced by calls only in B, before this call)");
        }
    }
    if let Some(e) = &r.error {
        let _ = write!(line, "  {e}");
    }
    line.trim_end().to_string()
}

/// The text report: one line per rank, the ranks in one dump only, then
/// the fleet verdict.
pub fn render(r: &FleetReport) -> String {
    let mut out = format!(
        "opdump compare: {} rank pair{} of A {} and B {}\n",
        r.ranks.len(),
        if r.ranks.len() == 1 { "" } else { "s" },
        r.dump_a,
        r.dump_b
    );
    let width = r.ranks.last().map_or(1, |row| row.rank.to_string().len());
    for row in &r.ranks {
        out.push_str(&row_line(row, width));
        out.push('\n');
    }
    let kind = if r.missing_is_error {
        "not compared"
    } else {
        "left out"
    };
    for (side, ranks) in [("A", &r.only_in_a), ("B", &r.only_in_b)] {
        if !ranks.is_empty() {
            let _ = writeln!(out, "only in {side} ({kind}): {}", format::ranks(ranks));
        }
    }
    out.push_str(&verdict_text(r));
    out
}

/// The fleet verdict, with the ranks by verdict unless all agree.
pub fn verdict_text(r: &FleetReport) -> String {
    let f = &r.fleet;
    let judged = r.ranks.len() - f.error.len();
    let mut line = match &f.first_introduced {
        Some(first) => format!(
            "fleet: introduced first on rank {}: {}, {}; {}",
            first.rank,
            site_text(&first.site),
            error_text(&first.site),
            where_it_shows(first, judged)
        ),
        None if !f.introduced.is_empty() => format!(
            "fleet: introduced by calls only in B on {}",
            format::ranks(&f.introduced)
        ),
        None if !f.drift.is_empty() => format!(
            "fleet: outputs drift beyond tolerance on {}, no op introduced it",
            format::ranks(&f.drift)
        ),
        None if judged > 0 => format!("fleet: all {judged} rank pairs agree"),
        None => "fleet: no rank pair could be judged".to_string(),
    };
    // Which ranks fall where, unless every pair agrees (the line said so).
    if f.agree.len() != r.ranks.len() {
        for (what, ranks) in [
            ("introduced", &f.introduced),
            ("drift", &f.drift),
            ("agree", &f.agree),
            ("could not be compared", &f.error),
        ] {
            if !ranks.is_empty() {
                let _ = write!(line, "\n  {what}: {}", format::ranks(ranks));
            }
        }
    }
    line.push('\n');
    line
}
