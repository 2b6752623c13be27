//! Helpers shared by the judge's integration tests: dumps built in memory
//! from records (`Dump::from_records`), aligned or compared with the
//! default settings.

#![allow(dead_code)]

use std::collections::BTreeMap;

use opdump_format::OpRecord;
use opdump_judge::align::{align, Alignment, Filter};
use opdump_judge::compare::{compare_dumps, CompareSettings, Compared};
use opdump_judge::tolerance::Tolerances;
use opdump_judge::{Dump, Silent};

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
