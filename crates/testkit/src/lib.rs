//! Test fixtures of opdump's crates: synthetic dumps written as the plugin
//! writes them, for tests and the benchmark. Without the `parquet` feature,
//! records are built in memory only (`DumpWriter::in_memory`).

pub mod calls;
pub mod optimizer;
#[cfg(feature = "parquet")]
pub mod ranks_job;
#[cfg(feature = "parquet")]
pub mod records;
pub mod scenarios;
#[cfg(feature = "parquet")]
pub mod schema3;
pub mod synth;
pub mod synth_chain;
