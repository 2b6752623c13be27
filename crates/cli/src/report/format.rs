//! How every report writes numbers and sets of ranks.

/// `1234567` -> `1,234,567`.
pub fn thousands(n: u64) -> String {
    let s = n.to_string();
    let mut out = String::with_capacity(s.len() + s.len() / 3);
    for (i, c) in s.chars().enumerate() {
        if i > 0 && (s.len() - i).is_multiple_of(3) {
            out.push(',');
        }
        out.push(c);
    }
    out
}

/// A number in 3 significant digits, `-` when missing.
pub fn num(v: f64) -> String {
    if v.is_nan() {
        "-".into()
    } else if v.is_infinite() {
        if v > 0.0 {
            "inf".into()
        } else {
            "-inf".into()
        }
    } else if v == 0.0 {
        "0".into()
    } else if (1e-3..1e5).contains(&v.abs()) {
        // Four significant digits.
        let decimals = (3 - v.abs().log10().floor() as i32).max(0) as usize;
        let s = format!("{v:.decimals$}");
        // Trailing zeros of the decimals only: 25000 stays 25000.
        if !s.contains('.') {
            return s;
        }
        let s = s.trim_end_matches('0').trim_end_matches('.');
        s.to_string()
    } else {
        format!("{v:.3e}")
    }
}

/// A statistic with 7 significant digits, so that A and B side by side show
/// where they differ.
pub fn sig(v: f64) -> String {
    if v.is_finite() && v != 0.0 {
        format!("{v:.6e}")
    } else {
        num(v)
    }
}

/// A set of ranks in one short line, runs folded: `0, 1, 2, 3, 5` ->
/// `0-3, 5` (a thousand ranks stay one line); empty for none.
pub fn rank_list(ranks: &[u32]) -> String {
    let mut out: Vec<String> = Vec::new();
    let mut i = 0;
    while i < ranks.len() {
        let mut j = i;
        while j + 1 < ranks.len() && ranks[j + 1] == ranks[j] + 1 {
            j += 1;
        }
        out.push(if j == i {
            ranks[i].to_string()
        } else {
            format!("{}-{}", ranks[i], ranks[j])
        });
        i = j + 1;
    }
    out.join(", ")
}

/// [`rank_list`] with its noun: `rank 5`, `ranks 0-3, 5`.
pub fn ranks(ranks: &[u32]) -> String {
    match ranks {
        [one] => format!("rank {one}"),
        _ => format!("ranks {}", rank_list(ranks)),
    }
}

/// The plural ending of `n` things: `""` for one, else `"s"`.
pub fn plural(n: usize) -> &'static str {
    if n == 1 {
        ""
    } else {
        "s"
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn rank_lists_fold_runs() {
        assert_eq!(rank_list(&[0, 1, 2, 3, 5, 7, 8]), "0-3, 5, 7-8");
        assert_eq!(rank_list(&[4]), "4");
        assert_eq!(rank_list(&[]), "");
        assert_eq!(ranks(&[4]), "rank 4");
        assert_eq!(ranks(&[0, 1, 3]), "ranks 0-1, 3");
    }
}
