//! The judge's integration tests, one binary: alignment, evidence,
//! tolerance and verdicts on dumps built in memory (`Dump::from_records`).

mod align;
mod align_prop;
mod common;
mod evidence_prop;
mod fused_optimizer;
mod incremental;
mod only_in_b;
mod optimizer_drift;
mod optimizer_lists;
mod reduction_length;
mod sketch;
mod tolerance_model;
mod verdicts;
