//! One module per command: each turns its options into a report model,
//! reading dumps through `opdump_load` and judging through `opdump_judge`.

pub(crate) mod check;
pub(crate) mod compare;
pub(crate) mod fleet;
pub(crate) mod ranks;
pub(crate) mod repro;
pub(crate) mod repro_check;
pub(crate) mod summary;
