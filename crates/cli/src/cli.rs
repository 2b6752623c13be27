//! The command line: arguments, and the options they make. Nothing here
//! runs a command (see `commands`).

use std::path::PathBuf;

use clap::{Args, Parser, Subcommand};
use opdump_format::ranges::IntSet;
use opdump_judge::dtype::{canonical, DType};
use opdump_judge::tolerance::{Tolerances, DEFAULT_MIN_AMPLIFICATION};
use opdump_judge::Filter;
use regex::Regex;

use crate::app::error::{CliError, Result};

#[derive(Parser, Debug)]
#[command(
    name = "opdump",
    version,
    about = "Compare and summarize opdump dumps (per-op tensor statistics)"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub cmd: Cmd,
}

#[derive(Subcommand, Debug)]
pub(crate) enum Cmd {
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
    /// compare` prints the values); or, with `--check FILE`, the capture of
    /// a failed check (`opdump check` prints the command). Exit status: 0
    /// written, 2 error.
    Repro(ReproArgs),
    /// List the op calls that OPDUMP_CHECK=1 found off against a float64
    /// CPU reference, worst first, each with its `opdump repro` command.
    ///
    /// Exit status: 0 no check failed and every signature was checked, 1 a
    /// check failed, 2 usage or input error (no check results, a missing
    /// dump, a mutated file), 3 no check failed but signatures were never
    /// checked (the time budget, or the checking queue full), listed.
    Check(CheckArgs),
    /// Compare the ranks of one data-parallel dump by fingerprint and name
    /// the odd rank out: the first parameter or gradient where one rank's
    /// values leave the majority.
    ///
    /// Exit status: 0 the ranks agree, 1 a rank (or, with no majority, the
    /// ranks) differ, 2 usage or input error.
    Ranks(RanksArgs),
}

#[derive(Args, Debug)]
pub(crate) struct RanksArgs {
    /// The dump directory, with a `rank=<R>` partition per rank.
    pub dump: PathBuf,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
}

#[derive(Args, Debug)]
pub(crate) struct CheckArgs {
    /// The dump directory of a job run with OPDUMP_CHECK=1.
    pub dump: PathBuf,
    /// Only this rank, or a set like `0-7,37` (default, and `all`: every
    /// rank).
    #[arg(long, value_parser = parse_rank_choice)]
    pub rank: Option<RankChoice>,
    /// Print the report as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

#[derive(Args, Debug)]
pub(crate) struct ReproArgs {
    /// The reference dump (the device you trust), with the call captured.
    #[arg(required_unless_present = "check")]
    pub dump_a: Option<PathBuf>,
    /// The dump under test, with the call captured.
    #[arg(required_unless_present = "check")]
    pub dump_b: Option<PathBuf>,
    /// The capture file of a failed check,
    /// DUMP/checks/rank=<R>/capture-<pid>-<n>.safetensors (`opdump check`
    /// prints the command): the call runs on the CPU in its own dtype, on
    /// the device it was checked on, and in float64.
    #[arg(long, value_name = "FILE", conflicts_with_all = ["dump_a", "dump_b", "call", "rank", "force"])]
    pub check: Option<PathBuf>,
    /// The call, as an op selector in A: `aten::gelu@step=0#1` (default: the
    /// first introduced divergence of `opdump compare A B`).
    #[arg(long, value_name = "SELECTOR")]
    pub call: Option<String>,
    /// The folder to write (default: repro-<op>-<seq A>).
    #[arg(long, short = 'o', value_name = "DIR")]
    pub out: Option<PathBuf>,
    /// Rank to compare (default: the lowest rank both dumps have).
    #[arg(long)]
    pub rank: Option<u32>,
    /// Compare even when the dumps look like runs of different programs.
    #[arg(long)]
    pub force: bool,
}

#[derive(Args, Debug)]
pub(crate) struct CompareArgs {
    /// The reference dump (the device you trust).
    pub dump_a: PathBuf,
    /// The dump under test.
    pub dump_b: PathBuf,
    /// Rank to compare (default: the lowest rank both dumps have); `all`,
    /// or a set like `0-7,37`, compares each rank pair both dumps have.
    #[arg(long, value_parser = parse_rank_choice)]
    pub rank: Option<RankChoice>,
    /// Rank pairs compared at once with `--rank all` or a set (default: the
    /// number of cores); each loads two dumps.
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(1..))]
    pub jobs: Option<u32>,
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
pub(crate) struct SummaryArgs {
    /// The dump directory.
    pub dump: PathBuf,
    /// Only this rank (default: every rank).
    #[arg(long)]
    pub rank: Option<u32>,
    /// Print the summary as JSON on stdout.
    #[arg(long)]
    pub json: bool,
    /// Also write a self-contained HTML report: the module tree with each
    /// module's op calls and where NaN or Inf came out.
    #[arg(long, value_name = "FILE")]
    pub html: Option<PathBuf>,
}

/// `3`, `0-2`, `0..2`, `0-2,5` -> inclusive ranges: the syntax of
/// `OPDUMP_STEPS` (crates/format/src/ranges.rs).
pub(crate) fn parse_steps(s: &str) -> Result<Vec<(i64, i64)>> {
    IntSet::parse(s)
        .map(|set| set.ranges().to_vec())
        .map_err(|why| {
            CliError::new(format!(
                "--steps {s:?}: {why}; expected steps like 3, 0-2 or 0-2,5"
            ))
        })
}

/// The ranks `compare --rank` names.
#[derive(Clone, Debug)]
pub(crate) enum RankChoice {
    /// One rank pair, as before sets existed.
    One(u32),
    /// Every rank both dumps have.
    All,
    /// The ranks of a set that both dumps have: `0-7,37`.
    Set(IntSet),
}

/// `5` -> one rank; `all`; `0-7,37` -> a set, in the syntax of `--steps`.
fn parse_rank_choice(s: &str) -> std::result::Result<RankChoice, String> {
    if let Ok(r) = s.parse::<u32>() {
        return Ok(RankChoice::One(r));
    }
    if s == "all" {
        return Ok(RankChoice::All);
    }
    IntSet::parse(s)
        .map(RankChoice::Set)
        .map_err(|why| format!("{why}; expected a rank like 5, `all`, or ranks like 0-7,37"))
}

/// What to compare, and how.
pub(crate) struct CompareOptions {
    pub dump_a: PathBuf,
    pub dump_b: PathBuf,
    pub rank: Option<u32>,
    pub filter: Filter,
    pub tol: Tolerances,
    pub top: usize,
    /// Compare even when the dumps look like different programs.
    pub force: bool,
}

/// The calls `compare` looks at: `--steps` and `--ignore`.
fn filter(a: &CompareArgs) -> Result<Filter> {
    Ok(Filter {
        steps: a
            .steps
            .as_deref()
            .map(parse_steps)
            .transpose()?
            .unwrap_or_default(),
        ignore: a
            .ignore
            .as_deref()
            .map(|r| Regex::new(r).map_err(|e| CliError::new(format!("--ignore {r:?}: {e}; --ignore takes a regular expression searched in op.overload, e.g. 'dropout|rand'"))))
            .transpose()?,
    })
}

impl CompareArgs {
    /// `--rank all` or a set of ranks: every pair, and the fleet verdict.
    pub(crate) fn several_ranks(&self) -> bool {
        matches!(self.rank, Some(RankChoice::All | RankChoice::Set(_)))
    }

    /// What to compare and how.
    pub(crate) fn options(&self) -> Result<CompareOptions> {
        Ok(CompareOptions {
            dump_a: self.dump_a.clone(),
            dump_b: self.dump_b.clone(),
            rank: match self.rank {
                Some(RankChoice::One(r)) => Some(r),
                _ => None,
            },
            filter: filter(self)?,
            tol: tolerances(&self.rtol, self.min_amplification)?,
            top: self.top,
            force: self.force,
        })
    }
}

impl ReproArgs {
    /// The comparison that finds the call, with the default settings.
    pub(crate) fn compare_options(&self) -> Result<CompareOptions> {
        // Without --check, clap requires both dumps.
        Ok(CompareOptions {
            dump_a: self.dump_a.clone().unwrap_or_default(),
            dump_b: self.dump_b.clone().unwrap_or_default(),
            rank: self.rank,
            filter: Filter::default(),
            tol: tolerances(&[], DEFAULT_MIN_AMPLIFICATION)?,
            top: 10,
            force: self.force,
        })
    }
}

/// The tolerances of `--rtol DTYPE=VALUE` arguments and
/// `--min-amplification`.
pub(crate) fn tolerances(specs: &[String], min_amplification: f64) -> Result<Tolerances> {
    let mut overrides = Vec::new();
    for s in specs {
        let Some((dt, v)) = s.split_once('=') else {
            return Err(CliError::new(format!(
                "--rtol {s:?}: expected DTYPE=VALUE, e.g. bfloat16=0.05"
            )));
        };
        let v: f64 = v.trim().parse().map_err(|_| {
            CliError::new(format!(
                "--rtol {s:?}: {v:?} is not a number; expected DTYPE=VALUE, e.g. bfloat16=0.05"
            ))
        })?;
        if !(v.is_finite() && v >= 0.0) {
            return Err(CliError::new(format!(
                "--rtol {s:?}: the tolerance must be a finite number >= 0"
            )));
        }
        let dt = canonical(dt.trim());
        if !DType::is_known(dt) {
            return Err(CliError::new(format!(
                "--rtol {s:?}: unknown dtype {dt:?} (use torch's names: float32, bfloat16, float16, float64, int64, ...)"
            )));
        }
        overrides.retain(|(d, _)| d != dt);
        overrides.push((dt.to_string(), v));
    }
    if !(min_amplification.is_finite() && min_amplification >= 1.0) {
        return Err(CliError::new("--min-amplification must be a number >= 1"));
    }
    Ok(Tolerances {
        overrides,
        min_amplification,
    })
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

    #[test]
    fn rank_choices() {
        assert!(matches!(parse_rank_choice("5"), Ok(RankChoice::One(5))));
        assert!(matches!(parse_rank_choice("all"), Ok(RankChoice::All)));
        let Ok(RankChoice::Set(set)) = parse_rank_choice("0-7,37") else {
            panic!("a set");
        };
        assert_eq!(set.ranges(), &[(0, 7), (37, 37)]);
        assert!(parse_rank_choice("x").is_err());
        assert!(parse_rank_choice("-1").is_err());
    }

    #[test]
    fn overrides() {
        let t = tolerances(&["bf16=0.1".into(), "float32=1e-3".into()], 32.0).unwrap();
        assert_eq!(t.rtol(Some(&DType::parse("bfloat16")), 1e6), 0.1);
        assert_eq!(t.rtol(Some(&DType::parse("float32")), 1.0), 1e-3);
        assert!(tolerances(&["float32".into()], 32.0).is_err());
        assert!(tolerances(&["float33=1".into()], 32.0).is_err());
        assert!(tolerances(&["float32=x".into()], 32.0).is_err());
    }
}
