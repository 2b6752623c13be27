//! The report of `opdump summary`: its model (the JSON) and its text.

pub(crate) mod model;
pub(crate) mod text;

pub use model::*;
