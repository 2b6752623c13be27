//! Aligning the op calls of two dumps.
//!
//! 1. Top-level calls (roots) are grouped by (step, phase): an extra op in
//!    one step cannot shift the next step, and the diff stays small.
//! 2. In each group the roots are aligned by signature (op, overload, tensor
//!    shapes; not dtypes) with [`crate::diff::diff`].
//! 3. Where the diff leaves a gap of equal length on both sides with the same
//!    op names in the same order, the calls are paired anyway ("loose"
//!    pairs): same program, different shapes, reported as shape mismatches.
//! 4. The children of each matched pair are aligned the same way, down to
//!    the leaves. A backend that decomposes an op differently shows up as
//!    unmatched children under a matched parent. A child that re-dispatches
//!    its parent's op (autocast: `linear` > casts + `linear` > `addmm`) is
//!    looked through.
//!
//! Whatever is not matched is "only in A" / "only in B", reported as the
//! roots of unmatched subtrees.

use std::collections::BTreeMap;

use regex::Regex;

use crate::diff::{diff, DiffStats};
use crate::dump::{Dump, NONE};
use crate::intern::FxMap;
use crate::progress::Progress;

/// Which op calls take part.
#[derive(Clone, Debug, Default)]
pub struct Filter {
    /// Steps to compare (inclusive ranges); all when empty.
    pub steps: Vec<(i64, i64)>,
    /// Op calls whose `op.overload` matches are left out with their
    /// subtree, on both sides.
    pub ignore: Option<Regex>,
}

impl Filter {
    pub fn step_selected(&self, s: i64) -> bool {
        self.steps.is_empty() || self.steps.iter().any(|&(lo, hi)| lo <= s && s <= hi)
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    pub a: u32,
    pub b: u32,
    /// Paired by name only: some shapes differ.
    pub loose: bool,
}

/// The result of aligning two dumps.
pub struct Alignment {
    /// Matched op calls at every depth, sorted by `a` (seq order of A).
    pub pairs: Vec<Pair>,
    /// For each op of A, its match in B (or `NONE`), and the reverse.
    pub a_match: Vec<u32>,
    pub b_match: Vec<u32>,
    /// Roots of unmatched subtrees (sorted), and the op calls they hold.
    pub only_a: Vec<u32>,
    pub only_b: Vec<u32>,
    pub only_a_calls: u64,
    pub only_b_calls: u64,
    /// Steps whose roots appear on one side only.
    pub steps_only_a: Vec<i64>,
    pub steps_only_b: Vec<i64>,
    /// Roots taken part (after filters), on each side.
    pub roots_a: u64,
    pub roots_b: u64,
    /// Per phase (forward, backward, optimizer): roots in groups present on
    /// both sides, on each side, and those matched with equal signatures.
    pub common_roots_a: [u64; 3],
    pub common_roots_b: [u64; 3],
    pub roots_matched_exact: [u64; 3],
    /// Op calls left out by `--ignore`, on each side (subtrees included).
    pub ignored_a: u64,
    pub ignored_b: u64,
    pub diff_stats: DiffStats,
    /// The dumps share no step number, so steps were not used to group.
    pub steps_ignored: bool,
}

/// Per dump: signature of every op and whether it is ignored.
struct Prepared {
    sig: Vec<u64>,
    ignored: Vec<bool>,
}

fn prepare(d: &Dump, filter: &Filter) -> Prepared {
    let sig: Vec<u64> = (0..d.len() as u32).map(|i| d.signature(i)).collect();
    let mut ignored = vec![false; d.len()];
    if let Some(re) = &filter.ignore {
        // One regex test per distinct (op, overload), not per call.
        let mut cache: FxMap<(u32, u32), bool> = FxMap::default();
        for (i, ig) in ignored.iter_mut().enumerate() {
            let key = (d.op[i], d.overload[i]);
            *ig = *cache.entry(key).or_insert_with(|| {
                let full = format!("{}.{}", d.names.get(key.0), d.names.get(key.1));
                re.is_match(&full)
            });
        }
    }
    Prepared { sig, ignored }
}

/// Roots taken part, grouped by (step, phase) (or by phase alone, when
/// `by_step` is false), in seq order.
fn groups(d: &Dump, p: &Prepared, filter: &Filter, by_step: bool) -> BTreeMap<(i64, u8), Vec<u32>> {
    let mut g: BTreeMap<(i64, u8), Vec<u32>> = BTreeMap::new();
    for &r in &d.roots {
        let (step, phase) = (d.step[r as usize], d.phase[r as usize]);
        if !p.ignored[r as usize] && filter.step_selected(step) {
            g.entry((if by_step { step } else { 0 }, phase))
                .or_default()
                .push(r);
        }
    }
    g
}

/// Both dumps with their signatures.
struct Sides<'a> {
    a: &'a Dump,
    b: &'a Dump,
    pa: &'a Prepared,
    pb: &'a Prepared,
}

/// Aligns the children lists (or root lists) `xa` and `xb`: exact matches
/// by signature, then loose pairs in equal gaps. Appends pairs in order.
fn align_lists(
    s: &Sides<'_>,
    xa: &[u32],
    xb: &[u32],
    stats: &mut DiffStats,
    out: &mut Vec<Pair>,
) -> u64 {
    let Sides { a, b, pa, pb } = *s;
    let sa: Vec<u64> = xa.iter().map(|&i| pa.sig[i as usize]).collect();
    let sb: Vec<u64> = xb.iter().map(|&i| pb.sig[i as usize]).collect();
    let matches = diff(&sa, &sb, stats);
    let exact = matches.len() as u64;
    // Walk gaps between consecutive matches (and before the first / after
    // the last) for loose pairs.
    let mut prev = (0usize, 0usize);
    let loose_gap = |a0: usize, a1: usize, b0: usize, b1: usize, out: &mut Vec<Pair>| {
        if a1 - a0 == b1 - b0 && a1 > a0 {
            let same_names =
                (0..a1 - a0).all(|k| a.name_signature(xa[a0 + k]) == b.name_signature(xb[b0 + k]));
            if same_names {
                for k in 0..a1 - a0 {
                    out.push(Pair {
                        a: xa[a0 + k],
                        b: xb[b0 + k],
                        loose: true,
                    });
                }
            }
        }
    };
    for &(i, j) in &matches {
        let (i, j) = (i as usize, j as usize);
        loose_gap(prev.0, i, prev.1, j, out);
        out.push(Pair {
            a: xa[i],
            b: xb[j],
            loose: false,
        });
        prev = (i + 1, j + 1);
    }
    loose_gap(prev.0, xa.len(), prev.1, xb.len(), out);
    exact
}

/// The children of `parent` that take part in alignment, in seq order:
/// ignored calls are left out, and a child that re-dispatches its parent's
/// own op and overload (autocast wraps `linear` in a bf16 `linear`, after
/// its casts) is replaced by its children, as if it were not there.
fn children(d: &Dump, p: &Prepared, parent: u32, out: &mut Vec<u32>, depth: u32) {
    let name = d.name_signature(parent);
    for &c in d.children_of(parent) {
        if p.ignored[c as usize] {
            continue;
        }
        if depth < 64 && d.name_signature(c) == name {
            children(d, p, c, out, depth + 1);
        } else {
            out.push(c);
        }
    }
}

fn subtree_calls(d: &Dump, p: &Prepared, root: u32) -> u64 {
    let mut n = 0;
    let mut stack = vec![root];
    while let Some(i) = stack.pop() {
        if p.ignored[i as usize] {
            continue;
        }
        n += 1;
        stack.extend_from_slice(d.children_of(i));
    }
    n
}

fn ignored_calls(d: &Dump, p: &Prepared) -> u64 {
    // Ignored op calls and everything beneath them.
    let mut n = 0;
    for i in 0..d.len() {
        let mut cur = i as u32;
        loop {
            if p.ignored[cur as usize] {
                n += 1;
                break;
            }
            match d.parent[cur as usize] {
                NONE => break,
                q => cur = q,
            }
        }
    }
    n
}

pub fn align(a: &Dump, b: &Dump, filter: &Filter, progress: &Progress) -> Alignment {
    progress.phase("aligning: signatures");
    let (pa, pb) = std::thread::scope(|s| {
        let ha = s.spawn(|| prepare(a, filter));
        let pb = prepare(b, filter);
        (ha.join(), pb)
    });
    let pa = match pa {
        Ok(p) => p,
        Err(e) => std::panic::resume_unwind(e),
    };
    let sides = Sides {
        a,
        b,
        pa: &pa,
        pb: &pb,
    };
    let mut ga = groups(a, &pa, filter, true);
    let mut gb = groups(b, &pb, filter, true);
    // Steps numbered differently (one run dumped from a later step): align
    // the whole runs, phase by phase, rather than nothing.
    let steps_ignored = !ga.is_empty() && !gb.is_empty() && !ga.keys().any(|k| gb.contains_key(k));
    if steps_ignored {
        ga = groups(a, &pa, filter, false);
        gb = groups(b, &pb, filter, false);
    }
    let mut stats = DiffStats::default();
    let mut pairs: Vec<Pair> = Vec::new();
    let mut only_a = Vec::new();
    let mut only_b = Vec::new();
    let mut steps_only_a = Vec::new();
    let mut steps_only_b = Vec::new();
    let (mut common_a, mut common_b, mut exact) = ([0u64; 3], [0u64; 3], [0u64; 3]);

    if !steps_ignored {
        let steps_a: std::collections::BTreeSet<i64> = ga.keys().map(|k| k.0).collect();
        let steps_b: std::collections::BTreeSet<i64> = gb.keys().map(|k| k.0).collect();
        steps_only_a.extend(steps_a.difference(&steps_b));
        steps_only_b.extend(steps_b.difference(&steps_a));
    }

    for (key, ra) in &ga {
        match gb.get(key) {
            Some(rb) => {
                progress.phase(&format!(
                    "aligning: step {} {}",
                    key.0,
                    crate::dump::phase_name(key.1)
                ));
                let ph = (key.1 as usize).min(2);
                common_a[ph] += ra.len() as u64;
                common_b[ph] += rb.len() as u64;
                exact[ph] += align_lists(&sides, ra, rb, &mut stats, &mut pairs);
            }
            None => only_a.extend_from_slice(ra),
        }
    }
    for (key, rb) in &gb {
        if !ga.contains_key(key) {
            only_b.extend_from_slice(rb);
        }
    }

    // Children of matched pairs, breadth-first over a work list.
    progress.phase("aligning: nested calls");
    let mut next = 0;
    let (mut ca, mut cb) = (Vec::new(), Vec::new());
    let mut matched: Vec<u32> = Vec::new();
    while next < pairs.len() {
        let Pair { a: ia, b: ib, .. } = pairs[next];
        next += 1;
        ca.clear();
        cb.clear();
        children(a, &pa, ia, &mut ca, 0);
        children(b, &pb, ib, &mut cb, 0);
        let start = pairs.len();
        if !ca.is_empty() && !cb.is_empty() {
            align_lists(&sides, &ca, &cb, &mut stats, &mut pairs);
        }
        // Children that found no partner.
        matched.clear();
        matched.extend(pairs[start..].iter().map(|p| p.a));
        matched.sort_unstable();
        only_a.extend(
            ca.iter()
                .copied()
                .filter(|c| matched.binary_search(c).is_err()),
        );
        matched.clear();
        matched.extend(pairs[start..].iter().map(|p| p.b));
        matched.sort_unstable();
        only_b.extend(
            cb.iter()
                .copied()
                .filter(|c| matched.binary_search(c).is_err()),
        );
        if next % 65536 == 0 {
            progress.update(|| format!("aligning: nested calls {next}/{}", pairs.len()));
        }
    }

    let mut a_match = vec![NONE; a.len()];
    let mut b_match = vec![NONE; b.len()];
    for p in &pairs {
        a_match[p.a as usize] = p.b;
        b_match[p.b as usize] = p.a;
    }
    // Unmatched roots of common groups.
    for ra in ga
        .iter()
        .filter(|(k, _)| gb.contains_key(k))
        .map(|(_, v)| v)
    {
        only_a.extend(ra.iter().copied().filter(|&r| a_match[r as usize] == NONE));
    }
    for rb in gb
        .iter()
        .filter(|(k, _)| ga.contains_key(k))
        .map(|(_, v)| v)
    {
        only_b.extend(rb.iter().copied().filter(|&r| b_match[r as usize] == NONE));
    }
    only_a.sort_unstable();
    only_a.dedup();
    only_b.sort_unstable();
    only_b.dedup();
    pairs.sort_unstable_by_key(|p| p.a);

    Alignment {
        only_a_calls: only_a.iter().map(|&r| subtree_calls(a, &pa, r)).sum(),
        only_b_calls: only_b.iter().map(|&r| subtree_calls(b, &pb, r)).sum(),
        pairs,
        a_match,
        b_match,
        only_a,
        only_b,
        steps_only_a,
        steps_only_b,
        roots_a: ga.values().map(|v| v.len() as u64).sum(),
        roots_b: gb.values().map(|v| v.len() as u64).sum(),
        common_roots_a: common_a,
        common_roots_b: common_b,
        roots_matched_exact: exact,
        ignored_a: if filter.ignore.is_some() {
            ignored_calls(a, &pa)
        } else {
            0
        },
        ignored_b: if filter.ignore.is_some() {
            ignored_calls(b, &pb)
        } else {
            0
        },
        diff_stats: stats,
        steps_ignored,
    }
}
