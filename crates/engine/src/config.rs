//! Every `OPDUMP_*` variable, parsed in one place.
//!
//! A bad value is one clear line naming the variable, the value and what is
//! accepted; dumping then stays off rather than guessing, and the job runs on.
//! An unknown `OPDUMP_*` name gets a warning with the nearest valid one.

use std::path::PathBuf;
use std::time::Duration;

use regex::Regex;

pub use opdump_format::ranges::IntSet;
use opdump_format::selector::{self, Selector};

/// Every variable opdump reads: name, default, meaning. The table of
/// docs/reference/environment.md and the unknown-name check both come from here.
pub const VARIABLES: &[(&str, &str, &str)] = &[
    ("OPDUMP", "0", "1 switches dumping on at load; 0 leaves it off until torch.ops.opdump.enable()"),
    ("OPDUMP_DIR", "./opdump", "where the dump goes (rank=<R>/device=<D>/part-*.parquet)"),
    ("OPDUMP_INCLUDE", "(all)", "regex searched in `op.overload`; only matching ops are recorded"),
    ("OPDUMP_EXCLUDE", "(none)", "regex searched in `op.overload`; matching ops are not recorded"),
    ("OPDUMP_STEPS", "(all)", "steps to record: a list of numbers and inclusive ranges, e.g. 0-2,10 (0..2 is the same as 0-2)"),
    ("OPDUMP_RANKS", "(all)", "ranks that record: a list of numbers and ranges, e.g. 0,3"),
    ("OPDUMP_MAX_DEPTH", "(none)", "deepest nesting level recorded; 0 records top-level ops only"),
    ("OPDUMP_INPUTS", "1", "0 records outputs only"),
    ("OPDUMP_REUSE", "1", "reuse the statistics of a tensor measured before and unchanged since (version counter), and copy them through views of the same elements (broadcasts scaled); 0 measures every tensor (for data written outside the dispatcher, e.g. through NumPy, or by a kernel writing an argument its schema marks read-only)"),
    ("OPDUMP_MAX_RECORDS", "0", "stop recording after this many op calls per process; 0 is no limit"),
    ("OPDUMP_ROTATE_ROWS", "500000", "start a new file after this many rows"),
    ("OPDUMP_ROTATE_SECS", "10", "start a new file after this many seconds; bounds what a crash loses"),
    ("OPDUMP_QUEUE", "16384", "capacity of the record channel to the writer thread, in op calls"),
    ("OPDUMP_QUEUE_FULL", "block", "when the channel, or the pool of device statistics waiting to come back, is full: block (wait, nothing lost) or drop (count and go on)"),
    ("OPDUMP_QUEUE_WAIT_MS", "10000", "with block: the longest wait before a record (or a device measurement) is dropped, so a hung disk or device never hangs the job"),
    ("OPDUMP_MODULES", "1", "in a Python process, name the nn.Module running each call (module column), the parameters and buffers (name column), and the forward call behind each backward call (fwd_seq), through global module hooks installed while dumping; 0 installs none"),
    ("OPDUMP_SOURCE", "0", "1 gives top-level calls outside backward a source column: the innermost line of user code, file.py:123 in forward (costs a Python frame walk per call)"),
    ("OPDUMP_CAPTURE", "(none)", "op calls whose full input and output tensors are saved (safetensors, beside the Parquet files): aten::gelu#0 (the first recorded call of that op), aten::gelu@step=1#2 (the third in step 1), module=blocks.0.mlp#0 (every call inside that module's first forward), several separated by ;"),
    ("OPDUMP_SKETCH", "0", "length K of each tensor's sketch, a power of two from 2 to 32 (16 is the usual choice), with the fingerprint; 0 writes neither (see the README's Fingerprint and sketch)"),
    ("OPDUMP_CAPTURE_MAX_BYTES", "2147483648", "the most bytes of captured tensors a process saves; calls past it are not captured, and counted"),
    ("OPDUMP_REFERENCE", "(none)", "a dump of the same program on a trusted device, made with the same OPDUMP_* selection: this run is judged against it step by step as it runs, the first introduced divergence is printed, captured in the same run and written to <OPDUMP_DIR>/verdicts/"),
    ("OPDUMP_ON_DIVERGENCE", "report", "with OPDUMP_REFERENCE, once a divergence is introduced: report (go on dumping and judging) or stop (after its capture is written, the next op call raises an error that names the op, so the job ends with a nonzero status)"),
    ("OPDUMP_CHECK", "0", "1 checks the accuracy of every distinct op call in the job itself, with no reference dump: the first calls of each signature run again on the CPU in float64 and in their own dtype, and each output is judged against float64 relative to the CPU's own error; a regex searched in `op.overload` checks only the matching ops. Results go to <OPDUMP_DIR>/checks/ (`opdump check`)"),
    ("OPDUMP_CHECK_PER_SIGNATURE", "1", "with OPDUMP_CHECK: how many calls of each signature (op, overload, dtypes, shapes and other arguments) are checked"),
    ("OPDUMP_CHECK_RECHECK", "1", "with OPDUMP_CHECK: how many signatures already checked are checked again in each later step, in turn (each at its first call in the step), so that a kernel that goes wrong later in the run is found; 0 checks each signature in its first calls only"),
    ("OPDUMP_CHECK_MAX_BYTES", "268435456", "with OPDUMP_CHECK: the most bytes of one call's input tensors copied to the host for its check; a call over it is not checked (no_reference); copies waiting for the checking thread stay under 4 times it, and a call that finds the queue full is checked at its next call; both counted"),
    ("OPDUMP_CHECK_SECONDS", "300", "with OPDUMP_CHECK: the most seconds the checking thread spends on checks in a process; signatures met after that are counted, not checked. 0 is no limit"),
    ("OPDUMP_CHECK_WAIT", "5", "with OPDUMP_CHECK: the most seconds a call waits for room in the checking thread's queue (4 times OPDUMP_CHECK_MAX_BYTES) before it goes unchecked, to be checked at its next call; the waits are counted and said at exit. 0 never waits"),
    ("OPDUMP_DEVICE_HOLD", "1", "0 reads every device tensor when it is measured, one launch each, instead of holding it until its batch closes or an op is about to write its memory: for jobs whose own kernels write tensors outside the dispatcher (Inductor's fused kernels, Triton, extensions that take raw pointers)"),
    ("OPDUMP_DEVICE_SYNC", "0", "1 measures device tensors synchronously: the job's thread waits for the device at every measured tensor, as a reference for the asynchronous path (same values, much slower)"),
    ("OPDUMP_FORK", "off", "a forked child (DataLoader worker, os.fork): off records nothing; record writes its own files part-<childpid>-*"),
    ("OPDUMP_FILE_MODE", "600", "permission bits (octal) of dump files; directories get the matching execute bits"),
    ("OPDUMP_PYTHON", "python3", "build time only: the Python interpreter whose torch build.rs builds against"),
    ("OPDUMP_HOOK_ONLY", "0", "benchmark only: 1 puts the hook on every op as when dumping, but each call only goes on to its kernel: nothing is measured or written (scripts/bench's empty-hook cost)"),
    ("OPDUMP_TIMINGS", "0", "opdump compare only: 1 prints the time of each phase (read, align, judge) on stderr"),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum QueueFull {
    Block,
    Drop,
}

/// What a run judged against a reference does once a divergence is
/// introduced (OPDUMP_ON_DIVERGENCE).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum OnDivergence {
    Report,
    Stop,
}

#[derive(Clone, Debug)]
pub struct Config {
    pub on_at_load: bool,
    pub dir: PathBuf,
    pub include: Option<Regex>,
    pub exclude: Option<Regex>,
    pub steps: Option<IntSet>,
    pub ranks: Option<IntSet>,
    pub max_depth: Option<i32>,
    pub inputs: bool,
    pub reuse: bool,
    /// The hook only: every call goes on to its kernel, nothing is recorded.
    pub hook_only: bool,
    pub max_records: u64,
    pub rotate_rows: u64,
    pub rotate_every: Duration,
    pub queue: usize,
    pub queue_full: QueueFull,
    pub queue_wait: Duration,
    /// Device tensors are measured with a wait on the job's thread.
    pub device_sync: bool,
    /// Device tensors are held until their batch closes, read many per launch.
    pub device_hold: bool,
    /// Python module hooks while dumping (module, name, fwd_seq).
    pub modules: bool,
    /// The source line of top-level calls outside backward.
    pub source: bool,
    /// The calls whose tensors are saved (OPDUMP_CAPTURE).
    pub capture: Vec<Selector>,
    pub capture_max_bytes: u64,
    /// The sketch's length; 0: neither sketch nor fingerprint.
    pub sketch: u32,
    /// A forked child records into its own files.
    pub fork_record: bool,
    pub file_mode: u32,
    /// The dump this run is judged against as it runs (OPDUMP_REFERENCE).
    pub reference: Option<PathBuf>,
    pub on_divergence: OnDivergence,
    /// The ops whose calls are checked against a float64 CPU reference
    /// (OPDUMP_CHECK); `None`: no check.
    pub check: Option<Regex>,
    pub check_per_signature: u32,
    /// Signatures checked again per step (OPDUMP_CHECK_RECHECK).
    pub check_recheck: u32,
    pub check_max_bytes: u64,
    /// Zero: no limit.
    pub check_budget: Duration,
    /// How long a call waits for room in the checking thread's queue
    /// (OPDUMP_CHECK_WAIT); zero: never.
    pub check_wait: Duration,
}

impl Config {
    /// Directories get an execute bit wherever files get read or write.
    pub fn dir_mode(&self) -> u32 {
        let mut m = self.file_mode;
        for shift in [6, 3, 0] {
            if (self.file_mode >> shift) & 0o6 != 0 {
                m |= 0o1 << shift;
            }
        }
        m
    }
}

impl Default for Config {
    /// The defaults [`VARIABLES`] states (a test holds them equal); rotation
    /// takes the writer's own.
    fn default() -> Self {
        let rotate = opdump_format::RotateOptions::default();
        Config {
            on_at_load: false,
            dir: PathBuf::from("./opdump"),
            include: None,
            exclude: None,
            steps: None,
            ranks: None,
            max_depth: None,
            inputs: true,
            reuse: true,
            hook_only: false,
            max_records: 0,
            rotate_rows: rotate.max_rows,
            rotate_every: rotate.max_age,
            queue: 16384,
            queue_full: QueueFull::Block,
            queue_wait: Duration::from_millis(10_000),
            device_sync: false,
            device_hold: true,
            modules: true,
            source: false,
            capture: Vec::new(),
            capture_max_bytes: 2 << 30,
            sketch: 0,
            fork_record: false,
            file_mode: 0o600,
            reference: None,
            on_divergence: OnDivergence::Report,
            check: None,
            check_per_signature: 1,
            check_recheck: 1,
            check_max_bytes: 256 << 20,
            check_budget: Duration::from_secs(300),
            check_wait: CHECK_WAIT,
        }
    }
}

/// The outcome of reading the environment: a config, and the lines to print.
pub struct Parsed {
    pub config: Config,
    /// Bad values: dumping must stay off.
    pub errors: Vec<String>,
    /// Unknown names: printed, nothing else changes.
    pub warnings: Vec<String>,
}

fn parse_bool(v: &str) -> Option<bool> {
    match v.trim().to_ascii_lowercase().as_str() {
        "1" | "true" | "on" | "yes" => Some(true),
        "0" | "false" | "off" | "no" | "" => Some(false),
        _ => None,
    }
}

fn parse_count(v: &str) -> Option<u64> {
    v.trim().replace('_', "").parse::<u64>().ok()
}

/// A count in `range`.
fn count_in(v: &str, range: std::ops::RangeInclusive<u64>) -> Option<u64> {
    parse_count(v).filter(|n| range.contains(n))
}

/// A finite number of seconds, 0 or more.
fn parse_seconds(v: &str) -> Option<f64> {
    v.trim()
        .parse::<f64>()
        .ok()
        .filter(|s| *s >= 0.0 && s.is_finite())
}

/// A number of seconds from 0 (or above 0, when `zero` is not allowed) to
/// `max`, as a Duration (which panics past u64::MAX seconds: the bound is
/// checked first).
fn seconds_in(v: &str, zero: bool, max: f64) -> Option<Duration> {
    parse_seconds(v)
        .filter(|s| (zero || *s > 0.0) && *s <= max)
        .map(Duration::from_secs_f64)
}

// The upper bounds of the numeric variables. Each lies far past any useful
// setting and keeps what is done with the value from overflowing or
// failing: a Duration, a deadline of now plus a wait (the device path's
// too, in C++ chrono), four times a byte count, a channel whose slots are
// allocated at once.
const MAX_ROTATE_ROWS: u64 = 1_000_000_000;
const MAX_ROTATE_SECS: f64 = 86_400.0;
const MAX_QUEUE: u64 = 1 << 20;
const MAX_QUEUE_WAIT_MS: u64 = 3_600_000;
/// 1 TiB: of captured tensors in one process, or of one checked call's inputs.
const MAX_BYTES: u64 = 1 << 40;
const MAX_CHECK_PER_SIGNATURE: u64 = 1_000_000;
const MAX_CHECK_SECONDS: f64 = 604_800.0;
const MAX_CHECK_WAIT: f64 = 3_600.0;

/// OPDUMP_CHECK_WAIT's default. The checking thread frees room as it
/// finishes a check, and one check of a call within the default
/// OPDUMP_CHECK_MAX_BYTES (two CPU runs, one in float64) takes from
/// milliseconds to about a second: 5 s lets a burst of large calls (a
/// forward pass) wait for the checks ahead of it rather than go unchecked.
/// The job only waits while the checking thread works, which stops at
/// OPDUMP_CHECK_SECONDS, so the total wait is bounded by that budget; a
/// checking thread that cannot move (it needs the GIL the waiting thread
/// holds, for a custom op) costs one wait of 5 s, after which no call
/// waits until a check finishes (`check::Checks::wanted`).
const CHECK_WAIT: Duration = Duration::from_secs(5);

/// Reads the configuration from `vars` (the process environment in
/// production, a list in tests).
pub fn parse<I: IntoIterator<Item = (String, String)>>(vars: I) -> Parsed {
    let mut parsed = Parsed {
        config: Config::default(),
        errors: Vec::new(),
        warnings: Vec::new(),
    };
    for (name, value) in vars {
        if name.starts_with("OPDUMP") {
            parsed.read(&name, &value);
        }
    }
    parsed
}

/// What one group of variables made of a variable: `None` when the name is
/// not one of the group's, else `Ok` or the accepted forms of a bad value.
type Outcome = Option<Result<(), String>>;

/// Each group of variables, one concern each; a name belongs to one group.
const GROUPS: &[fn(&mut Config, &str, &str) -> Outcome] = &[
    set_switch,
    set_filter,
    set_capture,
    set_output,
    set_queue,
    set_online,
    set_check,
    read_elsewhere,
];

impl Parsed {
    /// Applies the variable `name` to the config, or notes why not.
    fn read(&mut self, name: &str, value: &str) {
        let config = &mut self.config;
        match GROUPS.iter().find_map(|set| set(config, name, value)) {
            Some(Ok(())) => {}
            Some(Err(accepted)) => self
                .errors
                .push(format!("{name}={value:?} is not valid: {accepted}")),
            None => self.warnings.push(unknown_name(name)),
        }
    }
}

/// `Ok` once `set` took the value, else the accepted forms.
fn take<T>(
    value: Option<T>,
    set: impl FnOnce(T),
    accepted: impl Into<String>,
) -> Result<(), String> {
    match value {
        Some(v) => {
            set(v);
            Ok(())
        }
        None => Err(accepted.into()),
    }
}

/// The variables that are 1 or 0.
fn set_switch(c: &mut Config, name: &str, v: &str) -> Outcome {
    let field = match name {
        "OPDUMP" => &mut c.on_at_load,
        "OPDUMP_INPUTS" => &mut c.inputs,
        "OPDUMP_REUSE" => &mut c.reuse,
        "OPDUMP_HOOK_ONLY" => &mut c.hook_only,
        "OPDUMP_MODULES" => &mut c.modules,
        "OPDUMP_SOURCE" => &mut c.source,
        "OPDUMP_DEVICE_SYNC" => &mut c.device_sync,
        "OPDUMP_DEVICE_HOLD" => &mut c.device_hold,
        _ => return None,
    };
    let accepted = match name {
        "OPDUMP" => "use 1 to switch dumping on, 0 to leave it off",
        _ => "use 1 or 0",
    };
    Some(take(parse_bool(v), |b| *field = b, accepted))
}

/// Which op calls are recorded: ops, steps, ranks, depth, the record cap.
fn set_filter(c: &mut Config, name: &str, v: &str) -> Outcome {
    Some(match name {
        "OPDUMP_INCLUDE" => Regex::new(v)
            .map(|re| c.include = Some(re))
            .map_err(regex_problem),
        "OPDUMP_EXCLUDE" => Regex::new(v)
            .map(|re| c.exclude = Some(re))
            .map_err(regex_problem),
        "OPDUMP_STEPS" => IntSet::parse(v)
            .map(|s| c.steps = Some(s))
            .map_err(range_problem),
        "OPDUMP_RANKS" => IntSet::parse(v)
            .map(|s| c.ranks = Some(s))
            .map_err(range_problem),
        "OPDUMP_MAX_DEPTH" => take(
            v.trim().parse::<i32>().ok().filter(|d| *d >= 0),
            |d| c.max_depth = Some(d),
            "a depth of 0 or more is expected",
        ),
        "OPDUMP_MAX_RECORDS" => take(
            parse_count(v),
            |n| c.max_records = n,
            "a count of 0 (no limit) or more is expected",
        ),
        _ => return None,
    })
}

/// The last line of a regex error (the earlier ones repeat the pattern).
fn regex_problem(e: regex::Error) -> String {
    let first = e
        .to_string()
        .lines()
        .last()
        .unwrap_or("")
        .trim()
        .to_string();
    format!("a regular expression is expected ({first})")
}

fn range_problem(why: String) -> String {
    format!("{why}; use numbers and ranges such as 0-2,10 or 0..2")
}

/// Which calls' full tensors are saved, and how many bytes at most.
fn set_capture(c: &mut Config, name: &str, v: &str) -> Outcome {
    Some(match name {
        "OPDUMP_CAPTURE" => selector::parse_list(v).map(|list| c.capture = list).map_err(|why| {
            format!("{why}; selectors are aten::gelu#0, aten::gelu@step=1#2 or module=blocks.0.mlp#0, separated by ;")
        }),
        "OPDUMP_CAPTURE_MAX_BYTES" => take(
            count_in(v, 0..=MAX_BYTES),
            |n| c.capture_max_bytes = n,
            "a number of bytes from 0 to 1099511627776 (1 TiB) is expected, e.g. 1073741824",
        ),
        _ => return None,
    })
}

/// What is written and where: the directory, file rotation and mode, a
/// forked child's files, the sketch length.
fn set_output(c: &mut Config, name: &str, v: &str) -> Outcome {
    Some(match name {
        "OPDUMP_DIR" => take(
            (!v.trim().is_empty()).then(|| PathBuf::from(v)),
            |d| c.dir = d,
            "give a directory path",
        ),
        "OPDUMP_ROTATE_ROWS" => take(
            count_in(v, 1..=MAX_ROTATE_ROWS),
            |n| c.rotate_rows = n,
            "a row count above 0 and at most 1000000000 is expected, e.g. 500000",
        ),
        "OPDUMP_ROTATE_SECS" => take(
            seconds_in(v, false, MAX_ROTATE_SECS),
            |d| c.rotate_every = d,
            "a number of seconds above 0 and at most 86400 (a day) is expected, e.g. 10",
        ),
        "OPDUMP_FILE_MODE" => take(
            u32::from_str_radix(v.trim().trim_start_matches("0o"), 8)
                .ok()
                .filter(|m| *m <= 0o777 && m & 0o600 == 0o600),
            |m| c.file_mode = m,
            "octal permission bits that let the owner read and write, e.g. 600 or 640",
        ),
        "OPDUMP_FORK" => take(
            match v.trim() {
                "off" | "0" => Some(false),
                "record" | "1" => Some(true),
                _ => None,
            },
            |record| c.fork_record = record,
            "use off (a forked child records nothing) or record (its own files)",
        ),
        "OPDUMP_SKETCH" => take(
            v.trim()
                .parse::<u32>()
                .ok()
                .filter(|k| *k == 0 || (k.is_power_of_two() && (2..=32).contains(k))),
            |k| c.sketch = k,
            "use a power of two from 2 to 32 (16 is the usual choice), or 0 for no fingerprint and sketch",
        ),
        _ => return None,
    })
}

/// Judging this run against a reference dump while it runs.
fn set_online(c: &mut Config, name: &str, v: &str) -> Outcome {
    Some(match name {
        "OPDUMP_REFERENCE" => take(
            (!v.trim().is_empty()).then(|| PathBuf::from(v)),
            |d| c.reference = Some(d),
            "give the directory of a dump made on a trusted device (OPDUMP_DIR of that run)",
        ),
        "OPDUMP_ON_DIVERGENCE" => take(
            match v.trim() {
                "report" => Some(OnDivergence::Report),
                "stop" => Some(OnDivergence::Stop),
                _ => None,
            },
            |o| c.on_divergence = o,
            "use report (go on dumping and judging) or stop (end the job at the first introduced divergence)",
        ),
        _ => return None,
    })
}

/// The accuracy check against a float64 CPU reference.
fn set_check(c: &mut Config, name: &str, v: &str) -> Outcome {
    Some(match name {
        "OPDUMP_CHECK" => match parse_bool(v) {
            Some(on) => {
                c.check = on.then(|| Regex::new("").expect("the empty regex"));
                Ok(())
            }
            None => Regex::new(v)
                .map(|re| c.check = Some(re))
                .map_err(|e| format!("use 1 (check every op), 0, or {}", regex_problem(e))),
        },
        "OPDUMP_CHECK_PER_SIGNATURE" => take(
            count_in(v, 1..=MAX_CHECK_PER_SIGNATURE).and_then(|n| u32::try_from(n).ok()),
            |n| c.check_per_signature = n,
            "a count of calls above 0 and at most 1000000 is expected, e.g. 1",
        ),
        "OPDUMP_CHECK_RECHECK" => take(
            count_in(v, 0..=MAX_CHECK_PER_SIGNATURE).and_then(|n| u32::try_from(n).ok()),
            |n| c.check_recheck = n,
            "a count of signatures per step from 0 (none) to 1000000 is expected, e.g. 1",
        ),
        "OPDUMP_CHECK_MAX_BYTES" => take(
            count_in(v, 1..=MAX_BYTES),
            |n| c.check_max_bytes = n,
            "a number of bytes above 0 and at most 1099511627776 (1 TiB) is expected, e.g. 268435456",
        ),
        "OPDUMP_CHECK_SECONDS" => take(
            seconds_in(v, true, MAX_CHECK_SECONDS),
            |d| c.check_budget = d,
            "a number of seconds from 0 (no limit) to 604800 (a week) is expected, e.g. 300",
        ),
        "OPDUMP_CHECK_WAIT" => take(
            seconds_in(v, true, MAX_CHECK_WAIT),
            |d| c.check_wait = d,
            "a number of seconds from 0 (never wait) to 3600 (an hour) is expected, e.g. 5",
        ),
        _ => return None,
    })
}

/// The record channel to the writer thread.
fn set_queue(c: &mut Config, name: &str, v: &str) -> Outcome {
    Some(match name {
        "OPDUMP_QUEUE" => take(
            count_in(v, 1..=MAX_QUEUE),
            |n| c.queue = n as usize,
            "a capacity above 0 and at most 1048576 op calls is expected, e.g. 16384",
        ),
        "OPDUMP_QUEUE_FULL" => take(
            match v.trim() {
                "block" => Some(QueueFull::Block),
                "drop" => Some(QueueFull::Drop),
                _ => None,
            },
            |q| c.queue_full = q,
            "use block or drop",
        ),
        "OPDUMP_QUEUE_WAIT_MS" => take(
            count_in(v, 0..=MAX_QUEUE_WAIT_MS),
            |n| c.queue_wait = Duration::from_millis(n),
            "a number of milliseconds from 0 to 3600000 (an hour) is expected, e.g. 10000",
        ),
        _ => return None,
    })
}

/// Variables of opdump that the plugin does not read: build.rs and the CLI do.
fn read_elsewhere(_: &mut Config, name: &str, _: &str) -> Outcome {
    matches!(name, "OPDUMP_PYTHON" | "OPDUMP_TIMINGS").then_some(Ok(()))
}

/// The warning for an `OPDUMP*` name opdump does not know, with the nearest
/// known one.
fn unknown_name(name: &str) -> String {
    let nearest = VARIABLES
        .iter()
        .map(|(n, _, _)| (strsim::levenshtein(n, name), *n))
        .min()
        .map(|(_, n)| n)
        .unwrap_or("OPDUMP");
    format!("{name} is not an opdump variable and is ignored; did you mean {nearest}?")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn p(vars: &[(&str, &str)]) -> Parsed {
        parse(vars.iter().map(|(a, b)| (a.to_string(), b.to_string())))
    }

    #[test]
    fn defaults_and_values() {
        let r = p(&[
            ("OPDUMP", "1"),
            ("OPDUMP_STEPS", "0-2,10"),
            ("OPDUMP_QUEUE_FULL", "drop"),
        ]);
        assert!(r.errors.is_empty(), "{:?}", r.errors);
        assert!(r.config.on_at_load);
        let s = r.config.steps.unwrap();
        assert!(s.contains(0) && s.contains(2) && s.contains(10) && !s.contains(3));
        assert_eq!(r.config.queue_full, QueueFull::Drop);
    }

    #[test]
    fn bad_values_name_the_variable() {
        for (name, value) in [
            ("OPDUMP", "yes please"),
            ("OPDUMP_INCLUDE", "add("),
            ("OPDUMP_STEPS", "1-"),
            ("OPDUMP_ROTATE_ROWS", "-5"),
            ("OPDUMP_QUEUE_FULL", "sometimes"),
        ] {
            let r = p(&[(name, value)]);
            assert_eq!(r.errors.len(), 1, "{name}={value}");
            assert!(
                r.errors[0].starts_with(&format!("{name}=")),
                "{}",
                r.errors[0]
            );
        }
    }

    /// Every variable the plugin reads refuses a bad value with one error
    /// that names it and says what is accepted, and takes a good one.
    #[test]
    fn every_variable_refuses_a_bad_value_and_takes_a_good_one() {
        let cases = [
            ("OPDUMP", "maybe", "1", "use 1 to switch dumping on"),
            ("OPDUMP_DIR", " ", "/tmp/d", "give a directory path"),
            (
                "OPDUMP_INCLUDE",
                "(",
                "mm",
                "a regular expression is expected",
            ),
            (
                "OPDUMP_EXCLUDE",
                "[",
                "mm",
                "a regular expression is expected",
            ),
            ("OPDUMP_STEPS", "x", "1-2", "use numbers and ranges"),
            ("OPDUMP_RANKS", "-", "0,3", "use numbers and ranges"),
            ("OPDUMP_MAX_DEPTH", "-1", "0", "a depth of 0 or more"),
            ("OPDUMP_INPUTS", "2", "0", "use 1 or 0"),
            ("OPDUMP_REUSE", "2", "0", "use 1 or 0"),
            ("OPDUMP_HOOK_ONLY", "2", "1", "use 1 or 0"),
            ("OPDUMP_MAX_RECORDS", "-1", "5", "a count of 0 (no limit)"),
            ("OPDUMP_ROTATE_ROWS", "0", "10", "a row count above 0"),
            (
                "OPDUMP_ROTATE_SECS",
                "inf",
                "0.5",
                "a number of seconds above 0",
            ),
            ("OPDUMP_QUEUE", "0", "8", "a capacity above 0"),
            ("OPDUMP_QUEUE_FULL", "x", "drop", "use block or drop"),
            (
                "OPDUMP_QUEUE_WAIT_MS",
                "soon",
                "5",
                "a number of milliseconds",
            ),
            ("OPDUMP_MODULES", "2", "0", "use 1 or 0"),
            ("OPDUMP_SOURCE", "2", "1", "use 1 or 0"),
            (
                "OPDUMP_CAPTURE",
                "aten::gelu#",
                "aten::gelu#0",
                "selectors are",
            ),
            (
                "OPDUMP_SKETCH",
                "3",
                "16",
                "use a power of two from 2 to 32",
            ),
            (
                "OPDUMP_CAPTURE_MAX_BYTES",
                "lots",
                "1024",
                "a number of bytes",
            ),
            ("OPDUMP_DEVICE_SYNC", "2", "1", "use 1 or 0"),
            ("OPDUMP_DEVICE_HOLD", "sometimes", "0", "use 1 or 0"),
            ("OPDUMP_FORK", "sometimes", "record", "use off"),
            (
                "OPDUMP_REFERENCE",
                " ",
                "/tmp/ref",
                "give the directory of a dump",
            ),
            ("OPDUMP_ON_DIVERGENCE", "halt", "stop", "use report"),
            (
                "OPDUMP_CHECK",
                "(",
                "mm",
                "a regular expression is expected",
            ),
            (
                "OPDUMP_CHECK_PER_SIGNATURE",
                "-1",
                "3",
                "a count of calls above 0",
            ),
            (
                "OPDUMP_CHECK_MAX_BYTES",
                "0",
                "1024",
                "a number of bytes above 0",
            ),
            ("OPDUMP_CHECK_SECONDS", "soon", "5", "a number of seconds"),
            ("OPDUMP_CHECK_WAIT", "a while", "0", "a number of seconds"),
            (
                "OPDUMP_CHECK_RECHECK",
                "-1",
                "0",
                "a count of signatures per step",
            ),
            ("OPDUMP_FILE_MODE", "200", "640", "octal permission bits"),
        ];
        for (name, bad, good, accepted) in cases {
            let r = p(&[(name, bad)]);
            assert_eq!(r.errors.len(), 1, "{name}={bad:?}: {:?}", r.errors);
            let prefix = format!("{name}={bad:?} is not valid: ");
            assert!(r.errors[0].starts_with(&prefix), "{}", r.errors[0]);
            assert!(r.errors[0].contains(accepted), "{}", r.errors[0]);
            assert!(r.warnings.is_empty(), "{:?}", r.warnings);
            let r = p(&[(name, good)]);
            assert!(
                r.errors.is_empty() && r.warnings.is_empty(),
                "{name}={good:?}"
            );
            assert_ne!(
                format!("{:?}", r.config),
                format!("{:?}", Config::default()),
                "{name}={good:?} changed nothing"
            );
        }
        // Read by build.rs and the CLI: neither an error nor a warning.
        for name in ["OPDUMP_PYTHON", "OPDUMP_TIMINGS"] {
            let r = p(&[(name, "anything")]);
            assert!(r.errors.is_empty() && r.warnings.is_empty(), "{name}");
        }
    }

    /// Every seconds, size or count variable has a range: a value past it
    /// (1e20 seconds made `Duration::from_secs_f64` panic) is one error
    /// that names the variable and the range, and the bounds are taken.
    #[test]
    fn numeric_variables_refuse_values_outside_their_range() {
        let cases = [
            (
                "OPDUMP_CHECK_SECONDS",
                &["1e20", "604800.5", "-1", "nan"][..],
                &["0", "604800"][..],
            ),
            (
                "OPDUMP_CHECK_WAIT",
                &["1e20", "3600.5", "-1", "nan", "inf"],
                &["0", "0.25", "3600"],
            ),
            (
                "OPDUMP_ROTATE_SECS",
                &["1e20", "86401", "0", "1e400"],
                &["0.001", "86400"],
            ),
            (
                "OPDUMP_QUEUE_WAIT_MS",
                &["18446744073709551615", "3600001"],
                &["0", "3600000"],
            ),
            (
                "OPDUMP_QUEUE",
                &["0", "1048577", "99999999999999999999"],
                &["1", "1048576"],
            ),
            (
                "OPDUMP_ROTATE_ROWS",
                &["0", "1000000001"],
                &["1", "1000000000"],
            ),
            (
                "OPDUMP_CHECK_MAX_BYTES",
                &["0", "1099511627777"],
                &["1", "1099511627776"],
            ),
            (
                "OPDUMP_CAPTURE_MAX_BYTES",
                &["1099511627777", "-1"],
                &["0", "1099511627776"],
            ),
            (
                "OPDUMP_CHECK_PER_SIGNATURE",
                &["0", "1000001", "4294967296"],
                &["1", "1000000"],
            ),
            (
                "OPDUMP_CHECK_RECHECK",
                &["1000001", "4294967296", "one"],
                &["0", "1000000"],
            ),
        ];
        for (name, bad, good) in cases {
            for v in bad {
                let r = std::panic::catch_unwind(|| p(&[(name, v)]))
                    .unwrap_or_else(|_| panic!("{name}={v} panicked"));
                assert_eq!(r.errors.len(), 1, "{name}={v}: {:?}", r.errors);
                let e = &r.errors[0];
                assert!(
                    e.starts_with(&format!("{name}={v:?} is not valid: ")),
                    "{e}"
                );
                assert!(
                    e.contains("at most") || e.contains(" to "),
                    "no range in: {e}"
                );
            }
            for v in good {
                let r = p(&[(name, v)]);
                assert!(r.errors.is_empty(), "{name}={v}: {:?}", r.errors);
            }
        }
        let r = p(&[("OPDUMP_CHECK_SECONDS", "604800")]);
        assert_eq!(r.config.check_budget, Duration::from_secs(604_800));
        let r = p(&[("OPDUMP_CHECK_WAIT", "0.25")]);
        assert_eq!(r.config.check_wait, Duration::from_millis(250));
        let r = p(&[("OPDUMP_QUEUE_WAIT_MS", "3600000")]);
        assert_eq!(r.config.queue_wait, Duration::from_secs(3600));
    }

    #[test]
    fn file_mode_gives_directories_execute_bits() {
        let r = p(&[("OPDUMP_FILE_MODE", "640")]);
        assert_eq!(r.config.file_mode, 0o640);
        assert_eq!(r.config.dir_mode(), 0o750);
        assert_eq!(p(&[]).config.dir_mode(), 0o700);
        assert_eq!(p(&[("OPDUMP_FILE_MODE", "400")]).errors.len(), 1);
    }

    #[test]
    fn variables_table_states_the_defaults() {
        let defaults = format!("{:?}", Config::default());
        for (name, default, _) in VARIABLES {
            if default.starts_with('(') {
                continue; // "(all)", "(none)": the variable is unset
            }
            let r = p(&[(name, default)]);
            assert!(r.errors.is_empty(), "{name}={default}: {:?}", r.errors);
            assert_eq!(
                format!("{:?}", r.config),
                defaults,
                "{name}'s stated default {default:?} is not the default"
            );
        }
    }

    #[test]
    fn unknown_name_suggests_the_nearest() {
        // The misspelt name is assembled so that searches for the variables
        // opdump reads do not find it.
        let typo = ["OPDUMP", "DIRR"].join("_");
        let r = p(&[(typo.as_str(), "/tmp/x")]);
        assert!(r.errors.is_empty());
        assert!(
            r.warnings[0].contains("did you mean OPDUMP_DIR?"),
            "{}",
            r.warnings[0]
        );
    }
}

/// docs/reference/environment.md documents exactly the variables of
/// [`VARIABLES`], with their defaults and meanings, and the code reads no
/// `OPDUMP_*` name the table does not list.
#[cfg(test)]
mod readme {
    use super::VARIABLES;
    use std::path::{Path, PathBuf};

    fn root() -> PathBuf {
        Path::new(env!("CARGO_MANIFEST_DIR")).join("../..")
    }

    #[test]
    fn readme_table_matches_the_variables() {
        let readme = std::fs::read_to_string(root().join("docs/reference/environment.md")).unwrap();
        let rows: Vec<&str> = readme
            .lines()
            .filter(|l| l.starts_with("| `OPDUMP"))
            .collect();
        for (name, default, meaning) in VARIABLES {
            let row = format!("| `{name}` | `{default}` | {meaning} |");
            assert!(
                rows.contains(&row.as_str()),
                "README's row for {name} differs from config.rs; expected\n{row}"
            );
        }
        assert_eq!(
            rows.len(),
            VARIABLES.len(),
            "README lists variables config.rs does not: {rows:#?}"
        );
    }

    /// The text of every source file under `dir` with one of `exts`, cut at
    /// its unit tests (they use made-up names).
    fn sources(dir: &Path, exts: &[&str], out: &mut String) {
        let Ok(entries) = std::fs::read_dir(dir) else {
            return;
        };
        for e in entries.flatten() {
            let p = e.path();
            if p.is_dir() {
                sources(&p, exts, out);
            } else if p
                .extension()
                .and_then(|x| x.to_str())
                .is_some_and(|x| exts.contains(&x))
            {
                let text = std::fs::read_to_string(&p).unwrap();
                out.push_str(text.split("#[cfg(test)]").next().unwrap_or(""));
            }
        }
    }

    #[test]
    fn code_reads_no_undocumented_variable() {
        let r = root();
        let mut text = std::fs::read_to_string(r.join("build.rs")).unwrap();
        for dir in [
            "src",
            "cpp",
            "crates/engine/src",
            "crates/preload/src",
            "crates/torchfind/src",
        ] {
            sources(&r.join(dir), &["rs", "cpp", "h"], &mut text);
        }
        let known: Vec<&str> = VARIABLES.iter().map(|v| v.0).collect();
        let mut rest = text.as_str();
        while let Some(i) = rest.find("\"OPDUMP_") {
            let name: String = rest[i + 1..]
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            assert!(
                known.contains(&name.as_str()),
                "{name} is read but not in VARIABLES"
            );
            rest = &rest[i + 1..];
        }
    }
}
