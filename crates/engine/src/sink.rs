//! The record path after C++: a bounded channel and one named writer thread
//! that drains it into Parquet, one rotating writer per device partition.
//!
//! Modelled on tracing-appender's non-blocking writer: bounded channel, named
//! worker, explicit flush and shutdown with bounded waits. The producer never
//! waits longer than the configured bound, so a stalled disk cannot hang the
//! job; what is dropped or lost is counted.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use crossbeam_channel::{bounded, Receiver, SendTimeoutError, Sender, TryRecvError, TrySendError};
use opdump_format::schema::meta;
use opdump_format::{OpRecord, Role, RotateOptions, RotatingWriter, TensorRecord};

use crate::config::{Config, QueueFull};
use crate::online::Feed;

/// How often the writer wakes up to rotate files by age.
const TICK: Duration = Duration::from_millis(200);
/// How long the writer sleeps when the queue is empty: it starts at
/// IDLE_MIN and doubles up to IDLE_MAX while the queue stays empty.
const IDLE_MIN: Duration = Duration::from_millis(1);
const IDLE_MAX: Duration = Duration::from_millis(16);

/// Counts of what happened to records, for `torch.ops.opdump.stats()` and the
/// exit report.
#[derive(Default)]
pub struct Counters {
    /// Op calls handed to the channel.
    pub enqueued: AtomicU64,
    /// Op calls in complete, visible files.
    pub written: AtomicU64,
    /// Op calls dropped because the channel stayed full.
    pub dropped: AtomicU64,
    /// Op calls lost because writing failed.
    pub failed: AtomicU64,
    /// Capture files that could not be written (their rows name none).
    pub captures_failed: AtomicU64,
}

/// The tensor rows of a record still in the hook's own form: made into
/// [`TensorRecord`]s on the writer's thread. On the job's thread they would
/// be copied once more, and each row's sizes and strides allocated there:
/// memory the writer frees on its own core, which the job's core then
/// writes cold at its next call.
pub trait LaterRows: Send {
    fn into_records(self: Box<Self>) -> Result<Vec<TensorRecord>, String>;
}

// Nearly every message is a record: boxing it would add an allocation per op
// call to spare the rare Flush and Stop their unused bytes.
#[allow(clippy::large_enum_variant)]
enum Msg {
    /// A record, with its tensor rows still to make when they are given.
    Record(OpRecord, Option<Box<dyn LaterRows>>),
    /// Complete every open file, then answer.
    Flush(Sender<()>),
    /// The job ended this step and waits for its verdict against
    /// OPDUMP_REFERENCE: every record of it was sent before.
    StepEnd(i64),
    Stop,
}

/// What the writer needs to name and describe its files.
pub struct SinkSetup {
    pub dir: PathBuf,
    /// Resolved at the first record (the job may initialise torch.distributed
    /// after switching opdump on).
    pub rank: fn() -> u32,
    pub local_rank: fn() -> u32,
    pub pid: i32,
    pub torch_version: String,
    /// Set from a SIGTERM handler: drain, complete the files, then call
    /// `on_terminated` (which ends the process).
    pub terminate: &'static AtomicBool,
    pub on_terminated: fn(),
    /// Called by the writer after a SIGTERM, between two drains of the
    /// channel: brings in the records that still wait for the device.
    pub before_terminating: fn(),
    /// Called once from the writer thread when writing fails for good.
    pub on_failure: fn(),
    /// Called from the writer thread when a record's rows cannot be made
    /// (an opdump bug): says so and switches opdump off.
    pub on_internal_error: fn(&str),
    /// The parent's pid, for a forked child that records.
    pub forked_from: Option<i32>,
    pub file_mode: u32,
    pub dir_mode: u32,
    /// Judge the records against a reference as they are written
    /// (OPDUMP_REFERENCE).
    pub online: Option<crate::online::Setup>,
}

pub struct Sink {
    tx: Sender<Msg>,
    worker: Mutex<Option<JoinHandle<()>>>,
    pub counters: Arc<Counters>,
    policy: QueueFull,
    wait: Duration,
    /// Set after a send timed out: later sends do not wait again until the
    /// writer catches up, so a hung disk costs the job one wait, not one per op.
    stalled: AtomicBool,
}

impl Sink {
    pub fn start(config: &Config, mut setup: SinkSetup) -> std::io::Result<Sink> {
        let (tx, rx) = bounded(config.queue);
        let feed = setup.online.take().map(Feed::start).transpose()?;
        let counters = Arc::new(Counters::default());
        let opts = RotateOptions {
            max_rows: config.rotate_rows,
            max_age: config.rotate_every,
            file_mode: setup.file_mode,
            dir_mode: setup.dir_mode,
            ..RotateOptions::default()
        };
        let worker = Worker {
            setup,
            opts,
            writers: HashMap::new(),
            counters: counters.clone(),
            failed: false,
            feed,
        };
        // A write past a file-size limit fails with EFBIG on this thread
        // (handled as a full disk) instead of SIGXFSZ killing the job.
        let handle = opdump_fsguard::spawn("opdump-writer", move || worker.run(rx))?;
        Ok(Sink {
            tx,
            worker: Mutex::new(Some(handle)),
            counters,
            policy: config.queue_full,
            wait: config.queue_wait,
            stalled: AtomicBool::new(false),
        })
    }

    /// Hands one record to the writer, waiting at most the configured bound.
    pub fn send(&self, rec: OpRecord, later: Option<Box<dyn LaterRows>>) {
        let result = match self.policy {
            // A queue with room takes the record without the clock reading
            // that a deadline costs; only a full one waits.
            QueueFull::Block if !self.stalled.load(Ordering::Relaxed) => {
                match self.tx.try_send(Msg::Record(rec, later)) {
                    Ok(()) => Ok(()),
                    Err(TrySendError::Disconnected(_)) => Err(()),
                    Err(TrySendError::Full(msg)) => match self.tx.send_timeout(msg, self.wait) {
                        Ok(()) => Ok(()),
                        Err(SendTimeoutError::Timeout(_)) => {
                            if !self.stalled.swap(true, Ordering::Relaxed) {
                                eprintln!(
                                    "opdump: the writer has not taken a record for {} ms (a slow or hung disk?); \
                                     records are dropped and counted until it catches up. Point OPDUMP_DIR at a faster disk, \
                                     or wait longer with OPDUMP_QUEUE_WAIT_MS",
                                    self.wait.as_millis()
                                );
                            }
                            Err(())
                        }
                        Err(SendTimeoutError::Disconnected(_)) => Err(()),
                    },
                }
            }
            _ => match self.tx.try_send(Msg::Record(rec, later)) {
                Ok(()) => {
                    self.stalled.store(false, Ordering::Relaxed);
                    Ok(())
                }
                Err(TrySendError::Full(_) | TrySendError::Disconnected(_)) => Err(()),
            },
        };
        match result {
            Ok(()) => self.counters.enqueued.fetch_add(1, Ordering::Relaxed),
            Err(()) => self.counters.dropped.fetch_add(1, Ordering::Relaxed),
        };
    }

    /// Waits until everything sent so far is in complete, visible files.
    pub fn flush(&self, timeout: Duration) -> bool {
        let (reply_tx, reply_rx) = bounded(1);
        if self.tx.send_timeout(Msg::Flush(reply_tx), timeout).is_err() {
            return false;
        }
        reply_rx.recv_timeout(timeout).is_ok()
    }

    /// The job ended `step` and waits for its verdict (online compare):
    /// once the writer has written what was sent before, it hands the step
    /// to the judge. False when the channel stayed full for `timeout`.
    pub fn step_ended(&self, step: i64, timeout: Duration) -> bool {
        self.tx.send_timeout(Msg::StepEnd(step), timeout).is_ok()
    }

    /// Writes everything queued, completes the files and stops the writer.
    pub fn shutdown(&self, timeout: Duration) -> bool {
        let Some(handle) = self.worker.lock().ok().and_then(|mut w| w.take()) else {
            return true;
        };
        if self.tx.send_timeout(Msg::Stop, timeout).is_err() {
            return false;
        }
        let deadline = Instant::now() + timeout;
        while !handle.is_finished() {
            if Instant::now() >= deadline {
                return false;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        handle.join().is_ok()
    }
}

struct Worker {
    setup: SinkSetup,
    opts: RotateOptions,
    writers: HashMap<String, RotatingWriter>,
    counters: Arc<Counters>,
    failed: bool,
    feed: Option<Feed>,
}

/// How long the last step's judging may take at exit.
const JUDGE_AT_EXIT: Duration = Duration::from_secs(60);

/// `cuda:0` -> `cuda_0`: a directory name for a device.
fn device_dir(device: &str) -> String {
    device.replace(':', "_")
}

/// An op's rows go to the partition of its first output's device, else its
/// first input's, else `cpu`.
fn partition_of(rec: &OpRecord) -> &str {
    rec.tensors
        .iter()
        .find(|t| t.role == Role::Output)
        .or_else(|| rec.tensors.first())
        .map_or("cpu", |t| &*t.device)
}

impl Worker {
    fn run(mut self, rx: Receiver<Msg>) {
        let mut last_tick = Instant::now();
        let mut idle = IDLE_MIN;
        loop {
            // Rotation by age must not wait for an idle channel.
            if last_tick.elapsed() >= TICK {
                self.tick();
                last_tick = Instant::now();
            }
            if self.setup.terminate.load(Ordering::SeqCst) {
                // What is queued, then what the device still owed (sent while
                // the channel has room again), then that.
                for pass in 0..2 {
                    while let Ok(msg) = rx.try_recv() {
                        if let Msg::Record(rec, later) = msg {
                            self.write(rec, later);
                        }
                    }
                    if pass == 0 {
                        (self.setup.before_terminating)();
                    }
                }
                self.close_all();
                self.finish_judging();
                (self.setup.on_terminated)();
                return;
            }
            // The writer polls instead of blocking in recv: a receiver parked
            // in the channel makes every send a futex wake-up, a system call
            // per op on the job's thread. Sleeping between polls leaves sends
            // lock-free; a flush waits at most IDLE_MAX longer.
            match rx.try_recv() {
                Ok(Msg::Record(rec, later)) => {
                    idle = IDLE_MIN;
                    self.write(rec, later);
                }
                Ok(Msg::Flush(reply)) => {
                    idle = IDLE_MIN;
                    self.close_all();
                    let _ = reply.send(());
                }
                Ok(Msg::StepEnd(step)) => {
                    idle = IDLE_MIN;
                    if let Some(feed) = self.feed.as_mut() {
                        feed.step_ended(step);
                    }
                }
                Ok(Msg::Stop) | Err(TryRecvError::Disconnected) => {
                    // Take the records still queued, then stop.
                    while let Ok(msg) = rx.try_recv() {
                        if let Msg::Record(rec, later) = msg {
                            self.write(rec, later);
                        }
                    }
                    self.close_all();
                    self.finish_judging();
                    return;
                }
                Err(TryRecvError::Empty) => {
                    std::thread::sleep(idle);
                    idle = (idle * 2).min(IDLE_MAX);
                }
            }
        }
    }

    fn writer_for(&mut self, device: &str) -> &mut RotatingWriter {
        let key = device_dir(device);
        let s = &self.setup;
        let opts = &self.opts;
        self.writers.entry(key.clone()).or_insert_with(|| {
            let rank = (s.rank)();
            // Created and entered below OPDUMP_DIR without following links.
            let levels = vec![format!("rank={rank}"), format!("device={key}")];
            let accumulate = if device.starts_with("mps") {
                "float32"
            } else {
                "float64"
            };
            let metadata = vec![
                (
                    meta::PLUGIN_VERSION.to_string(),
                    env!("CARGO_PKG_VERSION").to_string(),
                ),
                (meta::TORCH_VERSION.to_string(), s.torch_version.clone()),
                (meta::PID.to_string(), s.pid.to_string()),
                (meta::RANK.to_string(), rank.to_string()),
                (meta::LOCAL_RANK.to_string(), (s.local_rank)().to_string()),
                (meta::DEVICE.to_string(), device.to_string()),
                (meta::STATS_ACCUMULATE.to_string(), accumulate.to_string()),
            ];
            let mut metadata = metadata;
            if let Some(parent) = s.forked_from {
                metadata.push((meta::FORKED_FROM.to_string(), parent.to_string()));
            }
            RotatingWriter::in_partition(
                &s.dir,
                levels,
                format!("part-{}", s.pid),
                opts.clone(),
                metadata,
            )
        })
    }

    fn write(&mut self, mut rec: OpRecord, later: Option<Box<dyn LaterRows>>) {
        if self.failed {
            self.counters.failed.fetch_add(1, Ordering::Relaxed);
            return;
        }
        if let Some(rows) = later {
            match rows.into_records() {
                Ok(tensors) => rec.tensors = tensors,
                Err(why) => {
                    self.counters.failed.fetch_add(1, Ordering::Relaxed);
                    return (self.setup.on_internal_error)(&format!(
                        "internal error at an op's exit ({why})"
                    ));
                }
            }
        }
        let device = partition_of(&rec).to_string();
        let w = self.writer_for(&device);
        // The capture file first, so that the rows can name it; a capture
        // that cannot be written costs its file, not the dump.
        let capture_failed = w.write_capture(&mut rec).err();
        let before = w.ops_written();
        let result = w.append(&rec);
        let done = w.ops_written() - before;
        self.counters.written.fetch_add(done, Ordering::Relaxed);
        if let Some(e) = capture_failed {
            if self
                .counters
                .captures_failed
                .fetch_add(1, Ordering::Relaxed)
                == 0
            {
                eprintln!(
                    "opdump: writing a capture file failed ({e}); the call's rows name no file. Free space under OPDUMP_DIR, or lower OPDUMP_CAPTURE_MAX_BYTES"
                );
            }
        }
        if let Err(e) = result {
            return self.fail(&e);
        }
        if let Some(feed) = self.feed.as_mut() {
            // Judging reads statistics only; the captured bytes are written.
            rec.capture = None;
            feed.offer(rec);
        }
    }

    fn finish_judging(&mut self) {
        if let Some(feed) = self.feed.as_mut() {
            feed.finish(JUDGE_AT_EXIT);
        }
    }

    fn tick(&mut self) {
        let now = Instant::now();
        let mut error = None;
        for w in self.writers.values_mut() {
            let before = w.ops_written();
            if let Err(e) = w.tick(now) {
                error = Some(e);
            }
            self.counters
                .written
                .fetch_add(w.ops_written() - before, Ordering::Relaxed);
        }
        if let Some(e) = error {
            self.fail(&e);
        }
    }

    fn close_all(&mut self) {
        if self.failed {
            return;
        }
        let mut error = None;
        for w in self.writers.values_mut() {
            let before = w.ops_written();
            if let Err(e) = w.close_file() {
                error = Some(e);
            }
            self.counters
                .written
                .fetch_add(w.ops_written() - before, Ordering::Relaxed);
        }
        if let Some(e) = error {
            self.fail(&e);
        }
    }

    /// Writing failed (disk full, a file-size limit, permissions): stop
    /// writing for good, remove incomplete files, count what is lost.
    fn fail(&mut self, e: &opdump_format::Error) {
        self.failed = true;
        let lost: u64 = self.writers.values_mut().map(|w| w.abandon()).sum();
        self.counters.failed.fetch_add(lost, Ordering::Relaxed);
        eprintln!(
            "opdump: writing the dump failed ({e}); opdump stops recording. \
             {lost} op calls were lost; the job goes on unchanged. The files written \
             before stay readable: free space (or raise the limit) under OPDUMP_DIR, or \
             record less (OPDUMP_STEPS, OPDUMP_INCLUDE, OPDUMP_MAX_RECORDS), and run again"
        );
        (self.setup.on_failure)();
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use opdump_format::reader::list_files;
    use opdump_format::{Phase, Stats, StatsStatus, TensorRecord};
    use opdump_testkit::records::read_records;

    static NEVER: AtomicBool = AtomicBool::new(false);

    fn setup(dir: &std::path::Path) -> SinkSetup {
        SinkSetup {
            dir: dir.to_path_buf(),
            rank: || 2,
            local_rank: || 0,
            pid: 4242,
            torch_version: "0.0-test".into(),
            terminate: &NEVER,
            on_terminated: || {},
            before_terminating: || {},
            on_failure: || {},
            on_internal_error: |_| {},
            forked_from: None,
            file_mode: 0o600,
            dir_mode: 0o700,
            online: None,
        }
    }

    fn record(seq: i64, device: &str) -> OpRecord {
        let t = |role| TensorRecord {
            role,
            arg: "self".into(),
            list_index: None,
            dtype: "float32".into(),
            shape: vec![4],
            stride: vec![1],
            device: device.to_string().into(),
            numel: 4,
            name: None,
            capture_key: None,
            fingerprint: None,
            sketch: None,
            status: StatsStatus::Computed,
            stats: Stats {
                min: -1.0,
                max: 1.0,
                mean: 0.0,
                std: 1.0,
                l2: 2.0,
                absmax: 1.0,
                ..Stats::NONE
            },
        };
        OpRecord {
            seq,
            parent_seq: None,
            depth: 0,
            pid: 4242,
            thread: 1,
            step: 0,
            phase: Phase::Forward,
            op: "aten::relu".into(),
            overload: "default".into(),
            args: String::new(),
            start_ns: 0,
            duration_ns: 1,
            error: None,
            module: None,
            fwd_seq: None,
            source: None,
            capture: None,
            tensors: vec![t(Role::Input), t(Role::Output)],
        }
    }

    fn seqs(dir: &std::path::Path) -> Vec<i64> {
        let mut out: Vec<i64> = list_files(dir)
            .unwrap()
            .iter()
            .flat_map(|f| read_records(&f.path).unwrap())
            .map(|r| r.seq)
            .collect();
        out.sort_unstable();
        out
    }

    #[test]
    fn partitions_by_rank_and_device_and_counts_what_it_writes() {
        let tmp = tempfile::tempdir().unwrap();
        let sink = Sink::start(&Config::default(), setup(tmp.path())).unwrap();
        for s in 0..10 {
            sink.send(record(s, if s % 2 == 0 { "cpu" } else { "cuda:1" }), None);
        }
        assert!(sink.flush(Duration::from_secs(10)));
        assert_eq!(sink.counters.written.load(Ordering::Relaxed), 10);
        let cpu = tmp.path().join("rank=2/device=cpu");
        let cuda = tmp.path().join("rank=2/device=cuda_1");
        assert_eq!(seqs(&cpu), [0, 2, 4, 6, 8]);
        assert_eq!(seqs(&cuda), [1, 3, 5, 7, 9]);
        assert!(sink.shutdown(Duration::from_secs(10)));
    }

    #[test]
    fn shutdown_writes_everything_queued() {
        let tmp = tempfile::tempdir().unwrap();
        let sink = Sink::start(&Config::default(), setup(tmp.path())).unwrap();
        for s in 0..2000 {
            sink.send(record(s, "cpu"), None);
        }
        assert!(sink.shutdown(Duration::from_secs(30)));
        assert_eq!(
            seqs(&tmp.path().join("rank=2/device=cpu")),
            (0..2000).collect::<Vec<_>>()
        );
        let c = &sink.counters;
        assert_eq!(c.written.load(Ordering::Relaxed), 2000);
        assert_eq!(
            c.dropped.load(Ordering::Relaxed) + c.failed.load(Ordering::Relaxed),
            0
        );
    }

    /// Sends 5000 records through a one-slot channel, shuts down, and checks
    /// that every record was either written or dropped, once. Returns the
    /// number dropped.
    fn flood_one_slot(config: Config) -> u64 {
        let tmp = tempfile::tempdir().unwrap();
        let config = Config { queue: 1, ..config };
        let sink = Sink::start(&config, setup(tmp.path())).unwrap();
        for s in 0..5000 {
            sink.send(record(s, "cpu"), None);
        }
        assert!(sink.shutdown(Duration::from_secs(30)));
        let c = &sink.counters;
        let (enqueued, dropped) = (
            c.enqueued.load(Ordering::Relaxed),
            c.dropped.load(Ordering::Relaxed),
        );
        assert_eq!(enqueued + dropped, 5000);
        assert_eq!(c.written.load(Ordering::Relaxed), enqueued);
        assert_eq!(
            seqs(&tmp.path().join("rank=2/device=cpu")).len() as u64,
            enqueued
        );
        dropped
    }

    #[test]
    fn drop_policy_counts_every_record_once() {
        let dropped = flood_one_slot(Config {
            queue_full: QueueFull::Drop,
            ..Config::default()
        });
        assert!(
            dropped > 0,
            "a one-slot channel took 5000 records without a drop"
        );
    }

    #[test]
    fn block_policy_with_no_wait_drops_and_counts() {
        // With `block` and a zero wait, a send into the full queue waits no
        // time: the record is dropped and counted, never lost silently.
        flood_one_slot(Config {
            queue_wait: Duration::ZERO,
            ..Config::default()
        });
    }
}
