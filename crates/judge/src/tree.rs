//! The call tree of a dump, from each call's seq and its parent's seq: the
//! one place that builds it, for a dump read from files and for one built
//! from records in memory.

use crate::dump::NONE;

/// The parent seq of a call that has none (a null `parent_seq`).
pub const NO_PARENT: i64 = i64::MIN;

/// Each call's parent and children, by index of the call in seq order (the
/// [`crate::Dump`] fields of the same names).
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct CallTree {
    /// Index of the parent call, [`NONE`] for a root.
    pub parent: Vec<u32>,
    /// Children of call `i`: `children[child_start[i]..child_start[i + 1]]`.
    pub child_start: Vec<u32>,
    /// Every call's children, in seq order, call after call.
    pub children: Vec<u32>,
    /// Calls without a parent, in seq order.
    pub roots: Vec<u32>,
}

/// A call that is its own ancestor: its `parent_seq` chain loops.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct AncestorLoop {
    /// The seq of a call on the loop.
    pub seq: i64,
}

/// Builds the tree of the calls of `seq` (sorted, no seq twice), whose
/// parents' seqs are `parent_seq` ([`NO_PARENT`] for none). A parent missing
/// from the calls (filtered out, or in a file that was lost) makes its child
/// a root; a loop of parents is an error, since every walk up or down the
/// tree would then run forever.
pub fn call_tree(seq: &[i64], parent_seq: &[i64]) -> Result<CallTree, AncestorLoop> {
    debug_assert_eq!(seq.len(), parent_seq.len());
    let parent = parents(seq, parent_seq);
    check_acyclic(&parent, seq)?;
    let (child_start, children, roots) = children_of(&parent);
    Ok(CallTree {
        parent,
        child_start,
        children,
        roots,
    })
}

/// The index of each call's parent, by binary search of its seq.
fn parents(seq: &[i64], parent_seq: &[i64]) -> Vec<u32> {
    parent_seq
        .iter()
        .map(|&ps| {
            if ps == NO_PARENT {
                NONE
            } else {
                seq.binary_search(&ps).map_or(NONE, |i| i as u32)
            }
        })
        .collect()
}

/// One pass: each chain of parents is walked until a root or a call already
/// known to lead to one.
fn check_acyclic(parent: &[u32], seq: &[i64]) -> Result<(), AncestorLoop> {
    const ON_PATH: u8 = 1;
    const DONE: u8 = 2;
    let mut state = vec![0u8; parent.len()];
    let mut walk = Vec::new();
    for start in 0..parent.len() as u32 {
        let mut cur = start;
        while cur != NONE && state[cur as usize] == 0 {
            state[cur as usize] = ON_PATH;
            walk.push(cur);
            cur = parent[cur as usize];
        }
        if cur != NONE && state[cur as usize] == ON_PATH {
            return Err(AncestorLoop {
                seq: seq[cur as usize],
            });
        }
        for &i in &walk {
            state[i as usize] = DONE;
        }
        walk.clear();
    }
    Ok(())
}

/// `(child_start, children, roots)` from the parents, children in seq
/// order (a counting sort by parent).
fn children_of(parent: &[u32]) -> (Vec<u32>, Vec<u32>, Vec<u32>) {
    let n = parent.len();
    let mut child_start = vec![0u32; n + 1];
    for &p in parent {
        if p != NONE {
            child_start[p as usize + 1] += 1;
        }
    }
    for i in 0..n {
        child_start[i + 1] += child_start[i];
    }
    let mut fill = child_start.clone();
    let mut children = vec![0u32; child_start[n] as usize];
    let mut roots = Vec::new();
    for (i, &p) in parent.iter().enumerate() {
        if p == NONE {
            roots.push(i as u32);
        } else {
            let slot = &mut fill[p as usize];
            children[*slot as usize] = i as u32;
            *slot += 1;
        }
    }
    (child_start, children, roots)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn children_in_seq_order_and_missing_parents_make_roots() {
        // 10 -> {11, 13}, 11 -> 12, 14's parent 99 is not in the dump.
        let seq = [10, 11, 12, 13, 14];
        let parent_seq = [NO_PARENT, 10, 11, 10, 99];
        let t = call_tree(&seq, &parent_seq).unwrap();
        assert_eq!(t.parent, vec![NONE, 0, 1, 0, NONE]);
        assert_eq!(t.roots, vec![0, 4]);
        assert_eq!(t.child_start, vec![0, 2, 3, 3, 3, 3]);
        assert_eq!(t.children, vec![1, 3, 2]);
    }

    #[test]
    fn a_loop_of_parents_is_refused() {
        assert_eq!(call_tree(&[5], &[5]), Err(AncestorLoop { seq: 5 }));
        let err = call_tree(&[1, 2, 3], &[NO_PARENT, 3, 2]).unwrap_err();
        assert!(err.seq == 2 || err.seq == 3, "{err:?}");
    }

    #[test]
    fn no_calls_no_tree() {
        let t = call_tree(&[], &[]).unwrap();
        assert_eq!(t.child_start, vec![0]);
        assert!(t.parent.is_empty() && t.children.is_empty() && t.roots.is_empty());
    }
}
