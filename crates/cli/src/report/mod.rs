//! Reports: the data model, and its forms (text, JSON, HTML, Parquet).

pub mod html;
pub mod json;
pub mod model;
pub mod parquet;
pub mod summary_text;
pub mod terminal;
