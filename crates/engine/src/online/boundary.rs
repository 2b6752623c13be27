//! The end of a step, on the job's thread: where a short run gets its
//! capture.
//!
//! A call named in step S is captured in a later step that makes it. The
//! judge names it once step S is judged; if the job is already past that
//! call in step S+1 by then, the capture waits for step S+2, and a run that
//! ends at S+1 has none. So at the end of a step the job may wait for that
//! step's verdict: its device statistics come back, a marker through the
//! writer's channel tells the writer that the step is complete, the writer
//! hands it to the judge, and the judge arms the capture before the job
//! makes its first call of step S+1.
//!
//! That wait costs the step's judging time on the job's thread, so the job
//! waits only where a later step may be missing: at the end of the first
//! step that recorded calls (a run of two steps, the quick start's), and at
//! the end of the step before the last one `OPDUMP_STEPS` selects. It never
//! waits once a divergence is named, when comparing is off, or when the
//! next step is not recorded, and at most [`WAIT`] each time. Other steps
//! are judged once records two steps later arrive ([`super::Feed`]).

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Condvar, Mutex, MutexGuard};
use std::time::{Duration, Instant};

/// The longest the job waits at a step's end. Judging a step takes a
/// fraction of the time the job took to run it (about a third on the TinyLM
/// benchmark, and far less than a second), so the bound is reached only by a
/// judge held up by a slow disk, an overloaded machine or a very large step;
/// the job pays it at most twice a run, and goes on after it. The line said
/// when it is reached (`runtime.rs`) names it.
pub const WAIT: Duration = Duration::from_secs(30);

struct State {
    /// A judge thread takes steps, and compares.
    on: bool,
    /// A divergence was named: there is nothing more to arm.
    named: bool,
    /// The step whose verdict the job waits for, while it waits.
    waiting_for: Option<i64>,
    /// The last step the judge gave its verdict on, or that it will not
    /// judge.
    judged: Option<i64>,
    /// The job waited at the end of a step already.
    waited: bool,
}

static STATE: Mutex<State> = Mutex::new(State {
    on: false,
    named: false,
    waiting_for: None,
    judged: None,
    waited: false,
});
static CHANGED: Condvar = Condvar::new();
/// `on && !named`, read without the lock at every step's end.
static ACTIVE: AtomicBool = AtomicBool::new(false);

fn state() -> MutexGuard<'static, State> {
    STATE
        .lock()
        .unwrap_or_else(std::sync::PoisonError::into_inner)
}

fn update(f: impl FnOnce(&mut State)) {
    let mut s = state();
    f(&mut s);
    ACTIVE.store(s.on && !s.named, Ordering::SeqCst);
    drop(s);
    CHANGED.notify_all();
}

/// The judge thread started.
pub fn start() {
    update(|s| s.on = true);
}

/// The judge stopped comparing, or ended: the job waits for nothing more.
pub fn stop() {
    update(|s| s.on = false);
}

/// Whether a step's end may wait for its verdict: one load.
pub fn active() -> bool {
    ACTIVE.load(Ordering::Relaxed)
}

/// The verdict of `step` is in (or it will not be judged).
pub fn judged(step: i64) {
    update(|s| s.judged = s.judged.max(Some(step)));
}

/// The judge names a call of `step`: `arm` arms its capture, told the step
/// whose start the job waits at when it waits for this verdict (so that no
/// call of that step has run), or `None` when the job goes on. The job does
/// not leave its wait while `arm` runs.
pub fn named(step: i64, arm: impl FnOnce(Option<i64>)) {
    update(|s| {
        s.named = true;
        arm((s.waiting_for == Some(step)).then_some(step + 1));
    });
}

/// What the job knows at the end of `ended`, for [`should_wait`].
#[derive(Clone, Copy, Debug)]
pub struct StepEnd {
    pub ended: i64,
    /// Step `ended` recorded calls.
    pub recorded: bool,
    /// Step `ended + 1` is one that is recorded.
    pub next_recorded: bool,
    /// Step `ended + 1` is the last one `OPDUMP_STEPS` selects.
    pub next_is_last: bool,
}

/// Whether the job waits for the verdict of the step that ended.
pub fn should_wait(end: StepEnd) -> bool {
    let s = state();
    s.on && !s.named
        && end.recorded
        && end.next_recorded
        && (!s.waited || end.next_is_last)
        && s.judged.is_none_or(|j| j < end.ended)
}

/// Waits until the verdict of `step` is in, comparing stops, or `deadline`
/// passes; false for the deadline.
pub fn wait_for_verdict(step: i64, deadline: Instant) -> bool {
    let mut s = state();
    s.waited = true;
    s.waiting_for = Some(step);
    let done = |s: &State| !s.on || s.named || s.judged.is_some_and(|j| j >= step);
    while !done(&s) {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        s = CHANGED
            .wait_timeout(s, left)
            .unwrap_or_else(std::sync::PoisonError::into_inner)
            .0;
    }
    s.waiting_for = None;
    done(&s)
}

#[cfg(test)]
pub(crate) fn reset() {
    update(|s| {
        *s = State {
            on: false,
            named: false,
            waiting_for: None,
            judged: None,
            waited: false,
        }
    });
}

#[cfg(test)]
mod tests {
    use super::*;

    fn end(ended: i64, next_is_last: bool) -> StepEnd {
        StepEnd {
            ended,
            recorded: true,
            next_recorded: true,
            next_is_last,
        }
    }

    /// The one test of this process-wide state (tests run in parallel).
    #[test]
    fn the_job_waits_at_its_first_step_and_before_the_last_until_a_call_is_named() {
        reset();
        assert!(!should_wait(end(0, false)), "no judge");
        start();
        assert!(active());
        assert!(!should_wait(StepEnd {
            next_recorded: false,
            ..end(0, false)
        }));
        assert!(!should_wait(StepEnd {
            recorded: false,
            ..end(0, false)
        }));
        assert!(should_wait(end(0, false)));
        // The judge gives its verdict from another thread.
        let judge = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            judged(0);
        });
        assert!(wait_for_verdict(
            0,
            Instant::now() + Duration::from_secs(10)
        ));
        judge.join().unwrap();
        // Later steps wait only before the last one.
        assert!(!should_wait(end(1, false)));
        assert!(should_wait(end(4, true)));
        // A verdict that does not come in time: the job goes on.
        let t = Instant::now();
        assert!(!wait_for_verdict(4, t + Duration::from_millis(30)));
        assert!(t.elapsed() >= Duration::from_millis(30));
        // Naming a call while the job waits: armed for the next step's start.
        let judge = std::thread::spawn(|| {
            std::thread::sleep(Duration::from_millis(20));
            let mut told = None;
            named(5, |start| told = start);
            told
        });
        assert!(wait_for_verdict(
            5,
            Instant::now() + Duration::from_secs(10)
        ));
        assert_eq!(judge.join().unwrap(), Some(6));
        assert!(!active() && !should_wait(end(8, true)));
        reset();
    }
}
