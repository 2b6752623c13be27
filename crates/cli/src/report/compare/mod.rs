//! The report of `opdump compare` on one rank pair: its model (the JSON),
//! its text, its HTML page and its Parquet table.

pub(crate) mod html;
pub(crate) mod model;
pub(crate) mod parquet;
pub(crate) mod text;
