//! Alignment on synthetic dumps built in memory: insertions, deletions, extra copies, a
//! different decomposition at depth 1, a reordered tail, steps, dtypes, and
//! a long repetitive run. Each test names the exact calls it expects to be
//! unmatched, by seq.

use crate::common::*;
use opdump_format::OpRecord;
use opdump_testkit::synth::{input, output, DumpWriter};

/// A call to write: name, tensor size, children.
#[derive(Clone)]
struct N {
    name: &'static str,
    size: i64,
    kids: Vec<N>,
}

fn op(name: &'static str, size: i64) -> N {
    N {
        name,
        size,
        kids: vec![],
    }
}

fn tree(name: &'static str, size: i64, kids: Vec<N>) -> N {
    N { name, size, kids }
}

/// Writes steps of calls into `out`; returns (name, seq) of every call in
/// preorder.
fn write(
    out_records: &mut Vec<OpRecord>,
    steps: &[Vec<N>],
    dtype: &str,
) -> Vec<(&'static str, i64)> {
    fn one(w: &mut DumpWriter, n: &N, dtype: &str, out: &mut Vec<(&'static str, i64)>) {
        let o = w.begin(
            n.name,
            "default",
            "",
            vec![input("self", dtype, &[n.size], 1.0)],
        );
        out.push((n.name, w.next_seq() - 1));
        for k in &n.kids {
            one(w, k, dtype, out);
        }
        w.end(o, vec![output(0, dtype, &[n.size], 1.0)])
            .expect("write");
    }
    let mut w = DumpWriter::in_memory();
    let mut out = Vec::new();
    for (s, calls) in steps.iter().enumerate() {
        w.step = s as i64;
        for n in calls {
            one(&mut w, n, dtype, &mut out);
        }
    }
    *out_records = w.records();
    out
}

fn seq_of(calls: &[(&str, i64)], name: &str, nth: usize) -> i64 {
    calls
        .iter()
        .filter(|c| c.0 == name)
        .nth(nth)
        .unwrap_or_else(|| panic!("no {name} #{nth}"))
        .1
}

fn abcde() -> Vec<N> {
    ["aten::a", "aten::b", "aten::c", "aten::d", "aten::e"]
        .iter()
        .map(|n| op(n, 4))
        .collect()
}

#[test]
fn insertion_is_only_in_b() {
    let mut t = Sides::default();
    let a = write(t.side("a"), &[abcde()], "float32");
    let mut bl = abcde();
    bl.insert(2, op("aten::extra", 4));
    let b = write(t.side("b"), &[bl], "float32");
    let (da, db, al) = t.align("a", "b");
    assert_eq!(seqs(&db, &al.only_b), vec![seq_of(&b, "aten::extra", 0)]);
    assert!(al.only_a.is_empty());
    let pairs = seq_pairs(&da, &db, &al);
    for name in ["aten::a", "aten::b", "aten::c", "aten::d", "aten::e"] {
        assert!(
            pairs.contains(&(seq_of(&a, name, 0), seq_of(&b, name, 0))),
            "{name} not paired"
        );
    }
    assert_eq!(pairs.len(), 5);
}

#[test]
fn deletion_is_only_in_a() {
    let mut t = Sides::default();
    let a = write(t.side("a"), &[abcde()], "float32");
    let mut bl = abcde();
    bl.remove(2);
    write(t.side("b"), &[bl], "float32");
    let (da, db, al) = t.align("a", "b");
    assert_eq!(seqs(&da, &al.only_a), vec![seq_of(&a, "aten::c", 0)]);
    assert!(al.only_b.is_empty());
    assert_eq!(al.pairs.len(), 4);
    let _ = db;
}

fn copy() -> N {
    tree(
        "aten::_to_copy",
        4,
        vec![op("aten::empty_strided", 4), op("aten::copy_", 4)],
    )
}

#[test]
fn extra_copies_are_only_in_b_with_their_children() {
    let mut t = Sides::default();
    write(t.side("a"), &[abcde()], "float32");
    let mut bl = abcde();
    bl.insert(3, copy());
    bl.insert(1, copy());
    let b = write(t.side("b"), &[bl], "float32");
    let (_, db, al) = t.align("a", "b");
    assert_eq!(
        seqs(&db, &al.only_b),
        vec![
            seq_of(&b, "aten::_to_copy", 0),
            seq_of(&b, "aten::_to_copy", 1)
        ]
    );
    assert_eq!(al.only_b_calls, 6);
    assert_eq!(al.pairs.len(), 5);
}

#[test]
fn different_decomposition_at_depth_1() {
    let mut t = Sides::default();
    let lin_a = tree(
        "aten::linear",
        4,
        vec![op("aten::t", 4), op("aten::addmm", 4)],
    );
    let lin_b = tree(
        "aten::linear",
        4,
        vec![op("aten::t", 4), op("aten::mm", 4), op("aten::add", 4)],
    );
    let a = write(
        t.side("a"),
        &[vec![op("aten::x", 4), lin_a, op("aten::y", 4)]],
        "float32",
    );
    let b = write(
        t.side("b"),
        &[vec![op("aten::x", 4), lin_b, op("aten::y", 4)]],
        "float32",
    );
    let (da, db, al) = t.align("a", "b");
    let pairs = seq_pairs(&da, &db, &al);
    assert!(pairs.contains(&(seq_of(&a, "aten::linear", 0), seq_of(&b, "aten::linear", 0))));
    assert!(pairs.contains(&(seq_of(&a, "aten::t", 0), seq_of(&b, "aten::t", 0))));
    assert_eq!(seqs(&da, &al.only_a), vec![seq_of(&a, "aten::addmm", 0)]);
    assert_eq!(
        seqs(&db, &al.only_b),
        vec![seq_of(&b, "aten::mm", 0), seq_of(&b, "aten::add", 0)]
    );
    assert_eq!(pairs.len(), 4);
}

#[test]
fn reordered_tail() {
    let mut t = Sides::default();
    let names = [
        "aten::a", "aten::b", "aten::c", "aten::d", "aten::e", "aten::f",
    ];
    let a = write(
        t.side("a"),
        &[names.iter().map(|n| op(n, 4)).collect()],
        "float32",
    );
    let order = [
        "aten::a", "aten::b", "aten::c", "aten::f", "aten::d", "aten::e",
    ];
    let b = write(
        t.side("b"),
        &[order.iter().map(|n| op(n, 4)).collect()],
        "float32",
    );
    let (da, db, al) = t.align("a", "b");
    // The longest common order keeps d, e; the moved f is unmatched on both
    // sides.
    assert_eq!(seqs(&da, &al.only_a), vec![seq_of(&a, "aten::f", 0)]);
    assert_eq!(seqs(&db, &al.only_b), vec![seq_of(&b, "aten::f", 0)]);
    let pairs = seq_pairs(&da, &db, &al);
    for n in ["aten::a", "aten::b", "aten::c", "aten::d", "aten::e"] {
        assert!(pairs.contains(&(seq_of(&a, n, 0), seq_of(&b, n, 0))), "{n}");
    }
}

#[test]
fn an_extra_op_in_one_step_does_not_shift_the_next() {
    let mut t = Sides::default();
    let a = write(t.side("a"), &[abcde(), abcde()], "float32");
    let mut s0 = abcde();
    s0.push(op("aten::a", 4)); // looks like the start of step 1
    let b = write(t.side("b"), &[s0, abcde()], "float32");
    let (da, db, al) = t.align("a", "b");
    assert_eq!(seqs(&db, &al.only_b), vec![seq_of(&b, "aten::a", 1)]);
    let pairs = seq_pairs(&da, &db, &al);
    assert!(pairs.contains(&(seq_of(&a, "aten::a", 1), seq_of(&b, "aten::a", 2))));
    assert_eq!(pairs.len(), 10);
}

#[test]
fn dtypes_do_not_matter_shapes_do() {
    let mut t = Sides::default();
    write(t.side("a"), &[abcde()], "float32");
    write(t.side("b"), &[abcde()], "bfloat16");
    let (_, _, al) = t.align("a", "b");
    assert_eq!(al.pairs.len(), 5);
    assert!(al.pairs.iter().all(|p| !p.loose()));

    // Same op names with other shapes pair only loosely (shape mismatch).
    let mut t = Sides::default();
    write(t.side("a"), &[abcde()], "float32");
    let mut bl = abcde();
    bl[2].size = 5;
    write(t.side("b"), &[bl], "float32");
    let (_, _, al) = t.align("a", "b");
    assert_eq!(al.pairs.len(), 5);
    assert_eq!(al.pairs.iter().filter(|p| p.loose()).count(), 1);
}

#[test]
fn long_repetitive_run_aligns_layer_by_layer() {
    let layers = 3000;
    let layer = |copy_first: bool, gelu: bool| {
        let mut v = Vec::new();
        v.push(tree(
            "aten::layer_norm",
            8,
            vec![op("aten::native_layer_norm", 8)],
        ));
        if copy_first {
            v.push(copy());
        }
        v.push(tree(
            "aten::linear",
            8,
            vec![op("aten::t", 8), op("aten::addmm", 8)],
        ));
        if gelu {
            v.push(op("aten::gelu", 8));
        }
        v
    };
    let mut t = Sides::default();
    let a_calls: Vec<N> = (0..layers).flat_map(|_| layer(false, true)).collect();
    let b_calls: Vec<N> = (0..layers)
        .flat_map(|l| layer(l % 7 == 3, l != 1500))
        .collect();
    let a = write(t.side("a"), &[a_calls], "float32");
    let b = write(t.side("b"), &[b_calls], "float32");
    let start = std::time::Instant::now();
    let (da, db, al) = t.align("a", "b");
    assert!(start.elapsed().as_secs() < 20);
    // Only layer 1500's gelu is missing; only the copies are extra.
    assert_eq!(seqs(&da, &al.only_a), vec![seq_of(&a, "aten::gelu", 1500)]);
    let copies: Vec<i64> = b
        .iter()
        .filter(|c| c.0 == "aten::_to_copy")
        .map(|c| c.1)
        .collect();
    assert_eq!(seqs(&db, &al.only_b), copies);
    // Layer i of A pairs with layer i of B.
    let pairs = seq_pairs(&da, &db, &al);
    for l in [0, 1499, 1500, 1501, layers - 1] {
        let p = (seq_of(&a, "aten::addmm", l), seq_of(&b, "aten::addmm", l));
        assert!(pairs.contains(&p), "addmm of layer {l}");
    }
    assert_eq!(pairs.len(), layers * 6 - 1);
}

/// Three layers calling the same op with the same shapes; B lacks layer 0's
/// call. Module paths decide which calls pair: without them the first two
/// calls of A would pair with B's two (layer 0 with layer 1).
fn write_layers(out: &mut Vec<OpRecord>, layers: &[usize], with_modules: bool) {
    let mut w = DumpWriter::in_memory();
    for &l in layers {
        w.module = with_modules.then(|| format!("layers.{l}"));
        w.leaf(
            "aten::mul",
            "Tensor",
            "",
            vec![input("self", "float32", &[8], l as f64)],
            vec![output(0, "float32", &[8], l as f64)],
        )
        .expect("write");
    }
    *out = w.records();
}

#[test]
fn module_paths_decide_which_calls_pair() {
    let mut t = Sides::default();
    write_layers(t.side("a"), &[0, 1, 2], true);
    write_layers(t.side("b"), &[1, 2], true);
    let (da, db, al) = t.align("a", "b");
    assert_eq!(seq_pairs(&da, &db, &al), vec![(1, 0), (2, 1)]);
    assert_eq!(seqs(&da, &al.only_a), vec![0]);
    assert_eq!(da.module_of(al.only_a[0]), Some("layers.0"));

    // Without module paths on one side, alignment goes by signature alone.
    write_layers(t.side("c"), &[1, 2], false);
    let (da, dc, al) = t.align("a", "c");
    assert!(!dc.has_modules);
    assert_eq!(seq_pairs(&da, &dc, &al), vec![(0, 0), (1, 1)]);
}

/// An eager run nests decomposed ops under composite ones (`linear`,
/// `matmul` > `reshape`); compiled code runs the same ops as a flat list.
/// Too few roots match for one program, so the wrappers are dissolved,
/// down two levels, and every op pairs with its own.
#[test]
fn a_flat_compiled_run_aligns_with_the_nested_eager_one() {
    let mut t = Sides::default();
    let linear = || {
        tree(
            "aten::linear",
            8,
            vec![op("aten::t", 8), op("aten::addmm", 8)],
        )
    };
    let eager = vec![
        linear(),
        tree(
            "aten::matmul",
            8,
            vec![
                tree("aten::reshape", 8, vec![op("aten::view", 8)]),
                op("aten::bmm", 8),
            ],
        ),
        op("aten::gelu", 8),
        linear(),
    ];
    let flat = [
        "aten::t",
        "aten::addmm",
        "aten::view",
        "aten::bmm",
        "aten::gelu",
        "aten::t",
        "aten::addmm",
    ];
    let a = write(t.side("a"), &[eager], "float32");
    let b = write(
        t.side("b"),
        &[flat.iter().map(|&n| op(n, 8)).collect()],
        "float32",
    );
    let (da, db, al) = t.align("a", "b");
    assert!(al.only_a.is_empty(), "{:?}", seqs(&da, &al.only_a));
    assert!(al.only_b.is_empty(), "{:?}", seqs(&db, &al.only_b));
    let pairs = seq_pairs(&da, &db, &al);
    for (name, k) in [
        ("aten::t", 0),
        ("aten::addmm", 0),
        ("aten::view", 0),
        ("aten::bmm", 0),
        ("aten::gelu", 0),
        ("aten::t", 1),
        ("aten::addmm", 1),
    ] {
        assert!(
            pairs.contains(&(seq_of(&a, name, k), seq_of(&b, name, k))),
            "{name} #{k} not paired"
        );
    }
    assert_eq!(pairs.len(), 7);
    // Counted on the lists as dissolved: all 7 calls of each side pair.
    assert_eq!(al.roots_matched_of_larger(), (7, 7));
}

/// A child that re-dispatches its parent's op (autocast) is looked
/// through.
#[test]
fn autocast_redispatch_is_looked_through() {
    // fp32: linear > [t, addmm]; autocast: linear > [to, to, linear > [t, addmm]].
    let mut t = Sides::default();
    let write = |out: &mut Vec<OpRecord>, autocast: bool| {
        let mut w = DumpWriter::in_memory();
        let dt = if autocast { "bfloat16" } else { "float32" };
        let x = |dt: &str| input("input", dt, &[4, 8], 1.0);
        let lin = w.begin("aten::linear", "default", "", vec![x("float32")]);
        let inner = if autocast {
            for _ in 0..2 {
                w.leaf(
                    "aten::to",
                    "dtype",
                    "dtype=torch.bfloat16",
                    vec![x("float32")],
                    vec![output(0, dt, &[4, 8], 1.0)],
                )
                .unwrap();
            }
            Some(w.begin("aten::linear", "default", "", vec![x(dt)]))
        } else {
            None
        };
        w.leaf(
            "aten::t",
            "default",
            "",
            vec![input("self", dt, &[8, 8], 1.0)],
            vec![output(0, dt, &[8, 8], 1.0)],
        )
        .unwrap();
        w.leaf(
            "aten::addmm",
            "default",
            "",
            vec![x(dt)],
            vec![output(0, dt, &[4, 8], 1.0)],
        )
        .unwrap();
        if let Some(inner) = inner {
            w.end(inner, vec![output(0, dt, &[4, 8], 1.0)]).unwrap();
        }
        w.end(lin, vec![output(0, dt, &[4, 8], 1.0)]).unwrap();
        *out = w.records();
    };
    write(t.side("a"), false);
    write(t.side("b"), true);
    let (da, db, al) = t.align("a", "b");
    let names: Vec<String> = al.pairs.iter().map(|p| da.full_name(p.a)).collect();
    assert_eq!(names, vec!["aten::linear", "aten::t", "aten::addmm"]);
    assert_eq!(seqs(&db, &al.only_b), vec![1, 2]);
    assert!(al.only_a.is_empty());
}
