//! The `opdump` command; everything lives in the library.

use std::process::ExitCode;

fn main() -> ExitCode {
    opdump_cli::main(std::env::args_os())
}
