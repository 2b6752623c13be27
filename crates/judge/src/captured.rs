//! Captured values of tensors (`OPDUMP_CAPTURE`), which a comparison reads
//! for exact metrics where both sides have them.

use std::sync::Arc;

use opdump_format::capture::CaptureFile;

/// Where a dump's captured values come from: the CLI opens the safetensors
/// files a dump names, the plugin would hand over the tensors it holds.
pub trait CapturedValues: Send + Sync {
    /// The capture file named `file` by a dump's rows (its path, as
    /// written), when it can be read.
    fn file(&self, file: &str) -> Option<Arc<CaptureFile>>;
}

/// No captured values: every tensor is compared by its statistics.
#[derive(Clone, Copy, Debug, Default)]
pub struct NoCaptures;

impl CapturedValues for NoCaptures {
    fn file(&self, _file: &str) -> Option<Arc<CaptureFile>> {
        None
    }
}
