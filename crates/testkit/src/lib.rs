//! Test fixtures of opdump's crates: synthetic dumps written as the plugin
//! writes them, for tests and the benchmark.

pub mod calls;
pub mod ranks_job;
pub mod records;
pub mod synth;
pub mod synth_chain;
