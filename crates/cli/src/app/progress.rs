//! Progress on stderr, only when stderr is a terminal: a long compare shows
//! where it is, and a piped or captured run stays quiet.

use std::io::{IsTerminal, Write};
use std::sync::Mutex;
use std::time::{Duration, Instant};

use opdump_judge::Observer;

pub struct Progress {
    enabled: bool,
    state: Mutex<State>,
}

struct State {
    last: Option<Instant>,
    shown: bool,
}

impl Progress {
    /// Shows progress when stderr is a terminal.
    pub fn auto() -> Self {
        Self::new(std::io::stderr().is_terminal())
    }

    pub fn new(enabled: bool) -> Self {
        Progress {
            enabled,
            state: Mutex::new(State {
                last: None,
                shown: false,
            }),
        }
    }

    /// Shows `msg`, at most ten times a second.
    pub fn update(&self, msg: impl FnOnce() -> String) {
        if !self.enabled {
            return;
        }
        let Ok(mut st) = self.state.lock() else {
            return;
        };
        let now = Instant::now();
        if st
            .last
            .is_some_and(|t| now.duration_since(t) < Duration::from_millis(100))
        {
            return;
        }
        st.last = Some(now);
        st.shown = true;
        let mut err = std::io::stderr().lock();
        let _ = write!(err, "\r\x1b[2K{}", msg());
        let _ = err.flush();
    }

    /// Shows a step at once (a phase change).
    pub fn phase(&self, msg: &str) {
        if let Ok(mut st) = self.state.lock() {
            st.last = None;
        }
        self.update(|| msg.to_string());
    }

    /// Clears the line before the report is printed.
    pub fn finish(&self) {
        if !self.enabled {
            return;
        }
        if let Ok(mut st) = self.state.lock() {
            if st.shown {
                let _ = write!(std::io::stderr(), "\r\x1b[2K");
                st.shown = false;
            }
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.finish();
    }
}

/// With `OPDUMP_TIMINGS=1`, each phase's wall time goes to stderr (for
/// benchmarking; not part of the interface).
pub(crate) fn timing(label: &str, since: std::time::Instant) {
    if std::env::var_os("OPDUMP_TIMINGS").is_some_and(|v| v == "1") {
        eprintln!(
            "opdump: timing: {label}: {:.3}s{}",
            since.elapsed().as_secs_f64(),
            memory_now()
        );
    }
}

/// The resident set now and its peak so far (`/proc/self/status`), for
/// [`timing`]; empty where that file is not there.
fn memory_now() -> String {
    let Ok(s) = std::fs::read_to_string("/proc/self/status") else {
        return String::new();
    };
    let field = |k: &str| {
        s.lines()
            .find_map(|l| l.strip_prefix(k))
            .and_then(|v| v.split_whitespace().next()?.parse::<u64>().ok())
            .map_or("?".to_string(), |kb| format!("{} MB", kb / 1024))
    };
    format!(" (RSS {}, peak {})", field("VmRSS:"), field("VmHWM:"))
}

impl Observer for Progress {
    fn update(&self, msg: &dyn Fn() -> String) {
        Progress::update(self, msg)
    }

    fn phase(&self, msg: &str) {
        Progress::phase(self, msg)
    }

    fn finish(&self) {
        Progress::finish(self)
    }

    fn stage_done(&self, stage: &str, since: std::time::Instant) {
        timing(stage, since)
    }
}
