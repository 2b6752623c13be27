//! A last line of defence: a decoder that panics on a malformed file must
//! still give the user one clear line and exit status 2, not a backtrace.
//!
//! The CLI has no `unwrap` on fallible paths; this only guards third-party
//! decoding code, and turns a panic anywhere else into "internal error".

use std::cell::Cell;
use std::io::Write;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::Path;
use std::sync::Mutex;

use crate::error::{CliError, Result};

thread_local! {
    static GUARDED: Cell<u32> = const { Cell::new(0) };
}

static LAST_PANIC: Mutex<Option<String>> = Mutex::new(None);

/// Installs a panic hook that stays quiet inside [`run`] (the panic becomes
/// an error message there) and prints one `opdump:` line elsewhere.
pub fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = match info.payload().downcast_ref::<&str>() {
            Some(s) => s.to_string(),
            None => info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "panic".into()),
        };
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if GUARDED.with(|g| g.get()) > 0 {
            if let Ok(mut last) = LAST_PANIC.lock() {
                *last = Some(msg);
            }
        } else {
            let _ = writeln!(
                std::io::stderr(),
                "opdump: internal error (please report it): {}{at}",
                crate::text::clean(&msg)
            );
        }
    }));
}

/// Runs `f`, which reads `path`; a panic inside becomes an error that names
/// the file.
pub fn run<T>(path: &Path, f: impl FnOnce() -> Result<T>) -> Result<T> {
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
            Err(CliError::new(format!(
                "{}: cannot decode this file (corrupt or truncated?): {msg}",
                path.display()
            )))
        }
    }
}
