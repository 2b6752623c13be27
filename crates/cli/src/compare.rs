//! `opdump compare`: read both dumps, align, measure every aligned pair, and
//! find the first divergence and the first introduced divergence.

use std::path::PathBuf;

use crate::align::{align, Alignment, Filter};
use crate::dump::{Dump, NONE, ROLE_OUTPUT};
use crate::error::{CliError, Result};
use crate::metrics::{Ctx, OpCmp};
use crate::progress::Progress;
use crate::provenance::Provenance;
use crate::read::{load, scan, DumpIndex};
use crate::tolerance::Tolerances;
use crate::verdict::{OpVerdict, TensorVerdict};

pub struct CompareOptions {
    pub dump_a: PathBuf,
    pub dump_b: PathBuf,
    pub rank: Option<u32>,
    pub filter: Filter,
    pub tol: Tolerances,
    pub top: usize,
    /// Compare even when the dumps look like different programs.
    pub force: bool,
}

/// Everything a report needs.
pub struct Compared {
    pub a: Dump,
    pub b: Dump,
    pub alignment: Alignment,
    pub tol: Tolerances,
    /// Per pair (index into `alignment.pairs`).
    pub verdict: Vec<u8>,
    pub out_err: Vec<f32>,
    pub amplification: Vec<f32>,
    /// Pair index of each op of A, or `NONE`.
    pub pair_of_a: Vec<u32>,
    /// Per tensor of A: the taint an input had (see `provenance`), so a
    /// report recomputes the same verdicts.
    pub input_taint: Vec<f32>,
    pub tensor_counts: [u64; TensorVerdict::ALL.len()],
    pub op_counts: [u64; OpVerdict::ALL.len()],
    pub tensor_pairs: u64,
    pub dtype_differs: u64,
    pub first_divergence: Option<usize>,
    /// The first introduced op in seq order (maybe a parent like `linear`).
    pub first_introduced_outer: Option<usize>,
    /// The deepest introduced op inside that subtree: the headline.
    pub first_introduced: Option<usize>,
    /// Introduced ops without an introduced descendant, by amplification.
    pub top_introduced: Vec<usize>,
    /// Values changed by calls only in B before an aligned op consumed them,
    /// when that is the first cause of the divergence (see
    /// `changed_only_in_b`).
    pub first_unmatched_change: Option<UnmatchedChange>,
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
    pub after: u32,
    /// Lower bound on the relative change, and the consumer's tolerance.
    pub rel_change: f64,
    pub tolerance: f64,
}

impl Compared {
    pub fn ctx(&self) -> Ctx<'_> {
        Ctx::new(&self.a, &self.b, &self.tol)
    }

    pub fn op_verdict(&self, pair: usize) -> OpVerdict {
        OpVerdict::from_code(self.verdict[pair])
    }

    /// Full comparison of one pair, for reports: the same verdicts as the
    /// main pass, with the inputs' divergence it recorded.
    pub fn detail(&self, pair: usize) -> OpCmp {
        let mut cmp = OpCmp::default();
        self.detail_into(pair, &self.ctx(), &mut cmp);
        cmp
    }

    pub fn detail_into(&self, pair: usize, ctx: &Ctx<'_>, cmp: &mut OpCmp) {
        let p = self.alignment.pairs[pair];
        ctx.measure(p.a, p.b, cmp);
        ctx.judge(cmp, |tc| {
            tc.ta.map_or(0.0, |x| self.input_taint[x as usize] as f64)
        });
    }

    pub fn divergence_found(&self) -> bool {
        self.first_divergence.is_some()
    }
}

/// Picks the rank to compare.
fn choose_rank(
    ia: &DumpIndex,
    ib: &DumpIndex,
    want: Option<u32>,
    notes: &mut Vec<String>,
) -> Result<(u32, u32)> {
    let (ra, rb) = (ia.ranks(), ib.ranks());
    let list = |s: &std::collections::BTreeSet<u32>| {
        s.iter()
            .map(|r| r.to_string())
            .collect::<Vec<_>>()
            .join(", ")
    };
    if let Some(r) = want {
        for (idx, ranks) in [(ia, &ra), (ib, &rb)] {
            if !ranks.contains(&r) {
                return Err(CliError::new(format!(
                    "{}: no rank {r} (ranks present: {})",
                    idx.dir.display(),
                    list(ranks)
                )));
            }
        }
        return Ok((r, r));
    }
    let common: Vec<u32> = ra.intersection(&rb).copied().collect();
    if let Some(&r) = common.first() {
        if common.len() > 1 {
            notes.push(format!(
                "comparing rank {r}; both dumps also have ranks {} (choose with --rank)",
                {
                    common[1..]
                        .iter()
                        .map(|r| r.to_string())
                        .collect::<Vec<_>>()
                        .join(", ")
                }
            ));
        }
        return Ok((r, r));
    }
    if ra.len() == 1 && rb.len() == 1 {
        let (x, y) = (
            *ra.iter().next().unwrap_or(&0),
            *rb.iter().next().unwrap_or(&0),
        );
        notes.push(format!("comparing rank {x} of A with rank {y} of B"));
        return Ok((x, y));
    }
    Err(CliError::new(format!(
        "the dumps share no rank (A has {}, B has {}); choose one with --rank",
        list(&ra),
        list(&rb)
    )))
}

/// With `OPDUMP_TIMINGS=1`, each phase's wall time goes to stderr (for
/// benchmarking; not part of the interface).
pub fn timing(label: &str, since: std::time::Instant) {
    if std::env::var_os("OPDUMP_TIMINGS").is_some_and(|v| v == "1") {
        eprintln!(
            "opdump: timing: {label}: {:.3}s",
            since.elapsed().as_secs_f64()
        );
    }
}

pub fn run(opts: CompareOptions, progress: &Progress) -> Result<Compared> {
    let t0 = std::time::Instant::now();
    let mut notes = Vec::new();
    progress.phase("reading footers");
    let ia = scan(&opts.dump_a)?;
    let ib = scan(&opts.dump_b)?;
    let (rank_a, rank_b) = choose_rank(&ia, &ib, opts.rank, &mut notes)?;
    let (a, b) = std::thread::scope(|s| {
        let ha = s.spawn(|| load(&ia, rank_a, progress, "A"));
        let b = load(&ib, rank_b, progress, "B");
        (ha.join(), b)
    });
    let a = match a {
        Ok(r) => r?,
        Err(e) => std::panic::resume_unwind(e),
    };
    let b = b?;
    timing("read", t0);
    for d in [&a, &b] {
        if d.skipped_other_pids > 0 {
            notes.push(format!(
                "{}: left out {} op calls of other processes of rank {} (kept pid {})",
                d.path.display(),
                d.skipped_other_pids,
                d.rank,
                d.pid.map_or("?".into(), |p| p.to_string())
            ));
        }
    }
    compare_dumps(
        a,
        b,
        opts.filter,
        opts.tol,
        opts.top,
        opts.force,
        notes,
        progress,
    )
}

#[allow(clippy::too_many_arguments)]
pub fn compare_dumps(
    a: Dump,
    b: Dump,
    filter: Filter,
    tol: Tolerances,
    top: usize,
    force: bool,
    mut notes: Vec<String>,
    progress: &Progress,
) -> Result<Compared> {
    for (d, name) in [(&a, "A"), (&b, "B")] {
        if d.is_empty() {
            return Err(CliError::new(format!(
                "{}: dump {name} holds no op calls",
                d.path.display()
            )));
        }
        if !filter.steps.is_empty()
            && !d
                .roots
                .iter()
                .any(|&r| filter.step_selected(d.step[r as usize]))
        {
            return Err(CliError::new(format!(
                "{}: no op calls in the selected steps (the dump has {})",
                d.path.display(),
                step_range(d)
            )));
        }
    }
    let t0 = std::time::Instant::now();
    let alignment = align(&a, &b, &filter, progress);
    timing("align", t0);
    let t0 = std::time::Instant::now();
    let (ca, cb, ex) = (
        alignment.common_roots_a,
        alignment.common_roots_b,
        alignment.roots_matched_exact,
    );
    if ca.iter().sum::<u64>() == 0 || cb.iter().sum::<u64>() == 0 {
        return Err(CliError::new(
            "the dumps have no phase (forward, backward, optimizer) in common; are they runs of the same program?",
        ));
    }
    if alignment.steps_ignored {
        notes.push(format!(
            "the dumps share no step number (A: {}, B: {}): aligned ignoring steps",
            step_range(&a),
            step_range(&b)
        ));
    }
    // Same program? Judged on the model's calls (forward and backward):
    // optimizers legitimately differ by device (a per-parameter loop on one,
    // `_foreach_` calls on the other).
    let model = |x: [u64; 3]| x[0] + x[1];
    let (matched, larger) = if model(ca) > 0 && model(cb) > 0 {
        (model(ex), model(ca).max(model(cb)))
    } else {
        (ex.iter().sum(), ca.iter().sum::<u64>().max(cb.iter().sum()))
    };
    if matched * 2 < larger {
        let msg = format!(
            "the dumps look like different programs: only {matched} of {larger} top-level op calls align (use --force to compare anyway)"
        );
        if !force {
            return Err(CliError::new(msg));
        }
        notes.push(msg);
    }
    if alignment.diff_stats.regions_given_up > 0 {
        notes.push(format!(
            "alignment gave up on {} region(s) without any common anchor ({} op calls left unmatched)",
            alignment.diff_stats.regions_given_up, alignment.diff_stats.tokens_given_up
        ));
    }

    let n = alignment.pairs.len();
    let mut verdict = vec![0u8; n];
    let mut out_err = vec![0f32; n];
    let mut amplification = vec![0f32; n];
    let mut tensor_counts = [0u64; TensorVerdict::ALL.len()];
    let mut dtype_differs = 0u64;
    let mut input_taint = vec![0f32; a.tensors.len()];
    let mut verified = vec![false; n];
    let unmatched: std::cell::Cell<Option<UnmatchedChange>> = std::cell::Cell::new(None);
    {
        // Judged in A's call order, so that every input's producer comes
        // first; measuring needs no order and runs ahead on a second thread.
        let ctx = Ctx::new(&a, &b, &tol);
        let mut prov = Provenance::with_capacity(a.tensors.len() / 2);
        let unmatched_first = &unmatched;
        let pairs = &alignment.pairs;
        std::thread::scope(|s| {
            let (tx, rx) = std::sync::mpsc::sync_channel::<Vec<OpCmp>>(8);
            // Judged batches go back to be refilled: no allocation per pair.
            let (back_tx, back_rx) = std::sync::mpsc::channel::<Vec<OpCmp>>();
            let ctx_m = &ctx;
            s.spawn(move || {
                for chunk in pairs.chunks(4096) {
                    let mut batch = back_rx.try_recv().unwrap_or_default();
                    batch.resize_with(chunk.len(), OpCmp::default);
                    for (p, cmp) in chunk.iter().zip(batch.iter_mut()) {
                        ctx_m.measure(p.a, p.b, cmp);
                    }
                    if tx.send(batch).is_err() {
                        return;
                    }
                }
            });
            let mut k = 0usize;
            for mut batch in rx {
                for cmp in batch.iter_mut() {
                    let pair_k = k;
                    ctx.judge(cmp, |tc| {
                        let found = if tc.key != (0, 0) {
                            prov.find(tc.key)
                        } else {
                            None
                        };
                        // Unknown producer: tainted by its own error when
                        // that exceeds the tolerance.
                        let mut t = found.map_or(
                            if tc.verdict == TensorVerdict::Diverged {
                                tc.rel_err
                            } else {
                                0.0
                            },
                            |f| f.taint,
                        );
                        if let Some(ch) = changed_only_in_b(&ctx, found, tc, pair_k) {
                            t = t.max(ch.rel_change);
                            if unmatched_first.get().is_none() {
                                unmatched_first.set(Some(ch));
                            }
                        }
                        // As stored for reports (f32), so they recompute
                        // the very same verdicts.
                        if t > 0.0 {
                            (t as f32).max(f32::MIN_POSITIVE) as f64
                        } else {
                            0.0
                        }
                    });
                    for tc in &cmp.tensors {
                        tensor_counts[tc.verdict as usize] += 1;
                        dtype_differs += tc.dtype_differs as u64;
                        let Some(x) = tc.ta else { continue };
                        if tc.role == ROLE_OUTPUT {
                            if tc.key != (0, 0) {
                                prov.register(tc.key, tc.taint, tc.tb);
                            }
                        } else {
                            input_taint[x as usize] = tc.taint as f32;
                        }
                    }
                    let v = cmp.verdict.unwrap_or(OpVerdict::Ok);
                    verdict[k] = v.code();
                    // Outputs compared and found to agree, nothing upstream
                    // diverged: differences in the calls below this one are
                    // internal to it.
                    verified[k] = v == OpVerdict::Ok
                        && cmp.diverged_in_err == 0.0
                        && cmp.tensors.iter().any(|t| {
                            t.role == ROLE_OUTPUT
                                && matches!(
                                    t.verdict,
                                    TensorVerdict::Close
                                        | TensorVerdict::StatsEqual
                                        | TensorVerdict::Identical
                                )
                        });
                    out_err[k] = cmp.out_err as f32;
                    amplification[k] = cmp.amplification as f32;
                    if k % 65536 == 0 {
                        progress.update(|| format!("measuring: {k}/{n} op pairs"));
                    }
                    k += 1;
                }
                batch.clear();
                let _ = back_tx.send(batch);
            }
        });
    }
    let mut pair_of_a = vec![NONE; a.len()];
    for (k, p) in alignment.pairs.iter().enumerate() {
        pair_of_a[p.a as usize] = k as u32;
    }
    // A divergence below an op whose outputs agree (and whose inputs are
    // clean) stays inside that op: absorbed.
    for (v, p) in verdict.iter_mut().zip(&alignment.pairs) {
        if OpVerdict::from_code(*v).diverged() {
            let mut cur = a.parent[p.a as usize];
            while cur != NONE {
                let pk = pair_of_a[cur as usize];
                if pk != NONE && verified[pk as usize] {
                    *v = OpVerdict::Absorbed.code();
                    break;
                }
                cur = a.parent[cur as usize];
            }
        }
    }
    let mut op_counts = [0u64; OpVerdict::ALL.len()];
    for &v in &verdict {
        op_counts[v as usize] += 1;
    }
    let v = |k: usize| OpVerdict::from_code(verdict[k]);
    // Pairs are sorted by A's index, which is seq order.
    let first_divergence = (0..n).find(|&k| v(k).diverged());
    let first_introduced_outer = (0..n).find(|&k| v(k) == OpVerdict::Introduced);
    let first_introduced =
        first_introduced_outer.map(|k| deepest_introduced(&a, &alignment, &pair_of_a, &verdict, k));
    // A change made by calls only in B is the headline when it comes first:
    // no aligned op introduced an error before its consumer, and an aligned
    // output diverged at or after it.
    let first_unmatched_change = unmatched.get().filter(|ch| {
        first_divergence.is_some_and(|d| d >= ch.pair)
            && first_introduced_outer.is_none_or(|k| ch.pair < k)
    });
    let first_unmatched_change = first_unmatched_change.map(|mut ch| {
        ch.b_op = changer_only_in_b(
            &b,
            &alignment,
            ch.after,
            b.seq[alignment.pairs[ch.pair].b as usize],
        );
        ch
    });

    // Introduced ops with an introduced descendant are the parents of the
    // real culprit (`linear` over `addmm`): leave them out of the top list.
    let mut has_introduced_below = vec![false; n];
    for k in 0..n {
        if v(k) == OpVerdict::Introduced {
            let mut cur = a.parent[alignment.pairs[k].a as usize];
            while cur != NONE {
                let pk = pair_of_a[cur as usize];
                if pk != NONE {
                    if has_introduced_below[pk as usize] {
                        break;
                    }
                    has_introduced_below[pk as usize] = true;
                }
                cur = a.parent[cur as usize];
            }
        }
    }
    let mut top_introduced: Vec<usize> = (0..n)
        .filter(|&k| v(k) == OpVerdict::Introduced && !has_introduced_below[k])
        .collect();
    top_introduced.sort_by(|&x, &y| {
        amplification[y]
            .total_cmp(&amplification[x])
            .then(x.cmp(&y))
    });
    top_introduced.truncate(top);

    progress.finish();
    timing("measure", t0);
    let tensor_pairs = tensor_counts.iter().sum();
    Ok(Compared {
        a,
        b,
        alignment,
        tol,
        verdict,
        out_err,
        amplification,
        pair_of_a,
        input_taint,
        tensor_counts,
        op_counts,
        tensor_pairs,
        dtype_differs,
        first_divergence,
        first_introduced_outer,
        first_introduced,
        top_introduced,
        first_unmatched_change,
        notes,
    })
}

/// B fed an aligned op an input that its aligned producer did not make (A's
/// side names the producer, the pair does not): calls only in B came
/// between. When B's tensor as consumed differs from B's tensor as
/// produced by more than the consumer's tolerance, those calls changed its
/// values while A passed the tensor on unchanged: a divergence that they
/// introduced (a copy to another device and back changes nothing).
fn changed_only_in_b(
    ctx: &Ctx<'_>,
    found: Option<crate::provenance::Found>,
    tc: &crate::metrics::TensorCmp,
    pair: usize,
) -> Option<UnmatchedChange> {
    let f = found?;
    let after = tc.tb?;
    if f.by_pair || f.b_produced == NONE || tc.verdict.is_structural() {
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
    let h = crate::provenance::side_hash(b, t);
    let mut best: Option<u32> = None;
    for i in 0..b.len() as u32 {
        if b.seq[i as usize] >= before_seq {
            break;
        }
        if al.b_match[i as usize] != NONE {
            continue;
        }
        let makes_it = b.tensors_of(i).any(|x| {
            b.tensors.role[x as usize] == ROLE_OUTPUT
                && b.tensors.has_values(x)
                && crate::provenance::side_hash(b, x) == h
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

fn step_range(d: &Dump) -> String {
    let s = d.steps();
    match (s.first(), s.last()) {
        (Some(f), Some(l)) if f == l => format!("step {f}"),
        (Some(f), Some(l)) => format!("steps {f}..{l}"),
        _ => "no steps".into(),
    }
}

/// From an introduced pair, goes down to the first introduced descendant
/// (in seq order, at any depth below), repeatedly: `seq` is entry order, so
/// the parent `linear` is seen before the `addmm` that really went wrong.
fn deepest_introduced(
    a: &Dump,
    al: &Alignment,
    pair_of_a: &[u32],
    verdict: &[u8],
    start: usize,
) -> usize {
    let mut cur = start;
    loop {
        let mut found = None;
        // Preorder walk of A's subtree below `cur`, children in seq order.
        let mut stack: Vec<u32> = a
            .children_of(al.pairs[cur].a)
            .iter()
            .rev()
            .copied()
            .collect();
        while let Some(i) = stack.pop() {
            let pk = pair_of_a[i as usize];
            if pk != NONE && OpVerdict::from_code(verdict[pk as usize]) == OpVerdict::Introduced {
                found = Some(pk as usize);
                break;
            }
            stack.extend(a.children_of(i).iter().rev());
        }
        match found {
            Some(k) => cur = k,
            None => return cur,
        }
    }
}
