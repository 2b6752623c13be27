//! Which device is off: the call online compare named is run again on the
//! CPU from its captured inputs, in float64 and in its own dtype
//! (`cpp/check/cpu_check.cpp`), and its outputs on this run's device are
//! measured against the float64 result.
//!
//! The inputs agreed between the two runs (that is what "introduced"
//! means), so the CPU's answer stands for both. A device far from float64
//! where the CPU at the same precision is near is off; a device as near as
//! the CPU leaves the reference's device as the one that is off.

use std::sync::atomic::{AtomicU32, Ordering};
use std::sync::OnceLock;
use std::time::{Duration, Instant};

pub use opdump_format::tables::verdict::CpuFound as Found;
use opdump_judge::check::{self, CheckVerdict};

/// Whether this run's device is the one that is off
/// (`opdump_judge::check`); `None` when nothing was compared.
pub fn device_is_off(found: &Found) -> Option<bool> {
    let (d, c) = (found.device_err?, found.cpu_err?);
    Some(CheckVerdict::of_ratio(check::ratio(d, c, &found.dtype, 1.0)) == CheckVerdict::Fail)
}

static PENDING: AtomicU32 = AtomicU32::new(0);
/// Hands a result to the judge thread.
type Deliver = Box<dyn Fn(Found) + Send + Sync>;
static JUDGE: OnceLock<Deliver> = OnceLock::new();

/// Where the results go: the judge thread.
pub fn connect(deliver: Deliver) {
    let _ = JUDGE.set(deliver);
}

/// A check starts: the call entering now carries it.
pub fn started() {
    PENDING.fetch_add(1, Ordering::SeqCst);
}

/// Whether no check is under way.
pub fn idle() -> bool {
    PENDING.load(Ordering::SeqCst) == 0
}

/// The check is done (from its own thread).
pub fn done(found: Found) {
    if let Some(deliver) = JUDGE.get() {
        deliver(found);
    }
    PENDING.fetch_sub(1, Ordering::SeqCst);
}

/// The check could not be made.
pub fn failed(why: &str) {
    done(Found {
        device: String::new(),
        dtype: String::new(),
        device_err: None,
        cpu_err: None,
        why: Some(why.to_string()),
    });
}

/// Waits at most `timeout` for the checks under way (at exit, before the
/// judge thread ends).
pub fn wait(timeout: Duration) -> bool {
    let deadline = Instant::now() + timeout;
    while !idle() {
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
    true
}
