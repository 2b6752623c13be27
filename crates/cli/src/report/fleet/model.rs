//! `opdump compare --rank all` (or a set of ranks): one row per rank pair,
//! and the fleet verdict over them: the model (the JSON).
//!
//! A row keeps only what the fleet report shows, so that a rank pair's
//! judged dumps can be dropped as soon as the row is made.

use serde::Serialize;

use opdump_judge::compare::Outcome;

use crate::app::error::EXIT_ERROR;
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
        let verdict = r.outcome.as_str();
        let headline = r
            .headline
            .as_ref()
            .or(r.first_divergence.as_ref().filter(|_| verdict == "drift"))
            .map(Site::of)
            .or_else(|| r.first_introduced_unmatched.as_ref().map(unmatched_site));
        RankRow {
            rank,
            verdict,
            exit_status: r.outcome.exit_status(),
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
            Outcome::Introduced.exit_status()
        } else if !fleet.drift.is_empty() {
            Outcome::DriftOnly.exit_status()
        } else {
            Outcome::Agree.exit_status()
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
