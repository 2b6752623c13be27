//! The report of `opdump ranks`: its model (the JSON of `--json`), made
//! from the judge's vote.

use opdump_judge::vote::{Disagreement, Keys, OddRank, VoteCounts, Voter};
use opdump_judge::{Interner, NO_ID};
use serde::Serialize;

/// What `opdump ranks` found (the JSON of `--json`).
#[derive(Serialize, Debug)]
pub struct RanksReport {
    pub format: &'static str,
    pub version: u32,
    pub path: String,
    pub ranks: Vec<u32>,
    pub step_first: Option<i64>,
    pub step_last: Option<i64>,
    pub tensors: TensorCounts,
    /// Ranks that left the majority on some tensor, lowest rank first.
    pub by_rank: Vec<RankCount>,
    /// The first finding (by step, then call order): the verdict.
    pub first: Option<Finding>,
    /// The first findings, in order, `first` among them.
    pub findings: Vec<Finding>,
    /// 0 every tensor agrees (or has no majority and may differ), 1 a
    /// finding.
    pub exit_status: u8,
    pub notes: Vec<String>,
}

/// Tensors compared, each one key ([`opdump_judge::vote::TensorKey`]) measured on several
/// ranks.
#[derive(Serialize, Debug, Default, Clone, Copy)]
pub struct TensorCounts {
    /// Measured on at least two ranks.
    pub compared: u64,
    /// The same fingerprint on every rank that measured it.
    pub agree: u64,
    /// A strict majority agrees; the other ranks are odd ones out.
    pub odd: u64,
    /// Optimizer tensors with no strict majority (two ranks that differ,
    /// an even split): they must agree, and no rank can be named.
    pub split: u64,
    /// Forward tensors with no strict majority: not judged, since buffers
    /// (running statistics) may differ per rank.
    pub not_judged: u64,
    /// Measured on one rank only.
    pub one_rank: u64,
}

#[derive(Serialize, Debug, Clone)]
pub struct RankCount {
    pub rank: u32,
    /// Tensors on which this rank left the majority.
    pub odd: u64,
    pub first_step: i64,
}

/// One rank's value of a tensor.
#[derive(Serialize, Debug, Clone)]
pub struct RankValue {
    pub rank: u32,
    /// 16 hex digits, `0x` first (JSON numbers lose bits past 2^53).
    pub fingerprint: String,
    pub seq: i64,
    pub module: Option<String>,
}

/// A tensor whose ranks disagree.
#[derive(Serialize, Debug, Clone)]
pub struct Finding {
    /// `odd` (a strict majority agrees) or `split` (none does).
    pub kind: &'static str,
    pub step: i64,
    pub phase: &'static str,
    pub op: String,
    pub overload: String,
    pub name: String,
    pub role: &'static str,
    pub arg: String,
    pub list_index: Option<i32>,
    /// Which call of this op on this tensor in the step (0: the first).
    pub occurrence: u32,
    /// Ranks outside the majority (`odd`), empty for `split`.
    pub odd_ranks: Vec<u32>,
    pub majority_fingerprint: Option<String>,
    pub majority_ranks: Vec<u32>,
    /// The lowest rank of the majority (of all ranks, for `split`).
    pub reference: RankValue,
    /// The ranks outside the majority (every rank, for `split`).
    pub others: Vec<RankValue>,
}

fn hex(fp: u64) -> String {
    format!("0x{fp:016x}")
}

impl From<VoteCounts> for TensorCounts {
    fn from(c: VoteCounts) -> Self {
        TensorCounts {
            compared: c.compared,
            agree: c.agree,
            odd: c.odd,
            split: c.split,
            not_judged: c.not_judged,
            one_rank: c.one_rank,
        }
    }
}

impl From<OddRank> for RankCount {
    fn from(r: OddRank) -> Self {
        RankCount {
            rank: r.rank,
            odd: r.odd,
            first_step: r.first_step,
        }
    }
}

impl RankValue {
    fn of(v: &Voter, strings: &Interner) -> Self {
        RankValue {
            rank: v.rank,
            fingerprint: hex(v.fingerprint),
            seq: v.seq,
            module: (v.module != NO_ID).then(|| strings.get(v.module).to_string()),
        }
    }
}

impl Finding {
    /// The report's form of a disagreement, its strings looked up in `keys`.
    pub fn of(d: &Disagreement, keys: &Keys) -> Self {
        let s = |id: u32| keys.strings.get(id).to_string();
        let k = &d.key;
        Finding {
            kind: if d.majority.is_some() { "odd" } else { "split" },
            step: d.step,
            phase: k.phase.as_str(),
            op: s(k.op),
            overload: s(k.overload),
            name: s(k.name),
            role: k.role.as_str(),
            arg: s(k.arg),
            list_index: (k.list_index >= 0).then_some(k.list_index),
            occurrence: d.occurrence,
            odd_ranks: d.odd_ranks.clone(),
            majority_fingerprint: d.majority.map(hex),
            majority_ranks: d.majority_ranks.clone(),
            reference: RankValue::of(&d.reference, &keys.strings),
            others: d
                .others
                .iter()
                .map(|v| RankValue::of(v, &keys.strings))
                .collect(),
        }
    }
}
