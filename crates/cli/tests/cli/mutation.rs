//! A bounded-time mutation test of the reader: a real dump written by the
//! format crate's writer, and a fixed number of seeded mutants of its file
//! (bit flips, truncations, byte overwrites in the footer and the pages,
//! zeroed and forged lengths). `opdump summary` and `opdump compare` must
//! end on each within a few seconds, by exit status, never by a signal or
//! a panic, and an error must be exactly one `opdump:` line.
//!
//! `compare` may also exit 1: a flipped statistic is a divergence.

use std::path::Path;

use crate::common::*;

/// Mutants per run of the test, and the seed: fixed, so a failure names a
/// mutant that can be produced again. `MUTATION_MUTANTS` and `MUTATION_SEED`
/// override them for a longer hunt by hand.
const MUTANTS: usize = 300;
const SEED: u64 = 0x0bd_5eed_2026;

fn env_or<T: std::str::FromStr>(name: &str, default: T) -> T {
    std::env::var(name)
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(default)
}
const TIMEOUT_SECS: u64 = 5;

/// xorshift64*: enough randomness for choosing bytes, no dependency.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        let mut x = self.0;
        x ^= x >> 12;
        x ^= x << 25;
        x ^= x >> 27;
        self.0 = x;
        x.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }

    fn range(&mut self, lo: usize, hi: usize) -> usize {
        lo + self.below(hi - lo)
    }
}

/// Where the footer (Thrift metadata) lies: `start..len - 8`.
fn footer_start(bytes: &[u8]) -> usize {
    let n = bytes.len();
    let len = u32::from_le_bytes(bytes[n - 8..n - 4].try_into().unwrap()) as usize;
    n - 8 - len
}

/// One mutant of `good`, and what was done to it.
fn mutate(rng: &mut Rng, good: &[u8]) -> (Vec<u8>, String) {
    let mut b = good.to_vec();
    let n = b.len();
    let fs = footer_start(good);
    let kind = rng.below(10);
    let what = match kind {
        0 => {
            let k = rng.range(1, 9);
            for _ in 0..k {
                let i = rng.below(n);
                b[i] ^= 1 << rng.below(8);
            }
            format!("{k} bit flips anywhere")
        }
        1 => {
            let k = rng.range(1, 5);
            for _ in 0..k {
                let i = rng.range(fs, n - 8);
                b[i] ^= 1 << rng.below(8);
            }
            format!("{k} bit flips in the footer")
        }
        2 => {
            let cut = rng.below(n);
            b.truncate(cut);
            format!("truncated to {cut} bytes")
        }
        3 => {
            let i = rng.range(fs, n - 8);
            let k = rng.range(1, 17).min(n - 8 - i);
            for x in &mut b[i..i + k] {
                *x = rng.next() as u8;
            }
            format!("{k} random bytes in the footer at {i}")
        }
        4 => {
            let i = rng.range(4, fs);
            let k = rng.range(1, 65).min(fs - i);
            for x in &mut b[i..i + k] {
                *x = rng.next() as u8;
            }
            format!("{k} random bytes in the pages at {i}")
        }
        5 => {
            let i = rng.range(fs, n - 12);
            b[i..i + 4].fill(0);
            format!("4 zero bytes in the footer at {i}")
        }
        6 => {
            let v: u32 = match rng.below(4) {
                0 => 0,
                1 => u32::MAX,
                2 => (n as u32).wrapping_add(rng.below(100) as u32),
                _ => rng.next() as u32,
            };
            b[n - 8..n - 4].copy_from_slice(&v.to_le_bytes());
            format!("footer length {v}")
        }
        7 => {
            // Varint continuation bits and extreme values in the footer:
            // lengths, counts and offsets grow huge.
            let i = rng.range(fs, n - 8);
            let k = rng.range(1, 10).min(n - 8 - i);
            b[i..i + k].fill(0xff);
            format!("{k} bytes 0xff in the footer at {i}")
        }
        8 => {
            let i = rng.range(4, fs);
            let k = rng.range(1, 9).min(fs - i);
            b[i..i + k].fill(0);
            format!("{k} zero bytes in the pages at {i}")
        }
        _ => {
            // A count, size or offset of the footer (a Thrift i64 field:
            // num_rows, num_values, total_byte_size, page offsets) set to
            // an extreme value.
            let v = match rng.below(5) {
                0 => 1i64 << 50,
                1 => i64::MAX,
                2 => 0,
                3 => -1,
                _ => (rng.next() >> 1) as i64,
            };
            match rewrite_i64_field(good, fs, rng, v) {
                Some((m, at)) => {
                    b = m;
                    format!("footer i64 field at {at} set to {v}")
                }
                None => "unchanged".to_string(),
            }
        }
    };
    (b, what)
}

/// The file with the value of a random i64 field of its footer (a field
/// header byte of type 6, then a varint) replaced by `v`, the footer's
/// length updated; and where the field was.
fn rewrite_i64_field(good: &[u8], fs: usize, rng: &mut Rng, v: i64) -> Option<(Vec<u8>, usize)> {
    let end = good.len() - 8;
    let varint_end = |at: usize| {
        let mut j = at + 1;
        while j < end && good[j] & 0x80 != 0 {
            j += 1;
        }
        (j < end).then_some(j)
    };
    // Half the time the file's own num_rows: field 3 of FileMetaData (delta
    // 1, type i64: 0x16), right before the row group list (0x19).
    let num_rows = (fs..end - 1).rev().find(|&i| {
        good[i] == 0x16 && varint_end(i).is_some_and(|j| good.get(j + 1) == Some(&0x19))
    });
    let at = match num_rows {
        Some(i) if rng.below(2) == 0 => i,
        _ => {
            let fields: Vec<usize> = (fs..end - 1)
                .filter(|&i| good[i] & 0x0f == 6 && good[i] >> 4 != 0)
                .collect();
            fields[rng.below(fields.len())]
        }
    };
    let j = varint_end(at)?;
    let mut footer = good[fs..=at].to_vec();
    footer.extend(varint(v));
    footer.extend_from_slice(&good[j + 1..end]);
    let mut out = good[..fs].to_vec();
    out.extend_from_slice(&footer);
    out.extend_from_slice(&(footer.len() as u32).to_le_bytes());
    out.extend_from_slice(b"PAR1");
    Some((out, at))
}

fn check(r: &TimedRun, allowed: &[i32], what: &str) {
    assert!(!r.timed_out, "{what}: hang (killed after {TIMEOUT_SECS}s)");
    assert!(
        r.signal.is_none(),
        "{what}: killed by signal {:?}; stderr: {}",
        r.signal,
        r.stderr
    );
    assert!(
        allowed.contains(&r.code),
        "{what}: exit {}; stderr: {}",
        r.code,
        r.stderr
    );
    for bad in ["panicked", "backtrace", "internal error"] {
        assert!(!r.stderr.contains(bad), "{what}: {bad}: {}", r.stderr);
    }
    if r.code == 2 {
        assert!(r.stderr.starts_with("opdump: "), "{what}: {}", r.stderr);
        assert_eq!(
            r.stderr.trim_end().lines().count(),
            1,
            "{what}: not one line: {}",
            r.stderr
        );
    }
}

fn write(path: &Path, bytes: &[u8]) {
    std::fs::write(path, bytes).unwrap();
}

#[test]
fn seeded_mutants_of_a_real_dump() {
    let t = tmp();
    let good = t.path().join("good");
    small_dump(&good);
    let file = only_file(&good);
    let bytes = std::fs::read(&file).unwrap();
    let m = t.path().join("mutant");
    let dir = m.join("rank=0").join("device=cpu");
    std::fs::create_dir_all(&dir).unwrap();
    let target = dir.join(file.file_name().unwrap());
    let (g, mp) = (path_str(&good), path_str(&m));

    let start = std::time::Instant::now();
    let mutants = env_or("MUTATION_MUTANTS", MUTANTS);
    let mut rng = Rng(env_or("MUTATION_SEED", SEED).max(1));
    let mut codes = [0usize; 3];
    for k in 0..mutants {
        let (mutant, what) = mutate(&mut rng, &bytes);
        write(&target, &mutant);
        let what = format!("mutant {k} ({what})");
        let r = run_timeout(&["summary", mp], TIMEOUT_SECS);
        check(&r, &[0, 2], &format!("summary of {what}"));
        codes[r.code as usize] += 1;
        let r = run_timeout(&["compare", g, mp], TIMEOUT_SECS);
        check(&r, &[0, 1, 2, 3], &format!("compare with {what}"));
    }
    // The mutants must reach the decoder, not only the footer check.
    assert!(codes[0] > 0, "no mutant was readable: {codes:?}");
    assert!(
        codes[2] > mutants / 4,
        "too few mutants rejected: {codes:?}"
    );
    eprintln!(
        "{mutants} mutants in {:.1}s: summary exit 0 x{}, exit 2 x{}",
        start.elapsed().as_secs_f64(),
        codes[0],
        codes[2]
    );
}
