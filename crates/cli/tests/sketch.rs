//! The fingerprint and the error sketch in `opdump compare`, on synthetic
//! dumps whose every tensor holds real float32 values (`synth_chain.rs`):
//! what the statistics cannot see (values moved, zero-mean noise) is named
//! at the op that made it, rounding is not, equal fingerprints prove
//! identity, and dumps without the columns compare as before.

mod common;

use std::path::Path;
use std::sync::Arc;

use arrow_array::cast::AsArray;
use arrow_array::types::Float64Type;
use arrow_array::Array;
use arrow_array::RecordBatch;
use common::{compare_json, load_one, path_str, tmp};
use opdump_format::reader::list_files;
use opdump_format::schema::{col, meta};
use opdump_format::Role;
use opdump_testkit::synth::DumpWriter;
use opdump_testkit::synth_chain::{tensor_of, uniform, write_pair, Chain, Change};
use parquet::arrow::arrow_reader::ParquetRecordBatchReaderBuilder;
use parquet::arrow::ArrowWriter;
use parquet::file::metadata::KeyValue;
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

fn headline_seq(j: &Value) -> Option<i64> {
    j["headline"]["seq_a"].as_i64()
}

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
fn a_permutation_is_introduced_at_the_op_that_made_it() {
    let dir = tmp();
    let seqs = write_pair(
        dir.path(),
        &chain(Some((FAULTED, Change::Permute)), Some(16)),
    )
    .unwrap();
    let (code, j, err) = compare_json(&dir.path().join("a"), &dir.path().join("b"), &[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(headline_seq(&j), Some(seqs[FAULTED]), "{:#}", j["headline"]);
    assert_eq!(j["first_introduced"]["op"], "aten::tanh");
    let out = output_of_first_introduced(&j);
    assert_eq!(out["verdict"], "diverged");
    assert_eq!(out["evidence"], "sketch");
    // Every statistic kept: the bound says nothing, the sketch about
    // sqrt(2) (a reversal of values that do not repeat).
    assert!(out["rel_l2"].as_f64().unwrap() < 1e-5, "{out:#}");
    let rel = out["sketch"]["rel"].as_f64().unwrap();
    assert!((0.7..2.8).contains(&rel), "{out:#}");
    assert_eq!(out["sketch"]["k"], 16);

    // The Parquet report carries the estimate next to the bound.
    let (code, _, _) = compare_json(
        &dir.path().join("a"),
        &dir.path().join("b"),
        &["--out", path_str(&dir.path().join("out"))],
    );
    assert_eq!(code, 1);
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

    // Without the columns the statistics name a later op that mixes the
    // moved values, not the one that moved them.
    let dir = tmp();
    write_pair(dir.path(), &chain(Some((FAULTED, Change::Permute)), None)).unwrap();
    let (code, j, _) = compare_json(&dir.path().join("a"), &dir.path().join("b"), &[]);
    assert_eq!(code, 1);
    assert_ne!(headline_seq(&j), Some(seqs[FAULTED]));
}

#[test]
fn noise_of_1e4_is_introduced_at_its_op() {
    let dir = tmp();
    let fault = Some((FAULTED, Change::Noise(1e-4)));
    let seqs = write_pair(dir.path(), &chain(fault, Some(16))).unwrap();
    let (code, j, err) = compare_json(&dir.path().join("a"), &dir.path().join("b"), &[]);
    assert_eq!(code, 1, "{err}");
    assert_eq!(headline_seq(&j), Some(seqs[FAULTED]), "{:#}", j["headline"]);
    let out = output_of_first_introduced(&j);
    // The statistics' bound is within rounding; the sketch sees the noise
    // (about 1e-4 / sqrt(3) relative).
    assert!(
        out["rel_l2"].as_f64().unwrap() <= out["tolerance"].as_f64().unwrap(),
        "{out:#}"
    );
    let rel = out["sketch"]["rel"].as_f64().unwrap();
    assert!((2.5e-5..1.2e-4).contains(&rel), "{out:#}");

    // The statistics alone do not name it.
    let dir = tmp();
    write_pair(dir.path(), &chain(fault, None)).unwrap();
    let (_, j, _) = compare_json(&dir.path().join("a"), &dir.path().join("b"), &[]);
    assert_ne!(headline_seq(&j), Some(seqs[FAULTED]));
}

#[test]
fn rounding_on_every_op_is_no_divergence() {
    for k in [2, 16, 32] {
        let dir = tmp();
        write_pair(dir.path(), &chain(None, Some(k))).unwrap();
        let (code, j, err) = compare_json(&dir.path().join("a"), &dir.path().join("b"), &[]);
        assert_eq!(code, 0, "K = {k}: {err} {:#}", j["first_divergence"]);
        assert_eq!(j["divergence"], false);
        assert_eq!(j["tensor_verdicts"]["diverged"], 0);
        // The sketches were read, of the length written.
        let d = load_one(&dir.path().join("b"));
        assert_eq!(d.tensors.sketch(0).map(<[f64]>::len), Some(k));
    }
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
fn equal_fingerprints_are_identical_whatever_the_statistics() {
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
    assert_eq!(j["tensor_verdicts"]["diverged"], 0);

    // The same dumps without the fingerprint column: the mean differs.
    strip_to_schema_3(&b);
    let (code, j, _) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1);
    assert_eq!(j["tensor_verdicts"]["diverged"], 1);
}

/// Rewrites every file of a dump as schema 3 wrote it: no fingerprint, no
/// sketch column.
fn strip_to_schema_3(dir: &Path) {
    for f in list_files(dir).unwrap() {
        let file = std::fs::File::open(&f.path).unwrap();
        let builder = ParquetRecordBatchReaderBuilder::try_new(file).unwrap();
        let kv: Vec<KeyValue> = builder
            .metadata()
            .file_metadata()
            .key_value_metadata()
            .cloned()
            .unwrap_or_default()
            .into_iter()
            .filter(|kv| kv.key != meta::SCHEMA_VERSION && kv.key != "ARROW:schema")
            .collect();
        let batches: Vec<RecordBatch> = builder.build().unwrap().map(|b| b.unwrap()).collect();
        let keep: Vec<usize> = batches[0]
            .schema()
            .fields()
            .iter()
            .enumerate()
            .filter(|(_, fl)| fl.name() != col::FINGERPRINT && fl.name() != col::SKETCH)
            .map(|(i, _)| i)
            .collect();
        let schema = Arc::new(batches[0].schema().project(&keep).unwrap());
        let out = std::fs::File::create(&f.path).unwrap();
        let mut w = ArrowWriter::try_new(out, schema.clone(), None).unwrap();
        for b in &batches {
            w.write(&b.project(&keep).unwrap()).unwrap();
        }
        for kv in kv {
            w.append_key_value_metadata(kv);
        }
        w.append_key_value_metadata(KeyValue::new(meta::SCHEMA_VERSION.into(), "3".to_string()));
        w.close().unwrap();
    }
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
