//! The lines of `<OPDUMP_DIR>/checks/rank=<R>/part-<pid>.jsonl`: one
//! `check` line per checked call, and a `summary` line at the process's
//! exit (a job killed before its exit has none).

use serde::Serialize;

/// One checked call.
#[derive(Serialize, Clone, Debug, Default)]
pub struct CheckRow {
    pub kind: &'static str,
    /// `op.overload(dtype[shape], ...; other arguments)`: what makes two
    /// calls the same check.
    pub signature: String,
    pub op: String,
    pub overload: String,
    /// The non-tensor arguments as text.
    pub args: String,
    pub module: Option<String>,
    pub phase: &'static str,
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
    /// ||device - CPU in the same dtype|| / ||CPU||.
    pub device_vs_cpu: Option<f64>,
    /// device_err over what a correct kernel of the dtype shows
    /// (`opdump_judge::check::ratio`).
    pub ratio: Option<f64>,
    /// Largest distance from float64 in units in the last place, for
    /// element-wise ops.
    pub device_ulp: Option<f64>,
    pub cpu_ulp: Option<f64>,
    /// Elements summed into each output, for reductions and contractions.
    pub reduction_len: Option<f64>,
    /// `pass`, `fail` or `no_reference`.
    pub verdict: &'static str,
    /// Why there is no reference.
    pub reason: Option<String>,
    /// The capture file of a failed call, relative to OPDUMP_DIR.
    pub capture: Option<String>,
}

/// What a process checked, at its exit.
#[derive(Serialize, Clone, Debug, Default)]
pub struct SummaryRow {
    pub kind: &'static str,
    pub rank: u32,
    pub pid: i32,
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
    /// Checks still queued when the process exited.
    pub unfinished: u64,
    /// Lines and capture files that could not be written.
    pub write_failures: u64,
    /// Seconds the checking thread spent.
    pub seconds: f64,
}
