//! The accuracy check's table: `checks/rank=<R>/part-<pid>.jsonl` holds a
//! [`CheckLine`] per checked call and, at the process's exit, one
//! [`CheckSummary`] (a job killed before its exit has none).

use serde::{Deserialize, Serialize};

use super::Kind;

/// A check's verdict.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Default)]
#[serde(rename_all = "snake_case")]
pub enum Verdict {
    Pass,
    Fail,
    #[default]
    NoReference,
}

impl Verdict {
    pub const fn as_str(self) -> &'static str {
        match self {
            Verdict::Pass => "pass",
            Verdict::Fail => "fail",
            Verdict::NoReference => "no_reference",
        }
    }
}

/// A checked call, all but its verdict: what a report of failures shows.
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CheckedCall {
    /// `op.overload(dtype[shape], ...; other arguments)`: what makes two
    /// calls the same check.
    pub signature: String,
    pub op: String,
    pub overload: String,
    /// The non-tensor arguments as text.
    pub args: String,
    pub module: Option<String>,
    /// `forward`, `backward` or `optimizer`.
    pub phase: String,
    pub step: i64,
    pub seq: i64,
    pub rank: u32,
    /// The device of the call's outputs, and their dtype.
    pub device: String,
    pub dtype: String,
    /// ||device - float64|| / ||float64||, largest over the outputs.
    pub device_err: Option<f64>,
    /// ||CPU in the same dtype - float64|| / ||float64||.
    pub cpu_err: Option<f64>,
    /// ||device - CPU in the same dtype|| / ||CPU||; files of older
    /// plugins lack it.
    #[serde(default)]
    pub device_vs_cpu: Option<f64>,
    /// device_err over what a correct kernel of the dtype shows
    /// (`opdump_judge::check::ratio`).
    pub ratio: Option<f64>,
    /// Largest distance from float64 in units in the last place, for
    /// element-wise ops.
    pub device_ulp: Option<f64>,
    pub cpu_ulp: Option<f64>,
    /// Elements summed into each output, for reductions and contractions
    /// (a count, read whether written as an integer or a float).
    pub reduction_len: Option<f64>,
    /// Why there is no reference.
    pub reason: Option<String>,
    /// The capture file of a failed call, relative to the dump's root
    /// (`checks/rank=<R>/<file>.safetensors`).
    pub capture: Option<String>,
    /// For an op whose outputs are tensor lists (`_foreach_*`,
    /// `_fused_adamw_`): the list index this line judges (a line per
    /// index); null for any other op. Files of older plugins lack it.
    #[serde(default)]
    pub element: Option<u32>,
    /// The parameter at that index, where the dump knows it (a gradient's
    /// list names its parameter). Files of older plugins lack it.
    #[serde(default)]
    pub name: Option<String>,
}

/// One checked call (`"kind": "check"`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CheckLine {
    pub kind: Kind,
    #[serde(flatten)]
    pub call: CheckedCall,
    pub verdict: Verdict,
}

impl CheckLine {
    /// The fields a line must hold (`null` where the plugin has no value),
    /// so that a line cut down by hand is caught; the others may be
    /// missing from an older plugin's file.
    pub const REQUIRED: &'static [&'static str] = &[
        "signature",
        "op",
        "overload",
        "args",
        "module",
        "phase",
        "step",
        "seq",
        "rank",
        "device",
        "dtype",
        "device_err",
        "cpu_err",
        "ratio",
        "device_ulp",
        "cpu_ulp",
        "reduction_len",
        "verdict",
        "reason",
        "capture",
    ];
}

/// What a process checked, at its exit (`"kind": "summary"`).
#[derive(Serialize, Deserialize, Clone, Debug, Default, PartialEq)]
pub struct CheckSummary {
    pub kind: Kind,
    pub rank: u32,
    pub pid: i64,
    /// Calls judged, and by verdict.
    pub checked: u64,
    pub passed: u64,
    pub failed: u64,
    pub no_reference: u64,
    /// Distinct signatures met.
    pub signatures: u64,
    /// Signatures not checked: one call's tensors over
    /// OPDUMP_CHECK_MAX_BYTES (written as no_reference), the time budget
    /// spent, the checking thread's queue full at every call.
    pub skipped_bytes: u64,
    pub skipped_budget: u64,
    pub skipped_busy: u64,
    /// Checks still queued when the process exited; files of older
    /// plugins lack it.
    #[serde(default)]
    pub unfinished: u64,
    /// Lines and capture files that could not be written; files of older
    /// plugins lack it.
    #[serde(default)]
    pub write_failures: u64,
    /// Seconds the checking thread spent.
    #[serde(default)]
    pub seconds: f64,
    /// Checks of a signature again in a later step
    /// (OPDUMP_CHECK_RECHECK), among `checked`; files of older plugins
    /// lack it.
    #[serde(default)]
    pub rechecks: u64,
    /// The signatures met and never checked in the process (the time
    /// budget spent, or the checking thread's queue full at each call), in
    /// the order first met, at most [`CheckSummary::MAX_UNCHECKED`]; files
    /// of older plugins lack it: none known.
    #[serde(default)]
    pub unchecked: Vec<Unchecked>,
    /// Calls that waited for room in the checking thread's queue
    /// (OPDUMP_CHECK_WAIT), and the seconds they waited in all; files of
    /// older plugins lack them.
    #[serde(default)]
    pub waits: u64,
    #[serde(default)]
    pub wait_seconds: f64,
}

/// Why a signature was never checked.
#[derive(Serialize, Deserialize, Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord)]
#[serde(rename_all = "snake_case")]
pub enum SkipCause {
    /// OPDUMP_CHECK_SECONDS was spent (counted in `skipped_budget`).
    Budget,
    /// The checking thread's queue was full at each call (counted in
    /// `skipped_busy`).
    Busy,
}

impl SkipCause {
    pub const fn as_str(self) -> &'static str {
        match self {
            SkipCause::Budget => "budget",
            SkipCause::Busy => "busy",
        }
    }
}

/// A signature met and never checked (see [`CheckSummary::unchecked`]).
#[derive(Serialize, Deserialize, Clone, Debug, PartialEq)]
pub struct Unchecked {
    pub signature: String,
    pub op: String,
    pub overload: String,
    pub why: SkipCause,
}

impl CheckSummary {
    /// The most signatures a summary lists in `unchecked`: the line stays
    /// short; the counts stay exact.
    pub const MAX_UNCHECKED: usize = 10_000;

    /// The fields a summary line must hold (see [`CheckLine::REQUIRED`]).
    pub const REQUIRED: &'static [&'static str] = &[
        "rank",
        "pid",
        "checked",
        "passed",
        "failed",
        "no_reference",
        "signatures",
        "skipped_bytes",
        "skipped_budget",
        "skipped_busy",
    ];
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::{Map, Value};

    fn keys<T: Serialize>(t: &T) -> Map<String, Value> {
        match serde_json::to_value(t).unwrap() {
            Value::Object(m) => m,
            v => panic!("not an object: {v}"),
        }
    }

    /// Every required field is written, and every field written but not
    /// required is one an older plugin's file may lack.
    #[test]
    fn required_fields_are_the_written_ones_but_the_later_additions() {
        let line = keys(&CheckLine::default());
        for f in CheckLine::REQUIRED {
            assert!(line.contains_key(*f), "{f}");
        }
        let extra: Vec<&str> = line
            .keys()
            .map(String::as_str)
            .filter(|k| !CheckLine::REQUIRED.contains(k))
            .collect();
        assert_eq!(extra, ["device_vs_cpu", "element", "kind", "name"]);
        let summary = keys(&CheckSummary::default());
        for f in CheckSummary::REQUIRED {
            assert!(summary.contains_key(*f), "{f}");
        }
        let extra: Vec<&str> = summary
            .keys()
            .map(String::as_str)
            .filter(|k| !CheckSummary::REQUIRED.contains(k))
            .collect();
        assert_eq!(
            extra,
            [
                "kind",
                "rechecks",
                "seconds",
                "unchecked",
                "unfinished",
                "wait_seconds",
                "waits",
                "write_failures"
            ]
        );
    }

    #[test]
    fn a_line_reads_back_as_written() {
        let line = CheckLine {
            kind: Kind::Check,
            call: CheckedCall {
                signature: "aten::mm.default(float32[4, 4], float32[4, 4])".into(),
                op: "aten::mm".into(),
                phase: "forward".into(),
                ratio: Some(3.5),
                reduction_len: Some(4.0),
                ..CheckedCall::default()
            },
            verdict: Verdict::Fail,
        };
        let text = serde_json::to_string(&line).unwrap();
        assert!(
            text.starts_with(r#"{"kind":"check","signature":"#),
            "{text}"
        );
        assert!(text.contains(r#""verdict":"fail""#), "{text}");
        assert_eq!(serde_json::from_str::<CheckLine>(&text).unwrap(), line);
        // A count written as an integer reads as the same number.
        let int = text.replace(r#""reduction_len":4.0"#, r#""reduction_len":4"#);
        assert_eq!(serde_json::from_str::<CheckLine>(&int).unwrap(), line);
    }

    /// An older plugin's summary, without the list of unchecked signatures
    /// or the waits, reads as none known; a newer one reads back as written.
    #[test]
    fn a_summary_without_the_later_fields_reads_as_none_known() {
        let old = r#"{"kind":"summary","rank":0,"pid":7,"checked":3,"passed":3,"failed":0,"no_reference":0,"signatures":5,"skipped_bytes":0,"skipped_budget":1,"skipped_busy":1}"#;
        let s: CheckSummary = serde_json::from_str(old).unwrap();
        assert_eq!((s.skipped_budget, s.skipped_busy), (1, 1));
        assert!(s.unchecked.is_empty());
        assert_eq!((s.waits, s.wait_seconds), (0, 0.0));
        let new = CheckSummary {
            kind: Kind::Summary,
            skipped_busy: 1,
            unchecked: vec![Unchecked {
                signature: "aten::mm.default(float32[4, 4], float32[4, 4])".into(),
                op: "aten::mm".into(),
                overload: "default".into(),
                why: SkipCause::Busy,
            }],
            waits: 2,
            wait_seconds: 0.5,
            ..CheckSummary::default()
        };
        let text = serde_json::to_string(&new).unwrap();
        assert!(text.contains(r#""why":"busy""#), "{text}");
        assert_eq!(serde_json::from_str::<CheckSummary>(&text).unwrap(), new);
    }
}
