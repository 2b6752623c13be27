//! The one bridge between the C++ fallback and the torch-free engine
//! (crates/engine).
//!
//! Only plain data crosses it: no torch object ever lives in Rust. C++ asks
//! Rust, at each op's entry, whether to record it (Rust owns configuration,
//! filtering and sequencing), and hands over the finished record at the op's
//! exit. Rust switches the C++ hook on and off. Role, phase and status cross
//! as shared enums; a value outside them is an internal error, never a
//! default.

use opdump_engine::recorder::{self, Call, Ticket};
use opdump_engine::{entry, host::Host, names, runtime};
use opdump_format::{self as format, Name, TensorRecord};

#[cxx::bridge(namespace = "opdump")]
pub mod ffi {
    // ----------------------------------------------------------------------
    // Shared enums: `enum class X : uint8_t` in C++.
    // ----------------------------------------------------------------------

    /// The tensor's place in the call.
    #[derive(Debug)]
    enum Role {
        Input,
        Output,
    }

    /// Where an op call runs: the autograd engine's backward functions,
    /// inside `Optimizer.step`, or anywhere else.
    #[derive(Debug)]
    enum Phase {
        Forward,
        Backward,
        Optimizer,
    }

    /// Why a tensor's statistics are what they are (`StatsStatus` in
    /// crates/format, which documents each value).
    #[derive(Debug)]
    enum StatsStatus {
        Computed,
        Uninitialized,
        Unsupported,
        Reused,
        View,
        NotMeasured,
        Failed,
        Capturing,
        Dropped,
    }

    // ----------------------------------------------------------------------
    // Shared structs: plain data, filled on one side and read on the other.
    // ----------------------------------------------------------------------

    /// Rust's answer at an op's entry.
    struct OpTicket {
        /// Whether C++ should measure this call and hand it over at exit.
        record: bool,
        /// Whether to measure the inputs (they may be switched off).
        inputs: bool,
        /// Nesting depth of the call on its thread (0: called by the job).
        depth: i32,
        /// Reuse statistics already measured, and copy them through views.
        shortcuts: bool,
        /// Name the line of user code that made the call (OPDUMP_SOURCE=1).
        source: bool,
        /// Save the call's full tensors and arguments (OPDUMP_CAPTURE).
        capture: bool,
        /// Raise `stop_message()` instead of running the call
        /// (OPDUMP_ON_DIVERGENCE=stop).
        stop: bool,
        /// Run the call again on the CPU and measure the device's outputs
        /// against float64 (the call online compare named).
        check_on_cpu: bool,
        /// OPDUMP_CHECK selects the op: describe the call to
        /// `check_wanted`, which says whether it is checked.
        check: bool,
    }

    /// What the CPU check of a call found (cpu_check.cpp).
    struct CpuCheckResult {
        /// The device of the call's outputs, and their dtype.
        device: String,
        dtype: String,
        /// ||device - float64|| / ||float64|| and ||CPU - float64|| /
        /// ||float64||, the largest over the floating outputs; -1 when
        /// none was compared.
        device_err: f64,
        cpu_err: f64,
        /// Why nothing was compared, else empty.
        why: String,
    }

    /// What the accuracy check's thread measured of one call
    /// (accuracy_check.cpp): errors are relative L2 norms, largest over the
    /// floating outputs; -1 where not measured.
    struct CheckMeasure {
        device: String,
        dtype: String,
        /// Device and CPU (same dtype) against float64, and device
        /// against CPU.
        device_err: f64,
        cpu_err: f64,
        device_vs_cpu: f64,
        /// Largest distance from float64 in units in the last place.
        device_ulp: f64,
        cpu_ulp: f64,
        /// The shapes of the floating inputs, each as its rank then its
        /// sizes.
        float_input_shapes: Vec<i64>,
        out_numel: i64,
        seconds: f64,
        /// Some float64 reference output held a nonzero value: a check of
        /// outputs that are all zero (a state scaled before it holds
        /// anything) tells nothing of the kernel.
        informative: bool,
        /// Why nothing was measured, else empty.
        why: String,
        /// For an op whose outputs are tensor lists (`_foreach_*`,
        /// `_fused_adamw_`): each list index measured on its own, in place
        /// of the call-wide errors above.
        elements: Vec<CheckElement>,
    }

    /// One list index of a list op's check (see `CheckMeasure`).
    struct CheckElement {
        index: i64,
        /// The parameter (or its gradient) at this index, else empty.
        name: String,
        device_err: f64,
        cpu_err: f64,
        device_vs_cpu: f64,
        device_ulp: f64,
        cpu_ulp: f64,
        /// The element's floating inputs, as in `CheckMeasure`.
        float_input_shapes: Vec<i64>,
        out_numel: i64,
        informative: bool,
        why: String,
    }

    /// Statistics over the finite elements of a tensor, in float64 (`Stats`
    /// in crates/format). NaN stands for a value that does not exist.
    #[derive(Clone, Copy)]
    struct TensorStats {
        min: f64,
        max: f64,
        mean: f64,
        /// Population standard deviation.
        std: f64,
        l2: f64,
        absmax: f64,
        nan_count: i64,
        posinf_count: i64,
        neginf_count: i64,
        zero_count: i64,
    }

    /// One tensor of a call, measured by C++. Names cross as ids from
    /// `intern_name`.
    struct TensorRow {
        role: Role,
        /// The schema's argument name, or the return's index.
        arg_id: u32,
        /// -1 when the tensor is not an element of a list.
        list_index: i32,
        /// As Python prints it without `torch.`: `float32`.
        dtype_id: u32,
        /// The sizes and strides of a tensor of at most `INLINE_DIMS`
        /// dimensions, filled without an allocation or a call across the
        /// bridge per dimension: `dims[..rank]` the sizes,
        /// `dims[INLINE_DIMS..INLINE_DIMS + rank]` the strides (when
        /// `strided`). -1: more dimensions, in `shape` and `stride`.
        rank: i32,
        dims: [i64; 16],
        strided: bool,
        shape: Vec<i64>,
        stride: Vec<i64>,
        /// As torch prints it: `cpu`, `cuda:0`.
        device_id: u32,
        numel: i64,
        status: StatsStatus,
        /// Meaningful when `status` is Computed, Reused or View.
        stats: TensorStats,
        /// The parameter or buffer it is, or its `.grad`; empty: none.
        name: String,
        /// The values' fingerprint, when `has_fingerprint` (README:
        /// "Fingerprint and sketch").
        fingerprint: u64,
        has_fingerprint: bool,
        /// The sketch; empty: none.
        sketch: Vec<f64>,
    }

    /// A recorded call's place, taken from the thread's stack when it leaves
    /// the op; its record is handed over later (`op_submit`), once the device
    /// statistics it waits for have come back.
    struct Departure {
        /// Whether the call is recorded at all; nothing else is meaningful
        /// when it is not.
        recorded: bool,
        seq: i64,
        /// -1: no recorded ancestor.
        parent_seq: i64,
        depth: i32,
        step: i64,
        phase: Phase,
        thread: i64,
        /// The interned module path; u32::MAX: none.
        module_id: u32,
        /// -1: none.
        fwd_seq: i64,
        /// The OPDUMP_CAPTURE selector that chose the call; -1: none.
        capture: i32,
    }

    /// One tensor of a captured call, on the host: its values in its own
    /// dtype, in logical (row-major) order.
    struct SavedTensor {
        /// `input.<arg>[.<i>]` or `output.<return or written arg>[.<i>]`.
        key: String,
        dtype: String,
        shape: Vec<i64>,
        data: Vec<u8>,
    }

    /// How the device path waits (from OPDUMP_QUEUE_FULL,
    /// OPDUMP_QUEUE_WAIT_MS and OPDUMP_DEVICE_SYNC).
    struct DeviceSettings {
        /// Measure device tensors synchronously: each record waits for the
        /// device on the job's thread.
        sync: bool,
        /// Hold measured device tensors and read many per launch
        /// (OPDUMP_DEVICE_HOLD).
        hold: bool,
        /// When the pool of pending results is full: wait (true) or drop.
        block: bool,
        wait_ms: i64,
    }

    /// What C++ knows of a call at its exit.
    struct OpCall {
        /// Interned (`intern_name`): `aten::addmm`.
        op_id: u32,
        /// Interned: `default` for the unnamed overload.
        overload_id: u32,
        args: String,
        start_ns: i64,
        duration_ns: i64,
        has_error: bool,
        error: String,
        /// The source line, e.g. file.py:123 in forward; empty: not asked for, or not found.
        source: String,
        tensors: Vec<TensorRow>,
        /// A capture was made (the ticket asked, and its inputs fit the
        /// byte cap): every argument, typed, as JSON, and the tensors.
        captured: bool,
        capture_args: String,
        saved: Vec<SavedTensor>,
        /// The outputs did not fit the byte cap and were left out.
        capture_outputs_skipped: bool,
    }

    // ----------------------------------------------------------------------
    // Rust functions the C++ hook calls. None of them unwinds into C++.
    // ----------------------------------------------------------------------
    extern "Rust" {
        /// At an op's entry: assigns its seq, pushes the thread's nesting
        /// stack and decides whether it is recorded. `node_thread`,
        /// `node_seq_nr`: the autograd node a backward call runs (its forward
        /// thread and sequence number), or -1.
        /// Whether the include and exclude regexes select the op: asked
        /// once per op and thread, which C++ keeps; -1 before the runtime
        /// exists (ask again), else 0 or 1.
        fn op_selected(op: &str, overload: &str) -> i32;
        /// `selected`: what `op_selected` said; when false, `op` and
        /// `overload` are not looked at (C++ passes them empty). `depth`:
        /// the calls the thread is inside, entered or not. A call of an op
        /// the regexes leave out is entered only at the top level, and only
        /// while `every_top_level_call` says so.
        fn op_enter(
            op: &str,
            overload: &str,
            selected: bool,
            phase: Phase,
            node_thread: i64,
            node_seq_nr: i64,
            depth: i32,
        ) -> OpTicket;
        /// Whether a top-level call of an op the regexes leave out must
        /// still be entered (online compare's step ends, a stop): two
        /// relaxed loads.
        fn every_top_level_call() -> bool;
        /// After the op ran, before its exit: it made the autograd nodes
        /// `first..end` of forward thread `thread`.
        fn op_made_nodes(thread: i64, first: i64, end: i64);
        /// At an op's exit, always paired with `op_enter`: pops the stack and,
        /// when the call was recorded, takes the record (leaving `call` empty).
        fn op_exit(call: &mut OpCall);
        /// At an op's exit, instead of `op_exit`, for a call that is not
        /// recorded (its ticket said so): pops the stack.
        fn op_leave();
        /// At an op's exit, instead of `op_exit`, for a call whose rows still
        /// wait for device statistics: pops the stack and says where the call
        /// was.
        fn op_depart() -> Departure;
        /// Takes the record of a call that left through `op_depart`, from any
        /// thread, once its rows are complete.
        fn op_submit(departure: &Departure, call: &mut OpCall);
        /// Read once, at the first device measurement.
        fn device_settings() -> DeviceSettings;
        /// OPDUMP_SKETCH: the sketch's length K; 0: no fingerprint and no
        /// sketch. Read once, at the first measurement.
        fn sketch_size() -> i32;
        /// OPDUMP_HOOK_ONLY: the hook passes every call on, records nothing
        /// (the benchmark's empty-hook cost).
        fn hook_only() -> bool;
        /// The id of a name (an op, overload, argument, dtype or device), the
        /// same in every thread; C++ caches it. u32::MAX when it cannot
        /// be had, which fails the record that carries it.
        fn intern_name(name: &str) -> u32;
        /// One `opdump:` line on stderr; opdump stays on.
        fn warn(what: &str);
        /// First thing on every thread C++ starts (`start_thread`): the
        /// rule every thread of opdump's keeps (`opdump_fsguard::spawn`).
        fn own_thread_started();
        /// The error a ticket with `stop` raises in the job.
        fn stop_message() -> String;
        /// The CPU check of the named call is done (on its own thread).
        fn cpu_check_done(result: CpuCheckResult);
        /// The CPU check could not start; `why` says what failed.
        fn cpu_check_failed(why: &str);
        /// OPDUMP_CHECK, at a call whose ticket says `check`, before it
        /// runs: the id to check it under, or -1. `bytes`: its input
        /// tensors'.
        fn check_wanted(op: &str, overload: &str, args: &str, signature: &str, bytes: u64) -> i64;
        /// The checking thread measured call `id`: true when it failed
        /// and its capture is wanted (`check_captured` follows).
        fn check_measured(id: i64, m: &CheckMeasure) -> bool;
        /// The capture of failed call `id`; `call.captured` false when it
        /// could not be made.
        fn check_captured(id: i64, call: &mut OpCall);
        /// Call `id` is not checked after all: the op raised, or the
        /// process is exiting.
        fn check_dropped(id: i64, exiting: bool);
        /// The end of an `Optimizer.step` scope on this thread.
        fn optimizer_step_done();
        /// An internal failure in C++: print one line and switch opdump off.
        fn internal_error(what: &str);

        // torch.ops.opdump.* custom ops.
        fn control_enable() -> bool;
        fn control_disable();
        fn control_flush() -> bool;
        /// Completes this process's files as at its exit, for a forked
        /// child that leaves through `os._exit` (no exit handler runs).
        fn control_finish();
        fn control_step() -> i64;
        fn control_stats() -> Vec<i64>;
        fn control_device_stats() -> Vec<i64>;
        /// From the Python module hooks: a module's forward begins, ends.
        fn control_module_enter(path: &str);
        fn control_module_exit();
        /// `control_module_enter` by the path's `intern_name` id (u32::MAX:
        /// a module whose calls carry none).
        fn control_module_enter_id(id: u32);
        /// Whether the Python module hooks go in while dumping (OPDUMP_MODULES).
        fn modules_enabled() -> bool;
        /// Whether forked children record (OPDUMP_FORK=record).
        fn fork_record_enabled() -> bool;
        /// Takes `bytes` of captured tensors from the process's budget
        /// (OPDUMP_CAPTURE_MAX_BYTES); false, and counted, when they do not
        /// fit. `outputs`: the call's inputs were taken already.
        fn capture_reserve(bytes: u64, outputs: bool) -> bool;
        /// A copy of host bytes, owned by Rust, for a SavedTensor.
        fn capture_bytes(data: &[u8]) -> Vec<u8>;
        /// [captured, not captured for the cap, without outputs for it,
        /// bytes].
        fn control_capture_stats() -> Vec<i64>;
    }

    // ----------------------------------------------------------------------
    // C++ functions Rust calls: the torch side of the plugin.
    // ----------------------------------------------------------------------
    unsafe extern "C++" {
        include!("opdump/cpp/opdump.h");

        /// Registers the fallback, the custom ops and the thread hook, after
        /// checking the dispatcher for another copy. False when it did not.
        fn install() -> bool;
        /// Switches recording on or off. On: the calling thread and, through
        /// a RecordFunction callback, every thread at its next op carry the
        /// dispatch key.
        fn set_active(on: bool);
        /// The version of the torch this process runs.
        fn torch_version() -> String;
        /// The rank in torch.distributed's default group, or -1 before
        /// `init_process_group`.
        fn distributed_rank() -> i64;
        /// Waits until the device statistics launched so far have come back
        /// and their records are handed over. False when it took longer than
        /// `timeout_ms`, or a stream that captures a graph kept some.
        fn device_flush(timeout_ms: i64) -> bool;
        /// [measured, dropped, capturing, waits on the job's thread, failed]
        /// device measurements.
        fn device_counts() -> Vec<i64>;
        /// At exit: the accuracy check's thread drops what is queued
        /// (check_dropped) after the check under way.
        fn check_abandon();
    }
}

// ---------------------------------------------------------------------------
// The torch side, as the engine sees it.
// ---------------------------------------------------------------------------

/// What the engine may ask of the C++ side.
pub const HOST: Host = Host {
    install: ffi::install,
    set_active: ffi::set_active,
    torch_version: ffi::torch_version,
    distributed_rank: ffi::distributed_rank,
    device_flush: ffi::device_flush,
    device_counts: ffi::device_counts,
    check_abandon: ffi::check_abandon,
};

// ---------------------------------------------------------------------------
// Conversions: each shared enum has one exhaustive mapping; anything else is
// an error that switches opdump off.
// ---------------------------------------------------------------------------

fn role(r: ffi::Role) -> Result<format::Role, String> {
    match r {
        ffi::Role::Input => Ok(format::Role::Input),
        ffi::Role::Output => Ok(format::Role::Output),
        other => Err(format!("unknown tensor role {}", other.repr)),
    }
}

fn phase(p: ffi::Phase) -> Result<format::Phase, String> {
    match p {
        ffi::Phase::Forward => Ok(format::Phase::Forward),
        ffi::Phase::Backward => Ok(format::Phase::Backward),
        ffi::Phase::Optimizer => Ok(format::Phase::Optimizer),
        other => Err(format!("unknown phase {}", other.repr)),
    }
}

fn status(s: ffi::StatsStatus) -> Result<format::StatsStatus, String> {
    use format::StatsStatus as S;
    Ok(match s {
        ffi::StatsStatus::Computed => S::Computed,
        ffi::StatsStatus::Uninitialized => S::Uninitialized,
        ffi::StatsStatus::Unsupported => S::Unsupported,
        ffi::StatsStatus::Reused => S::Reused,
        ffi::StatsStatus::View => S::View,
        ffi::StatsStatus::NotMeasured => S::NotMeasured,
        ffi::StatsStatus::Failed => S::Failed,
        ffi::StatsStatus::Capturing => S::Capturing,
        ffi::StatsStatus::Dropped => S::Dropped,
        other => return Err(format!("unknown statistics status {}", other.repr)),
    })
}

fn stats(s: &ffi::TensorStats) -> format::Stats {
    format::Stats {
        min: s.min,
        max: s.max,
        mean: s.mean,
        std: s.std,
        l2: s.l2,
        absmax: s.absmax,
        nan_count: s.nan_count,
        posinf_count: s.posinf_count,
        neginf_count: s.neginf_count,
        zero_count: s.zero_count,
    }
}

/// An interned name, borrowed for the life of the process.
fn name(id: u32, what: &str) -> Result<Name, String> {
    names::get(id)
        .map(Name::Borrowed)
        .ok_or_else(|| format!("unknown {what} name id {id}"))
}

/// `TensorRow::dims` holds the sizes and the strides of tensors of up to
/// this many dimensions (`INLINE_DIMS` in C++).
const INLINE_DIMS: usize = 8;

/// The sizes and strides of a row, wherever C++ put them.
fn shape_and_stride(row: &mut ffi::TensorRow) -> Result<(Vec<i64>, Vec<i64>), String> {
    let Ok(rank) = usize::try_from(row.rank) else {
        return Ok((
            std::mem::take(&mut row.shape),
            std::mem::take(&mut row.stride),
        ));
    };
    if rank > INLINE_DIMS {
        return Err(format!("a row of rank {rank} in {INLINE_DIMS} places"));
    }
    let stride = if row.strided {
        row.dims[INLINE_DIMS..INLINE_DIMS + rank].to_vec()
    } else {
        Vec::new()
    };
    Ok((row.dims[..rank].to_vec(), stride))
}

fn tensor(row: &mut ffi::TensorRow) -> Result<TensorRecord, String> {
    let (shape, stride) = shape_and_stride(row)?;
    Ok(TensorRecord {
        role: role(row.role)?,
        arg: name(row.arg_id, "argument")?,
        list_index: (row.list_index >= 0).then_some(row.list_index),
        dtype: name(row.dtype_id, "dtype")?,
        shape,
        stride,
        device: name(row.device_id, "device")?,
        numel: row.numel,
        name: (!row.name.is_empty()).then(|| std::mem::take(&mut row.name)),
        status: status(row.status)?,
        stats: stats(&row.stats),
        // Given by the engine, which knows what the capture holds.
        capture_key: None,
        fingerprint: row.has_fingerprint.then_some(row.fingerprint),
        sketch: (!row.sketch.is_empty()).then(|| std::mem::take(&mut row.sketch)),
    })
}

fn saved(t: &mut ffi::SavedTensor) -> format::CapturedTensor {
    format::CapturedTensor {
        key: std::mem::take(&mut t.key),
        dtype: std::mem::take(&mut t.dtype),
        shape: std::mem::take(&mut t.shape),
        data: std::mem::take(&mut t.data),
    }
}

/// The rows of a call, in a vector of their number: collected through
/// `Result`, the vector would start small and grow (and be copied) row by
/// row.
fn tensors(rows: &mut [ffi::TensorRow]) -> Result<Vec<TensorRecord>, String> {
    let mut out = Vec::with_capacity(rows.len());
    for row in rows {
        out.push(tensor(row)?);
    }
    Ok(out)
}

/// C++'s rows, made into records on the writer's thread.
struct HookRows(Vec<ffi::TensorRow>);

impl opdump_engine::sink::LaterRows for HookRows {
    fn into_records(self: Box<Self>) -> Result<Vec<TensorRecord>, String> {
        let mut rows = self.0;
        tensors(&mut rows)
    }
}

/// Moves the strings and rows out of C++'s record.
fn take_call(call: &mut ffi::OpCall) -> Result<Call, String> {
    Ok(Call {
        op: name(call.op_id, "op")?,
        overload: name(call.overload_id, "overload")?,
        args: std::mem::take(&mut call.args),
        start_ns: call.start_ns,
        duration_ns: call.duration_ns,
        error: call.has_error.then(|| std::mem::take(&mut call.error)),
        source: (!call.source.is_empty()).then(|| std::mem::take(&mut call.source)),
        tensors: Vec::new(),
        later: Some(Box::new(HookRows(std::mem::take(&mut call.tensors)))),
        capture: call.captured.then(|| format::Capture {
            selector: String::new(), // the engine names it
            args: std::mem::take(&mut call.capture_args),
            tensors: call.saved.iter_mut().map(saved).collect(),
            outputs_skipped: call.capture_outputs_skipped,
            file: None,
        }),
    })
}

// ---------------------------------------------------------------------------
// The extern "Rust" functions: each forwards to the engine, which catches
// panics.
// ---------------------------------------------------------------------------

fn op_selected(op: &str, overload: &str) -> i32 {
    entry::op_selected(op, overload)
}

fn op_enter(
    op: &str,
    overload: &str,
    selected: bool,
    p: ffi::Phase,
    node_thread: i64,
    node_seq_nr: i64,
    depth: i32,
) -> ffi::OpTicket {
    let node = (node_seq_nr >= 0).then_some(recorder::Node {
        thread: node_thread,
        seq_nr: node_seq_nr,
    });
    let t = match phase(p) {
        Ok(p) => entry::op_enter(op, overload, selected, p, node, depth),
        Err(why) => {
            runtime::fail(&format!("internal error at an op's entry ({why})"));
            // Entry and exit stay paired: push a frame that records nothing.
            entry::op_enter(op, overload, false, format::Phase::Forward, None, depth)
        }
    };
    let Ticket {
        record,
        inputs,
        depth,
        shortcuts,
        source,
        capture,
        stop,
        check_on_cpu,
        check,
    } = t;
    ffi::OpTicket {
        record,
        inputs,
        depth,
        shortcuts,
        source,
        capture,
        stop,
        check_on_cpu,
        check,
    }
}

fn every_top_level_call() -> bool {
    recorder::every_top_level_call()
}

fn op_leave() {
    // Not recorded: nothing departs (op_depart returns None for it).
    let _ = entry::op_depart();
}

fn op_made_nodes(thread: i64, first: i64, end: i64) {
    entry::op_made_nodes(thread, first, end);
}

fn op_exit(call: &mut ffi::OpCall) {
    entry::op_exit(|| take_call(call));
}

fn op_depart() -> ffi::Departure {
    let d = entry::op_depart();
    ffi::Departure {
        recorded: d.is_some(),
        seq: d.map_or(-1, |d| d.seq),
        parent_seq: d.and_then(|d| d.parent_seq).unwrap_or(-1),
        depth: d.map_or(0, |d| d.depth),
        step: d.map_or(0, |d| d.step),
        phase: match d.map_or(format::Phase::Forward, |d| d.phase) {
            format::Phase::Forward => ffi::Phase::Forward,
            format::Phase::Backward => ffi::Phase::Backward,
            format::Phase::Optimizer => ffi::Phase::Optimizer,
        },
        thread: d.map_or(0, |d| d.thread),
        module_id: d.and_then(|d| d.module).unwrap_or(u32::MAX),
        fwd_seq: d.and_then(|d| d.fwd_seq).unwrap_or(-1),
        capture: d
            .and_then(|d| d.capture)
            .and_then(|i| i32::try_from(i).ok())
            .unwrap_or(-1),
    }
}

fn op_submit(d: &ffi::Departure, call: &mut ffi::OpCall) {
    if !d.recorded {
        return;
    }
    let departure = phase(d.phase).map(|phase| recorder::Departure {
        seq: d.seq,
        parent_seq: (d.parent_seq >= 0).then_some(d.parent_seq),
        depth: d.depth,
        step: d.step,
        phase,
        thread: d.thread,
        module: (d.module_id != u32::MAX).then_some(d.module_id),
        fwd_seq: (d.fwd_seq >= 0).then_some(d.fwd_seq),
        capture: usize::try_from(d.capture).ok(),
    });
    match departure {
        Ok(departure) => entry::op_submit(departure, || take_call(call)),
        Err(why) => runtime::fail(&format!("internal error handing over a record ({why})")),
    }
}

fn device_settings() -> ffi::DeviceSettings {
    let s = runtime::device_settings();
    ffi::DeviceSettings {
        sync: s.sync,
        hold: s.hold,
        block: s.block,
        wait_ms: s.wait_ms,
    }
}

fn sketch_size() -> i32 {
    runtime::sketch_size() as i32
}

fn hook_only() -> bool {
    runtime::hook_only()
}

fn intern_name(name: &str) -> u32 {
    std::panic::catch_unwind(|| names::intern(name))
        .ok()
        .flatten()
        .unwrap_or(u32::MAX)
}

fn warn(what: &str) {
    runtime::warn(what);
}

fn own_thread_started() {
    let _ = opdump_fsguard::block_file_size_signal();
}

fn stop_message() -> String {
    opdump_engine::online::stop::message()
}

fn cpu_check_done(r: ffi::CpuCheckResult) {
    let measured = r.why.is_empty();
    opdump_engine::online::cpu_check::done(opdump_engine::online::cpu_check::Found {
        device: r.device,
        dtype: r.dtype,
        device_err: measured.then_some(r.device_err),
        cpu_err: measured.then_some(r.cpu_err),
        why: (!measured).then_some(r.why),
    });
}

fn cpu_check_failed(why: &str) {
    opdump_engine::online::cpu_check::failed(why);
}

fn check_wanted(op: &str, overload: &str, args: &str, signature: &str, bytes: u64) -> i64 {
    entry::check_wanted(op, overload, args, signature, bytes)
}

/// Shapes written each as its rank, then its sizes.
fn shapes_of(flat: &[i64]) -> Vec<Vec<i64>> {
    let mut shapes = Vec::new();
    let mut rest = flat;
    while let Some((&rank, tail)) = rest.split_first() {
        let n = usize::try_from(rank).unwrap_or(0).min(tail.len());
        shapes.push(tail[..n].to_vec());
        rest = &tail[n..];
    }
    shapes
}

fn check_measured(id: i64, m: &ffi::CheckMeasure) -> bool {
    let shapes = shapes_of(&m.float_input_shapes);
    let elements = m
        .elements
        .iter()
        .map(|e| opdump_engine::check::ElementMeasure {
            index: u32::try_from(e.index).unwrap_or(u32::MAX),
            name: e.name.clone(),
            device_err: e.device_err,
            cpu_err: e.cpu_err,
            device_vs_cpu: e.device_vs_cpu,
            device_ulp: e.device_ulp,
            cpu_ulp: e.cpu_ulp,
            float_input_shapes: shapes_of(&e.float_input_shapes),
            out_numel: e.out_numel,
            informative: e.informative,
            why: e.why.clone(),
        })
        .collect();
    entry::check_measured(
        id,
        opdump_engine::check::Measured {
            device: m.device.clone(),
            dtype: m.dtype.clone(),
            device_err: m.device_err,
            cpu_err: m.cpu_err,
            device_vs_cpu: m.device_vs_cpu,
            device_ulp: m.device_ulp,
            cpu_ulp: m.cpu_ulp,
            float_input_shapes: shapes,
            out_numel: m.out_numel,
            seconds: m.seconds,
            informative: m.informative,
            why: m.why.clone(),
            elements,
        },
    )
}

fn check_captured(id: i64, call: &mut ffi::OpCall) {
    let capture = call.captured.then(|| format::Capture {
        selector: String::new(),
        args: std::mem::take(&mut call.capture_args),
        tensors: call.saved.iter_mut().map(saved).collect(),
        outputs_skipped: false,
        file: None,
    });
    entry::check_captured(id, capture);
}

fn check_dropped(id: i64, exiting: bool) {
    entry::check_dropped(id, exiting);
}

fn optimizer_step_done() {
    recorder::optimizer_step_done();
}

fn internal_error(what: &str) {
    runtime::internal_error(what);
}

fn control_enable() -> bool {
    runtime::control_enable()
}

fn control_disable() {
    runtime::control_disable();
}

fn control_flush() -> bool {
    runtime::control_flush()
}

fn control_finish() {
    runtime::control_finish();
}

fn control_step() -> i64 {
    entry::control_step()
}

fn control_stats() -> Vec<i64> {
    runtime::control_stats()
}

fn control_device_stats() -> Vec<i64> {
    runtime::control_device_stats()
}

fn control_module_enter(path: &str) {
    entry::module_enter(path);
}

fn control_module_enter_id(id: u32) {
    entry::module_enter_id(id);
}

fn control_module_exit() {
    entry::module_exit();
}

fn modules_enabled() -> bool {
    runtime::modules_enabled()
}

fn fork_record_enabled() -> bool {
    runtime::fork_record_enabled()
}

fn capture_reserve(bytes: u64, outputs: bool) -> bool {
    runtime::capture_reserve(bytes, outputs)
}

fn capture_bytes(data: &[u8]) -> Vec<u8> {
    data.to_vec()
}

fn control_capture_stats() -> Vec<i64> {
    runtime::control_capture_stats()
}
