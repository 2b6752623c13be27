//! Op-call records built by hand, for tests that judge dumps built in
//! memory (`opdump_judge::Dump::from_records`).

use opdump_format::{OpRecord, Phase, TensorRecord};

/// A top-level call of op `op` (overload `default`) in the forward of step
/// 0, with `tensors`.
pub fn call(seq: i64, op: &str, tensors: Vec<TensorRecord>) -> OpRecord {
    OpRecord {
        seq,
        parent_seq: None,
        depth: 0,
        pid: 1,
        thread: 1,
        step: 0,
        phase: Phase::Forward,
        op: op.to_string().into(),
        overload: "default".into(),
        args: String::new(),
        start_ns: seq * 1000,
        duration_ns: 500,
        error: None,
        module: None,
        fwd_seq: None,
        source: None,
        tensors,
        capture: None,
    }
}

/// `rec` made a child of `parent`.
pub fn under(mut rec: OpRecord, parent: &OpRecord) -> OpRecord {
    rec.parent_seq = Some(parent.seq);
    rec.depth = parent.depth + 1;
    rec.step = parent.step;
    rec.phase = parent.phase;
    rec
}
