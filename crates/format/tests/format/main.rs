//! The format crate's integration tests, one binary: files written and
//! read back.

mod hostile;
mod prop_roundtrip;
mod roundtrip;
mod schema_table;
