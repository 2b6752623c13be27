//! Interning of the strings and shapes of a dump, and a fast hash.
//!
//! A dump of a million op calls repeats a few hundred op names, argument
//! names, dtypes and shapes millions of times. Each distinct value is stored
//! once and rows hold a `u32` id, so memory grows with the number of rows by a
//! few bytes, not by a heap object per row.
//!
//! Ids are local to one dump. Values that must be compared across the two
//! dumps (op signatures) go through [`Interner::hash`], a content hash that is
//! the same on both sides.

use std::collections::HashMap;
use std::hash::{BuildHasherDefault, Hasher};

/// The multiply-rotate hash of rustc (FxHash). Not DoS-resistant, which does
/// not matter for local files, and several times faster than SipHash on the
/// short keys we hash.
#[derive(Default, Clone, Copy)]
pub struct FxHasher {
    hash: u64,
}

const SEED: u64 = 0x51_7c_c1_b7_27_22_0a_95;

impl FxHasher {
    #[inline]
    fn add(&mut self, w: u64) {
        self.hash = (self.hash.rotate_left(5) ^ w).wrapping_mul(SEED);
    }
}

impl Hasher for FxHasher {
    #[inline]
    fn write(&mut self, bytes: &[u8]) {
        let mut chunks = bytes.chunks_exact(8);
        for c in &mut chunks {
            let mut w = [0u8; 8];
            w.copy_from_slice(c);
            self.add(u64::from_le_bytes(w));
        }
        let rest = chunks.remainder();
        if !rest.is_empty() {
            let mut w = [0u8; 8];
            w[..rest.len()].copy_from_slice(rest);
            self.add(u64::from_le_bytes(w) ^ ((rest.len() as u64) << 56));
        }
    }
    #[inline]
    fn write_u8(&mut self, i: u8) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u32(&mut self, i: u32) {
        self.add(i as u64);
    }
    #[inline]
    fn write_u64(&mut self, i: u64) {
        self.add(i);
    }
    #[inline]
    fn write_usize(&mut self, i: usize) {
        self.add(i as u64);
    }
    #[inline]
    fn finish(&self) -> u64 {
        self.hash
    }
}

/// The hasher of [`FxMap`].
pub type FxBuild = BuildHasherDefault<FxHasher>;
/// A `HashMap` with the Fx hash (keys are ids and hashes, not attacker-chosen strings).
pub type FxMap<K, V> = HashMap<K, V, FxBuild>;

/// A well-mixed 64-bit combination (splitmix64 finaliser), used to build op
/// signatures from content hashes. FxHash alone mixes too little for values
/// that are themselves hashes and then compared for equality.
#[inline]
pub fn mix(h: u64, v: u64) -> u64 {
    let mut z = h ^ v
        .wrapping_add(0x9e37_79b9_7f4a_7c15)
        .wrapping_add(h << 6)
        .wrapping_add(h >> 2);
    z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
    z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
    z ^ (z >> 31)
}

/// Content hash of a byte string, equal across dumps.
pub fn hash_bytes(b: &[u8]) -> u64 {
    let mut h = FxHasher::default();
    h.write(b);
    mix(h.finish(), b.len() as u64)
}

/// No id: a null text.
pub const NO_ID: u32 = u32::MAX;

/// Distinct strings, each stored once. Lookup goes through the content hash
/// with a chain for the (rare) collisions, so there is no second copy of each
/// string as a map key.
#[derive(Default)]
pub struct Interner {
    strs: Vec<Box<str>>,
    hashes: Vec<u64>,
    /// Next id with the same hash, or `NO_ID`.
    next: Vec<u32>,
    first: FxMap<u64, u32>,
}

impl Interner {
    /// The id of `s`, added when new.
    pub fn intern(&mut self, s: &str) -> u32 {
        let h = hash_bytes(s.as_bytes());
        let mut id = self.first.get(&h).copied().unwrap_or(NO_ID);
        let head = id;
        while id != NO_ID {
            if &*self.strs[id as usize] == s {
                return id;
            }
            id = self.next[id as usize];
        }
        let new = self.strs.len() as u32;
        self.strs.push(s.into());
        self.hashes.push(h);
        self.next.push(head);
        self.first.insert(h, new);
        new
    }

    /// The string of an id; `""` for `NO_ID`.
    pub fn get(&self, id: u32) -> &str {
        self.strs.get(id as usize).map(|s| &**s).unwrap_or("")
    }

    /// The content hash of an id, equal for equal strings in any dump.
    pub fn hash(&self, id: u32) -> u64 {
        self.hashes.get(id as usize).copied().unwrap_or(0)
    }

    /// How many distinct strings there are.
    pub fn len(&self) -> usize {
        self.strs.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.strs.is_empty()
    }
}

/// Distinct (shape, numel) pairs, the dims stored flat in one pool. The
/// numel lives here rather than per tensor: it is the shape's product, and
/// 8 bytes per tensor add up over millions of tensors.
#[derive(Default)]
pub struct ShapeInterner {
    pool: Vec<i64>,
    offsets: Vec<u32>,
    numels: Vec<i64>,
    hashes: Vec<u64>,
    next: Vec<u32>,
    first: FxMap<u64, u32>,
}

impl ShapeInterner {
    /// An interner holding nothing but the empty shape.
    pub fn new() -> Self {
        ShapeInterner {
            offsets: vec![0],
            ..Default::default()
        }
    }

    /// Interns `dims` (the shape) with its `numel`. The signature hash
    /// ([`Self::hash`]) covers the dims only.
    pub fn intern(&mut self, dims: &[i64], numel: i64) -> u32 {
        let mut hs = FxHasher::default();
        for &d in dims {
            hs.write_u64(d as u64);
        }
        let h = mix(hs.finish(), dims.len() as u64);
        let mut id = self.first.get(&h).copied().unwrap_or(NO_ID);
        let head = id;
        while id != NO_ID {
            if self.get(id) == dims && self.numels[id as usize] == numel {
                return id;
            }
            id = self.next[id as usize];
        }
        let new = self.hashes.len() as u32;
        self.pool.extend_from_slice(dims);
        self.offsets.push(self.pool.len() as u32);
        self.numels.push(numel);
        self.hashes.push(h);
        self.next.push(head);
        self.first.insert(h, new);
        new
    }

    /// The dims of an id; empty for `NO_ID` (a tensor without a shape).
    pub fn get(&self, id: u32) -> &[i64] {
        let i = id as usize;
        match (self.offsets.get(i), self.offsets.get(i + 1)) {
            (Some(&s), Some(&e)) => &self.pool[s as usize..e as usize],
            _ => &[],
        }
    }

    /// The hash of shape `id` (equal shapes, equal hashes, across dumps).
    pub fn hash(&self, id: u32) -> u64 {
        self.hashes.get(id as usize).copied().unwrap_or(0)
    }

    /// The number of elements of shape `id`.
    pub fn numel(&self, id: u32) -> i64 {
        self.numels.get(id as usize).copied().unwrap_or(0)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn strings_are_stored_once() {
        let mut i = Interner::default();
        let a = i.intern("aten::add");
        let b = i.intern("aten::mul");
        assert_eq!(i.intern("aten::add"), a);
        assert_ne!(a, b);
        assert_eq!(i.get(b), "aten::mul");
        assert_eq!(i.len(), 2);
        let mut j = Interner::default();
        j.intern("x");
        let k = j.intern("aten::add");
        assert_eq!(j.hash(k), i.hash(a));
    }

    #[test]
    fn shapes_are_stored_once() {
        let mut s = ShapeInterner::new();
        let a = s.intern(&[2, 3], 6);
        let b = s.intern(&[], 1);
        assert_eq!(s.intern(&[2, 3], 6), a);
        assert_eq!(s.get(a), &[2, 3]);
        assert_eq!(s.numel(a), 6);
        assert_eq!(s.get(b), &[] as &[i64]);
        let c = s.intern(&[3, 2], 6);
        assert_ne!(s.hash(a), s.hash(c));
    }
}
