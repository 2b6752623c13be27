//! The loader's integration tests, one binary.

mod chunk_sums;
mod from_records;
mod fuzz_corpus;
