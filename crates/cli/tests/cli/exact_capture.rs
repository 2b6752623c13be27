//! Captured values in a comparison (OPDUMP_CAPTURE): the exact metrics
//! replace the statistics' bounds, so a permutation, which keeps every
//! statistic, is a divergence at the op that made it.

use crate::common::{compare_dirs, gelu_dump, tmp};

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
        gelu_dump(&a, &right, captured);
        gelu_dump(&b, &permuted, captured);
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
