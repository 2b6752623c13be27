//! The report of `opdump ranks`: its model (the JSON) and its text.

pub(crate) mod model;

pub use model::*;
