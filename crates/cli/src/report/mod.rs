//! Reports: the data model, and its forms (text, JSON, HTML, Parquet).

pub(crate) mod check;
pub(crate) mod check_html;
pub(crate) mod fleet;
pub(crate) mod html;
pub(crate) mod json;
pub(crate) mod model;
pub(crate) mod parquet;
pub(crate) mod ranks;
pub(crate) mod summary;
pub(crate) mod summary_text;
pub(crate) mod terminal;
