//! Online compare (`OPDUMP_REFERENCE`): this run judged against a
//! reference dump while it runs, a step at a time, on a thread of its own.
//!
//! The writer hands each record it wrote to a [`Feed`], which keeps the
//! current step's records. A step is complete when the job ends it and
//! waits for its verdict ([`boundary`]), or else once a record two steps
//! later arrives: its records go to the judge thread, which reads the same
//! step of the reference and the one before it, compares the two windows
//! with the judge `opdump compare` uses ([`opdump_judge::compare_dumps`],
//! the step before as context), and folds the outcome into the run's
//! verdict ([`fold`]). Memory stays at about three steps of each side: the
//! step being filled, and the step being judged with the one before it.
//!
//! The first introduced divergence is said on one `opdump:` line, the same
//! call of a later step is captured ([`crate::capture::Captures::arm`]),
//! and with `OPDUMP_ON_DIVERGENCE=stop` the job is stopped once that
//! capture is made. Every verdict is appended to
//! `<OPDUMP_DIR>/verdicts/rank=<R>/part-<pid>.jsonl` ([`crate::jsonl`]).
//!
//! Nothing here can stop the job by failing: a reference that cannot be
//! read, or a step that cannot be judged, is one line, and dumping goes on
//! without comparing.

pub mod boundary;
pub mod cpu_check;
pub mod fold;
pub mod reference;
pub mod stop;

use std::collections::BTreeMap;
use std::panic::{catch_unwind, AssertUnwindSafe};
use std::path::PathBuf;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, Sender};
use opdump_format::OpRecord;
use opdump_judge::{compare_dumps, CompareSettings, Dump, Filter, Refusal, Silent, Tolerances};

use crate::config::OnDivergence;
use crate::jsonl::JsonLines;
use fold::Fold;
use opdump_format::tables::verdict::{CallRef, CpuCheckLine, FinalLine};
use opdump_format::tables::{Kind, Table};
use reference::Reference;

/// What the judge thread tells the rest of opdump.
pub struct Hooks {
    /// A line on stderr (prefixed `opdump: `).
    pub say: fn(&str),
    /// The selector of the call captured for it, once captured.
    pub captured_as: fn() -> Option<String>,
}

pub struct Setup {
    pub reference: Reference,
    /// This run's dump directory.
    pub dir: PathBuf,
    pub rank: fn() -> u32,
    pub pid: i32,
    pub file_mode: u32,
    pub dir_mode: u32,
    /// What to do once a divergence is introduced (OPDUMP_ON_DIVERGENCE).
    pub on_divergence: OnDivergence,
    pub hooks: Hooks,
}

enum Msg {
    Step(i64, Vec<OpRecord>),
    /// The CPU check of the named call ([`cpu_check`]).
    CpuCheck(cpu_check::Found),
    Finish,
}

/// The writer's side: collects the steps still open, hands complete steps
/// to the judge thread.
///
/// A step is complete when the job says so at its end ([`Feed::step_ended`],
/// after its device statistics came back), or else once a record two steps
/// later arrives: records of the step before the current one still come in
/// a little late (from the autograd engine's threads, or device statistics
/// that came back late), and are judged with their step. A record of a step
/// handed over already is counted, and said at exit.
pub struct Feed {
    open: BTreeMap<i64, Vec<OpRecord>>,
    /// The last step handed over: records of it or before come too late.
    handed: Option<i64>,
    /// Records of a step handed over already, which cannot be judged.
    late: u64,
    tx: Sender<Msg>,
    worker: Option<JoinHandle<()>>,
    say: fn(&str),
}

impl Feed {
    pub fn start(setup: Setup) -> std::io::Result<Feed> {
        // One step in flight: the writer waits for the judge, rather than
        // let steps pile up in memory, when judging is the slower.
        let (tx, rx) = bounded(1);
        let to_judge = tx.clone();
        cpu_check::connect(Box::new(move |found| {
            let _ = to_judge.send(Msg::CpuCheck(found));
        }));
        let say = setup.hooks.say;
        let worker = opdump_fsguard::spawn("opdump-judge", move || Judging::new(setup).run(rx))?;
        boundary::start();
        Ok(Feed {
            open: BTreeMap::new(),
            handed: None,
            late: 0,
            tx,
            worker: Some(worker),
            say,
        })
    }

    /// A record the writer wrote.
    pub fn offer(&mut self, rec: OpRecord) {
        if self.handed.is_some_and(|h| rec.step <= h) {
            self.late += 1;
            return;
        }
        let step = rec.step;
        self.open.entry(step).or_default().push(rec);
        while let Some((&first, _)) = self.open.first_key_value() {
            if first + 2 > step {
                break;
            }
            self.hand_over_first();
        }
    }

    /// The job ended step `step` and waits for its verdict: every step up to
    /// it goes to the judge now. When there is nothing of it to judge, the
    /// job is told at once.
    pub fn step_ended(&mut self, step: i64) {
        if self.handed.is_some_and(|h| h >= step) {
            return boundary::judged(step);
        }
        let mut has_it = false;
        while let Some((&first, _)) = self.open.first_key_value() {
            if first > step {
                break;
            }
            has_it |= first == step;
            self.hand_over_first();
        }
        self.handed = Some(step);
        if !has_it {
            boundary::judged(step);
        }
    }

    fn hand_over_first(&mut self) {
        if let Some((step, records)) = self.open.pop_first() {
            self.handed = Some(step);
            let _ = self.tx.send(Msg::Step(step, records));
        }
    }

    /// The run ends: judges the steps still open, writes the final verdict,
    /// and waits at most `timeout` for that.
    pub fn finish(&mut self, timeout: Duration) {
        let Some(worker) = self.worker.take() else {
            return;
        };
        while !self.open.is_empty() {
            self.hand_over_first();
        }
        let _ = self.tx.send(Msg::Finish);
        if self.late > 0 {
            (self.say)(&format!(
                "{} op calls arrived after their step was judged against OPDUMP_REFERENCE and were not judged",
                self.late
            ));
        }
        let deadline = Instant::now() + timeout;
        while !worker.is_finished() {
            if Instant::now() >= deadline {
                (self.say)("judging against OPDUMP_REFERENCE did not finish in time at exit; the verdict file lacks its last steps");
                return;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        let _ = worker.join();
    }
}

/// The judge thread's state.
struct Judging {
    setup: Setup,
    fold: Fold,
    file: Option<JsonLines>,
    /// Comparing stopped for good (the reason was said).
    off: bool,
    /// The first step the reference lacked was said.
    said_missing: bool,
    /// The verdict file could not be written (said once).
    write_failed: bool,
    /// The step judged last and this run's records of it: the context of
    /// the next step (see [`Judging::judge_step`]).
    previous: Option<(i64, Vec<OpRecord>)>,
}

impl Judging {
    fn new(setup: Setup) -> Self {
        Judging {
            setup,
            fold: Fold::default(),
            file: None,
            off: false,
            said_missing: false,
            write_failed: false,
            previous: None,
        }
    }

    fn run(mut self, rx: Receiver<Msg>) {
        while let Ok(msg) = rx.recv() {
            match msg {
                Msg::Step(step, records) => {
                    if !self.off {
                        let judged =
                            catch_unwind(AssertUnwindSafe(|| self.judge_step(step, records)));
                        if judged.is_err() {
                            self.stop_comparing(&format!(
                                "internal error judging step {step} against OPDUMP_REFERENCE"
                            ));
                        }
                    }
                    boundary::judged(step);
                }
                Msg::CpuCheck(found) => self.checked(found),
                Msg::Finish => break,
            }
        }
        boundary::stop();
        if self.fold.steps_judged > 0 {
            let row = self.fold.final_row();
            self.write(&row);
            self.say_final(&row);
        } else if !self.off {
            (self.setup.hooks.say)(&format!(
                "OPDUMP_REFERENCE={} has no step in common with this run: nothing was compared; dump the \
                 reference with the same OPDUMP_STEPS",
                self.setup.reference.dir.display(),
            ));
        }
    }

    fn say(&self, line: &str) {
        (self.setup.hooks.say)(line)
    }

    fn stop_comparing(&mut self, why: &str) {
        self.off = true;
        boundary::stop();
        self.say(&format!("{why}; this run is dumped without comparing"));
    }

    /// Judges `step` with the step before it as context, when this run has
    /// it: the parameters that step's optimizer wrote are read by this
    /// step's forward, and have a producer and a taint there, as in one
    /// pass over the whole run. Judged alone, a parameter read here is
    /// judged by its own error, and a bias moved by Adam's first step from
    /// a gradient that is rounding noise (a key bias's) read as drift.
    fn judge_step(&mut self, step: i64, records: Vec<OpRecord>) {
        let records = match self.previous.take().filter(|(s, _)| *s + 1 == step) {
            Some((_, mut window)) => {
                // One vector for both steps, split again after: no copy.
                let before = window.len();
                window.extend(records);
                self.judge_window(step - 1, step, &window);
                window.split_off(before)
            }
            None => {
                self.judge_window(step, step, &records);
                records
            }
        };
        self.previous = Some((step, records));
    }

    fn judge_window(&mut self, first: i64, step: i64, records: &[OpRecord]) {
        let rank = (self.setup.rank)();
        let reference = &self.setup.reference;
        if !reference.ranks().contains(&rank) {
            let why = format!(
                "OPDUMP_REFERENCE={} has no rank {rank} (it has ranks {:?}): dump the reference with the same ranks",
                reference.dir.display(),
                reference.ranks()
            );
            return self.stop_comparing(&why);
        }
        let a = match reference.steps(rank, first, step) {
            Ok(a) => a,
            Err(e) => {
                let why = format!(
                    "reading OPDUMP_REFERENCE={} failed ({e})",
                    reference.dir.display()
                );
                return self.stop_comparing(&why);
            }
        };
        // The step itself, not only its context: a reference that stops
        // a step short has the step before.
        if a.steps().last() != Some(&step) {
            self.fold.steps_missing += 1;
            if !self.said_missing {
                self.said_missing = true;
                self.say(&format!(
                    "OPDUMP_REFERENCE={} has no calls of rank {rank} in step {step}; steps it lacks are not compared \
                     (dump the reference with the same OPDUMP_STEPS)",
                    reference.dir.display()
                ));
            }
            return;
        }
        let b = match Dump::from_records(self.setup.dir.clone(), rank, records) {
            Ok(b) => b,
            Err(e) => {
                return self
                    .stop_comparing(&format!("this run's step {step} cannot be judged ({e})"))
            }
        };
        let settings = CompareSettings {
            filter: Filter::default(),
            tol: Tolerances::default(),
            top: usize::MAX,
            // Whether the reference is a run of this program is decided at
            // the first step compared: a later step may be cut short (the
            // job ended, or raised), and still be compared.
            force: self.fold.steps_judged > 0,
            context_before: (first < step).then_some(step),
        };
        match compare_dumps(a, b, settings, Vec::new(), &Silent) {
            Ok(c) => {
                let (rows, named) = self.fold.add(&c, step);
                for row in &rows {
                    self.write(row);
                }
                if let Some(call) = named {
                    self.name(&call);
                }
            }
            Err(Refusal::DifferentPrograms { matched, larger }) => self.stop_comparing(&format!(
                "OPDUMP_REFERENCE={} is a dump of another program: in step {step}, only {matched} of {larger} \
                 top-level op calls align; give a reference of the same model, inputs and OPDUMP_* selection",
                self.setup.reference.dir.display()
            )),
            Err(refusal) => {
                let why = format!("step {step} cannot be compared with OPDUMP_REFERENCE ({refusal:?})");
                self.stop_comparing(&why)
            }
        }
    }

    /// The CPU check of the named call: one line, a `cpu_check` row, and
    /// the final verdict holds it.
    fn checked(&mut self, found: cpu_check::Found) {
        let Some(call) = self.fold.named().cloned() else {
            return;
        };
        let captured = (self.setup.hooks.captured_as)();
        let on = captured
            .as_deref()
            .map(|s| format!(" (the call {s})"))
            .unwrap_or_default();
        let line = match (cpu_check::device_is_off(&found), found.device_err, found.cpu_err) {
            (Some(true), Some(d), Some(c)) => format!(
                "{} is off at {}{on}: {d:.1e} from float64, where the CPU in {} is {c:.1e}",
                found.device,
                call.label(),
                found.dtype
            ),
            (Some(false), Some(d), Some(c)) => format!(
                "{} agrees with float64 at {}{on} ({d:.1e}; the CPU in {} is {c:.1e}): the device of \
                 OPDUMP_REFERENCE is the one that is off",
                found.device,
                call.label(),
                found.dtype
            ),
            _ => format!(
                "{}{on} was not checked on the CPU: {}",
                call.label(),
                found.why.as_deref().unwrap_or("nothing was compared")
            ),
        };
        self.say(&line);
        let row = CpuCheckLine {
            kind: Kind::CpuCheck,
            call: call.label(),
            captured,
            device_is_off: cpu_check::device_is_off(&found),
            found,
        };
        self.write(&row);
        self.fold.cpu_check = Some(row);
    }

    /// The first introduced divergence: one line; then the same call of a
    /// later step is captured (and checked on the CPU), and with
    /// OPDUMP_ON_DIVERGENCE=stop the job is stopped once it is.
    fn name(&mut self, call: &CallRef) {
        let verdicts = self.file.as_ref().map_or_else(
            || self.setup.dir.join(Table::Verdicts.dir()),
            |f| f.path.clone(),
        );
        self.say(&format!(
            "step {}, {}: {} introduced a divergence from OPDUMP_REFERENCE: {}. Capturing that call ({}) in the \
             next step that makes it; verdicts in {}",
            call.step,
            call.phase,
            call.label(),
            call.error_text(),
            call.selector.replace(&format!("@step={}", call.step), ""),
            verdicts.display()
        ));
        // When the job waits at the end of the step for this verdict, the
        // same call of the step it is about to begin is the one.
        boundary::named(call.step, |start| {
            if let (Some(c), Ok(list)) = (
                crate::capture::installed(),
                opdump_format::selector::parse_list(&call.selector),
            ) {
                if let Some(s) = list.first() {
                    match start {
                        Some(step) => c.arm_from(s, step),
                        None => c.arm(s),
                    }
                }
            }
        });
        if self.setup.on_divergence == OnDivergence::Stop {
            stop::request(format!(
                "opdump: OPDUMP_ON_DIVERGENCE=stop: {} introduced a divergence from OPDUMP_REFERENCE at step {} \
                 ({}); the job is stopped. Verdicts: {}; the capture and the dump: {}",
                call.label(),
                call.step,
                call.error_text(),
                verdicts.display(),
                self.setup.dir.display()
            ));
            // The job is being stopped: what runs from here on (its error
            // handling) is not the reference's program.
            self.off = true;
        }
    }

    fn say_final(&self, row: &FinalLine) {
        if row.outcome == opdump_judge::Outcome::Agree.as_str() {
            return;
        }
        if let (Some(h), "dominant") = (&row.headline, row.headline_rule.as_deref().unwrap_or("")) {
            self.say(&format!(
                "judged against OPDUMP_REFERENCE: the headline is {} at step {} ({}), which went ten times further \
                 beyond its allowance than the first introduced call",
                h.label(),
                h.step,
                h.error_text()
            ));
        }
    }

    fn write(&mut self, row: &impl serde::Serialize) {
        if self.write_failed {
            return;
        }
        if self.file.is_none() {
            let s = &self.setup;
            match JsonLines::create(
                &s.dir,
                Table::Verdicts,
                (s.rank)(),
                s.pid,
                s.file_mode,
                s.dir_mode,
            ) {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    self.write_failed = true;
                    return self.stop_comparing(&format!(
                        "the verdict file under {}/verdicts cannot be created ({e})",
                        s.dir.display()
                    ));
                }
            }
        }
        if let Some(f) = self.file.as_mut() {
            if let Err(e) = f.append(row) {
                let path = f.path.display().to_string();
                self.write_failed = true;
                self.stop_comparing(&format!("writing {path} failed ({e})"));
            }
        }
    }
}
