//! What the judge tells whoever watches a long comparison.

use std::time::Instant;

/// Progress of a long load or comparison. The CLI shows it on a terminal;
/// a caller that does not care passes [`Silent`].
pub trait Observer: Sync {
    /// Where a long pass is now; `msg` is called only when it is shown.
    fn update(&self, msg: &dyn Fn() -> String);

    /// A new stage begins.
    fn phase(&self, msg: &str);

    /// The work is done: whatever was shown can be cleared.
    fn finish(&self) {}

    /// A stage named `stage` that began at `since` ended (for timings).
    fn stage_done(&self, _stage: &str, _since: Instant) {}
}

/// An observer that shows nothing.
#[derive(Clone, Copy, Debug, Default)]
pub struct Silent;

impl Observer for Silent {
    fn update(&self, _msg: &dyn Fn() -> String) {}

    fn phase(&self, _msg: &str) {}
}
