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

use crate::dump::Dump;
use crate::intern::{mix, FxMap};

fn side_hash(d: &Dump, t: u32) -> u64 {
    let x = &d.tensors;
    let i = t as usize;
    // FxHash steps, one strong mix at the end.
    let mut h = x.shapes.hash(x.shape[i]);
    let [n, p, m] = x.nonfinite_counts(t);
    for v in [
        x.min[i],
        x.max[i],
        x.mean[i],
        x.std[i],
        x.l2[i],
        x.absmax[i],
    ] {
        h = (h.rotate_left(5) ^ v.to_bits()).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    for v in [n, p, m] {
        h = (h.rotate_left(5) ^ v as u64).wrapping_mul(0x51_7c_c1_b7_27_22_0a_95);
    }
    mix(h, x.numel(t) as u64)
}

/// The identity of a tensor pair, and of its A side alone.
pub fn key(a: &Dump, ta: u32, b: &Dump, tb: u32) -> (u64, u64) {
    let ha = side_hash(a, ta);
    (mix(ha, side_hash(b, tb)), ha)
}

#[derive(Default)]
pub struct Provenance {
    /// Pair identity -> its taint when produced: 0 when nothing upstream
    /// diverged, else the size of the error upstream.
    produced: FxMap<u64, f32>,
    /// The same by A's side alone. B may feed an op a tensor that went
    /// through calls A does not make (copies to and from a device, another
    /// decomposition); A's tensor still names the producer.
    produced_a: FxMap<u64, f32>,
}

impl Provenance {
    pub fn with_capacity(n: usize) -> Self {
        Provenance {
            produced: FxMap::with_capacity_and_hasher(n, Default::default()),
            produced_a: FxMap::with_capacity_and_hasher(n, Default::default()),
        }
    }

    /// Records an output; a later producer of the same tensor wins.
    pub fn register(&mut self, (pair, side_a): (u64, u64), taint: f64) {
        // A nonzero taint never rounds to 0 in f32.
        let t = if taint > 0.0 {
            (taint as f32).max(f32::MIN_POSITIVE)
        } else {
            0.0
        };
        self.produced.insert(pair, t);
        self.produced_a.insert(side_a, t);
    }

    /// The taint of this input when it was produced, if its producer is
    /// known: by the pair, else by A's side.
    pub fn lookup(&self, (pair, side_a): (u64, u64)) -> Option<f64> {
        self.produced
            .get(&pair)
            .or_else(|| self.produced_a.get(&side_a))
            .map(|&t| t as f64)
    }
}
