//! The comparison of two loaded dumps: align them, measure and judge every
//! aligned pair, and find the first divergence and the first introduced
//! divergence.

use std::cell::{Cell, RefCell};

use opdump_format::Role;

use crate::align::{align, Alignment, Filter, Pair};
use crate::drift::{drift_source, DriftSource};
use crate::dump::{Dump, NONE};
use crate::input_taints::InputTaints;
use crate::introduced::Introduced;
use crate::metrics::{Ctx, OpCmp, Taint, TensorCmp};
use crate::observer::Observer;
use crate::one_sided::OneSided;
use crate::provenance::{side_hash, Found, Provenance};
use crate::refusal::{Refusal, Side};
use crate::tolerance::Tolerances;
use crate::verdict::{OpVerdict, TensorVerdict};

/// How two loaded dumps are compared: the options other than which dumps
/// and which rank.
pub struct CompareSettings {
    /// Which calls take part.
    pub filter: Filter,
    /// The tolerance model.
    pub tol: Tolerances,
    /// How many introduced ops the top list keeps.
    pub top: usize,
    /// Compare even when the dumps look like different programs.
    pub force: bool,
    /// Calls of A's steps before this one are context only: judged, so
    /// that the tensors they make have a producer and a taint (the
    /// parameters an optimizer step wrote, read by the next step's
    /// forward), but no verdict, divergence or change only in B is taken
    /// from them. Online compare judges a step with the one before it.
    pub context_before: Option<i64>,
}

/// Everything a report needs.
pub struct Compared {
    /// The first dump, the reference.
    pub a: Dump,
    /// The second dump, under test.
    pub b: Dump,
    /// How their calls pair.
    pub alignment: Alignment,
    /// The tolerance model used.
    pub tol: Tolerances,
    /// Per pair (index into `alignment.pairs`).
    pub verdict: Vec<OpVerdict>,
    /// Per pair: the largest relative error of an output.
    pub out_err: Vec<f32>,
    /// Per tensor of A: the taint an input had (see `provenance`), and
    /// whether it was the input's own error (see [`Taint::own`]), so a
    /// report recomputes the same verdicts.
    pub input_taint: InputTaints,
    /// Tensor pairs by verdict (index: `TensorVerdict as usize`).
    pub tensor_counts: [u64; TensorVerdict::ALL.len()],
    /// Pairs by verdict (index: `OpVerdict as usize`).
    pub op_counts: [u64; OpVerdict::ALL.len()],
    /// Tensor pairs compared.
    pub tensor_pairs: u64,
    /// Tensor pairs whose dtypes differ.
    pub dtype_differs: u64,
    /// The first pair, in call order, whose outputs diverged or that read
    /// an input over its tolerance that no aligned op made (a parameter,
    /// data: where a difference enters the comparison).
    pub first_divergence: Option<usize>,
    /// The first introduced op in call order (the deepest introduced op
    /// inside the first introduced subtree).
    pub first_introduced: Option<usize>,
    /// When the first divergence is a parameter's first read in a step:
    /// the previous step's optimizer changed it (see [`crate::drift`]).
    pub drift_source: Option<DriftSource>,
    /// Unmatched subtrees before the first divergence, in A and in B: the
    /// calls one side makes upstream of it (0 and 0 without a divergence).
    pub unmatched_upstream: [u64; 2],
    /// The op the verdict names: the first introduced, unless a later one
    /// exceeds its allowance [`HEADLINE_DOMINANCE`] times more (see
    /// [`headline`]).
    pub headline: Option<usize>,
    /// Introduced ops without an introduced descendant, by amplification.
    pub top_introduced: Vec<usize>,
    /// Values changed by calls only in B before an aligned op consumed them,
    /// when that is the first cause of the divergence (see
    /// `changed_only_in_b`).
    pub first_unmatched_change: Option<UnmatchedChange>,
    /// What a reader of the report should know (said once each).
    pub notes: Vec<String>,
}

/// A tensor that calls only in B changed between its aligned producer and
/// an aligned consumer.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct UnmatchedChange {
    /// The consumer (index into `alignment.pairs`).
    pub pair: usize,
    /// The op only in B that made the changed tensor, when found.
    pub b_op: Option<u32>,
    /// B's tensor as its aligned producer made it, and as consumed.
    pub before: u32,
    /// B's tensor as the consumer read it.
    pub after: u32,
    /// Lower bound on the relative change, and the consumer's tolerance.
    pub rel_change: f64,
    /// The consumer's tolerance.
    pub tolerance: f64,
}

impl Compared {
    /// The measuring context of the two dumps.
    pub fn ctx(&self) -> Ctx<'_> {
        Ctx::new(&self.a, &self.b, &self.tol).with_fused(&self.alignment.fused)
    }

    /// The verdict of pair `pair`.
    pub fn op_verdict(&self, pair: usize) -> OpVerdict {
        self.verdict[pair]
    }

    /// Full comparison of one pair, for reports: the same verdicts as the
    /// main pass, with the inputs' divergence it recorded.
    pub fn detail(&self, pair: usize) -> OpCmp {
        let mut cmp = OpCmp::default();
        self.detail_into(pair, &self.ctx(), &mut cmp);
        cmp
    }

    /// [`Compared::detail`] into `cmp`, with a context made once.
    pub fn detail_into(&self, pair: usize, ctx: &Ctx<'_>, cmp: &mut OpCmp) {
        let p = self.alignment.pairs[pair];
        ctx.measure_pair(p, cmp);
        ctx.judge(cmp, |tc| {
            tc.ta
                .map_or(Taint::default(), |x| self.input_taint.taint(x))
        });
    }

    /// Whether some output diverged.
    pub fn divergence_found(&self) -> bool {
        self.first_divergence.is_some()
    }

    /// What the exit status says: an op introduced a divergence (aligned,
    /// or only in B), outputs diverged with no op to blame, or neither.
    pub fn outcome(&self) -> Outcome {
        if self.headline.is_some() || self.first_unmatched_change.is_some() {
            Outcome::Introduced
        } else if self.divergence_found() {
            Outcome::DriftOnly
        } else {
            Outcome::Agree
        }
    }
}

/// The three answers of a comparison, one exit status each.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Outcome {
    /// Every aligned op agrees within what rounding explains.
    Agree,
    /// Some op's kernel made an error its inputs do not explain.
    Introduced,
    /// Outputs diverged, but every diverged op inherited it: from inputs
    /// that differ from the start, random or discontinuous ops, or calls
    /// only in A. No kernel to blame.
    DriftOnly,
}

impl Outcome {
    /// The outcome's name in the verdict file: `agree`, `introduced` or
    /// `drift`.
    pub fn as_str(self) -> &'static str {
        match self {
            Outcome::Agree => "agree",
            Outcome::Introduced => "introduced",
            Outcome::DriftOnly => "drift",
        }
    }

    /// The exit status `opdump compare` gives it: 0, 1 or 3.
    pub fn exit_status(self) -> u8 {
        match self {
            Outcome::Agree => 0,
            Outcome::Introduced => 1,
            Outcome::DriftOnly => 3,
        }
    }
}

/// A later introduced op whose error is at least this many times further
/// beyond what its inputs and rounding explain (`excess`: output error over
/// the allowed error) than the first one's takes the headline. An order of
/// magnitude: a false alarm from rounding that the model explains badly
/// exceeds its allowance by a few times (the cancelled key-bias sum of a
/// BERT: 5.3 times), a 1e-3 fault in float32 by a hundred and more. The
/// excess is relative to each op's own tolerance, so a bfloat16 fault and
/// a float32 false alarm compare fairly, which amplification does not (a
/// bfloat16 kernel can amplify at most about 1/u = 256).
pub const HEADLINE_DOMINANCE: f64 = 10.0;

/// The headline among introduced ops: the first in call order, unless some
/// introduced leaf goes [`HEADLINE_DOMINANCE`] times further beyond its
/// allowance than the first one; then the first of those in call order
/// (where that fault first showed). Infinite excess (NaN or Inf from
/// finite inputs, a shape change) dominates any finite one; against an
/// infinite first, nothing does.
/// `excess` gives each introduced pair's.
pub fn headline(
    first: Option<usize>,
    leaves: &[usize],
    excess: impl Fn(usize) -> f32,
) -> Option<usize> {
    let first = first?;
    let bar = HEADLINE_DOMINANCE * excess(first) as f64;
    let dominant = leaves
        .iter()
        .copied()
        .filter(|&k| excess(k) > excess(first) && excess(k) as f64 >= bar)
        .min();
    Some(dominant.unwrap_or(first))
}

/// Compares two loaded dumps: aligns them, checks that they are runs of
/// one program, measures and judges every aligned pair, and finds the
/// divergences a report names. `notes` holds what reading already noted.
pub fn compare_dumps(
    a: Dump,
    b: Dump,
    settings: CompareSettings,
    mut notes: Vec<String>,
    progress: &dyn Observer,
) -> Result<Compared, Refusal> {
    let CompareSettings {
        filter,
        tol,
        top,
        force,
        context_before,
    } = settings;
    check_dumps_hold_calls(&a, &b, &filter)?;
    let t0 = std::time::Instant::now();
    let alignment = align(&a, &b, &filter, progress);
    progress.stage_done("align", t0);
    let t0 = std::time::Instant::now();
    check_alignment(&a, &b, &alignment, (&filter, force), &mut notes)?;

    // Measuring runs ahead of judging on a second thread, over all groups
    // (and while this one finds them).
    let j = std::thread::scope(|s| {
        let mut judge = Judge::new(&a, &b, &alignment, &tol, top);
        if let Some(step) = context_before {
            // Pairs are in A's call order, and steps follow it.
            judge.judged.judged_from = alignment.pairs.partition_point(|p| a.step(p.a) < step);
        }
        judge.measure_ahead(s);
        for group in alignment.groups() {
            judge.push(group, progress);
        }
        judge.finish()
    });
    progress.finish();
    progress.stage_done("measure", t0);
    Ok(Compared {
        a,
        b,
        alignment,
        tol,
        verdict: j.verdict,
        out_err: j.out_err,
        input_taint: j.input_taint,
        tensor_pairs: j.tensor_counts.iter().sum(),
        tensor_counts: j.tensor_counts,
        op_counts: j.op_counts,
        dtype_differs: j.dtype_differs,
        first_divergence: j.first_divergence,
        first_introduced: j.first_introduced,
        drift_source: j.drift_source,
        unmatched_upstream: j.unmatched_upstream,
        headline: j.headline,
        top_introduced: j.top_introduced,
        first_unmatched_change: j.first_unmatched_change,
        notes,
    })
}

/// Refuses a dump without op calls, or without any in the selected steps:
/// there would be nothing to compare, and the reason is worth saying.
fn check_dumps_hold_calls(a: &Dump, b: &Dump, filter: &Filter) -> Result<(), Refusal> {
    for (d, side) in [(a, Side::A), (b, Side::B)] {
        if d.is_empty() {
            return Err(Refusal::NoCalls {
                side,
                path: d.path.clone(),
            });
        }
        if !filter.steps.is_empty() && !d.roots.iter().any(|&r| filter.step_selected(d.step(r))) {
            return Err(Refusal::NoCallsInSteps {
                side,
                path: d.path.clone(),
                has: step_range(d),
            });
        }
    }
    Ok(())
}

/// Refuses an alignment of two different programs (unless `force`), and
/// notes what the reader of the report should know about it.
fn check_alignment(
    a: &Dump,
    b: &Dump,
    alignment: &Alignment,
    (filter, force): (&Filter, bool),
    notes: &mut Vec<String>,
) -> Result<(), Refusal> {
    let (ca, cb) = (alignment.common_roots_a, alignment.common_roots_b);
    if ca.iter().sum::<u64>() == 0 || cb.iter().sum::<u64>() == 0 {
        return Err(Refusal::NoPhaseInCommon {
            steps_a: step_range(a),
            steps_b: step_range(b),
            phases_a: phase_list(a, filter),
            phases_b: phase_list(b, filter),
        });
    }
    if alignment.steps_ignored {
        notes.push(format!(
            "the dumps share no step number (A: {}, B: {}): aligned ignoring steps",
            step_range(a),
            step_range(b)
        ));
    }
    let (matched, larger) = alignment.roots_matched_of_larger();
    if matched * 2 < larger {
        if !force {
            return Err(Refusal::DifferentPrograms { matched, larger });
        }
        notes.push(format!(
            "the dumps look like different programs: only {matched} of {larger} top-level op calls align (use --force to compare anyway)"
        ));
    }
    if alignment.diff_stats.regions_given_up > 0 {
        notes.push(format!(
            "alignment gave up on {} region(s) without any common anchor ({} op calls left unmatched)",
            alignment.diff_stats.regions_given_up, alignment.diff_stats.tokens_given_up
        ));
    }
    Ok(())
}

/// What judging every pair yields, per pair (index into the pairs) unless
/// said otherwise.
struct Judged {
    verdict: Vec<OpVerdict>,
    out_err: Vec<f32>,
    /// The pairs judged introduced, in order, with their amplification and
    /// their output error over the allowed error: what the top list and
    /// the headline rank them by. Only introduced pairs are ranked (a
    /// verdict changes afterwards only to absorbed), so the rest keep
    /// none: 8 bytes per pair saved.
    introduced: Introduced,
    /// Per tensor of A: the taint an input had.
    input_taint: InputTaints,
    /// Outputs compared and found to agree, nothing upstream diverged.
    verified: Vec<bool>,
    /// The first pair that read an input over its tolerance that no
    /// aligned op made, and those inputs (A's tensors).
    first_diverged_input: Option<(usize, Vec<u32>)>,
    tensor_counts: [u64; TensorVerdict::ALL.len()],
    dtype_differs: u64,
    /// The first input that calls only in B changed (its maker not yet
    /// looked for).
    unmatched_change: Option<UnmatchedChange>,
    /// (consumer, producer): pair `consumer` read a tainted output of pair
    /// `producer`. The paths along which a divergence travels.
    consumed_tainted: Vec<(u32, u32)>,
    /// The pairs before this one are context (`CompareSettings::context_before`).
    judged_from: usize,
}

/// Pairs measured per batch handed from the measuring thread.
const MEASURE_BATCH: usize = 4096;

/// What the judge decided about every pair, for [`Compared`].
pub struct Judgement {
    /// Per pair (index into the alignment's pairs).
    pub verdict: Vec<OpVerdict>,
    /// Per pair: the largest relative error of an output.
    pub out_err: Vec<f32>,
    /// Per tensor of A: the taint an input had, and whether it was the
    /// input's own error.
    pub input_taint: InputTaints,
    /// Tensor pairs by verdict.
    pub tensor_counts: [u64; TensorVerdict::ALL.len()],
    /// Pairs by verdict.
    pub op_counts: [u64; OpVerdict::ALL.len()],
    /// Tensor pairs whose dtypes differ.
    pub dtype_differs: u64,
    /// The first pair whose outputs diverged, or that read an input over
    /// its tolerance that no aligned op made.
    pub first_divergence: Option<usize>,
    /// The first introduced pair in call order, the deepest inside it.
    pub first_introduced: Option<usize>,
    /// Where the first divergence came from, when a parameter the previous
    /// step's optimizer changed is what differs.
    pub drift_source: Option<DriftSource>,
    /// Unmatched subtrees before the first divergence, in A and in B.
    pub unmatched_upstream: [u64; 2],
    /// The pair the verdict names (see [`headline`]).
    pub headline: Option<usize>,
    /// Introduced pairs without an introduced descendant, by amplification.
    pub top_introduced: Vec<usize>,
    /// A change made by calls only in B, when it is the first cause.
    pub first_unmatched_change: Option<UnmatchedChange>,
}

/// Judges the aligned pairs of two dumps one (step, phase) group at a
/// time ([`Judge::push`]), in A's call order, so that every input's
/// producer is judged before its consumers; [`Judge::finish`] then finds
/// the first divergence, the first introduced one and the headline. What
/// a group's outputs taint stays known to the groups after it (a backward
/// reads what the forward made).
pub struct Judge<'d> {
    ctx: Ctx<'d>,
    alignment: &'d Alignment,
    top: usize,
    judged: Judged,
    prov: Provenance,
    one_sided: OneSided,
    /// Pairs judged so far: the next group starts here.
    next: usize,
    /// The pairs a second thread measures ahead ([`Judge::measure_ahead`]);
    /// without it, each pair is measured when it is judged, into `inline`.
    ahead: Option<Ahead>,
    inline: OpCmp,
}

/// Pairs measured ahead by a second thread, in order, a batch at a time.
struct Ahead {
    rx: std::sync::mpsc::Receiver<Vec<OpCmp>>,
    /// Judged batches go back to be refilled: no allocation per pair.
    back: std::sync::mpsc::Sender<Vec<OpCmp>>,
    batch: Vec<OpCmp>,
    pos: usize,
}

impl Ahead {
    /// The next pair measured; `None` when the thread has stopped.
    fn next(&mut self) -> Option<&mut OpCmp> {
        if self.pos == self.batch.len() {
            let judged = std::mem::take(&mut self.batch);
            if !judged.is_empty() {
                // Kept whole: the next batch reuses each OpCmp's buffers.
                let _ = self.back.send(judged);
            }
            self.batch = self.rx.recv().ok()?;
            self.pos = 0;
        }
        self.pos += 1;
        self.batch.get_mut(self.pos - 1)
    }
}

impl<'d> Judge<'d> {
    /// A judge of `alignment`'s pairs of `a` and `b`, keeping the `top`
    /// introduced ops for the top list.
    pub fn new(
        a: &'d Dump,
        b: &'d Dump,
        alignment: &'d Alignment,
        tol: &'d Tolerances,
        top: usize,
    ) -> Self {
        let n = alignment.pairs.len();
        Judge {
            ctx: Ctx::new(a, b, tol).with_fused(&alignment.fused),
            alignment,
            top,
            judged: Judged {
                verdict: vec![OpVerdict::Ok; n],
                out_err: vec![0f32; n],
                introduced: Introduced::default(),
                input_taint: InputTaints::new(a.tensors.len()),
                verified: vec![false; n],
                first_diverged_input: None,
                tensor_counts: [0u64; TensorVerdict::ALL.len()],
                dtype_differs: 0,
                unmatched_change: None,
                consumed_tainted: Vec::new(),
                judged_from: 0,
            },
            // Room for an output per two pairs, grown when more come: the
            // synthetic 1M pair's 947K pairs register 631K distinct outputs.
            // Sized by A's tensors (2.8M / 2) the table had twice the
            // buckets it needs, and inserts at random touch every page.
            prov: Provenance::with_capacity(n / 2),
            one_sided: OneSided::new(a, b, alignment),
            next: 0,
            ahead: None,
            inline: OpCmp::default(),
        }
    }

    /// Measures the pairs not judged yet on a second thread of `scope`,
    /// ahead of the pushes that judge them (measuring needs no order).
    /// Finish the judge inside the scope: the thread waits for it to take
    /// what it measured.
    pub fn measure_ahead<'scope, 'env>(&mut self, scope: &'scope std::thread::Scope<'scope, 'env>)
    where
        'd: 'scope,
    {
        let pairs = &self.alignment.pairs[self.next..];
        let (a, b, tol) = (self.ctx.a, self.ctx.b, self.ctx.tol);
        let fused = &self.alignment.fused[..];
        // Two batches queued keep the judging thread fed; each batch more
        // held about 10 MB at the 10M pair's peak (8 queued: 40 MB more).
        let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<OpCmp>>(2);
        let (back, back_rx) = std::sync::mpsc::channel::<Vec<OpCmp>>();
        scope.spawn(move || {
            let ctx = Ctx::new(a, b, tol).with_fused(fused);
            for chunk in pairs.chunks(MEASURE_BATCH) {
                let mut batch = back_rx.try_recv().unwrap_or_default();
                batch.resize_with(chunk.len(), OpCmp::default);
                for (p, cmp) in chunk.iter().zip(batch.iter_mut()) {
                    cmp.reset();
                    ctx.measure_pair(*p, cmp);
                }
                if tx.send(batch).is_err() {
                    return;
                }
            }
        });
        self.ahead = Some(Ahead {
            rx,
            back,
            batch: Vec::new(),
            pos: 0,
        });
    }

    /// Judges the pairs of one group (a range of the alignment's pairs, as
    /// [`Alignment::groups`] gives them), measured ahead or here. Groups
    /// come in order; pairs before `group.end` that an earlier push left
    /// out are judged now, and pairs judged already are not judged again.
    pub fn push(&mut self, group: std::ops::Range<usize>, progress: &dyn Observer) {
        let n = self.alignment.pairs.len();
        let end = group.end.min(n);
        if end <= self.next {
            return;
        }
        let Judge {
            ctx,
            alignment,
            judged: j,
            prov,
            one_sided,
            next,
            ahead,
            inline,
            ..
        } = self;
        // Set from inside `judge`'s callback, which may not mutate.
        let first_change = Cell::new(j.unmatched_change);
        let consumed_tainted = RefCell::new(std::mem::take(&mut j.consumed_tainted));
        for k in *next..end {
            let cmp = match ahead.as_mut().and_then(Ahead::next) {
                Some(cmp) => cmp,
                None => {
                    let p = alignment.pairs[k];
                    inline.reset();
                    ctx.measure_pair(p, inline);
                    &mut *inline
                }
            };
            ctx.judge(cmp, |tc| {
                let found = find_producer(prov, tc);
                if let Some(f) = found.filter(|f| f.taint > 0.0) {
                    consumed_tainted.borrow_mut().push((k as u32, f.producer));
                }
                let change = if k >= j.judged_from {
                    Some(&first_change)
                } else {
                    None
                };
                input_taint_from(ctx, found, one_sided, tc, k, change)
            });
            j.record(k, cmp, prov);
            register_outputs(ctx, cmp, one_sided);
            if k.is_multiple_of(65536) {
                progress.update(&|| format!("measuring: {k}/{n} op pairs"));
            }
        }
        j.unmatched_change = first_change.get();
        j.consumed_tainted = consumed_tainted.into_inner();
        *next = end;
    }

    /// Judges what no push reached, then finds what a report names: the
    /// absorbed divergences, the first divergence, the first introduced,
    /// the headline and the top list.
    pub fn finish(mut self) -> Judgement {
        self.push(0..self.alignment.pairs.len(), &crate::observer::Silent);
        // Lets a measuring thread that ran ahead end.
        self.ahead = None;
        let Judge {
            ctx,
            alignment,
            top,
            judged,
            ..
        } = self;
        let (a, b) = (ctx.a, ctx.b);
        let Judged {
            mut verdict,
            out_err,
            introduced,
            input_taint,
            verified,
            first_diverged_input,
            tensor_counts,
            dtype_differs,
            unmatched_change,
            consumed_tainted,
            judged_from,
        } = judged;
        let pair_of_a = pair_of_each_op(&alignment.pairs, a.len());
        let tree = PairTree {
            a,
            pairs: &alignment.pairs,
            pair_of_a: &pair_of_a,
        };
        mark_absorbed(&tree, &verified, &consumed_tainted, &mut verdict);
        // Context pairs were judged for their outputs' provenance only.
        verdict[..judged_from].fill(OpVerdict::Ok);
        let mut op_counts = [0u64; OpVerdict::ALL.len()];
        for &v in &verdict {
            op_counts[v as usize] += 1;
        }
        // Pairs are sorted by A's index, which is seq order. An input that
        // differs beyond its tolerance with no aligned op to have made it
        // is a divergence too, even where the op's outputs stay close (a
        // parameter's bias moved by 1e-3 of itself, next to activations a
        // thousand times larger): the runs differ there.
        let first_output_divergence = verdict.iter().position(|v| v.diverged());
        let first_divergence = match (first_output_divergence, &first_diverged_input) {
            (Some(o), Some((i, _))) => Some(o.min(*i)),
            (o, i) => o.or(i.as_ref().map(|x| x.0)),
        };
        let drift_source = first_diverged_input
            .as_ref()
            .filter(|(i, _)| Some(*i) == first_divergence)
            .and_then(|(i, ts)| drift_source(a, b, alignment, *i, ts));
        let unmatched_upstream = first_divergence.map_or([0, 0], |k| {
            let p = alignment.pairs[k];
            // Roots are sorted by index, which is each side's call order.
            [
                alignment.only_a.partition_point(|&r| r < p.a) as u64,
                alignment.only_b.partition_point(|&r| r < p.b) as u64,
            ]
        });
        let first_introduced_outer = verdict.iter().position(|&v| v == OpVerdict::Introduced);
        let first_introduced = first_introduced_outer.map(|k| tree.deepest_introduced(&verdict, k));
        let mut top_introduced =
            introduced_leaves(&tree, &verdict, |k| introduced.of(k).amplification);
        let headline = headline(first_introduced, &top_introduced, |k| {
            introduced.of(k).excess
        });
        top_introduced.truncate(top);
        let first_unmatched_change = unmatched_change
            .filter(|ch| is_first_cause(ch, first_divergence, first_introduced_outer))
            .map(|ch| UnmatchedChange {
                b_op: changer_only_in_b(b, alignment, ch.after, b.seq(alignment.pairs[ch.pair].b)),
                ..ch
            })
            .filter(|ch| {
                ch.b_op
                    .is_none_or(|op| !in_place_with_counterpart_in_a(a, b, alignment, op))
            });
        Judgement {
            verdict,
            out_err,
            input_taint,
            tensor_counts,
            op_counts,
            dtype_differs,
            first_divergence,
            first_introduced,
            drift_source,
            unmatched_upstream,
            headline,
            top_introduced,
            first_unmatched_change,
        }
    }
}

/// Registers the aligned outputs of a judged pair that unaligned calls may
/// read (see `one_sided`).
fn register_outputs(ctx: &Ctx<'_>, cmp: &OpCmp, one_sided: &mut OneSided) {
    for tc in cmp.tensors.iter().filter(|t| t.role == Role::Output) {
        if let (Some(tb), true) = (tc.tb, tc.key != (0, 0)) {
            // The error only where an unaligned call reads the output,
            // from the rows as the measuring thread read them: this
            // thread reads no chunk of the dumps for them.
            let err = || {
                let rows = tc.ta.and_then(|ta| cmp.rows(ta, tb));
                ctx.own_relative_error_of(tc, |ta| {
                    rows.map_or_else(|| ctx.a.tensors.row(ta), |r| *r.0)
                })
            };
            one_sided.register((tc.key.1, tc.side_b), err, tc.taint);
        }
    }
}

/// The aligned producer of input `tc`, when its statistics name one.
fn find_producer(prov: &Provenance, tc: &TensorCmp) -> Option<Found> {
    if tc.key != (0, 0) {
        prov.find(tc.key)
    } else {
        None
    }
}

/// The taint of an input of pair `pair`: its producer's, when provenance
/// knows it. Unknown producer: tainted by its own error when that exceeds
/// the tolerance, unless calls only one side makes produced it from inputs
/// whose differences explain it (see `one_sided`). Values that calls only
/// in B changed on the way (see
/// [`changed_only_in_b`]) taint it by that change, and the first such input
/// goes to `first_change`. Rounded as stored for reports (f32), so that
/// they recompute the very same verdicts.
fn input_taint_from(
    ctx: &Ctx<'_>,
    found: Option<Found>,
    one_sided: &OneSided,
    tc: &TensorCmp,
    pair: usize,
    first_change: Option<&Cell<Option<UnmatchedChange>>>,
) -> Taint {
    let mut own = found.is_none();
    let mut t = found.map_or(
        if tc.verdict == TensorVerdict::Diverged {
            tc.rel_err
        } else {
            0.0
        },
        |f| f.taint,
    );
    if found.is_none() && t > 0.0 {
        if let Some(fed_taint) = explained_by_one_sided(ctx, one_sided, tc) {
            // Explained by what the calls were fed: it carries their taint,
            // not its own error.
            t = fed_taint;
            own = false;
        }
    }
    if let Some(ch) = changed_only_in_b(ctx, found, tc, pair) {
        if ch.rel_change > t {
            own = false;
        }
        t = t.max(ch.rel_change);
        if let Some(first) = first_change.filter(|f| f.get().is_none()) {
            first.set(Some(ch));
        }
    }
    Taint {
        size: if t > 0.0 {
            (t as f32).max(f32::MIN_POSITIVE) as f64
        } else {
            0.0
        },
        own: own && t > 0.0,
    }
}

/// When calls only one side makes produced input `tc` from inputs whose
/// differences explain its own (see `one_sided`): the taint of those
/// inputs. Explained means within the tolerance of the calls' longest
/// reduction plus `min_amplification` times what they were fed.
fn explained_by_one_sided(ctx: &Ctx<'_>, one_sided: &OneSided, tc: &TensorCmp) -> Option<f64> {
    let (ta, tb) = (tc.ta?, tc.tb?);
    let fed = one_sided.fed(ctx.a, ta, ctx.b, tb)?;
    let (da, db) = (ctx.a.dtype(ta), ctx.b.dtype(tb));
    let dt = if db.unit_roundoff > da.unit_roundoff {
        db
    } else {
        da
    };
    let tol = tc
        .tolerance
        .max(ctx.tol.rtol(dt.is_float().then_some(dt), fed.k));
    let allowed = tol + ctx.tol.min_amplification * fed.error.unwrap_or(0.0);
    (tc.rel_err <= allowed).then_some(fed.taint)
}

impl Judged {
    /// Keeps what reports need of judged pair `k`, and registers the taint
    /// of its outputs for their consumers.
    fn record(&mut self, k: usize, cmp: &OpCmp, prov: &mut Provenance) {
        // Only where some output was compared and differs: an op whose
        // outputs are unmeasured or equal on both sides computed nothing
        // from the input's difference. The input may be memory that holds
        // no values yet, read by a collective's wrapper or its wait before
        // the collective filled it (FSDP's all-gather buffer).
        let output_compared = cmp.tensors.iter().any(|t| {
            t.role == Role::Output
                && matches!(
                    t.verdict,
                    TensorVerdict::Close | TensorVerdict::Diverged | TensorVerdict::NanMismatch
                )
        });
        if self.first_diverged_input.is_none() && output_compared && k >= self.judged_from {
            let own: Vec<u32> = cmp
                .tensors
                .iter()
                .filter(|t| t.role != Role::Output && t.taint_own)
                .filter(|t| {
                    matches!(
                        t.verdict,
                        TensorVerdict::Diverged | TensorVerdict::NanMismatch
                    )
                })
                .filter_map(|t| t.ta)
                .collect();
            if !own.is_empty() {
                self.first_diverged_input = Some((k, own));
            }
        }
        for tc in &cmp.tensors {
            self.tensor_counts[tc.verdict as usize] += 1;
            self.dtype_differs += tc.dtype_differs as u64;
            let Some(x) = tc.ta else { continue };
            if tc.role == Role::Output {
                if tc.key != (0, 0) {
                    // What the context made was judged with its own step
                    // (a divergence there was said then): it passes on no
                    // taint, as its inputs from before it carried none.
                    let taint = if k < self.judged_from { 0.0 } else { tc.taint };
                    prov.register(tc.key, taint, tc.tb, k as u32);
                }
            } else {
                self.input_taint.set(x, tc.taint as f32, tc.taint_own);
            }
        }
        let v = cmp.verdict.unwrap_or(OpVerdict::Ok);
        self.verdict[k] = v;
        self.verified[k] = outputs_verified(v, cmp);
        self.out_err[k] = cmp.out_err as f32;
        if v == OpVerdict::Introduced {
            self.introduced
                .push(k, cmp.amplification as f32, cmp.excess as f32);
        }
    }
}

/// Outputs compared and found to agree, nothing upstream diverged:
/// differences in the calls below this one are internal to it.
fn outputs_verified(v: OpVerdict, cmp: &OpCmp) -> bool {
    v == OpVerdict::Ok
        && cmp.diverged_in_err == 0.0
        && cmp.tensors.iter().any(|t| {
            t.role == Role::Output
                && matches!(
                    t.verdict,
                    TensorVerdict::Close | TensorVerdict::StatsEqual | TensorVerdict::Identical
                )
        })
}

/// Pair index of each op of A, or `NONE`.
fn pair_of_each_op(pairs: &[Pair], len_a: usize) -> Vec<u32> {
    let mut pair_of_a = vec![NONE; len_a];
    for (k, p) in pairs.iter().enumerate() {
        pair_of_a[p.a as usize] = k as u32;
    }
    pair_of_a
}

/// A's call tree seen through the pairs: walks up and down it by pair.
struct PairTree<'a> {
    a: &'a Dump,
    pairs: &'a [Pair],
    pair_of_a: &'a [u32],
}

impl PairTree<'_> {
    /// The pairs of the ancestors of pair `k` (those that have one),
    /// innermost first.
    fn ancestor_pairs(&self, k: usize) -> impl Iterator<Item = usize> + '_ {
        let a = self.a;
        std::iter::successors(a.parent_of(self.pairs[k].a), move |&i| a.parent_of(i))
            .map(|i| self.pair_of_a[i as usize])
            .filter(|&pk| pk != NONE)
            .map(|pk| pk as usize)
    }

    /// From an introduced pair, goes down to the first introduced
    /// descendant (in seq order, at any depth below), repeatedly: `seq` is
    /// entry order, so the parent `linear` is seen before the `addmm` that
    /// really went wrong.
    fn deepest_introduced(&self, verdict: &[OpVerdict], start: usize) -> usize {
        let mut cur = start;
        while let Some(k) = self.first_introduced_below(verdict, cur) {
            cur = k;
        }
        cur
    }

    /// Preorder walk of A's subtree below pair `k`, children in seq order,
    /// to the first introduced pair.
    fn first_introduced_below(&self, verdict: &[OpVerdict], k: usize) -> Option<usize> {
        let a = self.a;
        let mut stack: Vec<u32> = a.children_of(self.pairs[k].a).rev().collect();
        while let Some(i) = stack.pop() {
            let pk = self.pair_of_a[i as usize];
            if pk != NONE && verdict[pk as usize] == OpVerdict::Introduced {
                return Some(pk as usize);
            }
            stack.extend(a.children_of(i).rev());
        }
        None
    }
}

/// A divergence below an op whose outputs agree (and whose inputs are
/// clean) stays inside that op: absorbed, unless it travels on. Its
/// enclosing op's outputs are one consumer; a later op may read the inner
/// op's outputs too (a backward kernel reads the forward's `_log_softmax`
/// output that the loss around it averaged away). When a tainted output of
/// it reaches, through any chain of consumers (`consumed_tainted`), an op
/// that diverged and is not itself absorbed, the difference did not
/// vanish: the verdict stays (`introduced` where its inputs agreed), for
/// otherwise the divergence downstream has no op to blame.
fn mark_absorbed(
    tree: &PairTree<'_>,
    verified: &[bool],
    consumed_tainted: &[(u32, u32)],
    verdict: &mut [OpVerdict],
) {
    let inside_verified: Vec<bool> = (0..verdict.len())
        .map(|k| verdict[k].diverged() && tree.ancestor_pairs(k).any(|pk| verified[pk]))
        .collect();
    let travels = divergence_travels(verdict, &inside_verified, consumed_tainted);
    for (k, v) in verdict.iter_mut().enumerate() {
        if inside_verified[k] && !travels[k] {
            *v = OpVerdict::Absorbed;
        }
    }
}

/// Per pair: whether a tainted output of it reaches a divergence that is
/// not inside a verified op, through consumers (each consumer comes after
/// its producer in A's call order, so one backward pass decides).
fn divergence_travels(
    verdict: &[OpVerdict],
    inside_verified: &[bool],
    consumed_tainted: &[(u32, u32)],
) -> Vec<bool> {
    let n = verdict.len();
    // Consumers of each producer, producers in decreasing order.
    let mut edges: Vec<(u32, u32)> = consumed_tainted
        .iter()
        .filter(|&&(c, p)| c > p && (c as usize) < n)
        .map(|&(c, p)| (p, c))
        .collect();
    edges.sort_unstable_by(|x, y| y.cmp(x));
    // reaches[k]: k's own divergence counts, or a consumer's reaches.
    let mut reaches: Vec<bool> = (0..n)
        .map(|k| verdict[k].diverged() && !inside_verified[k])
        .collect();
    let mut travels = vec![false; n];
    for &(p, c) in &edges {
        if reaches[c as usize] {
            travels[p as usize] = true;
            reaches[p as usize] = true;
        }
    }
    travels
}

/// Introduced ops without an introduced descendant, the largest
/// amplifications first. Introduced ops with an introduced descendant are
/// the parents of the real culprit (`linear` over `addmm`): left out.
fn introduced_leaves(
    tree: &PairTree<'_>,
    verdict: &[OpVerdict],
    amplification: impl Fn(usize) -> f32,
) -> Vec<usize> {
    let introduced = |k: &usize| verdict[*k] == OpVerdict::Introduced;
    let mut has_introduced_below = vec![false; verdict.len()];
    for k in (0..verdict.len()).filter(introduced) {
        for pk in tree.ancestor_pairs(k) {
            // Marked already: so are the ancestors above it.
            if has_introduced_below[pk] {
                break;
            }
            has_introduced_below[pk] = true;
        }
    }
    let mut top_list: Vec<usize> = (0..verdict.len())
        .filter(introduced)
        .filter(|&k| !has_introduced_below[k])
        .collect();
    top_list.sort_by(|&x, &y| {
        amplification(y)
            .total_cmp(&amplification(x))
            .then(x.cmp(&y))
    });
    top_list
}

/// A change made by calls only in B is the headline when it comes first:
/// no aligned op introduced an error before its consumer, and an aligned
/// output diverged at or after it.
fn is_first_cause(
    ch: &UnmatchedChange,
    first_divergence: Option<usize>,
    first_introduced_outer: Option<usize>,
) -> bool {
    first_divergence.is_some_and(|d| d >= ch.pair)
        && first_introduced_outer.is_none_or(|k| ch.pair < k)
}

/// B fed an aligned op an input that its aligned producer did not make (A's
/// side names the producer, the pair does not): calls only in B came
/// between. When B's tensor as consumed differs from B's tensor as
/// produced by more than the consumer's tolerance, those calls changed its
/// values while A passed the tensor on unchanged: a divergence that they
/// introduced (a copy to another device and back changes nothing), when
/// B's tensor as consumed also differs from A's beyond that tolerance.
fn changed_only_in_b(
    ctx: &Ctx<'_>,
    found: Option<Found>,
    tc: &TensorCmp,
    pair: usize,
) -> Option<UnmatchedChange> {
    let f = found?;
    let after = tc.tb?;
    if f.by_pair || f.b_produced == NONE || tc.verdict.is_structural() {
        return None;
    }
    // A cast only B makes (a bfloat16 model's RMSNorm computes in float32
    // and casts back) changes the values by its dtype's rounding, and the
    // two sides' dtypes already differ there: never an introducer by itself.
    // Beyond rounding, the statistics matched other tensors than the cast's.
    if ctx.b.dtype(f.b_produced).canonical() != ctx.b.dtype(after).canonical() {
        return None;
    }
    // B fed the consumer what A fed it, within the consumer's tolerance:
    // nothing on the way introduced a divergence, whatever B's tensor as
    // produced was. Both can drift from A's by rounding accumulated over
    // the run, each within its tolerance and apart by more; and A's
    // statistics alone may name a tensor that is not B's producer (in a
    // training run, the last step's gradient after a norm, where the loss's
    // backward, not in the dump, made this step's: 1.1e-6 apart at 10M
    // synthetic op calls, each within 7e-7 of A's).
    if tc.rel_err <= tc.tolerance {
        return None;
    }
    let rel_change = ctx.relative_change(ctx.b, f.b_produced, after);
    (rel_change > tc.tolerance).then_some(UnmatchedChange {
        pair,
        b_op: None,
        before: f.b_produced,
        after,
        rel_change,
        tolerance: tc.tolerance,
    })
}

/// The op only in B that made tensor `t` of B: the last unmatched call
/// before `before_seq` with an output of the same statistics, the outermost
/// when calls nest (`to` over `_to_copy`).
fn changer_only_in_b(b: &Dump, al: &Alignment, t: u32, before_seq: i64) -> Option<u32> {
    let h = side_hash(b, t);
    let mut best: Option<u32> = None;
    for i in 0..b.len() as u32 {
        if b.seq(i) >= before_seq {
            break;
        }
        if al.b_match[i as usize] != NONE {
            continue;
        }
        let makes_it = b.tensors_of(i).any(|x| {
            b.tensors.role(x) == Role::Output && b.tensors.has_values(x) && side_hash(b, x) == h
        });
        if makes_it {
            // A later maker wins, unless it is inside the one found.
            let inside = best.is_some_and(|o| b.ancestors(i).contains(&o));
            if !inside {
                best = Some(i);
            }
        }
    }
    best
}

/// Whether call `op` of B (a call only in B) updates a tensor in place
/// (`add_`: gradient accumulation, an optimizer's update) and A makes an
/// unaligned call of the same op in the same step and phase. In-place
/// calls exist to change their tensor; when A makes its own, B's is not a
/// call A lacks but one the alignment left unpaired (a backward pass
/// accumulates gradients in an order that differs by device), and blaming
/// it would name a correct op "introduced, only in B".
fn in_place_with_counterpart_in_a(a: &Dump, b: &Dump, al: &Alignment, op: u32) -> bool {
    let name = b.op_name(op);
    if !is_in_place(name) {
        return false;
    }
    let (step, phase) = (b.step(op), b.phase(op));
    (0..a.len() as u32).any(|i| {
        al.a_match[i as usize] == NONE
            && a.step(i) == step
            && a.phase(i) == phase
            && a.op_name(i) == name
    })
}

/// `aten::add_`: an in-place op (a dunder name such as `__iand__` is not).
fn is_in_place(op: &str) -> bool {
    let name = crate::opclass::after_last_colons(op);
    name.ends_with('_') && !name.ends_with("__")
}

fn step_range(d: &Dump) -> String {
    let s = d.steps();
    match (s.first(), s.last()) {
        (Some(f), Some(l)) if f == l => format!("step {f}"),
        (Some(f), Some(l)) => format!("steps {f}..{l}"),
        _ => "no steps".into(),
    }
}

/// The phases of the top-level calls of a dump that the filter keeps, in
/// phase order (`forward, backward`), or `none`.
fn phase_list(d: &Dump, filter: &Filter) -> String {
    use opdump_format::Phase;
    let kept = |r: u32| {
        filter.step_selected(d.step(r)) && !filter.ignores(d.op_name(r), d.overload_name(r))
    };
    let present: Vec<&str> = [Phase::Forward, Phase::Backward, Phase::Optimizer]
        .into_iter()
        .filter(|&p| d.roots.iter().any(|&r| d.phase(r) == p && kept(r)))
        .map(Phase::as_str)
        .collect();
    if present.is_empty() {
        "none".into()
    } else {
        present.join(", ")
    }
}
