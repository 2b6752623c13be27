//! The verdict of a run judged step by step: each step's comparison adds
//! its groups' outcomes, and the run's first divergence, first introduced
//! divergence and headline follow the rules `opdump compare` applies to
//! the whole dumps (see `opdump_judge::compare::headline`).

use opdump_format::tables::verdict::{CallRef, CpuCheckLine, FinalLine, GroupLine};
use opdump_format::tables::Kind;
use opdump_format::Role;
use opdump_judge::compare::HEADLINE_DOMINANCE;
use opdump_judge::{Compared, Dump, OpVerdict, Outcome};

/// Aligned pair `pair` of a comparison, as the verdict file names it.
fn call_ref(c: &Compared, pair: usize) -> CallRef {
    let p = c.alignment.pairs[pair];
    let (a, b) = (&c.a, &c.b);
    let cmp = c.detail(pair);
    let allowed = cmp
        .tensors
        .iter()
        .filter(|t| t.role == Role::Output)
        .map(|t| t.allowed)
        .fold(cmp.tolerance, f64::max);
    let module = b.module_of(p.b).or_else(|| a.module_of(p.a));
    let fwd = b
        .fwd_of(p.b)
        .map(|f| (b, f))
        .or_else(|| a.fwd_of(p.a).map(|f| (a, f)));
    // This run's call (the selector names it); for one element of a list
    // call, which element, and whose list when it is the reference's.
    let element = c.alignment.element(pair).map(|e| match e.side {
        opdump_judge::Side::B => e.describe(),
        opdump_judge::Side::A => format!(
            "{} of the reference's {}",
            e.describe(),
            a.full_name(e.call)
        ),
    });
    CallRef {
        step: b.step(p.b),
        phase: b.phase(p.b).as_str().to_string(),
        op: b.op_name(p.b).to_string(),
        overload: b.overload_name(p.b).to_string(),
        element,
        seq_a: a.seq(p.a),
        seq_b: b.seq(p.b),
        module: module.map(str::to_string),
        fwd_op: fwd.map(|(d, f)| d.full_name(f)),
        rel_err: cmp.out_err.is_finite().then_some(cmp.out_err),
        allowed,
        tolerance: cmp.tolerance,
        selector: opdump_judge::selector::of_call(b, p.b).to_string(),
        excess: cmp.excess as f32,
    }
}

/// The fold over the steps judged so far.
#[derive(Default)]
pub struct Fold {
    first_divergence: Option<CallRef>,
    first_introduced: Option<CallRef>,
    headline: Option<CallRef>,
    dominant: bool,
    /// Calls only in this run changed a value before an aligned op read it
    /// (`Compared::first_unmatched_change`).
    unmatched_change: bool,
    pub steps_judged: u64,
    pub steps_missing: u64,
    pub cpu_check: Option<CpuCheckLine>,
    /// The call named when the first introduced divergence was found.
    named: Option<CallRef>,
}

impl Fold {
    /// The call named on the first introduced divergence's line.
    pub fn named(&self) -> Option<&CallRef> {
        self.named.as_ref()
    }

    /// Adds the comparison of `step` (and of the step before it, judged as
    /// context, whose verdicts were taken already): its groups' rows, and
    /// the call the run's headline newly names, if this step named the
    /// first one.
    pub fn add(&mut self, c: &Compared, step: i64) -> (Vec<GroupLine>, Option<CallRef>) {
        self.steps_judged += 1;
        let rows = group_rows(c, step);
        if self.first_divergence.is_none() {
            self.first_divergence = c.first_divergence.map(|k| call_ref(c, k));
        }
        self.unmatched_change |= c.first_unmatched_change.is_some();
        let mut named = None;
        match &self.first_introduced {
            None => {
                if let Some(first) = c.first_introduced {
                    self.first_introduced = Some(call_ref(c, first));
                    let head = c.headline.unwrap_or(first);
                    self.dominant = head != first;
                    self.headline = Some(call_ref(c, head));
                    named = self.headline.clone();
                    self.named = named.clone();
                }
            }
            // A later step's introduced call takes the headline when it goes
            // HEADLINE_DOMINANCE times further beyond its allowance than the
            // first did, as in one pass over the whole run: the earliest
            // such call (steps come in call order).
            Some(first) if !self.dominant => {
                let bar = HEADLINE_DOMINANCE * first.excess as f64;
                let dominant = c
                    .top_introduced
                    .iter()
                    .copied()
                    .filter(|&k| {
                        let e = c.detail(k).excess as f32;
                        e > first.excess && e as f64 >= bar
                    })
                    .min();
                if let Some(k) = dominant {
                    self.headline = Some(call_ref(c, k));
                    self.dominant = true;
                }
            }
            Some(_) => {}
        }
        (rows, named)
    }

    pub fn outcome(&self) -> Outcome {
        if self.headline.is_some() || self.unmatched_change {
            Outcome::Introduced
        } else if self.first_divergence.is_some() {
            Outcome::DriftOnly
        } else {
            Outcome::Agree
        }
    }

    pub fn final_row(&self) -> FinalLine {
        let outcome = self.outcome();
        FinalLine {
            kind: Kind::Final,
            outcome: outcome.as_str().to_string(),
            exit_status: outcome.exit_status(),
            headline: self.headline.clone(),
            headline_rule: self
                .headline
                .as_ref()
                .map(|_| if self.dominant { "dominant" } else { "first" }.to_string()),
            first_introduced: self.first_introduced.clone(),
            first_divergence: self.first_divergence.clone(),
            steps_judged: self.steps_judged,
            steps_missing: self.steps_missing,
            cpu_check: self.cpu_check.clone(),
        }
    }
}

/// Each (step, phase) group of this run's calls in the comparison.
fn group_rows(c: &Compared, judged: i64) -> Vec<GroupLine> {
    let b: &Dump = &c.b;
    let mut rows: Vec<GroupLine> = Vec::new();
    for (k, p) in c.alignment.pairs.iter().enumerate() {
        let (step, phase) = (b.step(p.b), b.phase(p.b).as_str());
        if step < judged {
            continue;
        }
        if !rows
            .last()
            .is_some_and(|r| r.step == step && r.phase == phase)
        {
            rows.push(GroupLine {
                kind: Kind::Group,
                step,
                phase: phase.to_string(),
                calls: 0,
                introduced: 0,
                inherited: 0,
                outcome: Outcome::Agree.as_str().to_string(),
                first_introduced: None,
            });
        }
        let Some(row) = rows.last_mut() else { continue };
        row.calls += 1;
        match c.op_verdict(k) {
            OpVerdict::Introduced => {
                row.introduced += 1;
                row.outcome = Outcome::Introduced.as_str().to_string();
                if row.first_introduced.is_none() {
                    row.first_introduced = Some(call_ref(c, k));
                }
            }
            OpVerdict::Inherited => {
                row.inherited += 1;
                if row.introduced == 0 {
                    row.outcome = Outcome::DriftOnly.as_str().to_string();
                }
            }
            _ => {}
        }
    }
    rows
}
