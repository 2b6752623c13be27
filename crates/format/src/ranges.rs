//! The one syntax for sets of steps and ranks, shared by the plugin
//! (`OPDUMP_STEPS`, `OPDUMP_RANKS`) and the CLI (`--steps`), so that both
//! accept exactly the same text.
//!
//! A set is a comma-separated list of numbers and inclusive ranges:
//! `3`, `0-2`, `0..2` (the same as `0-2`), `0-2,10`. Numbers are 0 or more.

/// A set of non-negative integers, as inclusive ranges.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct IntSet(Vec<(i64, i64)>);

impl IntSet {
    /// Parses `0-2,10`. The error says which part is wrong; the caller names
    /// the variable or option.
    pub fn parse(s: &str) -> Result<Self, String> {
        let mut out = Vec::new();
        for part in s.split(',').map(str::trim) {
            let num = |t: &str| t.trim().parse::<i64>().ok().filter(|v| *v >= 0);
            let range = match part.split_once("..").or_else(|| part.split_once('-')) {
                Some((a, b)) => match (num(a), num(b)) {
                    (Some(a), Some(b)) if a <= b => (a, b),
                    _ => return Err(format!("bad range {part:?}")),
                },
                None => match num(part) {
                    Some(v) => (v, v),
                    None => return Err(format!("bad number {part:?}")),
                },
            };
            out.push(range);
        }
        Ok(IntSet(out))
    }

    pub fn contains(&self, v: i64) -> bool {
        self.0.iter().any(|&(lo, hi)| lo <= v && v <= hi)
    }

    /// The inclusive ranges, in the order given.
    pub fn ranges(&self) -> &[(i64, i64)] {
        &self.0
    }
}

#[cfg(test)]
mod tests {
    use super::IntSet;

    #[test]
    fn both_range_spellings_and_lists() {
        let s = IntSet::parse("0-2, 5..6,10").unwrap();
        assert_eq!(s.ranges(), &[(0, 2), (5, 6), (10, 10)]);
        assert!(s.contains(0) && s.contains(2) && s.contains(6) && s.contains(10));
        assert!(!s.contains(3) && !s.contains(7) && !s.contains(-1));
        assert_eq!(IntSet::parse("1..4"), IntSet::parse("1-4"));
    }

    #[test]
    fn refuses_what_is_not_a_set() {
        for bad in [
            "", "x", "1-", "-1", "2-1", "3..1", "1,,2", "0x1", "1.5", "1-2-3",
        ] {
            assert!(IntSet::parse(bad).is_err(), "{bad:?} was accepted");
        }
    }
}
