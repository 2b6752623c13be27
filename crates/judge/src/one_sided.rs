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
//! So an unaligned subtree is judged as a whole, by what it was fed: walking
//! back from the tensor to the root of the unaligned subtree that made it,
//! then through the roots' inputs to the tensors that aligned ops made (the
//! *frontier*), the largest difference among those, each relative to its
//! own norm, is what the calls were fed. A list op (`_foreach_*`,
//! `_fused_adamw_`) computes element i of its output lists from element i
//! of its input lists, so only those are followed: one parameter's update
//! is explained by its own gradient, not by the noisiest gradient of the
//! model. A difference within the tolerance of the subtrees' longest
//! reduction (a fused attention backward reduces over the head dimension;
//! its consumer, a `narrow`, over nothing) plus `min_amplification` times
//! what they were fed is explained, as an aligned op's output would be, and
//! it carries the taint of what they were fed. Each side is walked in its
//! own dump, and the side with the smaller frontier error decides.

use std::cell::RefCell;
use std::collections::HashSet;

use opdump_format::Role;

use crate::align::Alignment;
use crate::dump::{Dump, NONE};
use crate::hash_filter::HashFilter;
use crate::intern::{FxBuild, FxMap};
use crate::metrics::reduction_length;
use crate::opclass::classify;
use crate::provenance::{side_hash, side_hash_of_row};

/// How many subtree roots one walk visits at most (an optimizer's chain for
/// one parameter is a dozen), and how many calls of one subtree it reads
/// for their reduction length.
const WALK_LIMIT: usize = 512;

/// An unaligned subtree's output: the root of the subtree, and the list
/// element it is when the root itself returned it in a list.
type Made = (u32, Option<i32>);

/// The walk of one side.
#[derive(Default)]
struct Side {
    /// Side hash of an output of an unaligned call -> where it was made.
    made: FxMap<u64, Made>,
    /// Side hashes that unaligned roots read: only these need an error.
    read: HashSet<u64, FxBuild>,
    /// `read`'s bits: most aligned outputs, read by no unaligned root, are
    /// told so without a look-up in `read`.
    read_filter: HashFilter,
    /// Side hash of an aligned output -> (its error relative to its own
    /// norm, its taint).
    err: FxMap<u64, (f32, f32)>,
    /// Walks already made, by where they start.
    memo: RefCell<FxMap<Made, Option<Fed>>>,
}

/// The unaligned subtrees of each side, and the errors of the aligned
/// outputs they read, as judged so far.
#[derive(Default)]
pub struct OneSided {
    a: Side,
    b: Side,
}

/// What the unaligned calls behind a tensor were fed, and how long their
/// longest reduction was.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Fed {
    /// The largest error of an aligned output they read (relative to its
    /// own norm); `None` when they read none (a device's own copies lead to
    /// host tensors no aligned op made: that side tells nothing).
    pub error: Option<f64>,
    /// The largest taint among those outputs: what a divergence upstream
    /// passes on through the subtrees.
    pub taint: f64,
    /// The largest reduction length among the subtrees' calls
    /// (`metrics::reduction_length`): the rounding they may add is that of
    /// their longest reduction, not the consumer's.
    pub k: f64,
}

impl OneSided {
    /// What the calls only A or only B makes read, from the alignment.
    pub fn new(a: &Dump, b: &Dump, al: &Alignment) -> Self {
        // Each side walks its own dump's unaligned calls and their rows: A's
        // on a second thread, while this one walks B's (at the synthetic
        // 10M pair, 1 s on one thread, with the other core idle).
        std::thread::scope(|s| {
            let side_a = s.spawn(|| Side::new(a, &al.a_match));
            let side_b = Side::new(b, &al.b_match);
            let side_a = match side_a.join() {
                Ok(side) => side,
                Err(e) => std::panic::resume_unwind(e),
            };
            OneSided {
                a: side_a,
                b: side_b,
            }
        })
    }

    /// Records an aligned output (`ha`, `hb`: its side hashes in A and in
    /// B), its error relative to its own norm (`err`, computed only when an
    /// unaligned root reads the output) and its taint.
    pub fn register(&mut self, (ha, hb): (u64, u64), err: impl FnOnce() -> f64, taint: f64) {
        let (in_a, in_b) = (self.a.reads(ha), self.b.reads(hb));
        if !(in_a || in_b) {
            return;
        }
        let v = (err() as f32, taint as f32);
        if in_a {
            self.a.err.insert(ha, v);
        }
        if in_b {
            self.b.err.insert(hb, v);
        }
    }

    /// What made tensor `ta` of A and `tb` of B, when calls only one side
    /// makes did: `None` when neither side's producer is an unaligned call.
    pub fn fed(&self, a: &Dump, ta: u32, b: &Dump, tb: u32) -> Option<Fed> {
        let fa = self.a.walk(a, side_hash(a, ta));
        let fb = self.b.walk(b, side_hash(b, tb));
        match (fa, fb) {
            (Some(x), Some(y)) => {
                // The side with the smaller frontier error decides; one
                // that read nothing aligned tells nothing.
                let pick = match (x.error, y.error) {
                    (Some(p), Some(q)) if q < p => y,
                    (None, Some(_)) => y,
                    _ => x,
                };
                Some(Fed {
                    k: x.k.max(y.k),
                    ..pick
                })
            }
            (x, y) => x.or(y),
        }
    }
}

impl Side {
    fn new(d: &Dump, matched: &[u32]) -> Self {
        let mut side = Side::default();
        // The call's rows, read together once (each read of a row kept out
        // of memory is a look-up of its own).
        let mut rows = Vec::new();
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
            let ts = d.tensors_of(i);
            d.tensors.rows_of(ts.clone(), &mut rows);
            for (t, r) in ts.zip(&rows) {
                let output = r.role == Role::Output;
                // Only outputs, and the inputs of roots, are looked up.
                if !r.has_values() || !(output || i == root) {
                    continue;
                }
                let h = side_hash_of_row(d, t, r);
                if output {
                    // The root's own outputs come first (a parent's seq is
                    // below its children's) and keep their list element.
                    let li = if i == root {
                        (r.list_index >= 0).then_some(r.list_index)
                    } else {
                        None
                    };
                    side.made
                        .entry(h)
                        .and_modify(|m| {
                            if m.0 != root {
                                *m = (root, li)
                            }
                        })
                        .or_insert((root, li));
                } else {
                    side.read.insert(h);
                }
            }
        }
        side.read_filter = HashFilter::new(side.read.iter());
        side
    }

    /// Whether an unaligned root of this side reads the tensor of side hash
    /// `h`.
    #[inline]
    fn reads(&self, h: u64) -> bool {
        self.read_filter.may_contain(h) && self.read.contains(&h)
    }

    /// From the unaligned subtree that made the tensor of hash `start`,
    /// back through the roots' inputs; memoized by where it starts.
    fn walk(&self, d: &Dump, start: u64) -> Option<Fed> {
        let first = *self.made.get(&start)?;
        if let Some(f) = self.memo.borrow().get(&first) {
            return *f;
        }
        let mut stack = vec![first];
        let mut seen: HashSet<Made, FxBuild> = HashSet::default();
        seen.insert(first);
        let (mut error, mut taint, mut k) = (None::<f64>, 0.0f64, 1.0f64);
        let mut calls = Vec::new();
        while let Some((root, li)) = stack.pop() {
            // The subtree's longest reduction.
            calls.clear();
            calls.push(root);
            let mut c = 0;
            while c < calls.len() && calls.len() < WALK_LIMIT {
                calls.extend(d.children_of(calls[c]));
                c += 1;
            }
            for &i in &calls {
                k = k.max(reduction_length(d, i, classify(d.op_name(i))));
            }
            // What the root was fed: of a list output's element i, only
            // element i of the input lists (and the inputs not in a list).
            for t in d.tensors_of(root) {
                if d.tensors.role(t) != Role::Input || !d.tensors.has_values(t) {
                    continue;
                }
                let lt = d.list_index(t);
                if li.is_some() && lt.is_some() && lt != li {
                    continue;
                }
                let h = side_hash(d, t);
                if let Some(&(e, tn)) = self.err.get(&h) {
                    error = Some(error.unwrap_or(0.0).max(e as f64));
                    taint = taint.max(tn as f64);
                } else if let Some(&m) = self.made.get(&h) {
                    if seen.len() < WALK_LIMIT && seen.insert(m) {
                        stack.push(m);
                    }
                }
            }
        }
        let fed = Some(Fed { error, taint, k });
        self.memo.borrow_mut().insert(first, fed);
        fed
    }
}
