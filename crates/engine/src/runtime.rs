//! Process-wide state: the configuration read at load, the sink started at
//! the first enable, and the switches behind `torch.ops.opdump.*`.

use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Mutex, OnceLock};
use std::time::{Duration, Instant};

use crate::config::{self, Config};
use crate::host::{self, Host};
use crate::online;
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
/// A forked child's own sink (OPDUMP_FORK=record). Never touched by the
/// parent, so its lock cannot have been held by another thread at fork.
static CHILD_SINK: OnceLock<Sink> = OnceLock::new();
static CHILD_SINK_START: Mutex<()> = Mutex::new(());
/// This process is a fork of the one that loaded opdump.
static FORKED: AtomicBool = AtomicBool::new(false);
static PARENT_PID: AtomicI32 = AtomicI32::new(0);
/// SIGTERM arrived: the writer completes the files and ends the process.
static TERMINATE: AtomicBool = AtomicBool::new(false);
static TERM_SIGNAL: AtomicI32 = AtomicI32::new(libc::SIGTERM);
static PID: AtomicI32 = AtomicI32::new(0);
/// An internal failure switched opdump off for the rest of the process.
static BROKEN: AtomicBool = AtomicBool::new(false);
/// Rust's view of whether recording is on; the C++ hook has its own flag so
/// that it skips the bridge entirely when off. Written only here.
pub static RECORDING: AtomicBool = AtomicBool::new(false);

/// The first of `names` that is set to a number.
fn rank_from_env(names: &[&str]) -> Option<u32> {
    names
        .iter()
        .find_map(|v| std::env::var(v).ok()?.trim().parse().ok())
}

/// The rank of this process: from `RANK`, `OMPI_COMM_WORLD_RANK` or
/// `SLURM_PROCID`, else from an initialised torch.distributed, else 0.
/// Resolved at the first record, not at load, since launchers and jobs set
/// it late.
pub fn rank() -> u32 {
    static RANK: OnceLock<u32> = OnceLock::new();
    *RANK.get_or_init(|| {
        rank_from_env(&["RANK", "OMPI_COMM_WORLD_RANK", "SLURM_PROCID"])
            .or_else(|| u32::try_from((host::get().distributed_rank)()).ok())
            .unwrap_or(0)
    })
}

/// The local rank, likewise: `LOCAL_RANK`, `OMPI_COMM_WORLD_LOCAL_RANK` or
/// `SLURM_LOCALID`, else 0. Written into each file's metadata.
pub fn local_rank() -> u32 {
    static LOCAL: OnceLock<u32> = OnceLock::new();
    *LOCAL.get_or_init(|| {
        rank_from_env(&["LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_RANK", "SLURM_LOCALID"]).unwrap_or(0)
    })
}

pub fn get() -> Option<&'static Runtime> {
    RUNTIME.get()
}

/// The sink of this process: the parent's, or a forked child's own.
pub fn sink() -> Option<&'static Sink> {
    if !FORKED.load(Ordering::Relaxed) {
        return SINK.get();
    }
    if let Some(s) = CHILD_SINK.get() {
        return Some(s);
    }
    let rt = get()?;
    let _guard = CHILD_SINK_START.lock().ok()?;
    if let Some(s) = CHILD_SINK.get() {
        return Some(s);
    }
    let s = Sink::start(
        &rt.config,
        setup(rt, Some(PARENT_PID.load(Ordering::Relaxed))),
    )
    .ok()?;
    Some(CHILD_SINK.get_or_init(|| s))
}

/// The sink this process has started, if any: the parent's, or a forked
/// child's own. Never starts one. Only atomics: safe in a signal handler.
fn started_sink() -> Option<&'static Sink> {
    if FORKED.load(Ordering::SeqCst) {
        CHILD_SINK.get()
    } else {
        SINK.get()
    }
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
        say(&format!(
            "{what}; opdump switches itself off, the job goes on. This is an opdump bug: please report this line"
        ));
    }
    set_recording(false);
}

fn set_recording(on: bool) {
    RECORDING.store(on, Ordering::SeqCst);
    (host::get().set_active)(on);
}

/// Called by the writer thread when the disk fails.
fn writer_failed() {
    set_recording(false);
}

/// At load: read the configuration, register with the dispatcher through
/// `host`, and switch on when OPDUMP=1.
pub fn init(host: Host) {
    host::set(host);
    PID.store(std::process::id() as i32, Ordering::Relaxed);
    let parsed = config::parse(std::env::vars());
    let config_ok = parsed.errors.is_empty();
    let dir = std::path::absolute(&parsed.config.dir).unwrap_or_else(|_| parsed.config.dir.clone());
    let on = parsed.config.on_at_load;
    crate::capture::install(crate::capture::Captures::new(
        parsed.config.capture.clone(),
        parsed.config.capture_max_bytes,
    ));
    if parsed.config.check.is_some() {
        crate::check::install(crate::check::Checks::new(crate::check::Settings {
            per_signature: parsed.config.check_per_signature,
            recheck_per_step: parsed.config.check_recheck,
            max_bytes: parsed.config.check_max_bytes,
            budget: parsed.config.check_budget,
            wait: parsed.config.check_wait,
            dir: dir.clone(),
            pid: pid(),
            file_mode: parsed.config.file_mode,
            dir_mode: parsed.config.dir_mode(),
            say,
        }));
    }
    let _ = RUNTIME.set(Runtime {
        config: parsed.config,
        config_ok,
        dir,
        torch_version: (host.torch_version)(),
    });
    // A second copy reports itself and nothing else.
    if !(host.install)() {
        return;
    }
    for line in parsed.warnings.iter().chain(&parsed.errors) {
        say(line);
    }
    if !config_ok {
        say("dumping stays off until the values above are fixed");
    }
    // SAFETY: registering plain extern "C" functions.
    unsafe {
        libc::atexit(at_exit);
        libc::pthread_atfork(None, None, Some(in_forked_child));
    }
    register_python_exit();
    if on && config_ok {
        enable();
    }
}

fn setup(rt: &Runtime, forked_from: Option<i32>) -> SinkSetup {
    SinkSetup {
        dir: rt.dir.clone(),
        rank,
        local_rank,
        pid: pid(),
        torch_version: rt.torch_version.clone(),
        terminate: &TERMINATE,
        on_terminated: end_after_signal,
        before_terminating: || {
            let _ = (host::get().device_flush)(5_000);
        },
        on_failure: writer_failed,
        on_internal_error: fail,
        forked_from,
        file_mode: rt.config.file_mode,
        dir_mode: rt.config.dir_mode(),
        // A forked child's calls are not the reference's program.
        online: forked_from.is_none().then(|| online_setup(rt)).flatten(),
    }
}

/// Online compare, when OPDUMP_REFERENCE names a reference that can be
/// read; otherwise one line, and dumping goes on without it.
fn online_setup(rt: &Runtime) -> Option<online::Setup> {
    let dir = rt.config.reference.as_ref()?;
    let reference = match online::reference::Reference::open(dir) {
        Ok(r) => r,
        Err(why) => {
            say(&format!("{why}. This run is dumped without comparing"));
            return None;
        }
    };
    Some(online::Setup {
        reference,
        dir: rt.dir.clone(),
        rank,
        pid: pid(),
        file_mode: rt.config.file_mode,
        dir_mode: rt.config.dir_mode(),
        on_divergence: rt.config.on_divergence,
        hooks: online::Hooks {
            say,
            captured_as: || crate::capture::installed()?.armed_chosen(),
        },
    })
}

/// After fork, in the child (one thread: the one that forked). By default
/// the child records nothing: it would continue the parent's seq numbers and
/// write into the parent's files. With OPDUMP_FORK=record it writes files of
/// its own, started at its first record.
extern "C" fn in_forked_child() {
    PARENT_PID.store(PID.load(Ordering::Relaxed), Ordering::Relaxed);
    // SAFETY: getpid is async-signal-safe.
    PID.store(unsafe { libc::getpid() }, Ordering::Relaxed);
    FORKED.store(true, Ordering::SeqCst);
    if !get().is_some_and(|rt| rt.config.fork_record) {
        RECORDING.store(false, Ordering::SeqCst);
    }
}

/// SIGTERM (and SIGINT where nothing else handles it): stop recording at
/// once, and let the writer thread complete the files and end the process.
/// Only atomics are touched here: this runs in a signal handler.
extern "C" fn on_terminate_signal(sig: libc::c_int) {
    RECORDING.store(false, Ordering::SeqCst);
    let writer = started_sink();
    if writer.is_none() {
        // Nothing to complete (a forked child that records nothing): end now.
        // SAFETY: signal and raise are async-signal-safe.
        unsafe {
            libc::signal(sig, libc::SIG_DFL);
            libc::raise(sig);
        }
        return;
    }
    TERM_SIGNAL.store(sig, Ordering::SeqCst);
    TERMINATE.store(true, Ordering::SeqCst);
}

/// Called by the writer thread once the files are complete: end the process
/// as the signal would have, with its status.
fn end_after_signal() {
    let sig = TERM_SIGNAL.load(Ordering::SeqCst);
    // SAFETY: restoring the default action and re-raising the signal.
    unsafe {
        libc::signal(sig, libc::SIG_DFL);
        libc::kill(libc::getpid(), sig);
    }
}

/// Handles SIGTERM and SIGINT only where the job left them at their default
/// action (Python turns SIGINT into KeyboardInterrupt, which exits through
/// atexit and needs nothing from us).
fn install_signal_handlers() {
    for sig in [libc::SIGTERM, libc::SIGINT] {
        // SAFETY: reading and setting dispositions with zeroed sigaction structs.
        unsafe {
            let mut old: libc::sigaction = std::mem::zeroed();
            if libc::sigaction(sig, std::ptr::null(), &mut old) != 0
                || old.sa_sigaction != libc::SIG_DFL
            {
                continue;
            }
            let mut act: libc::sigaction = std::mem::zeroed();
            act.sa_sigaction = on_terminate_signal as extern "C" fn(libc::c_int) as usize;
            libc::sigemptyset(&mut act.sa_mask);
            libc::sigaction(sig, &act, std::ptr::null_mut());
        }
    }
}

fn start_sink(rt: &Runtime) -> Option<&'static Sink> {
    let _guard = SINK_START.lock().ok()?;
    if let Some(s) = SINK.get() {
        return Some(s);
    }
    // Created if missing; refused if it is not a directory we can write,
    // another user's, or writable by others (see opdump_fsguard).
    if let Err(problem) = opdump_fsguard::check_dump_dir(&rt.dir, rt.config.dir_mode()) {
        say(&format!("{problem}. Dumping stays off"));
        return None;
    }
    match Sink::start(&rt.config, setup(rt, None)) {
        Ok(s) => {
            install_signal_handlers();
            SINK.get_or_init(|| s).into()
        }
        Err(e) => {
            say(&format!(
                "cannot start the writer thread ({e}); dumping stays off. Raise the process's thread or memory limit (ulimit -u, ulimit -v) and run again"
            ));
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
    if FORKED.load(Ordering::SeqCst) {
        if !rt.config.fork_record {
            return false; // see in_forked_child
        }
    } else if !rt.config.hook_only && start_sink(rt).is_none() {
        return false;
    }
    set_recording(true);
    true
}

pub fn disable() {
    set_recording(false);
}

pub fn flush() -> bool {
    match started_sink() {
        Some(s) => {
            let device = flush_device();
            s.flush(FLUSH_WAIT) && device
        }
        None => true,
    }
}

/// The job's thread ended a step (the step counter moved past it), and
/// makes its first top-level call since. With OPDUMP_REFERENCE the job may
/// wait here for the step's verdict, so that a call it names is captured in
/// the step it begins ([`online::boundary`]).
pub fn step_ended(end: online::boundary::StepEnd) {
    if FORKED.load(Ordering::Relaxed) {
        return;
    }
    guarded((), || wait_for_verdict(end));
}

fn wait_for_verdict(end: online::boundary::StepEnd) {
    static SAID: AtomicBool = AtomicBool::new(false);
    let Some(sink) = SINK.get() else {
        return;
    };
    if !RECORDING.load(Ordering::Relaxed) || !online::boundary::should_wait(end) {
        return;
    }
    let ended = end.ended;
    let deadline = Instant::now() + online::boundary::WAIT;
    let left = || deadline.saturating_duration_since(Instant::now());
    // The step's device statistics come back first, so that their records
    // are in the channel ahead of the step's end.
    let _ = (host::get().device_flush)(i64::try_from(left().as_millis()).unwrap_or(i64::MAX));
    let judged =
        sink.step_ended(ended, left()) && online::boundary::wait_for_verdict(ended, deadline);
    if !judged && !SAID.swap(true, Ordering::Relaxed) {
        // 30 s: online::boundary::WAIT.
        say(&format!(
            "the verdict of step {ended} against OPDUMP_REFERENCE did not come within 30 s of the step's end; \
             the job goes on, and a call it names is captured in a later step"
        ));
    }
}

/// Waits for the device statistics launched so far, so that their records
/// are in the channel before the writer is asked to complete its files.
fn flush_device() -> bool {
    (host::get().device_flush)(FLUSH_WAIT.as_millis() as i64)
}

/// How the device path waits; see [`Config::device_sync`] and the queue
/// settings, which it shares with the record channel.
pub struct DeviceSettings {
    pub sync: bool,
    pub hold: bool,
    pub block: bool,
    pub wait_ms: i64,
}

pub fn device_settings() -> DeviceSettings {
    let c = get().map(|rt| rt.config.clone()).unwrap_or_default();
    DeviceSettings {
        sync: c.device_sync,
        hold: c.device_hold,
        block: c.queue_full == config::QueueFull::Block,
        wait_ms: i64::try_from(c.queue_wait.as_millis()).unwrap_or(i64::MAX),
    }
}

/// The sketch's length K (OPDUMP_SKETCH); 0: no fingerprint and no sketch.
pub fn sketch_size() -> u32 {
    get().map_or(0, |rt| rt.config.sketch)
}

/// OPDUMP_HOOK_ONLY: the hook passes every call on and records nothing.
pub fn hook_only() -> bool {
    get().is_some_and(|rt| rt.config.hook_only)
}

/// Whether the Python module hooks go in while dumping (OPDUMP_MODULES).
pub fn modules_enabled() -> bool {
    get().is_some_and(|rt| rt.config.modules)
}

/// Whether forked children write files of their own (OPDUMP_FORK=record).
pub fn fork_record_enabled() -> bool {
    get().is_some_and(|rt| rt.config.fork_record)
}

/// One line on stderr; opdump stays on.
pub fn warn(what: &str) {
    guarded((), || say(what))
}

/// What happened to device measurements, for the exit report: [measured,
/// dropped, capturing, waits on the job's thread, failed, held tensors read
/// early before a write].
fn device_counts() -> [i64; 6] {
    let v = (host::get().device_counts)();
    std::array::from_fn(|i| v.get(i).copied().unwrap_or(0))
}

/// Python ends a job interrupted by Ctrl-C (an unhandled KeyboardInterrupt)
/// by finalizing and then killing itself with SIGINT, so the C atexit
/// handlers never run. `Py_AtExit` functions run at the end of finalization:
/// register there too when the process is Python. `at_exit` runs once.
fn register_python_exit() {
    type PyAtExit = unsafe extern "C" fn(extern "C" fn()) -> libc::c_int;
    // SAFETY: looks the symbol up in the process; calls it with its signature.
    unsafe {
        let sym = libc::dlsym(libc::RTLD_DEFAULT, c"Py_AtExit".as_ptr());
        if !sym.is_null() {
            let py_at_exit: PyAtExit = std::mem::transmute(sym);
            py_at_exit(at_exit);
        }
    }
}

static EXITED: AtomicBool = AtomicBool::new(false);

extern "C" fn at_exit() {
    if EXITED.swap(true, Ordering::SeqCst) {
        return;
    }
    let _ = catch_unwind(AssertUnwindSafe(|| {
        RECORDING.store(false, Ordering::SeqCst);
        // A forked child has no writer thread of the parent's to wait for.
        let s = started_sink();
        let Some(s) = s else { return };
        if !online::cpu_check::wait(FLUSH_WAIT) {
            say("the CPU check of the call online compare named did not finish within 60 s at exit; its verdict is missing");
        }
        finish_checks();
        if !flush_device() {
            say("device statistics did not all come back within 60 s at exit; their op calls are missing. Check that the device is not hung, or measure synchronously with OPDUMP_DEVICE_SYNC=1");
        }
        if !s.shutdown(FLUSH_WAIT) {
            say("the writer did not finish within 60 s at exit; the last files may be missing. The disk under OPDUMP_DIR is slow or hung: use another, or record less (OPDUMP_STEPS, OPDUMP_INCLUDE)");
        }
        let c = &s.counters;
        let (written, dropped, failed) = (
            c.written.load(Ordering::Relaxed),
            c.dropped.load(Ordering::Relaxed),
            c.failed.load(Ordering::Relaxed),
        );
        if dropped > 0 || failed > 0 {
            say(&format!(
                "{written} op calls written; {dropped} dropped (channel full), {failed} lost (write failures). To drop none, set OPDUMP_QUEUE_FULL=block with a longer OPDUMP_QUEUE_WAIT_MS, or record less (OPDUMP_STEPS, OPDUMP_INCLUDE)"
            ));
        }
        let [_, dev_dropped, _, _, dev_failed, _] = device_counts();
        if dev_dropped > 0 || dev_failed > 0 {
            say(&format!(
                "{dev_dropped} device tensors not measured (status dropped: results pool full), \
                 {dev_failed} failed on the device (status failed). To drop none, set OPDUMP_QUEUE_FULL=block with a longer OPDUMP_QUEUE_WAIT_MS"
            ));
        }
        report_captures(c.captures_failed.load(Ordering::Relaxed));
        if online::stop::requested() {
            // The job may have caught the raised error, or ended before its
            // next call: a CI gate still sees the divergence.
            say("OPDUMP_ON_DIVERGENCE=stop: a divergence was introduced; the process exits with status 1");
            // SAFETY: ends the process; the files are complete (shut down above).
            unsafe { libc::_exit(1) };
        }
    }));
}

/// OPDUMP_CHECK at exit: the checks under way finish (queued ones are
/// dropped after FLUSH_WAIT), then the summary.
fn finish_checks() {
    let Some(c) = crate::check::get() else { return };
    if !c.is_of_process(pid()) {
        return;
    }
    if !c.wait(FLUSH_WAIT) {
        (host::get().check_abandon)();
        c.wait(Duration::from_secs(10));
    }
    c.finish();
}

/// What OPDUMP_CAPTURE saved, said once at exit: a selector that matched
/// nothing is the usual mistake, and calls past the byte cap are counted.
fn report_captures(failed: u64) {
    let (Some(c), Some(rt)) = (crate::capture::installed(), get()) else {
        return;
    };
    if rt.config.capture.is_empty() {
        return; // a call armed by the online judge is reported by it
    }
    let [captured, skipped, partial, bytes] = c.counts();
    let written = captured.saturating_sub(failed);
    if captured == 0 && skipped == 0 {
        say(
            "OPDUMP_CAPTURE matched no recorded call, so nothing was captured. Selectors count the calls that \
             are recorded (OPDUMP_INCLUDE, OPDUMP_STEPS, OPDUMP_MAX_DEPTH ...): the indexes `opdump compare` \
             prints hold for a run with the same settings",
        );
        return;
    }
    let mut line = format!(
        "captured {written} op call{} ({:.1} MiB of tensors) into {}/rank=*/device=*/capture-{}-*.safetensors",
        if written == 1 { "" } else { "s" },
        bytes as f64 / (1u64 << 20) as f64,
        rt.dir.display(),
        pid()
    );
    if skipped > 0 || partial > 0 {
        line += &format!(
            "; {skipped} more not captured and {partial} without their outputs: \
             OPDUMP_CAPTURE_MAX_BYTES={} reached: raise it to capture them",
            rt.config.capture_max_bytes
        );
    }
    if failed > 0 {
        line += &format!("; {failed} capture files could not be written");
    }
    say(&line);
}

// ---------------------------------------------------------------------------
// torch.ops.opdump.* (through the bridge). Never unwinds.
// ---------------------------------------------------------------------------

pub(crate) fn guarded<T>(default: T, f: impl FnOnce() -> T) -> T {
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

/// What the exit handlers do, now: a forked child ending through
/// `os._exit` (multiprocessing's workers) runs none of them.
pub fn control_finish() {
    at_exit();
}

/// [written, dropped, failed] op calls.
pub fn control_stats() -> Vec<i64> {
    guarded(vec![0, 0, 0], || match started_sink() {
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

/// [captured, not captured for the byte cap, captured without outputs for
/// it, bytes saved] (OPDUMP_CAPTURE).
pub fn control_capture_stats() -> Vec<i64> {
    guarded(vec![0; 4], || {
        crate::capture::installed()
            .map(|c| c.counts().iter().map(|&v| v as i64).collect())
            .unwrap_or_else(|| vec![0; 4])
    })
}

/// Takes bytes of captured tensors from the process's budget.
pub fn capture_reserve(bytes: u64, outputs: bool) -> bool {
    guarded(false, || {
        crate::capture::installed().is_some_and(|c| c.reserve(bytes, outputs))
    })
}

/// [measured, dropped, capturing, waits on the job's thread, failed] device
/// tensors, and the reads of held tensors made early, before a write.
pub fn control_device_stats() -> Vec<i64> {
    guarded(vec![0; 6], || device_counts().to_vec())
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
