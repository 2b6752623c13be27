//! Where a divergence with no op to blame came from, when the dumps say:
//! a parameter that the previous step's optimizer changed.
//!
//! An aligned op reads a parameter that differs beyond its tolerance
//! (judged on its own: no aligned op made it), it is the first read of
//! that parameter in its step, and every aligned op before it agreed:
//! the previous step's forward and backward agreed, so its optimizer
//! changed the parameter differently on the two sides. The optimizers'
//! calls that one side makes and the other does not are where to look
//! (a per-parameter loop against `_foreach_` calls, or a call one side
//! lacks).

use opdump_format::{Phase, Role};

use crate::align::Alignment;
use crate::dump::{Dump, NONE};

/// A divergence first seen in a parameter the previous step's optimizer
/// changed.
#[derive(Clone, Debug, PartialEq)]
pub struct DriftSource {
    /// The aligned op that read the parameter (index into
    /// `alignment.pairs`): the first divergence.
    pub pair: usize,
    /// A's tensor of the parameter, as that op read it.
    pub tensor: u32,
    /// The parameter's name (`blocks.0.ln1.bias`).
    pub name: String,
    /// The step whose optimizer changed it (the step before the read).
    pub step: i64,
    /// That step's optimizer calls only in A, by op: (op, overload,
    /// calls), in the order A first made them.
    pub only_a: Vec<(String, String, u64)>,
    /// The same only in B.
    pub only_b: Vec<(String, String, u64)>,
}

impl DriftSource {
    /// The side whose optimizer makes calls the other lacks: `Some("B")`
    /// when only B has such calls, `Some("A")` when only A, `None` when
    /// both (or neither) do.
    pub fn unmatched_side(&self) -> Option<&'static str> {
        match (self.only_a.is_empty(), self.only_b.is_empty()) {
            (true, false) => Some("B"),
            (false, true) => Some("A"),
            _ => None,
        }
    }
}

/// The drift source of a first divergence at pair `first`, whose input
/// tensors `diverged` (A's) differ on their own: the first of them that is
/// a parameter read for the first time in its step, after a step with
/// optimizer calls. `None` when no such input is there.
pub fn drift_source(
    a: &Dump,
    b: &Dump,
    al: &Alignment,
    first: usize,
    diverged: &[u32],
) -> Option<DriftSource> {
    let p = al.pairs[first];
    let step = a.step(p.a);
    let tensor = diverged.iter().copied().find(|&t| {
        a.tensors.role(t) == Role::Input && a.tensor_name(t).is_some_and(is_parameter)
    })?;
    let name = a.tensor_name(tensor)?.to_string();
    // The step before this one that holds optimizer calls, on either side.
    let prev = [a, b]
        .iter()
        .flat_map(|d| {
            d.roots
                .iter()
                .filter(|&&r| d.phase(r) == Phase::Optimizer && d.step(r) < step)
                .map(|&r| d.step(r))
                .max()
        })
        .max()?;
    if read_before_in_step(a, al, first, &name, step) {
        return None;
    }
    Some(DriftSource {
        pair: first,
        tensor,
        name,
        step: prev,
        only_a: optimizer_calls(a, &al.only_a, prev),
        only_b: optimizer_calls(b, &al.only_b, prev),
    })
}

/// A parameter's name, not its gradient's.
fn is_parameter(name: &str) -> bool {
    !name.ends_with(".grad") && !name.is_empty()
}

/// Whether an aligned op of `step` before pair `first` read a tensor named
/// `name` (then this is not the parameter's first read in the step).
fn read_before_in_step(a: &Dump, al: &Alignment, first: usize, name: &str, step: i64) -> bool {
    al.pairs[..first]
        .iter()
        .rev()
        .take_while(|p| a.step(p.a) == step)
        .any(|p| {
            a.tensors_of(p.a)
                .any(|t| a.tensors.role(t) == Role::Input && a.tensor_name(t) == Some(name))
        })
}

/// The unmatched subtrees (`roots`) of `d` that are optimizer calls of
/// `step`, counted by op, in the order the optimizer first made them (a
/// `_foreach_lerp_` made once is as telling as an `item` made 30 times).
fn optimizer_calls(d: &Dump, roots: &[u32], step: i64) -> Vec<(String, String, u64)> {
    let mut counts: Vec<((u32, u32), u64)> = Vec::new();
    for &r in roots {
        if r == NONE || d.step(r) != step || d.phase(r) != Phase::Optimizer {
            continue;
        }
        let key = (d.op_id(r), d.overload_id(r));
        match counts.iter_mut().find(|(k, _)| *k == key) {
            Some((_, n)) => *n += 1,
            None => counts.push((key, 1)),
        }
    }
    counts
        .into_iter()
        .map(|((o, v), n)| (d.names.get(o).to_string(), d.names.get(v).to_string(), n))
        .collect()
}
