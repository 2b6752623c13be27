//! Reports, one folder per report (compare, fleet, summary, check, ranks),
//! each with its model and its forms (text, JSON, HTML, Parquet).

pub(crate) mod check;
pub(crate) mod compare;
pub(crate) mod fleet;
pub(crate) mod format;
pub(crate) mod json;
pub(crate) mod module_tree;
pub(crate) mod page;
pub(crate) mod ranks;
pub(crate) mod summary;
