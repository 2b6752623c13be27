//! The per-call columns that stay in memory beside the call tree: each
//! call's op and overload and its run of tensors, packed.
//!
//! A dump of 10 million calls held them as four `u32`s a call (160 MB).
//! Few distinct (op, overload) pairs occur in a run (hundreds), so a call
//! keeps the index of its pair in a table, in 16 bits; and almost every
//! call has fewer than 255 tensors, so its count is a byte, with the rare
//! larger counts in a side list; the first tensors, which grow call by call,
//! are a [`PackedU32`]. About 5 bytes a call instead of 16; the answers are
//! those of the plain columns ([`CallColumns::new`] takes them).

use crate::packed::PackedU32;

/// A `t_len` byte that says: look in the overflow list.
const LEN_OVERFLOW: u8 = u8::MAX;

/// The (op, overload) pair of each call, by index in the table of pairs:
/// 16 bits while the table has at most 65536 pairs, else 32.
#[derive(Clone, Debug, PartialEq, Eq)]
enum KindIds {
    Narrow(Vec<u16>),
    Wide(Vec<u32>),
}

impl Default for KindIds {
    fn default() -> Self {
        KindIds::Narrow(Vec::new())
    }
}

/// Each call's op and overload ids and its tensors `t_start..t_start +
/// t_len`, indexed by call.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallColumns {
    /// The distinct (op, overload) id pairs, in order of first call.
    kinds: Vec<(u32, u32)>,
    kind: KindIds,
    t_start: PackedU32,
    /// The number of tensors, or [`LEN_OVERFLOW`]: then it is in
    /// `len_overflow`.
    t_len: Vec<u8>,
    /// (call, number of tensors) of the calls with 255 tensors or more,
    /// sorted by call.
    len_overflow: Vec<(u32, u32)>,
}

impl CallColumns {
    /// Packs the plain columns (all of one length, one entry a call).
    pub fn new(op: &[u32], overload: &[u32], t_start: &[u32], t_len: &[u32]) -> Self {
        assert!(op.len() == overload.len() && op.len() == t_start.len() && op.len() == t_len.len());
        let (kinds, kind) = kinds_of(op, overload);
        let mut len_overflow = Vec::new();
        let t_len = t_len
            .iter()
            .enumerate()
            .map(|(i, &n)| {
                if n < LEN_OVERFLOW as u32 {
                    n as u8
                } else {
                    len_overflow.push((i as u32, n));
                    LEN_OVERFLOW
                }
            })
            .collect();
        CallColumns {
            kinds,
            kind,
            t_start: PackedU32::new(t_start),
            t_len,
            len_overflow,
        }
    }

    /// How many calls.
    pub fn len(&self) -> usize {
        self.t_start.len()
    }

    /// Whether there are none.
    pub fn is_empty(&self) -> bool {
        self.t_start.is_empty()
    }

    /// The (op, overload) name ids of call `i`.
    #[inline]
    pub fn kind(&self, i: u32) -> (u32, u32) {
        let k = match &self.kind {
            KindIds::Narrow(v) => v[i as usize] as usize,
            KindIds::Wide(v) => v[i as usize] as usize,
        };
        self.kinds[k]
    }

    /// The first tensor of call `i`.
    #[inline]
    pub fn t_start(&self, i: u32) -> u32 {
        self.t_start.get(i as usize)
    }

    /// How many tensors call `i` has.
    #[inline]
    pub fn t_len(&self, i: u32) -> u32 {
        match self.t_len[i as usize] {
            LEN_OVERFLOW => {
                let k = self
                    .len_overflow
                    .binary_search_by_key(&i, |&(c, _)| c)
                    .expect("a call marked as having many tensors is in the overflow list");
                self.len_overflow[k].1
            }
            n => n as u32,
        }
    }
}

/// The table of distinct (op, overload) pairs and each call's index in it.
/// Name ids are small and dense (interned), so the pairs are found through
/// a list per op id: an op has a handful of overloads.
fn kinds_of(op: &[u32], overload: &[u32]) -> (Vec<(u32, u32)>, KindIds) {
    let mut kinds: Vec<(u32, u32)> = Vec::new();
    // by_op[op id]: (overload id, index in kinds) of that op's pairs.
    let mut by_op: Vec<Vec<(u32, u32)>> = Vec::new();
    let mut ids: Vec<u32> = Vec::with_capacity(op.len());
    let mut last: Option<((u32, u32), u32)> = None;
    for (&o, &v) in op.iter().zip(overload) {
        let k = match last {
            Some((key, k)) if key == (o, v) => k,
            _ => {
                if by_op.len() <= o as usize {
                    by_op.resize_with(o as usize + 1, Vec::new);
                }
                let list = &mut by_op[o as usize];
                let k = match list.iter().find(|&&(w, _)| w == v) {
                    Some(&(_, k)) => k,
                    None => {
                        let k = kinds.len() as u32;
                        kinds.push((o, v));
                        list.push((v, k));
                        k
                    }
                };
                last = Some(((o, v), k));
                k
            }
        };
        ids.push(k);
    }
    let kind = if kinds.len() <= u16::MAX as usize + 1 {
        KindIds::Narrow(ids.into_iter().map(|k| k as u16).collect())
    } else {
        KindIds::Wide(ids)
    };
    (kinds, kind)
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Every call's answers against the plain columns they were made of.
    fn check(op: &[u32], overload: &[u32], t_start: &[u32], t_len: &[u32]) -> CallColumns {
        let c = CallColumns::new(op, overload, t_start, t_len);
        assert_eq!(c.len(), op.len());
        for i in 0..op.len() {
            assert_eq!(c.kind(i as u32), (op[i], overload[i]), "call {i}");
            assert_eq!(c.t_start(i as u32), t_start[i], "call {i}");
            assert_eq!(c.t_len(i as u32), t_len[i], "call {i}");
        }
        c
    }

    #[test]
    fn same_answers_as_the_plain_columns() {
        let op = [3, 3, 7, 3, 0, 7, 7];
        let overload = [1, 2, 1, 1, 1, 1, 9];
        let t_start = [0, 2, 2, 5, 9, 9, 100];
        let t_len = [2, 0, 3, 4, 0, 91, 1];
        let c = check(&op, &overload, &t_start, &t_len);
        assert_eq!(c.kinds, vec![(3, 1), (3, 2), (7, 1), (0, 1), (7, 9)]);
        assert!(matches!(c.kind, KindIds::Narrow(_)));
        assert!(c.len_overflow.is_empty());
    }

    #[test]
    fn counts_of_255_tensors_and_more_go_to_the_overflow_list() {
        let op = [1; 6];
        let overload = [0; 6];
        let t_start = [0, 254, 254, 509, 1509, 1509];
        let t_len = [254, 0, 255, 1000, 0, u32::MAX - 2000];
        let c = check(&op, &overload, &t_start, &t_len);
        assert_eq!(
            c.len_overflow,
            vec![(2, 255), (3, 1000), (5, u32::MAX - 2000)]
        );
        assert_eq!(c.t_len[0], 254);
    }

    #[test]
    fn more_than_65536_pairs_take_32_bits() {
        let n = u16::MAX as u32 + 10;
        let op: Vec<u32> = (0..n).map(|i| i / 2).collect();
        let overload: Vec<u32> = (0..n).map(|i| i % 2).collect();
        let t_start: Vec<u32> = (0..n).collect();
        let t_len = vec![1; n as usize];
        let c = check(&op, &overload, &t_start, &t_len);
        assert!(matches!(c.kind, KindIds::Wide(_)));
        // Exactly 65536 pairs still fit in 16 bits.
        let m = u16::MAX as usize + 1;
        let c = check(&op[..m], &overload[..m], &t_start[..m], &t_len[..m]);
        assert!(matches!(c.kind, KindIds::Narrow(_)));
        assert_eq!(c.kind((m - 1) as u32), (op[m - 1], overload[m - 1]));
    }

    #[test]
    fn no_calls() {
        let c = check(&[], &[], &[], &[]);
        assert!(c.is_empty());
    }
}
