//! The report of `opdump ranks`: its model (the JSON of `--json`), made
//! from the judge's vote, and its text.

use std::fmt::Write as _;

use opdump_judge::vote::{Disagreement, Keys, OddRank, VoteCounts, Voter};
use opdump_judge::{Interner, NO_ID};
use serde::Serialize;

use crate::app::text::Clean;
use crate::report::compare::text::thousands;

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

/// `1, 2 and 3`.
pub(crate) fn list(ranks: &[u32]) -> String {
    let s: Vec<String> = ranks.iter().map(u32::to_string).collect();
    match s.len() {
        0 => String::new(),
        1 => s[0].clone(),
        n => format!("{} and {}", s[..n - 1].join(", "), s[n - 1]),
    }
}

pub(crate) fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

/// Where the tensor sits in its call: `input self[3]`.
fn place(f: &Finding) -> String {
    let idx = f.list_index.map(|i| format!("[{i}]")).unwrap_or_default();
    format!("{} {}{idx}", f.role, Clean(&f.arg))
}

fn op_name(f: &Finding) -> String {
    format!("{}.{}", Clean(&f.op), Clean(&f.overload))
}

fn module(v: &RankValue) -> String {
    v.module
        .as_deref()
        .map_or("-".into(), |m| Clean(m).to_string())
}

fn render_first(o: &mut String, f: &Finding) {
    let r = &f.reference;
    if f.kind == "odd" {
        let odd = &f.odd_ranks;
        let _ = writeln!(
            o,
            "Odd rank{} out: rank{} {}, step {}, {}",
            plural(odd.len()),
            plural(odd.len()),
            list(odd),
            f.step,
            f.phase
        );
    } else {
        let all: Vec<u32> = f.others.iter().map(|v| v.rank).collect();
        let _ = writeln!(
            o,
            "Ranks {} differ, with no majority to name one: step {}, {}",
            list(&all),
            f.step,
            f.phase
        );
    }
    let _ = writeln!(o, "  op           {}", op_name(f));
    let _ = writeln!(
        o,
        "  tensor       {}  ({}, the op's call #{} on it in the step)",
        Clean(&f.name),
        place(f),
        f.occurrence
    );
    for v in &f.others {
        let _ = writeln!(
            o,
            "  rank {:<7} seq {}  module {}  fingerprint {}",
            v.rank,
            v.seq,
            module(v),
            v.fingerprint
        );
    }
    if let Some(fp) = &f.majority_fingerprint {
        let _ = writeln!(
            o,
            "  majority     ranks {}: fingerprint {fp} (rank {}: seq {}, module {})",
            list(&f.majority_ranks),
            r.rank,
            r.seq,
            module(r)
        );
    }
}

/// The text report.
pub fn render(r: &RanksReport) -> String {
    let mut o = String::new();
    let steps = match (r.step_first, r.step_last) {
        (Some(a), Some(b)) => format!(", steps {a}..{b}"),
        _ => String::new(),
    };
    let _ = writeln!(o, "opdump ranks");
    let _ = writeln!(
        o,
        "  dump     {}  ({} ranks: {}{steps})",
        Clean(&r.path),
        r.ranks.len(),
        list(&r.ranks)
    );
    let c = &r.tensors;
    let _ = writeln!(
        o,
        "  tensors  {} compared (parameters and gradients in the optimizer, parameters read in forward): {} agree, {} with odd ranks out, {} split with no majority",
        thousands(c.compared),
        thousands(c.agree),
        thousands(c.odd),
        thousands(c.split)
    );
    for n in &r.notes {
        let _ = writeln!(o, "  note: {}", Clean(n));
    }
    let _ = writeln!(o);
    let Some(first) = &r.first else {
        let _ = writeln!(
            o,
            "Verdict: ranks agree: every tensor compared has the same fingerprint on all ranks that measured it (or no majority, where it may differ)."
        );
        return o;
    };
    render_first(&mut o, first);
    if !r.by_rank.is_empty() {
        let _ = writeln!(o, "\nTensors that leave the majority, by rank:");
        for b in &r.by_rank {
            let _ = writeln!(
                o,
                "  rank {:<6} {} tensor{}, first at step {}",
                b.rank,
                thousands(b.odd),
                plural(b.odd as usize),
                b.first_step
            );
        }
    }
    if r.findings.len() > 1 {
        let _ = writeln!(o, "\nFirst tensors that differ:");
        let _ = writeln!(
            o,
            "  {:>6}  {:<9}  {:<10}  {:<32}  tensor",
            "step", "phase", "ranks", "op"
        );
        for f in &r.findings {
            let who = if f.kind == "odd" {
                list(&f.odd_ranks)
            } else {
                "split".into()
            };
            let _ = writeln!(
                o,
                "  {:>6}  {:<9}  {:<10}  {:<32}  {} ({})",
                f.step,
                f.phase,
                who,
                op_name(f),
                Clean(&f.name),
                place(f)
            );
        }
    }
    let _ = writeln!(o);
    if first.kind == "odd" {
        let _ = writeln!(
            o,
            "Verdict: RANK{} {} DIFFER{}. First at step {} ({}): {}, {} of {}.",
            if first.odd_ranks.len() == 1 { "" } else { "S" },
            list(&first.odd_ranks),
            if first.odd_ranks.len() == 1 { "S" } else { "" },
            first.step,
            first.phase,
            Clean(&first.name),
            place(first),
            op_name(first)
        );
    } else {
        let all: Vec<u32> = first.others.iter().map(|v| v.rank).collect();
        let _ = writeln!(
            o,
            "Verdict: RANKS {} DIFFER (no majority names one). First at step {} ({}): {}, {} of {}.",
            list(&all),
            first.step,
            first.phase,
            Clean(&first.name),
            place(first),
            op_name(first)
        );
    }
    o
}
