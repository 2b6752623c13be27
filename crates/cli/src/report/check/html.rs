//! `opdump check --html FILE`: one self-contained page (inline CSS, no
//! script, no network), like compare's: the count line, the failing
//! signatures worst first with their `opdump repro` commands, the
//! signatures never checked, the reasons for no reference, the processes
//! read and the notes.

use std::fmt::Write;

use super::model::{CheckReport, FAIL_RATIO};
use super::text::{count, count_line, opt, skip_cause};
use crate::report::format::{self, num, thousands};
use crate::report::page::{esc, page};

/// The page.
pub fn render(r: &CheckReport) -> String {
    page("opdump check", "", &r.notes, |o| {
        verdict(o, r);
        failures(o, r);
        unchecked(o, r);
        no_reference(o, r);
        counts(o, r);
        processes(o, r);
    })
}

/// The dump, its ranks, the verdict and the count line.
fn verdict(o: &mut String, r: &CheckReport) {
    let _ = write!(
        o,
        "<h1>opdump check</h1><p><code>{}</code> ({})</p>",
        esc(&r.path),
        esc(&format::ranks(&r.ranks))
    );
    let _ = write!(
        o,
        "<p class=\"verdict\">{}</p><p>{}</p>",
        if r.failures.is_empty() && !r.unchecked.is_empty() {
            format!(
                "No check failed, but <b class=\"bad\">{} signatures were never checked</b> (exit status 3): a fault in them would not show.",
                r.unchecked.len()
            )
        } else if r.failures.is_empty() {
            "No check failed (exit status 0).".to_string()
        } else {
            format!(
                "<b class=\"bad\">{} failing signatures</b>, worst first (exit status 1). A check fails when the device's error against float64 on the CPU is more than {} times the CPU's own in the same dtype (or the dtype's unit roundoff, when larger).",
                r.failures.len(),
                num(FAIL_RATIO)
            )
        },
        esc(&count_line(r))
    );
}

/// The failing signatures, worst first, with their `opdump repro` commands.
fn failures(o: &mut String, r: &CheckReport) {
    if !r.failures.is_empty() {
        o.push_str(
            "<h2>Failing signatures</h2><table id=\"failures\"><tr><th>#</th><th>signature</th><th>module</th>\
             <th>phase</th><th>step</th><th>seq</th><th>rank</th><th>device</th><th>device error</th>\
             <th>CPU error</th><th>ratio</th><th>ULP device</th><th>ULP CPU</th><th>reduction length</th>\
             <th>failed calls</th><th>reproduce</th></tr>",
        );
        for (k, f) in r.failures.iter().enumerate() {
            let _ = write!(
                o,
                "<tr class=\"fail\"><td>{}</td><td class=\"l\"><code>{}</code></td><td class=\"l\"><code>{}</code></td>\
                 <td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\">{}</td><td>{}</td><td>{}</td>\
                 <td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"cmd\"><code>{}</code></td></tr>",
                k + 1,
                esc(&f.signature),
                esc(f.module.as_deref().unwrap_or("-")),
                esc(&f.phase),
                f.step,
                f.seq,
                f.rank,
                esc(&format!("{} in {}", f.device, f.dtype)),
                opt(f.device_err),
                opt(f.cpu_err),
                opt(f.ratio),
                opt(f.device_ulp),
                opt(f.cpu_ulp),
                f.reduction_len.map_or("-".into(), count),
                f.calls_failed,
                esc(f.repro.as_deref().unwrap_or("no capture file"))
            );
        }
        o.push_str("</table>");
    }
}

/// The signatures met and never checked, and why.
fn unchecked(o: &mut String, r: &CheckReport) {
    if !r.unchecked.is_empty() {
        o.push_str(
            "<h2>Never checked</h2><table id=\"unchecked\"><tr><th>signature</th><th>op</th><th>why</th><th>ranks</th></tr>",
        );
        for u in &r.unchecked {
            let _ = write!(
                o,
                "<tr><td class=\"l\"><code>{}</code></td><td class=\"l\"><code>{}</code></td><td class=\"l\">{}</td><td>{}</td></tr>",
                esc(&u.signature),
                esc(&opdump_judge::full_op_name(&u.op, &u.overload)),
                skip_cause(u.why),
                esc(&format::ranks(&u.ranks))
            );
        }
        o.push_str("</table>");
    }
}

/// Why calls had no reference, most first.
fn no_reference(o: &mut String, r: &CheckReport) {
    if !r.no_reference_reasons.is_empty() {
        o.push_str("<h2>No reference</h2><table id=\"no_reference\"><tr><th>reason</th><th>calls</th></tr>");
        for x in &r.no_reference_reasons {
            let _ = write!(
                o,
                "<tr><td class=\"l\">{}</td><td>{}</td></tr>",
                esc(&x.reason),
                thousands(x.count)
            );
        }
        o.push_str("</table>");
    }
}

fn counts(o: &mut String, r: &CheckReport) {
    let k = &r.skipped;
    let _ = write!(
        o,
        "<h2>Counts</h2><table id=\"counts\"><tr><th>checked</th><th>passed</th><th>failed</th><th>no_reference</th>\
         <th>skipped: bytes</th><th>skipped: time budget</th><th>skipped: busy</th></tr>\
         <tr><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td></tr></table>",
        thousands(r.counts.checked),
        thousands(r.counts.passed),
        thousands(r.counts.failed),
        thousands(r.counts.no_reference),
        thousands(k.bytes),
        thousands(k.budget),
        thousands(k.busy)
    );
}

/// One row per file read.
fn processes(o: &mut String, r: &CheckReport) {
    o.push_str("<h2>Processes</h2><table id=\"processes\"><tr><th>rank</th><th>pid</th><th>checked</th><th>finished</th><th>file</th></tr>");
    for p in &r.processes {
        let _ = write!(
            o,
            "<tr{}><td>{}</td><td>{}</td><td>{}</td><td>{}</td><td class=\"l\"><code>{}</code></td></tr>",
            if p.finished { "" } else { " class=\"unfinished\"" },
            p.rank,
            p.pid.map_or("-".into(), |p| p.to_string()),
            thousands(p.checked),
            if p.finished { "yes" } else { "no summary (killed?)" },
            esc(&p.file)
        );
    }
    o.push_str("</table>");
}
