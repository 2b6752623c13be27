//! The `OPDUMP_CAPTURE` selector of a call in a dump: the plugin counts
//! recorded calls as they enter, and a dump holds exactly those, in `seq`
//! order (`opdump_format::selector`).

use opdump_format::selector::Selector;

use crate::dump::Dump;

/// Whether call `j` of `d` is one that `s` counts.
pub fn counts(d: &Dump, s: &Selector, j: u32) -> bool {
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
