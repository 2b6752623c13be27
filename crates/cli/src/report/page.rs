//! The frame of every HTML page (`compare`, `compare --rank all`, `check`,
//! `summary --html FILE`): one self-contained file, inline CSS, no script,
//! no network, every string from a dump escaped.

use std::fmt::Write;

/// The one style sheet of every page.
const CSS: &str = "body{font:14px system-ui,sans-serif;margin:24px;color:#222}table{border-collapse:collapse;margin:8px 0}\
     td,th{border:1px solid #ddd;padding:3px 7px;text-align:right;font-variant-numeric:tabular-nums}\
     th{background:#f5f5f5}td.l{text-align:left}code{font-size:12px}pre{white-space:pre-wrap}\
     .dim{color:#888}.ax{font-size:11px;fill:#555}.bad{color:#b00}p.verdict{font-size:16px}\
     td.cmd{text-align:left;word-break:break-all}\
     p.introduced,span.introduced,li.introduced,b.introduced{color:#b00}p.introduced{font-size:16px}\
     .diverged td,tr.introduced td,.fail td{background:#fff0ee}.nan_mismatch td,.error td{background:#fde}\
     .close td{background:#f4fbf4}.drift td,.unfinished td{background:#fffbe6}\
     .plot{border:1px solid #eee;max-width:100%;height:auto}.legend span{margin-right:16px}\
     .flt{display:none;background:#fffbe6;padding:4px 8px}.flt:target{display:block}\
     .tree{font-size:13px}.mod{margin-left:18px}.tree>.mod{margin-left:0}.mod.leaf>summary{list-style:none}\
     .mod.leaf>summary::before{content:\"\\2022  \";color:#bbb}\
     .worst{color:#555}.over{color:#b00;font-weight:bold}.ops{margin:2px 0 2px 18px;padding:0;list-style:none}\
     .same{color:#555}";

/// Every string from a dump (and every path) goes through here: markup
/// characters as entities (the page has no script, and embeds no JSON),
/// control characters as visible escapes, as on a terminal.
pub fn esc(s: &str) -> String {
    let mut o = String::with_capacity(s.len());
    for c in s.chars() {
        match c {
            '&' => o.push_str("&amp;"),
            '<' => o.push_str("&lt;"),
            '>' => o.push_str("&gt;"),
            '"' => o.push_str("&quot;"),
            '\'' => o.push_str("&#39;"),
            c if crate::app::text::is_unsafe(c) => {
                let _ = crate::app::text::escape_char(c, &mut o);
            }
            c => o.push(c),
        }
    }
    o
}

/// A page titled `title`: the head with the style sheet (and `head`, more
/// of it: rules made for this page), `body`'s content, the notes, when
/// there are notes, and the end.
pub fn page(title: &str, head: &str, notes: &[String], body: impl FnOnce(&mut String)) -> String {
    let mut o = format!(
        "<!DOCTYPE html><html><head><meta charset=\"utf-8\"><title>{}</title><style>{CSS}</style>{head}</head><body>",
        esc(title)
    );
    body(&mut o);
    if !notes.is_empty() {
        o.push_str("<h2>Notes</h2><ul>");
        for n in notes {
            let _ = write!(o, "<li>{}</li>", esc(n));
        }
        o.push_str("</ul>");
    }
    o.push_str("</body></html>\n");
    o
}
