//! Inserting or deleting calls on one side never misaligns the rest: every
//! call that both dumps hold pairs with its counterpart, at the top level
//! and under a matched parent. Dumps are built in memory.

use opdump_format::OpRecord;
use opdump_judge::{align, Dump, Filter, Silent, NONE};
use opdump_testkit::calls::{call, under};
use opdump_testkit::synth::{input, output};
use proptest::prelude::*;

/// Op names of the program; inserted calls reuse them with shapes no
/// original call has, so only their shapes tell them apart.
const OPS: [&str; 4] = ["aten::add", "aten::mul", "aten::linear", "aten::relu"];
const CHILD_OPS: [&str; 2] = ["aten::mm", "aten::view"];

/// One call of the program and what happens to it on side B: `drop` below
/// 2 of 10 deletes it (with its subtree), `insert` below 2 of 10 puts a new
/// call before it.
#[derive(Clone, Debug)]
struct Edit {
    drop: u8,
    insert: u8,
}

impl Edit {
    fn kept(&self) -> bool {
        self.drop >= 2
    }
    fn inserts(&self) -> bool {
        self.insert < 2
    }
}

#[derive(Clone, Debug)]
struct Root {
    edit: Edit,
    children: Vec<Edit>,
}

fn edit() -> impl Strategy<Value = Edit> {
    (0u8..10, 0u8..10).prop_map(|(drop, insert)| Edit { drop, insert })
}

/// Up to 150 top-level calls: past 64 or so on both sides, the diff takes
/// its unique-signature anchors rather than the small dynamic program.
fn program() -> impl Strategy<Value = Vec<Root>> {
    let root = (edit(), prop::collection::vec(edit(), 0..4))
        .prop_map(|(edit, children)| Root { edit, children });
    prop::collection::vec(root, 1..150)
}

/// Records in call order, seqs handed out as the plugin does (a parent
/// before its children).
#[derive(Default)]
struct Side {
    recs: Vec<OpRecord>,
}

impl Side {
    fn push(&mut self, op: &str, shape: &[i64], parent: Option<usize>) -> i64 {
        let seq = self.recs.len() as i64;
        let tensors = vec![
            input("self", "float32", shape, 1.0),
            output(0, "float32", shape, 2.0),
        ];
        let rec = call(seq, op, tensors);
        let rec = match parent {
            Some(p) => under(rec, &self.recs[p]),
            None => rec,
        };
        self.recs.push(rec);
        seq
    }
}

/// Side A (the program), side B (edited), and the (seq in A, seq in B) of
/// every call both hold. With `kinds`, top-level calls repeat with that
/// many distinct signatures (as the layers of a model repeat); without,
/// each has its own.
fn sides(
    program: &[Root],
    kinds: Option<usize>,
) -> (Vec<OpRecord>, Vec<OpRecord>, Vec<(i64, i64)>) {
    let (mut a, mut b) = (Side::default(), Side::default());
    let mut common = Vec::new();
    let mut inserted = 0i64;
    for (k, root) in program.iter().enumerate() {
        let (op, shape) = (
            OPS[k % OPS.len()],
            [(k % kinds.unwrap_or(k + 1)) as i64 + 1, 2],
        );
        if root.edit.inserts() {
            inserted += 1;
            b.push(
                OPS[inserted as usize % OPS.len()],
                &[1000 + inserted, 7],
                None,
            );
        }
        let pa = a.push(op, &shape, None) as usize;
        let pb = root.edit.kept().then(|| b.push(op, &shape, None) as usize);
        if let Some(pb) = pb {
            common.push((pa as i64, pb as i64));
        }
        for (j, child) in root.children.iter().enumerate() {
            let (cop, cshape) = (CHILD_OPS[j % 2], [k as i64 + 1, j as i64 + 3]);
            let ca = a.push(cop, &cshape, Some(pa));
            let Some(pb) = pb else { continue };
            if child.inserts() {
                inserted += 1;
                b.push(
                    CHILD_OPS[inserted as usize % 2],
                    &[2000 + inserted],
                    Some(pb),
                );
            }
            if child.kept() {
                common.push((ca, b.push(cop, &cshape, Some(pb))));
            }
        }
    }
    (a.recs, b.recs, common)
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    #[test]
    fn edits_on_one_side_never_misalign_the_rest(program in program()) {
        let (ra, rb, common) = sides(&program, None);
        let a = Dump::from_records("a", 0, &ra).unwrap();
        let b = Dump::from_records("b", 0, &rb).unwrap();
        let al = align(&a, &b, &Filter::default(), &Silent);
        for &(sa, sb) in &common {
            let (ia, ib) = (a.find_seq(sa).unwrap(), b.find_seq(sb).unwrap());
            let got = al.a_match[ia as usize];
            prop_assert!(
                got == ib,
                "{} (seq {sa} of A) pairs with {} in B, not seq {sb}",
                a.full_name(ia),
                if got == NONE { "nothing".to_string() } else { format!("seq {}", b.seq(got)) }
            );
        }
        // Nothing else pairs exactly: what is paired beyond the common calls
        // is a loose pair (same names, other shapes).
        let exact = al.pairs.iter().filter(|p| !p.loose()).count();
        prop_assert_eq!(exact, common.len());
    }
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(256))]

    /// Where calls repeat, which of two equal calls is "the" counterpart is
    /// not defined (nor, then, whose children pair): what holds is that
    /// exact pairs are equal calls, top-level ones in order and at least as
    /// many as the top-level calls both sides hold.
    #[test]
    fn edits_among_repeated_calls_leave_an_ordered_alignment_no_smaller(
        program in program(),
        kinds in 2usize..13,
    ) {
        let (ra, rb, common) = sides(&program, Some(kinds));
        let a = Dump::from_records("a", 0, &ra).unwrap();
        let b = Dump::from_records("b", 0, &rb).unwrap();
        let al = align(&a, &b, &Filter::default(), &Silent);
        let exact: Vec<_> = al.pairs.iter().filter(|p| !p.loose()).collect();
        for p in &exact {
            prop_assert_eq!(
                a.signature(p.a),
                b.signature(p.b),
                "seq {} with seq {}",
                a.seq(p.a),
                b.seq(p.b)
            );
        }
        let is_root = |p: &&&opdump_judge::Pair| a.parent_of(p.a).is_none();
        let roots: Vec<u32> = exact.iter().filter(is_root).map(|p| p.b).collect();
        prop_assert!(roots.windows(2).all(|w| w[0] < w[1]), "top-level pairs out of order");
        let common_roots = common
            .iter()
            .filter(|&&(sa, _)| ra[sa as usize].parent_seq.is_none())
            .count();
        prop_assert!(
            roots.len() >= common_roots,
            "{} top-level pairs, {} top-level calls in common",
            roots.len(),
            common_roots
        );
    }
}
