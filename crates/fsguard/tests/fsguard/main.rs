//! fsguard's integration tests, one binary.

mod descriptors;
mod directories;
mod file_size_signal;
