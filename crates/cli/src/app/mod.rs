//! What every command shares: the error type, safe output files, progress
//! on a terminal, text made safe to print, and the names of calls.

pub(crate) mod call_selector;
pub(crate) mod error;
pub(crate) mod output;
pub(crate) mod panic_hook;
pub(crate) mod print;
pub(crate) mod progress;
pub(crate) mod text;
