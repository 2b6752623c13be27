//! opdump's on-disk format, with no dependency on torch.
//!
//! - [`record`]: one op call and its tensors, as the plugin produces them;
//! - [`capture`]: the safetensors file of a call `OPDUMP_CAPTURE` chose;
//! - [`schema`]: the Arrow schema of a dump file (one row per tensor);
//! - [`writer`]: a rotating Parquet writer that only ever shows complete files;
//! - [`reader`]: finding the files of a dump and reading them back;
//! - [`ranges`]: the one syntax of step and rank sets (`0-2,10`);
//! - [`selector`]: the one syntax naming op calls across runs (`aten::gelu@step=1#2`).
//!
//! The plugin (`src/`) writes with it and `opdump compare` (`crates/cli`) reads with it.

pub mod capture;
pub mod error;
pub mod ranges;
pub mod reader;
pub mod record;
pub mod schema;
pub mod selector;
pub mod writer;

pub use error::{Error, Result};
pub use record::{
    Capture, CapturedTensor, Name, OpRecord, Phase, Role, Stats, StatsStatus, TensorRecord,
};
pub use schema::SCHEMA_VERSION;
pub use writer::{RotateOptions, RotatingWriter};
