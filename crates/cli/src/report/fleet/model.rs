//! `opdump compare --rank all` (or a set of ranks): one row per rank pair,
//! and the fleet verdict over them, as text and as JSON.
//!
//! A row keeps only what the fleet report shows, so that a rank pair's
//! judged dumps can be dropped as soon as the row is made.

use std::fmt::Write as _;

use serde::Serialize;

use crate::app::error::{EXIT_DIVERGED, EXIT_DRIFT, EXIT_ERROR, EXIT_SAME};
use crate::report::compare::model::{finite, CompareReport, OpReport};

/// Identifies the JSON of a fleet compare (a single-rank compare's JSON is
/// `opdump-compare`).
const FORMAT: &str = "opdump-compare-fleet";
const VERSION: u32 = 1;

/// The op call a rank's verdict names.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct Site {
    /// `op.overload`.
    pub op: String,
    pub module: Option<String>,
    pub step: i64,
    /// The call's place in A's call order.
    pub seq_a: i64,
    /// Largest relative error of an output (null when infinite).
    #[serde(serialize_with = "finite")]
    pub rel_err: f64,
    pub tolerance: f64,
}

impl Site {
    fn of(r: &OpReport) -> Self {
        Site {
            op: opdump_judge::full_op_name(&r.op, &r.overload),
            module: r.module.clone(),
            step: r.step_a,
            seq_a: r.seq_a,
            rel_err: r.rel_err,
            tolerance: r.tolerance,
        }
    }

    /// Two ranks show the same fault when it is the same op of the same
    /// module at the same step (its seq may differ between ranks).
    fn same_place(&self, other: &Site) -> bool {
        self.op == other.op && self.module == other.module && self.step == other.step
    }
}

/// One rank pair's outcome.
#[derive(Serialize, Clone, Debug)]
pub struct RankRow {
    pub rank: u32,
    /// `agree`, `introduced`, `drift` or `error`.
    pub verdict: &'static str,
    /// The exit status a single-rank compare of this pair would have.
    pub exit_status: u8,
    /// The op the single-rank report headlines (for `drift`, the first
    /// diverged op).
    pub headline: Option<Site>,
    /// The first op that introduced a divergence, in A's call order: what
    /// the fleet verdict orders ranks by.
    pub first_introduced: Option<Site>,
    /// Calls only in B introduced the divergence before any aligned op.
    pub introduced_by_calls_only_in_b: bool,
    /// Why the pair could not be compared.
    pub error: Option<String>,
}

impl RankRow {
    /// The row of a judged rank pair.
    pub fn of(rank: u32, r: &CompareReport) -> Self {
        let verdict = match r.exit_status {
            EXIT_SAME => "agree",
            EXIT_DIVERGED => "introduced",
            EXIT_DRIFT => "drift",
            _ => "error",
        };
        let headline = r
            .headline
            .as_ref()
            .or(r.first_divergence.as_ref().filter(|_| verdict == "drift"))
            .map(Site::of)
            .or_else(|| r.first_introduced_unmatched.as_ref().map(unmatched_site));
        RankRow {
            rank,
            verdict,
            exit_status: r.exit_status,
            headline,
            first_introduced: r.first_introduced.as_ref().map(Site::of),
            introduced_by_calls_only_in_b: r.first_introduced_unmatched.is_some(),
            error: None,
        }
    }

    /// The row of a rank pair that could not be compared.
    pub fn failed(rank: u32, why: String) -> Self {
        RankRow {
            rank,
            verdict: "error",
            exit_status: EXIT_ERROR,
            headline: None,
            first_introduced: None,
            introduced_by_calls_only_in_b: false,
            error: Some(why),
        }
    }
}

/// The consumer of a tensor that calls only in B changed: where the
/// divergence enters the aligned calls.
fn unmatched_site(u: &crate::report::compare::model::UnmatchedReport) -> Site {
    Site {
        op: opdump_judge::full_op_name(&u.consumer.op, &u.consumer.overload),
        module: u.op.as_ref().and_then(|o| o.module.clone()),
        step: u.consumer.step_a,
        seq_a: u.consumer.seq_a,
        rel_err: u.rel_change,
        tolerance: u.tolerance,
    }
}

/// The earliest introduced divergence over the ranks, and where else it
/// shows.
#[derive(Serialize, Clone, Debug)]
pub struct FirstFault {
    /// The rank where it comes first by (step, seq).
    pub rank: u32,
    pub site: Site,
    /// Every rank whose first introduced divergence is the same op of the
    /// same module at the same step.
    pub ranks: Vec<u32>,
    /// `ranks` holds every judged rank (and more than one).
    pub on_every_rank: bool,
}

/// The verdict over all rank pairs.
#[derive(Serialize, Clone, Debug)]
pub struct FleetVerdict {
    /// `agree`, `introduced`, `drift`, or `error` when some rank pair could
    /// not be compared.
    pub verdict: &'static str,
    pub first_introduced: Option<FirstFault>,
    pub agree: Vec<u32>,
    pub introduced: Vec<u32>,
    pub drift: Vec<u32>,
    pub error: Vec<u32>,
}

/// The JSON of `compare --rank all` (`--json`).
#[derive(Serialize, Clone, Debug)]
pub struct FleetReport {
    pub format: &'static str,
    pub version: u32,
    pub dump_a: String,
    pub dump_b: String,
    /// One row per rank pair compared, by rank.
    pub ranks: Vec<RankRow>,
    /// Ranks asked for that only one dump has.
    pub only_in_a: Vec<u32>,
    pub only_in_b: Vec<u32>,
    /// Ranks in only one dump count as pairs that could not be compared
    /// (exit status 2): set for a rank set the user named, not for `all`.
    pub missing_is_error: bool,
    pub fleet: FleetVerdict,
    /// The worst over ranks: 2 a pair could not be compared, else 1 an op
    /// introduced a divergence, else 3 drift only, else 0.
    pub exit_status: u8,
}

impl FleetReport {
    /// `rows` in any order; `missing_is_error` for ranks the user named.
    pub fn build(
        dump_a: String,
        dump_b: String,
        mut rows: Vec<RankRow>,
        only_in_a: Vec<u32>,
        only_in_b: Vec<u32>,
        missing_is_error: bool,
    ) -> Self {
        rows.sort_by_key(|r| r.rank);
        let fleet = verdict(&rows);
        let missing = missing_is_error && !(only_in_a.is_empty() && only_in_b.is_empty());
        let exit_status = if missing || !fleet.error.is_empty() {
            EXIT_ERROR
        } else if !fleet.introduced.is_empty() {
            EXIT_DIVERGED
        } else if !fleet.drift.is_empty() {
            EXIT_DRIFT
        } else {
            EXIT_SAME
        };
        FleetReport {
            format: FORMAT,
            version: VERSION,
            dump_a,
            dump_b,
            ranks: rows,
            only_in_a,
            only_in_b,
            missing_is_error,
            fleet,
            exit_status,
        }
    }
}

fn ranks_with(rows: &[RankRow], verdict: &str) -> Vec<u32> {
    rows.iter()
        .filter(|r| r.verdict == verdict)
        .map(|r| r.rank)
        .collect()
}

fn verdict(rows: &[RankRow]) -> FleetVerdict {
    let (agree, introduced) = (ranks_with(rows, "agree"), ranks_with(rows, "introduced"));
    let (drift, error) = (ranks_with(rows, "drift"), ranks_with(rows, "error"));
    let judged = rows.len() - error.len();
    let first_introduced = first_fault(rows, judged);
    let verdict = if !error.is_empty() {
        "error"
    } else if !introduced.is_empty() {
        "introduced"
    } else if !drift.is_empty() {
        "drift"
    } else {
        "agree"
    };
    FleetVerdict {
        verdict,
        first_introduced,
        agree,
        introduced,
        drift,
        error,
    }
}

/// The earliest first introduced divergence by (step, seq in A), ties to
/// the lowest rank, and the ranks that show it at the same place.
fn first_fault(rows: &[RankRow], judged: usize) -> Option<FirstFault> {
    let (rank, site) = rows
        .iter()
        .filter_map(|r| r.first_introduced.as_ref().map(|s| (r.rank, s)))
        .min_by_key(|(rank, s)| (s.step, s.seq_a, *rank))?;
    let ranks: Vec<u32> = rows
        .iter()
        .filter(|r| {
            r.first_introduced
                .as_ref()
                .is_some_and(|s| s.same_place(site))
        })
        .map(|r| r.rank)
        .collect();
    Some(FirstFault {
        rank,
        site: site.clone(),
        on_every_rank: ranks.len() == judged && judged > 1,
        ranks,
    })
}

/// `0, 1, 2, 3, 5` -> `0-3, 5`: a thousand ranks stay one short line.
pub fn rank_list(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

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

/// `rank 5`, `ranks 0-3, 5`.
fn ranks_text(ranks: &[u32]) -> String {
    match ranks {
        [one] => format!("rank {one}"),
        _ => format!("ranks {}", rank_list(ranks)),
    }
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
            let _ = writeln!(out, "only in {side} ({kind}): {}", ranks_text(ranks));
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
            ranks_text(&f.introduced)
        ),
        None if !f.drift.is_empty() => format!(
            "fleet: outputs drift beyond tolerance on {}, no op introduced it",
            ranks_text(&f.drift)
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
                let _ = write!(line, "\n  {what}: {}", ranks_text(ranks));
            }
        }
    }
    line.push('\n');
    line
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists_fold_runs() {
        assert_eq!(rank_list(&[0, 1, 2, 3, 5, 7, 8]), "0-3, 5, 7-8");
        assert_eq!(rank_list(&[4]), "4");
        assert_eq!(rank_list(&[]), "");
    }
}
