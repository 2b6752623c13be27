//! The one error type of the CLI: a usage or input problem, shown as one line
//! and exit status 2.

use std::fmt;

use opdump_judge::Refusal;

/// Done (`compare`: the runs agree). The other statuses of `compare` are
/// its outcome's ([`opdump_judge::compare::Outcome::exit_status`]); `ranks`
/// and `check` give 1 for a finding, and `check` 3 for signatures never
/// checked (`report::check::model::EXIT_UNCHECKED`).
pub(crate) const EXIT_SAME: u8 = 0;
/// A usage or input error.
pub(crate) const EXIT_ERROR: u8 = 2;

#[derive(Debug)]
pub struct CliError {
    pub message: String,
}

pub type Result<T> = std::result::Result<T, CliError>;

impl CliError {
    pub fn new(message: impl Into<String>) -> Self {
        // One line: a message spread over lines reads badly after "opdump: ".
        let m: String = message.into();
        CliError {
            message: m.replace('\n', " "),
        }
    }
}

impl fmt::Display for CliError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(&self.message)
    }
}

impl std::error::Error for CliError {}

impl From<opdump_format::Error> for CliError {
    fn from(e: opdump_format::Error) -> Self {
        CliError::new(e.to_string())
    }
}

/// Shorthand for `Err(CliError::new(format!(...)))`.
#[macro_export]
macro_rules! bail {
    ($($t:tt)*) => {
        return Err($crate::app::error::CliError::new(format!($($t)*)))
    };
}

impl From<opdump_load::Error> for CliError {
    fn from(e: opdump_load::Error) -> Self {
        CliError::new(e.message)
    }
}

/// The judge's refusals, worded for the command line.
impl From<Refusal> for CliError {
    fn from(r: Refusal) -> Self {
        CliError::new(match r {
            Refusal::NoCalls { side, path } => {
                format!("{}: dump {} holds no op calls; run its job with OPDUMP=1 (or torch.ops.opdump.enable()) and check that OPDUMP_INCLUDE, OPDUMP_STEPS and OPDUMP_RANKS let calls through", path.display(), side.name())
            }
            Refusal::NoCallsInSteps { path, has, .. } => format!(
                "{}: no op calls in the selected steps (the dump has {has}); pass --steps within those",
                path.display()
            ),
            Refusal::NoPhaseInCommon {
                steps_a,
                steps_b,
                phases_a,
                phases_b,
            } => format!(
                "the dumps have no phase (forward, backward, optimizer) in common to align: A has {steps_a}, phases taking part: {phases_a}; B has {steps_b}, phases taking part: {phases_b}; dump the same steps and ops on both sides, or widen --steps and --ignore"
            ),
            Refusal::DifferentPrograms { matched, larger } => format!(
                "the dumps look like different programs: only {matched} of {larger} top-level op calls align; dump the same program with the same OPDUMP_* selection on both sides, or use --force to compare anyway"
            ),
        })
    }
}
