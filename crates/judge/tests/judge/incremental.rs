//! The judge fed one (step, phase) group at a time gives the judgement of
//! one pass over every pair, with or without a thread measuring ahead.

use opdump_judge::{align, Alignment, Dump, Filter, Judge, Judgement, Silent, Tolerances};
use opdump_testkit::synth::{model_records, Model, Variant};

/// A three-step training run and the same run with a 1% fault in one
/// `addmm` of step 1, aligned.
fn faulty_pair() -> (Dump, Dump, Alignment) {
    let m = Model {
        steps: 3,
        layers: 4,
        tokens: 8,
        hidden: 16,
    };
    let v = Variant {
        noise: 1e-7,
        fault: Some((1, 2, 0.01)),
        ..Variant::default()
    };
    let a = crate::common::dump("a", &model_records(&m, &Variant::default(), false));
    let b = crate::common::dump("b", &model_records(&m, &v, true));
    let al = align(&a, &b, &Filter::default(), &Silent);
    (a, b, al)
}

/// What the judge decided, as comparable values.
fn decided(j: &Judgement) -> String {
    format!(
        "{:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?} {:?}",
        j.verdict,
        j.out_err,
        j.input_taint,
        j.tensor_counts,
        j.op_counts,
        j.first_divergence,
        j.first_introduced,
        j.headline,
        j.top_introduced
    )
}

#[test]
fn groups_cut_the_pairs_by_step_and_phase_and_cover_them_all() {
    let (a, _, al) = faulty_pair();
    let groups = al.groups();
    // Three steps of forward, backward and optimizer.
    assert_eq!(groups.len(), 9, "{groups:?}");
    let mut next = 0;
    for g in &groups {
        assert_eq!(g.start, next);
        let keys: std::collections::BTreeSet<_> = al.pairs[g.clone()]
            .iter()
            .map(|p| (a.step(p.a), a.phase(p.a)))
            .collect();
        assert_eq!(keys.len(), 1, "group {g:?} spans {keys:?}");
        next = g.end;
    }
    assert_eq!(next, al.pairs.len());
}

#[test]
fn group_by_group_is_one_pass_with_or_without_a_measuring_thread() {
    let (a, b, al) = faulty_pair();
    let tol = Tolerances::default();
    let one_pass = {
        let mut j = Judge::new(&a, &b, &al, &tol, 10);
        j.push(0..al.pairs.len(), &Silent);
        j.finish()
    };
    let by_group = std::thread::scope(|s| {
        let mut j = Judge::new(&a, &b, &al, &tol, 10);
        j.measure_ahead(s);
        for g in al.groups() {
            j.push(g, &Silent);
        }
        j.finish()
    });
    // Groups pushed out of order and twice: what is judged is judged once.
    let repeated = {
        let mut j = Judge::new(&a, &b, &al, &tol, 10);
        let groups = al.groups();
        j.push(groups[2].clone(), &Silent);
        j.push(groups[0].clone(), &Silent);
        j.finish()
    };
    assert!(one_pass.headline.is_some(), "the planted fault is found");
    assert_eq!(decided(&one_pass), decided(&by_group));
    assert_eq!(decided(&one_pass), decided(&repeated));
}
