//! Helpers shared by the judge's integration tests: dumps built in memory
//! from records (`Dump::from_records`), aligned or compared with the
//! default settings.

#![allow(dead_code)]

use std::collections::BTreeMap;

use opdump_format::{OpRecord, Role};
use opdump_judge::align::{align, Alignment, Filter};
use opdump_judge::compare::{compare_dumps, CompareSettings, Compared};
use opdump_judge::metrics::TensorCmp;
use opdump_judge::tolerance::Tolerances;
use opdump_judge::{Dump, OpVerdict, Silent, TensorVerdict};
use opdump_testkit::synth::DumpWriter;

/// The dump of rank 0 made of `records`.
pub fn dump(name: &str, records: &[OpRecord]) -> Dump {
    Dump::from_records(name, 0, records).expect("records make a dump")
}

/// The records of several dumps under construction, by name ("a", "b").
#[derive(Default)]
pub struct Sides {
    records: BTreeMap<String, Vec<OpRecord>>,
}

impl Sides {
    /// The records of dump `name`, to be filled.
    pub fn side(&mut self, name: &str) -> &mut Vec<OpRecord> {
        self.records.entry(name.to_string()).or_default()
    }

    /// The dump `name` is.
    pub fn dump(&self, name: &str) -> Dump {
        dump(name, self.records.get(name).map_or(&[], Vec::as_slice))
    }

    /// Dumps `a` and `b` and their alignment.
    pub fn align(&self, a: &str, b: &str) -> (Dump, Dump, Alignment) {
        align_dumps(self.dump(a), self.dump(b))
    }
}

pub fn align_dumps(da: Dump, db: Dump) -> (Dump, Dump, Alignment) {
    let al = align(&da, &db, &Filter::default(), &Silent);
    (da, db, al)
}

/// `opdump compare` of two dumps, with the default settings.
pub fn compare(a: Dump, b: Dump) -> Compared {
    let settings = CompareSettings {
        filter: Filter::default(),
        tol: Tolerances::default(),
        top: 10,
        force: false,
        context_before: None,
    };
    compare_dumps(a, b, settings, vec![], &Silent).expect("compare")
}

pub fn seqs(d: &Dump, idx: &[u32]) -> Vec<i64> {
    idx.iter().map(|&i| d.seq(i)).collect()
}

/// Matched (seq A, seq B) pairs.
pub fn seq_pairs(a: &Dump, b: &Dump, al: &Alignment) -> Vec<(i64, i64)> {
    al.pairs.iter().map(|p| (a.seq(p.a), b.seq(p.b))).collect()
}

/// Side A (`side_b` false) and side B made by `fill` in memory, compared
/// with the default settings.
pub fn compare_sides(fill: impl Fn(&mut DumpWriter, bool)) -> Compared {
    let side = |side_b: bool| {
        let mut w = DumpWriter::in_memory();
        fill(&mut w, side_b);
        w.records()
    };
    compare(dump("a", &side(false)), dump("b", &side(true)))
}

/// The op (A's name) of pair `pair`, when there is one.
pub fn op_of(c: &Compared, pair: Option<usize>) -> Option<&str> {
    pair.map(|k| c.a.op_name(c.alignment.pairs[k].a))
}

/// A's step of pair `pair`.
pub fn step_of(c: &Compared, pair: Option<usize>) -> Option<i64> {
    pair.map(|k| c.a.step(c.alignment.pairs[k].a))
}

/// A's seq of pair `pair`.
pub fn seq_of(c: &Compared, pair: Option<usize>) -> Option<i64> {
    pair.map(|k| c.a.seq(c.alignment.pairs[k].a))
}

/// Aligned op calls with verdict `v`.
pub fn ops_judged(c: &Compared, v: OpVerdict) -> u64 {
    c.op_counts[v as usize]
}

/// Tensor pairs with verdict `v`.
pub fn tensors_judged(c: &Compared, v: TensorVerdict) -> u64 {
    c.tensor_counts[v as usize]
}

/// Seqs (A side) of the aligned ops with verdict `v`.
pub fn with_verdict(c: &Compared, v: OpVerdict) -> Vec<i64> {
    (0..c.alignment.pairs.len())
        .filter(|&k| c.op_verdict(k) == v)
        .map(|k| c.a.seq(c.alignment.pairs[k].a))
        .collect()
}

/// The headline was a later introduced op that dominates the first.
pub fn headline_dominates(c: &Compared) -> bool {
    c.headline.is_some() && c.headline != c.first_introduced
}

/// The tensors of pair `pair` as the report measures them.
pub fn tensors_of(c: &Compared, pair: usize) -> Vec<TensorCmp> {
    c.detail(pair).tensors
}

/// The first output tensor of pair `pair`.
pub fn output_of(c: &Compared, pair: usize) -> TensorCmp {
    tensors_of(c, pair)
        .into_iter()
        .find(|t| t.role == Role::Output)
        .expect("an output")
}
