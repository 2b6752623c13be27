//! The verdicts of a run judged against a reference while it ran
//! (`OPDUMP_REFERENCE`): `verdicts/rank=<R>/part-<pid>.jsonl` holds a
//! [`GroupLine`] per (step, phase) judged, a [`CpuCheckLine`] once the
//! named call was run again on the CPU, and a [`FinalLine`] with the run's
//! verdict so far after each step (the last one is the run's).

use serde::{Deserialize, Serialize};

use super::Kind;
use crate::Phase;

/// A call the judgement names, as the verdict file and the lines show it.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct CallRef {
    pub step: i64,
    pub phase: String,
    pub op: String,
    pub overload: String,
    /// For one element of a list call (`_foreach_`) judged against the
    /// other run's per-parameter call: `element 3, blocks.0.ln1.bias`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub element: Option<String>,
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
    /// Output error over what was allowed, for the headline rule of the
    /// run judging it; not written.
    #[serde(skip)]
    pub excess: f32,
}

impl CallRef {
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
            _ => match &self.element {
                Some(e) => format!("{op} ({e}){place}"),
                None => format!("{op}{place}"),
            },
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

/// One (step, phase) group's outcome (`"kind": "group"`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct GroupLine {
    pub kind: Kind,
    pub step: i64,
    pub phase: String,
    /// Aligned calls judged.
    pub calls: u64,
    pub introduced: u64,
    pub inherited: u64,
    /// `agree`, `drift_only` or `introduced` (`opdump_judge::Outcome`).
    pub outcome: String,
    /// The group's first introduced call.
    pub first_introduced: Option<CallRef>,
}

/// What the CPU check of the named call found.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct CpuFound {
    /// The device of the call's outputs in this run, and their dtype.
    pub device: String,
    pub dtype: String,
    /// ||device - float64|| / ||float64||, largest over the outputs.
    pub device_err: Option<f64>,
    /// ||CPU in the same dtype - float64|| / ||float64||.
    pub cpu_err: Option<f64>,
    /// Why nothing was compared.
    pub why: Option<String>,
}

/// The named call run again on the CPU (`"kind": "cpu_check"`), on its own
/// line and inside the final line.
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct CpuCheckLine {
    pub kind: Kind,
    /// The named call, as the lines say it.
    pub call: String,
    /// The selector of the call checked (captured in a later step).
    pub captured: Option<String>,
    /// Whether this run's device is off; null when nothing was compared.
    pub device_is_off: Option<bool>,
    #[serde(flatten)]
    pub found: CpuFound,
}

/// The run's verdict so far (`"kind": "final"`).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq, Default)]
pub struct FinalLine {
    pub kind: Kind,
    /// `agree`, `drift_only` or `introduced`.
    pub outcome: String,
    /// What `opdump compare REFERENCE THIS_DUMP` exits with for it.
    pub exit_status: u8,
    pub headline: Option<CallRef>,
    /// `first`, or `dominant` when a later call went ten times further
    /// beyond its allowance.
    pub headline_rule: Option<String>,
    pub first_introduced: Option<CallRef>,
    pub first_divergence: Option<CallRef>,
    /// Steps compared with the reference, and steps it lacked.
    pub steps_judged: u64,
    pub steps_missing: u64,
    /// Which device is off, from the named call run again on the CPU.
    pub cpu_check: Option<CpuCheckLine>,
}

#[cfg(test)]
mod tests {
    use super::*;

    fn call(phase: Phase) -> CallRef {
        CallRef {
            phase: phase.as_str().into(),
            op: "aten::mm".into(),
            overload: "default".into(),
            module: Some("blocks.0.fc1".into()),
            fwd_op: Some("aten::linear".into()),
            rel_err: Some(1e-2),
            allowed: 2.4e-6,
            excess: 3.0,
            ..CallRef::default()
        }
    }

    #[test]
    fn labels_name_the_backward_calls_forward_op() {
        assert_eq!(call(Phase::Forward).label(), "aten::mm in blocks.0.fc1");
        let element = CallRef {
            op: "aten::_foreach_lerp_".into(),
            element: Some("element 3, blocks.0.ln1.bias".into()),
            module: None,
            ..call(Phase::Optimizer)
        };
        assert_eq!(
            element.label(),
            "aten::_foreach_lerp_ (element 3, blocks.0.ln1.bias)"
        );
        assert_eq!(
            call(Phase::Backward).label(),
            "aten::mm (backward of aten::linear in blocks.0.fc1)"
        );
        assert_eq!(
            call(Phase::Forward).error_text(),
            "output error 1.0e-2, where rounding and its inputs allow 2.4e-6"
        );
    }

    #[test]
    fn a_final_line_reads_back_as_written_but_the_excess() {
        let line = FinalLine {
            kind: Kind::Final,
            outcome: "introduced".into(),
            exit_status: 1,
            headline: Some(call(Phase::Backward)),
            headline_rule: Some("first".into()),
            cpu_check: Some(CpuCheckLine {
                kind: Kind::CpuCheck,
                call: "aten::mm".into(),
                device_is_off: Some(true),
                found: CpuFound {
                    device: "cuda:0".into(),
                    device_err: Some(1e-2),
                    ..CpuFound::default()
                },
                ..CpuCheckLine::default()
            }),
            ..FinalLine::default()
        };
        let text = serde_json::to_string(&line).unwrap();
        assert!(
            text.starts_with(r#"{"kind":"final","outcome":"introduced""#),
            "{text}"
        );
        assert!(
            text.contains(r#""cpu_check":{"kind":"cpu_check","call":"aten::mm""#),
            "{text}"
        );
        assert!(!text.contains("excess"), "{text}");
        let back: FinalLine = serde_json::from_str(&text).unwrap();
        let mut expected = line;
        expected.headline.as_mut().unwrap().excess = 0.0;
        assert_eq!(back, expected);
    }
}
