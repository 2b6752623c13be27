//! The `opdump` binary's integration tests, one binary: exit statuses,
//! reports, files and argument errors.

mod bad_input;
mod check_status;
mod common;
mod compare;
mod exact_capture;
mod fleet;
mod hostile_input;
mod html_module_tree;
mod mutation;
mod probe_files;
mod ranks;
mod report_targets;
mod schema_table;
mod sketch;
mod summary;
mod summary_html;
mod verdict_text;
