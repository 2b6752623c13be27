//! `opdump repro A B [--call SELECTOR]`: a folder that reproduces one op call
//! outside the job: both runs' capture files of the call, `call.json` (what
//! the comparison knows of it) and `repro.py` (torch only), which calls the
//! op again on A's device type, on B's, and as a float64 reference on the
//! CPU, and names the device that is off.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::Serialize;

use opdump_format::capture::{meta, CaptureFile};
use opdump_format::selector::{self, Selector};
use opdump_fsguard::{self as fsguard, DirProblem, DirRefused};

use crate::app::call_selector;
use crate::app::error::EXIT_SAME;
use crate::app::error::{CliError, Result};
use crate::app::output;
use crate::app::print::print;
use crate::app::progress::Progress;
use crate::cli::CompareOptions;
use crate::cli::ReproArgs;
use crate::commands::compare;
use opdump_judge::dump::Dump;
use opdump_judge::{Compared, OpVerdict};

/// The script, the same for every call: it reads `call.json` beside it.
pub const SCRIPT: &str = include_str!("repro.py");

/// What `repro.py` reads besides the two capture files.
#[derive(Serialize)]
pub(crate) struct CallFile {
    pub(crate) format: &'static str,
    pub(crate) op: String,
    pub(crate) overload: String,
    /// The devices the call ran on in each run (its first output's, else its
    /// first input's): `cpu`, `cuda:0`, `testdev:0`.
    pub(crate) device_a: String,
    pub(crate) device_b: String,
    pub(crate) seq_a: i64,
    pub(crate) seq_b: i64,
    pub(crate) step_a: i64,
    pub(crate) step_b: i64,
    pub(crate) selector_a: String,
    pub(crate) selector_b: String,
    pub(crate) module: Option<String>,
    pub(crate) dump_a: String,
    pub(crate) dump_b: String,
    /// The relative error rounding explains for this call (its dtype and
    /// reduction length), as `opdump compare` judged it.
    pub(crate) tolerance: f64,
    /// A device is off when its error is beyond `tolerance` and this many
    /// times the other's: the check's own factor
    /// (`opdump_judge::check::OFF_FACTOR`), so that repro.py and opdump
    /// judge alike.
    pub(crate) margin: f64,
    /// `opdump compare`'s verdict on the call.
    pub(crate) verdict: &'static str,
    /// A had no capture of the call: there is no a.safetensors, and A's side
    /// runs from B's captured inputs (an introduced call's inputs agreed).
    pub(crate) a_from_b: bool,
    /// What the in-job check (OPDUMP_CHECK) found, when the folder was made
    /// from a check's capture (`opdump repro --check`).
    #[serde(skip_serializing_if = "Option::is_none")]
    pub(crate) check: Option<serde_json::Value>,
}

/// The device of a dump's files of its rank (`rank=R/device=D`), for the
/// side of a call that was not captured.
fn device_of_dump(d: &Dump) -> Result<String> {
    let files = opdump_format::reader::list_files(&d.path)
        .map_err(|e| CliError::new(format!("{}: {e}", d.path.display())))?;
    let device = files
        .iter()
        .filter(|f| f.rank.unwrap_or(0) == d.rank)
        .find_map(|f| f.device.clone())
        .unwrap_or_else(|| "cpu".to_string());
    // Partition directories write `cuda:0` as `cuda_0`.
    let device = match device.rsplit_once('_') {
        Some((kind, index)) if index.parse::<u32>().is_ok() => format!("{kind}:{index}"),
        _ => device,
    };
    if !is_device_name(&device) {
        return Err(CliError::new(format!(
            "{}: the partition device={device} is no device name; pass the call's files from a dump opdump wrote",
            d.path.display()
        )));
    }
    Ok(device)
}

/// The call B captured for pair `k` in a later step, when neither side
/// captured `k` itself: online compare (OPDUMP_REFERENCE) names a call and
/// captures the same call (op, overload, index within its step) of a step
/// after it. Its pair, if aligned.
fn later_capture(c: &Compared, k: usize) -> Option<usize> {
    let p = c.alignment.pairs[k];
    if c.a.capture_file_of(p.a).is_some() || c.b.capture_file_of(p.b).is_some() {
        return None;
    }
    let unstepped = |s: Selector| match s {
        Selector::Op {
            op,
            overload,
            index,
            ..
        } => Some((op, overload, index)),
        Selector::Module { .. } => None,
    };
    let want = unstepped(call_selector::of_call(&c.b, p.b))?;
    (k + 1..c.alignment.pairs.len()).find(|&j| {
        let q = c.alignment.pairs[j];
        c.b.step(q.b) > c.b.step(p.b)
            && c.b.capture_file_of(q.b).is_some()
            && unstepped(call_selector::of_call(&c.b, q.b)).as_ref() == Some(&want)
    })
}

/// The options of `opdump repro`.
pub struct ReproOptions {
    pub compare: CompareOptions,
    /// An op selector in A (`aten::gelu@step=0#1`); default: the first
    /// introduced divergence.
    pub call: Option<String>,
    /// Default: `repro-<op>-<seq A>` in the current directory.
    pub out: Option<PathBuf>,
}

/// The device a captured call ran on, from its capture file: its first
/// output's, else its first input's. A device that is no device name
/// (`cuda:0`) is refused: it goes into call.json and onto the terminal.
fn device_of(file: &CaptureFile, path: &str) -> Result<String> {
    let layout: std::collections::BTreeMap<String, serde_json::Value> = file
        .metadata
        .get(meta::TENSORS)
        .and_then(|t| serde_json::from_str(t).ok())
        .unwrap_or_default();
    let device = |prefix: &str| {
        layout
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .find_map(|(_, v)| v.get("device")?.as_str().map(str::to_string))
    };
    let found = device("output.")
        .or_else(|| device("input."))
        .unwrap_or_else(|| "cpu".into());
    if !is_device_name(&found) {
        return Err(CliError::new(format!(
            "{path}: its tensors' device {:?} is not a device name; not a capture file opdump wrote: run the job again with the same OPDUMP_CAPTURE to write it anew",
            found.chars().take(80).collect::<String>()
        )));
    }
    Ok(found)
}

/// A device as torch names it: a type, and an index after `:` where it has
/// one (`cpu`, `cuda:0`, `testdev:0`).
pub(crate) fn is_device_name(s: &str) -> bool {
    let (kind, index) = s.split_once(':').unwrap_or((s, "0"));
    let mut chars = kind.chars();
    chars
        .next()
        .is_some_and(|c| c.is_ascii_alphabetic() || c == '_')
        && chars.all(|c| c.is_ascii_alphanumeric() || c == '_')
        && !index.is_empty()
        && index.bytes().all(|b| b.is_ascii_digit())
}

/// The capture file `path` of call `i` of `d`, which must be of the op and
/// overload the dump's row names: repro.py calls the op the file names, so
/// a file of another op (planted or copied in) is refused here.
fn capture_of_call(d: &Dump, i: u32, path: &str) -> Result<Arc<CaptureFile>> {
    let file = d
        .captures
        .file(path)
        .ok_or_else(|| CliError::new(format!("{path}: not a readable capture file; run the job again with the same OPDUMP_CAPTURE to write it anew")))?;
    let named = |key: &str| file.metadata.get(key).map_or("", String::as_str);
    let (op, overload) = (named(meta::OP), named(meta::OVERLOAD));
    if op != d.op_name(i) || overload != d.overload_name(i) {
        return Err(CliError::new(format!(
            "{path}: the capture holds a call of {:?} (overload {:?}), but the dump's call seq {} is {} \
             (overload {:?}); refusing a capture file that is not of its call: run the job again with the same OPDUMP_CAPTURE to write it anew",
            op.chars().take(80).collect::<String>(),
            overload.chars().take(80).collect::<String>(),
            d.seq(i),
            d.op_name(i),
            d.overload_name(i)
        )));
    }
    Ok(file)
}

/// Why a folder is not trusted with repro.py, which the user will run from
/// it: one line that names the fix.
fn refusal(e: &DirRefused) -> String {
    let why = match &e.problem {
        DirProblem::Link => "is a symbolic link, which opdump repro does not follow".to_string(),
        DirProblem::NotDirectory => "exists and is not a directory".to_string(),
        DirProblem::OwnedByOther { uid, euid } => format!(
            "is owned by another user (uid {uid}, opdump runs as uid {euid}), who could replace \
             repro.py or the files it reads"
        ),
        DirProblem::WritableByOthers { mode } => format!(
            "is writable by other users (mode {mode:04o}), who could replace repro.py or the files it reads"
        ),
        DirProblem::NotWritable => "is not writable".to_string(),
        DirProblem::CannotCreate(io) => format!("cannot be created ({io})"),
        DirProblem::CannotOpen(io) => format!("cannot be opened ({io})"),
    };
    format!(
        "{} {why}; remove it, or name another folder with --out DIR",
        e.path.display()
    )
}

/// The default folder `name` in the working directory: created new, or an
/// existing one that passes `OPDUMP_DIR`'s trust test (a directory, not a
/// link, owned by this user, writable by no one else; fsguard::enter_dir).
/// A folder `--out` names is the user's choice and is not judged.
pub(crate) fn default_folder(name: &str) -> Result<PathBuf> {
    let mut cwd = fsguard::open_parent_dir(Path::new("."))
        .map_err(|e| CliError::new(format!("the working directory cannot be opened ({e}); run opdump repro from a directory you can read, or name the folder with --out")))?;
    fsguard::enter_dir(&mut cwd, Path::new(""), name, output::DIR_MODE)
        .map_err(|e| CliError::new(refusal(&e)))?;
    Ok(PathBuf::from(name))
}

/// Writes the folder; returns it and B's device.
pub fn run(opts: ReproOptions, progress: &Progress) -> Result<(PathBuf, String)> {
    let c = compare::run(opts.compare, progress)?;
    let k = match &opts.call {
        Some(text) => {
            let s = selector::parse_one(text).map_err(|e| CliError::new(format!("--call: {e}")))?;
            let ia = call_selector::find(&c.a, &s)?;
            c.alignment
                .pairs
                .iter()
                .position(|p| p.a == ia)
                .ok_or_else(|| {
                    CliError::new(format!(
                        "{s} (seq A {}) has no aligned call in B: nothing to reproduce it against; choose a call that `opdump compare` shows in both dumps",
                        c.a.seq(ia)
                    ))
                })?
        }
        None => c.first_introduced.ok_or_else(|| {
            CliError::new(
                "no op introduced a divergence between these dumps; name the call to reproduce with --call SELECTOR",
            )
        })?,
    };
    if let Some(e) = c.alignment.element(k) {
        // One side ran a list kernel, the other a call per parameter: no
        // call of one run is the other's to run against.
        let (d, side) = if e.side == opdump_judge::Side::A {
            (&c.a, "A")
        } else {
            (&c.b, "B")
        };
        return Err(CliError::new(format!(
            "{} (seq {side} {}), {}, is judged against the other run's per-parameter call: `opdump repro` runs one call against the same call, and the runs made different ones",
            d.full_name(e.call),
            d.seq(e.call),
            e.describe()
        )));
    }
    // A run judged online (OPDUMP_REFERENCE) captured the named call in a
    // later step: reproduce that one.
    let introduced = c.op_verdict(k) == OpVerdict::Introduced;
    let k = later_capture(&c, k).unwrap_or(k);
    let p = c.alignment.pairs[k];
    let (sa, sb) = (
        call_selector::of_call(&c.a, p.a),
        call_selector::of_call(&c.b, p.b),
    );
    let missing = |side: &str, d: &Dump, i: u32, s: &selector::Selector| {
        CliError::new(format!(
            "{side} ({}) holds no capture of {} (seq {}): run its job again with OPDUMP_CAPTURE='{s}' \
             and the same other OPDUMP_* settings, then run opdump repro on the new dump",
            d.path.display(),
            d.full_name(i),
            d.seq(i)
        ))
    };
    let fb =
        c.b.capture_file_of(p.b)
            .ok_or_else(|| missing("B", &c.b, p.b, &sb))?;
    let file_b = capture_of_call(&c.b, p.b, fb)?;
    let device_b = device_of(&file_b, fb)?;
    // Without A's capture, an introduced call's inputs stand for both runs
    // (they agreed): A's side runs from B's inputs on A's device. (The call
    // of a later step that online compare captured may have inherited some
    // drift by then; run from the same inputs, the devices still compare.)
    let a_side = match c.a.capture_file_of(p.a) {
        Some(fa) => {
            let file_a = capture_of_call(&c.a, p.a, fa)?;
            let device_a = device_of(&file_a, fa)?;
            Some((file_a, device_a))
        }
        None if introduced => None,
        None => return Err(missing("A", &c.a, p.a, &sa)),
    };
    let a_from_b = a_side.is_none();
    let (file_a, device_a) = match a_side {
        Some(side) => side,
        None => (file_b.clone(), device_of_dump(&c.a)?),
    };
    let out = match opts.out {
        Some(dir) => {
            output::create_dir(&dir)?;
            dir
        }
        None => {
            let safe: String =
                c.a.full_name(p.a)
                    .chars()
                    .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
                    .collect();
            default_folder(&format!("repro-{safe}-{}", c.a.seq(p.a)))?
        }
    };
    let files: &[(&CaptureFile, &str)] = if a_from_b {
        &[(&*file_b, "b.safetensors")]
    } else {
        &[(&*file_a, "a.safetensors"), (&*file_b, "b.safetensors")]
    };
    for (file, name) in files {
        output::write_bytes_in(&out, name, file.bytes())?;
    }
    let detail = c.detail(k);
    let call = CallFile {
        format: "opdump-repro",
        op: c.a.op_name(p.a).to_string(),
        overload: c.a.overload_name(p.a).to_string(),
        device_a,
        device_b,
        seq_a: c.a.seq(p.a),
        seq_b: c.b.seq(p.b),
        step_a: c.a.step(p.a),
        step_b: c.b.step(p.b),
        selector_a: sa.to_string(),
        selector_b: sb.to_string(),
        module: c.a.module_of(p.a).map(str::to_string),
        dump_a: c.a.path.display().to_string(),
        dump_b: c.b.path.display().to_string(),
        tolerance: detail.tolerance,
        margin: opdump_judge::check::OFF_FACTOR,
        verdict: c.op_verdict(k).as_str(),
        a_from_b,
        check: None,
    };
    let json = serde_json::to_string_pretty(&call)
        .map_err(|e| CliError::new(format!("call.json: {e}")))?;
    output::write_bytes_in(&out, "call.json", json.as_bytes())?;
    output::write_bytes_in(&out, "repro.py", SCRIPT.as_bytes())?;
    Ok((out, call.device_b))
}

/// What `opdump repro` prints: the folder, and the command to run.
pub fn summary(dir: &Path, device_b: &str) -> String {
    let captures = if dir.join("a.safetensors").exists() {
        "a.safetensors, b.safetensors"
    } else {
        "b.safetensors: A captured none, so A's side runs from B's inputs"
    };
    let mut s = format!(
        "opdump repro: wrote {}/ ({captures}, call.json, repro.py)\n\
         run it, with torch and without opdump:\n  python {}/repro.py",
        dir.display(),
        dir.display()
    );
    s += &setup_hint(device_b);
    s.push('\n');
    s
}

/// After the command to run repro.py: how to register a device torch does
/// not know by itself (empty for cpu, cuda, mps and xpu).
pub(crate) fn setup_hint(device: &str) -> String {
    let kind = device.split(':').next().unwrap_or(device);
    if matches!(kind, "cpu" | "cuda" | "mps" | "xpu") {
        return String::new();
    }
    let example = if kind == "testdev" {
        ": --setup tests.testdev:load"
    } else {
        ""
    };
    format!(
        "   (add --setup MODULE[:FUNCTION], the module that registers the {kind} device{example})"
    )
}

/// `opdump repro`: writes the folder and says what is in it.
pub(crate) fn execute(a: ReproArgs) -> Result<u8> {
    let progress = Progress::auto();
    let (dir, device_b) = run(
        ReproOptions {
            compare: a.compare_options()?,
            call: a.call,
            out: a.out,
        },
        &progress,
    )?;
    progress.finish();
    print(&summary(&dir, &device_b))?;
    Ok(EXIT_SAME)
}

#[cfg(test)]
mod tests {
    use super::is_device_name;

    #[test]
    fn device_names_are_a_type_and_an_optional_index() {
        for ok in ["cpu", "cuda:0", "testdev:12", "privateuse_1"] {
            assert!(is_device_name(ok), "{ok}");
        }
        for bad in [
            "",
            ":0",
            "cuda:",
            "cuda:0:1",
            "1cuda",
            "cu da",
            "cuda:x",
            "\u{1b}[2Jcpu",
        ] {
            assert!(!is_device_name(bad), "{bad:?}");
        }
    }
}
