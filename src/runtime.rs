//! Process-wide state: the configuration read at load, the sink started at
//! the first enable, and the switches behind `torch.ops.opdump.*`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::Duration;

use crate::bridge::ffi;
use crate::config::{self, Config};
use crate::recorder::{self, RECORDING};
use crate::sink::{Sink, SinkSetup};

/// The longest `flush()` and the exit waits for the writer.
const FLUSH_WAIT: Duration = Duration::from_secs(60);

pub struct Runtime {
    pub config: Config,
    /// The configuration had a bad value: dumping stays off.
    pub config_ok: bool,
    /// OPDUMP_DIR made absolute at load, so a later chdir changes nothing.
    pub dir: PathBuf,
    pub torch_version: String,
}

static RUNTIME: OnceLock<Runtime> = OnceLock::new();
static SINK: OnceLock<Sink> = OnceLock::new();
static SINK_START: Mutex<()> = Mutex::new(());
static PID: AtomicI32 = AtomicI32::new(0);
/// An internal failure switched opdump off for the rest of the process.
static BROKEN: AtomicBool = AtomicBool::new(false);

pub fn get() -> Option<&'static Runtime> {
    RUNTIME.get()
}

pub fn sink() -> Option<&'static Sink> {
    SINK.get()
}

pub fn pid() -> i32 {
    PID.load(Ordering::Relaxed)
}

fn say(line: &str) {
    eprintln!("opdump: {line}");
}

/// An internal failure: one line, then opdump is off for good. The job's
/// own work is untouched.
pub fn fail(what: &str) {
    if !BROKEN.swap(true, Ordering::SeqCst) {
        say(&format!("{what}; opdump switches itself off, the job goes on"));
    }
    set_recording(false);
}

fn set_recording(on: bool) {
    RECORDING.store(on, Ordering::SeqCst);
    ffi::set_active(on);
}

/// Called by the writer thread when the disk fails.
fn writer_failed() {
    set_recording(false);
}

/// At load: read the configuration, register with the dispatcher, and switch
/// on when OPDUMP=1.
pub fn init() {
    PID.store(std::process::id() as i32, Ordering::Relaxed);
    let parsed = config::parse(std::env::vars());
    let config_ok = parsed.errors.is_empty();
    let dir = std::path::absolute(&parsed.config.dir).unwrap_or_else(|_| parsed.config.dir.clone());
    let on = parsed.config.on_at_load;
    let _ = RUNTIME.set(Runtime {
        config: parsed.config,
        config_ok,
        dir,
        torch_version: ffi::torch_version(),
    });
    // A second copy reports itself and nothing else.
    if !ffi::install() {
        return;
    }
    for line in parsed.warnings.iter().chain(&parsed.errors) {
        say(line);
    }
    if !config_ok {
        say("dumping stays off until the values above are fixed");
    }
    // SAFETY: registering a plain extern "C" function.
    unsafe { libc::atexit(at_exit) };
    if on && config_ok {
        enable();
    }
}

fn start_sink(rt: &Runtime) -> Option<&'static Sink> {
    let _guard = SINK_START.lock().ok()?;
    if let Some(s) = SINK.get() {
        return Some(s);
    }
    if let Err(e) = opdump_format::writer::create_dir(&rt.dir, 0o700) {
        say(&format!("OPDUMP_DIR={} cannot be created ({e}); set OPDUMP_DIR to a writable directory. Dumping stays off", rt.dir.display()));
        return None;
    }
    let writable = std::ffi::CString::new(rt.dir.as_os_str().as_encoded_bytes())
        // SAFETY: access(2) on a valid C string.
        .map(|c| unsafe { libc::access(c.as_ptr(), libc::W_OK | libc::X_OK) } == 0)
        .unwrap_or(false);
    if !writable {
        say(&format!("OPDUMP_DIR={} is not writable; set OPDUMP_DIR to a writable directory. Dumping stays off", rt.dir.display()));
        return None;
    }
    let setup = SinkSetup {
        dir: rt.dir.clone(),
        rank: recorder::rank(),
        pid: pid(),
        torch_version: rt.torch_version.clone(),
        on_failure: writer_failed,
    };
    match Sink::start(&rt.config, setup) {
        Ok(s) => SINK.get_or_init(|| s).into(),
        Err(e) => {
            say(&format!("cannot start the writer thread ({e}); dumping stays off"));
            None
        }
    }
}

/// Switches dumping on. False (with the reason printed) when it cannot be.
pub fn enable() -> bool {
    let Some(rt) = get() else { return false };
    if BROKEN.load(Ordering::SeqCst) {
        return false;
    }
    if !rt.config_ok {
        say("enable() ignored: fix the OPDUMP_* values reported at load first");
        return false;
    }
    if start_sink(rt).is_none() {
        return false;
    }
    set_recording(true);
    true
}

pub fn disable() {
    set_recording(false);
}

pub fn flush() -> bool {
    match sink() {
        Some(s) => s.flush(FLUSH_WAIT),
        None => true,
    }
}

extern "C" fn at_exit() {
    let _ = catch_unwind(AssertUnwindSafe(|| {
        RECORDING.store(false, Ordering::SeqCst);
        let Some(s) = sink() else { return };
        if !s.shutdown(FLUSH_WAIT) {
            say("the writer did not finish within 60 s at exit; the last files may be missing");
        }
        let c = &s.counters;
        let (written, dropped, failed) = (
            c.written.load(Ordering::Relaxed),
            c.dropped.load(Ordering::Relaxed),
            c.failed.load(Ordering::Relaxed),
        );
        if dropped > 0 || failed > 0 {
            say(&format!(
                "{written} op calls written; {dropped} dropped (channel full), {failed} lost (write failures)"
            ));
        }
    }));
}

// ---------------------------------------------------------------------------
// torch.ops.opdump.* (through the bridge). Never unwinds.
// ---------------------------------------------------------------------------

fn guarded<T>(default: T, f: impl FnOnce() -> T) -> T {
    catch_unwind(AssertUnwindSafe(f)).unwrap_or_else(|_| {
        fail("internal error in a torch.ops.opdump call");
        default
    })
}

pub fn control_enable() -> bool {
    guarded(false, enable)
}

pub fn control_disable() {
    guarded((), disable)
}

pub fn control_flush() -> bool {
    guarded(false, flush)
}

pub fn control_step() -> i64 {
    guarded(0, recorder::explicit_step)
}

/// [written, dropped, failed] op calls.
pub fn control_stats() -> Vec<i64> {
    guarded(vec![0, 0, 0], || match sink() {
        Some(s) => {
            let c = &s.counters;
            [&c.written, &c.dropped, &c.failed]
                .iter()
                .map(|a| a.load(Ordering::Relaxed) as i64)
                .collect()
        }
        None => vec![0, 0, 0],
    })
}

pub fn internal_error(what: &str) {
    guarded((), || {
        // Registration found another copy: report, but this is not a failure
        // of this process's opdump.
        if what.starts_with("another copy") {
            say(what);
        } else {
            fail(what);
        }
    })
}
