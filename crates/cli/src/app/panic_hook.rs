//! The program's panic hook: a panic while a dump's file is decoded becomes
//! that file's error (see `opdump_load::panic_guard`); any other is one
//! `opdump:` line, not a backtrace.

use std::io::Write;

/// Installs a panic hook that stays quiet inside [`run`] (the panic becomes
/// an error message there) and prints one `opdump:` line elsewhere.
pub(crate) fn install_hook() {
    std::panic::set_hook(Box::new(|info| {
        let msg = match info.payload().downcast_ref::<&str>() {
            Some(s) => s.to_string(),
            None => info
                .payload()
                .downcast_ref::<String>()
                .cloned()
                .unwrap_or_else(|| "panic".into()),
        };
        let at = info
            .location()
            .map(|l| format!(" at {}:{}", l.file(), l.line()))
            .unwrap_or_default();
        if !opdump_load::panic_guard::capture(&msg) {
            let _ = writeln!(
                std::io::stderr(),
                "opdump: internal error (please report it): {}{at}",
                crate::app::text::clean(&msg)
            );
        }
    }));
}
