//! The ranks vote: the ranks of one data-parallel job against each other,
//! by fingerprint.
//!
//! Every rank applies the same all-reduced gradients to the same
//! parameters, so a parameter and its gradient as the optimizer reads and
//! writes them, and a parameter as a forward reads it, hold the same bits on
//! every rank. Each such tensor ([`TensorKey`], the same on every rank) is a
//! vote among the ranks that measured it: a strict majority names the odd
//! ranks out; without one, an optimizer tensor is a split (no rank can be
//! named) and a forward tensor is not judged (buffers may differ per rank).
//!
//! The caller feeds [`Entry`]s window by window (whole steps, every rank's
//! rows of those steps, occurrences numbered with [`number_occurrences`])
//! into a [`Tally`].

use std::collections::BTreeMap;

use opdump_format::{Phase, Role};

use crate::intern::{FxMap, Interner};

/// Whether a tensor row takes part in the vote: the optimizer reads and
/// writes parameters and their gradients; a forward reads parameters (and
/// buffers). Gradients before the optimizer are each rank's own, not yet
/// reduced, and a row without a tensor (`role` none) has nothing to vote.
pub fn votes_on(phase: Phase, name: &str, role: Role) -> bool {
    let phase_holds_reduced = match phase {
        Phase::Optimizer => true,
        Phase::Forward => !name.ends_with(".grad"),
        _ => false,
    };
    phase_holds_reduced && role != Role::None
}

/// What a tensor is, the same on every rank: extra calls on one rank shift
/// seqs, not keys. Strings are ids in [`Keys::strings`].
#[derive(Clone, Copy, PartialEq, Eq, Hash, Debug)]
pub struct TensorKey {
    /// The phase of the call.
    pub phase: Phase,
    /// The op's name.
    pub op: u32,
    /// The op's overload.
    pub overload: u32,
    /// The parameter (or its `.grad`).
    pub name: u32,
    /// Input or output of the call.
    pub role: Role,
    /// The argument's name or the result's index.
    pub arg: u32,
    /// The position in a `Tensor[]` argument, -1 for none.
    pub list_index: i32,
}

/// The keys seen so far, each with a dense id, and the strings they name.
#[derive(Default)]
pub struct Keys {
    /// The strings of keys and modules.
    pub strings: Interner,
    ids: FxMap<TensorKey, u32>,
    keys: Vec<TensorKey>,
}

impl Keys {
    /// The id of `k`, new if it was not seen before.
    pub fn id(&mut self, k: TensorKey) -> u32 {
        if let Some(&id) = self.ids.get(&k) {
            return id;
        }
        let id = self.keys.len() as u32;
        self.keys.push(k);
        self.ids.insert(k, id);
        id
    }

    /// The key of an id that [`Keys::id`] returned.
    pub fn key(&self, id: u32) -> TensorKey {
        self.keys[id as usize]
    }
}

/// One rank's row of a voting tensor.
#[derive(Clone, Copy, Debug)]
pub struct Entry {
    /// The training step.
    pub step: i64,
    /// The call's seq on its rank.
    pub seq: i64,
    /// The fingerprint; `None` where not measured.
    pub fp: Option<u64>,
    /// The id of its [`TensorKey`] in [`Keys`].
    pub key: u32,
    /// The key's occurrence in its step on its rank, in seq order (set by
    /// [`number_occurrences`]).
    pub occ: u32,
    /// The rank that wrote it.
    pub rank: u32,
    /// The module running the call, an id in [`Keys::strings`] or
    /// [`crate::NO_ID`].
    pub module: u32,
}

/// Numbers each key's calls within its step, in seq order (rows of one
/// call are consecutive and keep their order). Entries of one rank only.
pub fn number_occurrences(entries: &mut [Entry]) {
    entries.sort_by_key(|e| (e.step, e.seq));
    let mut count: FxMap<(i64, u32), u32> = FxMap::default();
    for e in entries.iter_mut() {
        let c = count.entry((e.step, e.key)).or_insert(0);
        e.occ = *c;
        *c += 1;
    }
}

/// Tensors voted on, each one key measured at one step and occurrence.
#[derive(Debug, Default, Clone, Copy, PartialEq, Eq)]
pub struct VoteCounts {
    /// Measured on at least two ranks.
    pub compared: u64,
    /// The same fingerprint on every rank that measured it.
    pub agree: u64,
    /// A strict majority agrees; the other ranks are odd ones out.
    pub odd: u64,
    /// Optimizer tensors with no strict majority.
    pub split: u64,
    /// Forward tensors with no strict majority: not judged.
    pub not_judged: u64,
    /// Measured on one rank only.
    pub one_rank: u64,
}

/// How often a rank left the majority.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct OddRank {
    /// The rank.
    pub rank: u32,
    /// Tensors on which it left the majority.
    pub odd: u64,
    /// The first step where it did.
    pub first_step: i64,
}

/// One rank's vote on a tensor.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Voter {
    /// The rank.
    pub rank: u32,
    /// Its fingerprint.
    pub fingerprint: u64,
    /// The call's seq on that rank.
    pub seq: i64,
    /// The module, an id in [`Keys::strings`] or [`crate::NO_ID`].
    pub module: u32,
}

/// A tensor whose ranks disagree.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Disagreement {
    /// The fingerprint a strict majority holds; `None` for a split.
    pub majority: Option<u64>,
    /// The step.
    pub step: i64,
    /// The tensor's key.
    pub key: TensorKey,
    /// Which call of this op on this tensor in the step (0: the first).
    pub occurrence: u32,
    /// Ranks outside the majority; empty for a split.
    pub odd_ranks: Vec<u32>,
    /// Ranks of the majority; empty for a split.
    pub majority_ranks: Vec<u32>,
    /// The lowest rank of the majority (of all ranks, for a split).
    pub reference: Voter,
    /// The ranks outside the majority (every other rank, for a split).
    pub others: Vec<Voter>,
}

/// The counts and first disagreements of everything voted so far.
#[derive(Debug, Default)]
pub struct Tally {
    /// Tensors by outcome.
    pub counts: VoteCounts,
    /// Ranks that left the majority, by rank.
    pub by_rank: BTreeMap<u32, OddRank>,
    /// The first disagreements in order (by step, then call order on the
    /// reference rank), at most `listed`.
    pub first: Vec<Disagreement>,
    /// Disagreements in all.
    pub total: u64,
    listed: usize,
}

impl Tally {
    /// An empty tally that keeps the first `listed` disagreements.
    pub fn new(listed: usize) -> Self {
        Tally {
            listed,
            ..Tally::default()
        }
    }

    /// Votes on one window's entries: every rank's rows of whole steps,
    /// occurrences numbered. Steps of later windows come after this one's.
    pub fn vote_window(&mut self, entries: &mut [Entry], keys: &Keys) {
        entries.sort_unstable_by_key(|e| (e.step, e.key, e.occ, e.rank));
        let mut found = Vec::new();
        for group in entries.chunk_by(|a, b| (a.step, a.key, a.occ) == (b.step, b.key, b.occ)) {
            if let Some(d) = self.vote(group, keys) {
                found.push(d);
            }
        }
        found.sort_by_key(|d| (d.step, d.reference.seq));
        let room = self.listed.saturating_sub(self.first.len());
        self.first.extend(found.into_iter().take(room));
    }

    /// One tensor's vote among the ranks with a fingerprint (`group`:
    /// one step, key and occurrence, lowest rank first).
    fn vote(&mut self, group: &[Entry], keys: &Keys) -> Option<Disagreement> {
        let measured: Vec<Voter> = group
            .iter()
            .filter_map(|e| {
                Some(Voter {
                    rank: e.rank,
                    fingerprint: e.fp?,
                    seq: e.seq,
                    module: e.module,
                })
            })
            .collect();
        match measured.len() {
            0 => return None,
            1 => {
                self.counts.one_rank += 1;
                return None;
            }
            _ => self.counts.compared += 1,
        }
        let (top, votes) = top_vote(&measured)?;
        if votes == measured.len() {
            self.counts.agree += 1;
            return None;
        }
        let key = keys.key(group[0].key);
        let majority = 2 * votes > measured.len();
        if majority {
            self.counts.odd += 1;
        } else if key.phase == Phase::Forward {
            self.counts.not_judged += 1;
            return None;
        } else {
            self.counts.split += 1;
        }
        let step = group[0].step;
        let d = disagreement(&measured, majority.then_some(top), key, group[0]);
        for &r in &d.odd_ranks {
            let c = self.by_rank.entry(r).or_insert(OddRank {
                rank: r,
                odd: 0,
                first_step: step,
            });
            c.odd += 1;
            c.first_step = c.first_step.min(step);
        }
        self.total += 1;
        Some(d)
    }
}

/// The fingerprint most ranks hold (the last seen among equals) and how
/// many hold it.
fn top_vote(measured: &[Voter]) -> Option<(u64, usize)> {
    let mut votes: Vec<(u64, usize)> = Vec::new();
    for v in measured {
        match votes.iter_mut().find(|(fp, _)| *fp == v.fingerprint) {
            Some((_, c)) => *c += 1,
            None => votes.push((v.fingerprint, 1)),
        }
    }
    votes.into_iter().max_by_key(|(_, c)| *c)
}

/// The disagreement of `measured` (lowest rank first) on the tensor of
/// `first`, around the `majority` fingerprint if there is one.
fn disagreement(
    measured: &[Voter],
    majority: Option<u64>,
    key: TensorKey,
    first: Entry,
) -> Disagreement {
    let in_majority = |v: &Voter| Some(v.fingerprint) == majority;
    let reference = measured
        .iter()
        .find(|v| in_majority(v))
        .copied()
        .unwrap_or(measured[0]);
    let others: Vec<Voter> = measured
        .iter()
        .filter(|v| !in_majority(v))
        .copied()
        .collect();
    let ranks_of = |vs: &mut dyn Iterator<Item = &Voter>| vs.map(|v| v.rank).collect();
    Disagreement {
        majority,
        step: first.step,
        key,
        occurrence: first.occ,
        odd_ranks: if majority.is_some() {
            ranks_of(&mut others.iter())
        } else {
            Vec::new()
        },
        majority_ranks: ranks_of(&mut measured.iter().filter(|v| in_majority(v))),
        reference,
        others,
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::NO_ID;

    fn key(keys: &mut Keys, phase: Phase, name: &str) -> u32 {
        let k = TensorKey {
            phase,
            op: keys.strings.intern("aten::add_"),
            overload: keys.strings.intern("Tensor"),
            name: keys.strings.intern(name),
            role: Role::Input,
            arg: keys.strings.intern("self"),
            list_index: -1,
        };
        keys.id(k)
    }

    fn entry(step: i64, seq: i64, key: u32, rank: u32, fp: Option<u64>) -> Entry {
        Entry {
            step,
            seq,
            fp,
            key,
            occ: 0,
            rank,
            module: NO_ID,
        }
    }

    /// One tensor voted by ranks holding `fps` (rank i holds fps[i]).
    fn vote_one(phase: Phase, fps: &[Option<u64>]) -> Tally {
        let mut keys = Keys::default();
        let k = key(&mut keys, phase, "w");
        let mut e: Vec<Entry> = (0..fps.len())
            .map(|r| entry(0, 10 + r as i64, k, r as u32, fps[r]))
            .collect();
        let mut t = Tally::new(10);
        t.vote_window(&mut e, &keys);
        t
    }

    #[test]
    fn occurrences_follow_seq_within_a_step() {
        let e = |step, seq, key| Entry {
            occ: 9,
            ..entry(step, seq, key, 0, Some(1))
        };
        let mut v = vec![e(0, 5, 1), e(0, 2, 1), e(1, 1, 1), e(0, 3, 2)];
        number_occurrences(&mut v);
        let got: Vec<(i64, i64, u32)> = v.iter().map(|e| (e.step, e.seq, e.occ)).collect();
        assert_eq!(got, vec![(0, 2, 0), (0, 3, 0), (0, 5, 1), (1, 1, 0)]);
    }

    #[test]
    fn a_strict_majority_names_the_odd_rank() {
        let t = vote_one(Phase::Optimizer, &[Some(7), Some(7), Some(9), Some(7)]);
        assert_eq!(t.counts.compared, 1);
        assert_eq!(t.counts.odd, 1);
        let d = &t.first[0];
        assert_eq!(d.majority, Some(7));
        assert_eq!(d.odd_ranks, vec![2]);
        assert_eq!(d.majority_ranks, vec![0, 1, 3]);
        assert_eq!(d.reference.rank, 0);
        assert_eq!(d.others.len(), 1);
        assert_eq!(d.others[0].fingerprint, 9);
        assert_eq!(t.by_rank[&2].odd, 1);
    }

    #[test]
    fn no_majority_splits_the_optimizer_and_skips_the_forward() {
        let t = vote_one(Phase::Optimizer, &[Some(1), Some(2)]);
        assert_eq!((t.counts.split, t.total), (1, 1));
        let d = &t.first[0];
        assert_eq!(d.majority, None);
        assert!(d.odd_ranks.is_empty() && d.majority_ranks.is_empty());
        assert_eq!(d.others.len(), 2);
        assert!(t.by_rank.is_empty());
        let f = vote_one(Phase::Forward, &[Some(1), Some(2)]);
        assert_eq!((f.counts.not_judged, f.total), (1, 0));
    }

    #[test]
    fn unmeasured_ranks_do_not_vote() {
        let t = vote_one(Phase::Optimizer, &[Some(3), None, Some(3)]);
        assert_eq!((t.counts.compared, t.counts.agree), (1, 1));
        let one = vote_one(Phase::Optimizer, &[None, Some(3)]);
        assert_eq!((one.counts.compared, one.counts.one_rank), (0, 1));
    }

    #[test]
    fn findings_are_listed_by_step_then_seq_and_capped() {
        let mut keys = Keys::default();
        let (a, b) = (
            key(&mut keys, Phase::Optimizer, "a"),
            key(&mut keys, Phase::Optimizer, "b"),
        );
        let mut e = Vec::new();
        // Key b is called before key a on rank 0; rank 2 is odd on both.
        for (k, seq) in [(a, 20), (b, 10)] {
            for r in 0..3u32 {
                e.push(entry(0, seq + i64::from(r), k, r, Some(u64::from(r == 2))));
            }
        }
        let mut t = Tally::new(1);
        t.vote_window(&mut e, &keys);
        assert_eq!(t.total, 2);
        assert_eq!(t.first.len(), 1);
        assert_eq!(t.first[0].key.name, keys.key(b).name);
        assert_eq!(t.by_rank[&2].odd, 2);
    }

    #[test]
    fn only_reduced_tensors_vote() {
        assert!(votes_on(Phase::Optimizer, "w.grad", Role::Input));
        assert!(votes_on(Phase::Forward, "w", Role::Input));
        assert!(!votes_on(Phase::Forward, "w.grad", Role::Input));
        assert!(!votes_on(Phase::Backward, "w", Role::Output));
        assert!(!votes_on(Phase::Optimizer, "w", Role::None));
    }
}
