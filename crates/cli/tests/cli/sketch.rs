//! The fingerprint and the error sketch in `opdump compare`'s files, on
//! synthetic dumps whose every tensor holds real float32 values
//! (`synth_chain.rs`): the reports carry the estimate, and dumps of schema
//! 3 (without the columns) compare as before. The verdicts the sketch and
//! the fingerprint make are tested in crates/judge/tests.

use std::path::Path;

use crate::common::{compare_json, load_one, path_str, tmp};
use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::Array;
use opdump_format::Role;
use opdump_testkit::schema3::strip_to_schema_3;
use opdump_testkit::synth::DumpWriter;
use opdump_testkit::synth_chain::{tensor_of, uniform, write_pair, Chain, Change};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use serde_json::Value;

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

/// The tensors of the report's first introduced op.
fn output_of_first_introduced(j: &Value) -> &Value {
    j["first_introduced"]["tensors"]
        .as_array()
        .unwrap()
        .iter()
        .find(|t| t["role"] == "output")
        .unwrap()
}

#[test]
fn the_parquet_report_carries_the_sketch_estimate() {
    let dir = tmp();
    write_pair(
        dir.path(),
        &chain(Some((FAULTED, Change::Permute)), Some(16)),
    )
    .unwrap();
    let (code, j, err) = compare_json(
        &dir.path().join("a"),
        &dir.path().join("b"),
        &["--out", path_str(&dir.path().join("out"))],
    );
    assert_eq!(code, 1, "{err}");
    let out = output_of_first_introduced(&j);
    assert_eq!(out["evidence"], "sketch");
    assert_eq!(out["sketch"]["k"], 16);
    let rel = out["sketch"]["rel"].as_f64().unwrap();
    assert!((0.7..2.8).contains(&rel), "{out:#}");
    // The Parquet report carries the estimate next to the bound.
    let file = std::fs::File::open(dir.path().join("out/compare.parquet")).unwrap();
    let rows = ParquetRecordBatchReaderBuilder::try_new(file)
        .unwrap()
        .build()
        .unwrap()
        .map(|b| b.unwrap());
    let (mut with_sketch, mut identical) = (0, 0);
    for b in rows {
        let rel = b
            .column_by_name("sketch_rel")
            .unwrap()
            .as_primitive::<Float64Type>();
        let verdict = b.column_by_name("verdict").unwrap().as_string::<i32>();
        with_sketch += rel.len() - rel.null_count();
        identical += (0..b.num_rows())
            .filter(|&i| verdict.value(i) == "identical")
            .count();
    }
    assert!(with_sketch > 20, "{with_sketch}");
    // The data going into the first op: equal fingerprints.
    assert!(identical >= 1);
}

/// One `aten::mul` whose output B measured wrongly: another mean, the same
/// values (fingerprint).
fn write_single(root: &Path, mean_off: f64) {
    let x: Vec<f32> = (0..100).map(|i| uniform(i, 3) as f32).collect();
    let mut w = DumpWriter::new(root, 0, "cpu");
    let mut out = tensor_of(Role::Output, "0", &x, Some(16));
    out.stats.mean += mean_off;
    w.leaf(
        "aten::mul",
        "Tensor",
        "",
        vec![tensor_of(Role::Input, "self", &x, Some(16))],
        vec![out],
    )
    .unwrap();
    w.close().unwrap();
}

#[test]
fn a_schema_3_dump_has_no_fingerprint_to_prove_identity() {
    let dir = tmp();
    let (a, b) = (dir.path().join("a"), dir.path().join("b"));
    write_single(&a, 0.0);
    write_single(&b, 0.5);
    let (code, j, err) = compare_json(&a, &b, &[]);
    assert_eq!(code, 0, "{err}");
    assert_eq!(
        j["tensor_verdicts"]["identical"], 2,
        "{:#}",
        j["tensor_verdicts"]
    );

    // The same dumps without the fingerprint column: the mean differs.
    strip_to_schema_3(&b);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1);
    assert_eq!(j["tensor_verdicts"]["diverged"], 1);
}

#[test]
fn schema_3_dumps_compare_as_before() {
    for fault in [
        Some((FAULTED, Change::Permute)),
        Some((2, Change::Noise(1e-2))),
    ] {
        let plain = tmp();
        write_pair(plain.path(), &chain(fault, None)).unwrap();
        let stripped = tmp();
        write_pair(stripped.path(), &chain(fault, Some(16))).unwrap();
        for side in ["a", "b"] {
            strip_to_schema_3(&stripped.path().join(side));
        }
        let d = load_one(&stripped.path().join("a"));
        assert_eq!(d.schema_version, 3);
        assert!(!d.tensors.has_fingerprints && d.tensors.sketch_start.is_empty());
        let (c1, j1, _) = compare_json(&plain.path().join("a"), &plain.path().join("b"), &[]);
        let (c2, j2, _) = compare_json(&stripped.path().join("a"), &stripped.path().join("b"), &[]);
        assert_eq!(c1, c2);
        for k in [
            "tensor_verdicts",
            "op_verdicts",
            "headline",
            "first_divergence",
        ] {
            assert_eq!(j1[k], j2[k], "{k}");
        }
        assert!(j2["headline"]["tensors"]
            .as_array()
            .unwrap()
            .iter()
            .all(|t| t["sketch"].is_null() && t["evidence"] == "stats"));
    }
    // And a schema-3 dump against a schema-4 one: no sketch evidence.
    let mixed = tmp();
    write_pair(
        mixed.path(),
        &chain(Some((FAULTED, Change::Permute)), Some(16)),
    )
    .unwrap();
    strip_to_schema_3(&mixed.path().join("a"));
    let (_, j, _) = compare_json(&mixed.path().join("a"), &mixed.path().join("b"), &[]);
    assert_eq!(j["tensor_verdicts"]["identical"], 0);
}
