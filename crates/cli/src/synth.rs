//! Synthetic dumps, written with the real writer, for tests and for the
//! 1M-op benchmark (`examples/synth.rs`). Nothing here runs in `opdump`
//! itself.
//!
//! A tensor is described by its shape and a positive scale `x`; its
//! statistics follow from them ([`stats_for`]), so a tensor scaled by a
//! planted fault has its statistics scaled the same way, as a real scaled
//! tensor would.

use std::path::{Path, PathBuf};
use std::time::Duration;

use opdump_format::schema::meta;
use opdump_format::{
    OpRecord, Phase, Role, RotateOptions, RotatingWriter, Stats, StatsStatus, TensorRecord,
};

/// Statistics of a tensor of `numel` elements at scale `x`.
pub fn stats_for(numel: i64, x: f64) -> Stats {
    let n = numel.max(0) as f64;
    let mean = 0.1 * x;
    let std = x;
    Stats {
        min: -2.0 * x,
        max: 2.5 * x,
        mean,
        std,
        l2: (n * (mean * mean + std * std)).sqrt(),
        absmax: 2.5 * x.abs(),
        nan_count: 0,
        posinf_count: 0,
        neginf_count: 0,
        zero_count: 0,
    }
}

pub fn numel(shape: &[i64]) -> i64 {
    shape.iter().product()
}

fn contiguous_stride(shape: &[i64]) -> Vec<i64> {
    let mut s = vec![1; shape.len()];
    for i in (0..shape.len().saturating_sub(1)).rev() {
        s[i] = s[i + 1] * shape[i + 1];
    }
    s
}

/// A tensor with measured statistics at scale `x`.
pub fn tensor(role: Role, arg: &str, dtype: &str, shape: &[i64], x: f64) -> TensorRecord {
    let n = numel(shape);
    TensorRecord {
        role,
        arg: arg.to_string(),
        list_index: None,
        dtype: dtype.to_string(),
        shape: shape.to_vec(),
        stride: contiguous_stride(shape),
        device: "cpu".into(),
        numel: n,
        status: StatsStatus::Computed,
        stats: stats_for(n, x),
    }
}

pub fn input(arg: &str, dtype: &str, shape: &[i64], x: f64) -> TensorRecord {
    tensor(Role::Input, arg, dtype, shape, x)
}

pub fn output(index: usize, dtype: &str, shape: &[i64], x: f64) -> TensorRecord {
    tensor(Role::Output, &index.to_string(), dtype, shape, x)
}

/// Marks `nan` elements NaN (the other statistics stay those of the rest).
pub fn with_nan(mut t: TensorRecord, nan: i64) -> TensorRecord {
    t.stats.nan_count = nan;
    t
}

/// A writer of one partition that hands out `seq`, `depth` and `parent_seq`
/// like the plugin: seq in entry order, the record written when the op
/// ends (so a parent's row follows its children's in the file).
pub struct DumpWriter {
    w: RotatingWriter,
    seq: i64,
    pid: i32,
    stack: Vec<(i64, i32)>,
    pub step: i64,
    pub phase: Phase,
    pub calls: u64,
}

/// An op that has begun and not yet ended.
pub struct Open {
    rec: OpRecord,
}

impl DumpWriter {
    /// Writes into `root/rank=<rank>/device=<device>/`.
    pub fn new(root: &Path, rank: u32, device: &str) -> Self {
        Self::with_rows(root, rank, device, 500_000)
    }

    /// As `new`, rotating files every `max_rows` rows.
    pub fn with_rows(root: &Path, rank: u32, device: &str, max_rows: u64) -> Self {
        Self::with_pid(root, rank, device, max_rows, 4242)
    }

    /// As `with_rows`, as process `pid`.
    pub fn with_pid(root: &Path, rank: u32, device: &str, max_rows: u64, pid: i32) -> Self {
        let dir: PathBuf = root
            .join(format!("rank={rank}"))
            .join(format!("device={device}"));
        let opts = RotateOptions {
            max_rows,
            max_age: Duration::from_secs(3600),
            ..Default::default()
        };
        let md = vec![
            (meta::PID.to_string(), pid.to_string()),
            (meta::RANK.to_string(), rank.to_string()),
            (meta::DEVICE.to_string(), device.to_string()),
            (meta::STATS_ACCUMULATE.to_string(), "float64".to_string()),
        ];
        DumpWriter {
            w: RotatingWriter::new(dir, format!("part-{pid}"), opts, md),
            seq: 0,
            pid,
            stack: Vec::new(),
            step: 0,
            phase: Phase::Forward,
            calls: 0,
        }
    }

    /// Starts an op; its children are the ops started before [`end`].
    pub fn begin(
        &mut self,
        op: &str,
        overload: &str,
        args: &str,
        inputs: Vec<TensorRecord>,
    ) -> Open {
        let seq = self.seq;
        self.seq += 1;
        let (parent_seq, depth) = match self.stack.last() {
            Some(&(p, d)) => (Some(p), d + 1),
            None => (None, 0),
        };
        self.stack.push((seq, depth));
        Open {
            rec: OpRecord {
                seq,
                parent_seq,
                depth,
                pid: self.pid,
                thread: 1,
                step: self.step,
                phase: self.phase,
                op: op.to_string(),
                overload: overload.to_string(),
                args: args.to_string(),
                start_ns: seq * 1000,
                duration_ns: 500,
                error: None,
                tensors: inputs,
            },
        }
    }

    /// Ends an op with its outputs and writes its record. Returns its seq.
    pub fn end(
        &mut self,
        mut open: Open,
        outputs: Vec<TensorRecord>,
    ) -> opdump_format::Result<i64> {
        self.stack.pop();
        open.rec.tensors.extend(outputs);
        self.w.append(&open.rec)?;
        self.calls += 1;
        Ok(open.rec.seq)
    }

    /// An op without children.
    pub fn leaf(
        &mut self,
        op: &str,
        overload: &str,
        args: &str,
        inputs: Vec<TensorRecord>,
        outputs: Vec<TensorRecord>,
    ) -> opdump_format::Result<i64> {
        let o = self.begin(op, overload, args, inputs);
        self.end(o, outputs)
    }

    /// The next seq to be handed out.
    pub fn next_seq(&self) -> i64 {
        self.seq
    }

    /// Sets the next seq (several writers of one process share its seq).
    pub fn set_next_seq(&mut self, seq: i64) {
        self.seq = seq;
    }

    pub fn close(mut self) -> opdump_format::Result<u64> {
        self.w.close_file()?;
        Ok(self.calls)
    }
}

/// How side B of a synthetic training run differs from side A.
#[derive(Clone, Debug, Default)]
pub struct Variant {
    /// Relative rounding noise on every output of B (cross-device noise).
    pub noise: f64,
    /// B computes in this dtype instead of float32 (bf16 autocast).
    pub dtype: Option<&'static str>,
    /// A `_to_copy` before every n-th linear of B.
    pub extra_copy_every: Option<usize>,
    /// B lacks the gelu of every n-th layer.
    pub drop_gelu_every: Option<usize>,
    /// B's layer_norm decomposes into other ops at depth 1.
    pub decompose_layer_norm: bool,
    /// B's output of the proj `addmm` of (step, layer) is off by this
    /// relative amount.
    pub fault: Option<(i64, usize, f64)>,
    /// B's gelu of (step, layer) outputs this many NaN.
    pub nan: Option<(i64, usize, i64)>,
}

/// The shape of a synthetic training run.
#[derive(Clone, Debug)]
pub struct Model {
    pub steps: i64,
    pub layers: usize,
    pub tokens: i64,
    pub hidden: i64,
}

impl Model {
    /// Op calls per step on side A.
    pub fn calls_per_step(&self) -> u64 {
        // forward per layer: layer_norm(2) linear(3) view(1) softmax(2)
        // linear(3) add(1) gelu(1) = 13; loss 5; backward per layer 6;
        // optimizer 1.
        self.layers as u64 * 19 + 6
    }
}

/// The state of the residual stream: scale on A, relative error on B, and
/// NaN count on B.
#[derive(Clone, Copy)]
struct Val {
    x: f64,
    err: f64,
    nan: i64,
}

/// A deterministic value in [-1, 1] for noise.
fn jitter(k: u64) -> f64 {
    let h = crate::intern::mix(k, 0x5eed);
    (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// Writes one synthetic training run: `side_b` false writes the reference
/// A, true writes B with the differences of `v`.
pub fn write_model(
    root: &Path,
    m: &Model,
    v: &Variant,
    side_b: bool,
    max_rows: u64,
) -> opdump_format::Result<u64> {
    let mut w = DumpWriter::with_rows(root, 0, "cpu", max_rows);
    let dt = if side_b {
        v.dtype.unwrap_or("float32")
    } else {
        "float32"
    };
    let (t, h) = (m.tokens, m.hidden);
    let mut k: u64 = 0; // noise counter
                        // A tensor of side (A or B) from a value.
    let mk = |role: Role, arg: &str, shape: &[i64], val: Val, side_b: bool| {
        let x = if side_b {
            val.x * (1.0 + val.err)
        } else {
            val.x
        };
        let mut tr = tensor(role, arg, dt, shape, x);
        if side_b {
            tr.stats.nan_count = val.nan;
        }
        tr
    };
    // The next value after an op: the scale moves, noise adds on B.
    let step_val = |val: Val, f: f64, k: &mut u64| -> Val {
        *k += 1;
        Val {
            x: val.x * f,
            err: val.err + if side_b { v.noise * jitter(*k) } else { 0.0 },
            nan: val.nan,
        }
    };
    for step in 0..m.steps {
        w.step = step;
        w.phase = Phase::Forward;
        let mut cur = Val {
            x: 1.0,
            err: 0.0,
            nan: 0,
        };
        let act = [t, h];
        let wgt = [h, h];
        let params = Val {
            x: 0.02,
            err: 0.0,
            nan: 0,
        };
        for layer in 0..m.layers {
            // layer_norm: a CPU kernel on A; decomposed on B when asked.
            let ln = w.begin(
                "aten::layer_norm",
                "default",
                &format!("normalized_shape=[{h}], eps=1e-05"),
                vec![mk(Role::Input, "input", &act, cur, side_b)],
            );
            // A normalization: the scale resets, relative errors carry on.
            let next = step_val(Val { x: 1.0, ..cur }, 1.0, &mut k);
            if side_b && v.decompose_layer_norm {
                let mean_v = Val {
                    x: cur.x * 0.1,
                    ..cur
                };
                w.leaf(
                    "aten::mean",
                    "dim",
                    "dim=[-1], keepdim=True",
                    vec![mk(Role::Input, "self", &act, cur, side_b)],
                    vec![mk(Role::Output, "0", &[t, 1], mean_v, side_b)],
                )?;
                w.leaf(
                    "aten::sub",
                    "Tensor",
                    "alpha=1",
                    vec![
                        mk(Role::Input, "self", &act, cur, side_b),
                        mk(Role::Input, "other", &[t, 1], mean_v, side_b),
                    ],
                    vec![mk(Role::Output, "0", &act, cur, side_b)],
                )?;
                w.leaf(
                    "aten::mul",
                    "Tensor",
                    "",
                    vec![mk(Role::Input, "self", &act, cur, side_b)],
                    vec![mk(Role::Output, "0", &act, next, side_b)],
                )?;
            } else {
                w.leaf(
                    "aten::native_layer_norm",
                    "default",
                    &format!("normalized_shape=[{h}], eps=1e-05"),
                    vec![mk(Role::Input, "input", &act, cur, side_b)],
                    vec![
                        mk(Role::Output, "0", &act, next, side_b),
                        mk(Role::Output, "1", &[t, 1], Val { x: 0.1, ..cur }, side_b),
                    ],
                )?;
            }
            w.end(ln, vec![mk(Role::Output, "0", &act, next, side_b)])?;
            cur = next;
            // Two linears (qkv, proj) around a softmax.
            for (which, f) in [("qkv", 1.1), ("proj", 0.95)] {
                if side_b
                    && v.extra_copy_every
                        .is_some_and(|n| (layer * 2 + (which == "proj") as usize) % n == 0)
                {
                    let c = w.begin(
                        "aten::_to_copy",
                        "default",
                        "dtype=torch.float32",
                        vec![mk(Role::Input, "self", &act, cur, side_b)],
                    );
                    w.leaf(
                        "aten::empty_strided",
                        "default",
                        "",
                        vec![],
                        vec![{
                            let mut e = mk(Role::Output, "0", &act, cur, side_b);
                            e.status = StatsStatus::Uninitialized;
                            e
                        }],
                    )?;
                    w.leaf(
                        "aten::copy_",
                        "default",
                        "non_blocking=False",
                        vec![mk(Role::Input, "src", &act, cur, side_b)],
                        vec![mk(Role::Output, "0", &act, cur, side_b)],
                    )?;
                    w.end(c, vec![mk(Role::Output, "0", &act, cur, side_b)])?;
                }
                let lin = w.begin(
                    "aten::linear",
                    "default",
                    "",
                    vec![
                        mk(Role::Input, "input", &act, cur, side_b),
                        mk(Role::Input, "weight", &wgt, params, side_b),
                        mk(Role::Input, "bias", &[h], params, side_b),
                    ],
                );
                let mut next = step_val(cur, f, &mut k);
                if side_b && which == "proj" {
                    if let Some((s, l, rel)) = v.fault {
                        if s == step && l == layer {
                            next.err = (1.0 + next.err) * (1.0 + rel) - 1.0;
                        }
                    }
                }
                w.leaf(
                    "aten::t",
                    "default",
                    "",
                    vec![mk(Role::Input, "self", &wgt, params, side_b)],
                    vec![mk(Role::Output, "0", &wgt, params, side_b)],
                )?;
                w.leaf(
                    "aten::addmm",
                    "default",
                    "beta=1, alpha=1",
                    vec![
                        mk(Role::Input, "self", &[h], params, side_b),
                        mk(Role::Input, "mat1", &act, cur, side_b),
                        mk(Role::Input, "mat2", &wgt, params, side_b),
                    ],
                    vec![mk(Role::Output, "0", &act, next, side_b)],
                )?;
                w.end(lin, vec![mk(Role::Output, "0", &act, next, side_b)])?;
                cur = next;
                if which == "qkv" {
                    w.leaf(
                        "aten::view",
                        "default",
                        &format!("size=[{t}, {h}]"),
                        vec![mk(Role::Input, "self", &act, cur, side_b)],
                        vec![mk(Role::Output, "0", &act, cur, side_b)],
                    )?;
                    let sm = w.begin(
                        "aten::softmax",
                        "int",
                        "dim=-1",
                        vec![mk(Role::Input, "self", &act, cur, side_b)],
                    );
                    let next = step_val(cur, 0.5, &mut k);
                    w.leaf(
                        "aten::_softmax",
                        "default",
                        "dim=-1, half_to_float=False",
                        vec![mk(Role::Input, "self", &act, cur, side_b)],
                        vec![mk(Role::Output, "0", &act, next, side_b)],
                    )?;
                    w.end(sm, vec![mk(Role::Output, "0", &act, next, side_b)])?;
                    cur = next;
                }
            }
            let next = step_val(cur, 1.05, &mut k);
            w.leaf(
                "aten::add",
                "Tensor",
                "alpha=1",
                vec![
                    mk(Role::Input, "self", &act, cur, side_b),
                    mk(Role::Input, "other", &act, cur, side_b),
                ],
                vec![mk(Role::Output, "0", &act, next, side_b)],
            )?;
            cur = next;
            // A dropped gelu is fused elsewhere: the values go on as if it ran.
            let dropped = side_b && v.drop_gelu_every.is_some_and(|n| layer % n == n - 1);
            let mut next = step_val(cur, 0.7, &mut k);
            if side_b {
                if let Some((s, l, nan)) = v.nan {
                    if s == step && l == layer {
                        next.nan = nan;
                    }
                }
            }
            if !dropped {
                w.leaf(
                    "aten::gelu",
                    "default",
                    "approximate='none'",
                    vec![mk(Role::Input, "self", &act, cur, side_b)],
                    vec![mk(Role::Output, "0", &act, next, side_b)],
                )?;
            }
            cur = next;
        }
        // Loss.
        let vocab = [t, 4 * h];
        let ce = w.begin(
            "aten::cross_entropy_loss",
            "default",
            "reduction=Mean",
            vec![mk(Role::Input, "self", &vocab, cur, side_b)],
        );
        let ls = w.begin(
            "aten::log_softmax",
            "int",
            "dim=1",
            vec![mk(Role::Input, "self", &vocab, cur, side_b)],
        );
        let lsv = step_val(cur, 2.0, &mut k);
        w.leaf(
            "aten::_log_softmax",
            "default",
            "dim=1, half_to_float=False",
            vec![mk(Role::Input, "self", &vocab, cur, side_b)],
            vec![mk(Role::Output, "0", &vocab, lsv, side_b)],
        )?;
        w.end(ls, vec![mk(Role::Output, "0", &vocab, lsv, side_b)])?;
        let loss = step_val(lsv, 0.3, &mut k);
        let nl = w.begin(
            "aten::nll_loss_nd",
            "default",
            "reduction=Mean",
            vec![mk(Role::Input, "self", &vocab, lsv, side_b)],
        );
        w.leaf(
            "aten::nll_loss_forward",
            "default",
            "reduction=1, ignore_index=-100",
            vec![mk(Role::Input, "self", &vocab, lsv, side_b)],
            vec![mk(Role::Output, "0", &[], loss, side_b)],
        )?;
        w.end(nl, vec![mk(Role::Output, "0", &[], loss, side_b)])?;
        w.end(ce, vec![mk(Role::Output, "0", &[], loss, side_b)])?;
        // Backward: per layer, in reverse.
        w.phase = Phase::Backward;
        let mut g = Val {
            x: 1e-3,
            err: loss.err,
            nan: loss.nan,
        };
        for _layer in (0..m.layers).rev() {
            let next = step_val(g, 1.01, &mut k);
            w.leaf(
                "aten::gelu_backward",
                "default",
                "approximate='none'",
                vec![
                    mk(Role::Input, "grad_output", &act, g, side_b),
                    mk(Role::Input, "self", &act, cur, side_b),
                ],
                vec![mk(Role::Output, "0", &act, next, side_b)],
            )?;
            g = next;
            let gw = step_val(g, 3.0, &mut k);
            w.leaf(
                "aten::mm",
                "default",
                "",
                vec![
                    mk(Role::Input, "self", &[h, t], g, side_b),
                    mk(Role::Input, "mat2", &act, cur, side_b),
                ],
                vec![mk(Role::Output, "0", &wgt, gw, side_b)],
            )?;
            let next = step_val(g, 0.98, &mut k);
            w.leaf(
                "aten::mm",
                "default",
                "",
                vec![
                    mk(Role::Input, "self", &act, g, side_b),
                    mk(Role::Input, "mat2", &wgt, params, side_b),
                ],
                vec![mk(Role::Output, "0", &act, next, side_b)],
            )?;
            g = next;
            w.leaf(
                "aten::sum",
                "dim_IntList",
                "dim=[0], keepdim=True",
                vec![mk(Role::Input, "self", &act, g, side_b)],
                vec![mk(
                    Role::Output,
                    "0",
                    &[1, h],
                    step_val(g, 5.0, &mut k),
                    side_b,
                )],
            )?;
            let next = step_val(g, 1.0, &mut k);
            w.leaf(
                "aten::_softmax_backward_data",
                "default",
                "dim=-1",
                vec![
                    mk(Role::Input, "grad_output", &act, g, side_b),
                    mk(Role::Input, "output", &act, cur, side_b),
                ],
                vec![mk(Role::Output, "0", &act, next, side_b)],
            )?;
            g = next;
            // The normalization's backward resets the scale (no underflow
            // over thousands of layers).
            let next = step_val(Val { x: 1e-3, ..g }, 1.0, &mut k);
            w.leaf(
                "aten::native_layer_norm_backward",
                "default",
                "normalized_shape=[4]",
                vec![
                    mk(Role::Input, "grad_out", &act, g, side_b),
                    mk(Role::Input, "input", &act, cur, side_b),
                ],
                vec![mk(Role::Output, "0", &act, next, side_b)],
            )?;
            g = next;
        }
        // Optimizer: one foreach op over a list of parameters.
        w.phase = Phase::Optimizer;
        // p - lr * g: the update's relative error is a small part of g's.
        let n_params = 4;
        let mut ins = Vec::new();
        let mut grads = Vec::new();
        let mut outs = Vec::new();
        for p in 0..n_params {
            let mut a = mk(Role::Input, "self", &wgt, params, side_b);
            a.list_index = Some(p);
            ins.push(a);
            let mut gr = mk(Role::Input, "other", &wgt, g, side_b);
            gr.list_index = Some(p);
            grads.push(gr);
            let upd = Val {
                x: 0.0199,
                err: g.err * 0.05,
                nan: g.nan,
            };
            let mut o = mk(Role::Output, "self", &wgt, upd, side_b);
            o.list_index = Some(p);
            outs.push(o);
        }
        ins.extend(grads);
        w.leaf("aten::_foreach_add_", "List", "alpha=-0.001", ins, outs)?;
    }
    w.close()
}
