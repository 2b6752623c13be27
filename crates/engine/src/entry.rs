//! The bridge's entry points into the recorder. A panic here would abort the
//! job, so each one is caught, reported once, and switches opdump off.
//!
//! They sit apart from [`crate::recorder`] and [`crate::runtime`] so that
//! the imports point one way: entry → recorder → runtime.

use std::panic::{catch_unwind, AssertUnwindSafe};

use opdump_format::Phase;

use crate::modules;
use crate::recorder::{self, Call, Departure, Node, Ticket};
use crate::runtime;

/// At an op's entry: assigns its seq, pushes the thread's nesting stack and
/// decides whether it is recorded.
/// `selected`: what [`op_selected`] said of the op; `depth`: the calls the
/// thread is inside, entered or not.
pub fn op_enter(
    op: &str,
    overload: &str,
    selected: bool,
    phase: Phase,
    node: Option<Node>,
    depth: i32,
) -> Ticket {
    catch_unwind(AssertUnwindSafe(|| {
        recorder::enter(op, overload, selected, phase, node, depth)
    }))
    .unwrap_or_else(|_| {
        runtime::fail("internal error at an op's entry");
        Ticket::SKIP
    })
}

/// Whether the include and exclude regexes select `op.overload`, asked once
/// per op and thread: -1 while there is no runtime (ask again), else 0 or 1.
pub fn op_selected(op: &str, overload: &str) -> i32 {
    catch_unwind(AssertUnwindSafe(|| recorder::op_selected(op, overload)))
        .unwrap_or_else(|_| {
            runtime::fail("internal error selecting an op");
            Some(false)
        })
        .map_or(-1, i32::from)
}

/// After the op ran, before its exit: it made the autograd nodes
/// `first..end` of the forward thread `thread`.
pub fn op_made_nodes(thread: i64, first: i64, end: i64) {
    if catch_unwind(AssertUnwindSafe(|| {
        recorder::made_nodes(thread, first, end)
    }))
    .is_err()
    {
        runtime::fail("internal error noting an op's autograd nodes");
    }
}

/// A module's forward begins (`module_enter`) or ends on this thread.
pub fn module_enter(path: &str) {
    if catch_unwind(AssertUnwindSafe(|| modules::enter(path))).is_err() {
        runtime::fail("internal error entering a module");
    }
}

/// `module_enter` of a path the hook interned already (`names::intern`;
/// `u32::MAX` for "", a module whose calls carry none).
pub fn module_enter_id(id: u32) {
    if catch_unwind(AssertUnwindSafe(|| modules::enter_id(id))).is_err() {
        runtime::fail("internal error entering a module");
    }
}

pub fn module_exit() {
    if catch_unwind(AssertUnwindSafe(modules::exit)).is_err() {
        runtime::fail("internal error leaving a module");
    }
}

/// At an op's exit, always paired with [`op_enter`]: pops the stack and,
/// when the call was recorded, takes its record from `take` and sends it.
/// `take` runs only for recorded calls; its error switches opdump off.
pub fn op_exit(take: impl FnOnce() -> Result<Call, String>) {
    if catch_unwind(AssertUnwindSafe(|| recorder::exit(take))).is_err() {
        runtime::fail("internal error at an op's exit");
    }
}

/// At an op's exit, for a call whose record comes later: pops the stack and
/// returns the call's place when it is recorded.
pub fn op_depart() -> Option<Departure> {
    catch_unwind(AssertUnwindSafe(recorder::depart)).unwrap_or_else(|_| {
        runtime::fail("internal error at an op's exit");
        None
    })
}

/// Hands over the record of a call that left through [`op_depart`], from any
/// thread; `take` builds it.
pub fn op_submit(departure: Departure, take: impl FnOnce() -> Result<Call, String>) {
    if catch_unwind(AssertUnwindSafe(|| recorder::submit(departure, take))).is_err() {
        runtime::fail("internal error handing over a record");
    }
}

/// `torch.ops.opdump.step()`: the job numbers its steps from now on.
pub fn control_step() -> i64 {
    runtime::guarded(0, recorder::explicit_step)
}

/// OPDUMP_CHECK, at a call before it runs: the id to check it under, or -1.
pub fn check_wanted(op: &str, overload: &str, args: &str, signature: &str, bytes: u64) -> i64 {
    catch_unwind(AssertUnwindSafe(|| {
        recorder::check_wanted(op, overload, args, signature, bytes)
    }))
    .unwrap_or_else(|_| {
        runtime::fail("internal error deciding an accuracy check");
        -1
    })
}

/// The checking thread measured call `id`: true when its capture is wanted.
pub fn check_measured(id: i64, m: crate::check::Measured) -> bool {
    catch_unwind(AssertUnwindSafe(|| {
        crate::check::get().is_some_and(|c| c.measured(id, m))
    }))
    .unwrap_or_else(|_| {
        runtime::fail("internal error judging an accuracy check");
        false
    })
}

/// The capture of a failed check, or `None`.
pub fn check_captured(id: i64, capture: Option<opdump_format::Capture>) {
    if catch_unwind(AssertUnwindSafe(|| {
        if let Some(c) = crate::check::get() {
            c.captured(id, capture);
        }
    }))
    .is_err()
    {
        runtime::fail("internal error writing an accuracy check");
    }
}

/// A check that will not be made after all.
pub fn check_dropped(id: i64, exiting: bool) {
    if catch_unwind(AssertUnwindSafe(|| {
        if let Some(c) = crate::check::get() {
            c.dropped(id, exiting);
        }
    }))
    .is_err()
    {
        runtime::fail("internal error dropping an accuracy check");
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_without_runtime_never_takes_the_record() {
        // Recording is off and no runtime exists: the record is never built,
        // and entry and exit stay paired.
        let t = op_enter("aten::mm", "default", true, Phase::Forward, None, 0);
        assert!(!t.record);
        let mut taken = false;
        op_exit(|| {
            taken = true;
            Ok(Call::default())
        });
        assert!(!taken);
        assert_eq!(recorder::stack_depth(), 0);
    }
}
