//! Where a dump keeps its per-call and per-tensor rows.
//!
//! The judge reads rows by index and never cares where they live: in memory
//! ([`MemRows`], for dumps built in a test or by the plugin itself), or in a
//! file that a loader spills them to when a dump is larger than memory.

use std::ops::Range;

/// A column of fixed-size rows, read by index.
pub trait Rows<T>: Send + Sync {
    /// How many rows there are.
    fn len(&self) -> usize;

    /// Whether there are none.
    fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// Row `i` (`i < len()`).
    fn get(&self, i: usize) -> T;

    /// Rows `range`, replacing what `out` held.
    fn get_range(&self, range: Range<usize>, out: &mut Vec<T>);
}

/// Rows held in memory.
#[derive(Clone, Debug, Default)]
pub struct MemRows<T>(pub Vec<T>);

impl<T: Copy + Send + Sync> Rows<T> for MemRows<T> {
    fn len(&self) -> usize {
        self.0.len()
    }

    fn get(&self, i: usize) -> T {
        self.0[i]
    }

    fn get_range(&self, range: Range<usize>, out: &mut Vec<T>) {
        out.clear();
        out.extend_from_slice(&self.0[range]);
    }
}
