//! A bitmap in front of a large set of hashes: "certainly not in the set"
//! from memory the caches hold.
//!
//! The judging thread asks, for every aligned output (26M at the 10M
//! pair), whether an unaligned call reads it, and almost none is read. The
//! sets hold millions of hashes, far more than the caches: each question
//! was a miss to memory. One bit per hash, eight bits per member, answers
//! most questions with no look-up in the set (a false "maybe" for about 12%
//! of the hashes not in it, which the set then answers).

/// Bits of the filter per member of the set, rounded up to a power of two.
const BITS_PER_MEMBER: usize = 8;

/// Which bits a set of well-mixed 64-bit hashes sets.
pub struct HashFilter {
    words: Vec<u64>,
    /// A hash's bit is its top bits: `h >> shift`.
    shift: u32,
}

impl HashFilter {
    /// A filter of `hashes`, which must be well mixed (their top bits pick
    /// the bit).
    pub fn new<'a>(hashes: impl ExactSizeIterator<Item = &'a u64>) -> Self {
        let bits = (hashes.len() * BITS_PER_MEMBER).next_power_of_two().max(64);
        let mut f = HashFilter {
            words: vec![0; bits / 64],
            shift: 64 - bits.trailing_zeros(),
        };
        for &h in hashes {
            let b = f.bit(h);
            f.words[b / 64] |= 1 << (b % 64);
        }
        f
    }

    #[inline]
    fn bit(&self, h: u64) -> usize {
        // `shift` is at most 58 (64 bits or more).
        (h >> self.shift) as usize
    }

    /// False when `h` is certainly not one of the hashes; true when it may
    /// be.
    #[inline]
    pub fn may_contain(&self, h: u64) -> bool {
        let b = self.bit(h);
        self.words[b / 64] & (1 << (b % 64)) != 0
    }
}

impl Default for HashFilter {
    fn default() -> Self {
        HashFilter::new(std::iter::empty())
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::intern::mix;

    #[test]
    fn never_says_no_to_a_member_and_mostly_no_to_others() {
        let members: Vec<u64> = (0..100_000u64).map(|i| mix(0, i)).collect();
        let f = HashFilter::new(members.iter());
        assert!(members.iter().all(|&h| f.may_contain(h)));
        let others = (100_000..200_000u64).map(|i| mix(0, i));
        let maybe = others.filter(|&h| f.may_contain(h)).count();
        // 8 to 16 bits per member: at most about 12% say "maybe".
        assert!(maybe < 13_000, "{maybe}");
    }

    #[test]
    fn an_empty_filter_holds_nothing() {
        let f = HashFilter::default();
        assert!((0..1000u64).all(|i| !f.may_contain(mix(3, i))));
        let one = HashFilter::new([u64::MAX, 0].iter());
        assert!(one.may_contain(u64::MAX) && one.may_contain(0));
    }
}
