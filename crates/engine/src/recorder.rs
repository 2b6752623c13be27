//! Sequencing and nesting: what the hook asks at each op's entry and hands
//! over at its exit.
//!
//! - `seq` is process-wide and taken at entry, so it follows call order;
//!   only recorded calls take one.
//! - Each thread keeps a stack of the calls it is inside, for `depth` and
//!   `parent_seq` (the nearest recorded ancestor).
//! - `step` advances at the end of each `Optimizer.step`, until the job calls
//!   `torch.ops.opdump.step()` itself, which then takes over.

use std::cell::RefCell;
use std::sync::atomic::{AtomicBool, AtomicI64, Ordering};

use opdump_format::{capture as capture_file, Capture, Name, OpRecord, Phase, TensorRecord};

use crate::capture;
use crate::modules::{self, Forward, ModuleId};
use crate::runtime;
use crate::selection::{self, CallSite, Cap, OpVerdicts, RecordCap};
use crate::sink::LaterRows;

/// The engine's answer at an op's entry.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Ticket {
    /// Whether the hook should measure this call and hand it over at exit.
    pub record: bool,
    /// Whether to measure the inputs (they may be switched off).
    pub inputs: bool,
    /// Nesting depth of the call on its thread (0: called by the job).
    pub depth: i32,
    /// Reuse statistics already measured, and copy them through views.
    pub shortcuts: bool,
    /// Whether to name the line of user code that made the call
    /// (OPDUMP_SOURCE=1; top-level calls outside backward).
    pub source: bool,
    /// Whether to save the call's full tensors and arguments
    /// (OPDUMP_CAPTURE chose it).
    pub capture: bool,
    /// Raise `online::stop::message()` instead of running the call
    /// (OPDUMP_ON_DIVERGENCE=stop).
    pub stop: bool,
    /// Run the call again on the CPU to say which device is off (the call
    /// online compare named; `online::cpu_check`).
    pub check_on_cpu: bool,
    /// OPDUMP_CHECK selects the call's op: C++ describes the call to
    /// [`check_wanted`].
    pub check: bool,
}

impl Ticket {
    pub(crate) const SKIP: Ticket = Ticket {
        record: false,
        inputs: false,
        depth: 0,
        shortcuts: false,
        source: false,
        capture: false,
        stop: false,
        check_on_cpu: false,
        check: false,
    };
}

/// What the hook knows of a recorded call at its exit.
#[derive(Default)]
pub struct Call {
    pub op: Name,
    pub overload: Name,
    pub args: String,
    pub start_ns: i64,
    pub duration_ns: i64,
    pub error: Option<String>,
    /// `file.py:123 in forward`, when the ticket asked for it.
    pub source: Option<String>,
    pub tensors: Vec<TensorRecord>,
    /// Rows made on the writer's thread, in place of `tensors`.
    pub later: Option<Box<dyn LaterRows>>,
    /// The saved tensors and arguments, when the ticket asked for them
    /// (the selector is filled in at submit).
    pub capture: Option<Capture>,
}

/// Process-wide numbering of calls and steps.
pub struct Sequencer {
    next_seq: AtomicI64,
    step: AtomicI64,
    explicit_steps: AtomicBool,
}

impl Sequencer {
    pub const fn new() -> Self {
        Sequencer {
            next_seq: AtomicI64::new(0),
            step: AtomicI64::new(0),
            explicit_steps: AtomicBool::new(false),
        }
    }

    pub fn take_seq(&self) -> i64 {
        self.next_seq.fetch_add(1, Ordering::Relaxed)
    }

    pub fn step(&self) -> i64 {
        self.step.load(Ordering::Relaxed)
    }

    /// `torch.ops.opdump.step()`: the job numbers its steps itself from now
    /// on. Returns the new step.
    pub fn explicit_step(&self) -> i64 {
        self.explicit_steps.store(true, Ordering::Relaxed);
        self.step.fetch_add(1, Ordering::Relaxed) + 1
    }

    /// The end of an `Optimizer.step`: the next step, unless the job numbers
    /// its steps itself. Returns the step that ended, if one did.
    pub fn optimizer_step_done(&self) -> Option<i64> {
        (!self.explicit_steps.load(Ordering::Relaxed))
            .then(|| self.step.fetch_add(1, Ordering::Relaxed))
    }
}

impl Default for Sequencer {
    fn default() -> Self {
        Self::new()
    }
}

/// One call a thread is inside.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Frame {
    pub seq: Option<i64>,
    pub parent: Option<i64>,
    pub depth: i32,
    pub step: i64,
    pub phase: Phase,
    pub module: Option<ModuleId>,
    /// Backward calls: the forward call whose autograd node runs.
    pub fwd_seq: Option<i64>,
    /// The OPDUMP_CAPTURE selector that chose the call.
    pub capture: capture::Chosen,
}

/// The calls one thread is inside, innermost last.
#[derive(Default)]
pub struct CallStack {
    frames: Vec<Frame>,
    /// A step this thread ended, while online compare may wait for its
    /// verdict: the wait is at the thread's next top-level call, once the
    /// call that ended the step has handed over its record.
    ended: Option<i64>,
}

impl CallStack {
    /// The entered calls the thread is inside (the hook counts the calls
    /// it did not enter too, and passes a call's depth to [`enter`]).
    #[cfg(test)]
    pub fn depth(&self) -> i32 {
        i32::try_from(self.frames.len()).unwrap_or(i32::MAX)
    }

    /// The nearest recorded ancestor of a call entered now.
    pub fn parent(&self) -> Option<i64> {
        self.frames.iter().rev().find_map(|f| f.seq)
    }

    pub fn push(&mut self, frame: Frame) {
        self.frames.push(frame);
    }

    pub fn pop(&mut self) -> Option<Frame> {
        self.frames.pop()
    }
}

static SEQUENCER: Sequencer = Sequencer::new();
/// The latest step that recorded a call (online compare's step ends).
static RECORDED_STEP: AtomicI64 = AtomicI64::new(i64::MIN);
static CAP: RecordCap = RecordCap::new();

thread_local! {
    static STACK: RefCell<CallStack> = RefCell::new(CallStack::default());
    // SAFETY: gettid has no preconditions.
    static TID: i64 = i64::from(unsafe { libc::gettid() });
    static OPS: RefCell<OpVerdicts> = RefCell::new(OpVerdicts::default());
}

pub fn current_step() -> i64 {
    SEQUENCER.step()
}

/// `torch.ops.opdump.step()`.
pub fn explicit_step() -> i64 {
    let step = SEQUENCER.explicit_step();
    step_ended(step - 1);
    step
}

/// This thread ended step `ended`.
fn step_ended(ended: i64) {
    if crate::online::boundary::active() {
        STACK.with(|cell| cell.borrow_mut().ended = Some(ended));
    }
}

/// This thread's first top-level call since it ended step `ended`: online
/// compare may wait here for that step's verdict.
fn at_step_end(ended: i64) {
    let Some(rt) = runtime::get() else { return };
    let steps = rt.config.steps.as_ref();
    let next = ended + 1;
    runtime::step_ended(crate::online::boundary::StepEnd {
        ended,
        recorded: RECORDED_STEP.load(Ordering::Relaxed) >= ended,
        next_recorded: steps.is_none_or(|s| s.contains(next)),
        next_is_last: steps
            .and_then(|s| s.ranges().last())
            .is_some_and(|r| r.1 == next),
    });
}

/// The nesting depth of this thread's stack, for tests of the entry points.
#[cfg(test)]
pub(crate) fn stack_depth() -> i32 {
    STACK.with(|s| s.borrow().depth())
}

/// Whether the include and exclude regexes select `op.overload`: asked by
/// the hook once per op and thread, which keeps the answer; `None` before
/// the runtime exists (not to be kept).
pub fn op_selected(op: &str, overload: &str) -> Option<bool> {
    let rt = runtime::get()?;
    Some(
        OPS.with(|cache| selection::op_selected(&rt.config, &mut cache.borrow_mut(), op, overload)),
    )
}

/// Whether a call at this point is recorded, given that recording is on
/// and the regexes select its op.
fn decide(rt: &runtime::Runtime, op: &str, overload: &str, depth: i32, step: i64) -> bool {
    let c = &rt.config;
    let site = CallSite {
        op,
        overload,
        depth,
        step,
        rank: runtime::rank(),
    };
    if !selection::selects_site(c, site) {
        return false;
    }
    match CAP.take(c.max_records) {
        Cap::Allowed => true,
        Cap::Reached => {
            eprintln!(
                "opdump: OPDUMP_MAX_RECORDS={} reached; recording stops. To record more, raise it (0 is no limit)",
                c.max_records
            );
            false
        }
        Cap::Refused => false,
    }
}

/// The autograd node a backward call runs: its forward thread and sequence
/// number; for an AccumulateGrad node, `modules::ACCUMULATE_GRAD_THREAD` and
/// the id of its parameter's module.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Node {
    pub thread: i64,
    pub seq_nr: i64,
}

/// `selected`: the regexes select the op ([`op_selected`]); when false, the
/// call is not recorded and `op` and `overload` are not looked at (the hook
/// passes them empty). `depth`: the calls the thread is inside, counted by
/// the hook, which enters a call of an op the regexes leave out only where
/// [`every_top_level_call`] asks for it: the stack holds the calls entered.
pub(crate) fn enter(
    op: &str,
    overload: &str,
    selected: bool,
    phase: Phase,
    node: Option<Node>,
    depth: i32,
) -> Ticket {
    let rt = runtime::get();
    STACK.with(|cell| {
        let ended = {
            let mut stack = cell.borrow_mut();
            match stack.ended {
                Some(_) if depth == 0 => stack.ended.take(),
                _ => None,
            }
        };
        if let Some(ended) = ended {
            // Before this call is counted: a capture armed for it now takes
            // it.
            at_step_end(ended);
        }
        let mut stack = cell.borrow_mut();
        let step = current_step();
        let record = selected
            && runtime::RECORDING.load(Ordering::Relaxed)
            && rt.is_some_and(|rt| decide(rt, op, overload, depth, step));
        // Only a recorded call keeps its parent; the search up the stack is
        // not made for the others.
        let parent = if record { stack.parent() } else { None };
        let seq = record.then(|| SEQUENCER.take_seq());
        // A load, and a store once a step.
        if record && RECORDED_STEP.load(Ordering::Relaxed) < step {
            RECORDED_STEP.fetch_max(step, Ordering::Relaxed);
        }
        // A backward call belongs to the module of its node's forward call
        // (or of the parameter it accumulates into); work outside a node
        // (and forward recomputed in backward) to the module the thread is
        // in.
        let (fwd_seq, node_module) = match (record, phase, node) {
            (true, Phase::Backward, Some(n)) => modules::link_of(n.thread, n.seq_nr),
            _ => (None, None),
        };
        let module = if record {
            node_module.or_else(modules::current)
        } else {
            None
        };
        let chosen = match capture::get() {
            Some(c) if record => c.on_call(op, overload, step),
            _ => None,
        };
        stack.push(Frame {
            seq,
            parent,
            depth,
            step,
            phase,
            module,
            fwd_seq,
            capture: chosen,
        });
        Ticket {
            record,
            inputs: rt.is_some_and(|rt| rt.config.inputs),
            depth,
            shortcuts: rt.is_some_and(|rt| rt.config.reuse),
            source: record
                && depth == 0
                && phase != Phase::Backward
                && rt.is_some_and(|rt| rt.config.source),
            capture: chosen.is_some(),
            stop: depth == 0 && crate::online::stop::take(stop_ready),
            check_on_cpu: check_on_cpu(chosen, op),
            check: record && rt.is_some_and(|rt| checks_op(rt, op, overload)),
        }
    })
}

/// Whether the hook must enter every top-level call, those of ops the
/// regexes leave out included: at a step's end online compare may wait
/// there ([`at_step_end`]), and a stop raises there. Otherwise such calls
/// never reach the engine.
pub fn every_top_level_call() -> bool {
    crate::online::boundary::active() || crate::online::stop::pending()
}

/// Whether OPDUMP_CHECK selects the op, in the process that installed the
/// check (a forked child checks nothing).
fn checks_op(rt: &runtime::Runtime, op: &str, overload: &str) -> bool {
    let (Some(re), Some(c)) = (&rt.config.check, crate::check::get()) else {
        return false;
    };
    c.is_of_process(runtime::pid())
        && (re.as_str().is_empty() || re.is_match(&format!("{op}.{overload}")))
}

/// OPDUMP_CHECK, for the call on top of this thread's stack, before it
/// runs: the id to check it under, or -1.
pub(crate) fn check_wanted(
    op: &str,
    overload: &str,
    args: &str,
    signature: &str,
    bytes: u64,
) -> i64 {
    let Some(checks) = crate::check::get() else {
        return -1;
    };
    let Some((top, outer)) = STACK.with(|cell| {
        let stack = cell.borrow();
        let (top, below) = stack.frames.split_last()?;
        Some((*top, below.iter().filter_map(|f| f.seq).collect()))
    }) else {
        return -1;
    };
    let Some(seq) = top.seq else { return -1 };
    let call = crate::check::CallInfo {
        op: op.to_string(),
        overload: overload.to_string(),
        args: args.to_string(),
        module: top.module.and_then(modules::path).map(str::to_string),
        phase: top.phase,
        step: top.step,
        seq,
        rank: runtime::rank(),
        outer,
    };
    let signature = crate::check::signature_kind(signature, args);
    checks.wanted(&signature, bytes, call)
}

/// A stop waits for the capture of the named call and its CPU check. When
/// they never come (the run ends first, or it is over the byte cap), the
/// exit status says it instead (see `runtime::at_exit`).
fn stop_ready() -> bool {
    capture::installed().is_some_and(|c| c.armed_taken()) && crate::online::cpu_check::idle()
}

/// The call captured for online compare is checked on the CPU, unless it
/// is random (two generators make two answers, both right).
fn check_on_cpu(chosen: capture::Chosen, op: &str) -> bool {
    let check = capture::Captures::is_armed_choice(chosen)
        && opdump_judge::opclass::classify(op) != opdump_judge::opclass::OpClass::Rng;
    if check {
        crate::online::cpu_check::started();
    }
    check
}

/// The call on top of this thread's stack made the autograd nodes
/// `first..end` of `thread`: it claims them, if it is recorded.
pub(crate) fn made_nodes(thread: i64, first: i64, end: i64) {
    let top = STACK.with(|cell| cell.borrow().frames.last().copied());
    if let Some(Frame {
        seq: Some(seq),
        module,
        ..
    }) = top
    {
        modules::claim_nodes(thread, first, end, Forward { seq, module });
    }
}

/// Where a recorded call was, taken when it left the op; its record may be
/// handed over later, from another thread.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Departure {
    pub seq: i64,
    pub parent_seq: Option<i64>,
    pub depth: i32,
    pub step: i64,
    pub phase: Phase,
    pub thread: i64,
    pub module: Option<ModuleId>,
    pub fwd_seq: Option<i64>,
    pub capture: capture::Chosen,
}

/// Pops the calling thread's stack: the call's place when it is recorded.
pub(crate) fn depart() -> Option<Departure> {
    let frame = STACK.with(|cell| cell.borrow_mut().pop())?;
    Some(Departure {
        seq: frame.seq?,
        parent_seq: frame.parent,
        depth: frame.depth,
        step: frame.step,
        phase: frame.phase,
        thread: TID.with(|t| *t),
        module: frame.module,
        fwd_seq: frame.fwd_seq,
        capture: frame.capture,
    })
}

/// Names the selector of a capture, and gives each tensor row its key in
/// the capture file, where the file holds that tensor.
fn finish_capture(chosen: capture::Chosen, call: &mut Call) {
    let (Some(c), Some(i), Some(cap)) = (capture::installed(), chosen, call.capture.as_mut())
    else {
        call.capture = None;
        return;
    };
    cap.selector = c.selector(i);
    for t in &mut call.tensors {
        let key = capture_file::key(t.role.as_str(), &t.arg, t.list_index);
        if cap.tensors.iter().any(|s| s.key == key) {
            t.capture_key = Some(key);
        }
    }
    c.count_captured(i);
}

pub(crate) fn submit(d: Departure, take: impl FnOnce() -> Result<Call, String>) {
    let Some(sink) = runtime::sink() else { return };
    // A captured call's rows name their tensors in the capture file: they
    // are made here rather than on the writer's thread.
    let taken = take().and_then(|mut call| {
        if let Some(rows) = call.later.take_if(|_| d.capture.is_some()) {
            call.tensors = rows.into_records()?;
        }
        Ok(call)
    });
    let mut call = match taken {
        Ok(call) => call,
        Err(why) => return runtime::fail(&format!("internal error at an op's exit ({why})")),
    };
    finish_capture(d.capture, &mut call);
    let later = call.later;
    sink.send(
        OpRecord {
            seq: d.seq,
            parent_seq: d.parent_seq,
            depth: d.depth,
            pid: runtime::pid(),
            thread: d.thread,
            step: d.step,
            phase: d.phase,
            op: call.op,
            overload: call.overload,
            args: call.args,
            start_ns: call.start_ns,
            duration_ns: call.duration_ns,
            error: call.error,
            module: d.module.and_then(modules::path).map(Name::Borrowed),
            fwd_seq: d.fwd_seq,
            source: call.source,
            tensors: call.tensors,
            capture: call.capture,
        },
        later,
    );
}

pub(crate) fn exit(take: impl FnOnce() -> Result<Call, String>) {
    if let Some(d) = depart() {
        submit(d, take);
    }
}

/// The end of an `Optimizer.step` scope on this thread.
pub fn optimizer_step_done() {
    if let Some(ended) = SEQUENCER.optimizer_step_done() {
        step_ended(ended);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(stack: &CallStack, seq: Option<i64>) -> Frame {
        Frame {
            seq,
            parent: stack.parent(),
            depth: stack.depth(),
            step: 0,
            phase: Phase::Forward,
            module: None,
            fwd_seq: None,
            capture: None,
        }
    }

    #[test]
    fn depth_and_nearest_recorded_parent() {
        // linear (recorded) > t (not recorded) > as_strided (recorded)
        let mut s = CallStack::default();
        let linear = frame(&s, Some(10));
        assert_eq!((linear.depth, linear.parent), (0, None));
        s.push(linear);
        let t = frame(&s, None);
        assert_eq!((t.depth, t.parent), (1, Some(10)));
        s.push(t);
        let strided = frame(&s, Some(11));
        assert_eq!((strided.depth, strided.parent), (2, Some(10)));
        s.push(strided);
        assert_eq!(s.pop(), Some(strided));
        assert_eq!(s.pop(), Some(t));
        // A sibling of t after it: depth 1 again, same parent.
        let addmm = frame(&s, Some(12));
        assert_eq!((addmm.depth, addmm.parent), (1, Some(10)));
        assert_eq!(s.pop(), Some(linear));
        assert_eq!(s.pop(), None);
    }

    #[test]
    fn steps_follow_the_optimizer_until_the_job_numbers_them() {
        let seq = Sequencer::new();
        assert_eq!((seq.take_seq(), seq.take_seq()), (0, 1));
        assert_eq!(seq.optimizer_step_done(), Some(0));
        seq.optimizer_step_done();
        assert_eq!(seq.step(), 2);
        assert_eq!(seq.explicit_step(), 3);
        // From now on the job's own calls alone move the step.
        assert_eq!(seq.optimizer_step_done(), None);
        assert_eq!(seq.step(), 3);
        assert_eq!(seq.explicit_step(), 4);
    }

    #[test]
    fn seq_is_unique_across_threads() {
        let seq = std::sync::Arc::new(Sequencer::new());
        let mut all: Vec<i64> = (0..4)
            .map(|_| {
                let seq = seq.clone();
                std::thread::spawn(move || (0..1000).map(|_| seq.take_seq()).collect::<Vec<_>>())
            })
            .flat_map(|h| h.join().unwrap())
            .collect();
        all.sort_unstable();
        assert_eq!(all, (0..4000).collect::<Vec<_>>());
    }
}
