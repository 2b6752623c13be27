//! The model of `opdump summary`: what one dump holds, per rank (op calls
//! per op, phase, step and module; NaN/Inf origins), built from a loaded
//! dump for the text and JSON renderers.

use std::collections::BTreeMap;

use opdump_format::Role;
use serde::Serialize;

use crate::report::compare::model::{DumpInfo, OpBrief, StatsReport};
use opdump_judge::dump::Dump;
use opdump_judge::intern::{FxMap, NO_ID};

#[derive(Serialize, Clone, Debug)]
pub struct OpCalls {
    pub op: String,
    pub overload: String,
    pub calls: u64,
}

#[derive(Serialize, Clone, Debug)]
pub struct NonfiniteOp {
    pub op: String,
    pub overload: String,
    /// Calls with NaN / Inf in some output.
    pub calls_nan_out: u64,
    pub calls_inf_out: u64,
    /// Calls with NaN or Inf in some input.
    pub calls_nonfinite_in: u64,
    pub first_seq: i64,
}

/// Op calls of one module (innermost: a call in `h.3.mlp.fc` counts for
/// it, not for `h.3.mlp`), and where NaN or Inf first came out in it.
#[derive(Serialize, Clone, Debug)]
pub struct ModuleCalls {
    pub module: String,
    pub calls: u64,
    /// The first call's seq: modules are listed in this order, the model's.
    pub first_seq: i64,
    /// Calls with NaN / Inf in some output.
    pub calls_nan_out: u64,
    pub calls_inf_out: u64,
    /// The first call with NaN or Inf in some output.
    pub first_nonfinite_seq: Option<i64>,
    pub first_nonfinite_op: Option<String>,
    pub first_nonfinite_phase: Option<&'static str>,
}

#[derive(Serialize, Clone, Debug)]
pub struct TensorBrief {
    /// The parameter, buffer or `.grad` it is.
    pub name: Option<String>,
    pub role: &'static str,
    pub arg: String,
    pub list_index: Option<i32>,
    pub dtype: String,
    pub shape: Vec<i64>,
    pub stats: StatsReport,
}

/// An op call shown in full.
#[derive(Serialize, Clone, Debug)]
pub struct OpSite {
    #[serde(flatten)]
    pub op: OpBrief,
    pub args: String,
    /// Outermost first.
    pub ancestors: Vec<OpBrief>,
    pub tensors: Vec<TensorBrief>,
}

impl OpSite {
    pub fn of(d: &Dump, i: u32) -> Self {
        OpSite {
            op: OpBrief::of(d, i),
            args: d.args_text(i).to_string(),
            ancestors: d
                .ancestors(i)
                .into_iter()
                .map(|x| OpBrief::of(d, x))
                .collect(),
            tensors: d
                .tensors_of(i)
                .map(|t| TensorBrief {
                    name: d.tensor_name(t).map(str::to_string),
                    role: d.tensors.role(t).as_str(),
                    arg: d.arg_name(t).to_string(),
                    list_index: d.list_index(t),
                    dtype: d.dtype(t).name.to_string(),
                    shape: d.shape(t).to_vec(),
                    stats: StatsReport::of(d, t),
                })
                .collect(),
        }
    }
}

#[derive(Serialize, Clone, Debug)]
pub struct RankSummary {
    pub dump: DumpInfo,
    pub per_op: Vec<OpCalls>,
    /// Per module, in the order the model first called them; empty when
    /// the dump has no module paths.
    pub per_module: Vec<ModuleCalls>,
    /// Op calls outside any module.
    pub calls_outside_modules: u64,
    /// Of those, the calls with NaN / Inf in some output.
    pub calls_outside_modules_nan_out: u64,
    pub calls_outside_modules_inf_out: u64,
    pub per_phase: BTreeMap<&'static str, u64>,
    /// Op calls per step (all depths).
    pub per_step: BTreeMap<i64, u64>,
    pub ops_raised: u64,
    pub first_raised: Option<OpSite>,
    pub nonfinite_ops: Vec<NonfiniteOp>,
    /// The first op (deepest in its subtree) whose outputs hold NaN while
    /// no input does.
    pub first_nan_from_finite: Option<OpSite>,
    /// The first op (deepest in its subtree) whose outputs hold NaN or Inf
    /// while every input is finite. Often a `-inf` attention mask: look at
    /// `first_nan_from_finite` too.
    pub first_nonfinite_from_finite: Option<OpSite>,
}

#[derive(Serialize, Clone, Debug)]
pub struct SummaryReport {
    pub format: &'static str,
    pub version: u32,
    pub path: String,
    pub ranks: Vec<RankSummary>,
    pub notes: Vec<String>,
}

fn io_flags(d: &Dump, i: u32) -> (bool, bool, bool, bool) {
    // (nan in, nonfinite in, nan out, inf out), over measured tensors.
    let (mut nan_in, mut nf_in, mut nan_out, mut inf_out) = (false, false, false, false);
    for t in d.tensors_of(i) {
        if !d.tensors.has_values(t) {
            continue;
        }
        let [n, p, m] = d.tensors.nonfinite_counts(t);
        let (nan, inf) = (n > 0, p > 0 || m > 0);
        match d.tensors.role(t) {
            Role::Input => {
                nan_in |= nan;
                nf_in |= nan || inf;
            }
            Role::Output => {
                nan_out |= nan;
                inf_out |= inf;
            }
            _ => {}
        }
    }
    (nan_in, nf_in, nan_out, inf_out)
}

/// The first op in seq order satisfying `p`, then, repeatedly, the first
/// op satisfying it below (a parent is entered before the child that did
/// the damage).
fn first_deepest(d: &Dump, p: impl Fn(u32) -> bool) -> Option<u32> {
    let mut cur = (0..d.len() as u32).find(|&i| p(i))?;
    loop {
        let mut stack: Vec<u32> = d.children_of(cur).rev().collect();
        let mut found = None;
        while let Some(i) = stack.pop() {
            if p(i) {
                found = Some(i);
                break;
            }
            stack.extend(d.children_of(i).rev());
        }
        match found {
            Some(i) => cur = i,
            None => return Some(cur),
        }
    }
}

/// Counts call `i` for its innermost module `m`, with whether its outputs
/// held NaN and Inf.
fn add_module_call(
    per_module: &mut FxMap<u32, ModuleCalls>,
    d: &Dump,
    i: u32,
    m: u32,
    (nan_out, inf_out): (bool, bool),
) {
    let e = per_module.entry(m).or_insert_with(|| ModuleCalls {
        module: d.texts.get(m).to_string(),
        calls: 0,
        first_seq: d.seq(i),
        calls_nan_out: 0,
        calls_inf_out: 0,
        first_nonfinite_seq: None,
        first_nonfinite_op: None,
        first_nonfinite_phase: None,
    });
    e.calls += 1;
    e.calls_nan_out += nan_out as u64;
    e.calls_inf_out += inf_out as u64;
    if (nan_out || inf_out) && e.first_nonfinite_seq.is_none() {
        e.first_nonfinite_seq = Some(d.seq(i));
        e.first_nonfinite_op = Some(d.full_name(i));
        e.first_nonfinite_phase = Some(d.phase(i).as_str());
    }
}

/// Counts call `i` (of op `key`) with NaN or Inf in or out.
fn add_nonfinite(
    nonfinite: &mut FxMap<(u32, u32), NonfiniteOp>,
    d: &Dump,
    i: u32,
    key: (u32, u32),
    (nf_in, nan_out, inf_out): (bool, bool, bool),
) {
    let e = nonfinite.entry(key).or_insert_with(|| NonfiniteOp {
        op: d.names.get(key.0).into(),
        overload: d.names.get(key.1).into(),
        calls_nan_out: 0,
        calls_inf_out: 0,
        calls_nonfinite_in: 0,
        first_seq: d.seq(i),
    });
    e.calls_nan_out += nan_out as u64;
    e.calls_inf_out += inf_out as u64;
    e.calls_nonfinite_in += nf_in as u64;
}

/// Op calls per op, most first.
fn per_op_sorted(d: &Dump, per_op: FxMap<(u32, u32), u64>) -> Vec<OpCalls> {
    let mut per_op: Vec<OpCalls> = per_op
        .into_iter()
        .map(|((o, v), calls)| OpCalls {
            op: d.names.get(o).into(),
            overload: d.names.get(v).into(),
            calls,
        })
        .collect();
    per_op.sort_by(|x, y| {
        y.calls
            .cmp(&x.calls)
            .then_with(|| (&x.op, &x.overload).cmp(&(&y.op, &y.overload)))
    });
    per_op
}

pub fn summarize(d: &Dump) -> RankSummary {
    let mut per_op: FxMap<(u32, u32), u64> = FxMap::default();
    let mut per_phase: BTreeMap<&'static str, u64> = BTreeMap::new();
    let mut per_step: BTreeMap<i64, u64> = BTreeMap::new();
    let mut nonfinite: FxMap<(u32, u32), NonfiniteOp> = FxMap::default();
    let mut raised = 0u64;
    let mut first_raised = None;
    let mut per_module: FxMap<u32, ModuleCalls> = FxMap::default();
    // Calls outside any module: all, NaN out, Inf out.
    let mut outside = (0u64, 0u64, 0u64);
    for i in 0..d.len() as u32 {
        let key = (d.op_id(i), d.overload_id(i));
        *per_op.entry(key).or_default() += 1;
        *per_phase.entry(d.phase(i).as_str()).or_default() += 1;
        *per_step.entry(d.step(i)).or_default() += 1;
        if d.error_text(i).is_some() {
            raised += 1;
            first_raised.get_or_insert(i);
        }
        let (_, nf_in, nan_out, inf_out) = io_flags(d, i);
        match d.op_row(i).module {
            NO_ID => {
                outside.0 += 1;
                outside.1 += nan_out as u64;
                outside.2 += inf_out as u64;
            }
            m => add_module_call(&mut per_module, d, i, m, (nan_out, inf_out)),
        }
        if nf_in || nan_out || inf_out {
            add_nonfinite(&mut nonfinite, d, i, key, (nf_in, nan_out, inf_out));
        }
    }
    let per_op = per_op_sorted(d, per_op);
    let mut per_module: Vec<ModuleCalls> = per_module.into_values().collect();
    per_module.sort_by_key(|m| m.first_seq);
    let mut nonfinite_ops: Vec<NonfiniteOp> = nonfinite.into_values().collect();
    nonfinite_ops.sort_by_key(|x| x.first_seq);

    let nan_from_finite = first_deepest(d, |i| {
        let (nan_in, _, nan_out, _) = io_flags(d, i);
        nan_out && !nan_in
    });
    let nonfinite_from_finite = first_deepest(d, |i| {
        let (_, nf_in, nan_out, inf_out) = io_flags(d, i);
        (nan_out || inf_out) && !nf_in
    });
    RankSummary {
        dump: DumpInfo::of(d),
        per_op,
        // A dump without module paths has no calls outside modules.
        calls_outside_modules: if per_module.is_empty() { 0 } else { outside.0 },
        calls_outside_modules_nan_out: if per_module.is_empty() { 0 } else { outside.1 },
        calls_outside_modules_inf_out: if per_module.is_empty() { 0 } else { outside.2 },
        per_module,
        per_phase,
        per_step,
        ops_raised: raised,
        first_raised: first_raised.map(|i| OpSite::of(d, i)),
        nonfinite_ops,
        first_nan_from_finite: nan_from_finite.map(|i| OpSite::of(d, i)),
        first_nonfinite_from_finite: nonfinite_from_finite.map(|i| OpSite::of(d, i)),
    }
}
