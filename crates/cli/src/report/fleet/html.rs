//! The page of `compare --rank all --html FILE` (or a set of ranks).

use std::fmt::Write;

use super::model::{FleetReport, RankRow};
use super::text as fleet;
use crate::report::format::{self, num};
use crate::report::page::{esc, page};

/// The page of `compare --rank all` (or a set of ranks): the fleet verdict
/// and one table row per rank pair; no plot, since each pair has its own
/// (`--rank R --html`).
pub fn render(r: &FleetReport) -> String {
    page("opdump compare: ranks", "", &[], |o| {
        let _ = write!(
            o,
            "<h1>opdump compare: {} rank pairs</h1><p>A (reference) <code>{}</code><br>B (under test) <code>{}</code></p>",
            r.ranks.len(),
            esc(&r.dump_a),
            esc(&r.dump_b)
        );
        let _ = write!(o, "<pre>{}</pre>", esc(&fleet::verdict_text(r)));
        o.push_str(
            "<table><tr><th>rank</th><th>verdict</th><th>op</th><th>module</th><th>step</th><th>seq A</th>\
             <th>error</th><th>tolerance</th><th>why not compared</th></tr>",
        );
        for row in &r.ranks {
            fleet_row(o, row);
        }
        o.push_str("</table>");
        for (side, ranks) in [("A", &r.only_in_a), ("B", &r.only_in_b)] {
            if !ranks.is_empty() {
                let _ = write!(o, "<p>Only in {side}: {}</p>", format::ranks(ranks));
            }
        }
    })
}

fn fleet_row(o: &mut String, row: &RankRow) {
    let _ = write!(
        o,
        "<tr class=\"{}\"><td>{}</td><td class=\"l\">{}</td>",
        row.verdict, row.rank, row.verdict
    );
    match &row.headline {
        Some(s) => {
            let _ = write!(
                o,
                "<td class=\"l\"><code>{}</code></td><td class=\"l\">{}</td><td>{}</td><td>{}</td><td>{}</td><td>{}</td>",
                esc(&s.op),
                esc(s.module.as_deref().unwrap_or("")),
                s.step,
                s.seq_a,
                num(s.rel_err),
                num(s.tolerance)
            );
        }
        None => o.push_str("<td></td><td></td><td></td><td></td><td></td><td></td>"),
    }
    let _ = write!(
        o,
        "<td class=\"l\">{}</td></tr>",
        esc(row.error.as_deref().unwrap_or(""))
    );
}
