//! The engine's integration tests, one binary.

mod jsonl_files;
