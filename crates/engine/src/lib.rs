//! opdump's core, with no dependency on torch: everything the plugin decides
//! and does after the C++ hook has measured a call.
//!
//! - [`config`]: every `OPDUMP_*` variable;
//! - [`selection`]: which op calls are recorded (regexes, steps, ranks,
//!   depth, the record cap);
//! - [`entry`]: the bridge's entry points into the recorder, each catching
//!   a panic;
//! - [`recorder`]: sequencing and nesting of op calls, per thread;
//! - [`capture`]: which calls `OPDUMP_CAPTURE` chooses, and the byte cap;
//! - [`names`]: the interned names records borrow (ops, arguments, dtypes,
//!   devices, module paths);
//! - [`modules`]: the module path of a call, and the forward call behind a
//!   backward one;
//! - [`sink`]: the bounded channel and the writer thread;
//! - [`check`]: the accuracy check of each distinct call against a float64
//!   CPU reference (`OPDUMP_CHECK`);
//! - [`jsonl`]: the JSON-lines files beside the Parquet files;
//! - [`online`]: this run judged against a reference dump while it runs
//!   (`OPDUMP_REFERENCE`), on a thread of its own;
//! - [`runtime`]: process-wide state, signals, fork, exit, and the
//!   `torch.ops.opdump.*` switches;
//! - [`host`]: the few things only the torch side can do, handed in by the
//!   bridge at load.
//!
//! The layers: `cpp/` → the bridge (`src/`) → this crate → `opdump-format`.
//! Unit tests run here in milliseconds, without torch.

pub mod capture;
pub mod check;
pub mod config;
pub mod entry;
pub mod host;
pub mod jsonl;
pub mod modules;
pub mod names;
pub mod online;
pub mod recorder;
pub mod runtime;
pub mod selection;
pub mod sink;
