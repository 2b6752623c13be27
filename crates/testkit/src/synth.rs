//! Synthetic dumps, written with the real writer, for tests and for the
//! 1M-op benchmark (`examples/synth.rs`). Nothing here runs in `opdump`
//! itself.
//!
//! A tensor is described by its shape and a positive scale `x`; its
//! statistics follow from them ([`stats_for`]), so a tensor scaled by a
//! planted fault has its statistics scaled the same way, as a real scaled
//! tensor would.

#[cfg(feature = "parquet")]
use std::path::{Path, PathBuf};
#[cfg(feature = "parquet")]
use std::time::Duration;

#[cfg(feature = "parquet")]
use opdump_format::schema::meta;
use opdump_format::{OpRecord, Phase, Role, Stats, StatsStatus, TensorRecord};
#[cfg(feature = "parquet")]
use opdump_format::{RotateOptions, RotatingWriter};

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
        arg: arg.to_string().into(),
        list_index: None,
        dtype: dtype.to_string().into(),
        shape: shape.to_vec(),
        stride: contiguous_stride(shape),
        device: "cpu".into(),
        numel: n,
        name: None,
        capture_key: None,
        status: StatsStatus::Computed,
        stats: stats_for(n, x),
        fingerprint: None,
        sketch: None,
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
/// ends (so a parent's row follows its children's in the file). Into files,
/// or kept in memory for a dump built with `Dump::from_records`.
pub struct DumpWriter {
    out: Out,
    seq: i64,
    pid: i32,
    stack: Vec<(i64, i32)>,
    pub step: i64,
    pub phase: Phase,
    pub calls: u64,
    /// The module path given to the op calls begun from now on.
    pub module: Option<String>,
}

/// Where a [`DumpWriter`]'s records go.
enum Out {
    #[cfg(feature = "parquet")]
    Files(Box<RotatingWriter>),
    /// In the order they would be written.
    Memory(Vec<OpRecord>),
}

/// An op that has begun and not yet ended.
pub struct Open {
    rec: OpRecord,
}

impl DumpWriter {
    #[cfg(feature = "parquet")]
    /// Writes into `root/rank=<rank>/device=<device>/`.
    pub fn new(root: &Path, rank: u32, device: &str) -> Self {
        Self::with_rows(root, rank, device, 500_000)
    }

    #[cfg(feature = "parquet")]
    /// As `new`, rotating files every `max_rows` rows.
    pub fn with_rows(root: &Path, rank: u32, device: &str, max_rows: u64) -> Self {
        Self::with_pid(root, rank, device, max_rows, 4242)
    }

    #[cfg(feature = "parquet")]
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
        Self::into_out(
            Out::Files(Box::new(RotatingWriter::new(
                dir,
                format!("part-{pid}"),
                opts,
                md,
            ))),
            pid,
        )
    }

    /// A writer that keeps its records in memory ([`DumpWriter::records`]).
    pub fn in_memory() -> Self {
        Self::into_out(Out::Memory(Vec::new()), 4242)
    }

    fn into_out(out: Out, pid: i32) -> Self {
        DumpWriter {
            out,
            seq: 0,
            pid,
            stack: Vec::new(),
            step: 0,
            phase: Phase::Forward,
            calls: 0,
            module: None,
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
                op: op.to_string().into(),
                overload: overload.to_string().into(),
                args: args.to_string(),
                start_ns: seq * 1000,
                duration_ns: 500,
                error: None,
                module: self.module.clone().map(Into::into),
                fwd_seq: None,
                source: None,
                capture: None,
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
        let seq = open.rec.seq;
        match &mut self.out {
            #[cfg(feature = "parquet")]
            Out::Files(w) => {
                w.write_capture(&mut open.rec)?;
                w.append(&open.rec)?;
            }
            Out::Memory(recs) => recs.push(open.rec),
        }
        self.calls += 1;
        Ok(seq)
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

    /// An op without children whose tensors were captured: each tensor row
    /// whose key `capture` holds names it (as the plugin's rows do).
    pub fn leaf_captured(
        &mut self,
        op: &str,
        inputs: Vec<TensorRecord>,
        outputs: Vec<TensorRecord>,
        capture: opdump_format::Capture,
    ) -> opdump_format::Result<i64> {
        let mut o = self.begin(op, "default", "", inputs);
        o.rec.tensors.extend(outputs);
        for t in &mut o.rec.tensors {
            let key = opdump_format::capture::key(t.role.as_str(), &t.arg, t.list_index);
            if capture.tensors.iter().any(|c| c.key == key) {
                t.capture_key = Some(key);
            }
        }
        o.rec.capture = Some(capture);
        self.end(o, Vec::new())
    }

    /// The next seq to be handed out.
    pub fn next_seq(&self) -> i64 {
        self.seq
    }

    /// Sets the next seq (several writers of one process share its seq).
    pub fn set_next_seq(&mut self, seq: i64) {
        self.seq = seq;
    }

    /// Closes the last file; returns the calls written.
    pub fn close(#[allow(unused_mut)] mut self) -> opdump_format::Result<u64> {
        #[cfg(feature = "parquet")]
        if let Out::Files(w) = &mut self.out {
            w.close_file()?;
        }
        Ok(self.calls)
    }

    /// The records of an in-memory writer, in write order (none for a
    /// writer into files).
    pub fn records(self) -> Vec<OpRecord> {
        match self.out {
            Out::Memory(recs) => recs,
            #[cfg(feature = "parquet")]
            Out::Files(_) => Vec::new(),
        }
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

/// Weights and biases: the same on both sides, and never updated.
const PARAMS: Val = Val {
    x: 0.02,
    err: 0.0,
    nan: 0,
};

/// A deterministic value in [-1, 1] for noise.
fn jitter(k: u64) -> f64 {
    let h = opdump_judge::intern::mix(k, 0x5eed);
    (h >> 11) as f64 / (1u64 << 53) as f64 * 2.0 - 1.0
}

/// Writes one synthetic training run: `side_b` false writes the reference
/// A, true writes B with the differences of `v`.
#[cfg(feature = "parquet")]
pub fn write_model(
    root: &Path,
    m: &Model,
    v: &Variant,
    side_b: bool,
    max_rows: u64,
) -> opdump_format::Result<u64> {
    write_model_rank(root, &RankOf::default(), m, v, side_b, max_rows)
}

/// One rank of a synthetic data-parallel run, for `opdump compare --rank
/// all` and `opdump ranks` at scale.
#[derive(Clone, Copy, Debug, Default)]
pub struct RankOf {
    /// The partition written, `rank=<rank>`.
    pub rank: u32,
    /// Name the parameters (the linear weights read in forward, and the
    /// optimizer's parameters and gradients) and give them fingerprints,
    /// the rows `opdump ranks` votes on.
    pub fingerprints: bool,
    /// This rank's gradient of the optimizer's first parameter differs at
    /// this step: the odd rank out.
    pub odd_grad_at: Option<i64>,
}

/// [`write_model`] as one rank of a multi-rank run.
#[cfg(feature = "parquet")]
pub fn write_model_rank(
    root: &Path,
    rank: &RankOf,
    m: &Model,
    v: &Variant,
    side_b: bool,
    max_rows: u64,
) -> opdump_format::Result<u64> {
    // Each rank its own pid, as processes of one job have.
    let pid = 4242 + rank.rank as i32;
    let w = DumpWriter::with_pid(root, rank.rank, "cpu", max_rows, pid);
    let mut run = SyntheticRun::new(w, m, v, side_b);
    run.rank = *rank;
    for step in 0..m.steps {
        run.training_step(step)?;
    }
    run.w.close()
}

/// The records [`write_model`] writes, kept in memory.
pub fn model_records(m: &Model, v: &Variant, side_b: bool) -> Vec<OpRecord> {
    let mut run = SyntheticRun::new(DumpWriter::in_memory(), m, v, side_b);
    for step in 0..m.steps {
        run.training_step(step).expect("in memory");
    }
    run.w.records()
}

/// One side of a synthetic run while it is written. Every op is one method,
/// so the order of the calls in the dump reads off `training_step`; the
/// values follow the residual stream ([`Val`]) from op to op.
struct SyntheticRun<'a> {
    w: DumpWriter,
    v: &'a Variant,
    side_b: bool,
    /// The dtype of every tensor on this side.
    dtype: &'static str,
    layers: usize,
    tokens: i64,
    hidden: i64,
    /// Values made so far: each new value draws its own noise.
    values_made: u64,
    /// Which rank this is, and whether parameters carry names.
    rank: RankOf,
}

impl<'a> SyntheticRun<'a> {
    fn new(w: DumpWriter, m: &Model, v: &'a Variant, side_b: bool) -> Self {
        let dtype = if side_b {
            v.dtype.unwrap_or("float32")
        } else {
            "float32"
        };
        SyntheticRun {
            w,
            v,
            side_b,
            dtype,
            layers: m.layers,
            tokens: m.tokens,
            hidden: m.hidden,
            values_made: 0,
            rank: RankOf::default(),
        }
    }

    /// `t` named `name` with the fingerprint `fp`, when this rank writes
    /// fingerprints; unchanged otherwise.
    fn named(&self, mut t: TensorRecord, name: String, fp: u64) -> TensorRecord {
        if self.rank.fingerprints {
            t.name = Some(name);
            t.fingerprint = Some(fp);
        }
        t
    }

    /// A parameter's fingerprint at a step: the same on every rank and
    /// side (the parameters are never updated in value, only in name).
    fn param_fp(id: u64, step: i64) -> u64 {
        opdump_judge::intern::mix(id, step as u64)
    }

    /// The shape of an activation.
    fn act(&self) -> [i64; 2] {
        [self.tokens, self.hidden]
    }

    /// The shape of a weight matrix.
    fn wgt(&self) -> [i64; 2] {
        [self.hidden, self.hidden]
    }

    /// A tensor of this side holding `val`: B sees the error and the NaN
    /// that A does not.
    fn tensor_of(&self, role: Role, arg: &str, shape: &[i64], val: Val) -> TensorRecord {
        let x = if self.side_b {
            val.x * (1.0 + val.err)
        } else {
            val.x
        };
        let mut tr = tensor(role, arg, self.dtype, shape, x);
        if self.side_b {
            tr.stats.nan_count = val.nan;
        }
        tr
    }

    fn input_of(&self, arg: &str, shape: &[i64], val: Val) -> TensorRecord {
        self.tensor_of(Role::Input, arg, shape, val)
    }

    fn output_of(&self, index: &str, shape: &[i64], val: Val) -> TensorRecord {
        self.tensor_of(Role::Output, index, shape, val)
    }

    /// The value after an op that scales by `f`: on B, rounding noise adds
    /// to the relative error.
    fn next_value(&mut self, val: Val, f: f64) -> Val {
        self.values_made += 1;
        let noise = if self.side_b {
            self.v.noise * jitter(self.values_made)
        } else {
            0.0
        };
        Val {
            x: val.x * f,
            err: val.err + noise,
            nan: val.nan,
        }
    }

    /// Forward over every layer, the loss, backward in reverse, and one
    /// optimizer step.
    fn training_step(&mut self, step: i64) -> opdump_format::Result<()> {
        self.w.step = step;
        self.w.phase = Phase::Forward;
        let mut cur = Val {
            x: 1.0,
            err: 0.0,
            nan: 0,
        };
        for layer in 0..self.layers {
            self.w.module = Some(format!("layers.{layer}"));
            cur = self.forward_layer(step, layer, cur)?;
        }
        self.w.module = None;
        let loss = self.loss(cur)?;
        self.w.phase = Phase::Backward;
        // The backward of every layer sees the last activation: the model
        // is a caricature, only the shapes and the flow of errors matter.
        let mut grad = Val {
            x: 1e-3,
            err: loss.err,
            nan: loss.nan,
        };
        for layer in (0..self.layers).rev() {
            self.w.module = Some(format!("layers.{layer}"));
            grad = self.backward_layer(grad, cur)?;
        }
        self.w.module = None;
        self.w.phase = Phase::Optimizer;
        self.optimizer(step, grad)
    }

    /// layer_norm, the qkv linear, attention, the proj linear, the residual
    /// add and gelu. Returns the layer's output.
    fn forward_layer(&mut self, step: i64, layer: usize, cur: Val) -> opdump_format::Result<Val> {
        let mut cur = self.layer_norm(cur)?;
        for (which, f) in [("qkv", 1.1), ("proj", 0.95)] {
            if self.extra_copy_before(layer, which) {
                self.cast_copy(cur)?;
            }
            cur = self.linear(step, layer, which, f, cur)?;
            if which == "qkv" {
                cur = self.attention(cur)?;
            }
        }
        cur = self.residual_add(cur)?;
        self.gelu(step, layer, cur)
    }

    /// layer_norm: a CPU kernel on A; decomposed on B when asked.
    fn layer_norm(&mut self, cur: Val) -> opdump_format::Result<Val> {
        let (act, h) = (self.act(), self.hidden);
        let args = format!("normalized_shape=[{h}], eps=1e-05");
        let ln = self.w.begin(
            "aten::layer_norm",
            "default",
            &args,
            vec![self.input_of("input", &act, cur)],
        );
        // A normalization: the scale resets, relative errors carry on.
        let next = self.next_value(Val { x: 1.0, ..cur }, 1.0);
        if self.side_b && self.v.decompose_layer_norm {
            self.layer_norm_decomposed(cur, next)?;
        } else {
            let outputs = vec![
                self.output_of("0", &act, next),
                self.output_of("1", &[self.tokens, 1], Val { x: 0.1, ..cur }),
            ];
            let inputs = vec![self.input_of("input", &act, cur)];
            self.w
                .leaf("aten::native_layer_norm", "default", &args, inputs, outputs)?;
        }
        let out = self.output_of("0", &act, next);
        self.w.end(ln, vec![out])?;
        Ok(next)
    }

    /// The mean, sub and mul another backend computes layer_norm with.
    fn layer_norm_decomposed(&mut self, cur: Val, next: Val) -> opdump_format::Result<()> {
        let act = self.act();
        let rows = [self.tokens, 1];
        let mean_v = Val {
            x: cur.x * 0.1,
            ..cur
        };
        let (inputs, outputs) = (
            vec![self.input_of("self", &act, cur)],
            vec![self.output_of("0", &rows, mean_v)],
        );
        self.w.leaf(
            "aten::mean",
            "dim",
            "dim=[-1], keepdim=True",
            inputs,
            outputs,
        )?;
        let (inputs, outputs) = (
            vec![
                self.input_of("self", &act, cur),
                self.input_of("other", &rows, mean_v),
            ],
            vec![self.output_of("0", &act, cur)],
        );
        self.w
            .leaf("aten::sub", "Tensor", "alpha=1", inputs, outputs)?;
        let (inputs, outputs) = (
            vec![self.input_of("self", &act, cur)],
            vec![self.output_of("0", &act, next)],
        );
        self.w.leaf("aten::mul", "Tensor", "", inputs, outputs)?;
        Ok(())
    }

    /// Whether B casts before this linear (`which` is "qkv" or "proj").
    fn extra_copy_before(&self, layer: usize, which: &str) -> bool {
        let linear_index = layer * 2 + (which == "proj") as usize;
        self.side_b
            && self
                .v
                .extra_copy_every
                .is_some_and(|n| linear_index.is_multiple_of(n))
    }

    /// A `_to_copy` to float32 that leaves the values as they are: an extra
    /// op on one side, with children, that alignment must skip.
    fn cast_copy(&mut self, cur: Val) -> opdump_format::Result<()> {
        let act = self.act();
        let c = self.w.begin(
            "aten::_to_copy",
            "default",
            "dtype=torch.float32",
            vec![self.input_of("self", &act, cur)],
        );
        let mut empty = self.output_of("0", &act, cur);
        empty.status = StatsStatus::Uninitialized;
        self.w
            .leaf("aten::empty_strided", "default", "", vec![], vec![empty])?;
        let (inputs, outputs) = (
            vec![self.input_of("src", &act, cur)],
            vec![self.output_of("0", &act, cur)],
        );
        self.w.leaf(
            "aten::copy_",
            "default",
            "non_blocking=False",
            inputs,
            outputs,
        )?;
        let out = self.output_of("0", &act, cur);
        self.w.end(c, vec![out])?;
        Ok(())
    }

    /// `linear` over `t` and `addmm`; the planted fault is in the proj
    /// `addmm` of B (its parent `linear` then diverges too).
    fn linear(
        &mut self,
        step: i64,
        layer: usize,
        which: &str,
        f: f64,
        cur: Val,
    ) -> opdump_format::Result<Val> {
        let (act, wgt, h) = (self.act(), self.wgt(), self.hidden);
        let lin = self.w.begin(
            "aten::linear",
            "default",
            "",
            vec![
                self.input_of("input", &act, cur),
                self.named(
                    self.input_of("weight", &wgt, PARAMS),
                    format!("layers.{layer}.{which}.weight"),
                    Self::param_fp((layer * 2 + usize::from(which == "proj")) as u64, step),
                ),
                self.input_of("bias", &[h], PARAMS),
            ],
        );
        let mut next = self.next_value(cur, f);
        if self.side_b && which == "proj" {
            if let Some((s, l, rel)) = self.v.fault {
                if s == step && l == layer {
                    next.err = (1.0 + next.err) * (1.0 + rel) - 1.0;
                }
            }
        }
        let (inputs, outputs) = (
            vec![self.input_of("self", &wgt, PARAMS)],
            vec![self.output_of("0", &wgt, PARAMS)],
        );
        self.w.leaf("aten::t", "default", "", inputs, outputs)?;
        let (inputs, outputs) = (
            vec![
                self.input_of("self", &[h], PARAMS),
                self.input_of("mat1", &act, cur),
                self.input_of("mat2", &wgt, PARAMS),
            ],
            vec![self.output_of("0", &act, next)],
        );
        self.w
            .leaf("aten::addmm", "default", "beta=1, alpha=1", inputs, outputs)?;
        let out = self.output_of("0", &act, next);
        self.w.end(lin, vec![out])?;
        Ok(next)
    }

    /// A `view` (values unchanged) and `softmax` over `_softmax`.
    fn attention(&mut self, cur: Val) -> opdump_format::Result<Val> {
        let (act, t, h) = (self.act(), self.tokens, self.hidden);
        let (inputs, outputs) = (
            vec![self.input_of("self", &act, cur)],
            vec![self.output_of("0", &act, cur)],
        );
        self.w.leaf(
            "aten::view",
            "default",
            &format!("size=[{t}, {h}]"),
            inputs,
            outputs,
        )?;
        let sm = self.w.begin(
            "aten::softmax",
            "int",
            "dim=-1",
            vec![self.input_of("self", &act, cur)],
        );
        let next = self.next_value(cur, 0.5);
        let (inputs, outputs) = (
            vec![self.input_of("self", &act, cur)],
            vec![self.output_of("0", &act, next)],
        );
        self.w.leaf(
            "aten::_softmax",
            "default",
            "dim=-1, half_to_float=False",
            inputs,
            outputs,
        )?;
        let out = self.output_of("0", &act, next);
        self.w.end(sm, vec![out])?;
        Ok(next)
    }

    fn residual_add(&mut self, cur: Val) -> opdump_format::Result<Val> {
        let act = self.act();
        let next = self.next_value(cur, 1.05);
        let (inputs, outputs) = (
            vec![
                self.input_of("self", &act, cur),
                self.input_of("other", &act, cur),
            ],
            vec![self.output_of("0", &act, next)],
        );
        self.w
            .leaf("aten::add", "Tensor", "alpha=1", inputs, outputs)?;
        Ok(next)
    }

    /// gelu, where B may plant NaN, or leave the call out.
    fn gelu(&mut self, step: i64, layer: usize, cur: Val) -> opdump_format::Result<Val> {
        // A dropped gelu is fused elsewhere: the values go on as if it ran.
        let dropped = self.side_b && self.v.drop_gelu_every.is_some_and(|n| layer % n == n - 1);
        let mut next = self.next_value(cur, 0.7);
        if self.side_b {
            if let Some((s, l, nan)) = self.v.nan {
                if s == step && l == layer {
                    next.nan = nan;
                }
            }
        }
        if !dropped {
            let act = self.act();
            let (inputs, outputs) = (
                vec![self.input_of("self", &act, cur)],
                vec![self.output_of("0", &act, next)],
            );
            self.w.leaf(
                "aten::gelu",
                "default",
                "approximate='none'",
                inputs,
                outputs,
            )?;
        }
        Ok(next)
    }

    /// cross_entropy_loss over log_softmax and nll_loss_nd; returns the
    /// scalar loss.
    fn loss(&mut self, cur: Val) -> opdump_format::Result<Val> {
        let vocab = [self.tokens, 4 * self.hidden];
        let ce = self.w.begin(
            "aten::cross_entropy_loss",
            "default",
            "reduction=Mean",
            vec![self.input_of("self", &vocab, cur)],
        );
        let ls = self.w.begin(
            "aten::log_softmax",
            "int",
            "dim=1",
            vec![self.input_of("self", &vocab, cur)],
        );
        let lsv = self.next_value(cur, 2.0);
        let (inputs, outputs) = (
            vec![self.input_of("self", &vocab, cur)],
            vec![self.output_of("0", &vocab, lsv)],
        );
        self.w.leaf(
            "aten::_log_softmax",
            "default",
            "dim=1, half_to_float=False",
            inputs,
            outputs,
        )?;
        let out = self.output_of("0", &vocab, lsv);
        self.w.end(ls, vec![out])?;
        let loss = self.next_value(lsv, 0.3);
        let nl = self.w.begin(
            "aten::nll_loss_nd",
            "default",
            "reduction=Mean",
            vec![self.input_of("self", &vocab, lsv)],
        );
        let (inputs, outputs) = (
            vec![self.input_of("self", &vocab, lsv)],
            vec![self.output_of("0", &[], loss)],
        );
        self.w.leaf(
            "aten::nll_loss_forward",
            "default",
            "reduction=1, ignore_index=-100",
            inputs,
            outputs,
        )?;
        let out = self.output_of("0", &[], loss);
        self.w.end(nl, vec![out])?;
        let out = self.output_of("0", &[], loss);
        self.w.end(ce, vec![out])?;
        Ok(loss)
    }

    /// The backward of one layer, from the gradient `grad` and the layer's
    /// activation `cur`; returns the gradient of its input.
    fn backward_layer(&mut self, grad: Val, cur: Val) -> opdump_format::Result<Val> {
        let (act, wgt, t, h) = (self.act(), self.wgt(), self.tokens, self.hidden);
        let mut g = grad;
        let next = self.next_value(g, 1.01);
        let (inputs, outputs) = (
            vec![
                self.input_of("grad_output", &act, g),
                self.input_of("self", &act, cur),
            ],
            vec![self.output_of("0", &act, next)],
        );
        self.w.leaf(
            "aten::gelu_backward",
            "default",
            "approximate='none'",
            inputs,
            outputs,
        )?;
        g = next;
        // The weight's gradient, then the input's.
        let gw = self.next_value(g, 3.0);
        let (inputs, outputs) = (
            vec![
                self.input_of("self", &[h, t], g),
                self.input_of("mat2", &act, cur),
            ],
            vec![self.output_of("0", &wgt, gw)],
        );
        self.w.leaf("aten::mm", "default", "", inputs, outputs)?;
        let next = self.next_value(g, 0.98);
        let (inputs, outputs) = (
            vec![
                self.input_of("self", &act, g),
                self.input_of("mat2", &wgt, PARAMS),
            ],
            vec![self.output_of("0", &act, next)],
        );
        self.w.leaf("aten::mm", "default", "", inputs, outputs)?;
        g = next;
        // The bias's gradient.
        let gb = self.next_value(g, 5.0);
        let (inputs, outputs) = (
            vec![self.input_of("self", &act, g)],
            vec![self.output_of("0", &[1, h], gb)],
        );
        self.w.leaf(
            "aten::sum",
            "dim_IntList",
            "dim=[0], keepdim=True",
            inputs,
            outputs,
        )?;
        let next = self.next_value(g, 1.0);
        let (inputs, outputs) = (
            vec![
                self.input_of("grad_output", &act, g),
                self.input_of("output", &act, cur),
            ],
            vec![self.output_of("0", &act, next)],
        );
        self.w.leaf(
            "aten::_softmax_backward_data",
            "default",
            "dim=-1",
            inputs,
            outputs,
        )?;
        g = next;
        // The normalization's backward resets the scale (no underflow
        // over thousands of layers).
        let next = self.next_value(Val { x: 1e-3, ..g }, 1.0);
        let (inputs, outputs) = (
            vec![
                self.input_of("grad_out", &act, g),
                self.input_of("input", &act, cur),
            ],
            vec![self.output_of("0", &act, next)],
        );
        self.w.leaf(
            "aten::native_layer_norm_backward",
            "default",
            "normalized_shape=[4]",
            inputs,
            outputs,
        )?;
        Ok(next)
    }

    /// One foreach op over a list of parameters: p - lr * g.
    fn optimizer(&mut self, step: i64, grad: Val) -> opdump_format::Result<()> {
        let wgt = self.wgt();
        let n_params = 4;
        // The update's relative error is a small part of the gradient's.
        let update = Val {
            x: 0.0199,
            err: grad.err * 0.05,
            nan: grad.nan,
        };
        let listed = |mut t: TensorRecord, p: i32| {
            t.list_index = Some(p);
            t
        };
        // Ids past the layers' weights (`linear`), so no two names share one.
        let param_id = |p: i32| (1 << 32) + p as u64;
        let odd = |p: i32| p == 0 && self.rank.odd_grad_at == Some(step);
        let param = |p: i32, s: i64, t: TensorRecord| {
            self.named(t, format!("opt.{p}"), Self::param_fp(param_id(p), s))
        };
        let params = (0..n_params).map(|p| {
            let t = param(p, step, self.input_of("self", &wgt, PARAMS));
            listed(t, p)
        });
        let grads = (0..n_params).map(|p| {
            let fp = Self::param_fp(param_id(p) ^ (1 << 40), step) ^ u64::from(odd(p));
            let t = self.named(
                self.input_of("other", &wgt, grad),
                format!("opt.{p}.grad"),
                fp,
            );
            listed(t, p)
        });
        let inputs: Vec<TensorRecord> = params.chain(grads).collect();
        let outputs: Vec<TensorRecord> = (0..n_params)
            .map(|p| listed(param(p, step + 1, self.output_of("self", &wgt, update)), p))
            .collect();
        self.w.leaf(
            "aten::_foreach_add_",
            "List",
            "alpha=-0.001",
            inputs,
            outputs,
        )?;
        Ok(())
    }
}
