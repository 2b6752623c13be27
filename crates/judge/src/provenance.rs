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
    (pair_key(ha, side_hash_of_row(b, tb, rb)), ha)
}

/// The identity of a tensor pair from its sides' identities.
#[inline]
pub fn pair_key(side_a: u64, side_b: u64) -> u64 {
    mix(side_a, side_b)
}

/// Which aligned pair produced each tensor, by its statistics, and the taint it carried.
///
/// Two questions are asked of every input: was this pair of tensors (A's
/// and B's statistics together) produced by an aligned op, else was A's
/// tensor alone. Both are answered from one table keyed by A's side, whose
/// entry also holds the pair identity of the latest producer of that A
/// tensor: one random access per output registered and per input looked
/// up, where two tables cost two (the table is far larger than the caches
/// at 10M op calls, and its misses were most of the judging thread's
/// time), and 32 bytes an entry instead of 40 over two tables. A pair
/// identity that a later producer of the same A tensor displaced (same
/// statistics in A, other ones in B) moves to `displaced`, which stays
/// tiny: an exact answer, as two tables gave.
///
/// The taint and the producing pair matter only where the taint is not 0
/// (consumers of a clean output record no path), and almost every output
/// upstream of a divergence is clean: an entry holds an index into
/// `tainted` instead, 24 bytes a bucket, not 32 (200 MB at the synthetic
/// 10M pair's 6.3M outputs, not 264).
#[derive(Default)]
pub struct Provenance {
    /// A's side identity -> the latest producer of such a tensor.
    by_a: FxMap<u64, Produced>,
    /// Pair identity -> taint and producer, for pairs whose A side's entry
    /// in `by_a` now holds a later producer's pair.
    displaced: FxMap<u64, (f32, u32)>,
    /// The taint and the producer of each tainted registration.
    tainted: Vec<(f32, u32)>,
}

/// `Produced::tainted` of a clean output.
const CLEAN: u32 = u32::MAX;

/// The latest registration of an A tensor.
#[derive(Clone, Copy)]
struct Produced {
    /// The pair identity it was registered with.
    pair: u64,
    /// Its taint when produced (0 when nothing upstream diverged, else the
    /// size of the error upstream) and the aligned pair that produced it:
    /// an index into `Provenance::tainted`, [`CLEAN`] for taint 0.
    tainted: u32,
    /// B's tensor as produced (`NONE` when unknown). B may feed an op a
    /// tensor that went through calls A does not make (copies to and from
    /// a device, another decomposition); A's tensor still names the
    /// producer, and B's tensor as produced tells whether those calls
    /// changed its values.
    b_tensor: u32,
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
    /// The aligned pair (index into the alignment's pairs) that produced
    /// it, where the taint is not 0 (where it is, `NONE`: a clean output
    /// leaves no path to follow).
    pub producer: u32,
}

impl Provenance {
    /// An empty map with room for about `n` tensors.
    pub fn with_capacity(n: usize) -> Self {
        Provenance {
            by_a: FxMap::with_capacity_and_hasher(n, Default::default()),
            displaced: FxMap::default(),
            tainted: Vec::new(),
        }
    }

    /// The taint and producer an entry's `tainted` names.
    fn tainted(&self, k: u32) -> (f32, u32) {
        match k {
            CLEAN => (0.0, NONE),
            k => self.tainted[k as usize],
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
        let tainted = if t > 0.0 {
            self.tainted.push((t, producer));
            // Registrations are outputs of A, and a dump holds fewer than
            // u32::MAX tensors (the loader refuses more).
            (self.tainted.len() - 1) as u32
        } else {
            CLEAN
        };
        let new = Produced {
            pair,
            tainted,
            b_tensor: b_tensor.unwrap_or(NONE),
        };
        if let Some(old) = self.by_a.insert(side_a, new) {
            // The pair identity folds in A's side, so the entry replaced
            // was the latest producer of its pair too: it is still that
            // pair's answer.
            if old.pair != pair {
                let v = self.tainted(old.tainted);
                self.displaced.insert(old.pair, v);
            }
        }
    }

    /// Where this input came from, if its producer is known: by the pair,
    /// else by A's side.
    pub fn find(&self, (pair, side_a): (u64, u64)) -> Option<Found> {
        let latest = self.by_a.get(&side_a);
        let by_pair = match latest {
            Some(p) if p.pair == pair => Some(self.tainted(p.tainted)),
            _ if self.displaced.is_empty() => None,
            _ => self.displaced.get(&pair).copied(),
        };
        if let Some((t, producer)) = by_pair {
            return Some(Found {
                taint: t as f64,
                by_pair: true,
                b_produced: NONE,
                producer,
            });
        }
        latest.map(|p| {
            let (t, producer) = self.tainted(p.tainted);
            Found {
                taint: t as f64,
                by_pair: false,
                b_produced: p.b_tensor,
                producer,
            }
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::collections::HashMap;

    /// The two tables this one replaced: by pair, and by A's side alone.
    #[derive(Default)]
    struct TwoTables {
        by_pair: HashMap<u64, (f32, u32)>,
        by_a: HashMap<u64, (f32, u32, u32)>,
    }

    impl TwoTables {
        fn register(&mut self, (pair, a): (u64, u64), t: f32, b: u32, producer: u32) {
            // A clean output's producer is not kept (see `Found::producer`).
            let producer = if t > 0.0 { producer } else { NONE };
            self.by_pair.insert(pair, (t, producer));
            self.by_a.insert(a, (t, b, producer));
        }

        fn find(&self, (pair, a): (u64, u64)) -> Option<Found> {
            if let Some(&(t, producer)) = self.by_pair.get(&pair) {
                return Some(Found {
                    taint: t as f64,
                    by_pair: true,
                    b_produced: NONE,
                    producer,
                });
            }
            self.by_a.get(&a).map(|&(t, b, producer)| Found {
                taint: t as f64,
                by_pair: false,
                b_produced: b,
                producer,
            })
        }
    }

    /// A pair identity that folds in A's side, as `key_of_rows` makes it.
    fn key(a: u64, b: u64) -> (u64, u64) {
        (mix(a, b), a)
    }

    #[test]
    fn a_displaced_pair_is_still_found_by_pair() {
        let mut p = Provenance::with_capacity(4);
        p.register(key(1, 10), 0.0, Some(5), 0);
        // The same A tensor, another B tensor: the later producer of A's.
        p.register(key(1, 11), 0.5, Some(6), 1);
        let first = p.find(key(1, 10)).unwrap();
        assert!(first.by_pair && first.producer == NONE && first.taint == 0.0);
        let second = p.find(key(1, 11)).unwrap();
        assert!(second.by_pair && second.producer == 1 && second.taint == 0.5);
        // B fed a tensor no aligned op made: found by A's side, the latest.
        let by_a = p.find(key(1, 12)).unwrap();
        assert!(!by_a.by_pair && by_a.producer == 1 && by_a.b_produced == 6);
        assert_eq!(p.find(key(2, 10)), None);
        // Produced again by a later pair: that one wins, by pair too.
        p.register(key(1, 10), 0.25, None, 2);
        let again = p.find(key(1, 10)).unwrap();
        assert!(again.by_pair && again.producer == 2 && again.taint == 0.25);
        assert_eq!(p.find(key(1, 11)).unwrap().producer, 1);
    }

    #[test]
    fn answers_as_the_two_tables_did() {
        // Few A tensors and B tensors, so that sides collide often.
        let mut x = 0x9e37_79b9_7f4a_7c15u64;
        let mut next = |m: u64| {
            x ^= x << 13;
            x ^= x >> 7;
            x ^= x << 17;
            x % m
        };
        let (mut p, mut q) = (Provenance::with_capacity(8), TwoTables::default());
        for producer in 0..5000u32 {
            let k = key(next(40), next(6));
            if next(2) == 0 {
                let t = [0.0f32, 0.5, 2.0][next(3) as usize];
                let b = [NONE, 7, 9][next(3) as usize];
                let b_opt = (b != NONE).then_some(b);
                p.register(k, t as f64, b_opt, producer);
                q.register(k, t, b, producer);
            } else {
                assert_eq!(p.find(k), q.find(k), "at {producer}");
            }
        }
    }
}
