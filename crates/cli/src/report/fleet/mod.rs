//! The report of `opdump compare --rank all`: its model (the JSON) and its
//! text.

pub(crate) mod model;

pub use model::*;
