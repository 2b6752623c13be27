//! Strings from a dump are data, never terminal commands.
//!
//! Op names, overloads, args, error texts, argument names, dtypes and paths
//! come from files anyone may have written. Printed raw, an ESC or CSI in
//! them would drive the user's terminal (retitle it, hide lines, fake a
//! verdict), and a newline would forge a line of the report. Every printer
//! (the text reports, the JSON on stdout, the `opdump:` error line, the
//! HTML) shows them through [`escape_char`]: control characters (C0, DEL,
//! C1) become visible escapes, `\x1b` or `\u{9b}`; everything else is
//! printed as it is.

use std::borrow::Cow;
use std::fmt::{self, Write};

/// A control character: C0 (`\0` to `\x1f`, newline and tab included), DEL,
/// or C1 (`\u{80}` to `\u{9f}`, where CSI `\u{9b}` lives).
pub fn is_unsafe(c: char) -> bool {
    c.is_control()
}

/// The visible form of a control character: `\x1b` for C0 and DEL, `\u{9b}`
/// for C1.
pub fn escape_char(c: char, out: &mut impl Write) -> fmt::Result {
    let v = c as u32;
    if v < 0x80 {
        write!(out, "\\x{v:02x}")
    } else {
        write!(out, "\\u{{{v:x}}}")
    }
}

fn escape_where(s: &str, keep: impl Fn(char) -> bool) -> Cow<'_, str> {
    if !s.chars().any(|c| is_unsafe(c) && !keep(c)) {
        return Cow::Borrowed(s);
    }
    let mut o = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if is_unsafe(c) && !keep(c) {
            let _ = escape_char(c, &mut o);
        } else {
            o.push(c);
        }
    }
    Cow::Owned(o)
}

/// One string from a dump (or a path), safe to print on one line: every
/// control character escaped, newlines and tabs included.
pub fn clean(s: &str) -> Cow<'_, str> {
    escape_where(s, |_| false)
}

/// A rendered multi-line report, as a last line of defence behind
/// [`clean`]: every control character but the newlines that the report's
/// own layout puts there.
pub fn clean_lines(s: &str) -> Cow<'_, str> {
    escape_where(s, |c| c == '\n')
}

/// DEL and C1, which `serde_json` leaves raw in strings.
fn raw_in_json(c: char) -> bool {
    is_unsafe(c) && c as u32 >= 0x7f
}

/// JSON text, safe on a terminal with the same values: `serde_json` writes
/// C0 characters in strings as `\u00XX` already (the newlines left are the
/// layout's); DEL and C1, which can only occur inside strings, get the same
/// `\u00XX` form, which decodes to the very same string.
pub fn clean_json(s: &str) -> Cow<'_, str> {
    if !s.chars().any(raw_in_json) {
        return Cow::Borrowed(s);
    }
    let mut o = String::with_capacity(s.len() + 8);
    for c in s.chars() {
        if raw_in_json(c) {
            let _ = write!(o, "\\u{:04x}", c as u32);
        } else {
            o.push(c);
        }
    }
    Cow::Owned(o)
}

/// `clean` as a `Display` adapter, for `format!` arguments.
pub struct Clean<'a>(pub &'a str);

impl fmt::Display for Clean<'_> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for c in self.0.chars() {
            if is_unsafe(c) {
                escape_char(c, f)?;
            } else {
                f.write_char(c)?;
            }
        }
        Ok(())
    }
}

/// An op and its overload as a text report prints them (see
/// `opdump_judge::full_op_name`), escaped: they come from the dump.
pub fn op_label(op: &str, overload: &str) -> String {
    clean(&opdump_judge::full_op_name(op, overload)).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn escapes_controls_only() {
        assert_eq!(clean("aten::add"), "aten::add");
        assert_eq!(clean("a\x1b[31mb"), "a\\x1b[31mb");
        assert_eq!(clean("a\nb\tc\x7f"), "a\\x0ab\\x09c\\x7f");
        assert_eq!(clean("x\u{9b}2Jy"), "x\\u{9b}2Jy");
        assert_eq!(clean("é ü 日本 \u{a0}"), "é ü 日本 \u{a0}");
        assert_eq!(clean_lines("a\nb\x1bc\r"), "a\nb\\x1bc\\x0d");
        assert_eq!(format!("{}", Clean("p\x07q")), "p\\x07q");
        let json = "{\"op\": \"a\u{9b}b\u{7f}\"}";
        let cleaned = clean_json(json);
        assert_eq!(cleaned, "{\"op\": \"a\\u009bb\\u007f\"}");
        let v: serde_json::Value = serde_json::from_str(&cleaned).unwrap();
        assert_eq!(v["op"], "a\u{9b}b\u{7f}");
        let pretty = serde_json::to_string_pretty(&v).unwrap();
        assert_eq!(
            clean_json(&pretty),
            pretty
                .replace('\u{9b}', "\\u009b")
                .replace('\u{7f}', "\\u007f")
        );
        assert!(pretty.contains('\n'));
    }
}
