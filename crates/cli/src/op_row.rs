//! What an op call holds besides its place in the call tree, as a
//! fixed-size record that [`crate::spill`] keeps out of memory: read in
//! order by the passes over all calls, and for the few calls a report
//! shows.

use opdump_format::Phase;

use crate::dump::NO_SEQ;
use crate::intern::NO_ID;
use crate::spill::{bytes_at, chunk_cache, PutBytes, Record};

#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpRow {
    pub seq: i64,
    pub step: i64,
    /// Backward calls: the seq of the forward call that made the autograd
    /// node being run; [`NO_SEQ`] when null.
    pub fwd_seq: i64,
    pub depth: i32,
    pub phase: Phase,
    /// Id in the dump's texts of the call's `args`.
    pub args: u32,
    /// `NO_ID` when the op did not raise.
    pub error: u32,
    /// Id in the dump's texts of the innermost module running the call (its
    /// forward's, for a backward call); `NO_ID` outside any.
    pub module: u32,
    /// Id in the dump's texts of the user's source line (`OPDUMP_SOURCE=1`).
    pub source: u32,
}

impl Default for OpRow {
    fn default() -> Self {
        OpRow {
            seq: 0,
            step: 0,
            fwd_seq: NO_SEQ,
            depth: 0,
            phase: Phase::Forward,
            args: NO_ID,
            error: NO_ID,
            module: NO_ID,
            source: NO_ID,
        }
    }
}

const PHASES: [Phase; 3] = [Phase::Forward, Phase::Backward, Phase::Optimizer];

impl Record for OpRow {
    const SIZE: usize = 45;

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
        w.put(&[PHASES.iter().position(|&p| p == self.phase).unwrap_or(0) as u8]);
    }

    chunk_cache!(OpRow);

    fn take(b: &[u8]) -> Self {
        let l = |k: usize| i64::from_le_bytes(bytes_at(b, k));
        let w = |k: usize| u32::from_le_bytes(bytes_at(b, k));
        OpRow {
            seq: l(0),
            step: l(8),
            fwd_seq: l(16),
            depth: w(24) as i32,
            args: w(28),
            error: w(32),
            module: w(36),
            source: w(40),
            phase: PHASES
                .get(b[44] as usize)
                .copied()
                .unwrap_or(Phase::Forward),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

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
        };
        let mut b = [0u8; OpRow::SIZE];
        r.put(&mut b);
        assert_eq!(OpRow::take(&b), r);
    }
}
