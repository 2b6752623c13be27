//! Which recorded calls are captured (`OPDUMP_CAPTURE`), and the byte cap.
//!
//! Each selector counts the recorded calls it could name, in the order their
//! entries reach it: `aten::gelu#2` is chosen when it sees its third
//! `aten::gelu`; `aten::gelu@step=1#2` counts only calls in step 1; a module
//! selector counts the module's forward calls, and every recorded call on
//! that thread while that forward runs is captured. The selector text is the
//! format crate's (`opdump_format::selector`), which `opdump compare` also
//! prints.
//!
//! Copying a tensor to the host takes the bytes from the process's budget
//! (`OPDUMP_CAPTURE_MAX_BYTES`) first: a call whose inputs do not fit is not
//! captured, one whose outputs do not fit keeps its inputs, and both are
//! counted and reported at exit.

use std::cell::Cell;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Mutex, OnceLock};

use opdump_format::selector::Selector;

/// The selectors and their counts, for the whole process.
pub struct Captures {
    selectors: Vec<Selector>,
    /// How many calls (or module calls) each selector has counted.
    counts: Vec<AtomicU64>,
    max_bytes: u64,
    bytes: AtomicU64,
    /// Calls captured (files handed to the writer), calls not captured at
    /// all and calls whose outputs were left out, for the byte cap.
    captured: AtomicU64,
    skipped: AtomicU64,
    partial: AtomicU64,
    /// A call named while the job runs (a divergence found against
    /// `OPDUMP_REFERENCE`), to capture at its next occurrence.
    armed: Mutex<Option<Armed>>,
    armed_on: AtomicBool,
    /// The armed call was captured (its record handed to the writer).
    armed_taken: AtomicBool,
}

/// The `index`-th call of an op within a step, in a step after `after`:
/// the same call of a later step of a training loop, or of the next
/// forward of an inference loop.
struct Armed {
    op: String,
    overload: Option<String>,
    index: u64,
    after: i64,
    /// The step being counted, and the calls of the op seen in it.
    step: i64,
    seen: u64,
    /// The selector of the captured call, once chosen.
    chosen: Option<String>,
    /// `after` includes the step of the first call recorded since arming.
    synced: bool,
}

/// The [`Chosen`] index of the armed call: past any selector's, and within
/// the bridge's `i32` (a device call's departure carries it).
const ARMED: usize = i32::MAX as usize;

/// What a ticket says about capturing: the index of the selector that chose
/// the call.
pub type Chosen = Option<usize>;

impl Captures {
    pub fn new(selectors: Vec<Selector>, max_bytes: u64) -> Self {
        let counts = selectors.iter().map(|_| AtomicU64::new(0)).collect();
        Captures {
            selectors,
            counts,
            max_bytes,
            bytes: AtomicU64::new(0),
            captured: AtomicU64::new(0),
            skipped: AtomicU64::new(0),
            partial: AtomicU64::new(0),
            armed: Mutex::new(None),
            armed_on: AtomicBool::new(false),
            armed_taken: AtomicBool::new(false),
        }
    }

    pub fn is_empty(&self) -> bool {
        self.selectors.is_empty() && !self.armed_on.load(Ordering::Relaxed)
    }

    /// Captures the next call like the one `s` names (an op selector with
    /// its step): the same op's call with the same index within a step,
    /// in the first step after `s`'s, and after the step the job is in when
    /// it next records a call, that has one (the job may be inside a step
    /// already, past some of the op's calls). Replaces what was armed
    /// before; a module selector arms nothing.
    pub fn arm(&self, s: &Selector) {
        self.arm_after(s, None);
    }

    /// [`Captures::arm`], when the job has made no call of step `first` yet
    /// (it waits at that step's start for the verdict that names `s`): the
    /// call of step `first` itself, or of the first later step that has it.
    pub fn arm_from(&self, s: &Selector, first: i64) {
        self.arm_after(s, Some(first.saturating_sub(1)));
    }

    /// `known`: the step after which calls count, when it is known now.
    fn arm_after(&self, s: &Selector, known: Option<i64>) {
        let Selector::Op {
            op,
            overload,
            step,
            index,
        } = s
        else {
            return;
        };
        if let Ok(mut armed) = self.armed.lock() {
            let after = step.unwrap_or(i64::MIN).max(known.unwrap_or(i64::MIN));
            *armed = Some(Armed {
                op: op.clone(),
                overload: overload.clone(),
                index: *index,
                after,
                step: after,
                seen: 0,
                chosen: None,
                synced: known.is_some(),
            });
            self.armed_on.store(true, Ordering::SeqCst);
        }
    }

    /// Whether `chosen` is the armed call.
    pub fn is_armed_choice(chosen: Chosen) -> bool {
        chosen == Some(ARMED)
    }

    /// The selector of the armed call, once it was chosen.
    pub fn armed_chosen(&self) -> Option<String> {
        self.armed.lock().ok()?.as_ref()?.chosen.clone()
    }

    /// Whether the armed call has been captured.
    pub fn armed_taken(&self) -> bool {
        self.armed_taken.load(Ordering::SeqCst)
    }

    /// Counts a call for the armed selector; true when it is the one.
    fn on_armed_call(&self, op: &str, overload: &str, step: i64) -> bool {
        if !self.armed_on.load(Ordering::Relaxed) {
            return false;
        }
        let Ok(mut guard) = self.armed.lock() else {
            return false;
        };
        let Some(a) = guard.as_mut() else {
            return false;
        };
        if !a.synced {
            a.synced = true;
            a.after = a.after.max(step);
            a.step = a.after;
        }
        let matches = Selector::Op {
            op: a.op.clone(),
            overload: a.overload.clone(),
            step: None,
            index: 0,
        }
        .matches_op(op, overload);
        if !matches || step <= a.after || a.chosen.is_some() {
            return false;
        }
        if step != a.step {
            a.step = step;
            a.seen = 0;
        }
        a.seen += 1;
        if a.seen - 1 != a.index {
            return false;
        }
        a.chosen = Some(
            Selector::Op {
                op: a.op.clone(),
                overload: a.overload.clone(),
                step: Some(step),
                index: a.index,
            }
            .to_string(),
        );
        self.armed_on.store(false, Ordering::SeqCst);
        true
    }

    /// A recorded call enters: counts it for every op selector that could
    /// name it, and says which one (if any) chooses it. A call inside a
    /// module call chosen by a module selector is chosen too.
    pub fn on_call(&self, op: &str, overload: &str, step: i64) -> Chosen {
        let mut chosen = None;
        for (i, s) in self.selectors.iter().enumerate() {
            if let Selector::Op {
                step: want, index, ..
            } = s
            {
                if s.matches_op(op, overload) && want.is_none_or(|w| w == step) {
                    let n = self.counts[i].fetch_add(1, Ordering::Relaxed);
                    if n == *index {
                        chosen.get_or_insert(i);
                    }
                }
            }
        }
        if self.on_armed_call(op, overload, step) {
            chosen.get_or_insert(ARMED);
        }
        chosen.or_else(|| MODULE_CHOICE.with(Cell::get))
    }

    /// A module's forward begins on this thread, `depth` modules deep (1 for
    /// the outermost): counts it for every module selector of its path, and
    /// starts capturing when one chooses it.
    pub fn on_module_enter(&self, path: &str, depth: usize) {
        for (i, s) in self.selectors.iter().enumerate() {
            if let Selector::Module { path: p, index } = s {
                if p == path && self.counts[i].fetch_add(1, Ordering::Relaxed) == *index {
                    MODULE_CHOICE.with(|c| {
                        if c.get().is_none() {
                            c.set(Some(i));
                            MODULE_DEPTH.with(|d| d.set(depth));
                        }
                    });
                }
            }
        }
    }

    /// A module's forward ends: this thread's stack is now `depth` modules
    /// deep. Capturing stops when the chosen module's call has ended.
    pub fn on_module_exit(&self, depth: usize) {
        if MODULE_CHOICE.with(Cell::get).is_some() && MODULE_DEPTH.with(Cell::get) > depth {
            MODULE_CHOICE.with(|c| c.set(None));
        }
    }

    /// The selector's text, for the capture file.
    pub fn selector(&self, chosen: usize) -> String {
        if chosen == ARMED {
            return self
                .armed
                .lock()
                .ok()
                .and_then(|a| a.as_ref()?.chosen.clone())
                .unwrap_or_default();
        }
        self.selectors
            .get(chosen)
            .map(ToString::to_string)
            .unwrap_or_default()
    }

    /// Takes `bytes` from the budget; false (and nothing taken) when they do
    /// not fit. `outputs`: the call's inputs were taken already.
    pub fn reserve(&self, bytes: u64, outputs: bool) -> bool {
        let fits = self
            .bytes
            .fetch_update(Ordering::Relaxed, Ordering::Relaxed, |b| {
                b.checked_add(bytes).filter(|&t| t <= self.max_bytes)
            })
            .is_ok();
        if !fits {
            if outputs {
                self.partial.fetch_add(1, Ordering::Relaxed);
            } else {
                self.skipped.fetch_add(1, Ordering::Relaxed);
            }
        }
        fits
    }

    /// A capture chosen by `chosen` was handed to the writer.
    pub fn count_captured(&self, chosen: usize) {
        self.captured.fetch_add(1, Ordering::Relaxed);
        if chosen == ARMED {
            self.armed_taken.store(true, Ordering::SeqCst);
        }
    }

    /// [captured calls, calls not captured for the cap, calls whose outputs
    /// were left out for it, bytes taken].
    pub fn counts(&self) -> [u64; 4] {
        [
            self.captured.load(Ordering::Relaxed),
            self.skipped.load(Ordering::Relaxed),
            self.partial.load(Ordering::Relaxed),
            self.bytes.load(Ordering::Relaxed),
        ]
    }
}

thread_local! {
    /// The module selector whose chosen module call this thread is inside,
    /// and that call's depth in the thread's module stack.
    static MODULE_CHOICE: Cell<Option<usize>> = const { Cell::new(None) };
    static MODULE_DEPTH: Cell<usize> = const { Cell::new(0) };
}

static CAPTURES: OnceLock<Captures> = OnceLock::new();

/// The process's selectors; set once, at the runtime's start.
pub fn install(c: Captures) {
    let _ = CAPTURES.set(c);
}

/// The process's captures, selectors or not (to arm one).
pub fn installed() -> Option<&'static Captures> {
    CAPTURES.get()
}

/// None when `OPDUMP_CAPTURE` is unset and nothing is armed: nothing to
/// count.
pub fn get() -> Option<&'static Captures> {
    CAPTURES.get().filter(|c| !c.is_empty())
}

#[cfg(test)]
mod tests {
    use super::*;
    use opdump_format::selector::parse_list;

    fn captures(s: &str, max: u64) -> Captures {
        Captures::new(parse_list(s).unwrap(), max)
    }

    #[test]
    fn op_selectors_count_their_own_calls() {
        let c = captures("aten::gelu#1;aten::add.Tensor@step=1#0;aten::mm#0", 1 << 20);
        let calls = [
            ("aten::gelu", "default", 0), // gelu #0
            ("aten::add", "Tensor", 0),   // step 0: not counted by the step selector
            ("aten::gelu", "default", 0), // gelu #1: chosen
            ("aten::add", "Scalar", 1),   // another overload
            ("aten::add", "Tensor", 1),   // step 1 #0: chosen
            ("aten::gelu", "default", 1),
        ];
        let chosen: Vec<Chosen> = calls
            .iter()
            .map(|(op, ov, step)| c.on_call(op, ov, *step))
            .collect();
        assert_eq!(chosen, [None, None, Some(0), None, Some(1), None]);
        assert_eq!(c.selector(1), "aten::add.Tensor@step=1#0");
        assert_eq!(c.on_call("aten::mm", "default", 0), Some(2));
        assert_eq!(c.on_call("aten::mm", "default", 0), None);
    }

    #[test]
    fn a_module_selector_captures_what_runs_inside_its_call() {
        let c = captures("module=blocks.1#1", 1 << 20);
        // blocks.1's first call: not chosen.
        c.on_module_enter("Model", 1);
        c.on_module_enter("blocks.1", 2);
        assert_eq!(c.on_call("aten::mm", "default", 0), None);
        c.on_module_exit(1);
        // Its second call, with a submodule inside: everything is chosen
        // until blocks.1 itself ends.
        c.on_module_enter("blocks.1", 2);
        c.on_module_enter("blocks.1.fc", 3);
        assert_eq!(c.on_call("aten::addmm", "default", 0), Some(0));
        c.on_module_exit(2);
        assert_eq!(c.on_call("aten::gelu", "default", 0), Some(0));
        c.on_module_exit(1);
        assert_eq!(c.on_call("aten::mm", "default", 0), None);
        // Other threads are not inside it.
        c.on_module_enter("blocks.1", 2); // its third call
        std::thread::scope(|s| {
            s.spawn(|| assert_eq!(c.on_call("aten::mm", "default", 0), None));
        });
    }

    #[test]
    fn the_byte_cap_skips_and_counts() {
        let c = captures("aten::mm#0", 100);
        assert!(c.reserve(60, false));
        assert!(!c.reserve(60, false)); // inputs do not fit: not captured
        assert!(c.reserve(40, false));
        assert!(!c.reserve(1, true)); // outputs do not fit: inputs kept
        c.count_captured(0);
        assert_eq!(c.counts(), [1, 1, 1, 100]);
    }

    #[test]
    fn an_armed_call_is_the_same_call_of_a_later_step() {
        let c = Captures::new(Vec::new(), 1 << 20);
        assert!(get_like(&c).is_none());
        c.arm(&parse_list("aten::gelu@step=3#1").unwrap()[0]);
        let calls = [
            ("aten::gelu", 3), // step 3 itself: not counted
            ("aten::gelu", 3),
            ("aten::mm", 4),
            ("aten::gelu", 4), // step 4 #0
            ("aten::gelu", 4), // step 4 #1: chosen
            ("aten::gelu", 5), // captured once only
            ("aten::gelu", 5),
        ];
        let chosen: Vec<Chosen> = calls
            .iter()
            .map(|(op, step)| c.on_call(op, "default", *step))
            .collect();
        assert_eq!(chosen, [None, None, None, None, Some(ARMED), None, None]);
        assert_eq!(c.selector(ARMED), "aten::gelu@step=4#1");
        assert!(!c.armed_taken());
        c.count_captured(ARMED);
        assert!(c.armed_taken());
    }

    #[test]
    fn an_armed_call_waits_for_a_step_that_has_it() {
        let c = Captures::new(Vec::new(), 1 << 20);
        // Armed while the job is in step 1, past its first add: step 1 is
        // not counted. Step 2 has two adds only; step 3 has the third.
        c.arm(&parse_list("aten::add.Tensor@step=0#2").unwrap()[0]);
        let mut chosen = Vec::new();
        for step in [1, 1, 2, 2, 3, 3, 3] {
            chosen.push(c.on_call("aten::add", "Tensor", step));
        }
        assert_eq!(chosen, [None, None, None, None, None, None, Some(ARMED)]);
        assert_eq!(c.selector(ARMED), "aten::add.Tensor@step=3#2");
    }

    #[test]
    fn armed_at_a_steps_start_the_call_of_that_step_is_the_one() {
        // The job waits at the start of step 1 for step 0's verdict: step
        // 1's call is captured, not step 2's.
        let c = Captures::new(Vec::new(), 1 << 20);
        c.arm_from(&parse_list("aten::mm@step=0#1").unwrap()[0], 1);
        let chosen: Vec<Chosen> = [1, 1, 2, 2]
            .iter()
            .map(|&step| c.on_call("aten::mm", "default", step))
            .collect();
        assert_eq!(chosen, [None, Some(ARMED), None, None]);
        assert_eq!(c.selector(ARMED), "aten::mm@step=1#1");
        // Armed the usual way instead, the first call recorded is taken to
        // be inside step 1 already: step 2's call is the one.
        let c = Captures::new(Vec::new(), 1 << 20);
        c.arm(&parse_list("aten::mm@step=0#1").unwrap()[0]);
        let chosen: Vec<Chosen> = [1, 1, 2, 2]
            .iter()
            .map(|&step| c.on_call("aten::mm", "default", step))
            .collect();
        assert_eq!(chosen, [None, None, None, Some(ARMED)]);
    }

    /// What [`get`] would say of `c`.
    fn get_like(c: &Captures) -> Option<&Captures> {
        Some(c).filter(|c| !c.is_empty())
    }
}
