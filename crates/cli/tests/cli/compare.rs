//! `opdump compare` end to end on synthetic training runs written to disk:
//! the exit status, the JSON report's fields, the Parquet and HTML reports,
//! the options (steps, ignore, rtol, rank) and dumps split over partitions
//! and processes. The verdicts themselves are tested in crates/judge/tests.

use std::path::Path;

use crate::common::*;
use opdump_testkit::synth::{input, output, DumpWriter, Variant};
use serde_json::Value;

fn noisy() -> Variant {
    Variant {
        noise: 1e-8,
        ..Default::default()
    }
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
