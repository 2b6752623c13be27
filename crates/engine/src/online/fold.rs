//! The verdict of a run judged step by step: each step's comparison adds
//! its groups' outcomes, and the run's first divergence, first introduced
//! divergence and headline follow the rules `opdump compare` applies to
//! the whole dumps (see `opdump_judge::compare::headline`).

use serde::Serialize;

use opdump_format::{Phase, Role};
use opdump_judge::compare::HEADLINE_DOMINANCE;
use opdump_judge::{Compared, Dump, OpVerdict, Outcome};

/// A call the judgement names, as the verdict file and the line show it.
#[derive(Serialize, Clone, Debug, PartialEq)]
pub struct CallRef {
    pub step: i64,
    pub phase: &'static str,
    pub op: String,
    pub overload: String,
    /// The call's seq in the reference and in this run.
    pub seq_a: i64,
    pub seq_b: i64,
    /// The innermost module running the call (a backward call's forward
    /// call's), this run's, else the reference's.
    pub module: Option<String>,
    /// A backward call's forward op (`op.overload`) and its module.
    pub fwd_op: Option<String>,
    /// Largest relative error of an output; null when infinite.
    pub rel_err: Option<f64>,
    /// What rounding and the inputs' error allow the output: the op's
    /// tolerance widened by its inputs' drift.
    pub allowed: f64,
    /// The op's own tolerance.
    pub tolerance: f64,
    /// The `OPDUMP_CAPTURE` selector of the call in this run.
    pub selector: String,
    /// Output error over what was allowed, for the headline rule.
    #[serde(skip)]
    excess: f32,
}

impl CallRef {
    fn of(c: &Compared, pair: usize) -> CallRef {
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
        CallRef {
            step: b.step(p.b),
            phase: b.phase(p.b).as_str(),
            op: b.op_name(p.b).to_string(),
            overload: b.overload_name(p.b).to_string(),
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

    /// `aten::gelu in blocks.0.mlp`, or for a backward call `aten::mm
    /// (backward of aten::linear in blocks.0.fc1)`.
    pub fn label(&self) -> String {
        let op = if self.overload == "default" {
            self.op.clone()
        } else {
            format!("{}.{}", self.op, self.overload)
        };
        let place = self
            .module
            .as_deref()
            .map(|m| format!(" in {m}"))
            .unwrap_or_default();
        match &self.fwd_op {
            Some(f) if self.phase == Phase::Backward.as_str() => {
                format!("{op} (backward of {f}{place})")
            }
            _ => format!("{op}{place}"),
        }
    }

    /// `output error 1.0e-2, where rounding and its inputs allow 2.4e-6`.
    pub fn error_text(&self) -> String {
        let err = self
            .rel_err
            .map_or("infinite (NaN/Inf or shapes differ)".to_string(), |e| {
                format!("{e:.1e}")
            });
        format!(
            "output error {err}, where rounding and its inputs allow {:.1e}",
            self.allowed
        )
    }
}

/// One (step, phase) group's outcome.
#[derive(Serialize, Debug)]
pub struct GroupRow {
    pub kind: &'static str,
    pub step: i64,
    pub phase: &'static str,
    /// Aligned calls judged.
    pub calls: u64,
    pub introduced: u64,
    pub inherited: u64,
    pub outcome: &'static str,
    /// The group's first introduced call.
    pub first_introduced: Option<CallRef>,
}

/// The CPU check of the named call ([`super::cpu_check`]).
#[derive(Serialize, Debug, Clone)]
pub struct CheckRow {
    pub kind: &'static str,
    /// The named call, as the lines say it.
    pub call: String,
    /// The selector of the call checked (captured in a later step).
    pub captured: Option<String>,
    /// Whether this run's device is off; null when nothing was compared.
    pub device_is_off: Option<bool>,
    #[serde(flatten)]
    pub found: super::cpu_check::Found,
}

/// The run's verdict so far.
#[derive(Serialize, Debug)]
pub struct FinalRow {
    pub kind: &'static str,
    pub outcome: &'static str,
    /// What `opdump compare REFERENCE THIS_DUMP` exits with for it.
    pub exit_status: u8,
    pub headline: Option<CallRef>,
    /// `first`, or `dominant` when a later call went ten times further
    /// beyond its allowance.
    pub headline_rule: Option<&'static str>,
    pub first_introduced: Option<CallRef>,
    pub first_divergence: Option<CallRef>,
    /// Steps compared with the reference, and steps it lacked.
    pub steps_judged: u64,
    pub steps_missing: u64,
    /// Which device is off, from the named call run again on the CPU.
    pub cpu_check: Option<CheckRow>,
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
    pub cpu_check: Option<CheckRow>,
    /// The call named when the first introduced divergence was found.
    named: Option<CallRef>,
}

impl Fold {
    /// The call named on the first introduced divergence's line.
    pub fn named(&self) -> Option<&CallRef> {
        self.named.as_ref()
    }

    /// Adds one step's comparison: its groups' rows, and the call the run's
    /// headline newly names, if this step named the first one.
    pub fn add(&mut self, c: &Compared) -> (Vec<GroupRow>, Option<CallRef>) {
        self.steps_judged += 1;
        let rows = group_rows(c);
        if self.first_divergence.is_none() {
            self.first_divergence = c.first_divergence.map(|k| CallRef::of(c, k));
        }
        self.unmatched_change |= c.first_unmatched_change.is_some();
        let mut named = None;
        match &self.first_introduced {
            None => {
                if let Some(first) = c.first_introduced {
                    self.first_introduced = Some(CallRef::of(c, first));
                    let head = c.headline.unwrap_or(first);
                    self.dominant = head != first;
                    self.headline = Some(CallRef::of(c, head));
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
                    self.headline = Some(CallRef::of(c, k));
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

    pub fn final_row(&self) -> FinalRow {
        let outcome = self.outcome();
        FinalRow {
            kind: "final",
            outcome: outcome.as_str(),
            exit_status: outcome.exit_status(),
            headline: self.headline.clone(),
            headline_rule: self.headline.as_ref().map(|_| {
                if self.dominant {
                    "dominant"
                } else {
                    "first"
                }
            }),
            first_introduced: self.first_introduced.clone(),
            first_divergence: self.first_divergence.clone(),
            steps_judged: self.steps_judged,
            steps_missing: self.steps_missing,
            cpu_check: self.cpu_check.clone(),
        }
    }
}

/// Each (step, phase) group of this run's calls in the comparison.
fn group_rows(c: &Compared) -> Vec<GroupRow> {
    let b: &Dump = &c.b;
    let mut rows: Vec<GroupRow> = Vec::new();
    for (k, p) in c.alignment.pairs.iter().enumerate() {
        let (step, phase) = (b.step(p.b), b.phase(p.b).as_str());
        if !rows
            .last()
            .is_some_and(|r| r.step == step && r.phase == phase)
        {
            rows.push(GroupRow {
                kind: "group",
                step,
                phase,
                calls: 0,
                introduced: 0,
                inherited: 0,
                outcome: Outcome::Agree.as_str(),
                first_introduced: None,
            });
        }
        let Some(row) = rows.last_mut() else { continue };
        row.calls += 1;
        match c.op_verdict(k) {
            OpVerdict::Introduced => {
                row.introduced += 1;
                row.outcome = Outcome::Introduced.as_str();
                if row.first_introduced.is_none() {
                    row.first_introduced = Some(CallRef::of(c, k));
                }
            }
            OpVerdict::Inherited => {
                row.inherited += 1;
                if row.introduced == 0 {
                    row.outcome = Outcome::DriftOnly.as_str();
                }
            }
            _ => {}
        }
    }
    rows
}
