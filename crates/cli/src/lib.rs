//! `opdump compare` and `opdump summary`: read dumps written by the opdump
//! plugin, align the op calls of two runs, and name the op where they
//! diverge, and whether it introduced the error or inherited it.
//!
//! Pipeline of `compare`:
//! [`read`] (two dumps in parallel, columns only) -> [`align`] (by
//! signature, recursively, with [`diff`]) -> [`metrics`] (per tensor pair:
//! [`evidence`] and [`tolerance`]) -> [`verdict`] (per op: introduced or
//! inherited) -> [`compare`] (first divergence, first introduced) ->
//! [`report`].

pub mod align;
pub mod call_selector;
pub mod captures;
pub mod cli;
pub mod compare;
pub mod diff;
pub mod dtype;
pub mod dump;
pub mod error;
pub mod evidence;
pub mod exact;
pub mod intern;
pub mod metrics;
pub mod one_sided;
pub mod op_row;
pub mod opclass;
pub mod output;
pub mod panic_guard;
pub mod progress;
pub mod provenance;
pub mod ranks;
pub mod read;
pub mod report;
pub mod repro;
pub mod sketch;
pub mod spill;
pub mod summary;
pub mod synth;
pub mod synth_chain;
pub mod tensor_row;
pub mod text;
pub mod tolerance;
pub mod verdict;
