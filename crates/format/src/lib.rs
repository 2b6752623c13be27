//! opdump's on-disk format, with no dependency on torch.
//!
//! - [`record`]: one op call and its tensors, as the plugin produces them;
//! - [`capture`]: the safetensors file of a call `OPDUMP_CAPTURE` chose;
//! - [`checksum`]: the CRC of each column chunk, which readers check;
//! - [`columns`]: the one table of a dump file's columns (one row per
//!   tensor), and the [`Stats`] of a tensor;
//! - [`schema`]: the Arrow schema and batch builder made from that table;
//! - [`writer`]: a rotating Parquet writer that only ever shows complete files;
//! - [`reader`]: finding the files of a dump and reading them back;
//! - [`regular`]: opening a dump's file only when it is a regular file;
//! - [`ranges`]: the one syntax of step and rank sets (`0-2,10`);
//! - [`selector`]: the one syntax naming op calls across runs (`aten::gelu@step=1#2`);
//! - [`tables`]: the JSON-lines tables beside the Parquet files (the
//!   accuracy check's results, the verdicts against a reference).
//!
//! The plugin (`src/`) writes with it and `opdump compare` (`crates/cli`) reads with it.
//!
//! The `parquet` feature (on by default) brings [`schema`], [`writer`] and
//! [`reader`], and with them Arrow and Parquet; without it the crate is the
//! record types, the table of columns, ranges, selectors and the capture
//! file format, for crates that judge records held in memory.

pub mod capture;
pub mod checksum;
pub mod columns;
pub mod error;
pub mod ranges;
#[cfg(feature = "parquet")]
pub mod reader;
pub mod record;
pub mod regular;
#[cfg(feature = "parquet")]
pub mod schema;
pub mod selector;
pub mod tables;
#[cfg(feature = "parquet")]
pub mod writer;

pub use error::{Error, Result};
pub use record::{
    Capture, CapturedTensor, Name, OpRecord, Phase, Role, Stats, StatsStatus, TensorRecord,
};
#[cfg(feature = "parquet")]
pub use schema::SCHEMA_VERSION;
#[cfg(feature = "parquet")]
pub use writer::{RotateOptions, RotatingWriter};
