//! The check's file writer: one thread of opdump's own
//! (`opdump_fsguard::spawn`) writes every line and capture file of
//! `<OPDUMP_DIR>/checks/rank=<R>/`. The job's thread decides a call's
//! verdict without a reference (`Checks::wanted`) and writes the summary at
//! exit; the checking thread measures; neither writes a file. A write past
//! `ulimit -f` then fails here as a full disk, is counted, and never kills
//! the job.

use std::path::Path;
use std::time::Duration;

use crossbeam_channel::{bounded, unbounded, Sender};
use opdump_format::tables::check::{CheckLine, CheckSummary};
use opdump_format::tables::Table;
use opdump_format::{capture as capture_file, Capture, OpRecord};

use super::{CallInfo, Settings};
use crate::jsonl::JsonLines;

/// What the writer is given, in the order it writes. Rows are large and
/// go by value: the channel holds few at a time.
#[allow(clippy::large_enum_variant)]
pub(super) enum Line {
    Row(CheckLine),
    /// A failed call: its capture file, then its lines naming the file
    /// (a list op has one per list index).
    Failed(Box<(Vec<CheckLine>, CallInfo, Capture)>),
    /// The last line: the summary, counted with this thread's failed writes
    /// and handed back for the exit line.
    Summary(CheckSummary, Sender<CheckSummary>),
    /// Answered once every line before it is written.
    Barrier(Sender<()>),
}

pub(super) struct Writer {
    tx: Sender<Line>,
}

impl Writer {
    pub fn start(settings: Settings) -> std::io::Result<Writer> {
        let (tx, rx) = unbounded();
        let mut out = Output {
            settings,
            file: None,
            refused: false,
            next_capture: 0,
            rank: None,
            failures: 0,
        };
        opdump_fsguard::spawn("opdump-check-writer", move || {
            for line in rx {
                out.take(line);
            }
        })?;
        Ok(Writer { tx })
    }

    /// False when the thread is gone (the line is lost: count it).
    pub fn send(&self, line: Line) -> bool {
        self.tx.send(line).is_ok()
    }

    /// Whether every line sent before was written within `wait`.
    pub fn sync(&self, wait: Duration) -> bool {
        let (tx, rx) = bounded(1);
        self.send(Line::Barrier(tx)) && rx.recv_timeout(wait).is_ok()
    }

    /// Writes the summary line after every line sent before it; the
    /// summary as written, or `None` when the thread did not answer in
    /// `wait`.
    pub fn summary(&self, summary: CheckSummary, wait: Duration) -> Option<CheckSummary> {
        let (tx, rx) = bounded(1);
        if !self.send(Line::Summary(summary, tx)) {
            return None;
        }
        rx.recv_timeout(wait).ok()
    }
}

struct Output {
    settings: Settings,
    file: Option<JsonLines>,
    /// The file could not be made: said once, nothing more is tried.
    refused: bool,
    next_capture: u64,
    rank: Option<u32>,
    /// Lines and capture files that could not be written.
    failures: u64,
}

impl Output {
    fn take(&mut self, line: Line) {
        match line {
            Line::Row(row) => {
                self.rank.get_or_insert(row.call.rank);
                self.append(&row);
            }
            Line::Failed(failed) => {
                let (rows, call, capture) = *failed;
                self.rank.get_or_insert(call.rank);
                let file = self.write_capture(&call, capture);
                for mut row in rows {
                    row.call.capture.clone_from(&file);
                    self.append(&row);
                }
            }
            Line::Barrier(back) => {
                let _ = back.send(());
            }
            Line::Summary(mut summary, back) => {
                summary.rank = self.rank.unwrap_or(0);
                summary.write_failures += self.failures;
                let written = self.append_ready()
                    && self
                        .file
                        .as_mut()
                        .is_some_and(|f| f.append(&summary).is_ok());
                if !written {
                    summary.write_failures += 1;
                }
                let _ = back.send(summary);
            }
        }
    }

    fn append(&mut self, row: &CheckLine) {
        let ok = self.append_ready() && self.file.as_mut().is_some_and(|f| f.append(row).is_ok());
        if !ok {
            self.failures += 1;
        }
    }

    /// Makes the file if it is not there yet (said once when it cannot
    /// be); whether it is there.
    fn append_ready(&mut self) -> bool {
        if self.file.is_none() && !self.refused {
            let p = &self.settings;
            match JsonLines::create(
                &p.dir,
                Table::Checks,
                self.rank.unwrap_or(0),
                p.pid,
                p.file_mode,
                p.dir_mode,
            ) {
                Ok(f) => self.file = Some(f),
                Err(e) => {
                    self.refused = true;
                    (p.say)(&format!(
                        "cannot write the accuracy check's results under {}/checks ({e}); the checks' verdicts are lost. \
                         Free space or fix the permissions under OPDUMP_DIR",
                        p.dir.display()
                    ));
                }
            }
        }
        self.file.is_some()
    }

    /// Writes the capture file of a failed call beside the check's lines;
    /// its path relative to OPDUMP_DIR, or `None` (counted).
    fn write_capture(&mut self, call: &CallInfo, capture: Capture) -> Option<String> {
        let rec = OpRecord {
            seq: call.seq,
            parent_seq: None,
            depth: 0,
            pid: self.settings.pid,
            thread: 0,
            step: call.step,
            phase: call.phase,
            op: call.op.clone().into(),
            overload: call.overload.clone().into(),
            args: call.args.clone(),
            start_ns: 0,
            duration_ns: 0,
            error: None,
            module: call.module.clone().map(Into::into),
            fwd_seq: None,
            source: None,
            tensors: Vec::new(),
            capture: Some(capture),
        };
        let written = capture_file::serialize(&rec)
            .map_err(std::io::Error::other)
            .and_then(|bytes| {
                if !self.append_ready() {
                    // Said once already: the results cannot be written at all.
                    return Err(std::io::Error::from(std::io::ErrorKind::NotFound));
                }
                loop {
                    let name = capture_file::file_name(self.settings.pid, self.next_capture);
                    self.next_capture += 1;
                    let Some(file) = self.file.as_mut() else {
                        return Err(std::io::Error::from(std::io::ErrorKind::NotFound));
                    };
                    match file.write_beside(&name, &bytes) {
                        Ok(_) => {
                            let dir = Table::Checks.rank_dir(Path::new(""), self.rank.unwrap_or(0));
                            return Ok(dir.join(name).display().to_string());
                        }
                        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => continue,
                        Err(e) => return Err(e),
                    }
                }
            });
        match written {
            Ok(path) => Some(path),
            Err(e) => {
                self.failures += 1;
                if !self.refused {
                    (self.settings.say)(&format!(
                        "writing the capture file of a failed check of {} failed ({e}); its line names no file. Free space under OPDUMP_DIR",
                        call.op
                    ));
                }
                None
            }
        }
    }
}
