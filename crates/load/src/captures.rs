//! The capture files of a dump (`OPDUMP_CAPTURE`), opened when a comparison
//! first needs one and kept for the rest of it.

use std::collections::HashMap;
use std::path::Path;
use std::sync::{Arc, Mutex};

use opdump_format::capture::CaptureFile;
use opdump_judge::CapturedValues;

/// Capture files by path; a file that cannot be read is remembered as such
/// (and said once).
#[derive(Default)]
pub struct CaptureCache {
    files: Mutex<HashMap<String, Option<Arc<CaptureFile>>>>,
}

impl CapturedValues for CaptureCache {
    fn file(&self, path: &str) -> Option<Arc<CaptureFile>> {
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
