//! What a command prints: its report on stdout, and one `opdump:` line on
//! stderr when it fails.

use std::io::Write;

use crate::app::error::{CliError, Result};
use crate::app::text;
use crate::report::json;

/// Writes to stdout and flushes it. A failed write (a full disk, `>
/// /dev/full`) is an error: a report cut short must not pass for a whole
/// one. A closed pipe (`| head`) is not: the reader took what it wanted, so
/// the command ends quietly, like other Unix tools, with the exit status it
/// would have had.
pub(crate) fn print(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::new(format!("writing to stdout: {e}; the report is cut short: redirect it to a file on a disk with space"))),
    }
}

/// One `opdump:` line on stderr, its control characters escaped (paths, op
/// names and metadata values in it come from files). Nothing more can be
/// done when stderr itself fails.
pub(crate) fn error_line(msg: &str) {
    let _ = writeln!(std::io::stderr(), "opdump: {}", text::clean(msg));
}

/// A report on stdout, as JSON or as text, safe on a terminal either way:
/// the text escapes every control character its layout did not put there,
/// the JSON writes DEL and C1 as `\u00XX` (the same values).
pub(crate) fn print_report<T: serde::Serialize>(
    as_json: bool,
    r: &T,
    render: fn(&T) -> String,
) -> Result<()> {
    if as_json {
        let mut buf = Vec::new();
        json::write(r, &mut buf)?;
        print(&text::clean_json(&String::from_utf8_lossy(&buf)))
    } else {
        print(&text::clean_lines(&render(r)))
    }
}
