//! The sketch estimator (`opdump_judge::sketch`) on its own: the relative
//! L2 error two sketches estimate, against the true error.

use opdump_judge::sketch::{estimate, sketch};
use opdump_testkit::synth_chain::uniform;

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
