//! Reads a dump's Parquet files into the judge's in-memory [`Dump`]: the
//! one reader of the format (the CLI's `compare`, `summary` and `ranks`
//! read through it).
//!
//! - [`read`]: finds a dump's files ([`scan`]) and loads one rank ([`load`]);
//! - [`rank_keys`]: the rows the ranks vote needs, in windows of steps;
//! - [`spill`]: where a large dump's rows wait, out of memory;
//! - [`captures`]: the capture files a dump names, opened on first use;
//! - `chunks`: each column chunk checked against its CRC before it is decoded;
//! - [`panic_guard`]: a decoder's panic on a malformed file becomes an error;
//! - [`tables`]: the JSON-lines tables beside the Parquet files (the
//!   accuracy check's results, a run's final verdict against a reference).
//!
//! [`Dump`]: opdump_judge::Dump

pub mod captures;
mod chunks;
pub mod error;
pub mod panic_guard;
pub mod rank_keys;
pub mod read;
mod row_bytes;
pub mod spill;
pub mod tables;

pub use error::{Error, Result};
pub use read::{load, load_steps, scan, DumpIndex, FileInfo};
