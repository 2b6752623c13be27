//! The `opdump` command line: `compare`, `summary`, `ranks`, `check` and
//! `repro` over the dumps the plugin writes. Dumps are read by `opdump_load` and
//! judged by `opdump_judge`; this crate turns arguments into options
//! ([`cli`]), runs a command ([`commands`]), and renders its report
//! ([`report`]) through what every command shares ([`app`]).

use std::ffi::OsString;
use std::process::ExitCode;

use clap::Parser;

use crate::app::error::{EXIT_ERROR, EXIT_SAME};
use crate::app::print::{error_line, print};
use crate::cli::{Cli, Cmd};

mod app;
mod cli;
mod commands;
pub mod huge_pages;
mod report;

/// Runs the command line, with the panic safety net: returns the exit
/// status (0 agree or done, 1 an op introduced a divergence or a check
/// failed, 2 usage or input error, 3 outputs diverged but no op introduced
/// it).
pub fn main(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
    app::panic_hook::install_hook();
    let args: Vec<OsString> = args.into_iter().map(Into::into).collect();
    match std::panic::catch_unwind(|| run(args)) {
        Ok(code) => code,
        // The hook has printed one "opdump: internal error" line.
        Err(_) => ExitCode::from(EXIT_ERROR),
    }
}

/// Runs the command line; returns the exit status.
fn run(args: impl IntoIterator<Item = impl Into<OsString> + Clone>) -> ExitCode {
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
                error_line(
                    "missing command: compare, summary, check, repro or ranks (see opdump --help)",
                );
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
        Cmd::Compare(a) if a.several_ranks() => commands::fleet::execute(a),
        Cmd::Compare(a) => commands::compare::execute(a),
        Cmd::Summary(a) => commands::summary::execute(a),
        Cmd::Repro(mut a) => match a.check.take() {
            Some(file) => commands::repro_check::execute(&file, a),
            None => commands::repro::execute(a),
        },
        Cmd::Check(a) => commands::check::execute(a),
        Cmd::Ranks(a) => commands::ranks::execute(a),
    };
    match r {
        Ok(code) => ExitCode::from(code),
        Err(e) => {
            error_line(&e.message);
            ExitCode::from(EXIT_ERROR)
        }
    }
}
