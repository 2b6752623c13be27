//! opdump's judge: the in-memory model of a dump and everything that
//! decides whether two dumps agree, with no I/O.
//!
//! A [`Dump`] is one rank of one run as flat columns; its rows live in
//! [`Rows`] (in memory, or wherever a loader keeps them), its captured
//! values behind [`CapturedValues`]. Comparing two dumps:
//! [`align`] (by signature, recursively, with a diff) -> per tensor pair,
//! evidence and tolerance -> per op, introduced or inherited -> the first
//! divergence, the first introduced divergence and the headline
//! ([`compare_dumps`], or group by group with [`Judge`]).
//!
//! Nothing here reads a file, the environment, or prints: progress goes to
//! an [`Observer`], and a comparison that cannot be made is a [`Refusal`]
//! for the caller to word.

#![deny(missing_docs)]

pub mod align;
pub mod calls;
pub mod captured;
pub mod check;
pub mod compare;
pub mod diff;
pub mod drift;
pub mod dtype;
pub mod dump;
pub mod evidence;
pub mod exact;
mod from_records;
mod hash_filter;
pub mod input_taints;
pub mod intern;
pub mod introduced;
pub mod list_call;
pub mod metrics;
pub mod observer;
pub mod one_sided;
pub mod op_row;
pub mod opclass;
pub mod packed;
pub mod provenance;
pub mod refusal;
pub mod rows;
pub mod selector;
pub mod sketch;
pub mod tensor_row;
pub mod tolerance;
pub mod tree;
pub mod verdict;
pub mod vote;

pub use align::{align, Alignment, Element, Filter, Pair, Part};
pub use captured::{CapturedValues, NoCaptures};
pub use compare::{
    compare_dumps, CompareSettings, Compared, Judge, Judgement, Outcome, UnmatchedChange,
};
pub use dtype::DType;
pub use dump::{full_op_name, Dump, Tensors, NONE};
pub use from_records::RecordsError;
pub use input_taints::InputTaints;
pub use intern::{Interner, ShapeInterner, NO_ID};
pub use observer::{Observer, Silent};
pub use op_row::{OpRow, NO_SEQ};
pub use refusal::{Refusal, Side};
pub use rows::{MemRows, Rows};
pub use tensor_row::TensorRow;
pub use tolerance::Tolerances;
pub use verdict::{OpVerdict, TensorVerdict};
