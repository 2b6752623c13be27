//! Synthetic dumps from real values, for the tests of the fingerprint and
//! the sketch: a chain of float32 ops computed element by element, every
//! tensor's statistics, fingerprint and sketch computed from its values as
//! the plugin does (`sketch.rs`). Side B may add rounding noise to every
//! output (a second correct device) and change one op's output (a fault).

#[cfg(feature = "parquet")]
use std::path::Path;

use opdump_format::{OpRecord, Role, Stats, StatsStatus, TensorRecord};

use crate::synth::DumpWriter;
use opdump_judge::sketch::{fingerprint_f32, fmix32, sketch};

/// Statistics of float32 values, accumulated in float64 over the values
/// sorted: the same bits for any order of the same values, so a
/// permutation keeps every statistic, as it does on a device up to the
/// last bits.
pub fn stats_of(values: &[f32]) -> Stats {
    let mut v: Vec<f64> = values
        .iter()
        .filter(|x| x.is_finite())
        .map(|&x| f64::from(x))
        .collect();
    v.sort_by(f64::total_cmp);
    let count = |f: fn(&f32) -> bool| values.iter().filter(|x| f(x)).count() as i64;
    let n = v.len() as f64;
    let mean = v.iter().sum::<f64>() / n;
    let var = v.iter().map(|x| (x - mean) * (x - mean)).sum::<f64>() / n;
    let nan = f64::NAN;
    Stats {
        min: v.first().copied().unwrap_or(nan),
        max: v.last().copied().unwrap_or(nan),
        mean: if v.is_empty() { nan } else { mean },
        std: if v.is_empty() { nan } else { var.sqrt() },
        l2: v.iter().map(|x| x * x).sum::<f64>().sqrt(),
        absmax: v.iter().fold(nan, |m, x| m.max(x.abs())),
        nan_count: count(|x| x.is_nan()),
        posinf_count: count(|&x| x == f32::INFINITY),
        neginf_count: count(|&x| x == f32::NEG_INFINITY),
        zero_count: count(|&x| x == 0.0),
    }
}

/// A one-dimensional float32 tensor holding `values`; with `sketch_k`, its
/// fingerprint and a sketch of that length too.
pub fn tensor_of(role: Role, arg: &str, values: &[f32], sketch_k: Option<usize>) -> TensorRecord {
    let n = values.len() as i64;
    let as_f64: Vec<f64> = values.iter().map(|&x| f64::from(x)).collect();
    TensorRecord {
        role,
        arg: arg.to_string().into(),
        list_index: None,
        dtype: "float32".into(),
        shape: vec![n],
        stride: vec![1],
        device: "cpu".into(),
        numel: n,
        name: None,
        capture_key: None,
        status: StatsStatus::Computed,
        stats: stats_of(values),
        fingerprint: sketch_k.map(|_| fingerprint_f32(values)),
        sketch: sketch_k.map(|k| sketch(&as_f64, k)),
    }
}

/// A uniform value in [-1, 1) from a counter and a seed.
pub fn uniform(i: u64, seed: u32) -> f64 {
    let h = fmix32(fmix32(i as u32 ^ seed).wrapping_add((i >> 32) as u32));
    f64::from(h) / 2f64.powi(31) - 1.0
}

/// What side B does to one op's output.
#[derive(Clone, Copy, Debug)]
pub enum Change {
    /// The values reversed: every statistic stays.
    Permute,
    /// Each value times (1 + r·u), u uniform in [-1, 1), but the smallest
    /// and the largest: zero-mean noise the extremes do not show, which
    /// keeps the statistics within rounding.
    Noise(f64),
}

/// A chain of `layers` x (mul, tanh, roll, add) over `numel` values.
#[derive(Clone, Debug)]
pub struct Chain {
    pub layers: usize,
    pub numel: usize,
    /// B's every output times (1 + rounding·u): a second correct device.
    pub rounding: f64,
    /// B's output of the op with this index (in call order) changes.
    pub fault: Option<(usize, Change)>,
    /// The sketch length; `None` writes no fingerprints or sketches.
    pub sketch_k: Option<usize>,
}

/// The ops of one layer, in call order.
pub const LAYER_OPS: [&str; 4] = ["aten::mul", "aten::tanh", "aten::roll", "aten::add"];

/// Writes side A (`side_b` false) or B of `c` under `root`; returns the
/// seq of each op, in call order (the same on both sides).
#[cfg(feature = "parquet")]
pub fn write_chain(root: &Path, c: &Chain, side_b: bool) -> opdump_format::Result<Vec<i64>> {
    let mut w = DumpWriter::new(root, 0, "cpu");
    let seqs = fill_chain(&mut w, c, side_b)?;
    w.close()?;
    Ok(seqs)
}

/// The records [`write_chain`] writes for side A (`side_b` false) or B,
/// kept in memory, and the seq of each op in call order.
pub fn chain_records(c: &Chain, side_b: bool) -> (Vec<OpRecord>, Vec<i64>) {
    let mut w = DumpWriter::in_memory();
    let seqs = fill_chain(&mut w, c, side_b).expect("in memory");
    (w.records(), seqs)
}

/// The calls of side A or B of `c`, given to `w`; the seq of each op.
fn fill_chain(w: &mut DumpWriter, c: &Chain, side_b: bool) -> opdump_format::Result<Vec<i64>> {
    let k = c.sketch_k;
    let mut x: Vec<f32> = (0..c.numel as u64)
        .map(|i| (2.0 * uniform(i, 0xda7a)) as f32)
        .collect();
    let mut seqs = Vec::new();
    // B's output of op `index`: rounding noise, then the fault.
    let finish = |index: usize, mut y: Vec<f32>| -> Vec<f32> {
        if !side_b {
            return y;
        }
        let seed = 0x5eed ^ index as u32;
        for (i, v) in y.iter_mut().enumerate() {
            *v = (f64::from(*v) * (1.0 + c.rounding * uniform(i as u64, seed))) as f32;
        }
        match c.fault {
            Some((at, Change::Permute)) if at == index => y.reverse(),
            Some((at, Change::Noise(r))) if at == index => {
                let (lo, hi) = y
                    .iter()
                    .fold((f32::MAX, f32::MIN), |(l, h), &v| (l.min(v), h.max(v)));
                for (i, v) in y.iter_mut().enumerate() {
                    if *v != lo && *v != hi {
                        *v = (f64::from(*v) * (1.0 + r * uniform(i as u64, !seed))) as f32;
                    }
                }
            }
            _ => {}
        }
        y
    };
    for layer in 0..c.layers {
        w.module = Some(format!("layers.{layer}"));
        let base = layer * LAYER_OPS.len();
        let scaled = finish(base, x.iter().map(|v| v * 1.01).collect());
        seqs.push(w.leaf(
            "aten::mul",
            "Scalar",
            "other=1.01",
            vec![tensor_of(Role::Input, "self", &x, k)],
            vec![tensor_of(Role::Output, "0", &scaled, k)],
        )?);
        let t = finish(base + 1, scaled.iter().map(|v| v.tanh()).collect());
        seqs.push(w.leaf(
            "aten::tanh",
            "default",
            "",
            vec![tensor_of(Role::Input, "self", &scaled, k)],
            vec![tensor_of(Role::Output, "0", &t, k)],
        )?);
        let mut rolled = t.clone();
        rolled.rotate_right(1);
        let rolled = finish(base + 2, rolled);
        seqs.push(w.leaf(
            "aten::roll",
            "default",
            "shifts=[1], dims=[0]",
            vec![tensor_of(Role::Input, "self", &t, k)],
            vec![tensor_of(Role::Output, "0", &rolled, k)],
        )?);
        let sum = finish(
            base + 3,
            t.iter().zip(&rolled).map(|(a, b)| a + 0.5 * b).collect(),
        );
        seqs.push(w.leaf(
            "aten::add",
            "Tensor",
            "alpha=0.5",
            vec![
                tensor_of(Role::Input, "self", &t, k),
                tensor_of(Role::Input, "other", &rolled, k),
            ],
            vec![tensor_of(Role::Output, "0", &sum, k)],
        )?);
        x = sum;
    }
    Ok(seqs)
}

/// Writes both sides under `root/a` and `root/b`; returns the seqs of the
/// ops in call order.
#[cfg(feature = "parquet")]
pub fn write_pair(root: &Path, c: &Chain) -> opdump_format::Result<Vec<i64>> {
    write_chain(&root.join("a"), c, false)?;
    write_chain(&root.join("b"), c, true)
}
