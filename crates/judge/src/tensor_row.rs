//! One tensor of a dump as a fixed-size row, the unit a dump's
//! [`crate::Rows`] may keep out of memory: what comparing one tensor needs.

use opdump_format::{Role, StatsStatus};

/// The per-tensor columns of a dump (see [`crate::dump::Tensors`]).
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct TensorRow {
    /// `Input` or `Output`: the row of an op without tensors is no tensor.
    pub role: Role,
    /// `None` when the file has no status, or one this reader does not
    /// know (a newer writer's): either way, no values to trust.
    pub status: Option<StatsStatus>,
    /// Index into [`crate::dump::Dump::dtypes`].
    pub dtype: u16,
    /// Id in the dump's shape interner (which also holds the numel).
    pub shape: u32,
    /// Id of the argument name in [`crate::dump::Dump::names`].
    pub arg: u32,
    /// -1 when null.
    pub list_index: i32,
    /// Id in [`crate::dump::Dump::texts`] of the parameter or buffer the
    /// tensor is (`fc1.weight`); `NO_ID` when none or unknown.
    pub name: u32,
    /// Minimum (statistics columns, as the dump holds them).
    pub min: f64,
    /// Maximum.
    pub max: f64,
    /// Mean.
    pub mean: f64,
    /// Standard deviation.
    pub std: f64,
    /// L2 norm.
    pub l2: f64,
    /// Largest absolute value.
    pub absmax: f64,
    /// Elements equal to zero.
    pub zero: i64,
    /// The `fingerprint` column (schema 4); 0 when null or absent.
    pub fingerprint: u64,
}

impl Default for TensorRow {
    fn default() -> Self {
        TensorRow {
            role: Role::None,
            status: None,
            dtype: 0,
            shape: 0,
            arg: 0,
            list_index: -1,
            name: 0,
            min: 0.0,
            max: 0.0,
            mean: 0.0,
            std: 0.0,
            l2: 0.0,
            absmax: 0.0,
            zero: 0,
            fingerprint: 0,
        }
    }
}

impl TensorRow {
    /// Whether the statistics hold measured values.
    pub fn has_values(&self) -> bool {
        self.status.is_some_and(|s| s.has_values())
    }

    /// The six float statistics, in the order of the schema.
    pub fn stats(&self) -> [f64; 6] {
        [
            self.min,
            self.max,
            self.mean,
            self.std,
            self.l2,
            self.absmax,
        ]
    }
}
