//! One tensor of a dump as a fixed-size record, the unit [`crate::spill`]
//! keeps out of memory: what comparing one tensor needs, 84 bytes.

use opdump_format::{Role, StatsStatus};

use crate::spill::{bytes_at, chunk_cache, PutBytes, Record};

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
    pub min: f64,
    pub max: f64,
    pub mean: f64,
    pub std: f64,
    pub l2: f64,
    pub absmax: f64,
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

const ROLES: [Role; 3] = [Role::Input, Role::Output, Role::None];
/// Status byte of `None`.
const NO_STATUS: u8 = u8::MAX;

fn role_byte(r: Role) -> u8 {
    ROLES.iter().position(|&x| x == r).unwrap_or(2) as u8
}

fn status_byte(s: Option<StatsStatus>) -> u8 {
    s.and_then(|s| StatsStatus::ALL.iter().position(|&x| x == s))
        .map_or(NO_STATUS, |k| k as u8)
}

impl Record for TensorRow {
    const SIZE: usize = 84;

    fn put(&self, out: &mut [u8]) {
        let mut w = PutBytes::new(out);
        for v in self.stats() {
            w.put(&v.to_le_bytes());
        }
        w.put(&self.zero.to_le_bytes());
        w.put(&self.fingerprint.to_le_bytes());
        w.put(&self.shape.to_le_bytes());
        w.put(&self.arg.to_le_bytes());
        w.put(&self.list_index.to_le_bytes());
        w.put(&self.name.to_le_bytes());
        w.put(&self.dtype.to_le_bytes());
        w.put(&[role_byte(self.role), status_byte(self.status)]);
    }

    chunk_cache!(TensorRow);

    fn take(b: &[u8]) -> Self {
        let f = |k: usize| f64::from_le_bytes(bytes_at(b, k));
        let u = |k: usize| u64::from_le_bytes(bytes_at(b, k));
        let w = |k: usize| u32::from_le_bytes(bytes_at(b, k));
        TensorRow {
            min: f(0),
            max: f(8),
            mean: f(16),
            std: f(24),
            l2: f(32),
            absmax: f(40),
            zero: u(48) as i64,
            fingerprint: u(56),
            shape: w(64),
            arg: w(68),
            list_index: w(72) as i32,
            name: w(76),
            dtype: u16::from_le_bytes(bytes_at(b, 80)),
            role: ROLES.get(b[82] as usize).copied().unwrap_or(Role::None),
            status: StatsStatus::ALL.get(b[83] as usize).copied(),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trips_through_bytes() {
        let r = TensorRow {
            role: Role::Output,
            status: Some(StatsStatus::Dropped),
            dtype: 7,
            shape: 123_456,
            arg: u32::MAX,
            list_index: -1,
            name: 9,
            min: -1.5,
            max: f64::INFINITY,
            mean: f64::NAN,
            std: 1e-300,
            l2: 2.0,
            absmax: 3.0,
            zero: -4,
            fingerprint: u64::MAX - 1,
        };
        let mut b = [0u8; TensorRow::SIZE];
        r.put(&mut b);
        let back = TensorRow::take(&b);
        assert_eq!(back.mean.to_bits(), r.mean.to_bits());
        assert_eq!(
            TensorRow { mean: 0.0, ..back },
            TensorRow { mean: 0.0, ..r }
        );
        let none = TensorRow::default();
        none.put(&mut b);
        assert_eq!(TensorRow::take(&b), none);
    }
}
