//! `opdump summary`: counts per op, phase and step, and where NaN first
//! appeared from inputs without NaN.

use crate::common::*;
use opdump_testkit::synth::{input, output, with_nan, DumpWriter, Variant};
use serde_json::Value;

#[test]
fn counts_and_first_nan() {
    let t = tmp();
    let (step, layer) = (1, 2);
    let m = small_model();
    let (_, b) = model_pair(
        t.path(),
        &m,
        &Variant {
            nan: Some((step, layer, 3)),
            ..Default::default()
        },
    );
    let r = run(&["summary", path_str(&b), "--json"]);
    assert_eq!(r.code, 0, "{}", r.stderr);
    let j: Value = serde_json::from_str(&r.stdout).expect("json");
    let rank = &j["ranks"][0];
    assert_eq!(
        rank["dump"]["op_calls"].as_u64(),
        Some(m.calls_per_step() * m.steps as u64)
    );
    let per_op = rank["per_op"].as_array().unwrap();
    let gelu = per_op
        .iter()
        .find(|o| o["op"] == "aten::gelu")
        .expect("gelu counted");
    assert_eq!(
        gelu["calls"].as_u64(),
        Some(m.layers as u64 * m.steps as u64)
    );
    assert_eq!(
        rank["per_phase"]["optimizer"].as_u64(),
        Some(m.steps as u64)
    );
    assert_eq!(rank["per_step"]["0"].as_u64(), Some(m.calls_per_step()));
    let recs = records(&b);
    let expect = nth_root(&recs, step, "aten::gelu", layer);
    let first = &rank["first_nan_from_finite"];
    assert_eq!(first["op"], "aten::gelu", "{first}");
    assert_eq!(first["seq"], expect);
    assert_eq!(rank["first_nonfinite_from_finite"]["seq"], expect);
    assert_eq!(rank["nonfinite_ops"][0]["op"], "aten::gelu");
    // Text form names it too.
    let r = run(&["summary", path_str(&b)]);
    assert_eq!(r.code, 0);
    assert!(
        r.stdout.contains(&format!(
            "first NaN from inputs without NaN: aten::gelu  (seq {expect}"
        )),
        "{}",
        r.stdout
    );
}

#[test]
fn nan_origin_is_the_deepest_op() {
    // linear (seq 0) > t (1), addmm (2, makes the NaN); then relu (3) only
    // passes it on.
    let t = tmp();
    let mut w = DumpWriter::new(t.path(), 0, "cpu");
    let x = || input("input", "float32", &[4, 4], 1.0);
    let lin = w.begin("aten::linear", "default", "", vec![x()]);
    w.leaf(
        "aten::t",
        "default",
        "",
        vec![x()],
        vec![output(0, "float32", &[4, 4], 1.0)],
    )
    .unwrap();
    w.leaf(
        "aten::addmm",
        "default",
        "",
        vec![x()],
        vec![with_nan(output(0, "float32", &[4, 4], 1.0), 2)],
    )
    .unwrap();
    w.end(lin, vec![with_nan(output(0, "float32", &[4, 4], 1.0), 2)])
        .unwrap();
    w.leaf(
        "aten::relu",
        "default",
        "",
        vec![with_nan(x(), 2)],
        vec![with_nan(output(0, "float32", &[4, 4], 1.0), 2)],
    )
    .unwrap();
    w.close().unwrap();
    let r = run(&["summary", path_str(t.path()), "--json"]);
    let j: Value = serde_json::from_str(&r.stdout).expect("json");
    let first = &j["ranks"][0]["first_nan_from_finite"];
    assert_eq!(first["op"], "aten::addmm");
    assert_eq!(first["seq"], 2);
    assert_eq!(first["ancestors"][0]["op"], "aten::linear");
    let relu = j["ranks"][0]["nonfinite_ops"]
        .as_array()
        .unwrap()
        .iter()
        .find(|o| o["op"] == "aten::relu")
        .cloned()
        .unwrap();
    assert_eq!(relu["calls_nonfinite_in"], 1);
}
