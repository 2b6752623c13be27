//! The compare and summary reports as JSON on stdout (progress and messages
//! go to stderr, so stdout stays parseable).

use std::io::Write;

use serde::Serialize;

use crate::app::error::{CliError, Result};

pub fn write<T: Serialize>(value: &T, out: &mut impl Write) -> Result<()> {
    serde_json::to_writer_pretty(&mut *out, value)
        .map_err(|e| CliError::new(format!("writing JSON: {e}; the report is cut short: redirect it to a file on a disk with space")))?;
    writeln!(out).map_err(|e| CliError::new(format!("writing JSON: {e}; the report is cut short: redirect it to a file on a disk with space")))
}
