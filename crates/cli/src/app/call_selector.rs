//! The `OPDUMP_CAPTURE` selector of a call in a dump, and the call a
//! selector names: the plugin counts recorded calls as they enter, and a
//! dump holds exactly those, in `seq` order (opdump_format::selector).

use opdump_format::selector::Selector;

use crate::app::error::{CliError, Result};
use opdump_judge::dump::Dump;

/// Whether call `j` of `d` is one `s` counts.
fn counts(d: &Dump, s: &Selector, j: u32) -> bool {
    match s {
        Selector::Op { step, .. } => {
            s.matches_op(d.op_name(j), d.overload_name(j)) && step.is_none_or(|st| st == d.step(j))
        }
        Selector::Module { .. } => false,
    }
}

/// The selector that names call `i` in a run like the one `d` recorded:
/// its op (with the overload unless it is the default one), its step, and
/// how many such calls came before it in that step.
pub fn of_call(d: &Dump, i: u32) -> Selector {
    let overload = d.overload_name(i);
    let mut s = Selector::Op {
        op: d.op_name(i).to_string(),
        overload: (overload != "default").then(|| overload.to_string()),
        step: Some(d.step(i)),
        index: 0,
    };
    let before = (0..i).filter(|&j| counts(d, &s, j)).count() as u64;
    if let Selector::Op { index, .. } = &mut s {
        *index = before;
    }
    s
}

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
