//! A fused optimizer kernel against the other side's per-parameter loop.
//!
//! With `fused=True`, `AdamW`, `Adam` and `SGD` run one kernel per step
//! (`_fused_adamw_(self[], grads[], exp_avgs[], exp_avg_sqs[], …)`,
//! `_fused_sgd_(self[], grads[], momentum_buffer_list[], …)`) where the
//! CPU runs a loop of small calls per parameter. No call of the loop does
//! what the kernel does, so the kernel is judged by what it writes: per
//! element `i` (parameter `p`, named on the kernel's `self[i]`), each list
//! it writes against the loop's call that wrote that value:
//!
//! - `self[i]`: the last call of the loop whose `self` is `p` (AdamW's
//!   `addcdiv_`, SGD's `add_`);
//! - `exp_avgs[i]`: the `lerp_` that reads `p.grad`;
//! - `exp_avg_sqs[i]`: the `addcmul_` that reads `p.grad`;
//! - `momentum_buffer_list[i]`: SGD's `add_` that reads `p.grad` (its first
//!   step clones the gradient instead: then that list is not judged).
//!
//! Each such pair names its tensors explicitly ([`FusedTensors`]): the
//! kernel's inputs of element `i` against the values the loop read before
//! it changed them (the parameter, its gradient, the states), and the
//! written output against that call's output. An output that diverges
//! while those inputs agree is introduced at the kernel; a gradient that
//! diverged upstream taints the pair, which then inherits.

use std::collections::HashMap;

use opdump_format::Role;

use super::calls::{Calls, ListParams};
use super::{Pair, Part};
use crate::dump::Dump;
use crate::intern::NO_ID;
use crate::list_call::loop_base;
use crate::refusal::Side;

/// Which list of a fused kernel a pair judges (the order, within an
/// element, in which its pairs are judged: states before the parameter).
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
#[repr(u8)]
pub enum Written {
    /// `exp_avgs` (Adam's first moment).
    ExpAvgs = 0,
    /// `exp_avg_sqs` (Adam's second moment).
    ExpAvgSqs = 1,
    /// `momentum_buffer_list` (SGD's momentum).
    Momentum = 2,
    /// `self`: the parameter.
    Param = 3,
}

impl Written {
    pub(super) fn from_bits(b: u32) -> Self {
        match b & 3 {
            0 => Written::ExpAvgs,
            1 => Written::ExpAvgSqs,
            2 => Written::Momentum,
            _ => Written::Param,
        }
    }

    /// The kernel's argument name of the list.
    pub fn arg(self) -> &'static str {
        match self {
            Written::ExpAvgs => "exp_avgs",
            Written::ExpAvgSqs => "exp_avg_sqs",
            Written::Momentum => "momentum_buffer_list",
            Written::Param => "self",
        }
    }
}

/// The tensors one fused pair judges, each as (A's tensor, B's tensor):
/// inputs, then the written output.
#[derive(Clone, Debug, PartialEq)]
pub struct FusedTensors {
    /// The pair's call in A.
    pub a: u32,
    /// The pair's call in B.
    pub b: u32,
    /// The pair's part (see [`Part::fused`]).
    pub part: Part,
    /// (tensor of A, tensor of B), inputs first.
    pub tensors: Vec<(u32, u32)>,
}

/// Whether `op` is a fused optimizer kernel this pass knows.
pub fn is_fused_op(op: &str) -> bool {
    matches!(
        crate::opclass::after_last_colons(op),
        "_fused_adamw_"
            | "_fused_adam_"
            | "_fused_sgd_"
            | "_fused_adamw"
            | "_fused_adam"
            | "_fused_sgd"
    )
}

/// One tensor of a call: its index and what pairing needs of its row.
#[derive(Clone, Copy)]
struct T {
    t: u32,
    input: bool,
    arg: u32,
    name: u32,
    shape: u32,
    list_index: i32,
}

fn tensors(d: &Dump, call: u32) -> Vec<T> {
    d.tensors_of(call)
        .filter_map(|t| {
            let r = d.tensors.row(t);
            (r.role != Role::None).then_some(T {
                t,
                input: r.role == Role::Input,
                arg: r.arg,
                name: r.name,
                shape: r.shape,
                list_index: r.list_index,
            })
        })
        .collect()
}

fn name_of<'d>(d: &'d Dump, x: &T) -> Option<&'d str> {
    (x.name != NO_ID).then(|| d.texts.get(x.name))
}

/// Pairs, both ways, each fused kernel among one side's calls with the
/// other side's per-parameter calls (see the module's documentation).
pub(super) fn pair_fused(
    a: Calls<'_>,
    b: Calls<'_>,
    out: &mut Vec<Pair>,
    table: &mut Vec<FusedTensors>,
    params: &mut Vec<ListParams>,
) {
    for (fused, per_param) in [(a, b), (b, a)] {
        for &r in fused.roots {
            if is_fused_op(fused.d.op_name(r)) {
                pair_one(fused, r, per_param, out, table, params);
            }
        }
    }
}

/// The loop's calls, each with its tensors, in call order.
struct Loop<'a> {
    d: &'a Dump,
    calls: Vec<(u32, Vec<T>)>,
    /// Per parameter or gradient name: the calls with an input of that
    /// name, in order.
    by_name: HashMap<&'a str, Vec<usize>>,
}

impl<'a> Loop<'a> {
    fn new(d: &'a Dump, roots: &[u32]) -> Self {
        let calls: Vec<(u32, Vec<T>)> = roots.iter().map(|&c| (c, tensors(d, c))).collect();
        let mut by_name: HashMap<&'a str, Vec<usize>> = HashMap::new();
        for (k, (_, ts)) in calls.iter().enumerate() {
            for x in ts.iter().filter(|x| x.input) {
                if let Some(n) = name_of(d, x) {
                    let v = by_name.entry(n).or_default();
                    if v.last() != Some(&k) {
                        v.push(k);
                    }
                }
            }
        }
        Loop { d, calls, by_name }
    }

    /// The calls with an input named `n`, in order.
    fn with_name(&self, n: &str) -> &[usize] {
        self.by_name.get(n).map_or(&[], Vec::as_slice)
    }

    fn named(&self, x: &T, n: &str) -> bool {
        name_of(self.d, x) == Some(n)
    }

    /// The input `self` of call `k`.
    fn self_input(&self, k: usize) -> Option<T> {
        self.calls[k]
            .1
            .iter()
            .find(|x| x.input && self.d.names.get(x.arg) == "self")
            .copied()
    }

    fn output(&self, k: usize) -> Option<T> {
        self.calls[k].1.iter().find(|x| !x.input).copied()
    }

    fn base(&self, k: usize) -> &str {
        loop_base(self.d.op_name(self.calls[k].0))
    }

    /// The first call of base `base` with an input named `grad`, and that
    /// input.
    fn reading(&self, base: &str, grad: &str) -> Option<(usize, T)> {
        self.with_name(grad).iter().find_map(|&k| {
            if self.base(k) != base {
                return None;
            }
            let g = self.calls[k]
                .1
                .iter()
                .find(|x| x.input && self.named(x, grad))?;
            Some((k, *g))
        })
    }

    /// The `self` input of the `mul_` on an unnamed state just before call
    /// `k` (the state's value before this step's loop changed it), within
    /// `since`..`k`.
    fn state_before(&self, since: usize, k: usize) -> Option<T> {
        (since..k).rev().find_map(|j| {
            if self.base(j) != "mul" {
                return None;
            }
            let s = self.self_input(j)?;
            (s.name == NO_ID).then_some(s)
        })
    }
}

/// A written list, the loop call that wrote it, and the tensors that pair
/// (kernel's, loop's).
type Judged = (Written, usize, Vec<(T, T)>);

fn pair_one(
    fused: Calls<'_>,
    call: u32,
    per_param: Calls<'_>,
    out: &mut Vec<Pair>,
    table: &mut Vec<FusedTensors>,
    params: &mut Vec<ListParams>,
) {
    let fd = fused.d;
    let ft = tensors(fd, call);
    let n = ft
        .iter()
        .map(|x| x.list_index + 1)
        .max()
        .unwrap_or(0)
        .max(0) as usize;
    if n == 0 {
        return;
    }
    let lp = Loop::new(per_param.d, per_param.roots);
    let find = |i: usize, arg: &str, input: bool| {
        ft.iter()
            .find(|x| x.list_index == i as i32 && x.input == input && fd.names.get(x.arg) == arg)
            .copied()
    };
    let mut names = vec![None; n];
    let mut any = false;
    for (i, slot) in names.iter_mut().enumerate() {
        let Some(param) = find(i, "self", true) else {
            continue;
        };
        let Some(p) = name_of(fd, &param).map(str::to_string) else {
            continue;
        };
        *slot = Some(p.clone());
        let grad = format!("{p}.grad");
        let g_in = find(i, "grads", true);
        // The loop's calls on this parameter: whose `self` is `p`.
        let touching: Vec<usize> = lp
            .with_name(&p)
            .iter()
            .copied()
            .filter(|&k| lp.self_input(k).is_some_and(|s| lp.named(&s, &p)))
            .collect();
        let lerp = lp.reading("lerp", &grad);
        let mut state_in: Vec<(T, T)> = Vec::new();
        let mut written: Vec<Judged> = Vec::new();
        if let (Some((k, lg)), Some(gi)) = (lerp, g_in) {
            let mut ts = vec![(gi, lg)];
            if let (Some(ea), Some(s)) = (find(i, "exp_avgs", true), lp.self_input(k)) {
                ts.push((ea, s));
                state_in.push((ea, s));
            }
            written.push((Written::ExpAvgs, k, ts));
        }
        if let (Some((k, cg)), Some(gi)) = (lp.reading("addcmul", &grad), g_in) {
            let mut ts = vec![(gi, cg)];
            if let (Some(s), Some(before)) = (
                find(i, "exp_avg_sqs", true),
                lp.state_before(k.saturating_sub(3), k),
            ) {
                ts.push((s, before));
                state_in.push((s, before));
            }
            written.push((Written::ExpAvgSqs, k, ts));
        }
        if find(i, "momentum_buffer_list", false).is_some() {
            // SGD's `buf.mul_(momentum).add_(grad)`: the `add_` on an
            // unnamed buffer that reads the gradient.
            // The call and its gradient input, found once.
            let hit = lp.with_name(&grad).iter().copied().find_map(|k| {
                let unnamed_self = lp.self_input(k).is_some_and(|s| s.name == NO_ID);
                if lp.base(k) != "add" || !unnamed_self {
                    return None;
                }
                let cg = lp.calls[k]
                    .1
                    .iter()
                    .find(|x| x.input && lp.named(x, &grad))?;
                Some((k, *cg))
            });
            if let (Some((k, cg)), Some(gi)) = (hit, g_in) {
                let mut ts = vec![(gi, cg)];
                if let (Some(s), Some(before)) = (
                    find(i, "momentum_buffer_list", true),
                    lp.state_before(k.saturating_sub(3), k),
                ) {
                    ts.push((s, before));
                }
                written.push((Written::Momentum, k, ts));
            }
        }
        if let (Some(&first), Some(&last)) = (touching.first(), touching.last()) {
            let mut ts = Vec::new();
            if let Some(s) = lp.self_input(first) {
                ts.push((param, s));
            }
            let read_grad = lp.with_name(&grad).iter().find_map(|&k| {
                lp.calls[k]
                    .1
                    .iter()
                    .find(|x| x.input && lp.named(x, &grad))
                    .copied()
            });
            if let (Some(gi), Some(lg)) = (g_in, read_grad) {
                ts.push((gi, lg));
            }
            ts.extend(state_in.iter().copied());
            written.push((Written::Param, last, ts));
        }
        for (kind, k, mut ts) in written {
            let (Some(o_fused), Some(o_loop)) = (find(i, kind.arg(), false), lp.output(k)) else {
                continue;
            };
            ts.push((o_fused, o_loop));
            if ts
                .iter()
                .any(|(x, y)| fd.tensors.shapes.get(x.shape) != lp.d.tensors.shapes.get(y.shape))
            {
                continue;
            }
            let lc = lp.calls[k].0;
            let part = Part::fused(fused.side, i as u32, kind);
            let (pa, pb) = match fused.side {
                Side::A => (call, lc),
                Side::B => (lc, call),
            };
            let tensors = ts
                .iter()
                .map(|(x, y)| match fused.side {
                    Side::A => (x.t, y.t),
                    Side::B => (y.t, x.t),
                })
                .collect();
            out.push(Pair::of_part(pa, pb, part));
            table.push(FusedTensors {
                a: pa,
                b: pb,
                part,
                tensors,
            });
            any = true;
        }
    }
    if any {
        params.push(ListParams {
            side: fused.side,
            call,
            names,
        });
    }
}
