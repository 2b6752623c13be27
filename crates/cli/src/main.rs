//! The `opdump` command; everything lives in the library.

use std::process::ExitCode;

// Large tables on huge pages: see the module.
#[global_allocator]
static ALLOC: opdump_cli::huge_pages::HugePages = opdump_cli::huge_pages::HugePages;

fn main() -> ExitCode {
    opdump_cli::main(std::env::args_os())
}
