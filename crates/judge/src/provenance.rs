//! Which op produced an input, known by its statistics.
//!
//! A dump does not say which op produced a tensor. But a tensor passed from
//! one op to the next has the very same statistics at both ends (on both
//! sides), so the statistics of both sides, together, identify it. Walking
//! the aligned ops in call order, each op's outputs are registered with
//! their *taint*: 0 when no divergence lies upstream, else the size of the
//! error that diverged upstream. An input found there takes that taint. An
//! input not found (parameters, data, the output of an op only one side
//! has) is judged on its own: tainted by its own error when that exceeds
//! the tolerance.
//!
//! Taint is what keeps a faulty op's consequences from being blamed on
//! later ops: the statistics only bound an error from below, so an error
//! can vanish from them for a few ops and show again after a reduction.
//!
//! Two distinct tensors with identical statistics on both sides (zeros of
//! one shape) hold the same values, so mixing them up changes nothing.

use crate::dump::{Dump, NONE};
use crate::intern::{mix, FxMap};
use crate::tensor_row::TensorRow;

/// The identity of one side's tensor by its statistics.
pub fn side_hash(d: &Dump, t: u32) -> u64 {
    side_hash_of_row(d, t, &d.tensors.row(t))
}

/// [`side_hash`] of tensor `t`, its row `r` already read.
pub fn side_hash_of_row(d: &Dump, t: u32, r: &TensorRow) -> u64 {
    let x = &d.tensors;
    // FxHash steps, one strong mix at the end.
    let mut h = x.shapes.hash(r.shape);
    let [n, p, m] = x.nonfinite_counts(t);
    for v in r.stats() {
        h = (h.rotate_left(5) ^ v.to_bits()).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    for v in [n, p, m] {
        h = (h.rotate_left(5) ^ v as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    mix(h, x.shapes.numel(r.shape) as u64)
}

/// The identity of a tensor pair, and of its A side alone.
pub fn key(a: &Dump, ta: u32, b: &Dump, tb: u32) -> (u64, u64) {
    key_of_rows(a, ta, &a.tensors.row(ta), b, tb, &b.tensors.row(tb))
}

/// [`key`], the two rows already read.
pub fn key_of_rows(
    a: &Dump,
    ta: u32,
    ra: &TensorRow,
    b: &Dump,
    tb: u32,
    rb: &TensorRow,
) -> (u64, u64) {
    let ha = side_hash_of_row(a, ta, ra);
    (mix(ha, side_hash_of_row(b, tb, rb)), ha)
}

/// Which aligned pair produced each tensor, by its statistics, and the taint it carried.
#[derive(Default)]
pub struct Provenance {
    /// Pair identity -> its taint when produced (0 when nothing upstream
    /// diverged, else the size of the error upstream), and the aligned pair
    /// that produced it.
    produced: FxMap<u64, (f32, u32)>,
    /// The same by A's side alone, with B's tensor as produced (`NONE` when
    /// unknown). B may feed an op a tensor that went through calls A does
    /// not make (copies to and from a device, another decomposition); A's
    /// tensor still names the producer, and B's tensor as produced tells
    /// whether those calls changed its values. Then the producing pair.
    produced_a: FxMap<u64, (f32, u32, u32)>,
}

/// Where an input came from, as far as the statistics tell.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct Found {
    /// The taint of the tensor when it was produced.
    pub taint: f64,
    /// Found by the pair: B fed the very tensor its aligned producer made.
    /// Else found by A's side alone, and `b_produced` is the tensor B's
    /// aligned producer made (`NONE` when unknown).
    pub by_pair: bool,
    /// See `by_pair`.
    pub b_produced: u32,
    /// The aligned pair (index into the alignment's pairs) that produced it.
    pub producer: u32,
}

impl Provenance {
    /// An empty map with room for about `n` tensors.
    pub fn with_capacity(n: usize) -> Self {
        Provenance {
            produced: FxMap::with_capacity_and_hasher(n, Default::default()),
            produced_a: FxMap::with_capacity_and_hasher(n, Default::default()),
        }
    }

    /// Records an output of aligned pair `producer`, `b_tensor` its B side;
    /// a later producer of the same tensor wins.
    pub fn register(
        &mut self,
        (pair, side_a): (u64, u64),
        taint: f64,
        b_tensor: Option<u32>,
        producer: u32,
    ) {
        // A nonzero taint never rounds to 0 in f32.
        let t = if taint > 0.0 {
            (taint as f32).max(f32::MIN_POSITIVE)
        } else {
            0.0
        };
        self.produced.insert(pair, (t, producer));
        self.produced_a
            .insert(side_a, (t, b_tensor.unwrap_or(NONE), producer));
    }

    /// Where this input came from, if its producer is known: by the pair,
    /// else by A's side.
    pub fn find(&self, (pair, side_a): (u64, u64)) -> Option<Found> {
        if let Some(&(t, producer)) = self.produced.get(&pair) {
            return Some(Found {
                taint: t as f64,
                by_pair: true,
                b_produced: NONE,
                producer,
            });
        }
        self.produced_a.get(&side_a).map(|&(t, b, producer)| Found {
            taint: t as f64,
            by_pair: false,
            b_produced: b,
            producer,
        })
    }
}
