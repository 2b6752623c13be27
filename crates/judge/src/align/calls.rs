//! What the optimizer passes (`optimizer.rs`, `fused.rs`) share: one
//! side's unmatched calls of a group, and the parameter names of the list
//! calls they pair.

use crate::dump::Dump;
use crate::refusal::Side;

/// The parameter names of a list call's elements, where some call of its
/// step names them (see `optimizer::pair_list_calls`).
#[derive(Clone, Debug, PartialEq)]
pub struct ListParams {
    /// The side whose call is the list call.
    pub side: Side,
    /// The list call.
    pub call: u32,
    /// Per element: the parameter's name, when known.
    pub names: Vec<Option<String>>,
}

/// One side of a group: its dump and its unmatched top-level calls.
#[derive(Clone, Copy)]
pub(super) struct Calls<'a> {
    pub d: &'a Dump,
    pub side: Side,
    pub roots: &'a [u32],
}
