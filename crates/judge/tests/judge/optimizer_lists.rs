//! An optimizer's per-parameter loop on one side against its `_foreach_`
//! kernels on the other: each list element pairs with its parameter's
//! call, a fault in one element is introduced at the list kernel with that
//! element named, and counts that do not fit leave the calls unmatched.

use crate::common::*;
use opdump_format::Phase;
use opdump_judge::{Dump, OpVerdict, Part, Side};
use opdump_testkit::optimizer::{adamw_step, args, values, Twist, KERNELS, SHAPES};
use opdump_testkit::synth::{input, output, DumpWriter};

/// One side in memory (see [`adamw_step`]).
fn side(list: bool, twist: Twist) -> Dump {
    let mut w = DumpWriter::in_memory();
    adamw_step(&mut w, list, twist);
    dump(if list { "list" } else { "loop" }, &w.records())
}

/// The element pairs of the alignment: (pair index, A's op, B's op, list
/// side, element).
fn element_pairs(
    a: &Dump,
    b: &Dump,
    pairs: &[opdump_judge::Pair],
) -> Vec<(usize, String, String, Side, u32)> {
    pairs
        .iter()
        .enumerate()
        .filter_map(|(k, p)| {
            let (side, e) = p.part().element_of()?;
            Some((
                k,
                a.op_name(p.a).to_string(),
                b.op_name(p.b).to_string(),
                side,
                e,
            ))
        })
        .collect()
}

#[test]
fn each_list_element_pairs_with_its_parameters_call() {
    let (a, b, al) = align_dumps(side(false, Twist::default()), side(true, Twist::default()));
    let elems = element_pairs(&a, &b, &al.pairs);
    assert_eq!(elems.len(), SHAPES.len() * KERNELS.len(), "{elems:?}");
    for &(k, ref op_a, ref op_b, side, e) in &elems {
        assert_eq!(side, Side::B);
        let p = al.pairs[k];
        // A's calls run parameter-major: call j of the optimizer is
        // kernel j % 4 of parameter j / 4 (after the forward's `mm`).
        let j = p.a as usize - 1;
        assert_eq!(
            (j / KERNELS.len()) as u32,
            e,
            "{op_a} paired with element {e}"
        );
        let kernel = j % KERNELS.len();
        assert_eq!(op_a, KERNELS[kernel].0);
        assert_eq!(op_b, KERNELS[kernel].2);
        // The second `mul_` of a parameter pairs with the second
        // `_foreach_mul_`.
        assert_eq!(p.b as usize, 1 + kernel, "{op_a} of parameter {e}");
        assert_eq!(al.element(k).unwrap().param, Some(format!("w{e}")));
    }
    assert!(al.only_a.is_empty() && al.only_b.is_empty());
    let c = compare(a, b);
    assert_eq!(c.headline, None);
    assert_eq!(c.first_divergence, None);
}

#[test]
fn a_fault_in_element_3_is_introduced_at_the_list_kernel() {
    let fault = Twist {
        fault: Some((1, 3, 1.001)),
        ..Twist::default()
    };
    let c = compare(side(false, Twist::default()), side(true, fault));
    let h = c.headline.expect("a headline");
    let p = c.alignment.pairs[h];
    assert_eq!(p.part(), Part::element(Side::B, 3));
    assert_eq!(c.b.op_name(p.b), "aten::_foreach_lerp_");
    assert_eq!(c.verdict[h], OpVerdict::Introduced);
    let e = c.alignment.element(h).unwrap();
    assert_eq!((e.index, e.param.as_deref()), (3, Some("w3")));
    assert_eq!(e.describe(), "element 3, w3");
    // The `addcdiv_` of parameter 3 read the diverged first moment: it
    // inherited the divergence; no other element diverged.
    let diverged: Vec<(String, u32, OpVerdict)> = (0..c.alignment.pairs.len())
        .filter(|&k| c.verdict[k].diverged())
        .map(|k| {
            let p = c.alignment.pairs[k];
            (
                c.b.op_name(p.b).to_string(),
                p.part().element_of().unwrap().1,
                c.verdict[k],
            )
        })
        .collect();
    assert_eq!(
        diverged,
        vec![
            ("aten::_foreach_lerp_".to_string(), 3, OpVerdict::Introduced),
            (
                "aten::_foreach_addcdiv_".to_string(),
                3,
                OpVerdict::Inherited
            ),
        ]
    );
}

#[test]
fn the_loop_on_b_pairs_and_names_the_list_kernel_of_a() {
    let fault = Twist {
        fault: Some((1, 3, 1.001)),
        ..Twist::default()
    };
    let c = compare(side(true, Twist::default()), side(false, fault));
    let h = c.headline.expect("a headline");
    let p = c.alignment.pairs[h];
    assert_eq!(p.part(), Part::element(Side::A, 3));
    assert_eq!(c.a.op_name(p.a), "aten::_foreach_lerp_");
    assert_eq!(c.b.op_name(p.b), "aten::lerp_");
    assert_eq!(c.alignment.element(h).unwrap().param.as_deref(), Some("w3"));
    // A's list calls pair once per element, in element order.
    let elems: Vec<u32> = c
        .alignment
        .pairs
        .iter()
        .filter(|q| q.a == p.a)
        .map(|q| q.part().element_of().unwrap().1)
        .collect();
    assert_eq!(elems, (0..SHAPES.len() as u32).collect::<Vec<_>>());
}

#[test]
fn counts_that_do_not_fit_leave_the_calls_unmatched() {
    // Parameter 2's `lerp_` is missing: 4 calls for a list of 5.
    let drop = Twist {
        drop: Some((1, 2)),
        ..Twist::default()
    };
    let (a, b, al) = align_dumps(side(false, drop), side(true, Twist::default()));
    let elems = element_pairs(&a, &b, &al.pairs);
    assert!(elems.iter().all(|e| e.1 != "aten::lerp_"), "{elems:?}");
    // The other kernels still pair, every element.
    assert_eq!(elems.len(), SHAPES.len() * (KERNELS.len() - 1));
    let only_a: Vec<&str> = al.only_a.iter().map(|&i| a.op_name(i)).collect();
    let only_b: Vec<&str> = al.only_b.iter().map(|&i| b.op_name(i)).collect();
    assert_eq!(only_a, vec!["aten::lerp_"; SHAPES.len() - 1]);
    assert_eq!(only_b, vec!["aten::_foreach_lerp_"]);
}

#[test]
fn shapes_that_do_not_fit_leave_the_calls_unmatched() {
    let mut w = DumpWriter::in_memory();
    w.phase = Phase::Optimizer;
    // A loop over the parameters in reverse: every kernel's count fits
    // and no element's shapes do.
    for (i, shape) in SHAPES.iter().enumerate().rev() {
        for (k, &(op, overload, _)) in KERNELS.iter().enumerate() {
            let ins = args(k, false)
                .iter()
                .enumerate()
                .map(|(j, arg)| input(arg, "float32", shape, values(i, k).0[j]))
                .collect();
            w.leaf(
                op,
                overload,
                "",
                ins,
                vec![output(0, "float32", shape, 1.0)],
            )
            .unwrap();
        }
    }
    let reversed = dump("reversed", &w.records());
    let (_, _, al) = align_dumps(reversed, side(true, Twist::default()));
    assert!(al.pairs.iter().all(|p| p.part() == Part::WHOLE));
}

#[test]
fn two_groups_of_equal_lists_are_not_paired_crosswise() {
    // Two parameter groups of two parameters of one shape, an unnamed
    // state each (`sqrt` of the second moment): by count and shape, loop
    // call j would pair with element j / 2 of list call j % 2, the second
    // group's list for the first group's second parameter. Their values
    // tell them apart.
    let scale = |g: usize, i: usize| 5f64.powi((2 * g + i) as i32);
    let mut w = DumpWriter::in_memory();
    w.phase = Phase::Optimizer;
    for g in 0..2 {
        for i in 0..2 {
            w.leaf(
                "aten::sqrt",
                "default",
                "",
                vec![input("self", "float32", &[3], scale(g, i))],
                vec![output(0, "float32", &[3], scale(g, i).sqrt())],
            )
            .unwrap();
        }
    }
    let per_param = dump("loop", &w.records());
    let mut w = DumpWriter::in_memory();
    w.phase = Phase::Optimizer;
    for g in 0..2 {
        let t = |role_in: bool, i: usize| {
            let mut t = if role_in {
                input("self", "float32", &[3], scale(g, i))
            } else {
                output(0, "float32", &[3], scale(g, i).sqrt())
            };
            t.list_index = Some(i as i32);
            t
        };
        let ins = (0..2).map(|i| t(true, i)).collect();
        let outs = (0..2).map(|i| t(false, i)).collect();
        w.leaf("aten::_foreach_sqrt", "default", "", ins, outs)
            .unwrap();
    }
    let lists = dump("list", &w.records());
    let (_, _, al) = align_dumps(per_param, lists);
    assert!(
        al.pairs.iter().all(|p| p.part() == Part::WHOLE),
        "{:?}",
        al.pairs
    );
    assert_eq!((al.only_a.len(), al.only_b.len()), (4, 2));
}
