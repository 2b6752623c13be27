//! The `opdump` command. Everything lives in the library; this sets up the
//! panic safety net and maps the outcome to an exit status.

use std::process::ExitCode;

fn main() -> ExitCode {
    opdump_cli::panic_guard::install_hook();
    match std::panic::catch_unwind(|| opdump_cli::cli::main(std::env::args_os())) {
        Ok(code) => code,
        // The hook has printed one "opdump: internal error" line.
        Err(_) => ExitCode::from(opdump_cli::cli::EXIT_ERROR),
    }
}
