//! The byte forms of the judge's rows, as [`crate::spill`] stores them.

use opdump_format::{Phase, Role, StatsStatus};
use opdump_judge::{OpRow, TensorRow};

use crate::spill::{chunk_cache, fixed, PutBytes, Record};

const PHASES: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Optimizer];

impl Record for OpRow {
    const SIZE: usize = 53;
    // Read back in six passes or more (aligning, measuring, judging, the
    // report), and a third of the tensors' size: as they are, a chunk
    // read back is a copy, not a decompression (5% of compare's CPU time
    // at 1M op calls, and 2-3% to compress; 0.9 GB more of spill file
    // at 10M).
    const COMPRESS: bool = false;

    #[inline(always)]
    fn put(&self, out: &mut [u8]) {
        let mut w = PutBytes::new(out);
        w.put(&self.seq.to_le_bytes());
        w.put(&self.step.to_le_bytes());
        w.put(&self.fwd_seq.to_le_bytes());
        w.put(&self.depth.to_le_bytes());
        w.put(&self.args.to_le_bytes());
        w.put(&self.error.to_le_bytes());
        w.put(&self.module.to_le_bytes());
        w.put(&self.source.to_le_bytes());
        w.put(&self.sig.to_le_bytes());
        w.put(&[PHASES.iter().position(|&p| p == self.phase).unwrap_or(0) as u8]);
    }

    chunk_cache!(OpRow);

    // Inlined into the loop that decodes a chunk (a call per record cost
    // as much as the decoding).
    #[inline(always)]
    fn take(b: &[u8]) -> Self {
        // A fixed-size array: every field's offset is a constant, so the
        // reads compile to loads without bounds checks (this runs for every
        // record of every chunk read back).
        let Ok(b) = <&[u8; Self::SIZE]>::try_from(b) else {
            return OpRow::default();
        };
        let l = |k: usize| i64::from_le_bytes(fixed(b, k));
        let w = |k: usize| u32::from_le_bytes(fixed(b, k));
        OpRow {
            seq: l(0),
            step: l(8),
            fwd_seq: l(16),
            depth: w(24) as i32,
            args: w(28),
            error: w(32),
            module: w(36),
            source: w(40),
            sig: u64::from_le_bytes(fixed(b, 44)),
            phase: PHASES
                .get(b[52] as usize)
                .copied()
                .unwrap_or(Phase::Forward),
        }
    }
}

#[cfg(test)]
mod op_row_tests {
    use super::*;
    use opdump_judge::{NO_ID, NO_SEQ};

    #[test]
    fn round_trips_through_bytes() {
        let r = OpRow {
            seq: i64::MAX,
            step: -3,
            fwd_seq: NO_SEQ,
            depth: 7,
            phase: Phase::Optimizer,
            args: 1,
            error: NO_ID,
            module: 5,
            source: 6,
            sig: u64::MAX - 7,
        };
        let mut b = [0u8; OpRow::SIZE];
        r.put(&mut b);
        assert_eq!(OpRow::take(&b), r);
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

    #[inline(always)]
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

    #[inline(always)]
    fn take(b: &[u8]) -> Self {
        // See OpRow's: constant offsets into a fixed-size array.
        let Ok(b) = <&[u8; Self::SIZE]>::try_from(b) else {
            return TensorRow::default();
        };
        let f = |k: usize| f64::from_le_bytes(fixed(b, k));
        let u = |k: usize| u64::from_le_bytes(fixed(b, k));
        let w = |k: usize| u32::from_le_bytes(fixed(b, k));
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
            dtype: u16::from_le_bytes(fixed(b, 80)),
            role: ROLES.get(b[82] as usize).copied().unwrap_or(Role::None),
            status: StatsStatus::ALL.get(b[83] as usize).copied(),
        }
    }
}

#[cfg(test)]
mod tensor_row_tests {
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
