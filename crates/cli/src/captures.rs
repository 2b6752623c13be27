//! The capture files of a dump (`OPDUMP_CAPTURE`), opened when a comparison
//! first needs one and kept for the rest of it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use opdump_format::capture::{CaptureFile, SavedTensor};

use crate::exact::{self, ExactMetrics};

/// Capture files by path; a file that cannot be read is remembered as such
/// (and said once).
#[derive(Default)]
pub struct CaptureCache {
    files: Mutex<HashMap<String, Option<Arc<CaptureFile>>>>,
}

impl CaptureCache {
    pub fn get(&self, path: &str) -> Option<Arc<CaptureFile>> {
        let mut files = self.files.lock().ok()?;
        files
            .entry(path.to_string())
            .or_insert_with(|| match CaptureFile::open(Path::new(path)) {
                Ok(f) => Some(Arc::new(f)),
                Err(e) => {
                    eprintln!("opdump: cannot read capture file {e}; its tensors are compared by their statistics");
                    None
                }
            })
            .clone()
    }
}

/// The exact metrics of tensor `ta` of `a` against `tb` of `b`, when both
/// were captured: `tol` is the op's relative tolerance.
pub fn exact_metrics(
    a: &crate::dump::Dump,
    ta: u32,
    b: &crate::dump::Dump,
    tb: u32,
    tol: f64,
) -> Option<ExactMetrics> {
    let ((fa, ka), (fb, kb)) = (a.capture_of(ta)?, b.capture_of(tb)?);
    let (xa, xb) = (a.captures.get(fa)?, b.captures.get(fb)?);
    let (sa, sb): (SavedTensor<'_>, SavedTensor<'_>) = (xa.tensor(ka)?, xb.tensor(kb)?);
    exact::compare(&sa, &sb, tol).ok()
}
