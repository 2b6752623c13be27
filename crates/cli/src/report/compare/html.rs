//! `--html FILE`: one self-contained page (inline CSS and SVG, no script, no
//! network): the error of every aligned op along A's call order on a log
//! scale, introduced ops marked, the model's module tree, and the tables of
//! the text report.
//!
//! A million ops do not fit in an SVG; the x axis is cut into at most
//! `BINS` columns and each column shows, per innermost module of its calls,
//! their largest error, coloured by the worst verdict among them.
//!
//! Clicking a module in the tree filters the plot to its calls with CSS
//! alone (`:target` and `:has`): the page needs no script, so a dump's
//! strings can never run as one.

use std::fmt::Write;

use crate::app::text::op_label;

use super::model::{AlignedPairs, CompareReport, OnlyIn, OpReport, StatsReport};
use crate::report::format::{num, thousands};
use crate::report::module_tree::{write_tree, ModNode, ModTree, NodeView, NO_MODULE};
use crate::report::page::{esc, page};
use opdump_judge::verdict::OpVerdict;

const BINS: usize = 1200;
const W: f64 = 1200.0;
const H: f64 = 336.0;
const LEFT: f64 = 60.0;
const TOP: f64 = 16.0;
const BOTTOM: f64 = 52.0;

/// The worst verdict in a column of the plot, in the order it is drawn over.
#[derive(Clone, Copy, Default, PartialEq, Eq, PartialOrd, Ord)]
enum Worst {
    #[default]
    Ok,
    Inherited,
    Introduced,
}

impl Worst {
    fn of(v: OpVerdict) -> Self {
        match v {
            OpVerdict::Introduced => Worst::Introduced,
            OpVerdict::Inherited => Worst::Inherited,
            _ => Worst::Ok,
        }
    }
}

/// The calls of one column of the plot that ran in the same innermost
/// module: one point.
#[derive(Clone, Copy)]
struct Group {
    /// The module's node in the [`ErrorTree`].
    leaf: u32,
    max_err: f64,
    worst: Worst,
    /// The pair named in the point's tooltip: of the worst verdict, then of
    /// the largest error.
    worst_pair: usize,
    count: usize,
}

/// One column of the plot: the pairs `first_pair..first_pair + count`.
#[derive(Clone, Default)]
struct Column {
    first_pair: usize,
    count: usize,
    groups: Vec<Group>,
}

/// Cuts the pairs into at most `BINS` columns of consecutive pairs, each
/// split by the innermost module of its calls (`leaf_of`, per pair).
fn columns(pairs: &AlignedPairs<'_>, leaf_of: &[u32]) -> Vec<Column> {
    let n = pairs.len();
    let cols = n.min(BINS);
    let mut c = vec![Column::default(); cols];
    for k in 0..n {
        let col = &mut c[k * cols / n];
        if col.count == 0 {
            col.first_pair = k;
        }
        col.count += 1;
        add_to_group(
            col,
            k,
            leaf_of[k],
            pairs.out_err(k),
            Worst::of(pairs.verdict(k)),
        );
    }
    c
}

/// Adds pair `k` to its module's group in a column (a column holds few
/// modules: a linear search).
fn add_to_group(col: &mut Column, k: usize, leaf: u32, e: f64, worst: Worst) {
    let i = match col.groups.iter().position(|g| g.leaf == leaf) {
        Some(i) => i,
        None => {
            col.groups.push(Group {
                leaf,
                max_err: e,
                worst,
                worst_pair: k,
                count: 0,
            });
            col.groups.len() - 1
        }
    };
    let g = &mut col.groups[i];
    g.count += 1;
    if worst > g.worst || (worst == g.worst && e > g.max_err) {
        g.worst_pair = k;
    }
    g.worst = g.worst.max(worst);
    g.max_err = g.max_err.max(e);
}

/// The top band holds infinite errors (NaN/Inf counts or shapes differ).
const INF_BAND: f64 = 14.0;

/// Where things go in the plot: x by pair, y by error on a log scale of
/// whole decades `lo..=hi`.
struct Frame {
    n: usize,
    /// Plot area width and height.
    pw: f64,
    ph: f64,
    lo: f64,
    hi: f64,
}

impl Frame {
    fn new(n: usize, cols: &[Column]) -> Self {
        let (lo, hi) = decades(cols);
        Frame {
            n,
            pw: W - LEFT - 10.0,
            ph: H - TOP - BOTTOM,
            lo,
            hi,
        }
    }

    fn x_of(&self, k: usize) -> f64 {
        LEFT + (k as f64 + 0.5) / self.n as f64 * self.pw
    }

    fn y_of(&self, e: f64) -> f64 {
        if !e.is_finite() {
            TOP + INF_BAND / 2.0
        } else {
            let t = ((e.log10() - self.lo) / (self.hi - self.lo)).clamp(0.0, 1.0);
            TOP + INF_BAND + (1.0 - t) * (self.ph - INF_BAND)
        }
    }
}

/// Y range in decades, from the smallest to the largest finite error.
fn decades(cols: &[Column]) -> (f64, f64) {
    let finite: Vec<f64> = cols
        .iter()
        .flat_map(|c| c.groups.iter().map(|g| g.max_err))
        .filter(|e| e.is_finite() && *e > 0.0)
        .collect();
    let lo = finite
        .iter()
        .copied()
        .fold(f64::INFINITY, f64::min)
        .log10()
        .floor()
        .max(-18.0);
    let hi = finite
        .iter()
        .copied()
        .fold(0.0, f64::max)
        .log10()
        .ceil()
        .min(6.0);
    if finite.is_empty() {
        (-8.0, 0.0)
    } else if hi <= lo {
        (lo - 1.0, lo + 1.0)
    } else {
        (lo, hi)
    }
}

fn plot(pairs: &AlignedPairs<'_>, tree: &ErrorTree) -> String {
    let n = pairs.len();
    let mut s = String::new();
    let _ = write!(
        s,
        r#"<svg xmlns="http://www.w3.org/2000/svg" width="{W}" height="{H}" viewBox="0 0 {W} {H}" class="plot">"#
    );
    if pairs.is_empty() {
        s.push_str("<text x=\"60\" y=\"40\">no aligned op calls</text></svg>");
        return s;
    }
    let cols = columns(pairs, &tree.leaf_of);
    let f = Frame::new(n, &cols);
    draw_grid(&mut s, &f);
    draw_step_marks(&mut s, &f, pairs);
    draw_points(&mut s, &f, &cols, pairs, tree);
    draw_markers(&mut s, &f, pairs);
    let _ = write!(
        s,
        r##"<rect x="{LEFT}" y="{TOP}" width="{}" height="{}" fill="none" stroke="#999"/><text x="{}" y="{}" class="ax" text-anchor="middle">aligned op calls in A's call order ({} ops)</text></svg>"##,
        f.pw,
        f.ph,
        LEFT + f.pw / 2.0,
        H - 4.0,
        thousands(n as u64)
    );
    s
}

/// One line per decade, and the label of the infinite band.
fn draw_grid(s: &mut String, f: &Frame) {
    let mut d = f.lo as i32;
    let band_label_y = TOP + INF_BAND / 2.0;
    while d as f64 <= f.hi {
        let y = f.y_of(10f64.powi(d));
        let _ = write!(
            s,
            r##"<line x1="{LEFT}" x2="{}" y1="{y:.1}" y2="{y:.1}" stroke="#e4e4e4"/>"##,
            LEFT + f.pw
        );
        // A decade label that would overprint the band's label is left out.
        if y - band_label_y >= 10.0 {
            let _ = write!(
                s,
                r#"<text x="{}" y="{:.1}" class="ax" text-anchor="end">1e{d}</text>"#,
                LEFT - 4.0,
                y + 3.0
            );
        }
        d += 1;
    }
    let _ = write!(
        s,
        r#"<text x="{}" y="{}" class="ax" text-anchor="end">NaN/Inf</text>"#,
        LEFT - 4.0,
        TOP + INF_BAND / 2.0 + 3.0
    );
}

/// A dashed line where a new step begins (at most 60: more would hide the
/// points).
fn draw_step_marks(s: &mut String, f: &Frame, pairs: &AlignedPairs<'_>) {
    let mut last_step = None;
    let mut marks = 0;
    for k in 0..f.n {
        let st = pairs.step_a(k);
        if last_step != Some(st) && pairs.is_top_level(k) {
            if last_step.is_some() && marks < 60 {
                let x = f.x_of(k);
                // Near the right edge the label ends at its line, inside the plot.
                let anchor = if x > LEFT + 0.9 * f.pw {
                    "end"
                } else {
                    "start"
                };
                let _ = write!(
                    s,
                    r##"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="#bbb" stroke-dasharray="3,3"/><text x="{x:.1}" y="{}" class="ax" text-anchor="{anchor}">step {st}</text>"##,
                    TOP + f.ph,
                    TOP + f.ph + 36.0
                );
                marks += 1;
            }
            last_step = Some(st);
        }
    }
}

/// A point per module of a column with an error: a triangle when some op
/// of it introduced an error, with the worst op named in its tooltip. Its
/// classes name its module and the module's ancestors, for the filter.
fn draw_points(
    s: &mut String,
    f: &Frame,
    cols: &[Column],
    pairs: &AlignedPairs<'_>,
    tree: &ErrorTree,
) {
    for col in cols {
        let x = f.x_of(col.first_pair + col.count / 2);
        for g in col.groups.iter().filter(|g| g.max_err > 0.0) {
            draw_point(s, f, x, g, pairs, &tree.tree.classes_of(g.leaf));
        }
    }
}

fn draw_point(
    s: &mut String,
    f: &Frame,
    x: f64,
    g: &Group,
    pairs: &AlignedPairs<'_>,
    classes: &str,
) {
    let y = f.y_of(g.max_err);
    let color = match g.worst {
        Worst::Introduced => "#d62728",
        Worst::Inherited => "#ff9f1c",
        Worst::Ok => "#4a78b5",
    };
    let label = pairs.label(g.worst_pair);
    let title = format!(
        "{}{} seq A {} / B {}: rel err {}{}",
        label.name,
        label.module.map_or(String::new(), |m| format!(" in {m}")),
        label.seq_a,
        label.seq_b,
        num(g.max_err),
        if g.count > 1 {
            format!(" (max of {} ops)", g.count)
        } else {
            String::new()
        }
    );
    if g.worst == Worst::Introduced {
        let _ = write!(
            s,
            r#"<path class="pt {classes}" d="M{:.1},{:.1} l5,9 l-10,0 z" fill="{color}"><title>{}</title></path>"#,
            x,
            y - 6.0,
            esc(&title)
        );
    } else {
        let _ = write!(
            s,
            r#"<circle class="pt {classes}" cx="{x:.1}" cy="{y:.1}" r="2" fill="{color}"><title>{}</title></circle>"#,
            esc(&title)
        );
    }
}

/// Lines at the headline, the first divergence and (when another op took
/// the headline) the first introduced op, labelled on rows below the plot
/// so that the labels never overlap when they are the same op.
fn draw_markers(s: &mut String, f: &Frame, pairs: &AlignedPairs<'_>) {
    let first = pairs
        .first_introduced()
        .filter(|&k| Some(k) != pairs.headline());
    for (row, (k, label, color)) in [
        (pairs.headline(), "introduced (headline)", "#d62728"),
        (pairs.first_divergence(), "first divergence", "#ff9f1c"),
        (first, "first introduced", "#9467bd"),
    ]
    .into_iter()
    .enumerate()
    {
        if let Some(k) = k {
            let x = f.x_of(k);
            let _ = write!(
                s,
                r#"<line x1="{x:.1}" x2="{x:.1}" y1="{TOP}" y2="{}" stroke="{color}" stroke-width="1.5"/><text x="{:.1}" y="{}" class="ax" fill="{color}">{label}</text>"#,
                TOP + f.ph,
                x + 3.0,
                TOP + f.ph + 12.0 + 12.0 * row as f64
            );
        }
    }
}

/// Introduced calls listed under their innermost module, at most.
const INTRODUCED_LISTED: usize = 5;

/// What a module's calls and its descendants' calls showed.
#[derive(Default)]
struct Errors {
    /// The largest output error over its allowance among the calls.
    worst: f64,
    calls: u64,
    introduced: u64,
    /// The first introduced calls (pairs) whose innermost module it is.
    own_introduced: Vec<usize>,
}

/// The module tree of A's calls, and each pair's innermost module.
struct ErrorTree {
    tree: ModTree<Errors>,
    /// Per pair: the node of its innermost module.
    leaf_of: Vec<u32>,
}

impl ErrorTree {
    /// Measures every pair again for its error over its allowance (as the
    /// Parquet report does) and adds it to its module and the module's
    /// ancestors.
    fn build(pairs: &AlignedPairs<'_>) -> Self {
        let mut t = ErrorTree {
            tree: ModTree::new(),
            leaf_of: Vec::with_capacity(pairs.len()),
        };
        let mut details = pairs.details();
        for k in 0..pairs.len() {
            let row = details.load(k);
            let leaf = t.tree.node_of(row.module_a.unwrap_or(NO_MODULE));
            t.leaf_of.push(leaf);
            t.add_call(leaf, k, row.excess, row.verdict == OpVerdict::Introduced);
        }
        t
    }

    fn add_call(&mut self, leaf: u32, k: usize, excess: f64, introduced: bool) {
        let own = &mut self.tree.nodes[leaf as usize].data.own_introduced;
        if introduced && own.len() < INTRODUCED_LISTED {
            own.push(k);
        }
        let ids: Vec<u32> = self.tree.up_from(leaf).collect();
        for id in ids {
            let n = &mut self.tree.nodes[id as usize].data;
            n.calls += 1;
            n.introduced += introduced as u64;
            // NaN (nothing measured) never replaces a number.
            if excess > n.worst {
                n.worst = excess;
            }
        }
    }

    /// The nodes from the root to pair `k`'s module.
    fn path_to(&self, k: Option<usize>) -> Vec<u32> {
        self.tree.path_to(k.map(|k| self.leaf_of[k]))
    }
}

/// The compare page's nodes: the worst error over the allowance, the
/// calls, the introduced calls.
struct ErrorView<'p, 'a> {
    pairs: &'p AlignedPairs<'a>,
}

impl NodeView<Errors> for ErrorView<'_, '_> {
    const LINKED: bool = true;

    fn attrs(&self, n: &ModNode<Errors>) -> String {
        format!(" data-worst=\"{}\"", n.data.worst)
    }

    fn line(&self, out: &mut String, n: &ModNode<Errors>) {
        let e = &n.data;
        let _ = write!(
            out,
            "<span class=\"{}\" title=\"largest output error over its allowance\">{}&times; allowed</span> \
             <span class=\"dim\">{} calls</span>",
            if e.worst > 1.0 { "worst over" } else { "worst" },
            num(e.worst),
            thousands(e.calls),
        );
        if e.introduced > 0 {
            let _ = write!(
                out,
                " <span class=\"introduced\">&#9650; {} introduced</span>",
                thousands(e.introduced)
            );
        }
    }

    fn own(&self, out: &mut String, n: &ModNode<Errors>) {
        if n.data.own_introduced.is_empty() {
            return;
        }
        out.push_str("<ul class=\"ops\">");
        for &k in &n.data.own_introduced {
            let l = self.pairs.label(k);
            let _ = write!(
                out,
                "<li class=\"introduced\">&#9650; {} <span class=\"dim\">seq A {} / B {}</span></li>",
                esc(&l.name),
                l.seq_a,
                l.seq_b
            );
        }
        out.push_str("</ul>");
    }
}

/// The module tree, each node with its worst error over its allowance and
/// its introduced calls, the path to the first introduced call open.
fn module_tree(out: &mut String, t: &ErrorTree, pairs: &AlignedPairs<'_>) {
    out.push_str("<h2 id=\"modules\">Modules</h2>");
    if !t.tree.any_module {
        out.push_str("<p>none: dump A has no module paths</p>");
        return;
    }
    out.push_str(
        "<p class=\"dim\">per module: the largest output error over its allowance among its calls \
         and its submodules' calls (above 1: diverged), and the introduced calls; \
         click a name to show only its calls in the plot</p>",
    );
    let open = t.path_to(pairs.first_introduced().or(pairs.first_divergence()));
    write_tree(out, &t.tree, &open, &ErrorView { pairs });
}

/// The filter's rules: while module `m<id>` is the page's target, the
/// points of other modules are hidden and its name in the tree is marked.
fn filter_css(out: &mut String, t: &ErrorTree) {
    if !t.tree.any_module {
        return;
    }
    out.push_str("<style>");
    for id in 1..t.tree.nodes.len() {
        let _ = write!(
            out,
            "body:has(#m{id}:target) .pt:not(.m{id}){{display:none}}\
             body:has(#m{id}:target) a[href=\"#m{id}\"]{{background:#ffe58a}}"
        );
    }
    out.push_str("</style>");
}

/// The filter's lines above the plot, one per module, shown while their
/// module is the page's target.
fn filter_lines(out: &mut String, t: &ErrorTree) {
    if !t.tree.any_module {
        return;
    }
    for (id, n) in t.tree.nodes.iter().enumerate().skip(1) {
        let _ = write!(
            out,
            "<p class=\"flt\" id=\"m{id}\">showing the {} calls in <code>{}</code> only &mdash; <a href=\"#plot\">show all</a></p>",
            thousands(n.data.calls),
            esc(&n.path)
        );
    }
}

fn stats_cells(s: &Option<StatsReport>) -> String {
    match s {
        None => "<td colspan=\"10\">absent</td>".into(),
        Some(s) if !s.has_values => {
            format!("<td colspan=\"10\">{} (numel {})</td>", esc(s.status.unwrap_or("no stats")), s.numel)
        }
        Some(s) => format!(
            "<td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
            num(s.min), num(s.max), num(s.mean), num(s.std), num(s.l2), num(s.absmax),
            s.nan_count, s.posinf_count, s.neginf_count, s.zero_count
        ),
    }
}

/// Where in the model the call ran, as a small table (nothing when the
/// dumps have no module paths, names or source lines).
fn where_rows(out: &mut String, r: &OpReport) {
    let mut rows: Vec<(&str, String)> = Vec::new();
    if let Some(m) = &r.module {
        let mut v = format!("<code>{}</code>", esc(m));
        if let Some(mb) = &r.module_b {
            let _ = write!(v, " (B: <code>{}</code>)", esc(mb));
        }
        rows.push(("module", v));
    }
    if let Some(f) = r.fwd_seq {
        let mut v = match &r.fwd_op {
            Some(op) => format!("{} (seq A {f}", esc(op)),
            None => format!("seq A {f} (not in the dump"),
        };
        if let Some(fb) = r.fwd_seq_b {
            let _ = write!(v, ", seq B {fb}");
        }
        v.push(')');
        if let Some(m) = &r.fwd_module {
            let _ = write!(v, " in <code>{}</code>", esc(m));
        }
        rows.push(("backward of", v));
    }
    if !r.names.is_empty() {
        let names: Vec<String> = r
            .names
            .iter()
            .map(|n| format!("<code>{}</code>", esc(n)))
            .collect();
        rows.push(("names", names.join(", ")));
    }
    if let Some(src) = &r.source {
        rows.push(("source", format!("<code>{}</code>", esc(src))));
    }
    if rows.is_empty() {
        return;
    }
    out.push_str("<table class=\"kv where\">");
    for (k, v) in rows {
        let _ = write!(out, "<tr><th>{k}</th><td>{v}</td></tr>");
    }
    out.push_str("</table>");
}

fn op_section(out: &mut String, title: &str, r: &Option<OpReport>) {
    let _ = write!(out, "<h2>{}</h2>", esc(title));
    let Some(r) = r else {
        out.push_str("<p>none</p>");
        return;
    };
    call_rows(out, r);
    where_rows(out, r);
    let _ = write!(
        out,
        "<p>output rel err <b>{}</b>, tolerance {} ({}, reduction length {}), input rel err {}, amplification <b>{}</b></p>",
        num(r.rel_err),
        num(r.tolerance),
        esc(r.compute_dtype.as_deref().unwrap_or("exact")),
        num(r.reduction_length),
        num(r.input_rel_err),
        num(r.amplification)
    );
    tensor_table(out, r);
    exact_table(out, r);
}

/// The call's chain of callers, and where it ran in A and in B.
fn call_rows(out: &mut String, r: &OpReport) {
    let chain: Vec<String> = r
        .ancestors
        .iter()
        .map(|a| {
            format!(
                "{} <span class=\"dim\">(seq {})</span>",
                esc(&op_label(&a.op, &a.overload)),
                a.seq_a
            )
        })
        .chain(std::iter::once(format!("<b>{}</b>", esc(&r.label()))))
        .collect();
    let _ = write!(
        out,
        "<p class=\"{v}\"><b>{}</b> &mdash; {v}</p><p>{}</p><table class=\"kv\">\
         <tr><th></th><th>seq</th><th>step</th><th>phase</th><th>depth</th><th>parent</th><th>args</th></tr>",
        esc(&r.label()),
        chain.join(" &rsaquo; "),
        v = r.verdict.as_str(),
    );
    for (side, seq, step, phase, parent, args) in [
        ("A", r.seq_a, r.step_a, r.phase_a, &r.parent_a, &r.args_a),
        ("B", r.seq_b, r.step_b, r.phase_b, &r.parent_b, &r.args_b),
    ] {
        let parent = parent.as_ref().map_or("top-level".into(), |p| {
            format!("{} (seq {})", op_label(&p.op, &p.overload), p.seq)
        });
        let _ = write!(
            out,
            "<tr><th>{side}</th><td>{seq}</td><td>{step}</td><td>{phase}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            r.depth,
            esc(&parent),
            esc(args)
        );
    }
    out.push_str("</table>");
}

/// Each tensor of the call, with its statistics in A and in B.
fn tensor_table(out: &mut String, r: &OpReport) {
    out.push_str(
        "<table><tr><th>tensor</th><th>dtype</th><th>shape</th><th>verdict</th><th>rel err</th><th title=\"the error sketches' estimate of the relative L2 error\">sketch est</th><th>tol</th><th></th>\
         <th>min</th><th>max</th><th>mean</th><th>std</th><th>l2</th><th>absmax</th><th>nan</th><th>+inf</th><th>-inf</th><th>zeros</th></tr>",
    );
    for t in &r.tensors {
        let mut name = match t.list_index {
            Some(i) => format!("{} {}[{i}]", t.role, t.arg),
            None => format!("{} {}", t.role, t.arg),
        };
        if let Some(n) = &t.name {
            let _ = write!(name, " ({n})");
        }
        let dtype = match (&t.dtype_a, &t.dtype_b) {
            (Some(x), Some(y)) if x != y => format!("{x} / {y}"),
            (Some(x), _) | (None, Some(x)) => x.clone(),
            _ => "-".into(),
        };
        let shape = format!(
            "{:?}",
            t.shape_a
                .as_ref()
                .or(t.shape_b.as_ref())
                .cloned()
                .unwrap_or_default()
        );
        let _ = write!(
            out,
            "<tr class=\"{v}\"><td rowspan=\"2\">{}</td><td rowspan=\"2\">{}</td><td rowspan=\"2\">{}</td><td rowspan=\"2\">{v}</td>\
             <td rowspan=\"2\">{}</td><td rowspan=\"2\">{}</td><td rowspan=\"2\">{}</td><th>A</th>{}</tr><tr class=\"{v}\"><th>B</th>{}</tr>",
            esc(&name),
            esc(&dtype),
            esc(&shape),
            num(t.rel_err),
            t.sketch.map_or("-".to_string(), |s| num(s.rel)),
            num(t.tolerance),
            stats_cells(&t.a),
            stats_cells(&t.b),
            v = t.verdict.as_str()
        );
    }
    out.push_str("</table>");
}

/// The op sections written so far: a call shown once (the first
/// divergence is often the first introduced call) is named, not repeated.
#[derive(Default)]
struct Shown {
    /// The call (seq A, seq B, op), and the title it is shown under.
    calls: Vec<((i64, i64, String), String)>,
}

impl Shown {
    fn section(&mut self, out: &mut String, title: &str, r: &Option<OpReport>) {
        let Some(op) = r else {
            return op_section(out, title, r);
        };
        let call = (op.seq_a, op.seq_b, op.label());
        if let Some((_, first_title)) = self.calls.iter().find(|(c, _)| *c == call) {
            let _ = write!(
                out,
                "<h2>{}</h2><p class=\"same\">{} (seq A {}, seq B {}): the same call as under &ldquo;{}&rdquo; above.</p>",
                esc(title),
                esc(&call.2),
                call.0,
                call.1,
                esc(first_title)
            );
            return;
        }
        self.calls.push((call, title.to_string()));
        op_section(out, title, r);
    }
}

/// The commands that take the first introduced call to a reproduction.
fn next_section(out: &mut String, n: &crate::report::compare::model::NextStep) {
    let _ = write!(
        out,
        "<h3>Next: reproduce {} outside the job</h3>",
        esc(&n.op)
    );
    if n.captured {
        let _ = write!(
            out,
            "<p>Both dumps hold its tensors:</p><pre>{}</pre>",
            esc(&n.repro)
        );
    } else {
        let _ = write!(
            out,
            "<p>Run each job again into a new <code>OPDUMP_DIR</code>, with the same other <code>OPDUMP_*</code> settings, and:</p>\
             <pre>A: OPDUMP_CAPTURE='{}'\nB: OPDUMP_CAPTURE='{}'</pre><p>then</p><pre>{}</pre>",
            esc(&n.capture_a),
            esc(&n.capture_b),
            esc(&n.repro)
        );
    }
}

/// The exact metrics of the tensors both dumps captured.
fn exact_table(out: &mut String, r: &OpReport) {
    if r.tensors.iter().all(|t| t.exact.is_none()) {
        return;
    }
    out.push_str(
        "<p>Exact metrics (both runs captured the values; they replace the bounds in the verdict):</p>\
         <table><tr><th>tensor</th><th>max abs</th><th>max rel</th><th>rel l2</th><th>cosine</th>\
         <th>ulp median</th><th>ulp p99</th><th>ulp max</th><th>beyond tol</th><th>worst element</th></tr>",
    );
    for t in &r.tensors {
        let Some(e) = &t.exact else { continue };
        let name = match t.list_index {
            Some(i) => format!("{} {}[{i}]", t.role, t.arg),
            None => format!("{} {}", t.role, t.arg),
        };
        let o = |v: Option<f64>| v.map_or("-".to_string(), num);
        let idx: Vec<String> = e.worst_index.iter().map(u64::to_string).collect();
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{:.9}</td><td>{}</td><td>{}</td><td>{}</td>\
             <td>{} of {}</td><td>[{}] A {} B {}</td></tr>",
            esc(&name),
            num(e.max_abs),
            num(e.max_rel),
            num(e.rel_l2),
            e.cosine,
            o(e.ulp_median),
            o(e.ulp_p99),
            o(e.ulp_max),
            e.beyond_tolerance,
            e.numel,
            idx.join(", "),
            num(e.worst_a),
            num(e.worst_b)
        );
    }
    out.push_str("</table>");
}

fn only_section(out: &mut String, side: &str, o: &OnlyIn) {
    let _ = write!(
        out,
        "<h3>Only in {side}: {} op calls in {} subtrees</h3>",
        thousands(o.op_calls),
        thousands(o.subtrees)
    );
    if o.by_op.is_empty() {
        return;
    }
    out.push_str("<table><tr><th>op</th><th>subtrees</th></tr>");
    for c in &o.by_op {
        let _ = write!(
            out,
            "<tr><td>{}</td><td>{}</td></tr>",
            esc(&op_label(&c.op, &c.overload)),
            c.count
        );
    }
    out.push_str("</table>");
}

/// The page: `r` for the tables, `pairs` for the plot of every pair.
pub fn render(r: &CompareReport, pairs: &AlignedPairs<'_>) -> String {
    let tree = ErrorTree::build(pairs);
    let mut head = String::new();
    filter_css(&mut head, &tree);
    page("opdump compare", &head, &r.notes, |o| {
        dumps_table(o, r);
        verdict_line(o, r);
        o.push_str("<h2 id=\"plot\">Error along the op sequence</h2><p class=\"legend\"><span style=\"color:#d62728\">&#9650; introduced</span><span style=\"color:#ff9f1c\">&#9679; inherited</span><span style=\"color:#4a78b5\">&#9679; within tolerance</span><span class=\"dim\">largest relative error of the outputs (lower bound from the statistics, or the low end of the sketches' estimate); hover for the op</span></p>");
        filter_lines(o, &tree);
        o.push_str(&plot(pairs, &tree));
        module_tree(o, &tree, pairs);
        op_sections(o, r);
        top_introduced(o, r);
        verdict_counts(o, r);
        only_section(o, "A", &r.only_in_a);
        only_section(o, "B", &r.only_in_b);
    })
}

/// The two dumps, one row each.
fn dumps_table(o: &mut String, r: &CompareReport) {
    o.push_str("<h1>opdump compare</h1><table class=\"kv\"><tr><th></th><th>dump</th><th>rank</th><th>files</th><th>op calls</th><th>top-level</th><th>steps</th></tr>");
    for (side, d) in [("A (reference)", &r.dump_a), ("B (under test)", &r.dump_b)] {
        let _ = write!(
            o,
            "<tr><th>{side}</th><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr>",
            esc(&d.path),
            d.rank,
            d.files,
            thousands(d.op_calls),
            thousands(d.top_level_calls),
            match (d.step_first, d.step_last) {
                (Some(f), Some(l)) => format!("{f}..{l}"),
                _ => "-".into(),
            }
        );
    }
    o.push_str("</table>");
}

/// What was aligned, and the verdict.
fn verdict_line(o: &mut String, r: &CompareReport) {
    let _ = write!(
        o,
        "<p>aligned {} op calls ({} top-level), {} tensor pairs. Verdict: <b class=\"{}\">{}</b></p>",
        thousands(r.aligned.op_calls),
        thousands(r.aligned.top_level_calls),
        thousands(r.aligned.tensor_pairs),
        if r.headline.is_some() { "introduced" } else { "" },
        verdict_text(r)
    );
}

fn verdict_text(r: &CompareReport) -> String {
    if let Some(u) = &r.first_introduced_unmatched {
        return match &u.op {
            Some(o) => format!(
                "first introduced at {} (only in B, seq B {})",
                esc(&op_label(&o.op, &o.overload)),
                o.seq
            ),
            None => "first introduced by calls only in B".into(),
        };
    }
    match (&r.headline, r.divergence) {
        (Some(i), _) if r.headline_rule == Some("dominant") => format!("introduced at {} (seq A {}, seq B {}), going at least {:.0} times further beyond its allowance than the first introduced op", esc(&i.label()), i.seq_a, i.seq_b, opdump_judge::compare::HEADLINE_DOMINANCE),
        (Some(i), _) => format!("first introduced at {}{} (seq A {}, seq B {})", esc(&i.label()), i.module.as_ref().map_or(String::new(), |m| format!(" in <code>{}</code>", esc(m))), i.seq_a, i.seq_b),
        (None, true) => match &r.drift_source {
            Some(d) => format!(
                "diverged: <code>{}</code> was changed by the optimizer of step {}; compare the optimizers' calls ({}). No aligned op introduced it (exit status {})",
                esc(&d.parameter),
                d.optimizer_step,
                esc(&d.unmatched_calls()),
                r.exit_status
            ),
            None => format!(
                "diverged, no op introduced it{} (exit status {})",
                r.unmatched_upstream
                    .phrase()
                    .map_or(String::new(), |p| format!("; upstream of it, {p}")),
                r.exit_status
            ),
        },
        (None, false) => "no divergence".into(),
    }
}

/// The headline (when another op than the first introduced), the first
/// introduced call with the next step, and the first divergence.
fn op_sections(o: &mut String, r: &CompareReport) {
    let mut shown = Shown::default();
    if r.headline_rule == Some("dominant") {
        shown.section(
            o,
            "Strongest introduced divergence (the headline)",
            &r.headline,
        );
    }
    shown.section(o, "First introduced divergence", &r.first_introduced);
    if let Some(n) = &r.next {
        next_section(o, n);
    }
    shown.section(o, "First divergence", &r.first_divergence);
}

fn top_introduced(o: &mut String, r: &CompareReport) {
    if r.top_introduced.is_empty() {
        return;
    }
    o.push_str("<h2>Introduced divergences by amplification</h2><table><tr><th>#</th><th>op</th><th>seq A</th><th>seq B</th><th>step</th><th>depth</th><th>rel err</th><th>tolerance</th><th>amplification</th><th>module</th></tr>");
    for (k, t) in r.top_introduced.iter().enumerate() {
        let _ = write!(
            o,
            "<tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td><code>{}</code></td></tr>",
            k + 1,
            esc(&t.label()),
            t.seq_a,
            t.seq_b,
            t.step_a,
            t.depth,
            num(t.rel_err),
            num(t.tolerance),
            num(t.amplification),
            esc(t.module.as_deref().unwrap_or("-"))
        );
    }
    o.push_str("</table>");
}

fn verdict_counts(o: &mut String, r: &CompareReport) {
    o.push_str("<h2>Verdict counts</h2><table><tr><th>tensor pairs</th><th></th></tr>");
    for (k, v) in &r.tensor_verdicts {
        let _ = write!(o, "<tr><td>{k}</td><td>{}</td></tr>", thousands(*v));
    }
    o.push_str("</table><table><tr><th>op calls</th><th></th></tr>");
    for (k, v) in &r.op_verdicts {
        let _ = write!(o, "<tr><td>{k}</td><td>{}</td></tr>", thousands(*v));
    }
    o.push_str("</table>");
}
