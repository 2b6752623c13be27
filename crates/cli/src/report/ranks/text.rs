//! The ranks report as text.

use std::fmt::Write as _;

use super::model::{Finding, RankValue, RanksReport};
use crate::app::text::{op_label, Clean};
use crate::report::format::{self, plural, rank_list, thousands};

/// Where the tensor sits in its call: `input self[3]`.
fn place(f: &Finding) -> String {
    let idx = f.list_index.map(|i| format!("[{i}]")).unwrap_or_default();
    format!("{} {}{idx}", f.role, Clean(&f.arg))
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
            "Odd rank{} out: {}, step {}, {}",
            plural(odd.len()),
            format::ranks(odd),
            f.step,
            f.phase
        );
    } else {
        let all: Vec<u32> = f.others.iter().map(|v| v.rank).collect();
        let _ = writeln!(
            o,
            "Ranks {} differ, with no majority to name one: step {}, {}",
            rank_list(&all),
            f.step,
            f.phase
        );
    }
    let _ = writeln!(o, "  op           {}", op_label(&f.op, &f.overload));
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
            "  majority     {}: fingerprint {fp} (rank {}: seq {}, module {})",
            format::ranks(&f.majority_ranks),
            r.rank,
            r.seq,
            module(r)
        );
    }
}

/// The text report.
pub fn render(r: &RanksReport) -> String {
    let mut o = String::new();
    header(&mut o, r);
    let Some(first) = &r.first else {
        let _ = writeln!(
            o,
            "Verdict: ranks agree: every tensor compared has the same fingerprint on all ranks that measured it (or no majority, where it may differ)."
        );
        return o;
    };
    render_first(&mut o, first);
    by_rank(&mut o, r);
    findings(&mut o, r);
    let _ = writeln!(o);
    verdict(&mut o, first);
    o
}

/// The dump, its ranks and steps, the tensors compared, the notes.
fn header(o: &mut String, r: &RanksReport) {
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
        rank_list(&r.ranks)
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
}

fn by_rank(o: &mut String, r: &RanksReport) {
    if r.by_rank.is_empty() {
        return;
    }
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

/// The first findings, one line each, when there is more than one.
fn findings(o: &mut String, r: &RanksReport) {
    if r.findings.len() <= 1 {
        return;
    }
    let _ = writeln!(o, "\nFirst tensors that differ:");
    let _ = writeln!(
        o,
        "  {:>6}  {:<9}  {:<10}  {:<32}  tensor",
        "step", "phase", "ranks", "op"
    );
    for f in &r.findings {
        let who = if f.kind == "odd" {
            rank_list(&f.odd_ranks)
        } else {
            "split".into()
        };
        let _ = writeln!(
            o,
            "  {:>6}  {:<9}  {:<10}  {:<32}  {} ({})",
            f.step,
            f.phase,
            who,
            op_label(&f.op, &f.overload),
            Clean(&f.name),
            place(f)
        );
    }
}

/// The verdict line, on the first finding.
fn verdict(o: &mut String, first: &Finding) {
    if first.kind == "odd" {
        let _ = writeln!(
            o,
            "Verdict: RANK{} {} DIFFER{}. First at step {} ({}): {}, {} of {}.",
            if first.odd_ranks.len() == 1 { "" } else { "S" },
            rank_list(&first.odd_ranks),
            if first.odd_ranks.len() == 1 { "S" } else { "" },
            first.step,
            first.phase,
            Clean(&first.name),
            place(first),
            op_label(&first.op, &first.overload)
        );
    } else {
        let all: Vec<u32> = first.others.iter().map(|v| v.rank).collect();
        let _ = writeln!(
            o,
            "Verdict: RANKS {} DIFFER (no majority names one). First at step {} ({}): {}, {} of {}.",
            rank_list(&all),
            first.step,
            first.phase,
            Clean(&first.name),
            place(first),
            op_label(&first.op, &first.overload)
        );
    }
}
