//! Exact error metrics of one tensor pair whose values both dumps captured
//! (`OPDUMP_CAPTURE`): what the statistics can only bound.
//!
//! A is the reference. Over the elements finite on both sides:
//! - `max_abs`: max |a - b|;
//! - `max_rel`: max |a - b| / max(|a|, tiny), with `tiny` the smallest
//!   normal number of A's dtype (so an element where A is 0 and B is not
//!   counts as huge, not infinite);
//! - `rel_l2`: ||a - b|| / ||a||; `cosine`: a.b / (||a|| ||b||) (1 when
//!   both are zero);
//! - ULP distance in the dtype, when both sides have the same float dtype:
//!   the number of representable values between a and b (0 for equal bits,
//!   1 for neighbours), as median, 99th percentile and max; for integer
//!   dtypes the difference itself;
//! - `beyond`: elements with |a - b| > tol * (|a| + rms(a)), tol being the
//!   op's relative tolerance (so that elements near zero are judged against
//!   the tensor's scale, not against themselves);
//! - the worst element (largest |a - b|) by its index, with both values.
//!
//! Elements NaN on one side only are counted in `nan_mismatch` (and in
//! `beyond`); NaN on both sides, or equal infinities, are equal.

use serde::Serialize;

use opdump_format::capture::SavedTensor;

/// The metrics of one pair. f64 fields that have no value are NaN in memory
/// and null in JSON.
#[derive(Clone, Debug, Default, PartialEq, Serialize)]
pub struct ExactMetrics {
    /// Elements compared.
    pub numel: u64,
    /// Every element bitwise equal.
    pub identical: bool,
    /// max |a - b|.
    pub max_abs: f64,
    /// ||a - b||.
    pub diff_l2: f64,
    /// max |a - b| / max(|a|, tiny).
    pub max_rel: f64,
    /// ||a - b|| / ||a||.
    pub rel_l2: f64,
    /// a.b / (||a|| ||b||).
    pub cosine: f64,
    /// None when the dtypes differ (no common ULP).
    pub ulp_median: Option<f64>,
    /// 99th percentile of the ULP distance.
    pub ulp_p99: Option<f64>,
    /// Largest ULP distance.
    pub ulp_max: Option<f64>,
    /// Elements with |a - b| > tolerance * (|a| + rms(a)).
    pub beyond_tolerance: u64,
    /// The tolerance `beyond_tolerance` used.
    pub tolerance: f64,
    /// Elements NaN on one side only.
    pub nan_mismatch: u64,
    /// Index of the worst element, one entry per dimension.
    pub worst_index: Vec<u64>,
    /// A's value at the worst element.
    pub worst_a: f64,
    /// B's value at the worst element.
    pub worst_b: f64,
}

/// The values as float64, and an ordinal per value whose differences are
/// ULP distances (None for dtypes without one).
fn values(t: &SavedTensor<'_>) -> Result<(Vec<f64>, Option<Vec<i128>>), String> {
    let d = t.data;
    fn chunks<const N: usize>(d: &[u8]) -> impl Iterator<Item = [u8; N]> + '_ {
        d.chunks_exact(N).map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            a
        })
    }
    // Sign-magnitude bits to a monotonic integer: equal values (and +0/-0)
    // one apart at most, neighbours exactly one apart.
    fn ordinal(bits: u64, sign_bit: u32) -> i128 {
        let mag = (bits & ((1u64 << sign_bit) - 1)) as i128;
        if bits >> sign_bit & 1 == 1 {
            -mag
        } else {
            mag
        }
    }
    Ok(match t.dtype {
        "float32" => {
            let bits: Vec<u32> = chunks::<4>(d).map(u32::from_le_bytes).collect();
            (
                bits.iter().map(|&b| f64::from(f32::from_bits(b))).collect(),
                Some(bits.iter().map(|&b| ordinal(u64::from(b), 31)).collect()),
            )
        }
        "float64" => {
            let bits: Vec<u64> = chunks::<8>(d).map(u64::from_le_bytes).collect();
            (
                bits.iter().map(|&b| f64::from_bits(b)).collect(),
                Some(bits.iter().map(|&b| ordinal(b, 63)).collect()),
            )
        }
        "float16" | "bfloat16" => {
            let bits: Vec<u16> = chunks::<2>(d).map(u16::from_le_bytes).collect();
            let v = if t.dtype == "float16" {
                bits.iter()
                    .map(|&b| half::f16::from_bits(b).to_f64())
                    .collect()
            } else {
                bits.iter()
                    .map(|&b| half::bf16::from_bits(b).to_f64())
                    .collect()
            };
            (
                v,
                Some(bits.iter().map(|&b| ordinal(u64::from(b), 15)).collect()),
            )
        }
        "bool" | "uint8" => {
            let v: Vec<f64> = d.iter().map(|&x| f64::from(x)).collect();
            let o = d.iter().map(|&x| i128::from(x)).collect();
            (v, Some(o))
        }
        "int8" => {
            let v: Vec<i128> = d.iter().map(|&x| i128::from(x as i8)).collect();
            (v.iter().map(|&x| x as f64).collect(), Some(v))
        }
        "int16" => int_values(chunks::<2>(d).map(|b| i128::from(i16::from_le_bytes(b)))),
        "uint16" => int_values(chunks::<2>(d).map(|b| i128::from(u16::from_le_bytes(b)))),
        "int32" => int_values(chunks::<4>(d).map(|b| i128::from(i32::from_le_bytes(b)))),
        "uint32" => int_values(chunks::<4>(d).map(|b| i128::from(u32::from_le_bytes(b)))),
        "int64" => int_values(chunks::<8>(d).map(|b| i128::from(i64::from_le_bytes(b)))),
        "uint64" => int_values(chunks::<8>(d).map(|b| i128::from(u64::from_le_bytes(b)))),
        // Real and imaginary parts, one after the other: the pair's error
        // is that of the complex values.
        "complex64" => {
            let bits: Vec<u32> = chunks::<4>(d).map(u32::from_le_bytes).collect();
            (
                bits.iter().map(|&b| f64::from(f32::from_bits(b))).collect(),
                Some(bits.iter().map(|&b| ordinal(u64::from(b), 31)).collect()),
            )
        }
        other => return Err(format!("no exact metrics for dtype {other}")),
    })
}

fn int_values(it: impl Iterator<Item = i128>) -> (Vec<f64>, Option<Vec<i128>>) {
    let v: Vec<i128> = it.collect();
    (v.iter().map(|&x| x as f64).collect(), Some(v))
}

fn tiny(dtype: &str) -> f64 {
    match dtype {
        "float16" => 6.103515625e-05,
        "bfloat16" | "float32" | "complex64" => f64::from(f32::MIN_POSITIVE),
        "float64" => f64::MIN_POSITIVE,
        _ => 1.0,
    }
}

/// Index of flat position `i` in `shape` (row-major).
fn unravel(mut i: u64, shape: &[usize]) -> Vec<u64> {
    let mut out = vec![0u64; shape.len()];
    for (d, &n) in shape.iter().enumerate().rev() {
        let n = n.max(1) as u64;
        out[d] = i % n;
        i /= n;
    }
    out
}

fn percentile(sorted: &[u128], q: f64) -> f64 {
    if sorted.is_empty() {
        return 0.0;
    }
    let rank = ((sorted.len() - 1) as f64 * q).round() as usize;
    sorted[rank.min(sorted.len() - 1)] as f64
}

/// The metrics of `a` (the reference) against `b`, with the op's relative
/// tolerance `tol`.
pub fn compare(a: &SavedTensor<'_>, b: &SavedTensor<'_>, tol: f64) -> Result<ExactMetrics, String> {
    if a.shape != b.shape {
        return Err(format!("shapes differ: {:?} and {:?}", a.shape, b.shape));
    }
    let (va, oa) = values(a)?;
    let (vb, ob) = values(b)?;
    if va.len() != vb.len() {
        return Err("the files hold different numbers of values".into());
    }
    let same_dtype = a.dtype == b.dtype;
    let identical = same_dtype && a.data == b.data;
    let n = va.len();
    let (mut sa, mut sb, mut sab, mut sd) = (0f64, 0f64, 0f64, 0f64);
    let (mut max_abs, mut max_rel) = (0f64, 0f64);
    let mut worst = None;
    let mut nan_mismatch = 0u64;
    let tiny = tiny(a.dtype);
    let mut ulps: Vec<u128> = Vec::new();
    let mut finite = 0usize;
    for i in 0..n {
        let (x, y) = (va[i], vb[i]);
        if x.is_nan() || y.is_nan() {
            nan_mismatch += u64::from(x.is_nan() != y.is_nan());
            continue;
        }
        if !x.is_finite() || !y.is_finite() {
            if x != y {
                nan_mismatch += 1;
            }
            continue;
        }
        finite += 1;
        let d = (x - y).abs();
        sa += x * x;
        sb += y * y;
        sab += x * y;
        sd += d * d;
        if worst.is_none() || d > max_abs {
            max_abs = d;
            worst = Some(i);
        }
        max_rel = max_rel.max(d / x.abs().max(tiny));
        if let (true, Some(oa), Some(ob)) = (same_dtype, &oa, &ob) {
            ulps.push((oa[i] - ob[i]).unsigned_abs());
        }
    }
    let rms_a = if finite > 0 {
        (sa / finite as f64).sqrt()
    } else {
        0.0
    };
    let mut beyond = nan_mismatch;
    for i in 0..n {
        let (x, y) = (va[i], vb[i]);
        if x.is_finite() && y.is_finite() && (x - y).abs() > tol * (x.abs() + rms_a) {
            beyond += 1;
        }
    }
    ulps.sort_unstable();
    let (na, nb) = (sa.sqrt(), sb.sqrt());
    let rel_l2 = if na > 0.0 {
        sd.sqrt() / na
    } else if sd > 0.0 {
        f64::INFINITY
    } else {
        0.0
    };
    let cosine = if na > 0.0 && nb > 0.0 {
        sab / (na * nb)
    } else if na == 0.0 && nb == 0.0 {
        1.0
    } else {
        0.0
    };
    let has_ulp = same_dtype && oa.is_some();
    let w = worst.unwrap_or(0);
    Ok(ExactMetrics {
        numel: n as u64,
        identical,
        max_abs,
        diff_l2: sd.sqrt(),
        max_rel,
        rel_l2,
        cosine,
        ulp_median: has_ulp.then(|| percentile(&ulps, 0.5)),
        ulp_p99: has_ulp.then(|| percentile(&ulps, 0.99)),
        ulp_max: has_ulp.then(|| ulps.last().map_or(0.0, |&u| u as f64)),
        beyond_tolerance: beyond,
        tolerance: tol,
        nan_mismatch,
        worst_index: if n > 0 {
            // complex64 holds two values per element
            let per = if a.dtype == "complex64" { 2 } else { 1 };
            unravel((w / per) as u64, &a.shape)
        } else {
            Vec::new()
        },
        worst_a: va.get(w).copied().unwrap_or(f64::NAN),
        worst_b: vb.get(w).copied().unwrap_or(f64::NAN),
    })
}

/// The exact metrics of tensor `ta` of `a` against `tb` of `b`, when both
/// were captured and both captures can be read: `tol` is the op's relative
/// tolerance.
pub fn exact_metrics(
    a: &crate::dump::Dump,
    ta: u32,
    b: &crate::dump::Dump,
    tb: u32,
    tol: f64,
) -> Option<ExactMetrics> {
    let ((fa, ka), (fb, kb)) = (a.capture_of(ta)?, b.capture_of(tb)?);
    let (xa, xb) = (a.captures.file(fa)?, b.captures.file(fb)?);
    let (sa, sb) = (xa.tensor(ka)?, xb.tensor(kb)?);
    compare(&sa, &sb, tol).ok()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn f32s(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    fn t<'a>(dtype: &'static str, shape: &[usize], data: &'a [u8]) -> SavedTensor<'a> {
        SavedTensor {
            dtype,
            shape: shape.to_vec(),
            data,
        }
    }

    #[test]
    fn metrics_against_a_direct_computation() {
        let a = [1.0f32, -2.0, 3.0, 0.0, 5.0, 6.0];
        let mut b = a;
        b[4] = f32::from_bits(a[4].to_bits() + 3); // 3 ulps
        b[1] = -2.5;
        let (da, db) = (f32s(&a), f32s(&b));
        let m = compare(
            &t("float32", &[2, 3], &da),
            &t("float32", &[2, 3], &db),
            1e-3,
        )
        .unwrap();
        assert!(!m.identical);
        assert_eq!(m.max_abs, 0.5);
        assert_eq!(m.worst_index, vec![0, 1]);
        assert_eq!((m.worst_a, m.worst_b), (-2.0, -2.5));
        assert!((m.max_rel - 0.25).abs() < 1e-12);
        let d5 = f64::from(b[4]) - 5.0;
        let l2 = (0.25 + d5 * d5).sqrt() / (75.0f64).sqrt();
        assert!((m.rel_l2 - l2).abs() < 1e-12, "{} {l2}", m.rel_l2);
        let dot: f64 = a
            .iter()
            .zip(&b)
            .map(|(x, y)| f64::from(*x) * f64::from(*y))
            .sum();
        let nb: f64 = b.iter().map(|y| f64::from(*y).powi(2)).sum::<f64>().sqrt();
        assert!((m.cosine - dot / (75.0f64.sqrt() * nb)).abs() < 1e-12);
        // ULPs: 0 x4, 3, and -2.0 -> -2.5 (2^21 values of float32 apart).
        assert_eq!(m.ulp_max, Some(f64::from(1u32 << 21)));
        assert_eq!(m.ulp_median, Some(0.0));
        assert_eq!(m.beyond_tolerance, 1);
    }

    #[test]
    fn a_permutation_keeps_norms_but_not_cosine() {
        let a = [1.0f32, 2.0, 3.0, 4.0];
        let b = [2.0f32, 1.0, 3.0, 4.0];
        let (da, db) = (f32s(&a), f32s(&b));
        let m = compare(&t("float32", &[4], &da), &t("float32", &[4], &db), 1e-6).unwrap();
        assert!(m.cosine < 1.0 && m.max_abs == 1.0);
        let same = compare(&t("float32", &[4], &da), &t("float32", &[4], &da), 1e-6).unwrap();
        assert!(same.identical && same.cosine == 1.0 && same.ulp_max == Some(0.0));
    }

    #[test]
    fn nans_and_low_precision() {
        let a: Vec<u8> = [1.0f32, f32::NAN, 2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let b: Vec<u8> = [1.0f32, 7.0, 2.0]
            .iter()
            .flat_map(|x| x.to_le_bytes())
            .collect();
        let m = compare(&t("float32", &[3], &a), &t("float32", &[3], &b), 1e-6).unwrap();
        assert_eq!((m.nan_mismatch, m.beyond_tolerance, m.max_abs), (1, 1, 0.0));
        // bfloat16 1.0 and its neighbour: one ulp.
        let one = half::bf16::from_f32(1.0).to_bits();
        let (x, y) = (one.to_le_bytes(), (one + 1).to_le_bytes());
        let m = compare(&t("bfloat16", &[1], &x), &t("bfloat16", &[1], &y), 1e-2).unwrap();
        assert_eq!(m.ulp_max, Some(1.0));
        assert!((m.max_abs - 2f64.powi(-7)).abs() < 1e-15);
        // Different dtypes: no common ULP.
        let f: Vec<u8> = 1.0f32.to_le_bytes().to_vec();
        let m = compare(&t("float32", &[1], &f), &t("bfloat16", &[1], &x), 1e-2).unwrap();
        assert!(m.ulp_max.is_none() && m.max_abs == 0.0);
    }
}
