//! The report of `opdump check`: its model (the JSON), its text and its
//! HTML page.

pub(crate) mod html;
pub(crate) mod model;
pub(crate) mod text;

pub use model::*;
pub use text::*;
