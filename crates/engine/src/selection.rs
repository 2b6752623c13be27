//! Which op calls are recorded, apart from the on/off switch: the include
//! and exclude regexes, steps, ranks, nesting depth and the record cap.
//! Functions of the configuration and the call only, so every case is a
//! unit test.

use std::collections::HashMap;
use std::sync::atomic::{AtomicU64, Ordering};

use crate::config::Config;

/// What selection looks at in one call.
#[derive(Clone, Copy, Debug)]
pub struct CallSite<'a> {
    pub op: &'a str,
    pub overload: &'a str,
    /// Nesting depth on its thread; 0 is a call made by the job itself.
    pub depth: i32,
    pub step: i64,
    pub rank: u32,
}

/// Include/exclude verdicts per `op.overload`, so each regex runs once per
/// op and thread rather than once per call.
#[derive(Default)]
pub struct OpVerdicts {
    key: String,
    verdicts: HashMap<String, bool>,
}

/// Whether the regexes select `op.overload`. Both are searched (not
/// anchored) in that text: `aten::add_.Tensor`.
pub fn op_selected(config: &Config, cache: &mut OpVerdicts, op: &str, overload: &str) -> bool {
    if config.include.is_none() && config.exclude.is_none() {
        return true;
    }
    let key = &mut cache.key;
    key.clear();
    key.push_str(op);
    key.push('.');
    key.push_str(overload);
    if let Some(&v) = cache.verdicts.get(key.as_str()) {
        return v;
    }
    let v = config.include.as_ref().is_none_or(|re| re.is_match(key))
        && !config.exclude.as_ref().is_some_and(|re| re.is_match(key));
    cache.verdicts.insert(key.clone(), v);
    v
}

/// Every selection variable but the record cap.
pub fn selects(config: &Config, cache: &mut OpVerdicts, call: CallSite) -> bool {
    selects_site(config, call) && op_selected(config, cache, call.op, call.overload)
}

/// The selection variables of the call's place (depth, step, rank), for an
/// op the regexes select: the hook asks [`op_selected`] once per op and
/// keeps the verdict, so a call pays no string work here.
pub fn selects_site(config: &Config, call: CallSite) -> bool {
    config.max_depth.is_none_or(|d| call.depth <= d)
        && config.steps.as_ref().is_none_or(|s| s.contains(call.step))
        && config
            .ranks
            .as_ref()
            .is_none_or(|r| r.contains(i64::from(call.rank)))
}

/// What the record cap (`OPDUMP_MAX_RECORDS`) says to one more call.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Cap {
    Allowed,
    /// The first call refused: the moment to say so, once.
    Reached,
    Refused,
}

/// Counts recorded calls against `OPDUMP_MAX_RECORDS` (0: no cap).
pub struct RecordCap {
    taken: AtomicU64,
}

impl RecordCap {
    pub const fn new() -> Self {
        RecordCap {
            taken: AtomicU64::new(0),
        }
    }

    /// Takes one place for a call, from any thread.
    pub fn take(&self, max: u64) -> Cap {
        if max == 0 {
            return Cap::Allowed;
        }
        match self.taken.fetch_add(1, Ordering::Relaxed) {
            n if n < max => Cap::Allowed,
            n if n == max => Cap::Reached,
            _ => Cap::Refused,
        }
    }
}

impl Default for RecordCap {
    fn default() -> Self {
        Self::new()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::config;

    fn config(vars: &[(&str, &str)]) -> Config {
        let parsed = config::parse(vars.iter().map(|(a, b)| (a.to_string(), b.to_string())));
        assert!(parsed.errors.is_empty(), "{:?}", parsed.errors);
        parsed.config
    }

    fn site<'a>(op: &'a str, overload: &'a str) -> CallSite<'a> {
        CallSite {
            op,
            overload,
            depth: 0,
            step: 0,
            rank: 0,
        }
    }

    /// The ops of a small training step, as `op.overload`.
    const OPS: &[(&str, &str)] = &[
        ("aten::randn", "default"),
        ("aten::linear", "default"),
        ("aten::t", "default"),
        ("aten::mm", "default"),
        ("aten::mmx", "default"),
        ("aten::relu", "default"),
        ("aten::sum", "default"),
        ("aten::add_", "Tensor"),
        ("aten::add_", "Scalar"),
        ("aten::threshold_backward", "default"),
    ];

    fn selected(c: &Config) -> Vec<String> {
        let mut cache = OpVerdicts::default();
        OPS.iter()
            .filter(|(op, ov)| selects(c, &mut cache, site(op, ov)))
            .map(|(op, ov)| format!("{op}.{ov}"))
            .collect()
    }

    #[test]
    fn include_selects_by_search_in_op_dot_overload() {
        let c = config(&[("OPDUMP_INCLUDE", r"aten::(relu|mm)\b")]);
        assert_eq!(selected(&c), ["aten::mm.default", "aten::relu.default"]);
    }

    #[test]
    fn exclude_removes_and_include_narrows_to_an_overload() {
        let c = config(&[("OPDUMP_EXCLUDE", r"^aten::(relu|t)\.")]);
        let s = selected(&c);
        assert!(
            !s.iter()
                .any(|o| o == "aten::relu.default" || o == "aten::t.default"),
            "{s:?}"
        );
        assert!(s.iter().any(|o| o == "aten::mm.default"));
        assert_eq!(s.len(), OPS.len() - 2);
        let c = config(&[("OPDUMP_INCLUDE", r"aten::add_\.Tensor")]);
        assert_eq!(selected(&c), ["aten::add_.Tensor"]);
        let both = config(&[("OPDUMP_INCLUDE", "add_"), ("OPDUMP_EXCLUDE", "Scalar")]);
        assert_eq!(selected(&both), ["aten::add_.Tensor"]);
    }

    #[test]
    fn verdicts_are_cached_per_op_overload() {
        let c = config(&[("OPDUMP_INCLUDE", "mm")]);
        let mut cache = OpVerdicts::default();
        assert!(op_selected(&c, &mut cache, "aten::mm", "default"));
        assert!(!op_selected(&c, &mut cache, "aten::relu", "default"));
        assert_eq!(cache.verdicts.len(), 2);
        assert!(op_selected(&c, &mut cache, "aten::mm", "default"));
        assert_eq!(cache.verdicts.len(), 2);
    }

    #[test]
    fn steps_ranks_and_depth() {
        let mut cache = OpVerdicts::default();
        let at = |step, rank, depth| CallSite {
            step,
            rank,
            depth,
            ..site("aten::mm", "default")
        };
        let c = config(&[("OPDUMP_STEPS", "1-2")]);
        let steps: Vec<i64> = (0..4)
            .filter(|&s| selects(&c, &mut cache, at(s, 0, 0)))
            .collect();
        assert_eq!(steps, [1, 2]);
        let c = config(&[("OPDUMP_STEPS", "0,3")]);
        let steps: Vec<i64> = (0..4)
            .filter(|&s| selects(&c, &mut cache, at(s, 0, 0)))
            .collect();
        assert_eq!(steps, [0, 3]);
        let c = config(&[("OPDUMP_RANKS", "1")]);
        assert!(!selects(&c, &mut cache, at(0, 0, 0)));
        assert!(selects(&c, &mut cache, at(0, 1, 0)));
        let c = config(&[("OPDUMP_RANKS", "0-1")]);
        assert!(selects(&c, &mut cache, at(0, 1, 0)) && !selects(&c, &mut cache, at(0, 2, 0)));
        for (max, deepest) in [("0", 0), ("1", 1)] {
            let c = config(&[("OPDUMP_MAX_DEPTH", max)]);
            let depths: Vec<i32> = (0..4)
                .filter(|&d| selects(&c, &mut cache, at(0, 0, d)))
                .collect();
            assert_eq!(depths, (0..=deepest).collect::<Vec<_>>());
        }
        let all = config(&[]);
        assert!((0..4).all(|d| selects(&all, &mut cache, at(d as i64, 7, d))));
    }

    #[test]
    fn record_cap_allows_exactly_max_and_reports_once() {
        let cap = RecordCap::new();
        let outcomes: Vec<Cap> = (0..30).map(|_| cap.take(25)).collect();
        assert_eq!(outcomes.iter().filter(|&&c| c == Cap::Allowed).count(), 25);
        assert_eq!(outcomes[25], Cap::Reached);
        assert!(outcomes[26..].iter().all(|&c| c == Cap::Refused));
        let none = RecordCap::new();
        assert!((0..1000).all(|_| none.take(0) == Cap::Allowed));
    }

    #[test]
    fn record_cap_holds_across_threads() {
        let cap = std::sync::Arc::new(RecordCap::new());
        let allowed: usize = (0..4)
            .map(|_| {
                let cap = cap.clone();
                std::thread::spawn(move || {
                    (0..100).filter(|_| cap.take(150) == Cap::Allowed).count()
                })
            })
            .map(|h| h.join().unwrap())
            .sum();
        assert_eq!(allowed, 150);
    }
}
