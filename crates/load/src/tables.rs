//! Reading the JSON-lines tables of a dump (`opdump_format::tables`): the
//! results of `OPDUMP_CHECK` in `<DUMP>/checks/rank=<R>/part-<pid>.jsonl`,
//! one JSON object per line, written by the plugin while the job runs, and
//! the final verdict of a run judged against `OPDUMP_REFERENCE`.
//!
//! A `check` line per checked call (its verdict was judged in the job; it is
//! read here, never recomputed), and a `summary` line per process at exit.
//! A process killed before exit has no summary line, and may have been cut
//! in the middle of its last line: both are said, neither is an error. Any
//! other line that is not JSON, or lacks a field, is a mutated file: an error
//! naming the file and the line.

use std::collections::BTreeMap;
use std::io::Read;
use std::path::{Component, Path, PathBuf};

use opdump_format::tables::check::{CheckLine, CheckSummary};
use opdump_format::tables::verdict::FinalLine;
use opdump_format::tables::{is_part_file_name, rank_of_dir_name, Kind, Table};
use serde::Deserialize;
use serde_json::{Map, Value};

use crate::error::{Error, Result};

/// A file larger than this is not one the plugin wrote (a line per distinct
/// signature: thousands of lines, not millions): refused before it is read.
const MAX_FILE_BYTES: u64 = 1 << 30;

/// One `part-<pid>.jsonl` file, read.
#[derive(Debug)]
pub struct CheckFile {
    pub path: PathBuf,
    /// From the directory `rank=<R>`.
    pub rank: u32,
    pub rows: Vec<CheckLine>,
    /// None: the process ended before exit (killed).
    pub summary: Option<CheckSummary>,
    /// The last line was cut short and is not JSON (the process was killed
    /// while writing it): left out.
    pub torn_last_line: bool,
    /// Lines of a kind this opdump does not know (a newer plugin's): left out.
    pub unknown_kinds: usize,
}

/// `field` of line `line` of `path` is missing or of the wrong type.
fn bad_line(path: &Path, line: usize, why: &str) -> Error {
    Error::new(format!(
        "{}:{line}: {why}; not a line opdump wrote: the file was changed or cut after the job wrote it; run the job again with OPDUMP_CHECK=1 to write it anew",
        path.display()
    ))
}

/// The typed value of a line, with every field of `fields` present.
fn typed<T: for<'de> Deserialize<'de>>(
    obj: Map<String, Value>,
    fields: &[&str],
    path: &Path,
    line: usize,
    kind: &str,
) -> Result<T> {
    let missing: Vec<&str> = fields
        .iter()
        .copied()
        .filter(|f| !obj.contains_key(*f))
        .collect();
    if !missing.is_empty() {
        return Err(bad_line(
            path,
            line,
            &format!("the {kind} line lacks {}", missing.join(", ")),
        ));
    }
    serde_json::from_value(Value::Object(obj))
        .map_err(|e| bad_line(path, line, &format!("the {kind} line holds {e}")))
}

/// Parses the text of one file (`path` names it in errors).
pub fn parse_check_file(text: &str, path: &Path, rank: u32) -> Result<CheckFile> {
    let mut f = CheckFile {
        path: path.to_path_buf(),
        rank,
        rows: Vec::new(),
        summary: None,
        torn_last_line: false,
        unknown_kinds: 0,
    };
    let lines: Vec<&str> = text.split('\n').collect();
    // `text` ends with '\n' when its last line is whole: the split leaves an
    // empty piece after it.
    let last = lines.len() - 1;
    for (k, raw) in lines.iter().enumerate() {
        let n = k + 1;
        if raw.trim().is_empty() {
            continue;
        }
        let value: Value = match serde_json::from_str(raw) {
            Ok(v) => v,
            // Written one whole line per write: only the last one, without
            // its newline, can be cut by a kill.
            Err(_) if k == last => {
                f.torn_last_line = true;
                continue;
            }
            Err(e) => return Err(bad_line(path, n, &format!("not JSON ({e})"))),
        };
        let Value::Object(obj) = value else {
            return Err(bad_line(path, n, "not a JSON object"));
        };
        let kind = match obj.get("kind") {
            Some(Value::String(s)) => s.clone(),
            _ => return Err(bad_line(path, n, "no \"kind\" string")),
        };
        match kind.as_str() {
            k if k == Kind::Check.as_str() => {
                f.rows.push(typed(obj, CheckLine::REQUIRED, path, n, k)?)
            }
            k if k == Kind::Summary.as_str() => {
                if f.summary.is_some() {
                    return Err(bad_line(path, n, "a second summary line"));
                }
                f.summary = Some(typed(obj, CheckSummary::REQUIRED, path, n, k)?);
            }
            _ => f.unknown_kinds += 1,
        }
    }
    Ok(f)
}

/// Reads one file: a regular file only (a FIFO is an error, not a wait),
/// of a bounded size, in UTF-8.
pub fn read_check_file(path: &Path, rank: u32) -> Result<CheckFile> {
    let too_large = || {
        Error::new(format!(
            "{}: larger than {} bytes, not a file of check results opdump wrote; move it out of the dump",
            path.display(),
            MAX_FILE_BYTES
        ))
    };
    let file = opdump_format::regular::open_regular(path).map_err(Error::from)?;
    // The size the file has now, before a byte of it is read; the read
    // below stays bounded too, for a file that grows meanwhile.
    let size = file
        .metadata()
        .map_err(|e| Error::new(format!("{}: {e}", path.display())))?
        .len();
    if size > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let mut bytes = Vec::with_capacity(size as usize);
    file.take(MAX_FILE_BYTES + 1)
        .read_to_end(&mut bytes)
        .map_err(|e| Error::new(format!("{}: {e}", path.display())))?;
    if bytes.len() as u64 > MAX_FILE_BYTES {
        return Err(too_large());
    }
    let text = String::from_utf8(bytes).map_err(|e| {
        bad_line(
            path,
            1 + bytes_before_lines(e.as_bytes(), e.utf8_error().valid_up_to()),
            "not UTF-8 text",
        )
    })?;
    parse_check_file(&text, path, rank)
}

/// The number of newlines before byte `at`: the line (from 0) it is on.
fn bytes_before_lines(bytes: &[u8], at: usize) -> usize {
    bytes[..at].iter().filter(|&&b| b == b'\n').count()
}

/// The check files (`part-*.jsonl`) of each rank under `<dump>/checks`, by rank,
/// sorted. A missing dump is an error; a dump without check results gives
/// none.
pub fn list_check_files(dump: &Path) -> Result<BTreeMap<u32, Vec<PathBuf>>> {
    match std::fs::metadata(dump) {
        Ok(m) if m.is_dir() => {}
        Ok(_) => {
            return Err(Error::new(format!(
                "{}: not a directory; pass the dump directory (OPDUMP_DIR of the job)",
                dump.display()
            )))
        }
        Err(e) => {
            return Err(Error::new(format!(
                "{}: {e}; pass the dump directory (OPDUMP_DIR of the job)",
                dump.display()
            )))
        }
    }
    let mut out: BTreeMap<u32, Vec<PathBuf>> = BTreeMap::new();
    let checks = dump.join(Table::Checks.dir());
    let Ok(entries) = std::fs::read_dir(&checks) else {
        return Ok(out);
    };
    for e in entries {
        let e = e.map_err(|e| Error::new(format!("{}: {e}", checks.display())))?;
        let name = e.file_name();
        let Some(name) = name.to_str() else { continue };
        if !name.starts_with("rank=") {
            continue;
        }
        let Some(rank) = rank_of_dir_name(name) else {
            return Err(Error::new(format!(
                "{}: the rank of a rank=<R> directory must be a decimal number; move the directory out of the dump",
                e.path().display()
            )));
        };
        let dir = e.path();
        let files =
            std::fs::read_dir(&dir).map_err(|e| Error::new(format!("{}: {e}", dir.display())))?;
        for f in files {
            let f = f.map_err(|e| Error::new(format!("{}: {e}", dir.display())))?;
            let n = f.file_name();
            let n = n.to_string_lossy();
            if is_part_file_name(&n) {
                out.entry(rank).or_default().push(f.path());
            }
        }
    }
    for files in out.values_mut() {
        files.sort();
    }
    Ok(out)
}

/// A capture path as the plugin writes it, relative to the dump's root:
/// `checks/rank=<R>/<file name>`. Anything else (absolute, `..`, another
/// directory) is refused: the path is printed in a command to run.
pub fn capture_parts(capture: &str) -> Option<(u32, &str)> {
    let p = Path::new(capture);
    let parts: Vec<&str> = p
        .components()
        .map(|c| match c {
            Component::Normal(s) => s.to_str(),
            _ => None,
        })
        .collect::<Option<Vec<_>>>()?;
    match parts.as_slice() {
        [table, rank_dir, name]
            if *table == Table::Checks.dir() && name.ends_with(".safetensors") =>
        {
            Some((rank_of_dir_name(rank_dir)?, *name))
        }
        _ => None,
    }
}

/// The final verdict of process `pid` of rank `rank` judged against a
/// reference while it ran: the last line of its verdict file when that is
/// a `final` line; `None` when there is none or it cannot be read (a note,
/// never an error: the dump's Parquet files stand without it).
pub fn final_verdict(dump: &Path, rank: u32, pid: i64) -> Option<(PathBuf, FinalLine)> {
    let file = Table::Verdicts.part_path(dump, rank, pid);
    let meta = std::fs::symlink_metadata(&file).ok()?;
    if !meta.is_file() || meta.len() > MAX_FILE_BYTES {
        return None;
    }
    let text = std::fs::read_to_string(&file).ok()?;
    let last: Value = serde_json::from_str(text.lines().last()?).ok()?;
    if last.get("kind")?.as_str()? != Kind::Final.as_str() {
        return None;
    }
    Some((file, serde_json::from_value(last).ok()?))
}

#[cfg(test)]
mod tests {
    use super::*;
    use opdump_format::tables::check::Verdict;

    fn row(extra: &str) -> String {
        format!(
            r#"{{"kind":"check","signature":"aten::mm.default(float32[4, 4], float32[4, 4])","op":"aten::mm","overload":"default","args":"","module":"m","phase":"forward","step":0,"seq":3,"rank":0,"device":"cpu","dtype":"float32","device_err":1e-3,"cpu_err":1e-8,"ratio":1e5,"device_ulp":null,"cpu_ulp":null,"reduction_len":4,"verdict":"fail","reason":null,"capture":"checks/rank=0/capture-1-0.safetensors"{extra}}}"#
        )
    }

    const SUMMARY: &str = r#"{"kind":"summary","rank":0,"pid":1,"checked":1,"passed":0,"failed":1,"no_reference":0,"signatures":1,"skipped_bytes":2,"skipped_budget":0,"skipped_busy":1}"#;

    #[test]
    fn reads_rows_and_the_summary() {
        let text = format!("{}\n{SUMMARY}\n", row(""));
        let f = parse_check_file(&text, Path::new("p"), 0).unwrap();
        assert_eq!(f.rows.len(), 1);
        assert_eq!(f.rows[0].verdict, Verdict::Fail);
        assert_eq!(f.rows[0].call.reduction_len, Some(4.0));
        // Written as a float by the plugin: read the same.
        let text = row("").replace(r#""reduction_len":4"#, r#""reduction_len":4.0"#);
        let g = parse_check_file(&format!("{text}\n"), Path::new("p"), 0).unwrap();
        assert_eq!(g.rows[0].call.reduction_len, Some(4.0));
        assert_eq!(f.summary.unwrap().skipped_busy, 1);
        assert!(!f.torn_last_line);
    }

    #[test]
    fn a_killed_process_has_no_summary_and_maybe_a_torn_line() {
        let text = format!("{}\n{}", row(""), &row("")[..40]);
        let f = parse_check_file(&text, Path::new("p"), 0).unwrap();
        assert_eq!(f.rows.len(), 1);
        assert!(f.summary.is_none() && f.torn_last_line);
    }

    #[test]
    fn mutated_lines_name_the_file_and_line() {
        // Not JSON, before the last line.
        let text = format!("{}\n{{oops\n{SUMMARY}\n", row(""));
        let e = parse_check_file(&text, Path::new("d/part-1.jsonl"), 0).unwrap_err();
        assert!(
            e.message.starts_with("d/part-1.jsonl:2: not JSON"),
            "{}",
            e.message
        );
        // A field gone.
        let cut = row("").replace(r#""ratio":1e5,"#, "");
        let e = parse_check_file(&format!("{cut}\n"), Path::new("p"), 0).unwrap_err();
        assert!(
            e.message.contains("p:1: the check line lacks ratio"),
            "{}",
            e.message
        );
        // A field of the wrong type, or an unknown verdict.
        let bad = row("").replace(r#""step":0"#, r#""step":"zero""#);
        assert!(parse_check_file(&format!("{bad}\n"), Path::new("p"), 0).is_err());
        let bad = row("").replace(r#""verdict":"fail""#, r#""verdict":"maybe""#);
        assert!(parse_check_file(&format!("{bad}\n"), Path::new("p"), 0).is_err());
        // No kind.
        assert!(parse_check_file("{\"x\":1}\n", Path::new("p"), 0).is_err());
    }

    #[test]
    fn unknown_kinds_and_extra_fields_are_left_for_newer_plugins() {
        let text = format!("{}\n{{\"kind\":\"later\"}}\n", row(r#","new":1"#));
        let f = parse_check_file(&text, Path::new("p"), 0).unwrap();
        assert_eq!((f.rows.len(), f.unknown_kinds), (1, 1));
    }

    #[test]
    fn capture_paths_are_checks_rank_file() {
        assert_eq!(
            capture_parts("checks/rank=3/capture-1-0.safetensors"),
            Some((3, "capture-1-0.safetensors"))
        );
        for bad in [
            "/checks/rank=0/c.safetensors",
            "checks/rank=0/../c.safetensors",
            "checks/rank=x/c.safetensors",
            "captures/rank=0/c.safetensors",
            "checks/rank=0/c.txt",
            "checks/rank=0/sub/c.safetensors",
        ] {
            assert_eq!(capture_parts(bad), None, "{bad}");
        }
    }
    #[test]
    fn the_final_verdict_is_the_last_line_when_final() {
        use opdump_format::tables::verdict::{CallRef, FinalLine};
        let dir = tempfile::tempdir().unwrap();
        let file = Table::Verdicts.part_path(dir.path(), 2, 77);
        std::fs::create_dir_all(file.parent().unwrap()).unwrap();
        let line = FinalLine {
            kind: Kind::Final,
            outcome: "introduced".into(),
            exit_status: 1,
            headline: Some(CallRef {
                op: "aten::gelu".into(),
                step: 3,
                seq_b: 40,
                ..CallRef::default()
            }),
            ..FinalLine::default()
        };
        let text = format!(
            "{{\"kind\":\"group\"}}\n{}\n",
            serde_json::to_string(&line).unwrap()
        );
        std::fs::write(&file, text).unwrap();
        let (path, read) = final_verdict(dir.path(), 2, 77).unwrap();
        assert_eq!((path, read), (file.clone(), line));
        assert!(final_verdict(dir.path(), 2, 78).is_none());
        // A run still judging, its last line a group's: no final verdict yet.
        std::fs::write(&file, "{\"kind\":\"group\"}\n").unwrap();
        assert!(final_verdict(dir.path(), 2, 77).is_none());
    }
}
