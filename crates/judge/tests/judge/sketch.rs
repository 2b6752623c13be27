//! The error sketch and the fingerprint: the sketch estimator
//! (`opdump_judge::sketch`) on its own, the relative L2 error two sketches
//! estimate against the true error; then both in the verdicts.

use opdump_format::Role;
use opdump_judge::compare::Compared;
use opdump_judge::sketch::{estimate, sketch};
use opdump_judge::{OpVerdict, Outcome, TensorVerdict};
use opdump_testkit::synth::DumpWriter;
use opdump_testkit::synth_chain::{chain_records, tensor_of, uniform, Chain, Change};

use crate::common::*;

/// Float32-like data and a difference of a chosen relative size, spread
/// over every element: the estimate from K = 16 projections is within
/// +-50% of the true relative L2 error in at least 99% of the trials, and
/// always for tensors of at most K elements (exact there).
#[test]
fn the_estimate_is_within_50_percent_of_the_true_error() {
    let k = 16;
    let sizes: [(usize, u32); 9] = [
        (1, 200),
        (5, 200),
        (16, 200),
        (17, 200),
        (100, 200),
        (1_000, 200),
        (10_000, 60),
        (100_000, 20),
        (1_000_000, 5),
    ];
    let (mut trials, mut passed) = (0u32, 0u32);
    for (n, reps) in sizes {
        for (e, rel) in [1e-4, 1e-3, 1e-2, 1e-1].into_iter().enumerate() {
            for t in 0..reps {
                let seed = (n as u32).wrapping_mul(7919) ^ (e as u32) << 20 ^ t << 8;
                let a: Vec<f32> = (0..n as u64)
                    .map(|i| (uniform(i, seed) * 3.0) as f32)
                    .collect();
                // Noise of relative size `rel` (uniform: rms 1/sqrt(3)),
                // then rounded to float32.
                let b: Vec<f32> = a
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| {
                        let u = uniform(i as u64, !seed) * 3f64.sqrt();
                        (f64::from(x) * (1.0 + rel * u)) as f32
                    })
                    .collect();
                let fa: Vec<f64> = a.iter().map(|&x| f64::from(x)).collect();
                let fb: Vec<f64> = b.iter().map(|&x| f64::from(x)).collect();
                let norm = fa.iter().map(|x| x * x).sum::<f64>().sqrt();
                let truth = fa
                    .iter()
                    .zip(&fb)
                    .map(|(x, y)| (x - y) * (x - y))
                    .sum::<f64>()
                    .sqrt();
                if truth == 0.0 {
                    continue;
                }
                let est = estimate(&sketch(&fa, k), &sketch(&fb, k)).unwrap();
                let ok = (est / norm - truth / norm).abs() <= 0.5 * truth / norm;
                if n <= k {
                    assert!(
                        (est - truth).abs() <= 1e-9 * truth,
                        "n {n} rel {rel}: {est} vs {truth}"
                    );
                }
                trials += 1;
                passed += ok as u32;
            }
        }
    }
    let fraction = f64::from(passed) / f64::from(trials);
    assert!(trials > 4000, "{trials}");
    assert!(fraction >= 0.99, "{passed} of {trials} within 50%");
}

// ---------------------------------------------------------------------------
// The fingerprint and the sketch in the verdicts, on synthetic dumps whose
// every tensor holds real float32 values (`synth_chain`): what the
// statistics cannot see (values moved, zero-mean noise) is named at the op
// that made it, rounding is not, and equal fingerprints prove identity.
// ---------------------------------------------------------------------------

/// 3 layers of (mul, tanh, roll, add) over 65,536 values: relative noise of
/// 1e-4 moves the statistics by less than float32 rounding there.
fn chain(fault: Option<(usize, Change)>, sketch_k: Option<usize>) -> Chain {
    Chain {
        layers: 3,
        numel: 1 << 16,
        rounding: 1e-7,
        fault,
        sketch_k,
    }
}

/// The op the fault is planted in: layer 1's tanh.
const FAULTED: usize = 5;

/// Both sides of `c` compared, and the seq of each op in call order.
fn compare_chain(c: &Chain) -> (Compared, Vec<i64>) {
    let (a, seqs) = chain_records(c, false);
    let (b, _) = chain_records(c, true);
    (compare(dump("a", &a), dump("b", &b)), seqs)
}

#[test]
fn a_permutation_is_introduced_at_the_op_that_made_it() {
    let (c, seqs) = compare_chain(&chain(Some((FAULTED, Change::Permute)), Some(16)));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(seq_of(&c, c.headline), Some(seqs[FAULTED]));
    let fi = c.first_introduced.expect("an introduced op");
    assert_eq!(op_of(&c, Some(fi)), Some("aten::tanh"));
    let out = output_of(&c, fi);
    assert_eq!(out.verdict, TensorVerdict::Diverged);
    assert_eq!(out.evidence, "sketch");
    // Every statistic kept: the bound says nothing, the sketch about
    // sqrt(2) (a reversal of values that do not repeat).
    assert!(out.rel_l2 < 1e-5, "{}", out.rel_l2);
    let rel = out.sketch_rel.expect("a sketch estimate");
    assert!((0.7..2.8).contains(&rel), "{rel}");
    assert_eq!(out.measure.sketch_k, 16);
    // The data going into the first op: equal fingerprints.
    assert!(tensors_judged(&c, TensorVerdict::Identical) >= 1);

    // Without the columns the statistics name a later op that mixes the
    // moved values, not the one that moved them.
    let (c, _) = compare_chain(&chain(Some((FAULTED, Change::Permute)), None));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_ne!(seq_of(&c, c.headline), Some(seqs[FAULTED]));
}

#[test]
fn noise_of_1e4_is_introduced_at_its_op() {
    let fault = Some((FAULTED, Change::Noise(1e-4)));
    let (c, seqs) = compare_chain(&chain(fault, Some(16)));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(seq_of(&c, c.headline), Some(seqs[FAULTED]));
    let out = output_of(&c, c.first_introduced.unwrap());
    // The statistics' bound is within rounding; the sketch sees the noise
    // (about 1e-4 / sqrt(3) relative).
    assert!(
        out.rel_l2 <= out.tolerance,
        "{} > {}",
        out.rel_l2,
        out.tolerance
    );
    let rel = out.sketch_rel.expect("a sketch estimate");
    assert!((2.5e-5..1.2e-4).contains(&rel), "{rel}");

    // The statistics alone do not name it.
    let (c, _) = compare_chain(&chain(fault, None));
    assert_ne!(seq_of(&c, c.headline), Some(seqs[FAULTED]));
}

#[test]
fn rounding_on_every_op_is_no_divergence() {
    for k in [2, 16, 32] {
        let (c, _) = compare_chain(&chain(None, Some(k)));
        assert_eq!(
            c.outcome(),
            Outcome::Agree,
            "K = {k}: {:?}",
            op_of(&c, c.first_divergence)
        );
        assert!(!c.divergence_found());
        assert_eq!(tensors_judged(&c, TensorVerdict::Diverged), 0);
        assert_eq!(ops_judged(&c, OpVerdict::Introduced), 0);
        // The sketches are held, of the length made.
        assert_eq!(c.b.tensors.sketch(0).map(<[f64]>::len), Some(k));
    }
}

/// One `aten::mul` whose output B measured wrongly: another mean, the same
/// values (fingerprint); with `fingerprints` false, neither fingerprint nor
/// sketch (as schema 3 wrote them).
fn single(w: &mut DumpWriter, mean_off: f64, fingerprints: bool) {
    let x: Vec<f32> = (0..100).map(|i| uniform(i, 3) as f32).collect();
    let k = fingerprints.then_some(16);
    let mut out = tensor_of(Role::Output, "0", &x, k);
    out.stats.mean += mean_off;
    w.leaf(
        "aten::mul",
        "Tensor",
        "",
        vec![tensor_of(Role::Input, "self", &x, k)],
        vec![out],
    )
    .unwrap();
}

#[test]
fn equal_fingerprints_are_identical_whatever_the_statistics() {
    let c = compare_sides(|w, side_b| single(w, if side_b { 0.5 } else { 0.0 }, true));
    assert_eq!(c.outcome(), Outcome::Agree);
    assert_eq!(tensors_judged(&c, TensorVerdict::Identical), 2);
    assert_eq!(tensors_judged(&c, TensorVerdict::Diverged), 0);

    // Without fingerprints: the mean differs.
    let c = compare_sides(|w, side_b| single(w, if side_b { 0.5 } else { 0.0 }, false));
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(tensors_judged(&c, TensorVerdict::Diverged), 1);
}

/// Adam's first update of a bias of 384 values, in float32, as the
/// `foreach` optimizer makes it: `self + value * tensor1 / tensor2` with
/// `tensor1` the first moment (0.1 g) and `tensor2` the divisor |g| + ε.
/// One gradient element is 0 on both sides and two cancelled to a few ε;
/// B's gradients differ from A's by cancellation noise, an absolute error
/// of 1e-7 of their RMS: the tiny ones differ by 0.1% of themselves, and
/// their update, g / (|g| + ε), by as much. B's update is off by `fault`
/// more.
fn adam_first_update(side_b: bool, fault: f32) -> Vec<opdump_format::OpRecord> {
    let n = 384u64;
    let rms = 5.5e-4;
    let g: Vec<f32> = (0..n)
        .map(|i| {
            let noise = if side_b {
                3e-7 * rms * uniform(i, 12)
            } else {
                0.0
            };
            let value = match i {
                7 => return 0.0,
                100 => 2e-8,
                200 => -3e-8,
                _ => rms * 3f64.sqrt() * uniform(i, 13),
            };
            (value + noise) as f32
        })
        .collect();
    let p: Vec<f32> = (0..n).map(|i| (0.05 * uniform(i, 14)) as f32).collect();
    let m: Vec<f32> = g.iter().map(|&x| 0.1 * x).collect();
    let d: Vec<f32> = g.iter().map(|&x| x.abs() + 1e-8).collect();
    let out: Vec<f32> = p
        .iter()
        .zip(&m)
        .zip(&d)
        .map(|((&p, &m), &d)| {
            let step = -0.1f32 * (m / d);
            p + if side_b { step * (1.0 + fault) } else { step }
        })
        .collect();
    let k = Some(16);
    let mut w = DumpWriter::in_memory();
    w.phase = opdump_format::Phase::Optimizer;
    w.leaf(
        "aten::addcdiv_",
        "default",
        "value=-0.1",
        vec![
            tensor_of(Role::Input, "self", &p, k),
            tensor_of(Role::Input, "tensor1", &m, k),
            tensor_of(Role::Input, "tensor2", &d, k),
        ],
        vec![tensor_of(Role::Output, "0", &out, k)],
    )
    .unwrap();
    w.records()
}

#[test]
fn adam_dividing_tiny_gradients_by_epsilon_is_no_divergence() {
    let run = |fault: f32| {
        compare(
            dump("a", &adam_first_update(false, 0.0)),
            dump("b", &adam_first_update(true, fault)),
        )
    };
    let c = run(0.0);
    assert_eq!(c.outcome(), Outcome::Agree, "{:?}", op_of(&c, c.headline));
    // A fault of 1e-3 in the update is still named there.
    let c = run(1e-3);
    assert_eq!(c.outcome(), Outcome::Introduced);
    assert_eq!(op_of(&c, c.headline), Some("aten::addcdiv_"));
}
