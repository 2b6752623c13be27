//! `opdump summary --html FILE`: one self-contained page (the frame and
//! style of compare's): per rank, the counts, where NaN or Inf first came
//! from finite inputs, and the module tree with each module's op calls and
//! its calls whose outputs held NaN or Inf.

use std::fmt::Write;

use super::model::{ModuleCalls, OpSite, RankSummary, SummaryReport};
use crate::app::text::op_label;
use crate::report::format::{num, thousands};
use crate::report::module_tree::{write_tree, ModNode, ModTree, NodeView, NO_MODULE};
use crate::report::page::{esc, page};

/// Ops listed per rank, the most called first.
const TOP_OPS: usize = 30;

/// The page.
pub fn render(s: &SummaryReport) -> String {
    page("opdump summary", "", &s.notes, |o| {
        let _ = write!(
            o,
            "<h1>opdump summary</h1><p><code>{}</code></p>",
            esc(&s.path)
        );
        for r in &s.ranks {
            rank(o, r);
        }
    })
}

fn rank(o: &mut String, r: &RankSummary) {
    let d = &r.dump;
    let _ = write!(
        o,
        "<h2 id=\"rank{}\">Rank {}</h2><p>{} op calls ({} top-level), {} tensors, {} files; per phase: {}</p>",
        d.rank,
        d.rank,
        thousands(d.op_calls),
        thousands(d.top_level_calls),
        thousands(d.tensors),
        d.files,
        r.per_phase
            .iter()
            .map(|(k, v)| format!("{k} {}", thousands(*v)))
            .collect::<Vec<_>>()
            .join(", ")
    );
    site(
        o,
        "First NaN from inputs without NaN",
        &r.first_nan_from_finite,
    );
    site(
        o,
        "First NaN/Inf from finite inputs",
        &r.first_nonfinite_from_finite,
    );
    modules(o, r);
    nonfinite_ops(o, r);
    per_op(o, r);
}

/// An op call where NaN or Inf came out: where it ran, and its tensors.
fn site(o: &mut String, title: &str, s: &Option<OpSite>) {
    let _ = write!(o, "<h3>{}</h3>", esc(title));
    let Some(s) = s else {
        o.push_str("<p>none</p>");
        return;
    };
    let c = &s.op;
    let _ = write!(
        o,
        "<p class=\"introduced\"><b>{}</b> <span class=\"dim\">seq {}, step {}, {}, depth {}</span></p><table class=\"kv where\">",
        esc(&op_label(&c.op, &c.overload)),
        c.seq,
        c.step,
        c.phase,
        c.depth
    );
    for (k, v) in [("module", &c.module), ("source", &c.source)] {
        if let Some(v) = v {
            let _ = write!(o, "<tr><th>{k}</th><td><code>{}</code></td></tr>", esc(v));
        }
    }
    if !s.args.is_empty() {
        let _ = write!(
            o,
            "<tr><th>args</th><td><code>{}</code></td></tr>",
            esc(&s.args)
        );
    }
    o.push_str("</table><table><tr><th>tensor</th><th>dtype</th><th>shape</th><th>min</th><th>max</th><th>absmax</th><th>nan</th><th>+inf</th><th>-inf</th></tr>");
    for t in &s.tensors {
        let idx = t.list_index.map_or(String::new(), |i| format!("[{i}]"));
        let name = t.name.as_ref().map_or(String::new(), |n| format!(" ({n})"));
        let st = &t.stats;
        let _ = write!(
            o,
            "<tr><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&format!("{} {}{idx}{name}", t.role, t.arg)),
            esc(&t.dtype),
            esc(&format!("{:?}", t.shape)),
            num(st.min),
            num(st.max),
            num(st.absmax),
            st.nan_count,
            st.posinf_count,
            st.neginf_count
        );
    }
    o.push_str("</table>");
}

/// The first call, in a module or its descendants, whose outputs held NaN
/// or Inf: (seq, op, phase).
type First = (i64, String, &'static str);

/// What a module's calls and its descendants' calls showed.
#[derive(Default)]
struct Calls {
    calls: u64,
    nan_out: u64,
    inf_out: u64,
    first: Option<First>,
    /// The first of its own calls (its innermost module's) with NaN or Inf
    /// out.
    own_first: Option<First>,
}

/// The tree of the modules of `r`, each with its counts and its
/// descendants'.
fn tree_of(r: &RankSummary) -> ModTree<Calls> {
    let mut t: ModTree<Calls> = ModTree::new();
    for m in &r.per_module {
        let leaf = t.node_of(&m.module);
        let first = first_of(m);
        t.nodes[leaf as usize].data.own_first = first.clone();
        let ids: Vec<u32> = t.up_from(leaf).collect();
        for id in ids {
            let n = &mut t.nodes[id as usize].data;
            n.calls += m.calls;
            n.nan_out += m.calls_nan_out;
            n.inf_out += m.calls_inf_out;
            if first
                .as_ref()
                .is_some_and(|f| n.first.as_ref().is_none_or(|g| f.0 < g.0))
            {
                n.first = first.clone();
            }
        }
    }
    if r.calls_outside_modules > 0 {
        let leaf = t.node_of(NO_MODULE);
        for id in t.up_from(leaf).collect::<Vec<_>>() {
            let n = &mut t.nodes[id as usize].data;
            n.calls += r.calls_outside_modules;
            n.nan_out += r.calls_outside_modules_nan_out;
            n.inf_out += r.calls_outside_modules_inf_out;
        }
    }
    t
}

fn first_of(m: &ModuleCalls) -> Option<First> {
    Some((
        m.first_nonfinite_seq?,
        m.first_nonfinite_op.clone().unwrap_or_default(),
        m.first_nonfinite_phase.unwrap_or("-"),
    ))
}

/// The summary page's nodes: op calls, and calls with NaN or Inf out.
struct CallsView;

impl NodeView<Calls> for CallsView {
    const LINKED: bool = false;

    fn attrs(&self, n: &ModNode<Calls>) -> String {
        let c = &n.data;
        format!(
            " data-calls=\"{}\" data-nan=\"{}\" data-inf=\"{}\"",
            c.calls, c.nan_out, c.inf_out
        )
    }

    fn line(&self, out: &mut String, n: &ModNode<Calls>) {
        let c = &n.data;
        let _ = write!(
            out,
            "<span class=\"dim\">{} calls</span>",
            thousands(c.calls)
        );
        if c.nan_out + c.inf_out > 0 {
            let _ = write!(
                out,
                " <span class=\"introduced\">&#9650; outputs with NaN in {} of them, with Inf in {}</span>",
                thousands(c.nan_out),
                thousands(c.inf_out)
            );
        }
        if let Some((seq, _, _)) = &c.first {
            let _ = write!(out, " <span class=\"dim\">first at seq {seq}</span>");
        }
    }

    fn own(&self, out: &mut String, n: &ModNode<Calls>) {
        if let Some((seq, op, phase)) = &n.data.own_first {
            let _ = write!(
                out,
                "<ul class=\"ops\"><li class=\"introduced\">&#9650; first NaN/Inf out: {} <span class=\"dim\">seq {seq}, {phase}</span></li></ul>",
                esc(op)
            );
        }
    }
}

/// The module tree, the path to where NaN or Inf first came from finite
/// inputs open.
fn modules(o: &mut String, r: &RankSummary) {
    o.push_str("<h3>Modules</h3>");
    let t = tree_of(r);
    if !t.any_module {
        o.push_str("<p>none: the dump has no module paths</p>");
        return;
    }
    o.push_str(
        "<p class=\"dim\">per module: the op calls in it and its submodules, the calls among them \
         whose outputs held NaN or Inf, and the first of those</p>",
    );
    let origin = [&r.first_nonfinite_from_finite, &r.first_nan_from_finite]
        .into_iter()
        .flatten()
        .find_map(|s| s.op.module.as_deref())
        .or_else(|| {
            r.per_module
                .iter()
                .filter(|m| m.first_nonfinite_seq.is_some())
                .min_by_key(|m| m.first_nonfinite_seq)
                .map(|m| m.module.as_str())
        });
    let open = t.path_to(origin.and_then(|m| t.find(m)));
    write_tree(o, &t, &open, &CallsView);
}

/// The ops whose calls had NaN or Inf in or out, first seen first.
fn nonfinite_ops(o: &mut String, r: &RankSummary) {
    o.push_str("<h3>Ops with NaN/Inf</h3>");
    if r.nonfinite_ops.is_empty() {
        o.push_str("<p>none</p>");
        return;
    }
    o.push_str("<table id=\"nonfinite\"><tr><th>op</th><th>NaN out</th><th>Inf out</th><th>NaN/Inf in</th><th>first seq</th></tr>");
    for x in &r.nonfinite_ops {
        let _ = write!(
            o,
            "<tr><td class=\"l\"><code>{}</code></td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&op_label(&x.op, &x.overload)),
            thousands(x.calls_nan_out),
            thousands(x.calls_inf_out),
            thousands(x.calls_nonfinite_in),
            x.first_seq
        );
    }
    o.push_str("</table>");
}

/// Op calls per op, the most called first.
fn per_op(o: &mut String, r: &RankSummary) {
    let _ = write!(
        o,
        "<h3>Op calls per op ({} distinct)</h3><table id=\"per_op\"><tr><th>op</th><th>calls</th></tr>",
        r.per_op.len()
    );
    for x in r.per_op.iter().take(TOP_OPS) {
        let _ = write!(
            o,
            "<tr><td class=\"l\"><code>{}</code></td><td>{}</td></tr>",
            esc(&op_label(&x.op, &x.overload)),
            thousands(x.calls)
        );
    }
    o.push_str("</table>");
    if r.per_op.len() > TOP_OPS {
        let _ = write!(
            o,
            "<p class=\"dim\">{} more (see --json)</p>",
            r.per_op.len() - TOP_OPS
        );
    }
}
