//! The one syntax for naming op calls across runs, shared by the plugin
//! (`OPDUMP_CAPTURE`) and the CLI (`opdump repro --call`, and the
//! `OPDUMP_CAPTURE=...` line `opdump compare` prints).
//!
//! A `seq` is no name for a call across runs: threads can change it. These
//! count recorded calls instead, which two runs of the same program with the
//! same `OPDUMP_*` selection make in the same order:
//!
//! - `aten::gelu#0`: the first recorded call of that op in the process
//!   (`aten::gelu.default#0`: of that overload);
//! - `aten::gelu@step=1#2`: the third recorded call of that op in step 1;
//! - `module=blocks.0.mlp#0`: every recorded call made inside the first call
//!   of that module's `forward` (nested modules and calls included);
//! - several, separated by `;`.

use std::fmt;

/// One selector.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Selector {
    /// The `index`-th recorded call (from 0) of `op` (`aten::gelu`), or of
    /// one overload when `overload` is given, in the whole process or in
    /// one step.
    Op {
        op: String,
        overload: Option<String>,
        step: Option<i64>,
        index: u64,
    },
    /// Every recorded call inside the `index`-th call of a module.
    Module { path: String, index: u64 },
}

impl Selector {
    /// The op calls this selector counts: `op.overload` matches `op` and,
    /// when given, `overload`.
    pub fn matches_op(&self, op: &str, overload: &str) -> bool {
        match self {
            Selector::Op {
                op: o,
                overload: ov,
                ..
            } => o == op && ov.as_deref().is_none_or(|v| v == overload),
            Selector::Module { .. } => false,
        }
    }
}

impl fmt::Display for Selector {
    /// The text that parses back to the same selector.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Selector::Op {
                op,
                overload,
                step,
                index,
            } => {
                f.write_str(op)?;
                if let Some(ov) = overload {
                    write!(f, ".{ov}")?;
                }
                if let Some(s) = step {
                    write!(f, "@step={s}")?;
                }
                write!(f, "#{index}")
            }
            Selector::Module { path, index } => write!(f, "module={path}#{index}"),
        }
    }
}

/// Parses one selector; the error says what is wrong with it.
pub fn parse_one(s: &str) -> Result<Selector, String> {
    let s = s.trim();
    let (what, index) = s
        .rsplit_once('#')
        .ok_or_else(|| format!("{s:?} has no call index: write aten::gelu#0 for the first call"))?;
    let index: u64 = index
        .trim()
        .parse()
        .map_err(|_| format!("{s:?}: the call index after # must be a number of 0 or more"))?;
    if let Some(path) = what.strip_prefix("module=") {
        if path.is_empty() || path.contains(char::is_whitespace) {
            return Err(format!(
                "{s:?}: a module path such as module=blocks.0.mlp#0 is expected"
            ));
        }
        return Ok(Selector::Module {
            path: path.to_string(),
            index,
        });
    }
    let (name, step) = match what.split_once('@') {
        Some((name, rest)) => {
            let step = rest
                .strip_prefix("step=")
                .and_then(|v| v.trim().parse::<i64>().ok())
                .filter(|v| *v >= 0)
                .ok_or_else(|| {
                    format!("{s:?}: after @ write step=N with N a step of 0 or more, e.g. aten::gelu@step=1#2")
                })?;
            (name, Some(step))
        }
        None => (what, None),
    };
    let Some((ns, rest)) = name.split_once("::") else {
        return Err(format!(
            "{s:?}: an op with its namespace is expected, e.g. aten::gelu#0 or module=blocks.0#0"
        ));
    };
    let valid = |t: &str| !t.is_empty() && t.chars().all(|c| c.is_ascii_alphanumeric() || c == '_');
    let (op_name, overload) = match rest.split_once('.') {
        Some((o, ov)) => (o, Some(ov)),
        None => (rest, None),
    };
    if !valid(ns) || !valid(op_name) || overload.is_some_and(|o| !valid(o)) {
        return Err(format!(
            "{s:?}: {name:?} is not an op name such as aten::gelu or aten::add.Tensor"
        ));
    }
    Ok(Selector::Op {
        op: format!("{ns}::{op_name}"),
        overload: overload.map(str::to_string),
        step,
        index,
    })
}

/// Parses a list separated by `;` (empty parts are ignored).
pub fn parse_list(s: &str) -> Result<Vec<Selector>, String> {
    let out: Vec<Selector> = s
        .split(';')
        .filter(|p| !p.trim().is_empty())
        .map(parse_one)
        .collect::<Result<_, _>>()?;
    if out.is_empty() {
        return Err("no selector given".into());
    }
    Ok(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses_and_prints_back() {
        let list =
            parse_list("aten::gelu#0; aten::add.Tensor@step=1#2;module=blocks.0.mlp#3").unwrap();
        assert_eq!(
            list,
            vec![
                Selector::Op {
                    op: "aten::gelu".into(),
                    overload: None,
                    step: None,
                    index: 0
                },
                Selector::Op {
                    op: "aten::add".into(),
                    overload: Some("Tensor".into()),
                    step: Some(1),
                    index: 2
                },
                Selector::Module {
                    path: "blocks.0.mlp".into(),
                    index: 3
                },
            ]
        );
        for s in &list {
            assert_eq!(parse_one(&s.to_string()).as_ref(), Ok(s));
        }
        assert_eq!(list[1].to_string(), "aten::add.Tensor@step=1#2");
    }

    #[test]
    fn overloads_narrow_the_match() {
        let any = parse_one("aten::add#0").unwrap();
        let one = parse_one("aten::add.Tensor#0").unwrap();
        assert!(any.matches_op("aten::add", "Tensor") && any.matches_op("aten::add", "Scalar"));
        assert!(one.matches_op("aten::add", "Tensor") && !one.matches_op("aten::add", "Scalar"));
        assert!(!any.matches_op("aten::add_", "Tensor"));
    }

    #[test]
    fn bad_selectors_say_what_is_wrong() {
        for (bad, says) in [
            ("aten::gelu", "no call index"),
            ("aten::gelu#x", "call index"),
            ("aten::gelu#-1", "call index"),
            ("gelu#0", "namespace"),
            ("aten::gelu@stp=1#0", "step=N"),
            ("aten::gelu@step=-1#0", "step=N"),
            ("aten::ge lu#0", "not an op name"),
            ("module=#0", "module path"),
            ("", "no selector"),
            (" ; ", "no selector"),
        ] {
            let err = parse_list(bad).unwrap_err();
            assert!(err.contains(says), "{bad:?}: {err}");
        }
    }
}
