//! A column of `u32`s whose neighbours are close, in about 2 bytes each.
//!
//! The call tree's columns (each call's first tensor, where its children
//! start, the children themselves) are indices that grow with the call:
//! 64 neighbours span far less than 65536. Each block of 64 values keeps
//! its smallest value in full and every value as its distance from it in
//! 16 bits; a block whose values spread wider keeps them in full, in a
//! side column. 2.1 bytes a value where the blocks are narrow (all of them
//! in the dumps seen), 6.1 where none is.

/// Values per block.
const BLOCK: usize = 64;

/// `Block::wide` of a block kept as distances.
const NARROW: u32 = u32::MAX;

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Block {
    /// The smallest value of the block.
    base: u32,
    /// Where the block's values start in `PackedU32::wide`, or [`NARROW`]:
    /// they are `base + delta`.
    wide: u32,
}

/// A read-only column of `u32`, packed (see the module's text).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct PackedU32 {
    blocks: Vec<Block>,
    delta: Vec<u16>,
    wide: Vec<u32>,
}

impl PackedU32 {
    /// Packs `values`.
    pub fn new(values: &[u32]) -> Self {
        let mut blocks = Vec::with_capacity(values.len().div_ceil(BLOCK));
        let mut delta = Vec::with_capacity(values.len());
        let mut wide = Vec::new();
        for block in values.chunks(BLOCK) {
            let base = block.iter().copied().min().unwrap_or(0);
            let max = block.iter().copied().max().unwrap_or(0);
            if max - base <= u16::MAX as u32 {
                blocks.push(Block { base, wide: NARROW });
                delta.extend(block.iter().map(|&v| (v - base) as u16));
            } else {
                assert!(wide.len() < NARROW as usize, "too many values to pack");
                blocks.push(Block {
                    base,
                    wide: wide.len() as u32,
                });
                wide.extend_from_slice(block);
                delta.extend(std::iter::repeat_n(0, block.len()));
            }
        }
        PackedU32 {
            blocks,
            delta,
            wide,
        }
    }

    /// How many values.
    pub fn len(&self) -> usize {
        self.delta.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.delta.is_empty()
    }

    /// Value `i`.
    #[inline]
    pub fn get(&self, i: usize) -> u32 {
        let b = self.blocks[i / BLOCK];
        if b.wide == NARROW {
            b.base + self.delta[i] as u32
        } else {
            self.wide[b.wide as usize + i % BLOCK]
        }
    }

    /// Values `range`, in order.
    pub fn range(
        &self,
        range: std::ops::Range<usize>,
    ) -> impl DoubleEndedIterator<Item = u32> + ExactSizeIterator + '_ {
        range.map(move |i| self.get(i))
    }

    /// Every value, in order.
    pub fn to_vec(&self) -> Vec<u32> {
        self.range(0..self.len()).collect()
    }
}

/// Each call's parent, in about 2 bytes a call: the distance back to it.
///
/// A parent enters before its children, so in seq order it comes first,
/// and it is near: calls of one op's subtree are consecutive. The distance
/// is kept in 16 bits, 0 for no parent; a parent 65535 calls back or more
/// (or after the call, which a well-formed dump never has) is looked up in
/// a side list.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct Parents {
    back: Vec<u16>,
    /// (call, parent) of the calls whose `back` is [`FAR`], sorted by call.
    far: Vec<(u32, u32)>,
}

/// A `Parents::back` that says: look in the side list.
const FAR: u16 = u16::MAX;

impl Parents {
    /// Packs `parent` (indices, [`crate::NONE`] for none).
    pub fn new(parent: &[u32]) -> Self {
        let mut far = Vec::new();
        let back = parent
            .iter()
            .enumerate()
            .map(|(i, &p)| {
                let i = i as u32;
                if p == crate::NONE {
                    0
                } else if p < i && i - p < FAR as u32 {
                    (i - p) as u16
                } else {
                    far.push((i, p));
                    FAR
                }
            })
            .collect();
        Parents { back, far }
    }

    /// How many calls.
    pub fn len(&self) -> usize {
        self.back.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.back.is_empty()
    }

    /// The parent of call `i`, [`crate::NONE`] for none.
    #[inline]
    pub fn get(&self, i: u32) -> u32 {
        match self.back[i as usize] {
            0 => crate::NONE,
            FAR => {
                let k = self
                    .far
                    .binary_search_by_key(&i, |&(c, _)| c)
                    .expect("a call marked as having a far parent is in the side list");
                self.far[k].1
            }
            d => i - d as u32,
        }
    }

    /// Every parent, in order.
    pub fn to_vec(&self) -> Vec<u32> {
        (0..self.len() as u32).map(|i| self.get(i)).collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn check(values: &[u32]) -> PackedU32 {
        let p = PackedU32::new(values);
        assert_eq!(p.len(), values.len());
        for (i, &v) in values.iter().enumerate() {
            assert_eq!(p.get(i), v, "value {i}");
        }
        assert_eq!(p.to_vec(), values);
        assert!(p.range(3..values.len().min(70)).rev().eq(values
            .get(3..values.len().min(70))
            .unwrap_or(&[])
            .iter()
            .rev()
            .copied()));
        p
    }

    #[test]
    fn close_values_are_kept_as_distances() {
        let v: Vec<u32> = (0..1000).map(|i| 1_000_000 + i * 3 - (i % 7) * 5).collect();
        let p = check(&v);
        assert!(p.wide.is_empty());
        assert_eq!(p.blocks.len(), 16);
    }

    #[test]
    fn a_block_that_spreads_wider_is_kept_whole() {
        // Block 1 (values 64..128) holds u32::MAX and 64; block 2 spans
        // exactly 65535 (130 to 65665) and stays narrow, block 3 spans
        // 65536.
        let mut v: Vec<u32> = (0..300).collect();
        v[70] = u32::MAX;
        v[128] = 130 + 65535;
        v[129] = 200;
        v[192] = 100 + 65536;
        v[193] = 100;
        let p = check(&v);
        assert_eq!(p.blocks[1].wide, 0);
        assert_eq!(p.blocks[2].wide, NARROW);
        assert_eq!(p.blocks[3].wide, 64);
        assert_eq!(p.wide.len(), 128);
    }

    #[test]
    fn parents_near_far_and_none() {
        let none = crate::NONE;
        let far = FAR as u32;
        // 0 and 1 are roots; 2's parent is 1 back; 70000's is 70000 back;
        // the call 65535 back is far, 65534 back is not; a parent after its
        // child (not in a well-formed dump) is answered too.
        let mut parent = vec![none; 70_003];
        parent[2] = 1;
        parent[65_536] = 1; // 65535 back
        parent[65_535] = 1; // 65534 back
        parent[70_000] = 0;
        parent[70_001] = 70_002;
        parent[70_002] = 70_002 - (far - 1); // 65534 back: near
        let p = Parents::new(&parent);
        assert_eq!(p.to_vec(), parent);
        assert_eq!(p.far, vec![(65_536, 1), (70_000, 0), (70_001, 70_002)]);
        assert_eq!(p.get(65_535), 1);
        assert!(Parents::new(&[]).is_empty());
    }

    #[test]
    fn short_and_empty_columns() {
        check(&[]);
        check(&[7]);
        check(&[u32::MAX, 0, 5]);
    }
}
