//! Tensors made by calls that only one side makes, judged by what those
//! calls were fed.
//!
//! Two correct devices often run different calls for the same step: a
//! per-parameter AdamW loop against `_foreach_` calls, a fused attention
//! kernel against its math path, a decomposed LayerNorm. Their outputs reach
//! aligned consumers with no aligned producer, and such an input used to be
//! tainted by its own error as soon as that exceeded the *consumer's*
//! tolerance, which knows nothing of the calls that made it. Adam's first
//! step, for one, turns a gradient that is pure rounding noise (the key
//! bias's) into a parameter update of relative size 1, on both devices,
//! differently.
//!
//! So the calls are judged as a whole: walking back from the tensor through
//! its unaligned producers to the tensors they read that aligned ops made
//! (the *frontier*), the largest difference among those, each relative to
//! its own norm, is what the calls were fed. A difference within the
//! tolerance of the calls' longest reduction (a fused attention backward
//! reduces over the head dimension; its consumer, a `narrow`, over
//! nothing) plus `min_amplification` times that is explained, as an
//! aligned op's output would be. Each side is walked in its own dump, and
//! the side with the smaller frontier error (the more specific one: a
//! per-parameter loop rather than a `_foreach_` call over all parameters)
//! decides.

use opdump_format::Role;

use crate::align::Alignment;
use crate::dump::{Dump, NONE};
use crate::intern::FxMap;
use crate::metrics::reduction_length;
use crate::opclass::classify;
use crate::provenance::side_hash;

/// How many calls one walk visits at most: an optimizer's chain for one
/// parameter is a dozen; a `_foreach_` call is one.
const WALK_LIMIT: usize = 512;

/// The unaligned producers of each side, by the statistics of their
/// outputs, and the errors of the aligned outputs judged so far.
#[derive(Default)]
pub struct OneSided {
    made_a: FxMap<u64, u32>,
    made_b: FxMap<u64, u32>,
    /// Side hash of an aligned output -> its error relative to its own norm.
    err_a: FxMap<u64, f32>,
    err_b: FxMap<u64, f32>,
}

impl OneSided {
    pub fn new(a: &Dump, b: &Dump, al: &Alignment) -> Self {
        OneSided {
            made_a: unaligned_outputs(a, &al.a_match),
            made_b: unaligned_outputs(b, &al.b_match),
            ..Default::default()
        }
    }

    /// Records an aligned output (`ha`: its side hash in A; `tb`: its
    /// tensor in B) and its error relative to its own norm. Nothing is kept
    /// when neither side has unaligned calls to explain.
    pub fn register(&mut self, b: &Dump, ha: u64, tb: u32, err: f64) {
        let e = err as f32;
        if !self.made_a.is_empty() {
            self.err_a.insert(ha, e);
        }
        if !self.made_b.is_empty() {
            self.err_b.insert(side_hash(b, tb), e);
        }
    }

    /// What made tensor `ta` of A and `tb` of B, when calls only one side
    /// makes did: `None` when neither side's producer is an unaligned call.
    pub fn fed(&self, a: &Dump, ta: u32, b: &Dump, tb: u32) -> Option<Fed> {
        let fa = walk(a, &self.made_a, &self.err_a, side_hash(a, ta));
        let fb = walk(b, &self.made_b, &self.err_b, side_hash(b, tb));
        match (fa, fb) {
            (Some(x), Some(y)) => Some(Fed {
                error: match (x.error, y.error) {
                    (Some(p), Some(q)) => Some(p.min(q)),
                    (p, q) => p.or(q),
                },
                k: x.k.max(y.k),
            }),
            (x, y) => x.or(y),
        }
    }
}

/// What the unaligned calls behind a tensor were fed, and how long their
/// longest reduction was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fed {
    /// The largest error of an aligned output they read (relative to its
    /// own norm); `None` when they read none.
    pub error: Option<f64>,
    /// The largest reduction length among them (`metrics::reduction_length`):
    /// the rounding they may add is that of their longest reduction, not
    /// the consumer's.
    pub k: f64,
}

/// Each output of an unaligned call, by side hash -> the root of its
/// unaligned subtree (the outermost unaligned call around it): the subtree
/// is judged as a whole.
fn unaligned_outputs(d: &Dump, matched: &[u32]) -> FxMap<u64, u32> {
    let mut made = FxMap::default();
    for i in 0..d.len() as u32 {
        if matched[i as usize] != NONE {
            continue;
        }
        let mut root = i;
        while let Some(p) = d.parent_of(root) {
            if matched[p as usize] != NONE {
                break;
            }
            root = p;
        }
        for t in d.tensors_of(i) {
            if d.tensors.role[t as usize] == Role::Output && d.tensors.has_values(t) {
                made.insert(side_hash(d, t), root);
            }
        }
    }
    made
}

/// From the unaligned call that made the tensor of hash `start`, back
/// through unaligned producers; the largest error of an aligned output
/// read on the way, `None` when none was (a device's own copies lead to
/// host tensors no aligned op made: that side tells nothing).
fn walk(d: &Dump, made: &FxMap<u64, u32>, err: &FxMap<u64, f32>, start: u64) -> Option<Fed> {
    let first = *made.get(&start)?;
    let mut stack = vec![first];
    let mut seen = vec![first];
    let mut worst: Option<f64> = None;
    let mut k = 1.0f64;
    let mut calls = Vec::new();
    while let Some(root) = stack.pop() {
        // The subtree of `root`: every call in it reads or reduces.
        calls.clear();
        calls.push(root);
        let mut c = 0;
        while c < calls.len() && calls.len() < WALK_LIMIT {
            calls.extend_from_slice(d.children_of(calls[c]));
            c += 1;
        }
        for &i in &calls {
            k = k.max(reduction_length(d, i, classify(d.op_name(i))));
            walk_inputs(d, i, made, err, &mut worst, &mut seen, &mut stack);
        }
    }
    Some(Fed { error: worst, k })
}

/// The inputs of call `i`: errors of aligned outputs into `worst`, unaligned
/// producers not seen yet onto `stack`.
fn walk_inputs(
    d: &Dump,
    i: u32,
    made: &FxMap<u64, u32>,
    err: &FxMap<u64, f32>,
    worst: &mut Option<f64>,
    seen: &mut Vec<u32>,
    stack: &mut Vec<u32>,
) {
    for t in d.tensors_of(i) {
        if d.tensors.role[t as usize] != Role::Input || !d.tensors.has_values(t) {
            continue;
        }
        let h = side_hash(d, t);
        if let Some(&e) = err.get(&h) {
            *worst = Some(worst.unwrap_or(0.0).max(e as f64));
        } else if let Some(&j) = made.get(&h) {
            if seen.len() < WALK_LIMIT && !seen.contains(&j) {
                seen.push(j);
                stack.push(j);
            }
        }
    }
}
