//! Captured values in a comparison (OPDUMP_CAPTURE): the exact metrics
//! replace the statistics' bounds, so a permutation, which keeps every
//! statistic, is a divergence at the op that made it.

use opdump_format::{Capture, CapturedTensor};
use opdump_testkit::synth::{input, output, DumpWriter};

mod common;
use common::{compare_dirs, tmp};

fn f32s(v: &[f32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// One gelu call whose output holds `out`; captured or not. The statistics
/// rows are the same for any order of `out`.
fn write(dir: &std::path::Path, out: &[f32], captured: bool) {
    let x = [0.5f32, -1.0, 2.0, 1.5];
    let mut w = DumpWriter::new(dir, 0, "cpu");
    let (i, o) = (
        vec![input("self", "float32", &[4], 1.0)],
        vec![output(0, "float32", &[4], 2.0)],
    );
    if captured {
        let t = |key: &str, v: &[f32]| CapturedTensor {
            key: key.into(),
            dtype: "float32".into(),
            shape: vec![4],
            data: f32s(v),
        };
        let cap = Capture {
            selector: "aten::gelu#0".into(),
            args: "[]".into(),
            tensors: vec![t("input.self", &x), t("output.0", out)],
            outputs_skipped: false,
            file: None,
        };
        w.leaf_captured("aten::gelu", i, o, cap).expect("write");
    } else {
        w.leaf("aten::gelu", "default", "", i, o).expect("write");
    }
    w.close().expect("close");
}

#[test]
fn a_permutation_is_seen_only_with_captures() {
    let t = tmp();
    let right = [0.35f32, -0.16, 1.95, 1.40];
    let permuted = [1.40f32, -0.16, 1.95, 0.35];
    for (captured, diverged) in [(false, false), (true, true)] {
        let (a, b) = (
            t.path().join(format!("a{captured}")),
            t.path().join(format!("b{captured}")),
        );
        write(&a, &right, captured);
        write(&b, &permuted, captured);
        let c = compare_dirs(&a, &b);
        assert_eq!(
            c.first_introduced.is_some(),
            diverged,
            "captured: {captured}"
        );
        let out = c.detail(0);
        let o = out
            .tensors
            .iter()
            .find(|t| t.role == opdump_format::Role::Output)
            .unwrap();
        if captured {
            assert_eq!(o.evidence, "exact");
            assert_eq!(o.verdict.as_str(), "diverged");
            let i = out
                .tensors
                .iter()
                .find(|t| t.role == opdump_format::Role::Input)
                .unwrap();
            assert_eq!(i.verdict.as_str(), "identical");
        } else {
            assert_eq!(o.verdict.as_str(), "stats_equal");
        }
    }
}
