//! The compare report as text for a terminal.

use std::fmt::Write;

use super::model::{
    CompareReport, DriftSourceReport, DumpInfo, NextStep, OnlyIn, OpReport, StatsReport,
    TensorReport, UnmatchedReport,
};
use crate::app::text::{clean, op_label, Clean};
use crate::report::format::{num, sig, thousands};

fn shape(s: &Option<Vec<i64>>) -> String {
    match s {
        Some(s) => format!(
            "[{}]",
            s.iter()
                .map(|d| d.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
        None => "-".into(),
    }
}

fn dump_line(out: &mut String, side: &str, d: &DumpInfo) {
    let steps = match (d.step_first, d.step_last) {
        (Some(f), Some(l)) if f == l => format!("step {f}"),
        (Some(f), Some(l)) => format!("steps {f}..{l}"),
        _ => "no steps".into(),
    };
    let _ = writeln!(
        out,
        "  {side}  {}  (rank {}, {} file{}, {} op calls, {} top-level, {steps})",
        Clean(&d.path),
        d.rank,
        d.files,
        if d.files == 1 { "" } else { "s" },
        thousands(d.op_calls),
        thousands(d.top_level_calls),
    );
}

fn only_line(out: &mut String, side: &str, o: &OnlyIn) {
    if o.op_calls == 0 {
        let _ = writeln!(out, "  only in {side}: nothing");
        return;
    }
    let ops: Vec<String> = o
        .by_op
        .iter()
        .take(6)
        .map(|c| format!("{} x{}", op_label(&c.op, &c.overload), thousands(c.count)))
        .collect();
    let _ = write!(
        out,
        "  only in {side}: {} op calls in {} subtrees ({} top-level): {}",
        thousands(o.op_calls),
        thousands(o.subtrees),
        thousands(o.top_level),
        ops.join(", ")
    );
    if o.by_op.len() > 6 {
        out.push_str(", ...");
    }
    out.push('\n');
    if !o.steps.is_empty() {
        let _ = writeln!(out, "    steps only in {side}: {:?}", o.steps);
    }
}

fn stats_row(out: &mut String, side: &str, s: &Option<StatsReport>) {
    match s {
        None => {
            let _ = writeln!(out, "        {side}  (absent)");
        }
        Some(s)
            if s.status
                .is_some_and(|st| !matches!(st, "computed" | "reused" | "view"))
                || s.status.is_none() =>
        {
            let _ = writeln!(
                out,
                "        {side}  ({}, numel {})",
                Clean(s.status.unwrap_or("no stats")),
                s.numel
            );
        }
        Some(s) => {
            let _ = writeln!(
                out,
                "        {side} {:>13} {:>13} {:>13} {:>13} {:>13} {:>13} {:>6} {:>6} {:>6} {:>8}",
                sig(s.min),
                sig(s.max),
                sig(s.mean),
                sig(s.std),
                sig(s.l2),
                sig(s.absmax),
                s.nan_count,
                s.posinf_count,
                s.neginf_count,
                s.zero_count
            );
        }
    }
}

fn tensor_block(out: &mut String, t: &TensorReport) {
    let name = match t.list_index {
        Some(i) => format!("{}[{i}]", Clean(&t.arg)),
        None => clean(&t.arg).into_owned(),
    };
    let dtype = match (&t.dtype_a, &t.dtype_b) {
        (Some(x), Some(y)) if x != y => format!("{} vs {}", Clean(x), Clean(y)),
        (Some(x), _) | (None, Some(x)) => clean(x).into_owned(),
        _ => "-".into(),
    };
    let shp = if t.shape_a == t.shape_b {
        shape(&t.shape_a)
    } else {
        format!("{} vs {}", shape(&t.shape_a), shape(&t.shape_b))
    };
    let _ = write!(out, "    {:<6} {:<12} ", t.role, name);
    if let Some(n) = &t.name {
        let _ = write!(out, "{} ", Clean(n));
    }
    let _ = write!(out, "{dtype} {shp}  {}", t.verdict.as_str());
    if t.verdict.as_str() == "identical" && t.evidence == "fingerprint" {
        out.push_str(" (fingerprints equal)");
    }
    // The sketch's estimate next to the statistics' bound.
    let sketch = match &t.sketch {
        Some(s) => format!(", sketch {} low {}", num(s.rel), num(s.rel_low)),
        None => String::new(),
    };
    if matches!(
        t.verdict.as_str(),
        "close" | "diverged" | "rng" | "discontinuous"
    ) {
        let cmp = if t.rel_err > t.allowed { ">" } else { "<=" };
        let _ = write!(
            out,
            "  rel err {} (l2 {}, inf {}{sketch}) {cmp} {} {}",
            num(t.rel_err),
            num(t.rel_l2),
            num(t.rel_linf),
            if t.role == "output" && t.allowed > t.tolerance {
                "allowed"
            } else {
                "tol"
            },
            num(t.allowed)
        );
    } else if let Some(s) = &t.sketch {
        let _ = write!(out, "  sketch {} low {}", num(s.rel), num(s.rel_low));
    }
    out.push('\n');
    stats_row(out, "A", &t.a);
    stats_row(out, "B", &t.b);
    if let Some(e) = &t.exact {
        exact_row(out, e);
    }
}

/// The exact metrics of a captured pair, under its statistics.
fn exact_row(out: &mut String, e: &opdump_judge::exact::ExactMetrics) {
    if e.identical {
        out.push_str("        exact  bitwise identical\n");
        return;
    }
    let ulp = match (e.ulp_median, e.ulp_p99, e.ulp_max) {
        (Some(m), Some(p), Some(x)) => {
            format!("  ulp median {} p99 {} max {}", num(m), num(p), num(x))
        }
        _ => String::new(),
    };
    let idx: Vec<String> = e.worst_index.iter().map(u64::to_string).collect();
    let _ = writeln!(
        out,
        "        exact  max abs {}  max rel {}  rel l2 {}  cosine {:.9}{ulp}  beyond tol {} of {}{}  worst [{}]: A {} B {}",
        num(e.max_abs),
        num(e.max_rel),
        num(e.rel_l2),
        e.cosine,
        thousands(e.beyond_tolerance),
        thousands(e.numel),
        if e.nan_mismatch > 0 { format!(" ({} NaN/Inf on one side)", thousands(e.nan_mismatch)) } else { String::new() },
        idx.join(", "),
        num(e.worst_a),
        num(e.worst_b)
    );
}

/// Where in the model the call ran: its module, the forward call of a
/// backward call, the source line.
fn where_block(out: &mut String, r: &OpReport) {
    if let Some(m) = &r.module {
        let _ = write!(out, "  module  {}", Clean(m));
        if let Some(mb) = &r.module_b {
            let _ = write!(out, "  (B: {})", Clean(mb));
        }
        out.push('\n');
    }
    if let Some(f) = r.fwd_seq {
        let _ = write!(out, "  backward of  ");
        match &r.fwd_op {
            Some(op) => {
                let _ = write!(out, "{} (seq A {f}", Clean(op));
            }
            None => {
                let _ = write!(out, "seq A {f} (not in the dump");
            }
        }
        if let Some(fb) = r.fwd_seq_b {
            let _ = write!(out, ", seq B {fb}");
        }
        out.push(')');
        if let Some(m) = &r.fwd_module {
            let _ = write!(out, " in {}", Clean(m));
        }
        out.push('\n');
    }
    if !r.names.is_empty() {
        let names: Vec<String> = r.names.iter().map(|n| clean(n).into_owned()).collect();
        let _ = writeln!(out, "  names  {}", names.join(", "));
    }
    if let Some(src) = &r.source {
        let _ = writeln!(out, "  source  {}", Clean(src));
    }
}

/// ` in blocks.0.mlp.act` when the call has a module, else nothing.
fn in_module(m: &Option<String>) -> String {
    m.as_ref()
        .map_or(String::new(), |m| format!(" in {}", Clean(m)))
}

fn op_block(out: &mut String, title: &str, r: &OpReport) {
    // An op whose outputs agree is here for an input that differs.
    let input_diverged = r.verdict.as_str() == "ok"
        && r.tensors.iter().any(|t| {
            t.role == "input" && matches!(t.verdict.as_str(), "diverged" | "nan_mismatch")
        });
    let _ = writeln!(
        out,
        "{title}: {}  [{}]",
        r.label(),
        if input_diverged {
            "ok, an input diverged"
        } else {
            r.verdict.as_str()
        }
    );
    for (side, seq, step, phase, parent) in [
        ("A", r.seq_a, r.step_a, r.phase_a, &r.parent_a),
        ("B", r.seq_b, r.step_b, r.phase_b, &r.parent_b),
    ] {
        let parent = match parent {
            Some(p) => format!("parent {} (seq {})", op_label(&p.op, &p.overload), p.seq),
            None => "top-level".into(),
        };
        let _ = writeln!(
            out,
            "  {side}  seq {seq}  step {step}  {phase}  depth {}  {parent}",
            r.depth
        );
    }
    where_block(out, r);
    if !r.ancestors.is_empty() {
        let chain: Vec<String> = r
            .ancestors
            .iter()
            .map(|x| {
                let b = x.seq_b.map_or("-".into(), |s| s.to_string());
                format!("{} (seq {}/{b})", op_label(&x.op, &x.overload), x.seq_a)
            })
            .chain(std::iter::once(format!(
                "{} (seq {}/{})",
                r.label(),
                r.seq_a,
                r.seq_b
            )))
            .collect();
        let _ = writeln!(out, "  chain  {}", chain.join(" > "));
    }
    if r.args_a == r.args_b {
        let _ = writeln!(
            out,
            "  args  {}",
            Clean(if r.args_a.is_empty() { "-" } else { &r.args_a })
        );
    } else {
        let _ = writeln!(out, "  args A  {}", Clean(&r.args_a));
        let _ = writeln!(out, "  args B  {}", Clean(&r.args_b));
    }
    let _ = writeln!(
        out,
        "  error  output rel err {}  tolerance {} ({}, reduction length {})  input rel err {} ({})  amplification {}",
        num(r.rel_err),
        num(r.tolerance),
        Clean(r.compute_dtype.as_deref().unwrap_or("exact")),
        num(r.reduction_length),
        num(r.input_rel_err),
        if r.diverged_input_err > 0.0 {
            format!("diverged inputs {}", num(r.diverged_input_err))
        } else {
            "no input had diverged".to_string()
        },
        num(r.amplification),
    );
    if r.shapes_differ {
        out.push_str("  note  paired by op name: some shapes differ\n");
    }
    let _ = writeln!(
        out,
        "  tensors {:>13} {:>13} {:>13} {:>13} {:>13} {:>13} {:>6} {:>6} {:>6} {:>8}",
        "min", "max", "mean", "std", "l2", "absmax", "nan", "+inf", "-inf", "zeros"
    );
    for t in &r.tensors {
        tensor_block(out, t);
    }
}

fn unmatched_block(out: &mut String, u: &UnmatchedReport) {
    let c = &u.consumer;
    match &u.op {
        Some(o) => {
            let _ = writeln!(
                out,
                "First introduced: {}  [introduced, only in B]",
                op_label(&o.op, &o.overload)
            );
            let parent = match (&o.parent_op, o.parent_seq) {
                (Some(p), Some(s)) => format!("parent {} (seq {s})", Clean(p)),
                _ => "top-level".into(),
            };
            let _ = writeln!(
                out,
                "  B  seq {}  step {}  {}  depth {}  {parent}",
                o.seq, o.step, o.phase, o.depth
            );
            if let Some(m) = &o.module {
                let _ = writeln!(out, "  module  {}", Clean(m));
            }
            let args = u.args.as_deref().unwrap_or("");
            let _ = writeln!(
                out,
                "  args  {}",
                Clean(if args.is_empty() { "-" } else { args })
            );
        }
        None => out.push_str("First introduced: by calls only in B  [introduced, only in B]\n"),
    }
    let _ = writeln!(
        out,
        "  changed  input {} of {} (seq A {}, seq B {}) by rel {} > tol {}; A passes it on unchanged",
        Clean(&c.arg),
        op_label(&c.op, &c.overload),
        c.seq_a,
        c.seq_b,
        num(u.rel_change),
        num(u.tolerance)
    );
    let _ = writeln!(
        out,
        "  B tensor     {:>13} {:>13} {:>13} {:>13} {:>13} {:>13} {:>6} {:>6} {:>6} {:>8}",
        "min", "max", "mean", "std", "l2", "absmax", "nan", "+inf", "-inf", "zeros"
    );
    stats_row(out, "before", &Some(u.before.clone()));
    stats_row(out, "after ", &Some(u.after.clone()));
}

/// Where the first divergence came from: the previous step's optimizer.
fn drift_block(out: &mut String, d: &DriftSourceReport) {
    let _ = writeln!(
        out,
        "  drift source  {} was changed by the optimizer of step {}: it differs where {} first reads it in step {} (as {}), while step {}'s forward and backward agreed; compare the optimizers' calls ({})",
        Clean(&d.parameter),
        d.optimizer_step,
        op_label(&d.read_by.op, &d.read_by.overload),
        d.read_by.step_a,
        Clean(&d.read_by.arg),
        d.optimizer_step,
        Clean(&d.unmatched_calls())
    );
}

/// The text report of a comparison: the dumps, what aligned and how it
/// compared, the first divergence and the first introduced one, the top
/// list, the verdict and the next step.
pub fn render(r: &CompareReport) -> String {
    let mut out = String::new();
    header(&mut out, r);
    first_blocks(&mut out, r);
    top_list(&mut out, r);
    out.push('\n');
    verdict_line(&mut out, r);
    if let Some(n) = &r.next {
        next_block(&mut out, n);
    }
    out
}

/// The dumps, what aligned, and the verdict counts.
fn header(out: &mut String, r: &CompareReport) {
    out.push_str("opdump compare\n");
    dump_line(out, "A", &r.dump_a);
    dump_line(out, "B", &r.dump_b);
    let _ = writeln!(
        out,
        "  aligned: {} op calls ({} top-level), {} tensor pairs{}",
        thousands(r.aligned.op_calls),
        thousands(r.aligned.top_level_calls),
        thousands(r.aligned.tensor_pairs),
        if r.aligned.shape_differs > 0 {
            format!(
                ", {} paired with different shapes",
                thousands(r.aligned.shape_differs)
            )
        } else {
            String::new()
        }
    );
    only_line(out, "A", &r.only_in_a);
    only_line(out, "B", &r.only_in_b);
    if r.aligned.ignored_a + r.aligned.ignored_b > 0 {
        let _ = writeln!(
            out,
            "  ignored: {} op calls in A, {} in B",
            thousands(r.aligned.ignored_a),
            thousands(r.aligned.ignored_b)
        );
    }
    let counts = |m: &std::collections::BTreeMap<&'static str, u64>| {
        m.iter()
            .filter(|(_, &n)| n > 0)
            .map(|(k, n)| format!("{k} {}", thousands(*n)))
            .collect::<Vec<_>>()
            .join(", ")
    };
    let _ = writeln!(out, "  tensor pairs: {}", counts(&r.tensor_verdicts));
    if r.aligned.dtype_differs > 0 {
        let _ = writeln!(
            out,
            "    dtypes differ in {} pairs (not a divergence by itself)",
            thousands(r.aligned.dtype_differs)
        );
    }
    let _ = writeln!(out, "  op calls: {}", counts(&r.op_verdicts));
    for n in &r.notes {
        let _ = writeln!(out, "  note: {}", Clean(n));
    }
    out.push('\n');
}

/// The first divergence and the first introduced one (once when they are
/// the same call), and the headline when a later op dominates.
fn first_blocks(out: &mut String, r: &CompareReport) {
    match &r.first_divergence {
        Some(d) => op_block(out, "First divergence", d),
        None => out.push_str("First divergence: none\n"),
    }
    if let Some(d) = &r.drift_source {
        drift_block(out, d);
    }
    out.push('\n');
    match (&r.first_introduced, &r.first_divergence) {
        _ if r.first_introduced_unmatched.is_some() => {
            if let Some(u) = &r.first_introduced_unmatched {
                unmatched_block(out, u);
            }
        }
        (Some(i), Some(d)) if (i.seq_a, i.seq_b) == (d.seq_a, d.seq_b) => {
            let _ = writeln!(
                out,
                "First introduced: {} (seq A {}, seq B {}), the first divergence above",
                i.label(),
                i.seq_a,
                i.seq_b
            );
        }
        (Some(i), _) => op_block(out, "First introduced", i),
        (None, _) => out.push_str("First introduced: none\n"),
    }
    if let (Some(h), Some("dominant")) = (&r.headline, r.headline_rule) {
        out.push('\n');
        op_block(
            out,
            &format!(
                "Strongest introduced (the headline: it goes at least {:.0} times further beyond its allowance than the first)",
                opdump_judge::compare::HEADLINE_DOMINANCE
            ),
            h,
        );
    }
}

/// Introduced divergences without an introduced descendant, by
/// amplification.
fn top_list(out: &mut String, r: &CompareReport) {
    if !r.top_introduced.is_empty() {
        out.push_str("\nIntroduced divergences by amplification:\n");
        let _ = writeln!(
            out,
            "  {:>3}  {:<36} {:>10} {:>10} {:>6} {:>5} {:>10} {:>10} {:>10}  module",
            "#", "op", "seq A", "seq B", "step", "depth", "rel err", "tolerance", "amplif."
        );
        for (k, t) in r.top_introduced.iter().enumerate() {
            let _ = writeln!(
                out,
                "  {:>3}  {:<36} {:>10} {:>10} {:>6} {:>5} {:>10} {:>10} {:>10}  {}",
                k + 1,
                t.label(),
                t.seq_a,
                t.seq_b,
                t.step_a,
                t.depth,
                num(t.rel_err),
                num(t.tolerance),
                num(t.amplification),
                t.module.as_deref().map_or("-".into(), clean)
            );
        }
    }
}

/// The one-line verdict.
fn verdict_line(out: &mut String, r: &CompareReport) {
    match (&r.headline, r.divergence) {
        _ if r.first_introduced_unmatched.is_some() => {
            if let Some(u) = &r.first_introduced_unmatched {
                let _ = match &u.op {
                    Some(o) => writeln!(
                        out,
                        "Verdict: DIVERGED. First introduced at {}{} (only in B, seq B {}, step {}).",
                        op_label(&o.op, &o.overload),
                        in_module(&o.module),
                        o.seq,
                        o.step
                    ),
                    None => writeln!(
                        out,
                        "Verdict: DIVERGED. First introduced by calls only in B before {} (seq A {}, seq B {}).",
                        op_label(&u.consumer.op, &u.consumer.overload),
                        u.consumer.seq_a,
                        u.consumer.seq_b
                    ),
                };
            }
        }
        (Some(i), _) => {
            let _ = writeln!(
                out,
                "Verdict: DIVERGED. {} at {}{} (seq A {}, seq B {}, step {}).",
                if r.headline_rule == Some("dominant") {
                    "Introduced"
                } else {
                    "First introduced"
                },
                i.label(),
                in_module(&i.module),
                i.seq_a,
                i.seq_b,
                i.step_a
            );
        }
        (None, true) => match &r.drift_source {
            Some(d) => {
                let _ = writeln!(
                    out,
                    "Verdict: DRIFT. {} was changed by the optimizer of step {}: compare the optimizers' calls ({}). No aligned op introduced a divergence. Exit status 3.",
                    Clean(&d.parameter),
                    d.optimizer_step,
                    Clean(&d.unmatched_calls())
                );
            }
            None => {
                let _ = writeln!(
                    out,
                    "Verdict: DRIFT. The runs diverged, but no op introduced it: every diverged op inherited the difference (from inputs that differ from the start, random or discontinuous ops{}). Exit status 3.",
                    r.unmatched_upstream
                        .phrase()
                        .map_or(String::new(), |p| format!(", or {p}"))
                );
            }
        },
        (None, false) => {
            out.push_str("Verdict: no divergence: every aligned op agrees within tolerance.\n")
        }
    }
}

/// The commands that take the first introduced call to a reproduction.
fn next_block(out: &mut String, n: &NextStep) {
    let what = format!("{} (seq A {}, seq B {})", Clean(&n.op), n.seq_a, n.seq_b);
    if n.captured {
        let _ = writeln!(
            out,
            "\nNext: both dumps hold the tensors of {what}; reproduce it outside the job:\n  {}",
            Clean(&n.repro)
        );
        return;
    }
    let _ = writeln!(
        out,
        "\nNext: capture the tensors of {what} and reproduce it outside the job:\n  \
         1. run A's job again with  OPDUMP_CAPTURE='{}'\n     \
         run B's job again with  OPDUMP_CAPTURE='{}'\n     \
         (each into a new OPDUMP_DIR, with the same other OPDUMP_* settings: selectors count recorded calls)\n  \
         2. {}",
        Clean(&n.capture_a),
        Clean(&n.capture_b),
        Clean(&n.repro)
    );
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn formats() {
        assert_eq!(thousands(1234567), "1,234,567");
        assert_eq!(thousands(12), "12");
        assert_eq!(num(25000.0), "25000");
        assert_eq!(num(10000.0), "10000");
        assert_eq!(num(0.5), "0.5");
        assert_eq!(num(129.1027), "129.1");
        assert_eq!(num(0.0123456), "0.01235");
        assert_eq!(num(6.0), "6");
        assert_eq!(num(1e-7), "1.000e-7");
        assert_eq!(num(f64::NAN), "-");
    }
}
