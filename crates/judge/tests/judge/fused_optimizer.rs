//! A fused optimizer kernel (`_fused_adamw_`) on one side against the
//! other side's per-parameter loop: each element's written lists pair with
//! the loop's calls that wrote them, a fault in element 3 is introduced at
//! the kernel with that element named, a clean pair agrees, and a gradient
//! that diverged upstream makes the kernel inherit.

use crate::common::*;
use opdump_judge::align::fused::Written;
use opdump_judge::{Dump, OpVerdict, Part, Side};
use opdump_testkit::optimizer::{adamw_step, fused_adamw_step, Twist, SHAPES};
use opdump_testkit::synth::DumpWriter;

fn loop_side(twist: Twist) -> Dump {
    let mut w = DumpWriter::in_memory();
    adamw_step(&mut w, false, twist);
    dump("loop", &w.records())
}

fn fused_side(twist: Twist) -> Dump {
    let mut w = DumpWriter::in_memory();
    fused_adamw_step(&mut w, twist);
    dump("fused", &w.records())
}

/// (fused side, element, written list, loop op, verdict) of every fused
/// pair, in judging order.
fn fused_pairs(c: &opdump_judge::Compared) -> Vec<(Side, u32, Written, String, OpVerdict)> {
    c.alignment
        .pairs
        .iter()
        .enumerate()
        .filter_map(|(k, p)| {
            let kind = p.part().fused_kind()?;
            let (side, e) = p.part().element_of()?;
            let op = match side {
                Side::A => c.b.op_name(p.b),
                Side::B => c.a.op_name(p.a),
            };
            Some((side, e, kind, op.to_string(), c.verdict[k]))
        })
        .collect()
}

#[test]
fn each_element_pairs_its_written_lists_and_a_clean_pair_agrees() {
    let c = compare(loop_side(Twist::default()), fused_side(Twist::default()));
    let pairs = fused_pairs(&c);
    // The parameter and the first moment of each element; the second
    // moment's `addcmul_` is not in this loop.
    assert_eq!(pairs.len(), 2 * SHAPES.len(), "{pairs:?}");
    for (i, chunk) in pairs.chunks(2).enumerate() {
        assert_eq!(
            chunk
                .iter()
                .map(|p| (p.0, p.1, p.2, p.3.as_str()))
                .collect::<Vec<_>>(),
            vec![
                (Side::B, i as u32, Written::ExpAvgs, "aten::lerp_"),
                (Side::B, i as u32, Written::Param, "aten::addcdiv_"),
            ]
        );
    }
    assert!(pairs.iter().all(|p| p.4 == OpVerdict::Ok), "{pairs:?}");
    assert_eq!(c.headline, None);
    assert_eq!(c.first_divergence, None);
    // The kernel is no longer only in B.
    assert!(c
        .alignment
        .only_b
        .iter()
        .all(|&r| c.b.op_name(r) != "aten::_fused_adamw_"));
}

#[test]
fn a_fault_in_element_3_is_introduced_at_the_fused_kernel() {
    let fault = Twist {
        fault: Some((3, 3, 1.001)),
        ..Twist::default()
    };
    let c = compare(loop_side(Twist::default()), fused_side(fault));
    let h = c.headline.expect("a headline");
    let p = c.alignment.pairs[h];
    assert_eq!(p.part(), Part::fused(Side::B, 3, Written::Param));
    assert_eq!(c.b.op_name(p.b), "aten::_fused_adamw_");
    assert_eq!(c.a.op_name(p.a), "aten::addcdiv_");
    assert_eq!(c.verdict[h], OpVerdict::Introduced);
    let e = c.alignment.element(h).unwrap();
    assert_eq!(e.describe(), "element 3, w3");
    let diverged: Vec<_> = fused_pairs(&c)
        .into_iter()
        .filter(|p| p.4.diverged())
        .collect();
    assert_eq!(diverged.len(), 1, "{diverged:?}");
}

#[test]
fn the_fused_kernel_on_a_is_named_too() {
    let fault = Twist {
        fault: Some((1, 3, 1.001)),
        ..Twist::default()
    };
    let c = compare(fused_side(fault), loop_side(Twist::default()));
    let h = c.headline.expect("a headline");
    let p = c.alignment.pairs[h];
    assert_eq!(p.part(), Part::fused(Side::A, 3, Written::ExpAvgs));
    assert_eq!(c.a.op_name(p.a), "aten::_fused_adamw_");
    assert_eq!(c.b.op_name(p.b), "aten::lerp_");
    assert_eq!(c.verdict[h], OpVerdict::Introduced);
    assert_eq!(c.alignment.element(h).unwrap().param.as_deref(), Some("w3"));
}

#[test]
fn a_gradient_that_diverged_upstream_is_inherited_at_the_fused_kernel() {
    let upstream = Twist {
        grad3: Some(1.01),
        ..Twist::default()
    };
    let exact = Twist {
        grad3: Some(1.0),
        ..Twist::default()
    };
    let c = compare(loop_side(exact), fused_side(upstream));
    let h = c.headline.expect("a headline");
    assert_eq!(c.a.op_name(c.alignment.pairs[h].a), "aten::mul");
    assert_eq!(c.verdict[h], OpVerdict::Introduced);
    let diverged: Vec<_> = fused_pairs(&c)
        .into_iter()
        .filter(|p| p.4.diverged())
        .map(|p| (p.1, p.2, p.4))
        .collect();
    assert_eq!(
        diverged,
        vec![
            (3, Written::ExpAvgs, OpVerdict::Inherited),
            (3, Written::Param, OpVerdict::Inherited),
        ]
    );
}
