//! The fingerprint and the error sketch of a tensor, exactly as the
//! README's "Fingerprint and sketch" defines them, and what an estimate
//! from two sketches can be trusted to say.
//!
//! `opdump` itself only reads the two columns the plugin writes; the
//! reference computation here serves the synthetic dumps of the tests
//! (`synth.rs`) and keeps the definition checkable in one place.

/// Seeds of the fingerprint's keys: one hash per block of 64 words, one
/// per place in the block.
const BLOCK_SEED: u32 = 0x243F_6A88;
const LANE_SEED: u32 = 0x85A3_08D3;
/// Spreads word and group indices over the hash's input.
const GOLDEN: u32 = 0x9E37_79B1;
/// Seeds of the element signs (`a_g`) and the group's bucket shift (`c_g`).
const SIGN_SEED: u32 = 0x1319_8A2E;
const PROJ_SEED: u32 = 0x0370_7344;

/// The sketch length the plugin writes by default (`OPDUMP_SKETCH`).
pub const DEFAULT_K: usize = 16;

/// MurmurHash3's 32-bit finaliser.
pub fn fmix32(mut h: u32) -> u32 {
    h ^= h >> 16;
    h = h.wrapping_mul(0x85eb_ca6b);
    h ^= h >> 13;
    h = h.wrapping_mul(0xc2b2_ae35);
    h ^= h >> 16;
    h
}

/// The key of word `w`: `(B[w / 64] XOR L[w mod 64]) OR 1`, odd so that a
/// change of one word always changes the fingerprint.
fn key(w: u64) -> u32 {
    let block = fmix32(
        ((w >> 6) as u32)
            .wrapping_mul(GOLDEN)
            .wrapping_add(BLOCK_SEED),
    );
    let lane = fmix32(
        ((w & 63) as u32)
            .wrapping_mul(GOLDEN)
            .wrapping_add(LANE_SEED),
    );
    (block ^ lane) | 1
}

/// The fingerprint of a tensor given as its 32-bit words in logical order
/// (one per element of 32 bits or fewer, NaNs already canonical): the sum
/// of word times key, modulo 2^64.
pub fn fingerprint_words(words: impl IntoIterator<Item = u32>) -> u64 {
    words.into_iter().enumerate().fold(0u64, |f, (w, u)| {
        f.wrapping_add(u64::from(u) * u64::from(key(w as u64)))
    })
}

/// The fingerprint of float32 values: every NaN counts as the canonical
/// quiet NaN, so two devices' NaNs agree.
pub fn fingerprint_f32(values: &[f32]) -> u64 {
    fingerprint_words(
        values
            .iter()
            .map(|v| if v.is_nan() { 0x7fc0_0000 } else { v.to_bits() }),
    )
}

/// The hashes of group `g` for a sketch of length `k`: bit `r` of `a_g`
/// is element `r`'s sign, and `c_g < k` moves the group's elements to the
/// buckets `r XOR c_g`.
fn group_hashes(g: u64, k: usize) -> (u32, u32) {
    let x = (g as u32).wrapping_mul(GOLDEN);
    (
        fmix32(x.wrapping_add(SIGN_SEED)),
        fmix32(x.wrapping_add(PROJ_SEED)) & (k as u32 - 1),
    )
}

/// An element as the sketch takes it: NaN and infinities count as 0.
fn finite(x: f64) -> f64 {
    if x.is_finite() {
        x
    } else {
        0.0
    }
}

/// The `k` projections of `values` (`k` a power of two from 2 to 32), as
/// the plugin computes them: each element, signed by bit `r` of `a_g`, is
/// added to bucket `r XOR c_g`, and one fast Walsh-Hadamard transform of
/// the buckets (`k log2 k` additions) gives the projections.
pub fn sketch(values: &[f64], k: usize) -> Vec<f64> {
    assert!(
        k.is_power_of_two() && (2..=32).contains(&k),
        "bad sketch length {k}"
    );
    let mut y = vec![0.0; k];
    for (g, chunk) in values.chunks(k).enumerate() {
        let (a, c) = group_hashes(g as u64, k);
        for (r, &x) in chunk.iter().enumerate() {
            let x = finite(x);
            y[r ^ c as usize] += if (a >> r) & 1 == 1 { -x } else { x };
        }
    }
    walsh_hadamard(&mut y);
    y
}

/// In place: `y_j <- sum_r (-1)^popcount(r & j) y_r`.
fn walsh_hadamard(y: &mut [f64]) {
    let mut h = 1;
    while h < y.len() {
        for block in y.chunks_mut(2 * h) {
            let (lo, hi) = block.split_at_mut(h);
            for (u, v) in lo.iter_mut().zip(hi.iter_mut()) {
                let (s, d) = (*u + *v, *u - *v);
                *u = s;
                *v = d;
            }
        }
        h *= 2;
    }
}

/// `s_ij` straight from the definition: the sign element `i` gets in
/// projection `j`. Only the tests' O(n·k) check uses it.
pub fn sign(i: u64, j: usize, k: usize) -> f64 {
    let (g, r) = (i / k as u64, (i % k as u64) as u32);
    let (a, c) = group_hashes(g, k);
    let parity = ((a >> r) & 1) + ((r ^ c) & j as u32).count_ones();
    if parity % 2 == 1 {
        -1.0
    } else {
        1.0
    }
}

/// The estimate of ||a - b||_2 from the two tensors' sketches:
/// ||sketch_a - sketch_b|| / sqrt(K). `None` when the lengths differ (the
/// runs used different `OPDUMP_SKETCH`) or a sketch is empty.
pub fn estimate(sa: &[f64], sb: &[f64]) -> Option<f64> {
    if sa.len() != sb.len() || sa.is_empty() {
        return None;
    }
    let sq: f64 = sa.iter().zip(sb).map(|(x, y)| (x - y) * (x - y)).sum();
    Some((sq / sa.len() as f64).sqrt())
}

/// How many standard deviations of the estimator a confident statement
/// keeps away from. At k = 16 the low end is 0.47 of the estimate: a
/// tensor whose error sits right at the tolerance is called diverged only
/// when the estimate is 2.1 times too large, P(chi2_16 > 72) = 4e-9
/// (crates/cli/README.md, "Fingerprint and sketch").
pub const CONFIDENCE_SIGMAS: f64 = 3.0;

/// The relative spread the verdict allows the estimate of a tensor of
/// `numel` elements with `k` projections: 0 when the tensor fits in one
/// group (the signs are then an orthogonal matrix and the estimate is
/// exact), else [`CONFIDENCE_SIGMAS`] times 1/sqrt(2k), the relative
/// standard deviation of the estimate (a mean of `k` squares: sqrt(2/k) in
/// the square, half that in the norm; 18% at k = 16).
pub fn spread(k: usize, numel: i64) -> f64 {
    if numel <= k as i64 {
        0.0
    } else {
        CONFIDENCE_SIGMAS / (2.0 * k as f64).sqrt()
    }
}

/// How far two sketches of the *same* values may differ by their own
/// rounding, relative to the tensor's norm: each projection is a sum of
/// `numel` terms accumulated in another order on each device, which errs
/// by about sqrt(numel)·u·||x|| (a random walk; `u` the accumulation's
/// unit roundoff), with a factor 8 of margin as the statistics' own noise
/// has.
pub fn accumulation_noise(f32_accumulate: bool, numel: i64) -> f64 {
    let u = if f32_accumulate {
        f64::from(f32::EPSILON) / 2.0
    } else {
        f64::EPSILON / 2.0
    };
    8.0 * u * (numel.max(1) as f64).sqrt()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The O(n·k) sum of the definition.
    fn naive(values: &[f64], k: usize) -> Vec<f64> {
        (0..k)
            .map(|j| {
                values
                    .iter()
                    .enumerate()
                    .map(|(i, &x)| sign(i as u64, j, k) * finite(x))
                    .sum()
            })
            .collect()
    }

    fn values(n: usize, seed: u32) -> Vec<f64> {
        (0..n as u32)
            .map(|i| f64::from(fmix32(i ^ seed)) / f64::from(u32::MAX) - 0.5)
            .collect()
    }

    #[test]
    fn fmix32_known_values() {
        // MurmurHash3's finaliser: 0 stays 0; 1 as published.
        assert_eq!(fmix32(0), 0);
        assert_eq!(fmix32(1), 0x514e_28b7);
    }

    #[test]
    fn fingerprint_by_hand() {
        // One word u at w = 0: u times key 0, the hashes of block 0 and lane 0.
        let k0 = (fmix32(BLOCK_SEED) ^ fmix32(LANE_SEED)) | 1;
        assert_eq!(fingerprint_words([3u32]), 3 * u64::from(k0));
        // Word 65 is lane 1 of block 1.
        let k65 =
            (fmix32(GOLDEN.wrapping_add(BLOCK_SEED)) ^ fmix32(GOLDEN.wrapping_add(LANE_SEED))) | 1;
        let mut words = vec![0u32; 66];
        words[65] = u32::MAX;
        assert_eq!(
            fingerprint_words(words),
            u64::from(u32::MAX) * u64::from(k65)
        );
        // Order matters; NaN payloads do not; -0 is not 0.
        assert_ne!(fingerprint_f32(&[1.0, 2.0]), fingerprint_f32(&[2.0, 1.0]));
        let odd_nan = f32::from_bits(0x7fc0_1234);
        assert_eq!(
            fingerprint_f32(&[odd_nan, 1.0]),
            fingerprint_f32(&[f32::NAN, 1.0])
        );
        assert_ne!(fingerprint_f32(&[0.0]), fingerprint_f32(&[-0.0]));
    }

    #[test]
    fn fingerprint_equals_an_independent_implementation() {
        // tests/signature_ref.py (NumPy, from the README) on the same values.
        assert_eq!(fingerprint_f32(&[1.0, 2.0]), 0x773f_c913_8d80_0000);
        assert_eq!(
            fingerprint_f32(&[1.5, -2.25, 0.0, f32::NAN, 3e38]),
            0x82d6_f24e_786c_583a
        );
    }

    #[test]
    fn sketch_of_one_element_by_hand() {
        // x_0 = 3: group 0, r = 0; s_0j = (-1)^(bit 0 of a_0 + popcount(c_0 & j)).
        let (a, c) = group_hashes(0, 4);
        let s = sketch(&[3.0], 4);
        for (j, &v) in s.iter().enumerate() {
            let p = (a & 1) + (c & j as u32).count_ones();
            assert_eq!(v, if p % 2 == 1 { -3.0 } else { 3.0 }, "j = {j}");
        }
    }

    #[test]
    fn sketch_equals_an_independent_implementation() {
        // tests/signature_ref.py (NumPy, straight from the README's sum) on
        // the same values.
        assert_eq!(
            sketch(&[1.5, -2.25, 0.0, 4.0, 0.5, 7.0], 4),
            vec![14.25, -2.75, -6.75, 4.25]
        );
    }

    #[test]
    fn fast_form_equals_the_definition() {
        for k in [2, 4, 16, 32] {
            for n in [0, 1, 3, k - 1, k, k + 1, 5 * k + 3, 1000] {
                let v = values(n, n as u32 * 31 + k as u32);
                let (fast, slow) = (sketch(&v, k), naive(&v, k));
                for (f, s) in fast.iter().zip(&slow) {
                    assert!((f - s).abs() <= 1e-12 * (1.0 + s.abs()), "k {k} n {n}");
                }
            }
        }
    }

    #[test]
    fn non_finite_values_count_as_zero() {
        let mut v = values(40, 7);
        let clean = sketch(&v, 16);
        v[3] = 0.0;
        let zeroed = sketch(&v, 16);
        v[3] = f64::NAN;
        assert_eq!(sketch(&v, 16), zeroed);
        v[3] = f64::INFINITY;
        assert_eq!(sketch(&v, 16), zeroed);
        assert_ne!(clean, zeroed);
    }

    #[test]
    fn estimate_is_exact_within_one_group() {
        // Signs of one group form an orthogonal matrix (times sqrt k).
        for n in 1..=16 {
            let a = values(n, 1);
            let b: Vec<f64> = a.iter().zip(values(n, 2)).map(|(x, d)| x + d).collect();
            let truth = a
                .iter()
                .zip(&b)
                .map(|(x, y)| (x - y) * (x - y))
                .sum::<f64>()
                .sqrt();
            let est = estimate(&sketch(&a, 16), &sketch(&b, 16)).unwrap();
            assert!(
                (est - truth).abs() <= 1e-12 * truth,
                "n {n}: {est} vs {truth}"
            );
        }
        assert_eq!(estimate(&[1.0], &[1.0, 2.0]), None);
        assert_eq!(spread(16, 16), 0.0);
        assert!((spread(16, 17) - 0.53).abs() < 0.01);
    }
}
