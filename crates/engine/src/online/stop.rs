//! `OPDUMP_ON_DIVERGENCE=stop`: once the online judge names an introduced
//! divergence and its capture is made, the job's next top-level op call
//! raises one error that names the op, so that a CI gate on kernels ends
//! with a nonzero status. The check on the job's thread is one relaxed
//! atomic load while nothing is pending.

use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::OnceLock;

static PENDING: AtomicBool = AtomicBool::new(false);
/// Said once the error was raised, or asked at exit.
static REQUESTED: AtomicBool = AtomicBool::new(false);
static MESSAGE: OnceLock<String> = OnceLock::new();

/// Asks for the job to stop with `message`, once `ready` says the capture
/// is made (or cannot be).
pub fn request(message: String) {
    let _ = MESSAGE.set(message);
    REQUESTED.store(true, Ordering::SeqCst);
    PENDING.store(true, Ordering::SeqCst);
}

/// Whether the call entering now raises: true once, when a stop is
/// pending and `ready()` (the capture was made).
pub fn take(ready: impl FnOnce() -> bool) -> bool {
    if !PENDING.load(Ordering::Relaxed) || !ready() {
        return false;
    }
    PENDING.swap(false, Ordering::SeqCst)
}

/// Whether a stop waits to be raised: one relaxed load.
pub fn pending() -> bool {
    PENDING.load(Ordering::Relaxed)
}

/// Whether a stop was asked for in this process.
pub fn requested() -> bool {
    REQUESTED.load(Ordering::SeqCst)
}

/// The error the job's call raises.
pub fn message() -> String {
    MESSAGE.get().cloned().unwrap_or_default()
}
