//! `opdump compare` end to end on synthetic training runs: planted faults
//! must be named, by op and seq, as the first introduced divergence, with
//! downstream ops inherited; fault-free runs (identical, cross-device noise,
//! bf16 against fp32) must introduce nothing.

mod common;

use std::path::Path;

use common::*;
use opdump_judge::compare::Compared;
use opdump_judge::verdict::OpVerdict;
use opdump_testkit::synth::{input, output, DumpWriter, Variant};
use serde_json::Value;

fn compared(a: &Path, b: &Path) -> Compared {
    compare_dirs(a, b)
}

/// Seqs (A side) of the aligned ops with a given verdict.
fn with_verdict(c: &Compared, v: OpVerdict) -> Vec<i64> {
    (0..c.alignment.pairs.len())
        .filter(|&k| c.op_verdict(k) == v)
        .map(|k| c.a.seq(c.alignment.pairs[k].a))
        .collect()
}

/// The proj linear of (step, layer) and its addmm, in a dump.
fn planted_site(dir: &Path, step: i64, layer: usize) -> (i64, i64) {
    let recs = records(dir);
    let lin = nth_root(&recs, step, "aten::linear", 2 * layer + 1);
    (lin, child(&recs, lin, "aten::addmm"))
}

fn check_fault(rel: f64, variant: Variant) {
    let t = tmp();
    let (step, layer) = (1, 3);
    let v = Variant {
        fault: Some((step, layer, rel)),
        ..variant
    };
    let (a, b) = model_pair(t.path(), &small_model(), &v);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{j}");
    let (lin_a, addmm_a) = planted_site(&a, step, layer);
    let (lin_b, addmm_b) = planted_site(&b, step, layer);
    let fi = &j["first_introduced"];
    assert_eq!(fi["op"], "aten::addmm", "{fi}");
    assert_eq!(fi["overload"], "default");
    assert_eq!(fi["seq_a"], addmm_a);
    assert_eq!(fi["seq_b"], addmm_b);
    assert_eq!(fi["step_a"], step);
    assert_eq!(fi["step_b"], step);
    assert_eq!(fi["depth"], 1);
    assert_eq!(fi["verdict"], "introduced");
    assert_eq!(fi["ancestors"][0]["op"], "aten::linear");
    assert_eq!(fi["ancestors"][0]["seq_a"], lin_a);
    assert_eq!(fi["ancestors"][0]["seq_b"], lin_b);
    let err = fi["rel_err"].as_f64().expect("rel_err");
    let expect = rel.abs() / (1.0 + rel.min(0.0));
    assert!(
        (err - expect).abs() < 0.05 * expect,
        "rel_err {err} for a fault of {rel}"
    );
    // The first divergence is the parent linear (entered first).
    assert_eq!(j["first_divergence"]["seq_a"], lin_a);
    // Nothing else introduced an error; everything downstream inherited it.
    let c = compared(&a, &b);
    assert_eq!(
        with_verdict(&c, OpVerdict::Introduced),
        vec![lin_a, addmm_a]
    );
    let inherited = with_verdict(&c, OpVerdict::Inherited);
    assert!(!inherited.is_empty());
    assert!(
        inherited.iter().all(|&s| s > addmm_a),
        "inherited before the fault: {inherited:?}"
    );
    let recs = records(&a);
    let next_add = recs
        .iter()
        .find(|r| r.seq > addmm_a && r.op == "aten::add" && r.depth == 0)
        .expect("add after the fault")
        .seq;
    assert!(
        inherited.contains(&next_add),
        "the residual add after the fault is not inherited"
    );
    assert_eq!(j["top_introduced"].as_array().map(|v| v.len()), Some(1));
    assert_eq!(j["top_introduced"][0]["op"], "aten::addmm");
}

fn noisy() -> Variant {
    Variant {
        noise: 1e-8,
        ..Default::default()
    }
}

#[test]
fn one_percent_fault_is_named_with_downstream_inherited() {
    check_fault(0.01, noisy());
}

#[test]
fn twofold_fault_is_named() {
    check_fault(1.0, noisy());
}

#[test]
fn small_float32_fault_is_caught() {
    check_fault(1e-3, noisy());
}

#[test]
fn fault_is_named_despite_copies_missing_ops_and_other_decompositions() {
    check_fault(
        0.01,
        Variant {
            extra_copy_every: Some(3),
            drop_gelu_every: Some(4),
            decompose_layer_norm: true,
            ..noisy()
        },
    );
}

#[test]
fn identical_runs_exit_0() {
    let t = tmp();
    let (a, b) = model_pair(t.path(), &small_model(), &Variant::default());
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 0);
    assert_eq!(j["first_divergence"], Value::Null);
    assert_eq!(j["first_introduced"], Value::Null);
    assert_eq!(j["divergence"], false);
    let tv = &j["tensor_verdicts"];
    assert_eq!(tv["close"], 0);
    assert_eq!(tv["diverged"], 0);
    assert!(tv["stats_equal"].as_u64().unwrap_or(0) > 0);
    // A dump against itself, in text form.
    let r = run(&["compare", path_str(&a), path_str(&a)]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    assert!(r.stdout.contains("no divergence"), "{}", r.stdout);
}

#[test]
fn fault_free_cross_device_noise_introduces_nothing() {
    let t = tmp();
    // Rounding differences in every op, accumulating along the network.
    let v = Variant {
        noise: 3e-7,
        extra_copy_every: Some(5),
        decompose_layer_norm: true,
        ..Default::default()
    };
    let (a, b) = model_pair(t.path(), &small_model(), &v);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(
        j["first_introduced"],
        Value::Null,
        "{}",
        j["first_introduced"]
    );
    assert_eq!(j["op_verdicts"]["introduced"], 0);
    assert_eq!(code, 0, "first divergence: {}", j["first_divergence"]);
}

#[test]
fn bf16_against_fp32_introduces_nothing() {
    let t = tmp();
    let v = Variant {
        dtype: Some("bfloat16"),
        noise: 2e-3,
        ..Default::default()
    };
    let (a, b) = model_pair(t.path(), &small_model(), &v);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(
        j["op_verdicts"]["introduced"], 0,
        "{}",
        j["first_introduced"]
    );
    assert!(j["aligned"]["dtype_differs"].as_u64().unwrap_or(0) > 0);
    // A dtype difference alone is no divergence.
    assert_eq!(
        j["tensor_verdicts"]["diverged"], 0,
        "{}",
        j["first_divergence"]
    );
    assert_eq!(code, 0);
}

#[test]
fn bf16_against_fp32_still_catches_a_twofold_fault() {
    let t = tmp();
    let v = Variant {
        dtype: Some("bfloat16"),
        noise: 2e-3,
        fault: Some((2, 1, 1.0)),
        ..Default::default()
    };
    let (a, b) = model_pair(t.path(), &small_model(), &v);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1);
    let (_, addmm_a) = planted_site(&a, 2, 1);
    assert_eq!(
        j["first_introduced"]["seq_a"], addmm_a,
        "{}",
        j["first_introduced"]
    );
}

#[test]
fn nan_appearing_is_introduced_at_its_op() {
    let t = tmp();
    let (step, layer) = (2, 4);
    let v = Variant {
        nan: Some((step, layer, 7)),
        ..noisy()
    };
    let (a, b) = model_pair(t.path(), &small_model(), &v);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1);
    let recs = records(&a);
    let gelu = nth_root(&recs, step, "aten::gelu", layer);
    let fi = &j["first_introduced"];
    assert_eq!(fi["op"], "aten::gelu");
    assert_eq!(fi["seq_a"], gelu);
    assert_eq!(fi["rel_err"], Value::Null, "infinite error is null");
    let out = fi["tensors"]
        .as_array()
        .expect("tensors")
        .iter()
        .find(|t| t["role"] == "output")
        .cloned();
    let out = out.expect("an output");
    assert_eq!(out["verdict"], "nan_mismatch");
    assert_eq!(out["b"]["nan_count"], 7);
    let c = compared(&a, &b);
    assert_eq!(with_verdict(&c, OpVerdict::Introduced), vec![gelu]);
}

#[test]
fn random_and_discontinuous_ops_are_not_faults() {
    let t = tmp();
    let write = |dir: &Path, side_b: bool| {
        let mut w = DumpWriter::new(dir, 0, "cpu");
        let x = |s: f64| input("self", "float32", &[16], s);
        w.leaf(
            "aten::mul",
            "Tensor",
            "",
            vec![x(1.0)],
            vec![output(0, "float32", &[16], 1.0)],
        )
        .unwrap();
        // Two devices, two generators.
        let r = if side_b { 0.7 } else { 0.5 };
        w.leaf(
            "aten::normal_",
            "default",
            "mean=0, std=1",
            vec![x(1.0)],
            vec![output(0, "float32", &[16], r)],
        )
        .unwrap();
        // argmax of close inputs may pick another index.
        let idx = if side_b { 3.0 } else { 2.0 };
        w.leaf(
            "aten::argmax",
            "default",
            "dim=-1",
            vec![x(1.0)],
            vec![output(0, "int64", &[1], idx)],
        )
        .unwrap();
        let e = if side_b { 1.0 } else { 2.0 };
        w.leaf(
            "aten::eq",
            "Tensor",
            "",
            vec![x(1.0), input("other", "float32", &[16], 1.0)],
            vec![output(0, "bool", &[16], e)],
        )
        .unwrap();
        w.leaf(
            "aten::relu",
            "default",
            "",
            vec![x(1.0)],
            vec![output(0, "float32", &[16], 1.0)],
        )
        .unwrap();
        w.close().unwrap();
    };
    write(&t.path().join("a"), false);
    write(&t.path().join("b"), true);
    let (code, j, _) = compare_json(&t.path().join("a"), &t.path().join("b"), &[]);
    assert_eq!(j["first_introduced"], Value::Null);
    assert_eq!(j["first_divergence"], Value::Null);
    assert_eq!(j["op_verdicts"]["rng"], 1);
    assert_eq!(j["op_verdicts"]["discontinuous"], 2);
    assert_eq!(j["tensor_verdicts"]["rng"], 1);
    assert_eq!(j["tensor_verdicts"]["discontinuous"], 2);
    assert_eq!(code, 0);
}

#[test]
fn consumers_of_random_outputs_inherit() {
    let t = tmp();
    let write = |dir: &Path, side_b: bool| {
        let mut w = DumpWriter::new(dir, 0, "cpu");
        let r = if side_b { 0.7 } else { 0.5 };
        w.leaf(
            "aten::bernoulli_",
            "float",
            "p=0.5",
            vec![input("self", "float32", &[16], 1.0)],
            vec![output(0, "float32", &[16], r)],
        )
        .unwrap();
        w.leaf(
            "aten::mul",
            "Tensor",
            "",
            vec![
                input("self", "float32", &[16], 1.0),
                input("other", "float32", &[16], r),
            ],
            vec![output(0, "float32", &[16], r * 2.0)],
        )
        .unwrap();
        w.close().unwrap();
    };
    write(&t.path().join("a"), false);
    write(&t.path().join("b"), true);
    let (code, j, _) = compare_json(&t.path().join("a"), &t.path().join("b"), &[]);
    assert_eq!(
        j["first_introduced"],
        Value::Null,
        "{}",
        j["first_introduced"]
    );
    assert_eq!(j["first_divergence"]["op"], "aten::mul");
    assert_eq!(j["first_divergence"]["verdict"], "inherited");
    // A divergence no op introduced: exit status 3, not 1.
    assert_eq!(code, 3);
}

#[test]
fn json_has_the_stable_fields() {
    let t = tmp();
    let v = Variant {
        fault: Some((0, 2, 0.05)),
        ..noisy()
    };
    let (a, b) = model_pair(t.path(), &small_model(), &v);
    let (_, j, _) = compare_json(&a, &b, &[]);
    for k in [
        "dump_a",
        "dump_b",
        "aligned",
        "only_in_a",
        "only_in_b",
        "tensor_verdicts",
        "op_verdicts",
        "divergence",
        "exit_status",
        "first_divergence",
        "first_introduced",
        "headline",
        "headline_rule",
        "top_introduced",
    ] {
        assert!(j.get(k).is_some(), "missing {k}");
    }
    for k in [
        "op",
        "overload",
        "seq_a",
        "seq_b",
        "step_a",
        "step_b",
        "depth",
        "ancestors",
        "verdict",
        "rel_err",
        "tolerance",
        "input_rel_err",
        "amplification",
        "tensors",
        "parent_a",
        "parent_b",
        "args_a",
        "args_b",
    ] {
        assert!(
            j["first_introduced"].get(k).is_some(),
            "first_introduced lacks {k}"
        );
        assert!(
            j["first_divergence"].get(k).is_some(),
            "first_divergence lacks {k}"
        );
    }
    let t0 = &j["first_introduced"]["tensors"][0];
    for k in [
        "role",
        "arg",
        "list_index",
        "verdict",
        "dtype_a",
        "dtype_b",
        "shape_a",
        "shape_b",
        "a",
        "b",
        "abs_bound",
        "rel_l2",
        "rel_linf",
        "rel_err",
        "tolerance",
    ] {
        assert!(t0.get(k).is_some(), "tensor lacks {k}");
    }
    assert_eq!(j["first_introduced"]["parent_a"]["op"], "aten::linear");
}

#[test]
fn out_dir_and_html() {
    let t = tmp();
    let v = Variant {
        fault: Some((1, 1, 0.02)),
        ..noisy()
    };
    let (a, b) = model_pair(t.path(), &small_model(), &v);
    let out = t.path().join("out");
    let html = t.path().join("r.html");
    let (code, j, _) = compare_json(
        &a,
        &b,
        &["--out", path_str(&out), "--html", path_str(&html)],
    );
    assert_eq!(code, 1);
    // compare.parquet: one row per aligned tensor pair.
    let f = std::fs::File::open(out.join("compare.parquet")).expect("compare.parquet");
    let reader = parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder::try_new(f)
        .unwrap()
        .build()
        .unwrap();
    let mut rows = 0;
    let mut introduced_rows = 0;
    for batch in reader {
        let batch = batch.unwrap();
        rows += batch.num_rows();
        let v = batch.column_by_name("op_verdict").unwrap();
        let v = arrow_array::cast::AsArray::as_string::<i32>(v.as_ref());
        introduced_rows += v.iter().filter(|s| *s == Some("introduced")).count();
        for c in [
            "seq_a",
            "seq_b",
            "min_a",
            "min_b",
            "l2_a",
            "l2_b",
            "rel_err",
            "tolerance",
            "verdict",
        ] {
            assert!(
                batch.column_by_name(c).is_some(),
                "compare.parquet lacks {c}"
            );
        }
    }
    assert_eq!(rows as u64, j["aligned"]["tensor_pairs"].as_u64().unwrap());
    assert!(introduced_rows > 0);
    assert!(out.join("compare.json").exists());
    let page = std::fs::read_to_string(&html).expect("html");
    assert!(page.contains("<svg") && page.contains("first introduced"));
    assert!(
        !page.contains("http://")
            || page.matches("http://").count()
                == page.matches("http://www.w3.org/2000/svg").count(),
        "no network references"
    );
    assert!(page.contains("aten::addmm"));
}

#[test]
fn steps_and_ignore_filter() {
    let t = tmp();
    let v = Variant {
        fault: Some((1, 0, 0.05)),
        extra_copy_every: Some(2),
        ..noisy()
    };
    let (a, b) = model_pair(t.path(), &small_model(), &v);
    // Step 2 only: the fault is in step 1.
    let (code, j, _) = compare_json(&a, &b, &["--steps", "2"]);
    assert_eq!(code, 0, "{}", j["first_divergence"]);
    let (code, _, _) = compare_json(&a, &b, &["--steps", "0-1"]);
    assert_eq!(code, 1);
    // Ignoring the copies leaves nothing only in B.
    let (_, j, _) = compare_json(&a, &b, &["--ignore", "_to_copy"]);
    assert_eq!(j["only_in_b"]["op_calls"], 0, "{}", j["only_in_b"]);
    assert!(j["aligned"]["ignored_b"].as_u64().unwrap() > 0);
}

#[test]
fn rtol_override_changes_the_verdict() {
    let t = tmp();
    let v = Variant {
        fault: Some((1, 1, 1e-3)),
        ..noisy()
    };
    let (a, b) = model_pair(t.path(), &small_model(), &v);
    let (code, _, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1);
    let (code, j, _) = compare_json(&a, &b, &["--rtol", "float32=1e-2"]);
    assert_eq!(code, 0, "{}", j["first_divergence"]);
}

/// Writes `n` calls of a chain of relus; `device_of(k)` picks the partition
/// of call k; `x(k)` its output scale.
fn write_chain(
    root: &Path,
    rank: u32,
    pid: i32,
    n: usize,
    device_of: impl Fn(usize) -> &'static str,
    x: impl Fn(usize) -> f64,
) {
    let mut writers: std::collections::BTreeMap<&str, DumpWriter> =
        std::collections::BTreeMap::new();
    for k in 0..n {
        let dev = device_of(k);
        let w = writers
            .entry(dev)
            .or_insert_with(|| DumpWriter::with_pid(root, rank, dev, 500_000, pid));
        w.set_next_seq(k as i64);
        let prev = if k == 0 { 1.0 } else { x(k - 1) };
        w.leaf(
            "aten::relu",
            "default",
            "",
            vec![input("self", "float32", &[8], prev)],
            vec![output(0, "float32", &[8], x(k))],
        )
        .unwrap();
    }
    for (_, w) in writers {
        w.close().unwrap();
    }
}

#[test]
fn partitions_of_one_rank_merge_in_seq_order() {
    let t = tmp();
    let x = |k: usize| 1.0 + k as f64;
    write_chain(&t.path().join("a"), 0, 7, 40, |_| "cpu", x);
    // B: calls alternate between two devices; call 25 is 1% off.
    let xb = move |k: usize| if k == 25 { x(k) * 1.01 } else { x(k) };
    write_chain(
        &t.path().join("b"),
        0,
        7,
        40,
        |k| if k % 3 == 0 { "cpu" } else { "testdev_0" },
        xb,
    );
    let (code, j, _) = compare_json(&t.path().join("a"), &t.path().join("b"), &[]);
    assert_eq!(code, 1);
    assert_eq!(j["aligned"]["op_calls"], 40);
    assert_eq!(j["first_introduced"]["seq_a"], 25);
    assert_eq!(j["first_introduced"]["seq_b"], 25);
}

#[test]
fn ranks_and_other_processes() {
    let t = tmp();
    let x = |k: usize| 1.0 + k as f64;
    for side in ["a", "b"] {
        for rank in [0, 1] {
            write_chain(&t.path().join(side), rank, 7, 30, |_| "cpu", x);
        }
    }
    // A second process in B's rank 1 (a DataLoader worker) is left out.
    write_chain(&t.path().join("b"), 1, 99, 5, |_| "cpu", |_| 3.0);
    let (code, j, _) = compare_json(&t.path().join("a"), &t.path().join("b"), &[]);
    assert_eq!(code, 0);
    assert_eq!(j["dump_a"]["rank"], 0);
    assert!(j["notes"].to_string().contains("--rank"), "{}", j["notes"]);
    let (code, j, _) = compare_json(&t.path().join("a"), &t.path().join("b"), &["--rank", "1"]);
    assert_eq!(code, 0, "{}", j["first_divergence"]);
    assert_eq!(j["dump_b"]["rank"], 1);
    assert_eq!(j["dump_b"]["op_calls"], 30);
    assert!(
        j["notes"].to_string().contains("other processes"),
        "{}",
        j["notes"]
    );
}

#[test]
fn steps_numbered_differently_still_align() {
    let t = tmp();
    let m = small_model();
    let (a, _) = model_pair(t.path(), &m, &Variant::default());
    // B dumped from step 10 on.
    let b = t.path().join("b10");
    let mut w = opdump_format::RotatingWriter::new(
        b.join("rank=0").join("device=cpu"),
        "part-4242",
        Default::default(),
        vec![],
    );
    for mut r in records(&a) {
        r.step += 10;
        w.append(&r).unwrap();
    }
    w.close_file().unwrap();
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 0, "{}", j["notes"]);
    assert!(
        j["notes"].to_string().contains("share no step"),
        "{}",
        j["notes"]
    );
    assert_eq!(j["aligned"]["op_calls"], j["dump_a"]["op_calls"]);
}

#[test]
fn scratch_differences_inside_an_agreeing_op_are_absorbed() {
    // layer_norm_backward sizes a scratch buffer by the thread count: the
    // calls inside differ in shape, its result does not.
    let t = tmp();
    let write = |dir: &Path, chunks: i64| {
        let mut w = DumpWriter::new(dir, 0, "cpu");
        let g = || input("grad_out", "float32", &[4, 8], 1.0);
        let p = w.begin("aten::native_layer_norm_backward", "default", "", vec![g()]);
        let mut empty = input("self", "float32", &[0], 1.0);
        empty.status = opdump_format::StatsStatus::Uninitialized;
        let mut scratch = output(0, "float32", &[chunks, 8], 1.0);
        scratch.status = opdump_format::StatsStatus::Uninitialized;
        w.leaf(
            "aten::resize_",
            "default",
            &format!("size=[{chunks}, 8]"),
            vec![empty],
            vec![scratch.clone()],
        )
        .unwrap();
        let mut zeroed = output(0, "float32", &[chunks, 8], 0.0);
        zeroed.stats = opdump_format::Stats {
            zero_count: chunks * 8,
            ..opdump_testkit::synth::stats_for(chunks * 8, 0.0)
        };
        let mut s_in = scratch.clone();
        s_in.role = opdump_format::Role::Input;
        s_in.arg = "self".into();
        w.leaf("aten::zero_", "default", "", vec![s_in], vec![zeroed])
            .unwrap();
        w.end(p, vec![output(0, "float32", &[4, 8], 0.5)]).unwrap();
        w.close().unwrap();
    };
    write(&t.path().join("a"), 4);
    write(&t.path().join("b"), 2);
    let (code, j, _) = compare_json(&t.path().join("a"), &t.path().join("b"), &[]);
    assert_eq!(j["op_verdicts"]["absorbed"], 1, "{}", j["op_verdicts"]);
    assert_eq!(
        j["first_divergence"],
        Value::Null,
        "{}",
        j["first_divergence"]
    );
    assert_eq!(code, 0);
}

#[test]
fn an_error_hidden_from_the_statistics_is_still_inherited() {
    // mul is 1e-3 off; the next op's output hides it from its statistics
    // (a lower bound), and a sum reveals it again: the sum inherited it.
    let t = tmp();
    let write = |dir: &Path, side_b: bool| {
        let mut w = DumpWriter::new(dir, 0, "cpu");
        let e = |rel: f64| if side_b { 1.0 + rel } else { 1.0 };
        let v = |x: f64| input("self", "float32", &[64, 64], x);
        w.leaf(
            "aten::mul",
            "Tensor",
            "",
            vec![v(1.0)],
            vec![output(0, "float32", &[64, 64], 2.0 * e(1e-3))],
        )
        .unwrap();
        w.leaf(
            "aten::tanh",
            "default",
            "",
            vec![v(2.0 * e(1e-3))],
            vec![output(0, "float32", &[64, 64], 3.0 * e(1e-8))],
        )
        .unwrap();
        w.leaf(
            "aten::sum",
            "dim_IntList",
            "dim=[0]",
            vec![v(3.0 * e(1e-8))],
            vec![output(0, "float32", &[64], 4.0 * e(5e-4))],
        )
        .unwrap();
        w.close().unwrap();
    };
    write(&t.path().join("a"), false);
    write(&t.path().join("b"), true);
    let (code, j, _) = compare_json(&t.path().join("a"), &t.path().join("b"), &[]);
    assert_eq!(code, 1);
    assert_eq!(j["first_introduced"]["op"], "aten::mul");
    assert_eq!(j["op_verdicts"]["introduced"], 1, "{}", j["top_introduced"]);
    assert_eq!(j["op_verdicts"]["inherited"], 1);
}
