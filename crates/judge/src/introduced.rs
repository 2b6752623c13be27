//! What the top list and the headline rank introduced pairs by, kept for
//! those pairs alone.
//!
//! Per pair, the amplification and the excess (output error over what was
//! allowed) are read only where the verdict is `introduced`: a handful of
//! pairs in a run, where two dense columns took 8 bytes of every pair
//! (76 MB for the 10M op calls of the synthetic pair).

/// The ranking figures of one introduced pair.
#[derive(Clone, Copy, Debug, Default, PartialEq)]
pub struct Ranked {
    /// Output error over input error.
    pub amplification: f32,
    /// Output error over the error allowed for it.
    pub excess: f32,
}

/// Introduced pairs in increasing order of pair, with their figures.
#[derive(Clone, Debug, Default, PartialEq)]
pub struct Introduced {
    pairs: Vec<u32>,
    ranked: Vec<Ranked>,
}

impl Introduced {
    /// Records pair `k`, judged after every pair recorded so far (pairs
    /// are judged in order). Panics when it is not.
    pub fn push(&mut self, k: usize, amplification: f32, excess: f32) {
        let k = u32::try_from(k).expect("pair index fits in u32");
        assert!(
            self.pairs.last().is_none_or(|&l| l < k),
            "pair {k} out of order"
        );
        self.pairs.push(k);
        self.ranked.push(Ranked {
            amplification,
            excess,
        });
    }

    /// The figures of pair `k`; zeros for a pair never recorded (what the
    /// dense columns held for a pair that was not introduced).
    pub fn of(&self, k: usize) -> Ranked {
        u32::try_from(k)
            .ok()
            .and_then(|k| self.pairs.binary_search(&k).ok())
            .map_or(Ranked::default(), |i| self.ranked[i])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn finds_recorded_pairs_and_zeros_elsewhere() {
        let mut x = Introduced::default();
        x.push(3, 2.0, 10.0);
        x.push(70, 5.0, 0.5);
        assert_eq!(
            x.of(3),
            Ranked {
                amplification: 2.0,
                excess: 10.0
            }
        );
        assert_eq!(x.of(70).amplification, 5.0);
        assert_eq!(x.of(4), Ranked::default());
        assert_eq!(x.of(usize::MAX), Ranked::default());
    }

    #[test]
    #[should_panic]
    fn pairs_out_of_order_are_refused() {
        let mut x = Introduced::default();
        x.push(5, 1.0, 1.0);
        x.push(5, 1.0, 1.0);
    }
}
