//! The report of `opdump ranks`: its model (the JSON) and its text.

pub(crate) mod model;
pub(crate) mod text;

pub use model::*;
pub use text::*;
