//! `opdump repro A B [--call SELECTOR]`: a folder that reproduces one op call
//! outside the job: both runs' capture files of the call, `call.json` (what
//! the comparison knows of it) and `repro.py` (torch only), which calls the
//! op again on A's device type, on B's, and as a float64 reference on the
//! CPU, and names the device that is off.

use std::path::{Path, PathBuf};

use serde::Serialize;

use opdump_format::selector;

use crate::call_selector;
use crate::compare::{self, CompareOptions};
use crate::dump::Dump;
use crate::error::{CliError, Result};
use crate::output;
use crate::progress::Progress;

/// The script, the same for every call: it reads `call.json` beside it.
pub const SCRIPT: &str = include_str!("repro.py");

/// What `repro.py` reads besides the two capture files.
#[derive(Serialize)]
struct CallFile {
    format: &'static str,
    op: String,
    overload: String,
    /// The devices the call ran on in each run (its first output's, else its
    /// first input's): `cpu`, `cuda:0`, `testdev:0`.
    device_a: String,
    device_b: String,
    seq_a: i64,
    seq_b: i64,
    step_a: i64,
    step_b: i64,
    selector_a: String,
    selector_b: String,
    module: Option<String>,
    dump_a: String,
    dump_b: String,
    /// The relative error rounding explains for this call (its dtype and
    /// reduction length), as `opdump compare` judged it.
    tolerance: f64,
    /// `opdump compare`'s verdict on the call.
    verdict: &'static str,
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
/// output's, else its first input's.
fn device_of(d: &Dump, file: &str) -> String {
    let layout: std::collections::BTreeMap<String, serde_json::Value> = d
        .captures
        .get(file)
        .and_then(|f| {
            f.metadata
                .get(opdump_format::capture::meta::TENSORS)
                .cloned()
        })
        .and_then(|t| serde_json::from_str(&t).ok())
        .unwrap_or_default();
    let device = |prefix: &str| {
        layout
            .iter()
            .filter(|(k, _)| k.starts_with(prefix))
            .find_map(|(_, v)| v.get("device")?.as_str().map(str::to_string))
    };
    device("output.")
        .or_else(|| device("input."))
        .unwrap_or_else(|| "cpu".into())
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
                        "{s} (seq A {}) has no aligned call in B: nothing to reproduce it against",
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
    let fa =
        c.a.capture_file_of(p.a)
            .ok_or_else(|| missing("A", &c.a, p.a, &sa))?;
    let fb =
        c.b.capture_file_of(p.b)
            .ok_or_else(|| missing("B", &c.b, p.b, &sb))?;
    let op = c.a.full_name(p.a);
    let out = opts.out.unwrap_or_else(|| {
        let safe: String = op
            .chars()
            .map(|ch| if ch.is_ascii_alphanumeric() { ch } else { '_' })
            .collect();
        PathBuf::from(format!("repro-{safe}-{}", c.a.seq(p.a)))
    });
    output::create_dir(&out)?;
    for (d, from, name) in [(&c.a, fa, "a.safetensors"), (&c.b, fb, "b.safetensors")] {
        let file = d
            .captures
            .get(from)
            .ok_or_else(|| CliError::new(format!("{from}: not a readable capture file")))?;
        output::write_bytes(&out.join(name), file.bytes())?;
    }
    let detail = c.detail(k);
    let call = CallFile {
        format: "opdump-repro",
        op: c.a.op_name(p.a).to_string(),
        overload: c.a.overload_name(p.a).to_string(),
        device_a: device_of(&c.a, fa),
        device_b: device_of(&c.b, fb),
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
        verdict: c.op_verdict(k).as_str(),
    };
    let json = serde_json::to_string_pretty(&call)
        .map_err(|e| CliError::new(format!("call.json: {e}")))?;
    output::write_bytes(&out.join("call.json"), json.as_bytes())?;
    output::write_bytes(&out.join("repro.py"), SCRIPT.as_bytes())?;
    Ok((out, call.device_b))
}

/// What `opdump repro` prints: the folder, and the command to run.
pub fn summary(dir: &Path, device_b: &str) -> String {
    let mut s = format!(
        "opdump repro: wrote {}/ (a.safetensors, b.safetensors, call.json, repro.py)\n\
         run it, with torch and without opdump:\n  python {}/repro.py",
        dir.display(),
        dir.display()
    );
    let kind = device_b.split(':').next().unwrap_or(device_b);
    if !matches!(kind, "cpu" | "cuda" | "mps" | "xpu") {
        let example = if kind == "testdev" {
            ": --setup tests.testdev:load"
        } else {
            ""
        };
        s += &format!(
            "   (add --setup MODULE[:FUNCTION], the module that registers the {kind} device{example})"
        );
    }
    s.push('\n');
    s
}
