//! The one bridge between the C++ fallback and Rust.
//!
//! Only plain data crosses it: no torch object ever lives in Rust. C++ asks
//! Rust, at each op's entry, whether to record it (Rust owns configuration,
//! filtering and sequencing), and hands over the finished record at the op's
//! exit. Rust switches the C++ hook on and off.

// The extern "Rust" functions below, by the names C++ calls.
use crate::recorder::{op_enter, op_exit, optimizer_step_done};
use crate::runtime::{
    control_disable, control_enable, control_flush, control_stats, control_step, internal_error,
};

#[cxx::bridge(namespace = "opdump")]
pub mod ffi {
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
    }

    /// One tensor of a call, measured by C++.
    struct TensorRow {
        /// 0 input, 1 output.
        role: u8,
        arg: String,
        /// -1 when the tensor is not an element of a list.
        list_index: i32,
        dtype: String,
        shape: Vec<i64>,
        stride: Vec<i64>,
        /// As torch prints it: `cpu`, `cuda:0`.
        device: String,
        numel: i64,
        /// See `StatsStatus` in crates/format; same order as `status_from_code`.
        status: u8,
        min: f64,
        max: f64,
        mean: f64,
        std: f64,
        l2: f64,
        absmax: f64,
        nan_count: i64,
        posinf_count: i64,
        neginf_count: i64,
        zero_count: i64,
    }

    /// What C++ knows of a call at its exit.
    struct OpCall {
        op: String,
        overload: String,
        args: String,
        start_ns: i64,
        duration_ns: i64,
        has_error: bool,
        error: String,
        tensors: Vec<TensorRow>,
    }

    // ----------------------------------------------------------------------
    // Rust functions the C++ hook calls. None of them unwinds into C++.
    // ----------------------------------------------------------------------
    extern "Rust" {
        /// At an op's entry: assigns its seq, pushes the thread's nesting
        /// stack and decides whether it is recorded. `phase`: 0 forward,
        /// 1 backward, 2 optimizer.
        fn op_enter(op: &str, overload: &str, phase: u8) -> OpTicket;
        /// At an op's exit, always paired with `op_enter`: pops the stack and,
        /// when the call was recorded, takes the record (leaving `call` empty).
        fn op_exit(call: &mut OpCall);
        /// The end of an `Optimizer.step` scope on this thread.
        fn optimizer_step_done();
        /// An internal failure in C++: print one line and switch opdump off.
        fn internal_error(what: &str);

        // torch.ops.opdump.* custom ops.
        fn control_enable() -> bool;
        fn control_disable();
        fn control_flush() -> bool;
        fn control_step() -> i64;
        fn control_stats() -> Vec<i64>;
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
    }
}
