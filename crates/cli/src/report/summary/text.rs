//! The summary report as text.

use std::fmt::Write;

use crate::app::text::{clean, op_label, Clean};
use crate::report::format::{num, thousands};
use crate::report::summary::{OpSite, RankSummary, SummaryReport};

const TOP_OPS: usize = 30;
const TOP_MODULES: usize = 40;

fn site(out: &mut String, title: &str, s: &Option<OpSite>) {
    let Some(s) = s else {
        let _ = writeln!(out, "  {title}: none");
        return;
    };
    let o = &s.op;
    let _ = writeln!(
        out,
        "  {title}: {}  (seq {}, step {}, {}, depth {})",
        op_label(&o.op, &o.overload),
        o.seq,
        o.step,
        o.phase,
        o.depth
    );
    if let Some(m) = &o.module {
        let _ = writeln!(out, "    module  {}", Clean(m));
    }
    if let Some(f) = o.fwd_seq {
        let _ = writeln!(out, "    backward of the forward call at seq {f}");
    }
    if let Some(src) = &o.source {
        let _ = writeln!(out, "    source  {}", Clean(src));
    }
    if !s.ancestors.is_empty() {
        let chain: Vec<String> = s
            .ancestors
            .iter()
            .map(|a| format!("{} (seq {})", op_label(&a.op, &a.overload), a.seq))
            .collect();
        let _ = writeln!(out, "    inside  {}", chain.join(" > "));
    }
    if !s.args.is_empty() {
        let _ = writeln!(out, "    args  {}", Clean(&s.args));
    }
    for t in &s.tensors {
        let mut name = match t.list_index {
            Some(i) => format!("{}[{i}]", Clean(&t.arg)),
            None => clean(&t.arg).into_owned(),
        };
        if let Some(n) = &t.name {
            let _ = write!(name, " ({})", Clean(n));
        }
        let st = &t.stats;
        let _ = writeln!(
            out,
            "    {:<6} {:<10} {} {:?}  min {} max {} mean {} absmax {}  nan {} +inf {} -inf {}",
            t.role,
            name,
            Clean(&t.dtype),
            t.shape,
            num(st.min),
            num(st.max),
            num(st.mean),
            num(st.absmax),
            st.nan_count,
            st.posinf_count,
            st.neginf_count
        );
    }
}

/// Op calls per module, in the model's order, then the modules whose
/// outputs held NaN or Inf, by where that first happened.
fn modules(out: &mut String, r: &RankSummary) {
    if r.per_module.is_empty() {
        return;
    }
    let _ = writeln!(
        out,
        "  op calls per module ({} modules, in call order; {} calls outside any):",
        r.per_module.len(),
        thousands(r.calls_outside_modules)
    );
    for m in r.per_module.iter().take(TOP_MODULES) {
        let _ = writeln!(out, "    {:>12}  {}", thousands(m.calls), Clean(&m.module));
    }
    if r.per_module.len() > TOP_MODULES {
        let _ = writeln!(
            out,
            "    ... {} more (see --json)",
            r.per_module.len() - TOP_MODULES
        );
    }
    let mut nf: Vec<_> = r
        .per_module
        .iter()
        .filter(|m| m.first_nonfinite_seq.is_some())
        .collect();
    if nf.is_empty() {
        return;
    }
    nf.sort_by_key(|m| m.first_nonfinite_seq);
    out.push_str("  first NaN/Inf by module (first seen first):\n");
    let _ = writeln!(
        out,
        "    {:<40} {:>10} {:>10} {:>10}  first op",
        "module", "NaN out", "Inf out", "first seq"
    );
    for m in nf.iter().take(TOP_OPS) {
        let _ = writeln!(
            out,
            "    {:<40} {:>10} {:>10} {:>10}  {} ({})",
            clean(&m.module),
            m.calls_nan_out,
            m.calls_inf_out,
            m.first_nonfinite_seq.unwrap_or_default(),
            Clean(m.first_nonfinite_op.as_deref().unwrap_or("-")),
            m.first_nonfinite_phase.unwrap_or("-")
        );
    }
}

fn rank(out: &mut String, r: &RankSummary) {
    let d = &r.dump;
    let _ = writeln!(
        out,
        "rank {}: {} op calls ({} top-level), {} tensors, {} file{}",
        d.rank,
        thousands(d.op_calls),
        thousands(d.top_level_calls),
        thousands(d.tensors),
        d.files,
        if d.files == 1 { "" } else { "s" }
    );
    let phases: Vec<String> = r
        .per_phase
        .iter()
        .map(|(k, v)| format!("{k} {}", thousands(*v)))
        .collect();
    let _ = writeln!(out, "  per phase: {}", phases.join(", "));
    let steps: Vec<String> = r
        .per_step
        .iter()
        .take(20)
        .map(|(k, v)| format!("{k}: {}", thousands(*v)))
        .collect();
    let _ = writeln!(
        out,
        "  per step: {}{}",
        steps.join(", "),
        if r.per_step.len() > 20 {
            format!(", ... ({} steps)", r.per_step.len())
        } else {
            String::new()
        }
    );
    per_op(out, r);
    modules(out, r);
    if r.ops_raised > 0 {
        let _ = writeln!(out, "  op calls that raised: {}", thousands(r.ops_raised));
        site(out, "first that raised", &r.first_raised);
    }
    nonfinite_ops(out, r);
    site(
        out,
        "first NaN from inputs without NaN",
        &r.first_nan_from_finite,
    );
    site(
        out,
        "first NaN/Inf from finite inputs",
        &r.first_nonfinite_from_finite,
    );
}

pub fn render(s: &SummaryReport) -> String {
    let mut out = format!("opdump summary {}\n", Clean(&s.path));
    for r in &s.ranks {
        rank(&mut out, r);
    }
    for n in &s.notes {
        let _ = writeln!(out, "note: {}", Clean(n));
    }
    out
}

/// Op calls per op, most first.
fn per_op(out: &mut String, r: &RankSummary) {
    let _ = writeln!(out, "  op calls per op ({} distinct):", r.per_op.len());
    for o in r.per_op.iter().take(TOP_OPS) {
        let _ = writeln!(
            out,
            "    {:>12}  {}",
            thousands(o.calls),
            op_label(&o.op, &o.overload)
        );
    }
    if r.per_op.len() > TOP_OPS {
        let _ = writeln!(
            out,
            "    ... {} more (see --json)",
            r.per_op.len() - TOP_OPS
        );
    }
}

/// The ops whose calls had NaN or Inf in or out, first seen first.
fn nonfinite_ops(out: &mut String, r: &RankSummary) {
    if r.nonfinite_ops.is_empty() {
        out.push_str("  NaN/Inf: none\n");
    } else {
        out.push_str("  ops with NaN/Inf (first seen first):\n");
        let _ = writeln!(
            out,
            "    {:<40} {:>10} {:>10} {:>10} {:>10}",
            "op", "NaN out", "Inf out", "NaN/Inf in", "first seq"
        );
        for o in r.nonfinite_ops.iter().take(TOP_OPS) {
            let _ = writeln!(
                out,
                "    {:<40} {:>10} {:>10} {:>10} {:>10}",
                op_label(&o.op, &o.overload),
                o.calls_nan_out,
                o.calls_inf_out,
                o.calls_nonfinite_in,
                o.first_seq
            );
        }
    }
}
