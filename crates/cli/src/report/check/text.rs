//! The check report as text.

use std::fmt::Write as _;

use super::model::{CheckReport, Failure, UncheckedSignature, FAIL_RATIO};
use crate::app::text::{op_label, Clean};
use crate::report::format::{self, num, thousands};
use opdump_format::tables::check::SkipCause;

/// A count the plugin may write as a float: as an integer when it is one.
pub fn count(n: f64) -> String {
    if n >= 0.0 && n.fract() == 0.0 && n < 1e18 {
        thousands(n as u64)
    } else {
        num(n)
    }
}

pub(super) fn opt(v: Option<f64>) -> String {
    v.map_or("-".into(), num)
}

/// The count line: checked, by verdict, skipped and why, and why calls had
/// no reference.
pub fn count_line(r: &CheckReport) -> String {
    let c = &r.counts;
    let mut s = format!(
        "checked {} calls: {} passed, {} failed",
        thousands(c.checked),
        thousands(c.passed),
        thousands(c.failed)
    );
    if c.failed > 0 {
        let _ = write!(s, " ({} signatures)", thousands(c.failed_signatures));
    }
    let _ = write!(s, "; {} no_reference", thousands(c.no_reference));
    if !r.no_reference_reasons.is_empty() {
        let why: Vec<String> = r
            .no_reference_reasons
            .iter()
            .map(|x| format!("{}: {}", Clean(&x.reason), x.count))
            .collect();
        let _ = write!(s, " ({})", why.join("; "));
    }
    let k = &r.skipped;
    let _ = write!(
        s,
        "; skipped {}: {} over OPDUMP_CHECK_MAX_BYTES, {} past the time budget, {} while the checker was busy",
        thousands(k.bytes + k.budget + k.busy),
        thousands(k.bytes),
        thousands(k.budget),
        thousands(k.busy)
    );
    s
}

/// The text report: one block per failing signature, worst first, then the
/// count line and the notes.
pub fn render(r: &CheckReport) -> String {
    let mut o = String::new();
    let ranks = format::ranks(&r.ranks);
    if r.failures.is_empty() && !r.unchecked.is_empty() {
        let _ = writeln!(
            o,
            "opdump check: no check failed in {} ({ranks}), but {} signatures were never checked\n",
            Clean(&r.path),
            thousands(r.unchecked.len() as u64)
        );
    } else if r.failures.is_empty() {
        let _ = writeln!(
            o,
            "opdump check: no check failed in {} ({ranks})",
            Clean(&r.path)
        );
    } else {
        let _ = writeln!(
            o,
            "opdump check: {} failing signatures in {} ({ranks}), worst first\n",
            r.failures.len(),
            Clean(&r.path)
        );
    }
    for (k, f) in r.failures.iter().enumerate() {
        failure_block(&mut o, k, f);
    }
    unchecked_block(&mut o, &r.unchecked);
    let _ = writeln!(o, "{}", count_line(r));
    for n in &r.notes {
        let _ = writeln!(o, "note: {}", Clean(n));
    }
    o
}

/// The most unchecked signatures the text names (`--json` has them all).
const UNCHECKED_SHOWN: usize = 50;

/// Why a signature was never checked, in words.
pub fn skip_cause(why: SkipCause) -> &'static str {
    match why {
        SkipCause::Budget => "OPDUMP_CHECK_SECONDS was spent",
        SkipCause::Busy => "the checking thread's queue was full at each call",
    }
}

/// The signatures met and never checked, one line each.
fn unchecked_block(o: &mut String, list: &[UncheckedSignature]) {
    if list.is_empty() {
        return;
    }
    let _ = writeln!(
        o,
        "never checked: {} signatures, so a fault in them would not show (exit status 3 when no check failed):",
        thousands(list.len() as u64)
    );
    for u in list.iter().take(UNCHECKED_SHOWN) {
        let _ = writeln!(
            o,
            "   {}  [{}: {}; {}]",
            Clean(&u.signature),
            op_label(&u.op, &u.overload),
            skip_cause(u.why),
            format::ranks(&u.ranks)
        );
    }
    if list.len() > UNCHECKED_SHOWN {
        let _ = writeln!(
            o,
            "   ... and {} more (--json lists them all)",
            thousands((list.len() - UNCHECKED_SHOWN) as u64)
        );
    }
    o.push('\n');
}

/// Failing signature number `k` (from 0).
fn failure_block(o: &mut String, k: usize, f: &Failure) {
    let _ = writeln!(o, "{}. {}", k + 1, Clean(&f.signature));
    let _ = writeln!(
        o,
        "   op {}  module {}  phase {}  step {}  seq {}  rank {}  on {} in {}",
        op_label(&f.op, &f.overload),
        Clean(f.module.as_deref().unwrap_or("-")),
        Clean(&f.phase),
        f.step,
        f.seq,
        f.rank,
        Clean(&f.device),
        Clean(&f.dtype)
    );
    if let Some(i) = f.element {
        let _ = writeln!(
            o,
            "   list element {i}{}",
            f.name
                .as_deref()
                .map_or(String::new(), |n| format!(" ({})", Clean(n)))
        );
    }
    if !f.args.is_empty() {
        let _ = writeln!(o, "   args {}", Clean(&f.args));
    }
    let _ = writeln!(
        o,
        "   error vs float64 on the CPU: device {}, CPU in {} {}; ratio {} (fails above {})",
        opt(f.device_err),
        Clean(&f.dtype),
        opt(f.cpu_err),
        opt(f.ratio),
        num(FAIL_RATIO)
    );
    let mut extra = Vec::new();
    if f.device_ulp.is_some() || f.cpu_ulp.is_some() {
        extra.push(format!(
            "ULP device {}, CPU {}",
            opt(f.device_ulp),
            opt(f.cpu_ulp)
        ));
    }
    if let Some(n) = f.reduction_len {
        extra.push(format!("reduction length {}", count(n)));
    }
    if let Some(x) = f.device_vs_cpu {
        extra.push(format!("device vs CPU in {} {}", Clean(&f.dtype), num(x)));
    }
    if let Some(why) = &f.reason {
        extra.push(format!("reason: {}", Clean(why)));
    }
    if !extra.is_empty() {
        let _ = writeln!(o, "   {}", extra.join("; "));
    }
    if f.elements_failed.len() > 1 {
        const SHOWN: usize = 8;
        let mut each: Vec<String> = f
            .elements_failed
            .iter()
            .take(SHOWN)
            .map(|e| match &e.name {
                Some(n) => format!("{} ({})", e.element, Clean(n)),
                None => e.element.to_string(),
            })
            .collect();
        if f.elements_failed.len() > SHOWN {
            each.push("...".into());
        }
        let _ = writeln!(
            o,
            "   failed at {} list elements: {}; shown: the worst",
            f.elements_failed.len(),
            each.join(", ")
        );
    } else if f.calls_failed > 1 || f.ranks_failed.len() > 1 {
        let _ = writeln!(
            o,
            "   failed in {} calls ({}); shown: the worst",
            f.calls_failed,
            format::ranks(&f.ranks_failed)
        );
    }
    match &f.repro {
        Some(cmd) => {
            let _ = writeln!(o, "   reproduce: {}", Clean(cmd));
        }
        None => {
            let _ = writeln!(o, "   reproduce: no capture file of this call");
        }
    }
    o.push('\n');
}
