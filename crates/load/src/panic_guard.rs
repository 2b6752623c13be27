//! A last line of defence: a decoder that panics on a malformed file must
//! still give the user one clear line, not a backtrace.
//!
//! The loader has no `unwrap` on fallible paths; this only guards
//! third-party decoding code. The program's panic hook hands a panic's
//! message to [`capture`] and reports it itself when that returns false.

use std::cell::Cell;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Mutex;

use crate::error::Error;

thread_local! {
    static GUARDED: Cell<u32> = const { Cell::new(0) };
}

static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Keeps the message of a panic raised inside [`run`], for the error it
/// becomes; returns false, keeping nothing, outside [`run`] (the panic hook
/// of the program then reports it).
pub fn capture(msg: &str) -> bool {
    if GUARDED.with(|g| g.get()) == 0 {
        return false;
    }
    if let Ok(mut last) = LAST_PANIC.lock() {
        *last = Some(msg.to_string());
    }
    true
}

/// Runs `f`, which reads `path`; a panic inside becomes an error that names
/// the file.
pub fn run<T, E: From<Error>>(path: &Path, f: impl FnOnce() -> Result<T, E>) -> Result<T, E> {
    GUARDED.with(|g| g.set(g.get() + 1));
    let r = catch_unwind(AssertUnwindSafe(f));
    GUARDED.with(|g| g.set(g.get() - 1));
    match r {
        Ok(r) => r,
        Err(_) => {
            let msg = LAST_PANIC
                .lock()
                .ok()
                .and_then(|mut l| l.take())
                .unwrap_or_default();
            Err(Error::new(format!(
                "{}: cannot decode this file (corrupt or truncated?): {msg}; move it out of the dump directory to compare the rest, or dump again",
                path.display()
            ))
            .into())
        }
    }
}
