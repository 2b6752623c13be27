//! Sequencing and selection: what the C++ hook asks at each op's entry and
//! hands over at its exit.
//!
//! - `seq` is process-wide and taken at entry, so it follows call order;
//!   only recorded calls take one.
//! - Each thread keeps a stack of the calls it is inside, for `depth` and
//!   `parent_seq` (the nearest recorded ancestor).
//! - `step` advances at the end of each `Optimizer.step`, until the job calls
//!   `torch.ops.opdump.step()` itself, which then takes over.

use std::cell::RefCell;
use std::collections::HashMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::sync::atomic::{AtomicBool, AtomicI64, AtomicU64, Ordering};
use std::sync::OnceLock;

use opdump_format::{OpRecord, Phase, Role, Stats, StatsStatus, TensorRecord};

use crate::bridge::ffi::{OpCall, OpTicket, TensorRow};
use crate::runtime;

static NEXT_SEQ: AtomicI64 = AtomicI64::new(0);
static STEP: AtomicI64 = AtomicI64::new(0);
static EXPLICIT_STEPS: AtomicBool = AtomicBool::new(false);
static RECORDED: AtomicU64 = AtomicU64::new(0);
/// Rust's view of whether recording is on; the C++ hook has its own flag so
/// that it skips the bridge entirely when off.
pub static RECORDING: AtomicBool = AtomicBool::new(false);

struct Frame {
    seq: Option<i64>,
    parent: Option<i64>,
    depth: i32,
    step: i64,
    phase: u8,
}

thread_local! {
    static STACK: RefCell<Vec<Frame>> = const { RefCell::new(Vec::new()) };
    static TID: i64 = unsafe { libc::gettid() } as i64;
    /// include/exclude verdicts per `op.overload`, so each regex runs once per op.
    static SELECTED: RefCell<(String, HashMap<String, bool>)> = RefCell::new((String::new(), HashMap::new()));
}

/// The rank of this process: from `RANK`, `OMPI_COMM_WORLD_RANK` or
/// `SLURM_PROCID`, else from an initialised torch.distributed, else 0.
/// Resolved at the first record, not at load, since launchers and jobs set
/// it late.
pub fn rank() -> u32 {
    static RANK: OnceLock<u32> = OnceLock::new();
    *RANK.get_or_init(|| {
        ["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"]
            .iter()
            .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
            .or_else(|| u32::try_from(crate::bridge::ffi::distributed_rank()).ok())
            .unwrap_or(0)
    })
}

/// The local rank, likewise: `LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK` or
/// `SLURM_LOCALID`, else 0. Written into each file's metadata.
pub fn local_rank() -> u32 {
    static LOCAL: OnceLock<u32> = OnceLock::new();
    *LOCAL.get_or_init(|| {
        ["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"]
            .iter()
            .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
            .unwrap_or(0)
    })
}

pub fn current_step() -> i64 {
    STEP.load(Ordering::Relaxed)
}

/// `torch.ops.opdump.step()`: the job numbers its steps itself from now on.
pub fn explicit_step() -> i64 {
    EXPLICIT_STEPS.store(true, Ordering::Relaxed);
    STEP.fetch_add(1, Ordering::Relaxed) + 1
}

fn op_selected(rt: &runtime::Runtime, op: &str, overload: &str) -> bool {
    let c = &rt.config;
    if c.include.is_none() && c.exclude.is_none() {
        return true;
    }
    SELECTED.with(|cell| {
        let (key, cache) = &mut *cell.borrow_mut();
        key.clear();
        key.push_str(op);
        key.push('.');
        key.push_str(overload);
        if let Some(&v) = cache.get(key.as_str()) {
            return v;
        }
        let v = c.include.as_ref().is_none_or(|re| re.is_match(key))
            && !c.exclude.as_ref().is_some_and(|re| re.is_match(key));
        cache.insert(key.clone(), v);
        v
    })
}

fn enter(op: &str, overload: &str, phase: u8) -> OpTicket {
    let rt = runtime::get();
    STACK.with(|cell| {
        let mut stack = cell.borrow_mut();
        let depth = stack.len() as i32;
        let parent = stack.iter().rev().find_map(|f| f.seq);
        let step = current_step();
        let mut record = RECORDING.load(Ordering::Relaxed);
        if let Some(rt) = rt.filter(|_| record) {
            let c = &rt.config;
            record = c.max_depth.is_none_or(|d| depth <= d)
                && c.steps.as_ref().is_none_or(|s| s.contains(step))
                && c.ranks.as_ref().is_none_or(|r| r.contains(rank() as i64))
                && op_selected(rt, op, overload);
            if record && c.max_records > 0 && RECORDED.fetch_add(1, Ordering::Relaxed) >= c.max_records {
                record = false;
                if RECORDED.load(Ordering::Relaxed) == c.max_records + 1 {
                    eprintln!("opdump: OPDUMP_MAX_RECORDS={} reached; recording stops", c.max_records);
                }
            }
        } else {
            record = false;
        }
        let seq = record.then(|| NEXT_SEQ.fetch_add(1, Ordering::Relaxed));
        stack.push(Frame { seq, parent, depth, step, phase });
        OpTicket {
            record,
            inputs: rt.is_some_and(|rt| rt.config.inputs),
            depth,
            shortcuts: rt.is_some_and(|rt| rt.config.reuse),
        }
    })
}

fn status_from_code(code: u8) -> StatsStatus {
    match code {
        0 => StatsStatus::Computed,
        1 => StatsStatus::Uninitialized,
        2 => StatsStatus::Unsupported,
        3 => StatsStatus::Reused,
        4 => StatsStatus::View,
        5 => StatsStatus::NotMeasured,
        _ => StatsStatus::Failed,
    }
}

fn tensor_record(row: &mut TensorRow) -> TensorRecord {
    TensorRecord {
        role: if row.role == 0 { Role::Input } else { Role::Output },
        arg: std::mem::take(&mut row.arg),
        list_index: (row.list_index >= 0).then_some(row.list_index),
        dtype: std::mem::take(&mut row.dtype),
        shape: std::mem::take(&mut row.shape),
        stride: std::mem::take(&mut row.stride),
        device: std::mem::take(&mut row.device),
        numel: row.numel,
        status: status_from_code(row.status),
        stats: Stats {
            min: row.min,
            max: row.max,
            mean: row.mean,
            std: row.std,
            l2: row.l2,
            absmax: row.absmax,
            nan_count: row.nan_count,
            posinf_count: row.posinf_count,
            neginf_count: row.neginf_count,
            zero_count: row.zero_count,
        },
    }
}

fn exit(call: &mut OpCall) {
    let Some(frame) = STACK.with(|cell| cell.borrow_mut().pop()) else { return };
    let Some(seq) = frame.seq else { return };
    let Some(sink) = runtime::sink() else { return };
    let rec = OpRecord {
        seq,
        parent_seq: frame.parent,
        depth: frame.depth,
        pid: runtime::pid(),
        thread: TID.with(|t| *t),
        step: frame.step,
        phase: match frame.phase {
            1 => Phase::Backward,
            2 => Phase::Optimizer,
            _ => Phase::Forward,
        },
        op: std::mem::take(&mut call.op),
        overload: std::mem::take(&mut call.overload),
        args: std::mem::take(&mut call.args),
        start_ns: call.start_ns,
        duration_ns: call.duration_ns,
        error: call.has_error.then(|| std::mem::take(&mut call.error)),
        tensors: call.tensors.iter_mut().map(tensor_record).collect(),
    };
    sink.send(rec);
}

// ---------------------------------------------------------------------------
// Bridge entry points: a panic here would abort the job, so each one is
// caught, reported once, and switches opdump off.
// ---------------------------------------------------------------------------

pub fn op_enter(op: &str, overload: &str, phase: u8) -> OpTicket {
    catch_unwind(AssertUnwindSafe(|| enter(op, overload, phase))).unwrap_or_else(|_| {
        runtime::fail("internal error at an op's entry");
        OpTicket { record: false, inputs: false, depth: 0, shortcuts: false }
    })
}

pub fn op_exit(call: &mut OpCall) {
    if catch_unwind(AssertUnwindSafe(|| exit(call))).is_err() {
        runtime::fail("internal error at an op's exit");
    }
}

pub fn optimizer_step_done() {
    if !EXPLICIT_STEPS.load(Ordering::Relaxed) {
        STEP.fetch_add(1, Ordering::Relaxed);
    }
}
