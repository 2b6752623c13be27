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
//! 5. Where too few roots match for the dumps to pass as one program, the
//!    roots are aligned again across levels: in each gap the diff leaves,
//!    the calls of one side are replaced by their children ("dissolved")
//!    where that matches more, down to [`MAX_DISSOLVE`] levels. A compiled
//!    run (torch.compile) is a flat list of the decomposed ops that an
//!    eager run nests under `linear`, `matmul`, `reshape`: both then pair
//!    op for op, and the dissolved wrappers are neither paired nor unmatched.
//!
//! Whatever is not matched is "only in A" / "only in B", reported as the
//! roots of unmatched subtrees.

use std::collections::{BTreeMap, BTreeSet};

use opdump_format::Phase;
use regex::Regex;

use crate::diff::{diff, DiffStats};
use crate::dump::{Dump, NONE};
use crate::intern::{mix, FxMap, NO_ID};
use crate::observer::Observer;
use crate::refusal::Side;

mod calls;
pub mod fused;
pub mod optimizer;

pub use optimizer::Element;

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
    /// Whether the calls of `op` and `overload` are left out (`--ignore`
    /// matches `op.overload`).
    pub fn ignores(&self, op: &str, overload: &str) -> bool {
        self.ignore
            .as_ref()
            .is_some_and(|re| ignores(re, op, overload))
    }

    /// Whether step `s` is among the selected steps.
    pub fn step_selected(&self, s: i64) -> bool {
        self.steps.is_empty() || self.steps.iter().any(|&(lo, hi)| lo <= s && s <= hi)
    }
}

/// An aligned pair of op calls: the same call in both runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Pair {
    /// The call in A (index into A's calls).
    pub a: u32,
    /// The call in B (index into B's calls).
    pub b: u32,
    /// What of the two calls the pair judges ([`Pair::part`]), or
    /// [`LOOSE_WHOLE`]: whether the pair is loose lives here, not in a
    /// field of its own, which made a pair 16 bytes, not 12 (9.4M pairs at
    /// the synthetic 10M pair: 38 MB).
    part: Part,
}

/// The `Pair::part` of two whole calls paired by name only. Only whole
/// calls pair loosely. It is the code of a fused part of element
/// 2^28 - 1, as [`Part::WHOLE`] is: no list has that many.
const LOOSE_WHOLE: Part = Part(u32::MAX - 1);

impl Pair {
    /// Two whole calls, paired.
    pub fn whole(a: u32, b: u32, loose: bool) -> Self {
        Pair {
            a,
            b,
            part: if loose { LOOSE_WHOLE } else { Part::WHOLE },
        }
    }

    /// One element of a list call against the other side's call for that
    /// element, or one written list of a fused call (never loose).
    pub fn of_part(a: u32, b: u32, part: Part) -> Self {
        debug_assert!(part != Part::WHOLE && part != LOOSE_WHOLE);
        Pair { a, b, part }
    }

    /// What of the two calls the pair judges: both whole, or one element
    /// of a list call (`_foreach_`) against the other side's call for that
    /// element (see [`optimizer`]).
    #[inline]
    pub fn part(&self) -> Part {
        if self.part == LOOSE_WHOLE {
            Part::WHOLE
        } else {
            self.part
        }
    }

    /// Paired by name only: some shapes differ.
    #[inline]
    pub fn loose(&self) -> bool {
        self.part == LOOSE_WHOLE
    }
}

/// Which part of its two calls a [`Pair`] judges: the whole calls, or
/// element `i` of one side's list call (`_foreach_lerp_`'s `self[i]`,
/// `tensors1[i]`) against the other side's whole call (the `lerp_` of
/// parameter `i`). Packed in 32 bits: pairs are many.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct Part(u32);

impl Part {
    /// Both calls whole.
    pub const WHOLE: Part = Part(u32::MAX);
    const ON_B: u32 = 1 << 31;

    const FUSED: u32 = 1 << 30;

    /// Element `index` of the list call on `side`.
    pub fn element(side: Side, index: u32) -> Part {
        let index = index & !(Self::ON_B | Self::FUSED);
        Part(match side {
            Side::A => index,
            Side::B => index | Self::ON_B,
        })
    }

    /// One written list (`kind`, see [`fused::Written`]) of element
    /// `index` of the fused optimizer call (`_fused_adamw_`) on `side`,
    /// against the other side's per-parameter call that wrote that value.
    pub fn fused(side: Side, index: u32, kind: fused::Written) -> Part {
        let packed = ((index & ((1 << 28) - 1)) << 2) | kind as u32 | Self::FUSED;
        Part(match side {
            Side::A => packed,
            Side::B => packed | Self::ON_B,
        })
    }

    /// The side whose call is a list call, and the element judged; `None`
    /// for whole calls.
    pub fn element_of(self) -> Option<(Side, u32)> {
        if self == Part::WHOLE {
            return None;
        }
        let side = if self.0 & Self::ON_B != 0 {
            Side::B
        } else {
            Side::A
        };
        let rest = self.0 & !Self::ON_B;
        if rest & Self::FUSED != 0 {
            return Some((side, (rest & !Self::FUSED) >> 2));
        }
        Some((side, rest))
    }

    /// The written list a fused call's part judges; `None` for whole calls
    /// and list elements.
    pub fn fused_kind(self) -> Option<fused::Written> {
        if self == Part::WHOLE || self.0 & Self::FUSED == 0 {
            return None;
        }
        Some(fused::Written::from_bits(self.0 & 3))
    }
}

/// The result of aligning two dumps.
pub struct Alignment {
    /// Matched op calls at every depth, sorted by `a` (seq order of A).
    pub pairs: Vec<Pair>,
    /// For each op of A, its match in B (or `NONE`), and the reverse.
    pub a_match: Vec<u32>,
    /// Per call of B: its partner in A, or `NONE`.
    pub b_match: Vec<u32>,
    /// Roots of unmatched subtrees (sorted), and the op calls they hold.
    pub only_a: Vec<u32>,
    /// Roots of the subtrees only in B.
    pub only_b: Vec<u32>,
    /// Calls only in A, subtrees counted whole.
    pub only_a_calls: u64,
    /// Calls only in B, subtrees counted whole.
    pub only_b_calls: u64,
    /// Steps whose roots appear on one side only.
    pub steps_only_a: Vec<i64>,
    /// Steps only B has.
    pub steps_only_b: Vec<i64>,
    /// Per phase (forward, backward, optimizer): roots in groups present on
    /// both sides, on each side, and those matched with equal signatures.
    pub common_roots_a: [u64; 3],
    /// Roots of B in a (step, phase) group A has too, per phase.
    pub common_roots_b: [u64; 3],
    /// Roots paired by signature (not loosely), per phase.
    pub roots_matched_exact: [u64; 3],
    /// Op calls left out by `--ignore`, on each side (subtrees included).
    pub ignored_a: u64,
    /// Calls of B left out by the filter.
    pub ignored_b: u64,
    /// What the diff did (regions given up, and their calls).
    pub diff_stats: DiffStats,
    /// The dumps share no step number, so steps were not used to group.
    pub steps_ignored: bool,
    /// The first root of A of each (step, phase) group taking part, in
    /// call order: where [`Alignment::groups`] cuts the pairs.
    pub group_starts: Vec<u32>,
    /// The parameter names of the elements of the list calls paired
    /// element by element (see [`optimizer`]).
    pub list_params: Vec<optimizer::ListParams>,
    /// The tensors each pair of a fused optimizer kernel judges (see
    /// [`fused`]), sorted by (a, b, part).
    pub fused: Vec<fused::FusedTensors>,
}

/// Per dump: signature of every op, and whether it is ignored. The looser
/// key of loose pairs ([`Prepared::loose`]) is made when a gap asks for
/// it: gaps are few, and a column of it took 8 bytes per call of both
/// dumps at the peak of aligning (168 MB for the synthetic 10M pair).
struct Prepared {
    sig: Vec<u64>,
    /// Module paths are part of the keys.
    by_module: bool,
    /// Per call; empty when no filter ignores any op (then none is).
    ignored: Vec<bool>,
}

impl Prepared {
    /// Whether call `i` is left out by the filter.
    #[inline]
    fn ignored(&self, i: u32) -> bool {
        self.ignored.get(i as usize).copied().unwrap_or(false)
    }

    /// The looser key of call `i` of `d` (this dump's): op and overload,
    /// and the module when the keys have it.
    fn loose(&self, d: &Dump, i: u32) -> u64 {
        let l = d.name_signature(i);
        if self.by_module {
            mix(l, module_key(d.op_row(i).module, d))
        } else {
            l
        }
    }
}

/// The module path's part of a call's keys: two calls of one op in
/// different layers are different calls, even where their shapes agree (a
/// call missing on one side then cannot pair with the next layer's).
fn module_key(module: u32, d: &Dump) -> u64 {
    match module {
        NO_ID => 0,
        m => d.texts.hash(m),
    }
}

fn prepare(d: &Dump, filter: &Filter, by_module: bool) -> Prepared {
    // One pass over the calls' rows for both keys: the signature and the
    // module are read from the call's row once (each read of a row kept out
    // of memory costs a look-up, and a walk over every row a decode), and
    // the tensors' rows not at all.
    let mut sig = Vec::with_capacity(d.len());
    for i in 0..d.len() as u32 {
        let row = d.op_row(i);
        if by_module {
            sig.push(mix(row.sig, module_key(row.module, d)));
        } else {
            sig.push(row.sig);
        }
    }
    let mut ignored = Vec::new();
    if let Some(re) = filter.ignore.as_ref() {
        ignored = vec![false; d.len()];
        // One regex test per distinct (op, overload), not per call.
        let mut cache: FxMap<(u32, u32), bool> = FxMap::default();
        for (i, ig) in ignored.iter_mut().enumerate() {
            let key = d.calls.kind(i as u32);
            *ig = *cache
                .entry(key)
                .or_insert_with(|| ignores(re, d.names.get(key.0), d.names.get(key.1)));
        }
    }
    Prepared {
        sig,
        by_module,
        ignored,
    }
}

fn ignores(re: &Regex, op: &str, overload: &str) -> bool {
    re.is_match(&format!("{op}.{overload}"))
}

/// Roots by (step, phase), in seq order.
type Groups = BTreeMap<(i64, Phase), Vec<u32>>;

/// Roots taken part, grouped by (step, phase) (or by phase alone, when
/// `by_step` is false), in seq order.
fn groups(d: &Dump, p: &Prepared, filter: &Filter, by_step: bool) -> Groups {
    let mut g = Groups::new();
    for &r in &d.roots {
        let (step, phase) = (d.step(r), d.phase(r));
        if !p.ignored(r) && filter.step_selected(step) {
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
                (0..a1 - a0).all(|k| pa.loose(a, xa[a0 + k]) == pb.loose(b, xb[b0 + k]));
            if same_names {
                for k in 0..a1 - a0 {
                    out.push(Pair::whole(xa[a0 + k], xb[b0 + k], true));
                }
            }
        }
    };
    for &(i, j) in &matches {
        let (i, j) = (i as usize, j as usize);
        loose_gap(prev.0, i, prev.1, j, out);
        out.push(Pair::whole(xa[i], xb[j], false));
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
    for c in d.children_of(parent) {
        if p.ignored(c) {
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
        if p.ignored(i) {
            continue;
        }
        n += 1;
        stack.extend(d.children_of(i));
    }
    n
}

fn ignored_calls(d: &Dump, p: &Prepared) -> u64 {
    // Ignored op calls and everything beneath them.
    let mut n = 0;
    for i in 0..d.len() {
        let mut cur = i as u32;
        loop {
            if p.ignored(cur) {
                n += 1;
                break;
            }
            match d.parent.get(cur) {
                NONE => break,
                q => cur = q,
            }
        }
    }
    n
}

/// Both dumps' signatures, computed on two threads, with the module paths
/// as part of them or not.
fn prepare_both(a: &Dump, b: &Dump, filter: &Filter, by_module: bool) -> (Prepared, Prepared) {
    let (pa, pb) = std::thread::scope(|s| {
        let ha = s.spawn(|| prepare(a, filter, by_module));
        let pb = prepare(b, filter, by_module);
        (ha.join(), pb)
    });
    match pa {
        Ok(pa) => (pa, pb),
        Err(e) => std::panic::resume_unwind(e),
    }
}

/// The roots of both sides, grouped by (step, phase); by phase alone when
/// the dumps share no group (then the flag is true).
fn root_groups(s: &Sides<'_>, filter: &Filter) -> (Groups, Groups, bool) {
    let ga = groups(s.a, s.pa, filter, true);
    let gb = groups(s.b, s.pb, filter, true);
    // Steps numbered differently (one run dumped from a later step): align
    // the whole runs, phase by phase, rather than nothing.
    let steps_ignored = !ga.is_empty() && !gb.is_empty() && !ga.keys().any(|k| gb.contains_key(k));
    if steps_ignored {
        let ga = groups(s.a, s.pa, filter, false);
        let gb = groups(s.b, s.pb, filter, false);
        return (ga, gb, true);
    }
    (ga, gb, false)
}

/// Steps whose roots appear in `ga` and not in `gb`, and the reverse.
fn steps_on_one_side(ga: &Groups, gb: &Groups) -> (Vec<i64>, Vec<i64>) {
    let steps_a: BTreeSet<i64> = ga.keys().map(|k| k.0).collect();
    let steps_b: BTreeSet<i64> = gb.keys().map(|k| k.0).collect();
    (
        steps_a.difference(&steps_b).copied().collect(),
        steps_b.difference(&steps_a).copied().collect(),
    )
}

/// Pairs found so far, and the roots of unmatched subtrees on each side.
#[derive(Default)]
struct Matching {
    pairs: Vec<Pair>,
    only_a: Vec<u32>,
    only_b: Vec<u32>,
    /// Calls replaced by their children when aligning across levels.
    dissolved_a: Vec<u32>,
    dissolved_b: Vec<u32>,
    stats: DiffStats,
}

/// How many levels of calls a gap may dissolve (`matmul` > `reshape` >
/// `view` is two).
const MAX_DISSOLVE: u32 = 4;

/// The calls of `xs`, each replaced by its children where it has any; and
/// the calls so replaced.
fn dissolve(d: &Dump, p: &Prepared, xs: &[u32]) -> (Vec<u32>, Vec<u32>) {
    let (mut out, mut dissolved) = (Vec::with_capacity(xs.len()), Vec::new());
    for &x in xs {
        let start = out.len();
        children(d, p, x, &mut out, 0);
        if out.len() == start {
            out.push(x);
        } else {
            dissolved.push(x);
        }
    }
    (out, dissolved)
}

/// Exact matches between two lists, counted only.
fn matches_between(pa: &Prepared, xa: &[u32], pb: &Prepared, xb: &[u32]) -> usize {
    let sa: Vec<u64> = xa.iter().map(|&i| pa.sig[i as usize]).collect();
    let sb: Vec<u64> = xb.iter().map(|&i| pb.sig[i as usize]).collect();
    diff(&sa, &sb, &mut DiffStats::default()).len()
}

/// Aligns `xa` with `xb` as [`align_lists`] does, then each gap between
/// its pairs again with one side's calls dissolved into their children,
/// whichever side matches more. Calls no level matches go to `m.only_*`.
fn align_across_levels(s: &Sides<'_>, xa: &[u32], xb: &[u32], m: &mut Matching, level: u32) {
    let start = m.pairs.len();
    align_lists(s, xa, xb, &mut m.stats, &mut m.pairs);
    let found: Vec<(usize, usize)> = {
        let pos = |xs: &[u32], id: u32| xs.iter().position(|&x| x == id).unwrap_or(0);
        let (mut ia, mut ib) = (0, 0);
        m.pairs[start..]
            .iter()
            .map(|p| {
                // Pairs come in list order: search on from the last one.
                ia += pos(&xa[ia..], p.a);
                ib += pos(&xb[ib..], p.b);
                let here = (ia, ib);
                (ia, ib) = (ia + 1, ib + 1);
                here
            })
            .collect()
    };
    let mut prev = (0, 0);
    for (i, j) in found.into_iter().chain([(xa.len(), xb.len())]) {
        align_gap(s, &xa[prev.0..i], &xb[prev.1..j], m, level);
        prev = (i + 1, j + 1);
    }
}

fn align_gap(s: &Sides<'_>, ga: &[u32], gb: &[u32], m: &mut Matching, level: u32) {
    if !ga.is_empty() && !gb.is_empty() && level < MAX_DISSOLVE {
        let ((ea, da), (eb, db)) = (dissolve(s.a, s.pa, ga), dissolve(s.b, s.pb, gb));
        let by_a = if da.is_empty() {
            0
        } else {
            matches_between(s.pa, &ea, s.pb, gb)
        };
        let by_b = if db.is_empty() {
            0
        } else {
            matches_between(s.pa, ga, s.pb, &eb)
        };
        if by_a.max(by_b) > 0 {
            let (xa, xb) = if by_a >= by_b {
                m.dissolved_a.extend(da);
                (ea, gb.to_vec())
            } else {
                m.dissolved_b.extend(db);
                (ga.to_vec(), eb)
            };
            return align_across_levels(s, &xa, &xb, m, level + 1);
        }
    }
    m.only_a.extend_from_slice(ga);
    m.only_b.extend_from_slice(gb);
}

/// Per phase (forward, backward, optimizer): roots in groups present on
/// both sides, on each side, and those matched with equal signatures.
#[derive(Default)]
struct RootCounts {
    common_a: [u64; 3],
    common_b: [u64; 3],
    exact: [u64; 3],
}

impl RootCounts {
    /// Roots matched, and the larger side's roots: of the model's phases
    /// (forward, backward) where both sides have them, else of all.
    fn matched_of_larger(&self) -> (u64, u64) {
        roots_matched_of_larger(self.common_a, self.common_b, self.exact)
    }
}

/// See [`RootCounts::matched_of_larger`].
fn roots_matched_of_larger(ca: [u64; 3], cb: [u64; 3], exact: [u64; 3]) -> (u64, u64) {
    let model = |x: [u64; 3]| x[0] + x[1];
    if model(ca) > 0 && model(cb) > 0 {
        (model(exact), model(ca).max(model(cb)))
    } else {
        (
            exact.iter().sum(),
            ca.iter().sum::<u64>().max(cb.iter().sum()),
        )
    }
}

impl Alignment {
    /// The pairs in groups of one (step, phase) of A's calls each, in
    /// order: ranges of [`Alignment::pairs`], for [`crate::Judge::push`]. A
    /// group runs from the first root of its (step, phase) to the next
    /// group's; every pair is in one range.
    pub fn groups(&self) -> Vec<std::ops::Range<usize>> {
        let mut cuts: Vec<usize> = self
            .group_starts
            .iter()
            .map(|&first| self.pairs.partition_point(|p| p.a < first))
            .collect();
        cuts.push(self.pairs.len());
        let mut out = Vec::new();
        let mut start = 0;
        for cut in cuts {
            if cut > start {
                out.push(start..cut);
                start = cut;
            }
        }
        out
    }

    /// Top-level calls matched, and how many the larger side has, in the
    /// groups both sides have: what tells two runs of one program from two
    /// programs. Judged on the model's calls (forward and backward) when
    /// there are some: optimizers legitimately differ by device (a
    /// per-parameter loop on one, `_foreach_` calls on the other).
    pub fn roots_matched_of_larger(&self) -> (u64, u64) {
        roots_matched_of_larger(
            self.common_roots_a,
            self.common_roots_b,
            self.roots_matched_exact,
        )
    }
}

/// Aligns the roots of each group present on both sides. A group present
/// on one side only is unmatched as a whole. `across_levels`: see
/// [`align_across_levels`]; what is counted is then the calls of the lists
/// as dissolved, not the roots: so many of them must pair for one program.
fn align_roots(
    s: &Sides<'_>,
    ga: &Groups,
    gb: &Groups,
    m: &mut Matching,
    progress: &dyn Observer,
    across_levels: bool,
) -> RootCounts {
    let mut counts = RootCounts::default();
    for (key, ra) in ga {
        let Some(rb) = gb.get(key) else {
            m.only_a.extend_from_slice(ra);
            continue;
        };
        progress.phase(&format!("aligning: step {} {}", key.0, key.1.as_str()));
        let ph = key.1 as usize;
        if across_levels {
            // The calls of the lists as dissolved: each paired, or left
            // unmatched on its side.
            let (start, left_a, left_b) = (m.pairs.len(), m.only_a.len(), m.only_b.len());
            align_across_levels(s, ra, rb, m, 0);
            let found = &m.pairs[start..];
            let paired = found.len() as u64;
            counts.common_a[ph] += paired + (m.only_a.len() - left_a) as u64;
            counts.common_b[ph] += paired + (m.only_b.len() - left_b) as u64;
            // As at the roots, pairs by name alone (other shapes) do not
            // make one program.
            counts.exact[ph] += found.iter().filter(|p| !p.loose()).count() as u64;
        } else {
            counts.common_a[ph] += ra.len() as u64;
            counts.common_b[ph] += rb.len() as u64;
            counts.exact[ph] += align_lists(s, ra, rb, &mut m.stats, &mut m.pairs);
        }
    }
    for (key, rb) in gb {
        if !ga.contains_key(key) {
            m.only_b.extend_from_slice(rb);
        }
    }
    counts
}

/// Aligns the children of every matched pair, breadth-first: the pairs
/// `m.pairs` holds are a work list that grows as children match, so the
/// whole trees are aligned without recursion.
fn align_nested(s: &Sides<'_>, m: &mut Matching, progress: &dyn Observer) {
    let mut next = 0;
    let (mut ca, mut cb) = (Vec::new(), Vec::new());
    let mut scratch: Vec<u32> = Vec::new();
    while next < m.pairs.len() {
        let (ia, ib, part) = (m.pairs[next].a, m.pairs[next].b, m.pairs[next].part());
        next += 1;
        ca.clear();
        cb.clear();
        children(s.a, s.pa, ia, &mut ca, 0);
        children(s.b, s.pb, ib, &mut cb, 0);
        if let Some((side, elem)) = part.element_of() {
            // A list call's children and a per-parameter call's do not
            // correspond: both stay unmatched, the list call's once.
            let (list, per_param) = match side {
                Side::A => (&ca, &cb),
                Side::B => (&cb, &ca),
            };
            let (only_list, only_per_param) = match side {
                Side::A => (&mut m.only_a, &mut m.only_b),
                Side::B => (&mut m.only_b, &mut m.only_a),
            };
            if elem == 0 {
                only_list.extend_from_slice(list);
            }
            only_per_param.extend_from_slice(per_param);
            continue;
        }
        let start = m.pairs.len();
        if !ca.is_empty() && !cb.is_empty() {
            align_lists(s, &ca, &cb, &mut m.stats, &mut m.pairs);
        }
        let found = &m.pairs[start..];
        push_unmatched(&ca, found.iter().map(|p| p.a), &mut scratch, &mut m.only_a);
        push_unmatched(&cb, found.iter().map(|p| p.b), &mut scratch, &mut m.only_b);
        if next % 65536 == 0 {
            progress.update(&|| format!("aligning: nested calls {next}/{}", m.pairs.len()));
        }
    }
}

/// Appends the `candidates` that are not among `matched` (children that
/// found no partner); `scratch` is reused to sort `matched`.
fn push_unmatched(
    candidates: &[u32],
    matched: impl Iterator<Item = u32>,
    scratch: &mut Vec<u32>,
    out: &mut Vec<u32>,
) {
    scratch.clear();
    scratch.extend(matched);
    scratch.sort_unstable();
    out.extend(
        candidates
            .iter()
            .copied()
            .filter(|c| scratch.binary_search(c).is_err()),
    );
}

/// For each op of A its partner in B, or `NONE`; and the reverse.
fn partners(pairs: &[Pair], len_a: usize, len_b: usize) -> (Vec<u32>, Vec<u32>) {
    let mut a_match = vec![NONE; len_a];
    let mut b_match = vec![NONE; len_b];
    for p in pairs {
        a_match[p.a as usize] = p.b;
        b_match[p.b as usize] = p.a;
    }
    (a_match, b_match)
}

/// Appends the roots of the groups of `g` that `other` also has and that
/// found no partner, unless they were dissolved (sorted).
fn push_unmatched_roots(
    g: &Groups,
    other: &Groups,
    partner: &[u32],
    dissolved: &[u32],
    out: &mut Vec<u32>,
) {
    for roots in g
        .iter()
        .filter(|(k, _)| other.contains_key(k))
        .map(|(_, v)| v)
    {
        out.extend(
            roots
                .iter()
                .copied()
                .filter(|&r| partner[r as usize] == NONE && dissolved.binary_search(&r).is_err()),
        );
    }
}

fn sorted_unique(mut v: Vec<u32>) -> Vec<u32> {
    v.sort_unstable();
    v.dedup();
    v
}

/// Aligns the calls of `a` and `b` that `filter` selects: roots by (step, phase) group, then their children, recursively.
pub fn align(a: &Dump, b: &Dump, filter: &Filter, progress: &dyn Observer) -> Alignment {
    progress.phase("aligning: signatures");
    // Module paths take part when both dumps have them (a dump of schema 1,
    // or one written with `OPDUMP_MODULES=0`, has none).
    let by_module = a.has_modules && b.has_modules;
    let (pa, pb) = prepare_both(a, b, filter, by_module);
    let sides = Sides {
        a,
        b,
        pa: &pa,
        pb: &pb,
    };
    let (ga, gb, steps_ignored) = root_groups(&sides, filter);
    let group_starts = sorted_unique(
        ga.values()
            .filter_map(|roots| roots.first().copied())
            .collect(),
    );
    let (steps_only_a, steps_only_b) = if steps_ignored {
        (Vec::new(), Vec::new())
    } else {
        steps_on_one_side(&ga, &gb)
    };
    let mut m = Matching::default();
    let mut counts = align_roots(&sides, &ga, &gb, &mut m, progress, false);
    // Too few roots match for one program: align again across levels, and
    // by ops alone, since compiled code's calls carry no module. Kept when
    // it matches more.
    let (matched, larger) = counts.matched_of_larger();
    let retry = matched * 2 < larger;
    let by_ops = (retry && by_module).then(|| prepare_both(a, b, filter, false));
    let across_sides = match &by_ops {
        Some((qa, qb)) => Sides {
            a,
            b,
            pa: qa,
            pb: qb,
        },
        None => Sides {
            a,
            b,
            pa: &pa,
            pb: &pb,
        },
    };
    let mut nested_sides = &sides;
    if retry {
        let mut again = Matching::default();
        let across = align_roots(&across_sides, &ga, &gb, &mut again, progress, true);
        if across.matched_of_larger().0 > matched {
            (m, counts, nested_sides) = (again, across, &across_sides);
        }
    }
    let (list_params, fused) = optimizer::pair_optimizer_lists(
        a,
        b,
        (&ga, &gb),
        (&mut m.pairs, &m.dissolved_a, &m.dissolved_b),
    );
    progress.phase("aligning: nested calls");
    align_nested(nested_sides, &mut m, progress);

    let (a_match, b_match) = partners(&m.pairs, a.len(), b.len());
    let (dissolved_a, dissolved_b) = (sorted_unique(m.dissolved_a), sorted_unique(m.dissolved_b));
    push_unmatched_roots(&ga, &gb, &a_match, &dissolved_a, &mut m.only_a);
    push_unmatched_roots(&gb, &ga, &b_match, &dissolved_b, &mut m.only_b);
    let only_a = sorted_unique(m.only_a);
    let only_b = sorted_unique(m.only_b);
    let mut pairs = m.pairs;
    // A list call of A pairs once per element: in element order.
    pairs.sort_unstable_by_key(|p| (p.a, p.part()));

    let ignored = |d: &Dump, p: &Prepared| {
        if filter.ignore.is_some() {
            ignored_calls(d, p)
        } else {
            0
        }
    };
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
        common_roots_a: counts.common_a,
        common_roots_b: counts.common_b,
        roots_matched_exact: counts.exact,
        ignored_a: ignored(a, &pa),
        ignored_b: ignored(b, &pb),
        diff_stats: m.stats,
        steps_ignored,
        group_starts,
        list_params,
        fused,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_pair_keeps_looseness_in_its_part() {
        assert_eq!(std::mem::size_of::<Pair>(), 12);
        let loose = Pair::whole(3, 4, true);
        let exact = Pair::whole(3, 4, false);
        assert!(loose.loose() && !exact.loose());
        assert_eq!((loose.part(), exact.part()), (Part::WHOLE, Part::WHOLE));
        assert_ne!(loose, exact);
        for part in [
            Part::element(Side::A, 0),
            Part::element(Side::B, (1 << 30) - 1),
            Part::fused(Side::B, 7, fused::Written::from_bits(2)),
        ] {
            let p = Pair::of_part(1, 2, part);
            assert!(!p.loose());
            assert_eq!(p.part(), part);
        }
    }
}
