//! The words and exit statuses `opdump compare` gives the judge's outcomes
//! (the rules themselves are tested in crates/judge/tests): a dominant
//! later fault as the headline, drift with no op to blame (exit 3), and a
//! fault in an op only B runs.

use std::path::{Path, PathBuf};

use crate::common::*;
use opdump_testkit::scenarios::{extra_op_in_b, selected_row, two_faults};
use opdump_testkit::synth::DumpWriter;

/// Side A (`side_b` false) or B, filled by `fill`, written under `root`.
fn write_side(root: &Path, side_b: bool, fill: impl Fn(&mut DumpWriter, bool)) -> PathBuf {
    let dir = root.join(if side_b { "b" } else { "a" });
    let mut w = DumpWriter::new(&dir, 0, "cpu");
    fill(&mut w, side_b);
    w.close().unwrap();
    dir
}

#[test]
fn a_dominant_later_fault_is_named_in_the_verdict() {
    let t = tmp();
    let fill = |w: &mut DumpWriter, side_b| two_faults(w, side_b, 3e-6, 1e-2);
    let a = write_side(t.path(), false, fill);
    let b = write_side(t.path(), true, fill);
    let (code, j, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{stderr}\n{j}");
    assert_eq!(j["headline_rule"], "dominant", "{j}");
    let r = run(&["compare", path_str(&a), path_str(&b)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stdout
            .contains("Verdict: DIVERGED. Introduced at aten::gelu"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("Strongest introduced"), "{}", r.stdout);
}

#[test]
fn drift_with_no_op_to_blame_exits_3() {
    let t = tmp();
    let fill = |w: &mut DumpWriter, side_b| selected_row(w, side_b, 0.011, 0.5);
    let a = write_side(t.path(), false, fill);
    let b = write_side(t.path(), true, fill);
    let (code, j, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(code, 3, "{stderr}\n{j}");
    assert_eq!(j["exit_status"], 3);
    assert_eq!(j["first_divergence"]["op_class"], "movement", "{j}");
    let r = run(&["compare", path_str(&a), path_str(&b)]);
    assert_eq!(r.code, 3);
    assert!(r.stdout.contains("Verdict: DRIFT."), "{}", r.stdout);
}

#[test]
fn a_fault_in_an_op_only_in_b_is_named_there() {
    let t = tmp();
    let fill = |w: &mut DumpWriter, side_b| extra_op_in_b(w, side_b, "aten::mul", 1.01);
    let a = write_side(t.path(), false, fill);
    let b = write_side(t.path(), true, fill);
    let (code, v, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{stderr}\n{v:#}");
    let u = &v["first_introduced_unmatched"];
    assert_eq!(u["side"], "b", "{v:#}");
    assert_eq!(u["op"]["op"], "aten::mul");
    assert_eq!(u["op"]["seq"], 1);
    assert_eq!(u["consumer"]["op"], "aten::linear");
    assert_eq!(u["consumer"]["arg"], "input");
    assert_eq!(v["first_divergence"]["verdict"], "inherited");

    let r = run(&["compare", path_str(&a), path_str(&b)]);
    assert_eq!(r.code, 1);
    assert!(
        r.stdout
            .contains("First introduced: aten::mul.Tensor  [introduced, only in B]"),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout.contains(
            "Verdict: DIVERGED. First introduced at aten::mul.Tensor (only in B, seq B 1, step 0)."
        ),
        "{}",
        r.stdout
    );
}

#[test]
fn drift_from_the_optimizer_names_its_step_and_calls() {
    use opdump_testkit::scenarios::ln_bias_run;
    let t = tmp();
    let fill = |w: &mut DumpWriter, side_b| ln_bias_run(w, side_b, 1e-3, false);
    let a = write_side(t.path(), false, fill);
    let b = write_side(t.path(), true, fill);
    let (code, j, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(code, 3, "{stderr}\n{j}");
    let d = &j["drift_source"];
    assert_eq!(d["parameter"], "ln.bias", "{j}");
    assert_eq!(d["optimizer_step"], 0);
    assert_eq!(d["read_by"]["op"], "aten::native_layer_norm");
    assert_eq!(d["read_by"]["arg"], "bias");
    assert_eq!(d["only_in_b"][0]["op"], "aten::_foreach_lerp_");
    assert_eq!(d["only_in_a"][0]["op"], "aten::lerp_");
    assert!(d["unmatched_side"].is_null(), "{j}");
    assert_eq!(j["unmatched_upstream"]["a"], 1);
    assert_eq!(j["unmatched_upstream"]["b"], 1);

    let html = t.path().join("r.html");
    let r = run(&[
        "compare",
        path_str(&a),
        path_str(&b),
        "--html",
        path_str(&html),
    ]);
    assert_eq!(r.code, 3, "{}", r.stderr);
    assert!(
        r.stdout.contains(
            "Verdict: DRIFT. ln.bias was changed by the optimizer of step 0: compare the optimizers' calls (only in A: aten::lerp_.Scalar x1; only in B: aten::_foreach_lerp_.Scalar x1)."
        ),
        "{}",
        r.stdout
    );
    assert!(
        r.stdout
            .contains("First divergence: aten::native_layer_norm  [ok, an input diverged]"),
        "{}",
        r.stdout
    );
    assert!(r.stdout.contains("  drift source  ln.bias"), "{}", r.stdout);
    let page = std::fs::read_to_string(&html).unwrap();
    assert!(
        page.contains("<code>ln.bias</code> was changed by the optimizer of step 0"),
        "{page}"
    );
}

#[test]
fn drift_names_the_side_with_calls_upstream_only_when_there_are_some() {
    let t = tmp();
    let fill = |w: &mut DumpWriter, side_b| selected_row(w, side_b, 0.011, 0.5);
    let a = write_side(t.path(), false, fill);
    let b = write_side(t.path(), true, fill);
    let r = run(&["compare", path_str(&a), path_str(&b)]);
    assert_eq!(r.code, 3);
    // Both sides made the same calls: no side to blame for them.
    assert!(!r.stdout.contains("calls only in"), "{}", r.stdout);
}

#[test]
fn a_list_kernels_element_is_named_with_its_parameter() {
    use opdump_testkit::optimizer::{adamw_step, Twist};
    let t = tmp();
    let fill = |w: &mut DumpWriter, side_b: bool| {
        let fault = Twist {
            fault: side_b.then_some((1, 3, 1.001)),
            ..Twist::default()
        };
        adamw_step(w, side_b, fault)
    };
    let a = write_side(t.path(), false, fill);
    let b = write_side(t.path(), true, fill);
    let (code, j, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{stderr}\n{j}");
    assert_eq!(j["headline"]["op"], "aten::_foreach_lerp_", "{j}");
    assert_eq!(j["headline"]["element"]["index"], 3, "{j}");
    assert_eq!(j["headline"]["element"]["param"], "w3", "{j}");
    let r = run(&["compare", path_str(&a), path_str(&b)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stdout.contains(
            "Verdict: DIVERGED. First introduced at aten::_foreach_lerp_.Scalar (element 3, w3) (seq A"
        ),
        "{}",
        r.stdout
    );
    // No call of A is the list call's counterpart: repro refuses, and says why.
    let out = t.path().join("repro");
    let r = run(&["repro", path_str(&a), path_str(&b), "--out", path_str(&out)]);
    assert_ne!(r.code, 0, "{}", r.stdout);
    assert!(
        r.stderr.contains("(seq B 2), element 3, w3, is judged against the other run's per-parameter call: `opdump repro` runs one call against the same call"),
        "{}",
        r.stderr
    );
}

#[test]
fn a_fused_kernels_element_is_named_with_its_parameter() {
    use opdump_testkit::optimizer::{adamw_step, fused_adamw_step, Twist};
    let t = tmp();
    let fill = |w: &mut DumpWriter, side_b: bool| {
        if side_b {
            let fault = Twist {
                fault: Some((3, 3, 1.001)),
                ..Twist::default()
            };
            fused_adamw_step(w, fault)
        } else {
            adamw_step(w, false, Twist::default())
        }
    };
    let a = write_side(t.path(), false, fill);
    let b = write_side(t.path(), true, fill);
    let (code, j, stderr) = compare_json(&a, &b, &[]);
    assert_eq!(code, 1, "{stderr}\n{j}");
    assert_eq!(j["headline"]["op"], "aten::_fused_adamw_", "{j}");
    assert_eq!(j["headline"]["element"]["side"], "b", "{j}");
    assert_eq!(j["headline"]["element"]["index"], 3, "{j}");
    assert_eq!(j["headline"]["element"]["param"], "w3", "{j}");
    let r = run(&["compare", path_str(&a), path_str(&b)]);
    assert_eq!(r.code, 1, "{}", r.stderr);
    assert!(
        r.stdout.contains(
            "Verdict: DIVERGED. First introduced at aten::_fused_adamw_ (element 3, w3) (seq A"
        ),
        "{}",
        r.stdout
    );
}
