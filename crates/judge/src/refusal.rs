//! Why two dumps cannot be compared: the judge says which case it is, and
//! whoever shows it (the CLI, the plugin) words it.

use std::path::PathBuf;

/// Which of the two dumps a refusal is about.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Side {
    /// The first dump, the reference.
    A,
    /// The second dump.
    B,
}

impl Side {
    /// `A` or `B`.
    pub fn name(self) -> &'static str {
        match self {
            Side::A => "A",
            Side::B => "B",
        }
    }
}

/// A comparison that the judge refuses to make.
#[derive(Clone, Debug, PartialEq)]
pub enum Refusal {
    /// A dump holds no op call at all.
    NoCalls {
        /// Which dump.
        side: Side,
        /// Its directory.
        path: PathBuf,
    },
    /// A dump holds op calls, but none in the selected steps.
    NoCallsInSteps {
        /// Which dump.
        side: Side,
        /// Its directory.
        path: PathBuf,
        /// The steps it has, as a range (`steps 0..2`).
        has: String,
    },
    /// The dumps have no phase in common to align, even ignoring steps.
    NoPhaseInCommon {
        /// The steps of A, as a range (`steps 0..2`).
        steps_a: String,
        /// The steps of B.
        steps_b: String,
        /// The phases of A's top-level calls (`forward, backward`).
        phases_a: String,
        /// The phases of B's.
        phases_b: String,
    },
    /// Too few top-level calls align for the dumps to be one program.
    DifferentPrograms {
        /// Top-level calls that align.
        matched: u64,
        /// Top-level calls of the larger dump.
        larger: u64,
    },
}
