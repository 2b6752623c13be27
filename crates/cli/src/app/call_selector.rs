//! The `OPDUMP_CAPTURE` selector of a call in a dump, and the call a
//! selector names: the plugin counts recorded calls as they enter, and a
//! dump holds exactly those, in `seq` order (opdump_format::selector).

use opdump_format::selector::Selector;

use crate::app::error::{CliError, Result};
use opdump_judge::dump::Dump;
use opdump_judge::selector::counts;
pub use opdump_judge::selector::of_call;

/// The call `s` names in `d`.
pub fn find(d: &Dump, s: &Selector) -> Result<u32> {
    let index = match s {
        Selector::Op { index, .. } => *index,
        Selector::Module { .. } => {
            return Err(CliError::new(format!(
                "{s} names every call inside a module; name one call, e.g. aten::gelu@step=0#0"
            )))
        }
    };
    (0..d.len() as u32)
        .filter(|&j| counts(d, s, j))
        .nth(index as usize)
        .ok_or_else(|| {
            CliError::new(format!(
                "{}: no recorded call {s} (it counts recorded calls of that op{})",
                d.path.display(),
                if matches!(s, Selector::Op { step: Some(_), .. }) {
                    " in that step"
                } else {
                    ""
                }
            ))
        })
}
