//! Command-line parsing and the two commands' drivers.
//!
//! Exit status: 0 the runs agree, 1 an op introduced a divergence, 2 usage
//! or input error, 3 outputs diverged but no op introduced it
//! (one `opdump:` line on stderr). Reports go to stdout, progress and
//! messages to stderr.

use std::ffi::OsString;
use std::io::Write;
use std::path::PathBuf;
use std::process::ExitCode;

use clap::{Args, Parser, Subcommand};
use opdump_format::ranges::IntSet;
use regex::Regex;

use crate::align::Filter;
use crate::compare::{self, CompareOptions};
use crate::error::{CliError, Result};
use crate::output;
use crate::progress::Progress;
use crate::report::model::{AlignedPairs, CompareReport};
use crate::report::{html, json, parquet, summary_text, terminal};
use crate::summary;
use crate::text;
use crate::tolerance::{Tolerances, DEFAULT_MIN_AMPLIFICATION};

pub const EXIT_SAME: u8 = 0;
pub const EXIT_DIVERGED: u8 = 1;
pub const EXIT_ERROR: u8 = 2;
/// Outputs diverged, but no op introduced the divergence.
pub const EXIT_DRIFT: u8 = 3;

#[derive(Parser, Debug)]
#[command(
    name = "opdump",
    version,
    about = "Compare and summarize opdump dumps (per-op tensor statistics)"
)]
pub struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub enum Cmd {
    /// Align the op calls of two dumps and name the op where they diverge.
    ///
    /// Exit status: 0 the runs agree, 1 an op introduced a divergence, 2 usage or input error, 3 outputs diverged but no op introduced it.
    Compare(CompareArgs),
    /// Describe one dump: op calls per op, phase and step; NaN/Inf origins.
    Summary(SummaryArgs),
    /// Write a folder that reproduces one op call outside the job: both
    /// runs' captured tensors of the call and repro.py (torch only).
    ///
    /// Both dumps must hold the call's capture (OPDUMP_CAPTURE; `opdump
    /// compare` prints the values). Exit status: 0 written, 2 error.
    Repro(ReproArgs),
    /// Compare the ranks of one data-parallel dump by fingerprint and name
    /// the odd rank out: the first parameter or gradient where one rank's
    /// values leave the majority.
    ///
    /// Exit status: 0 the ranks agree, 1 a rank (or, with no majority, the
    /// ranks) differ, 2 usage or input error.
    Ranks(RanksArgs),
}

#[derive(Args, Debug)]
pub struct RanksArgs {
    /// The dump directory, with a `rank=<R>` partition per rank.
    pub dump: PathBuf,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub struct ReproArgs {
    /// The reference dump (the device you trust), with the call captured.
    pub dump_a: PathBuf,
    /// The dump under test, with the call captured.
    pub dump_b: PathBuf,
    /// The call, as an op selector in A: `aten::gelu@step=0#1` (default: the
    /// first introduced divergence of `opdump compare A B`).
    #[arg(long, value_name = "SELECTOR")]
    pub call: Option<String>,
    /// The folder to write (default: repro-<op>-<seq A>).
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Rank to compare (default: the lowest rank both dumps have).
    #[arg(long)]
    pub rank: Option<u32>,
    /// Compare even when the dumps look like runs of different programs.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct CompareArgs {
    /// The reference dump (the device you trust).
    pub dump_a: PathBuf,
    /// The dump under test.
    pub dump_b: PathBuf,
    /// Rank to compare (default: the lowest rank both dumps have).
    #[arg(long)]
    pub rank: Option<u32>,
    /// Steps to compare: `3`, `0-2`, `0-2,5`.
    #[arg(long, value_name = "RANGES")]
    pub steps: Option<String>,
    /// Leave out op calls (with what they call) whose `op.overload` matches,
    /// e.g. `aten::_to_copy|aten::copy_`.
    #[arg(long, value_name = "REGEX")]
    pub ignore: Option<String>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Also write DIR/compare.parquet (one row per aligned tensor pair) and
    /// DIR/compare.json.
    #[arg(long, value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Also write a self-contained HTML report.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
    /// Relative tolerance for a dtype, replacing the default formula; may be
    /// repeated: `--rtol bfloat16=0.05 --rtol float32=1e-5`.
    #[arg(long, value_name = "DTYPE=VALUE")]
    pub rtol: Vec<String>,
    /// How many introduced divergences to list.
    #[arg(long, default_value_t = 10)]
    pub top: usize,
    /// How much an op may amplify errors: an op "introduced" an error only
    /// if its output error exceeds X times the error that reached it from
    /// upstream divergences; rounding drift of its inputs may grow X-fold
    /// before an output counts as diverged.
    #[arg(long, default_value_t = DEFAULT_MIN_AMPLIFICATION, value_name = "X")]
    pub min_amplification: f64,
    /// Compare even when the dumps look like runs of different programs.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub struct SummaryArgs {
    /// The dump directory.
    pub dump: PathBuf,
    /// Only this rank (default: every rank).
    #[arg(long)]
    pub rank: Option<u32>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

/// `3`, `0-2`, `0..2`, `0-2,5` -> inclusive ranges: the syntax of
/// `OPDUMP_STEPS` (crates/format/src/ranges.rs).
pub fn parse_steps(s: &str) -> Result<Vec<(i64, i64)>> {
    IntSet::parse(s)
        .map(|set| set.ranges().to_vec())
        .map_err(|why| {
            CliError::new(format!(
                "--steps {s:?}: {why}; expected steps like 3, 0-2 or 0-2,5"
            ))
        })
}

/// Writes to stdout and flushes it. A failed write (a full disk, `>
/// /dev/full`) is an error: a report cut short must not pass for a whole
/// one. A closed pipe (`| head`) is not: the reader took what it wanted, so
/// the command ends quietly, like other Unix tools, with the exit status it
/// would have had.
fn print(s: &str) -> Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(s.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(e) if e.kind() == std::io::ErrorKind::BrokenPipe => Ok(()),
        Err(e) => Err(CliError::new(format!("writing to stdout: {e}"))),
    }
}

/// One `opdump:` line on stderr, its control characters escaped (paths, op
/// names and metadata values in it come from files). Nothing more can be
/// done when stderr itself fails.
fn error_line(msg: &str) {
    let _ = writeln!(std::io::stderr(), "opdump: {}", text::clean(msg));
}

fn compare_cmd(a: CompareArgs) -> Result<u8> {
    let filter = Filter {
        steps: a
            .steps
            .as_deref()
            .map(parse_steps)
            .transpose()?
            .unwrap_or_default(),
        ignore: a
            .ignore
            .as_deref()
            .map(|r| Regex::new(r).map_err(|e| CliError::new(format!("--ignore {r:?}: {e}"))))
            .transpose()?,
    };
    let tol = Tolerances::with_overrides(&a.rtol, a.min_amplification)?;
    let progress = Progress::auto();
    let t0 = std::time::Instant::now();
    let c = compare::run(
        CompareOptions {
            dump_a: a.dump_a.clone(),
            dump_b: a.dump_b.clone(),
            rank: a.rank,
            filter,
            tol,
            top: a.top,
            force: a.force,
        },
        &progress,
    )?;
    compare::timing("total compare", t0);
    let t0 = std::time::Instant::now();
    let report = CompareReport::build(&c, a.steps.clone(), a.ignore.clone());
    let pairs = AlignedPairs::of(&c);
    compare::timing("report", t0);
    // Report files: written beside their target and renamed over it, mode
    // 0600, never through a planted symlink (see `output`).
    if let Some(dir) = &a.out {
        parquet::write(&pairs, dir, &progress)?;
        let mut buf = Vec::new();
        json::write(&report, &mut buf)?;
        output::write_bytes(&dir.join("compare.json"), &buf)?;
    }
    if let Some(path) = &a.html {
        output::write_bytes(path, html::render(&report, &pairs).as_bytes())?;
    }
    progress.finish();
    print_report(a.json, &report, terminal::render)?;
    Ok(report.exit_status)
}

fn repro_cmd(a: ReproArgs) -> Result<u8> {
    let progress = Progress::auto();
    let (dir, device_b) = crate::repro::run(
        crate::repro::ReproOptions {
            compare: CompareOptions {
                dump_a: a.dump_a,
                dump_b: a.dump_b,
                rank: a.rank,
                filter: Filter::default(),
                tol: Tolerances::with_overrides(&[], DEFAULT_MIN_AMPLIFICATION)?,
                top: 10,
                force: a.force,
            },
            call: a.call,
            out: a.out,
        },
        &progress,
    )?;
    progress.finish();
    print(&crate::repro::summary(&dir, &device_b))?;
    Ok(EXIT_SAME)
}

fn ranks_cmd(a: RanksArgs) -> Result<u8> {
    let progress = Progress::auto();
    let r = crate::ranks::run(&a.dump, &progress)?;
    progress.finish();
    print_report(a.json, &r, crate::ranks::render)?;
    Ok(r.exit_status)
}

fn summary_cmd(a: SummaryArgs) -> Result<u8> {
    let progress = Progress::auto();
    let s = summary::run(&a.dump, a.rank, &progress)?;
    progress.finish();
    print_report(a.json, &s, summary_text::render)?;
    Ok(EXIT_SAME)
}

/// A report on stdout, as JSON or as text, safe on a terminal either way:
/// the text escapes every control character its layout did not put there,
/// the JSON writes DEL and C1 as `\u00XX` (the same values).
fn print_report<T: serde::Serialize>(as_json: bool, r: &T, render: fn(&T) -> String) -> Result<()> {
    if as_json {
        let mut buf = Vec::new();
        json::write(r, &mut buf)?;
        print(&text::clean_json(&String::from_utf8_lossy(&buf)))
    } else {
        print(&text::clean_lines(&render(r)))
    }
}

/// Runs the command line; returns the exit status.
pub fn main(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
    let cli = match Cli::try_parse_from(args) {
        Ok(c) => c,
        Err(e) => {
            use clap::error::ErrorKind;
            if matches!(e.kind(), ErrorKind::DisplayHelp | ErrorKind::DisplayVersion) {
                let mut text = e.to_string();
                if !text.ends_with('\n') {
                    text.push('\n');
                }
                return match print(&text) {
                    Ok(()) => ExitCode::from(EXIT_SAME),
                    Err(e) => {
                        error_line(&e.message);
                        ExitCode::from(EXIT_ERROR)
                    }
                };
            }
            if e.kind() == ErrorKind::DisplayHelpOnMissingArgumentOrSubcommand {
                // Bare `opdump`: a usage error like any other, one line; the
                // full help is for `--help`.
                error_line("missing command: compare, summary, repro or ranks (see opdump --help)");
                return ExitCode::from(EXIT_ERROR);
            }
            // One line: clap's first paragraph, without its "error: " prefix.
            let text = e.to_string();
            let para: Vec<&str> = text
                .lines()
                .take_while(|l| !l.trim().is_empty())
                .map(str::trim)
                .collect();
            let msg = para.join(" ");
            let msg = msg.strip_prefix("error: ").unwrap_or(&msg);
            error_line(&format!("{msg} (see opdump --help)"));
            return ExitCode::from(EXIT_ERROR);
        }
    };
    let r = match cli.cmd {
        Cmd::Compare(a) => compare_cmd(a),
        Cmd::Summary(a) => summary_cmd(a),
        Cmd::Repro(a) => repro_cmd(a),
        Cmd::Ranks(a) => ranks_cmd(a),
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            error_line(&e.message);
            ExitCode::from(EXIT_ERROR)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn steps() {
        assert_eq!(parse_steps("0-2").unwrap(), vec![(0, 2)]);
        assert_eq!(parse_steps("3").unwrap(), vec![(3, 3)]);
        assert_eq!(parse_steps("0-2,5").unwrap(), vec![(0, 2), (5, 5)]);
        assert_eq!(parse_steps("1..4").unwrap(), vec![(1, 4)]);
        assert!(parse_steps("2-1").is_err());
        assert!(parse_steps("x").is_err());
        assert!(parse_steps("").is_err());
    }
}
