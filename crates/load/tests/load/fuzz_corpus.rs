//! A fuzz target for the loader that runs on stable Rust as a test: small
//! valid dumps are written, then damaged deterministically (a seeded
//! generator picks byte flips, truncations, a file copied or lost, changed
//! footer metadata), and each damaged dump is loaded. Loading must succeed
//! or return an error: never panic in opdump's own code, hang or abort.
//!
//! A decoder (parquet, arrow) that panics on a malformed file is caught by
//! the loader's panic guard and becomes an error, which is allowed; a panic
//! located in opdump's own sources is a bug even when the guard catches it,
//! so a panic hook records where each panic happened.

use std::path::{Path, PathBuf};
use std::sync::mpsc;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use opdump_judge::Silent;
use opdump_load::read::{load, scan};
use opdump_testkit::synth::{write_model, Model, Variant};

/// How many damaged dumps are loaded.
const CASES: u64 = 300;
/// The seed of the whole run: change it to explore other damage.
const SEED: u64 = 0x6f70_6475_6d70;
/// Longer than any load of these small dumps by far.
const PER_CASE: Duration = Duration::from_secs(10);

/// Where the panics of the run happened (`file:line`).
static PANICS: Mutex<Vec<String>> = Mutex::new(Vec::new());

/// splitmix64: a small, well-known generator, so a case is reproduced from
/// its seed alone.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 = self.0.wrapping_add(0x9e37_79b9_7f4a_7c15);
        let mut z = self.0;
        z = (z ^ (z >> 30)).wrapping_mul(0xbf58_476d_1ce4_e5b9);
        z = (z ^ (z >> 27)).wrapping_mul(0x94d0_49bb_1331_11eb);
        z ^ (z >> 31)
    }

    /// A number in `0..n` (`n > 0`).
    fn below(&mut self, n: u64) -> u64 {
        self.next() % n
    }
}

/// The valid dumps the damage starts from: several files of a few row
/// groups each, of two runs that differ (NaN, another dtype).
fn corpus(root: &Path) -> Vec<PathBuf> {
    let m = Model {
        steps: 2,
        layers: 2,
        tokens: 4,
        hidden: 8,
    };
    let variants = [
        (Variant::default(), false, 40),
        (
            Variant {
                nan: Some((1, 1, 2)),
                dtype: Some("bfloat16"),
                ..Default::default()
            },
            true,
            500,
        ),
    ];
    let mut dirs = Vec::new();
    for (k, (v, side_b, max_rows)) in variants.iter().enumerate() {
        let dir = root.join(format!("base{k}"));
        write_model(&dir, &m, v, *side_b, *max_rows).expect("write a base dump");
        dirs.push(dir);
    }
    dirs
}

/// The Parquet files under `dir`, sorted.
fn parquet_files(dir: &Path) -> Vec<PathBuf> {
    let mut out = Vec::new();
    let mut stack = vec![dir.to_path_buf()];
    while let Some(d) = stack.pop() {
        for e in std::fs::read_dir(&d).expect("read_dir") {
            let p = e.expect("entry").path();
            if p.is_dir() {
                stack.push(p);
            } else if p.extension().is_some_and(|x| x == "parquet") {
                out.push(p);
            }
        }
    }
    out.sort();
    out
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).expect("mkdir");
    for e in std::fs::read_dir(from).expect("read_dir") {
        let e = e.expect("entry");
        let target = to.join(e.file_name());
        if e.path().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), target).expect("copy");
        }
    }
}

/// Footer keys whose values the damage rewrites.
const META_KEYS: [&str; 4] = [
    "opdump.schema_version",
    "opdump.op_calls",
    "opdump.pid",
    "opdump.stats_accumulate",
];

/// One kind of damage to one file (or to the set of files), described for
/// the failure message.
fn damage(rng: &mut Rng, files: &[PathBuf]) -> String {
    let file = &files[rng.below(files.len() as u64) as usize];
    let mut bytes = std::fs::read(file).expect("read");
    let len = bytes.len() as u64;
    let what = match rng.below(6) {
        0 => {
            let flips = 1 + rng.below(8);
            for _ in 0..flips {
                let at = rng.below(len) as usize;
                bytes[at] ^= 1 + rng.below(255) as u8;
            }
            format!("{flips} byte flips")
        }
        1 => {
            // The footer (schema, row groups, statistics) is the last part.
            let tail = (len / 8).max(1);
            let at = (len - tail + rng.below(tail)) as usize;
            bytes[at] ^= 1 + rng.below(255) as u8;
            format!("a footer byte flip at {at}")
        }
        2 => {
            let keep = rng.below(len) as usize;
            bytes.truncate(keep);
            format!("truncated to {keep} bytes")
        }
        3 => {
            let copy = file.with_file_name("part-4242-09999.parquet");
            std::fs::write(&copy, &bytes).expect("write copy");
            return format!("{} copied", file.display());
        }
        4 => {
            std::fs::remove_file(file).expect("remove");
            return format!("{} lost", file.display());
        }
        _ => return rewrite_metadata(rng, file, bytes),
    };
    std::fs::write(file, &bytes).expect("write");
    format!("{}: {what}", file.display())
}

/// Rewrites the value of one of the footer's metadata keys in place, its
/// length kept: digits (a wrong count, a huge one), a sign, or junk. In the
/// footer's Thrift encoding a key is followed by the value's field header
/// and its length (one byte, for these short values), then the value.
fn rewrite_metadata(rng: &mut Rng, file: &Path, mut bytes: Vec<u8>) -> String {
    let key = META_KEYS[rng.below(META_KEYS.len() as u64) as usize];
    let Some(at) = bytes.windows(key.len()).rposition(|w| w == key.as_bytes()) else {
        return format!("{}: no {key}", file.display());
    };
    let start = at + key.len() + 2;
    let len = bytes.get(start - 1).map_or(0, |&l| usize::from(l & 0x7f));
    for b in bytes.iter_mut().skip(start).take(len) {
        *b = match rng.below(8) {
            0 => b'-',
            1 => rng.below(256) as u8,
            _ => b'0' + rng.below(10) as u8,
        };
    }
    std::fs::write(file, &bytes).expect("write");
    format!("{}: the value of {key} rewritten", file.display())
}

/// Scans and loads every rank of `dir`: an error anywhere is a fine end.
fn load_all(dir: &Path) -> Result<usize, String> {
    let index = scan(dir).map_err(|e| e.to_string())?;
    let mut calls = 0;
    for rank in index.ranks() {
        calls += load(&index, rank, &Silent, "fuzz")
            .map_err(|e| e.to_string())?
            .len();
    }
    Ok(calls)
}

/// Loads `dir` on its own thread: `Err` when it panicked out of the loader
/// or did not finish in time.
fn load_bounded(dir: PathBuf) -> Result<Result<usize, String>, String> {
    let (tx, rx) = mpsc::channel();
    std::thread::spawn(move || {
        let _ = tx.send(load_all(&dir));
    });
    match rx.recv_timeout(PER_CASE) {
        Ok(r) => Ok(r),
        Err(mpsc::RecvTimeoutError::Timeout) => Err(format!("no result in {PER_CASE:?}")),
        Err(mpsc::RecvTimeoutError::Disconnected) => Err("the loader panicked".to_string()),
    }
}

/// Records where each panic happened, and keeps its message for the
/// loader's panic guard as the program's own hook does; a panic outside the
/// guard (this test's own asserts) is reported as usual.
fn record_panics() {
    let default = std::panic::take_hook();
    std::panic::set_hook(Box::new(move |info| {
        let at = info
            .location()
            .map_or_else(|| "?".to_string(), |l| format!("{}:{}", l.file(), l.line()));
        let msg = info
            .payload()
            .downcast_ref::<&str>()
            .map(|s| s.to_string())
            .or_else(|| info.payload().downcast_ref::<String>().cloned())
            .unwrap_or_default();
        PANICS.lock().unwrap_or_else(|e| e.into_inner()).push(at);
        if !opdump_load::panic_guard::capture(&msg) {
            default(info);
        }
    }));
}

/// A panic located in opdump's own sources (not a decoder's, not this
/// test's).
fn own_panics() -> Vec<String> {
    let mut panics = PANICS.lock().unwrap_or_else(|e| e.into_inner());
    let own = panics
        .iter()
        .filter(|at| at.starts_with("crates/") && !at.contains("/tests/"))
        .cloned()
        .collect();
    panics.clear();
    own
}

#[test]
fn damaged_dumps_load_or_fail_cleanly() {
    record_panics();
    let root = tempfile::tempdir().expect("tempdir");
    let bases = corpus(root.path());
    for base in &bases {
        assert!(load_all(base).expect("a base dump loads") > 0);
    }
    let started = Instant::now();
    let (mut loaded, mut refused) = (0, 0);
    let mut failures = Vec::new();
    for case in 0..CASES {
        let mut rng = Rng(SEED ^ case.wrapping_mul(0x2545_f491_4f6c_dd1d));
        let base = &bases[rng.below(bases.len() as u64) as usize];
        let dir = root.path().join(format!("case{case}"));
        copy_dir(base, &dir);
        let what = damage(&mut rng, &parquet_files(&dir));
        match load_bounded(dir.clone()) {
            Ok(Ok(_)) => loaded += 1,
            Ok(Err(_)) => refused += 1,
            Err(e) => failures.push(format!("case {case} ({what}): {e}")),
        }
        for at in own_panics() {
            failures.push(format!("case {case} ({what}): a panic at {at}"));
        }
        let _ = std::fs::remove_dir_all(&dir);
    }
    assert!(failures.is_empty(), "{}", failures.join("\n"));
    // Damage that the loader cannot notice is fine, but the corpus must
    // reach both ends.
    assert!(
        loaded > 10 && refused > 10,
        "{loaded} loaded, {refused} refused"
    );
    eprintln!(
        "{CASES} damaged dumps: {loaded} loaded, {refused} refused, in {:?}",
        started.elapsed()
    );
}
