//! Sequence alignment of two token sequences (op signatures), tolerant of
//! insertions and deletions, in near-linear time on long sequences.
//!
//! Plain LCS is quadratic: 10^6 x 10^6 op calls would take hours. Instead,
//! like patience/histogram diff:
//! 1. strip the common prefix and suffix (most of a run that matches);
//! 2. find anchors: tokens that occur exactly once on both sides; when there
//!    are none, tokens that occur equally often on both sides, their k-th
//!    occurrences paired (a training step repeats each layer's ops N times on
//!    both sides, so equal counts are the common case);
//! 3. keep the largest consistent set of anchors (longest increasing
//!    subsequence, O(k log k)) and recurse between them;
//! 4. small regions, and regions without anchors up to a size limit, get an
//!    exact LCS by dynamic programming.
//!
//! Each level is linear in the region's size, and anchors cut regions fast,
//! so a million tokens align in well under a second.

use crate::intern::FxMap;

/// Regions up to this many cells (n*m) get an exact LCS straight away.
const SMALL_DP_CELLS: u64 = 4096;
/// Anchorless regions up to this many cells still get an exact LCS (u16
/// table: 32 MiB at most).
const MAX_DP_CELLS: u64 = 16 << 20;

/// What the alignment had to give up on.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct DiffStats {
    /// Regions without any anchor too large for an exact LCS: left unmatched.
    pub regions_given_up: usize,
    /// Tokens in those regions (both sides).
    pub tokens_given_up: usize,
}

#[derive(Clone, Copy)]
struct Region {
    a0: usize,
    a1: usize,
    b0: usize,
    b1: usize,
}

/// Matched index pairs `(i, j)` with `a[i] == b[j]`, strictly increasing in
/// both, forming a common subsequence that is the longest one on all but
/// pathological inputs.
pub fn diff(a: &[u64], b: &[u64], stats: &mut DiffStats) -> Vec<(u32, u32)> {
    let mut out = Vec::new();
    if a == b {
        out.extend((0..a.len() as u32).map(|i| (i, i)));
        return out;
    }
    let mut stack = vec![Region {
        a0: 0,
        a1: a.len(),
        b0: 0,
        b1: b.len(),
    }];
    let mut scratch = Scratch::default();
    while let Some(Region {
        mut a0,
        mut a1,
        mut b0,
        mut b1,
    }) = stack.pop()
    {
        while a0 < a1 && b0 < b1 && a[a0] == b[b0] {
            out.push((a0 as u32, b0 as u32));
            a0 += 1;
            b0 += 1;
        }
        while a0 < a1 && b0 < b1 && a[a1 - 1] == b[b1 - 1] {
            a1 -= 1;
            b1 -= 1;
            out.push((a1 as u32, b1 as u32));
        }
        if a0 == a1 || b0 == b1 {
            continue;
        }
        let cells = (a1 - a0) as u64 * (b1 - b0) as u64;
        if cells <= SMALL_DP_CELLS {
            lcs_dp(&a[a0..a1], &b[b0..b1], a0, b0, &mut out);
            continue;
        }
        let mut anchors = scratch.anchors(&a[a0..a1], &b[b0..b1]);
        if anchors.is_empty() && cells <= MAX_DP_CELLS {
            lcs_dp(&a[a0..a1], &b[b0..b1], a0, b0, &mut out);
            continue;
        }
        // No token is unique or equally frequent on both sides (a few
        // distinct ops in an irregular order): runs of k tokens are far
        // more distinctive than single tokens.
        for k in [4, 16, 64] {
            if anchors.is_empty() && a1 - a0 > k && b1 - b0 > k {
                anchors = scratch.kgram_anchors(&a[a0..a1], &b[b0..b1], k);
            }
        }
        if anchors.is_empty() {
            stats.regions_given_up += 1;
            stats.tokens_given_up += (a1 - a0) + (b1 - b0);
            continue;
        }
        let (mut pa, mut pb) = (a0, b0);
        for (i, j) in anchors {
            let (i, j) = (a0 + i as usize, b0 + j as usize);
            stack.push(Region {
                a0: pa,
                a1: i,
                b0: pb,
                b1: j,
            });
            out.push((i as u32, j as u32));
            pa = i + 1;
            pb = j + 1;
        }
        stack.push(Region {
            a0: pa,
            a1,
            b0: pb,
            b1,
        });
    }
    out.sort_unstable();
    out
}

#[derive(Clone, Copy)]
struct Count {
    ca: u32,
    cb: u32,
    /// First position in b.
    first_b: u32,
    /// Slot among the tokens with equal counts.
    slot: u32,
}

/// Buffers reused across regions.
#[derive(Default)]
struct Scratch {
    counts: FxMap<u64, Count>,
}

impl Scratch {
    /// Anchor pairs (relative positions), increasing in both.
    fn anchors(&mut self, a: &[u64], b: &[u64]) -> Vec<(u32, u32)> {
        let counts = &mut self.counts;
        counts.clear();
        for &t in a {
            counts
                .entry(t)
                .or_insert(Count {
                    ca: 0,
                    cb: 0,
                    first_b: 0,
                    slot: u32::MAX,
                })
                .ca += 1;
        }
        for (j, &t) in b.iter().enumerate() {
            if let Some(c) = counts.get_mut(&t) {
                if c.cb == 0 {
                    c.first_b = j as u32;
                }
                c.cb += 1;
            }
        }
        // Unique on both sides: the most reliable anchors (patience diff).
        let unique: Vec<(u32, u32)> = a
            .iter()
            .enumerate()
            .filter_map(|(i, t)| {
                let c = counts.get(t)?;
                (c.ca == 1 && c.cb == 1).then_some((i as u32, c.first_b))
            })
            .collect();
        if !unique.is_empty() {
            return longest_increasing(&unique);
        }
        // Equal counts: pair the k-th occurrences. Positions in b are laid
        // out per token by a counting sort, so this stays linear.
        let mut slots = 0u32;
        let mut offsets: Vec<u32> = vec![0];
        for c in counts.values_mut() {
            if c.ca == c.cb && c.ca > 0 {
                c.slot = slots;
                slots += 1;
                let last = offsets.last().copied().unwrap_or(0);
                offsets.push(last + c.cb);
            }
        }
        if slots == 0 {
            return Vec::new();
        }
        let mut cursor: Vec<u32> = offsets[..slots as usize].to_vec();
        let mut pos_b = vec![0u32; offsets[slots as usize] as usize];
        for (j, t) in b.iter().enumerate() {
            if let Some(c) = counts.get(t) {
                if c.slot != u32::MAX {
                    let k = &mut cursor[c.slot as usize];
                    pos_b[*k as usize] = j as u32;
                    *k += 1;
                }
            }
        }
        cursor.copy_from_slice(&offsets[..slots as usize]);
        let mut cand = Vec::with_capacity(pos_b.len());
        for (i, t) in a.iter().enumerate() {
            if let Some(c) = counts.get(t) {
                if c.slot != u32::MAX {
                    let k = &mut cursor[c.slot as usize];
                    cand.push((i as u32, pos_b[*k as usize]));
                    *k += 1;
                }
            }
        }
        longest_increasing(&cand)
    }
}

/// Polynomial rolling hashes of every run of `k` tokens.
fn kgrams(t: &[u64], k: usize) -> Vec<u64> {
    const P: u64 = 0x100_0000_01b3;
    let pk = (0..k).fold(1u64, |acc, _| acc.wrapping_mul(P));
    let mut out = Vec::with_capacity(t.len().saturating_sub(k) + 1);
    let mut h = 0u64;
    for (i, &x) in t.iter().enumerate() {
        h = h.wrapping_mul(P).wrapping_add(x);
        if i >= k {
            h = h.wrapping_sub(t[i - k].wrapping_mul(pk));
        }
        if i + 1 >= k {
            out.push(h);
        }
    }
    out
}

impl Scratch {
    /// Anchors found among runs of `k` tokens, checked token by token (a
    /// hash collision must not pair different runs).
    fn kgram_anchors(&mut self, a: &[u64], b: &[u64], k: usize) -> Vec<(u32, u32)> {
        let (ka, kb) = (kgrams(a, k), kgrams(b, k));
        let mut anchors = self.anchors(&ka, &kb);
        anchors.retain(|&(i, j)| a[i as usize..i as usize + k] == b[j as usize..j as usize + k]);
        anchors
    }
}

/// The longest subsequence of `pairs` (sorted by `.0`, distinct `.0`) whose
/// `.1` strictly increases: patience sorting with back links.
fn longest_increasing(pairs: &[(u32, u32)]) -> Vec<(u32, u32)> {
    // tails[k]: index in `pairs` of the smallest tail of an increasing run
    // of length k+1.
    let mut tails: Vec<u32> = Vec::new();
    let mut prev: Vec<u32> = vec![u32::MAX; pairs.len()];
    for (idx, &(_, j)) in pairs.iter().enumerate() {
        let k = tails.partition_point(|&t| pairs[t as usize].1 < j);
        if k > 0 {
            prev[idx] = tails[k - 1];
        }
        if k == tails.len() {
            tails.push(idx as u32);
        } else {
            tails[k] = idx as u32;
        }
    }
    let mut out = Vec::with_capacity(tails.len());
    let mut cur = tails.last().copied().unwrap_or(u32::MAX);
    while cur != u32::MAX {
        out.push(pairs[cur as usize]);
        cur = prev[cur as usize];
    }
    out.reverse();
    out
}

/// Exact LCS by dynamic programming over suffixes, walked forward so that
/// earlier matches are preferred. `a.len() * b.len()` must be at most
/// `MAX_DP_CELLS`, so lengths fit in u16.
fn lcs_dp(a: &[u64], b: &[u64], a_off: usize, b_off: usize, out: &mut Vec<(u32, u32)>) {
    let (n, m) = (a.len(), b.len());
    let w = m + 1;
    let mut dp = vec![0u16; (n + 1) * w];
    for i in (0..n).rev() {
        for j in (0..m).rev() {
            dp[i * w + j] = if a[i] == b[j] {
                dp[(i + 1) * w + j + 1] + 1
            } else {
                dp[(i + 1) * w + j].max(dp[i * w + j + 1])
            };
        }
    }
    let (mut i, mut j) = (0, 0);
    while i < n && j < m {
        if a[i] == b[j] && dp[i * w + j] == dp[(i + 1) * w + j + 1] + 1 {
            out.push(((a_off + i) as u32, (b_off + j) as u32));
            i += 1;
            j += 1;
        } else if dp[(i + 1) * w + j] >= dp[i * w + j + 1] {
            i += 1;
        } else {
            j += 1;
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn lcs_len(a: &[u64], b: &[u64]) -> usize {
        let mut out = Vec::new();
        lcs_dp(a, b, 0, 0, &mut out);
        out.len()
    }

    fn check(a: &[u64], b: &[u64]) -> Vec<(u32, u32)> {
        let mut st = DiffStats::default();
        let m = diff(a, b, &mut st);
        for w in m.windows(2) {
            assert!(w[0].0 < w[1].0 && w[0].1 < w[1].1, "not increasing: {m:?}");
        }
        for &(i, j) in &m {
            assert_eq!(a[i as usize], b[j as usize]);
        }
        m
    }

    #[test]
    fn insertions_and_deletions() {
        let a = [1, 2, 3, 4, 5, 6];
        let b = [1, 9, 2, 3, 5, 6, 7];
        let m = check(&a, &b);
        assert_eq!(m, vec![(0, 0), (1, 2), (2, 3), (4, 4), (5, 5)]);
    }

    #[test]
    fn repeated_layers_with_extra_copies() {
        // 200 layers of [linear, gelu, add]; b has a copy (9) before every
        // 10th linear and lacks one gelu.
        let mut a = Vec::new();
        let mut b = Vec::new();
        for l in 0..200 {
            a.extend([1u64, 2, 3]);
            if l % 10 == 0 {
                b.push(9);
            }
            b.push(1);
            if l != 77 {
                b.push(2);
            }
            b.push(3);
        }
        let m = check(&a, &b);
        assert_eq!(m.len(), 599);
        assert_eq!(m.len(), lcs_len(&a, &b));
        // The missing gelu is layer 77's.
        let matched_a: std::collections::HashSet<u32> = m.iter().map(|p| p.0).collect();
        assert!(!matched_a.contains(&(77 * 3 + 1)));
    }

    #[test]
    fn reordered_tail() {
        let a = [1, 2, 3, 4, 5, 6, 7, 8];
        let b = [1, 2, 3, 4, 5, 8, 6, 7];
        let m = check(&a, &b);
        assert_eq!(m.len(), 7);
    }

    #[test]
    fn large_inputs_are_fast() {
        let mut a = Vec::with_capacity(1_000_000);
        let mut x = 12345u64;
        for _ in 0..1_000_000 {
            x = x
                .wrapping_mul(6364136223846793005)
                .wrapping_add(1442695040888963407);
            a.push((x >> 33) % 50);
        }
        let mut b = a.clone();
        for k in (0..b.len()).step_by(997).rev() {
            b.insert(k, 1000);
        }
        for k in (5..b.len()).step_by(1503).rev() {
            b.remove(k);
        }
        let t = std::time::Instant::now();
        let m = check(&a, &b);
        assert!(m.len() > 999_000, "{}", m.len());
        assert!(t.elapsed().as_secs_f64() < 10.0);
    }
}
