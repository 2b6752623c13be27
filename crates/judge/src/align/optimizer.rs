//! An optimizer's per-parameter loop against its list kernels.
//!
//! On the CPU, `torch.optim.AdamW` runs a Python loop over the parameters
//! (`add_`, `mul_`, `lerp_`, `mul_`, `addcmul_`, `sqrt`, `div`, `add_`,
//! `addcdiv_` per parameter); on an accelerator, one `_foreach_X_` call per
//! step of that loop, over lists of every parameter's tensors. The diff
//! cannot pair one call with N, so these calls stayed unmatched and a fault
//! in a list kernel was never named.
//!
//! Within one (step, optimizer) group, among the top-level calls nothing
//! else paired: the list side has M calls of base op `X` (`_foreach_add_`
//! and `_foreach_add` are `add`) of N elements each; the loop side must
//! have exactly N x M calls of `X` (`add_`, `add`), in parameter-major
//! order, since both follow `param_groups`: loop call j is element j / M
//! of the (j % M)-th list call. Every such pair must agree in the shapes
//! (and, where both sides name them, the parameter names) of the tensors
//! that pair by position; where counts or shapes do not fit, the calls of
//! that base op stay unmatched, rather than pair wrongly.

use std::collections::BTreeMap;

use opdump_format::{Phase, Role};

use super::calls::Calls;
pub use super::calls::ListParams;
use super::fused::FusedTensors;
use super::{partners, sorted_unique, Alignment, Groups, Pair, Part};
use crate::dump::{Dump, NONE};
use crate::intern::NO_ID;
use crate::list_call::{is_list_op, list_base, loop_base, pair_by_position, rows_of, Layout};
use crate::refusal::Side;
use crate::tensor_row::TensorRow;

/// Whether some call of `roots` is a list call: only then is the pass
/// worth making.
pub(super) fn has_list_call(d: &Dump, roots: &[u32]) -> bool {
    roots.iter().any(|&r| {
        let op = d.op_name(r);
        is_list_op(op) || super::fused::is_fused_op(op)
    })
}

/// Pairs the list calls of each side with the other side's per-parameter
/// calls (see the module's documentation), appending the pairs to `out`
/// and the parameter names of the list calls paired to `params`.
pub(super) fn pair_list_calls(
    a: Calls<'_>,
    b: Calls<'_>,
    out: &mut Vec<Pair>,
    params: &mut Vec<ListParams>,
) {
    for (list, per_param) in [(a, b), (b, a)] {
        pair_one_way(list, per_param, out, params);
    }
}

/// Base op -> its calls, in order.
type ByBase = BTreeMap<String, Vec<u32>>;

fn pair_one_way(
    list: Calls<'_>,
    per_param: Calls<'_>,
    out: &mut Vec<Pair>,
    params: &mut Vec<ListParams>,
) {
    let mut lists = ByBase::new();
    for &r in list.roots {
        if let Some(base) = list_base(list.d.op_name(r)) {
            lists.entry(base.to_string()).or_default().push(r);
        }
    }
    if lists.is_empty() {
        return;
    }
    let mut loops = ByBase::new();
    for &r in per_param.roots {
        let op = per_param.d.op_name(r);
        if is_list_op(op) {
            continue;
        }
        if let Some(calls) = lists.get(loop_base(op)).map(|_| loop_base(op)) {
            loops.entry(calls.to_string()).or_default().push(r);
        }
    }
    // Per element count, the names found for each element, across bases.
    let mut names: BTreeMap<usize, Vec<Option<String>>> = BTreeMap::new();
    let mut paired: Vec<(u32, usize)> = Vec::new();
    for (base, lcalls) in &lists {
        let Some(pcalls) = loops.get(base) else {
            continue;
        };
        let layouts: Vec<Layout> = lcalls.iter().map(|&c| Layout::of(list.d, c)).collect();
        let n = layouts[0].len();
        if n == 0 || layouts.iter().any(|l| l.len() != n) || pcalls.len() != n * lcalls.len() {
            continue;
        }
        let m = lcalls.len();
        let mut found = vec![None; n];
        let fits = pcalls.iter().enumerate().all(|(j, &pc)| {
            let (elem, k) = (j / m, j % m);
            element_fits(
                list.d,
                &layouts[k].element(elem),
                per_param.d,
                pc,
                &mut found[elem],
            )
        });
        if !fits {
            continue;
        }
        for (j, &pc) in pcalls.iter().enumerate() {
            let (elem, lc) = ((j / m) as u32, lcalls[j % m]);
            let (ia, ib) = match list.side {
                Side::A => (lc, pc),
                Side::B => (pc, lc),
            };
            out.push(Pair::of_part(ia, ib, Part::element(list.side, elem)));
        }
        let pooled = names.entry(n).or_insert_with(|| vec![None; n]);
        for (p, f) in pooled.iter_mut().zip(found) {
            if p.is_none() {
                *p = f;
            }
        }
        paired.extend(lcalls.iter().map(|&c| (c, n)));
    }
    for (call, n) in paired {
        params.push(ListParams {
            side: list.side,
            call,
            names: names.get(&n).cloned().unwrap_or_default(),
        });
    }
}

/// Whether element tensors `elem` of a list call of `ld` and call `pc` of
/// `pd` are one parameter's: the tensors that pair by position have equal
/// shapes and, where both sides name them, equal names. Some input must
/// pair. The first name found goes to `name` (a gradient's without its
/// `.grad`).
fn element_fits(ld: &Dump, elem: &[u32], pd: &Dump, pc: u32, name: &mut Option<String>) -> bool {
    if elem.is_empty() {
        return false;
    }
    let xl = rows_of(ld, elem);
    let range = pd.tensors_of(pc);
    let ts: Vec<u32> = range.collect();
    let xp = rows_of(pd, &ts);
    let mut pairs = Vec::new();
    pair_by_position(&xl, &xp, &mut pairs);
    let row = |xs: &[(u32, TensorRow)], t: u32| xs.iter().find(|x| x.0 == t).map(|x| x.1);
    let mut inputs = 0;
    for (tl, tp) in pairs {
        let (Some(tl), Some(tp)) = (tl, tp) else {
            return false;
        };
        let (Some(rl), Some(rp)) = (row(&xl, tl), row(&xp, tp)) else {
            return false;
        };
        if ld.tensors.shapes.get(rl.shape) != pd.tensors.shapes.get(rp.shape) {
            return false;
        }
        if rl.role == Role::Input && !norms_may_agree(&rl, &rp) {
            return false;
        }
        let (nl, np) = (text(ld, rl.name), text(pd, rp.name));
        if let (Some(x), Some(y)) = (nl, np) {
            if x != y {
                return false;
            }
        }
        if name.is_none() {
            *name = nl
                .or(np)
                .map(|n| n.strip_suffix(".grad").unwrap_or(n).to_string());
        }
        inputs += (rl.role == Role::Input) as usize;
    }
    inputs > 0
}

/// Whether two inputs may be one tensor on two devices: their norms within
/// a factor of 2, where both are measured and finite. Two parameter groups
/// with lists of equal length and equal shapes (per-layer learning rates)
/// would pass the shape check crossed; their unnamed states (`eps`'s
/// `add_`, `sqrt`) differ by far more than any drift that leaves a run
/// worth comparing.
fn norms_may_agree(x: &TensorRow, y: &TensorRow) -> bool {
    if !(x.has_values() && y.has_values() && x.l2.is_finite() && y.l2.is_finite()) {
        return true;
    }
    let (lo, hi) = (x.l2.min(y.l2), x.l2.max(y.l2));
    hi <= 2.0 * lo
}

fn text(d: &Dump, id: u32) -> Option<&str> {
    (id != NO_ID).then(|| d.texts.get(id))
}

/// One element of a list call that a pair judges, as reports name it.
#[derive(Clone, Debug, PartialEq)]
pub struct Element {
    /// The side whose call is the list call.
    pub side: Side,
    /// The list call.
    pub call: u32,
    /// The element (the position in the call's lists).
    pub index: u32,
    /// The parameter the element is, where some call of its step names it.
    pub param: Option<String>,
}

impl Element {
    /// `element 3, blocks.0.ln1.bias`, or `element 3` when the parameter
    /// is not known.
    pub fn describe(&self) -> String {
        match &self.param {
            Some(p) => format!("element {}, {p}", self.index),
            None => format!("element {}", self.index),
        }
    }
}

impl Alignment {
    /// The list element pair `pair` judges, when it judges one (see
    /// [`Part`]).
    pub fn element(&self, pair: usize) -> Option<Element> {
        let p = self.pairs.get(pair)?;
        let (side, index) = p.part().element_of()?;
        let call = match side {
            Side::A => p.a,
            Side::B => p.b,
        };
        let param = self
            .list_params
            .binary_search_by_key(&(side == Side::B, call), |l| (l.side == Side::B, l.call))
            .ok()
            .and_then(|k| {
                self.list_params[k]
                    .names
                    .get(index as usize)
                    .cloned()
                    .flatten()
            });
        Some(Element {
            side,
            call,
            index,
            param,
        })
    }
}

/// Pairs, in each (step, optimizer) group where a side makes a list call
/// (`_foreach_`), the top-level calls nothing paired: list calls element by
/// element with the other side's per-parameter calls (see [`optimizer`]).
/// Other groups cost a look at their roots' op names.
pub(super) fn pair_optimizer_lists(
    a: &Dump,
    b: &Dump,
    (ga, gb): (&Groups, &Groups),
    (pairs, dissolved_a, dissolved_b): (&mut Vec<Pair>, &[u32], &[u32]),
) -> (Vec<ListParams>, Vec<FusedTensors>) {
    let mut params = Vec::new();
    let mut fused = Vec::new();
    let groups: Vec<(&Vec<u32>, &Vec<u32>)> = ga
        .iter()
        .filter(|(k, _)| k.1 == Phase::Optimizer)
        .filter_map(|(k, ra)| gb.get(k).map(|rb| (ra, rb)))
        .filter(|(ra, rb)| has_list_call(a, ra) || has_list_call(b, rb))
        .collect();
    if groups.is_empty() {
        return (params, fused);
    }
    let (a_match, b_match) = partners(pairs, a.len(), b.len());
    let (dissolved_a, dissolved_b) = (
        sorted_unique(dissolved_a.to_vec()),
        sorted_unique(dissolved_b.to_vec()),
    );
    let unmatched = |roots: &[u32], partner: &[u32], dissolved: &[u32]| -> Vec<u32> {
        roots
            .iter()
            .copied()
            .filter(|&r| partner[r as usize] == NONE && dissolved.binary_search(&r).is_err())
            .collect()
    };
    for (ra, rb) in groups {
        let ua = unmatched(ra, &a_match, &dissolved_a);
        let ub = unmatched(rb, &b_match, &dissolved_b);
        let before = pairs.len();
        pair_list_calls(
            Calls {
                d: a,
                side: Side::A,
                roots: &ua,
            },
            Calls {
                d: b,
                side: Side::B,
                roots: &ub,
            },
            pairs,
            &mut params,
        );
        // Then the fused kernels, among the calls still unmatched.
        let paired_now = &pairs[before..];
        let (pa, pb): (Vec<u32>, Vec<u32>) = (
            sorted_unique(paired_now.iter().map(|p| p.a).collect()),
            sorted_unique(paired_now.iter().map(|p| p.b).collect()),
        );
        let ua: Vec<u32> = ua
            .into_iter()
            .filter(|r| pa.binary_search(r).is_err())
            .collect();
        let ub: Vec<u32> = ub
            .into_iter()
            .filter(|r| pb.binary_search(r).is_err())
            .collect();
        super::fused::pair_fused(
            Calls {
                d: a,
                side: Side::A,
                roots: &ua,
            },
            Calls {
                d: b,
                side: Side::B,
                roots: &ub,
            },
            pairs,
            &mut fused,
            &mut params,
        );
    }
    // Sorted, for `Alignment::element`'s search.
    params.sort_by_key(|l| (l.side == Side::B, l.call));
    fused.sort_by_key(|f| (f.a, f.b, f.part));
    (params, fused)
}
