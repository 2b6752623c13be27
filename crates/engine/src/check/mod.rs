//! The accuracy check (`OPDUMP_CHECK`): the first calls of each distinct
//! signature run again on the CPU, in float64 and in their own dtype, and
//! each output on the device is judged against float64 relative to the
//! CPU's own error (`opdump_judge::check`). No reference dump is needed.
//!
//! The work is split as for every call:
//! - at the call (the job's thread): [`Checks::wanted`] decides from the
//!   signature C++ describes; C++ then copies the inputs to the host before
//!   the op runs, and the outputs after;
//! - on C++'s checking thread (`cpp/check/accuracy_check.cpp`): the two CPU runs
//!   and the measures, handed back as [`Measured`];
//! - here: the verdict, the capture file of a failed call, and one line in
//!   `<OPDUMP_DIR>/checks/rank=<R>/part-<pid>.jsonl`
//!   (`opdump_format::tables::check`).
//!
//! An op whose outputs are tensor lists (`_foreach_*`, `_fused_adamw_`,
//! whose written arguments are its outputs) gets a line per list index,
//! with the parameter's name where the dump knows it.
//!
//! A signature's first calls are checked, and then, in turn, up to
//! `OPDUMP_CHECK_RECHECK` already-checked signatures per step again (see
//! [`Rotation`]): a kernel that goes wrong later in the run is found.
//!
//! Bounded three ways, each counted and reported at exit: one call's
//! tensors over `OPDUMP_CHECK_MAX_BYTES` are not copied; copies waiting for
//! the checking thread stay under [`QUEUE_CALLS`] times that (a call that
//! finds the queue full waits up to `OPDUMP_CHECK_WAIT` for room, see
//! [`Checks::wanted`], and is otherwise checked at its next call); the
//! checking thread spends at most `OPDUMP_CHECK_SECONDS`. A signature met
//! and never checked for the last two is listed in the summary line
//! (`unchecked`), and `opdump check` says so in its exit status.

mod writer;

use std::collections::{HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Condvar, Mutex, OnceLock};
use std::time::{Duration, Instant};

use opdump_format::{Capture, Phase};
use opdump_judge::check::{self as rule, CheckVerdict};
use opdump_judge::metrics::reduction_length_of_shapes;
use opdump_judge::opclass::{classify, OpClass};

use opdump_format::tables::check::{
    CheckLine, CheckSummary, CheckedCall, SkipCause, Unchecked, Verdict,
};
use opdump_format::tables::Kind;
use writer::{Line, Writer};

/// The copies waiting for the checking thread stay under this many times
/// OPDUMP_CHECK_MAX_BYTES: a burst of large calls (a forward pass) queues
/// while the thread works through them.
pub const QUEUE_CALLS: u64 = 4;
// The exit line, the docs and the message catalogue say "4 x
// OPDUMP_CHECK_MAX_BYTES" in words: another value must change them too.
const _: () = assert!(QUEUE_CALLS == 4);

/// How long the exit waits for the writer thread to write the summary
/// after the lines before it.
const SUMMARY_WAIT: Duration = Duration::from_secs(10);

/// What the check needs from the configuration and the process.
#[derive(Clone)]
pub struct Settings {
    pub per_signature: u32,
    /// Already-checked signatures checked again per step (0: none).
    pub recheck_per_step: u32,
    pub max_bytes: u64,
    /// Zero: no limit.
    pub budget: Duration,
    /// How long a call may wait for room in the checking thread's queue
    /// (OPDUMP_CHECK_WAIT); zero: never.
    pub wait: Duration,
    pub dir: PathBuf,
    pub pid: i32,
    pub file_mode: u32,
    pub dir_mode: u32,
    /// One `opdump:` line on stderr.
    pub say: fn(&str),
}

/// Where a call ran, as the recorder knows it at the call.
#[derive(Clone, Debug)]
pub struct CallInfo {
    pub op: String,
    pub overload: String,
    pub args: String,
    pub module: Option<String>,
    pub phase: Phase,
    pub step: i64,
    pub seq: i64,
    pub rank: u32,
    /// The recorded calls this call is inside, on its thread (their `seq`):
    /// their checks are handed to the checking thread only after this call
    /// returns, so waiting for their room would be waiting for oneself.
    pub outer: Vec<i64>,
}

/// What the checking thread measured of one call (`cpp/check/accuracy_check.cpp`).
#[derive(Clone, Debug, Default)]
pub struct Measured {
    pub device: String,
    pub dtype: String,
    pub device_err: f64,
    pub cpu_err: f64,
    pub device_vs_cpu: f64,
    /// Negative: not measured.
    pub device_ulp: f64,
    pub cpu_ulp: f64,
    /// The shapes of the call's floating inputs, in argument order.
    pub float_input_shapes: Vec<Vec<i64>>,
    /// The first output's number of elements.
    pub out_numel: i64,
    /// Seconds the checking thread spent on the call.
    pub seconds: f64,
    /// Some float64 reference output held a nonzero value (see
    /// [`Checks::measured`]).
    pub informative: bool,
    /// Why nothing was measured; empty when it was.
    pub why: String,
    /// A list op's list indices, each judged on its own (a line each);
    /// empty for any other op, judged by the fields above.
    pub elements: Vec<ElementMeasure>,
}

/// One list index of a list op's measure (see [`Measured::elements`]).
#[derive(Clone, Debug, Default)]
pub struct ElementMeasure {
    pub index: u32,
    /// The parameter, buffer or gradient at this index; empty: unknown.
    pub name: String,
    pub device_err: f64,
    pub cpu_err: f64,
    pub device_vs_cpu: f64,
    pub device_ulp: f64,
    pub cpu_ulp: f64,
    pub float_input_shapes: Vec<Vec<i64>>,
    pub out_numel: i64,
    pub informative: bool,
    pub why: String,
}

struct Pending {
    call: CallInfo,
    signature: String,
    charge: u64,
    /// A check of a signature already checked (OPDUMP_CHECK_RECHECK).
    recheck: bool,
    /// The rows, once measured, while the capture of a failed one is made.
    rows: Vec<CheckLine>,
}

/// What is known of a signature.
#[derive(Default)]
struct Signature {
    /// Checks started in its first calls.
    started: u32,
    /// The last step it was met in.
    last_step: i64,
    /// Its place in [`Rotation`]: queued there.
    in_rotation: bool,
    /// It has no reference (no CPU kernel, no floating output): checking it
    /// again gives nothing.
    no_recheck: bool,
    /// Checks of its first calls that passed on outputs all zero, given
    /// back (at most [`UNINFORMATIVE_RETRIES`]).
    retried: u32,
}

/// How many times a signature whose check saw only zero outputs is checked
/// again at a later call. An optimizer's first step scales states that
/// hold nothing yet (`exp_avg_sq.mul_(β2)` on zeros): any kernel passes
/// that, and the signature's next call, with values, is the real check. An
/// op whose outputs are always zero stops after these.
pub const UNINFORMATIVE_RETRIES: u32 = 2;

/// The re-check of signatures in later steps: the signatures checked, in
/// turn. At each step the one at the front is checked again at its first
/// call, and goes to the back. The front is always one met in the step
/// before (one left behind by the run, a step-0 setup op, or a call whose
/// scalar changes every step, leaves the rotation, and comes back when it
/// is met again): a signature the run keeps making is re-checked every
/// `rotation length / OPDUMP_CHECK_RECHECK` steps.
#[derive(Default)]
struct Rotation {
    queue: VecDeque<String>,
    /// The step of the last call seen, and the one before it.
    step: Option<i64>,
    previous_step: Option<i64>,
    in_step: u32,
}

/// A signature met and not checked for the budget or a full queue: what
/// the summary lists of it, if it is never checked.
struct Skip {
    /// The order it was first skipped in.
    order: u64,
    op: String,
    overload: String,
}

#[derive(Default)]
struct State {
    /// Per signature met and checked (or refused a reference).
    started: HashMap<String, Signature>,
    rotation: Rotation,
    /// Signatures met and not checked for the budget or a full queue.
    skipped_budget: HashMap<String, Skip>,
    skipped_busy: HashMap<String, Skip>,
    skips: u64,
    pending: HashMap<i64, Pending>,
    pending_bytes: u64,
    next_id: i64,
    spent: f64,
    /// Checks finished (measured, captured or dropped): a wait for room
    /// that ends with none finished found the checking thread stalled.
    finished: u64,
    /// A wait for room timed out with no check finished meanwhile: no call
    /// waits again until one finishes (see [`Checks::wanted`]).
    stalled: bool,
    summary: CheckSummary,
}

impl State {
    fn skip(&mut self, cause: SkipCause, signature: &str, call: &CallInfo) {
        let order = self.skips;
        let set = match cause {
            SkipCause::Budget => &mut self.skipped_budget,
            SkipCause::Busy => &mut self.skipped_busy,
        };
        if !set.contains_key(signature) {
            set.insert(
                signature.to_string(),
                Skip {
                    order,
                    op: call.op.clone(),
                    overload: call.overload.clone(),
                },
            );
            self.skips += 1;
        }
    }

    /// The checking thread moved on (a check measured, captured or
    /// dropped): room may have come, or the budget gone.
    fn progressed(&mut self) {
        self.finished += 1;
        self.stalled = false;
    }

    /// The signatures met and never checked, each counted once (the budget
    /// before a full queue), in the order first skipped.
    fn unchecked(&self) -> Vec<(&str, &Skip, SkipCause)> {
        let mut out: Vec<(&str, &Skip, SkipCause)> = self
            .skipped_budget
            .iter()
            .filter(|(k, _)| !self.started.contains_key(*k))
            .map(|(k, v)| (k.as_str(), v, SkipCause::Budget))
            .chain(
                self.skipped_busy
                    .iter()
                    .filter(|(k, _)| {
                        !self.started.contains_key(*k) && !self.skipped_budget.contains_key(*k)
                    })
                    .map(|(k, v)| (k.as_str(), v, SkipCause::Busy)),
            )
            .collect();
        out.sort_by_key(|(_, skip, _)| skip.order);
        out
    }
}

/// What [`Checks::decide`] makes of a call.
enum Decision {
    /// Not checked (already checked, not its turn, the budget spent).
    No,
    /// No reference: its line is written now, and it is never copied.
    Refused(String),
    /// The queue has no room for its copies.
    Full { recheck: bool },
    /// Checked: its copies fit the queue.
    Go { recheck: bool, started: u32 },
}

/// The state of the check in this process.
pub struct Checks {
    settings: Settings,
    state: Mutex<State>,
    /// Notified whenever a check is over (measured, captured or dropped),
    /// which frees room in the queue: a call waiting for room wakes.
    room: Condvar,
    /// Started at the first line (writer.rs).
    writer: Mutex<Option<Writer>>,
}

impl Checks {
    pub fn new(settings: Settings) -> Self {
        Checks {
            settings,
            state: Mutex::new(State::default()),
            room: Condvar::new(),
            writer: Mutex::new(None),
        }
    }

    /// Whether this is the process that installed the check.
    pub fn is_of_process(&self, pid: i32) -> bool {
        self.settings.pid == pid
    }

    /// At a call whose op OPDUMP_CHECK selects: whether to check it, as an
    /// id for the checking thread (`-1`: no). `bytes`: its input tensors'.
    ///
    /// A first check whose copies find the queue full waits for room, at
    /// most `OPDUMP_CHECK_WAIT`, on [`Checks::room`], which releases the
    /// state's lock while it waits. What frees room is the checking thread
    /// finishing a check, and that thread needs nothing of the job's thread
    /// (`cpp/check/accuracy_check.cpp`: host copies, CPU kernels, this
    /// state's lock, the writer's channel), with one exception: the rerun of
    /// an op outside `aten::` and `prims::` takes the GIL, which the job's
    /// thread may hold while it waits here. So the wait is bounded, a wait
    /// that times out with no check finished marks the thread stalled (no
    /// call waits again until a check finishes), and no call waits for the
    /// copies of the calls it is inside ([`CallInfo::outer`]), which are
    /// handed over only after it returns. A recheck never waits: its
    /// signature is checked already.
    pub fn wanted(&self, signature: &str, bytes: u64, call: CallInfo) -> i64 {
        let Ok(mut s) = self.state.lock() else {
            return -1;
        };
        // Since when the call waits for room; None: it has not waited.
        let mut waiting: Option<Instant> = None;
        let (recheck, started) = loop {
            match self.decide(&mut s, signature, bytes, &call) {
                Decision::Go { recheck, started } => break (recheck, started),
                Decision::No => {
                    note_wait(&mut s, waiting);
                    return -1;
                }
                Decision::Refused(reason) => {
                    note_wait(&mut s, waiting);
                    return self.refuse(s, signature, call, reason);
                }
                Decision::Full { recheck } => {
                    let left = self
                        .settings
                        .wait
                        .saturating_sub(waiting.map_or(Duration::ZERO, |w| w.elapsed()));
                    if recheck
                        || left.is_zero()
                        || s.stalled
                        || !self.room_can_come(&s, bytes, &call)
                    {
                        if !recheck {
                            s.skip(SkipCause::Busy, signature, &call);
                        }
                        note_wait(&mut s, waiting);
                        return -1;
                    }
                    waiting.get_or_insert_with(Instant::now);
                    let finished = s.finished;
                    let Ok((next, timeout)) = self.room.wait_timeout(s, left) else {
                        return -1;
                    };
                    s = next;
                    if timeout.timed_out() && s.finished == finished {
                        s.stalled = true;
                    }
                }
            }
        };
        note_wait(&mut s, waiting);
        if !recheck {
            let st = &mut *s;
            let sig = st.started.entry(signature.to_string()).or_default();
            sig.started = started + 1;
            sig.last_step = call.step;
            if self.settings.recheck_per_step > 0 && !sig.in_rotation && !sig.no_recheck {
                sig.in_rotation = true;
                st.rotation.queue.push_back(signature.to_string());
            }
        }
        let charge = bytes.saturating_mul(4);
        s.pending_bytes += charge;
        s.next_id += 1;
        let id = s.next_id;
        s.pending.insert(
            id,
            Pending {
                call,
                signature: signature.to_string(),
                charge,
                recheck,
                rows: Vec::new(),
            },
        );
        id
    }

    /// Whether to check a call now, from the state as it is.
    fn decide(&self, s: &mut State, signature: &str, bytes: u64, call: &CallInfo) -> Decision {
        if self.settings.recheck_per_step > 0 && s.rotation.step != Some(call.step) {
            s.rotation.previous_step = s.rotation.step;
            s.rotation.step = Some(call.step);
            s.rotation.in_step = 0;
            settle_front(s);
        }
        let started = s.started.get(signature).map_or(0, |x| x.started);
        let recheck = started >= self.settings.per_signature;
        if recheck && !self.recheck_due(s, signature, call.step) {
            return Decision::No;
        }
        let budget = self.settings.budget;
        if !budget.is_zero() && s.spent >= budget.as_secs_f64() {
            if !recheck {
                s.skip(SkipCause::Budget, signature, call);
            }
            return Decision::No;
        }
        let class = classify(&call.op);
        let over_cap = bytes > self.settings.max_bytes;
        match rule::no_reference_for(&call.op, class) {
            Some(why) => return Decision::Refused(why.to_string()),
            None if over_cap => {
                return Decision::Refused(format!(
                    "its input tensors take {bytes} bytes, over OPDUMP_CHECK_MAX_BYTES={}",
                    self.settings.max_bytes
                ))
            }
            None => {}
        }
        // The host copies: as they are, in float64, and the outputs.
        if !fits(s.pending_bytes, bytes, self.queue_cap()) {
            return Decision::Full { recheck };
        }
        Decision::Go { recheck, started }
    }

    /// The bytes of copies the queue holds at most.
    fn queue_cap(&self) -> u64 {
        self.settings.max_bytes.saturating_mul(QUEUE_CALLS)
    }

    /// Whether the queue would have room for the call once the checking
    /// thread is through every check but those of the calls it is inside.
    fn room_can_come(&self, s: &State, bytes: u64, call: &CallInfo) -> bool {
        let own: u64 = s
            .pending
            .values()
            .filter(|p| call.outer.contains(&p.call.seq))
            .map(|p| p.charge)
            .sum();
        own < s.pending_bytes && fits(own, bytes, self.queue_cap())
    }

    /// A call without a reference: its line, and its signature is done.
    fn refuse(
        &self,
        mut s: std::sync::MutexGuard<'_, State>,
        signature: &str,
        call: CallInfo,
        reason: String,
    ) -> i64 {
        s.started.insert(
            signature.to_string(),
            Signature {
                started: self.settings.per_signature,
                last_step: call.step,
                no_recheck: true,
                ..Signature::default()
            },
        );
        if reason.contains("OPDUMP_CHECK_MAX_BYTES") {
            s.summary.skipped_bytes += 1;
        }
        s.summary.no_reference += 1;
        drop(s);
        let mut row = base_row(signature, &call);
        row.call.reason = Some(reason);
        self.write(row);
        -1
    }

    /// At a call of a signature already checked in its first calls: notes
    /// the step it was met in, and whether its turn to be checked again has
    /// come (see [`Rotation`]).
    fn recheck_due(&self, s: &mut State, signature: &str, step: i64) -> bool {
        let per_step = self.settings.recheck_per_step;
        if per_step == 0 {
            return false;
        }
        let Some(sig) = s.started.get_mut(signature) else {
            return false;
        };
        sig.last_step = step;
        if sig.no_recheck {
            return false;
        }
        if !sig.in_rotation {
            // Met again after it left the rotation: back in turn.
            sig.in_rotation = true;
            s.rotation.queue.push_back(signature.to_string());
        }
        if s.rotation.in_step >= per_step
            || s.rotation.queue.front().map(String::as_str) != Some(signature)
        {
            return false;
        }
        s.rotation.queue.rotate_left(1);
        s.rotation.in_step += 1;
        settle_front(s);
        true
    }

    /// The checking thread measured call `id`. True when the call failed
    /// and its capture file is wanted: [`Checks::captured`] follows.
    pub fn measured(&self, id: i64, m: Measured) -> bool {
        let Ok(mut s) = self.state.lock() else {
            return false;
        };
        s.spent += m.seconds.max(0.0);
        s.progressed();
        self.room.notify_all();
        let Some(p) = s.pending.get_mut(&id) else {
            return false;
        };
        let rows = if m.why.is_empty() && !m.elements.is_empty() {
            m.elements
                .iter()
                .map(|e| judge_element(&p.signature, &p.call, &m, e))
                .collect()
        } else {
            vec![judge(&p.signature, &p.call, &m)]
        };
        let recheck = p.recheck;
        let informative = m.informative || m.elements.iter().any(|e| e.informative);
        if !recheck && !informative && rows.iter().all(|r| r.verdict == Verdict::Pass) {
            let signature = p.signature.clone();
            if let Some(sig) = s.started.get_mut(&signature) {
                if sig.retried < UNINFORMATIVE_RETRIES {
                    sig.retried += 1;
                    sig.started = sig.started.saturating_sub(1);
                }
            }
        }
        let Some(p) = s.pending.get_mut(&id) else {
            return false;
        };
        let no_reference = rows.iter().all(|r| r.verdict == Verdict::NoReference);
        if no_reference {
            let signature = p.signature.clone();
            if let Some(sig) = s.started.get_mut(&signature) {
                sig.no_recheck = true;
            }
        }
        if rows.iter().any(|r| r.verdict == Verdict::Fail) {
            if let Some(p) = s.pending.get_mut(&id) {
                p.rows = rows;
            }
            return true;
        }
        if let Some(p) = s.pending.remove(&id) {
            s.pending_bytes -= p.charge;
        }
        count_rows(&mut s.summary, &rows, recheck);
        drop(s);
        for row in rows {
            self.write(row);
        }
        false
    }

    /// The capture of failed call `id` (its inputs as they were before it
    /// ran, its outputs on the device), or `None` when it could not be
    /// made: the capture file, then the call's line naming it.
    pub fn captured(&self, id: i64, capture: Option<Capture>) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        s.progressed();
        self.room.notify_all();
        let Some(p) = s.pending.remove(&id) else {
            return;
        };
        s.pending_bytes -= p.charge;
        if p.rows.is_empty() {
            return;
        }
        count_rows(&mut s.summary, &p.rows, p.recheck);
        drop(s);
        match capture {
            Some(c) => self.send(Line::Failed(Box::new((p.rows, p.call, c)))),
            None => {
                for row in p.rows {
                    self.write(row);
                }
            }
        }
    }

    /// Call `id` was not checked after all: the op raised (the signature
    /// is checked at its next call), or the process is exiting.
    pub fn dropped(&self, id: i64, exiting: bool) {
        let Ok(mut s) = self.state.lock() else {
            return;
        };
        s.progressed();
        self.room.notify_all();
        let Some(p) = s.pending.remove(&id) else {
            return;
        };
        s.pending_bytes -= p.charge;
        if exiting {
            s.summary.unfinished += 1;
        } else if p.recheck {
            // Its turn comes again.
        } else if let Some(sig) = s.started.get_mut(&p.signature) {
            sig.started = sig.started.saturating_sub(1);
        }
    }

    /// Whether no check is under way.
    pub fn idle(&self) -> bool {
        self.state
            .lock()
            .map(|s| s.pending.is_empty())
            .unwrap_or(true)
    }

    /// Waits at most `timeout` for the checks under way.
    pub fn wait(&self, timeout: Duration) -> bool {
        let deadline = Instant::now() + timeout;
        while !self.idle() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        true
    }

    /// At exit: the summary line in the file and one `opdump:` line.
    pub fn finish(&self) {
        let Ok(s) = self.state.lock() else { return };
        let mut summary = s.summary.clone();
        summary.kind = Kind::Summary;
        summary.pid = self.settings.pid.into();
        let unchecked = s.unchecked();
        let count = |cause| unchecked.iter().filter(|u| u.2 == cause).count() as u64;
        summary.skipped_budget = count(SkipCause::Budget);
        summary.skipped_busy = count(SkipCause::Busy);
        summary.signatures = s.started.len() as u64 + unchecked.len() as u64;
        summary.unchecked = unchecked
            .iter()
            .take(CheckSummary::MAX_UNCHECKED)
            .map(|(signature, skip, why)| Unchecked {
                signature: signature.to_string(),
                op: skip.op.clone(),
                overload: skip.overload.clone(),
                why: *why,
            })
            .collect();
        summary.seconds = s.spent;
        drop(s);
        if summary.signatures == 0 {
            (self.settings.say)(
                "OPDUMP_CHECK matched no recorded op call, so nothing was checked. It checks the calls that are recorded: \
                 widen OPDUMP_INCLUDE, OPDUMP_STEPS or the OPDUMP_CHECK regex",
            );
            return;
        }
        // The writer thread writes it after every line before it.
        let written = self.writer.lock().ok().and_then(|w| {
            w.as_ref()
                .and_then(|w| w.summary(summary.clone(), SUMMARY_WAIT))
        });
        let summary = written.unwrap_or_else(|| CheckSummary {
            write_failures: summary.write_failures + 1,
            ..summary
        });
        (self.settings.say)(&exit_line(&summary, &self.settings));
    }

    /// Hands a line to the writer thread, started at the first; a line
    /// that cannot be handed over is counted as not written.
    fn send(&self, line: Line) {
        let sent = self.writer.lock().ok().is_some_and(|mut w| {
            if w.is_none() {
                match Writer::start(self.settings.clone()) {
                    Ok(started) => *w = Some(started),
                    Err(e) => (self.settings.say)(&format!(
                        "cannot start the accuracy check's writer thread ({e}); its results are not written"
                    )),
                }
            }
            w.as_ref().is_some_and(|w| w.send(line))
        });
        if !sent {
            if let Ok(mut s) = self.state.lock() {
                s.summary.write_failures += 1;
            }
        }
    }

    /// Whether every line handed over so far is written (within `wait`).
    pub fn sync(&self, wait: Duration) -> bool {
        self.writer
            .lock()
            .ok()
            .is_some_and(|w| w.as_ref().is_none_or(|w| w.sync(wait)))
    }

    fn write(&self, row: CheckLine) {
        self.send(Line::Row(row));
    }
}

/// The line of a call, without a reference until it is judged.
fn base_row(signature: &str, call: &CallInfo) -> CheckLine {
    CheckLine {
        kind: Kind::Check,
        call: CheckedCall {
            signature: signature.to_string(),
            op: call.op.clone(),
            overload: call.overload.clone(),
            args: call.args.clone(),
            module: call.module.clone(),
            phase: call.phase.as_str().to_string(),
            step: call.step,
            seq: call.seq,
            rank: call.rank,
            ..CheckedCall::default()
        },
        verdict: Verdict::NoReference,
    }
}

/// Moves the signatures at the front of the rotation that were met neither
/// in this step nor in the one before out of it (see [`Rotation`]).
fn settle_front(s: &mut State) {
    let Some(since) = s.rotation.previous_step.or(s.rotation.step) else {
        return;
    };
    while let Some(front) = s.rotation.queue.front() {
        match s.started.get_mut(front) {
            Some(sig) if sig.last_step >= since && !sig.no_recheck => return,
            Some(sig) => sig.in_rotation = false,
            None => {}
        }
        s.rotation.queue.pop_front();
    }
}

/// Whether copies of `bytes` (four times: as they are, in float64, and the
/// outputs) fit a queue of `cap` bytes holding `pending`: a call alone in
/// the queue always does.
fn fits(pending: u64, bytes: u64, cap: u64) -> bool {
    pending == 0 || pending.saturating_add(bytes.saturating_mul(4)) <= cap
}

/// Counts a call's wait for room in the queue, if it waited.
fn note_wait(s: &mut State, since: Option<Instant>) {
    if let Some(t) = since {
        s.summary.waits += 1;
        s.summary.wait_seconds += t.elapsed().as_secs_f64();
    }
}

fn count_rows(summary: &mut CheckSummary, rows: &[CheckLine], recheck: bool) {
    for row in rows {
        count(summary, row);
        if recheck && row.verdict != Verdict::NoReference {
            summary.rechecks += 1;
        }
    }
}

fn count(summary: &mut CheckSummary, row: &CheckLine) {
    match row.verdict {
        Verdict::Pass => summary.passed += 1,
        Verdict::Fail => summary.failed += 1,
        Verdict::NoReference => summary.no_reference += 1,
    }
    if row.verdict != Verdict::NoReference {
        summary.checked += 1;
    }
}

fn verdict_of(v: CheckVerdict) -> Verdict {
    match v {
        CheckVerdict::Pass => Verdict::Pass,
        CheckVerdict::Fail => Verdict::Fail,
        CheckVerdict::NoReference => Verdict::NoReference,
    }
}

/// The verdict of one list index of a measured list op: judged as a call
/// of its own, named by its index and parameter.
fn judge_element(signature: &str, call: &CallInfo, m: &Measured, e: &ElementMeasure) -> CheckLine {
    let one = Measured {
        device: m.device.clone(),
        dtype: m.dtype.clone(),
        device_err: e.device_err,
        cpu_err: e.cpu_err,
        device_vs_cpu: e.device_vs_cpu,
        device_ulp: e.device_ulp,
        cpu_ulp: e.cpu_ulp,
        float_input_shapes: e.float_input_shapes.clone(),
        out_numel: e.out_numel,
        seconds: 0.0,
        informative: e.informative,
        why: e.why.clone(),
        elements: Vec::new(),
    };
    let mut line = judge(signature, call, &one);
    line.call.element = Some(e.index);
    // A gradient's list names its parameter.
    let name = e.name.strip_suffix(".grad").unwrap_or(&e.name);
    line.call.name = (!name.is_empty()).then(|| name.to_string());
    line
}

/// The verdict of a measured call (`opdump_judge::check`).
fn judge(signature: &str, call: &CallInfo, m: &Measured) -> CheckLine {
    let mut line = base_row(signature, call);
    let row = &mut line.call;
    row.device = m.device.clone();
    row.dtype = m.dtype.clone();
    if !m.why.is_empty() {
        row.reason = Some(m.why.clone());
        return line;
    }
    let class = classify(&call.op);
    let shapes: Vec<&[i64]> = m.float_input_shapes.iter().map(Vec::as_slice).collect();
    let k = reduction_length_of_shapes(&call.op, class, &shapes, m.out_numel);
    let against_cpu = m.device_vs_cpu / rule::error_floor(&m.dtype, k);
    let mut ratio = if m.device_err.is_nan() && m.cpu_err.is_nan() {
        // Both overflow where float64 does not (float16, say): the device
        // is judged by how near it is to the CPU at the same precision.
        if against_cpu.is_nan() {
            f64::INFINITY
        } else {
            against_cpu
        }
    } else {
        rule::ratio(m.device_err, m.cpu_err, &m.dtype, k)
    };
    // A discontinuous op (a floor, a comparison) may land on the other side
    // of a step in float64: matching the CPU at the same precision is right.
    if class == OpClass::Discontinuous && against_cpu.is_finite() {
        ratio = ratio.min(against_cpu);
    }
    if m.device_err.is_nan() && CheckVerdict::of_ratio(ratio) == CheckVerdict::Fail {
        row.reason =
            Some("the device's output holds NaN or infinity where the CPU's does not".to_string());
    }
    // JSON has no infinity: the largest finite ratio stands for it.
    let ratio = ratio.min(f64::MAX);
    let known = |v: f64| (v >= 0.0).then_some(v.min(f64::MAX));
    row.device_err = known(m.device_err);
    row.cpu_err = known(m.cpu_err);
    row.device_vs_cpu = known(m.device_vs_cpu);
    row.ratio = Some(ratio);
    if rule::reports_ulp(class) {
        row.device_ulp = (m.device_ulp >= 0.0).then_some(m.device_ulp);
        row.cpu_ulp = (m.cpu_ulp >= 0.0).then_some(m.cpu_ulp);
    }
    row.reduction_len = (k > 1.0).then_some(k);
    line.verdict = verdict_of(CheckVerdict::of_ratio(ratio));
    line
}

fn exit_line(s: &CheckSummary, settings: &Settings) -> String {
    let mut line = format!(
        "OPDUMP_CHECK: {} signature{}, {} call{} checked against float64 on the CPU: {} failed, {} passed, {} without a reference",
        s.signatures,
        if s.signatures == 1 { "" } else { "s" },
        s.checked,
        if s.checked == 1 { "" } else { "s" },
        s.failed,
        s.passed,
        s.no_reference
    );
    if s.rechecks > 0 {
        line += &format!(
            " ({} of them checks again in later steps, OPDUMP_CHECK_RECHECK={})",
            s.rechecks, settings.recheck_per_step
        );
    }
    if s.skipped_budget > 0 {
        line += &format!(
            "; {} signatures not checked: OPDUMP_CHECK_SECONDS={} spent, raise it to check them",
            s.skipped_budget,
            settings.budget.as_secs_f64()
        );
    }
    if s.skipped_busy > 0 {
        line += &format!(
            "; {} signatures not checked: the checking thread's queue (4 x OPDUMP_CHECK_MAX_BYTES={}) was full at each call for OPDUMP_CHECK_WAIT={} s, raise either or run more steps",
            s.skipped_busy,
            settings.max_bytes,
            settings.wait.as_secs_f64()
        );
    }
    if s.waits > 0 {
        line += &format!(
            "; {} calls waited {:.3} s in all for room in the checking thread's queue (OPDUMP_CHECK_WAIT={} s each at most)",
            s.waits,
            s.wait_seconds,
            settings.wait.as_secs_f64()
        );
    }
    if s.unfinished > 0 {
        line += &format!("; {} checks unfinished at exit", s.unfinished);
    }
    if s.write_failures > 0 {
        line += &format!("; {} results could not be written", s.write_failures);
    }
    line + &format!(". See them with: opdump check {}", settings.dir.display())
}

/// The signature a call is counted under: C++'s `op.overload(tensors;
/// args)` with each floating-point argument's value replaced by its type
/// (`lr=float`, `scalars=float[4]`). Python floats that change every step
/// (AdamW's bias corrections and step sizes, a scheduled learning rate)
/// would otherwise make a new signature, and a new check, at every step;
/// integers, flags, strings and dtypes stay: dims, modes and flags change
/// what the op computes. A Python object's address goes too.
pub fn signature_kind<'a>(signature: &'a str, args: &str) -> std::borrow::Cow<'a, str> {
    use std::borrow::Cow;
    let Some(head) = signature
        .strip_suffix(')')
        .and_then(|s| s.strip_suffix(args))
        .and_then(|s| s.strip_suffix("; "))
    else {
        return Cow::Borrowed(signature);
    };
    let mut out = String::new();
    let mut changed = false;
    for (k, part) in top_level_parts(args).into_iter().enumerate() {
        if k > 0 {
            out.push_str(", ");
        }
        match part.split_once('=') {
            Some((name, value)) => match float_kind(value).or_else(|| object_kind(value)) {
                Some(kind) => {
                    changed = true;
                    out.push_str(name);
                    out.push('=');
                    out.push_str(&kind);
                }
                None => out.push_str(part),
            },
            None => out.push_str(part),
        }
    }
    if !changed {
        return Cow::Borrowed(signature);
    }
    Cow::Owned(format!("{head}; {out})"))
}

/// `a=1, b=[1, 2], c=(x, y)` split at the commas outside brackets.
fn top_level_parts(args: &str) -> Vec<&str> {
    let mut parts = Vec::new();
    let (mut depth, mut start) = (0i32, 0usize);
    let bytes = args.as_bytes();
    for (i, &b) in bytes.iter().enumerate() {
        match b {
            b'[' | b'(' | b'{' => depth += 1,
            b']' | b')' | b'}' => depth -= 1,
            b',' if depth == 0 && bytes.get(i + 1) == Some(&b' ') => {
                parts.push(&args[start..i]);
                start = i + 2;
            }
            _ => {}
        }
    }
    parts.push(&args[start.min(args.len())..]);
    parts
}

/// A Python object's text without its address (`<X object at 0x5649...>`
/// is `<X object>`): a new object each step is the same kind of call.
fn object_kind(value: &str) -> Option<String> {
    let cut = value.find(" at 0x")?;
    (value.starts_with('<') && value.ends_with('>')).then(|| format!("{}>", &value[..cut]))
}

/// `float` for a floating-point number, `float[n]` for a list of numbers
/// holding one; `None` for anything else.
fn float_kind(value: &str) -> Option<String> {
    let is_float = |v: &str| {
        let v = v.trim();
        v.parse::<f64>().is_ok() && v.contains(['.', 'e', 'E', 'n', 'N', 'i', 'I'])
    };
    let is_number = |v: &str| v.trim().parse::<f64>().is_ok();
    if is_float(value) {
        return Some("float".to_string());
    }
    let items = value.strip_prefix('[')?.strip_suffix(']')?;
    let items: Vec<&str> = items.split(',').collect();
    (items.iter().all(|v| is_number(v)) && items.iter().any(|v| is_float(v)))
        .then(|| format!("float[{}]", items.len()))
}

static CHECKS: OnceLock<Checks> = OnceLock::new();

/// Set once, when dumping first starts with OPDUMP_CHECK on.
pub fn install(c: Checks) -> &'static Checks {
    CHECKS.get_or_init(|| c)
}

/// The check, when OPDUMP_CHECK is on and dumping has started.
pub fn get() -> Option<&'static Checks> {
    CHECKS.get()
}

#[cfg(test)]
mod tests;
