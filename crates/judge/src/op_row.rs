//! What an op call holds besides its place in the call tree, as a
//! fixed-size row that a dump's [`crate::Rows`] may keep out of memory:
//! read in order by the passes over all calls, and for the few calls a
//! report shows.

use opdump_format::Phase;

use crate::intern::NO_ID;

/// A null seq (`fwd_seq` of a call outside backward).
pub const NO_SEQ: i64 = i64::MIN;

/// One op call's row.
#[derive(Clone, Copy, Debug, PartialEq)]
pub struct OpRow {
    /// Order of entry in the run.
    pub seq: i64,
    /// The training step.
    pub step: i64,
    /// Backward calls: the seq of the forward call that made the autograd
    /// node being run; [`NO_SEQ`] when null.
    pub fwd_seq: i64,
    /// How deep below other recorded calls (0: a root).
    pub depth: i32,
    /// Forward, backward or optimizer.
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
    /// The call's alignment signature ([`crate::Dump::signature`]), folded
    /// by whoever builds the dump while its rows pass by
    /// ([`crate::dump::signature_start`], [`crate::dump::signature_step`]):
    /// aligning then reads this row alone, not every tensor's again.
    pub sig: u64,
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
            sig: 0,
        }
    }
}
