//! `opdump repro --check DUMP/checks/rank=<R>/capture-<pid>-<n>.safetensors`:
//! the repro folder of a call that the in-job check (OPDUMP_CHECK) found
//! off, from the capture file it wrote.
//!
//! The check's row that names the file (in a `part-*.jsonl` beside it) says
//! which device and dtype the call ran in. The folder is the one `opdump
//! repro A B` writes for a call A did not capture: b.safetensors only, with
//! A's side run from its inputs, where A is the CPU in the call's own dtype.
//! So repro.py runs the call on the CPU in its dtype, on the device, and in
//! float64, and names the one that is off.

use std::path::{Path, PathBuf};

use opdump_format::capture::{meta, CaptureFile};
use opdump_judge::dtype::DType;

use crate::app::error::{CliError, Result, EXIT_SAME};
use crate::app::output;
use crate::app::print::print;
use crate::cli::ReproArgs;
use crate::commands::repro::{default_folder, is_device_name, setup_hint, CallFile, SCRIPT};
use crate::report::check::FAIL_RATIO;
use opdump_format::tables::check::CheckLine;
use opdump_format::tables::{is_part_file_name, Table};
use opdump_load::tables as checks;

/// The dump, the rank and the file name of a check's capture file at `path`:
/// it must lie in `<dump>/checks/rank=<R>/`, where its row is.
fn place(path: &Path) -> Result<(PathBuf, PathBuf, u32, String)> {
    let refuse = |why: &str| {
        CliError::new(format!(
            "{}: {why}; pass a check's capture file, DUMP/checks/rank=<R>/capture-<pid>-<n>.safetensors, as `opdump check DUMP` prints it",
            path.display()
        ))
    };
    let name = path
        .file_name()
        .and_then(|n| n.to_str())
        .ok_or_else(|| refuse("no file name"))?
        .to_string();
    let parent = match path.parent() {
        Some(p) if !p.as_os_str().is_empty() => p,
        _ => Path::new("."),
    };
    let rank_dir = std::fs::canonicalize(parent).map_err(|e| refuse(&e.to_string()))?;
    let as_written = rank_dir
        .file_name()
        .and_then(|n| n.to_str())
        .map(|n| format!("{}/{n}/{name}", Table::Checks.dir()))
        .unwrap_or_default();
    let rank = checks::capture_parts(&as_written)
        .map(|(r, _)| r)
        .ok_or_else(|| refuse("not in a checks/rank=<R>/ directory, or not a .safetensors file"))?;
    let checks_dir = rank_dir.parent().unwrap_or(Path::new("/"));
    if checks_dir.file_name().and_then(|n| n.to_str()) != Some(Table::Checks.dir()) {
        return Err(refuse("not in a checks/rank=<R>/ directory"));
    }
    let dump = checks_dir.parent().unwrap_or(Path::new("/")).to_path_buf();
    Ok((dump, rank_dir, rank, name))
}

/// The row of the check whose capture is `name` in rank `rank`'s directory:
/// read from every `part-*.jsonl` there (a mutated one is an error).
fn row_of(rank_dir: &Path, rank: u32, name: &str, path: &Path) -> Result<CheckLine> {
    let mut parts: Vec<PathBuf> = std::fs::read_dir(rank_dir)
        .map_err(|e| CliError::new(format!("{}: {e}", rank_dir.display())))?
        .filter_map(|e| e.ok().map(|e| e.path()))
        .filter(|p| {
            p.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(is_part_file_name)
        })
        .collect();
    parts.sort();
    for part in &parts {
        let f = checks::read_check_file(part, rank)?;
        if let Some(r) = f.rows.into_iter().find(|r| {
            r.call
                .capture
                .as_deref()
                .and_then(checks::capture_parts)
                .is_some_and(|(rk, n)| rk == rank && n == name)
        }) {
            return Ok(r);
        }
    }
    Err(CliError::new(format!(
        "{}: no check in {}/part-*.jsonl names this capture file ({} files read); pass a capture file that `opdump check DUMP` prints, in the dump the job wrote",
        path.display(),
        rank_dir.display(),
        parts.len()
    )))
}

/// The repro folder of the check's capture at `path`; returns the folder
/// and the check's row.
pub fn run(path: &Path, out: Option<PathBuf>) -> Result<(PathBuf, CheckLine)> {
    let (dump, rank_dir, rank, name) = place(path)?;
    let row = row_of(&rank_dir, rank, &name, path)?;
    let file = CaptureFile::open(path).map_err(|e| {
        CliError::new(format!(
            "{e}; not a readable capture file: run the job again with OPDUMP_CHECK=1 to write it anew"
        ))
    })?;
    let named = |key: &str| file.metadata.get(key).map_or("", String::as_str);
    let (op, overload) = (named(meta::OP), named(meta::OVERLOAD));
    // repro.py calls the op the file names: a file of another op than its
    // row's (planted, or copied in) is refused.
    if op != row.call.op || overload != row.call.overload {
        return Err(CliError::new(format!(
            "{}: the capture holds a call of {:?} (overload {:?}), but its check is of {} (overload {:?}); refusing a capture file that is not of its call: run the job again with OPDUMP_CHECK=1 to write it anew",
            path.display(),
            op.chars().take(80).collect::<String>(),
            overload.chars().take(80).collect::<String>(),
            row.call.op,
            row.call.overload
        )));
    }
    if !is_device_name(&row.call.device) {
        return Err(CliError::new(format!(
            "{}: the check's device {:?} is no device name; not a check opdump wrote: run the job again with OPDUMP_CHECK=1",
            path.display(),
            row.call.device.chars().take(80).collect::<String>()
        )));
    }
    let out = match out {
        Some(dir) => {
            output::create_dir(&dir)?;
            dir
        }
        None => {
            let safe: String = format!("{}.{}", row.call.op, row.call.overload)
                .chars()
                .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
                .collect();
            default_folder(&format!("repro-{safe}-{}", row.call.seq))?
        }
    };
    let dump_text = dump.display().to_string();
    let call = CallFile {
        format: "opdump-repro",
        op: row.call.op.clone(),
        overload: row.call.overload.clone(),
        // A is the CPU in the call's own dtype: the known-good kernel at
        // the same precision that the check measured the device against.
        device_a: "cpu".into(),
        device_b: row.call.device.clone(),
        seq_a: row.call.seq,
        seq_b: row.call.seq,
        step_a: row.call.step,
        step_b: row.call.step,
        selector_a: row.call.signature.clone(),
        selector_b: row.call.signature.clone(),
        module: row.call.module.clone(),
        dump_a: dump_text.clone(),
        dump_b: dump_text.clone(),
        // repro.py calls a device off when its error is beyond `tolerance`
        // and 10 times the other's: with 10 unit roundoffs, that is the
        // check's own rule, ratio = device_err / max(cpu_err, u) > 10.
        tolerance: FAIL_RATIO * DType::parse(&row.call.dtype).unit_roundoff,
        margin: FAIL_RATIO,
        verdict: row.verdict.as_str(),
        a_from_b: true,
        check: Some(serde_json::json!({
            "dump": dump_text,
            "capture": row.call.capture,
            "signature": row.call.signature,
            "phase": row.call.phase,
            "rank": row.call.rank,
            "dtype": row.call.dtype,
            "device_err": row.call.device_err,
            "cpu_err": row.call.cpu_err,
            "ratio": row.call.ratio,
            "verdict": row.verdict.as_str(),
            "reason": row.call.reason,
        })),
    };
    output::write_bytes_in(&out, "b.safetensors", file.bytes())?;
    let json = serde_json::to_string_pretty(&call)
        .map_err(|e| CliError::new(format!("call.json: {e}")))?;
    output::write_bytes_in(&out, "call.json", json.as_bytes())?;
    output::write_bytes_in(&out, "repro.py", SCRIPT.as_bytes())?;
    Ok((out, row))
}

/// What `opdump repro --check` prints: the folder, and the command to run.
pub fn summary(dir: &Path, row: &CheckLine) -> String {
    format!(
        "opdump repro: wrote {d}/ (b.safetensors: the check's capture of {sig}, call.json, repro.py)\n\
         it runs the call from its captured inputs on cpu in {dt} (A), on {dev} (B), and in float64 on the CPU,\n\
         and names the one that is off; run it, with torch and without opdump:\n  python {d}/repro.py{hint}\n",
        d = dir.display(),
        sig = row.call.signature,
        dt = row.call.dtype,
        dev = row.call.device,
        hint = setup_hint(&row.call.device)
    )
}

/// `opdump repro --check FILE`: writes the folder and says what is in it.
pub(crate) fn execute(file: &Path, a: ReproArgs) -> Result<u8> {
    let (dir, row) = run(file, a.out)?;
    // The signature and dtype come from the file: printed escaped.
    print(&crate::app::text::clean_lines(&summary(&dir, &row)))?;
    Ok(EXIT_SAME)
}
