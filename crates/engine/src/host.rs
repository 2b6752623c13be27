//! What only the torch side can do, as plain functions the bridge hands in
//! at load. The engine calls them and never sees a torch type; tests hand in
//! fakes.

use std::sync::OnceLock;

/// The torch side of the plugin.
#[derive(Clone, Copy)]
pub struct Host {
    /// Registers the fallback, the custom ops and the thread hook, after
    /// checking the dispatcher for another copy. False when it did not.
    pub install: fn() -> bool,
    /// Switches the C++ hook on or off for every thread.
    pub set_active: fn(bool),
    /// The version of the torch this process runs.
    pub torch_version: fn() -> String,
    /// The rank in torch.distributed's default group, or -1 before
    /// `init_process_group`.
    pub distributed_rank: fn() -> i64,
    /// Waits at most this many milliseconds for the device statistics
    /// launched so far and hands their records over; false when some are
    /// still out.
    pub device_flush: fn(i64) -> bool,
    /// [measured, dropped, capturing, waits on the job's thread, failed]
    /// device measurements.
    pub device_counts: fn() -> Vec<i64>,
    /// At exit: the accuracy check's thread drops what is queued after the
    /// check under way.
    pub check_abandon: fn(),
}

impl Host {
    /// A host with no torch behind it: nothing to install or switch.
    pub const NONE: Host = Host {
        install: || false,
        set_active: |_| {},
        torch_version: String::new,
        distributed_rank: || -1,
        device_flush: |_| true,
        device_counts: Vec::new,
        check_abandon: || {},
    };
}

static HOST: OnceLock<Host> = OnceLock::new();

/// Set once, at load, by the bridge.
pub fn set(host: Host) {
    let _ = HOST.set(host);
}

/// The host set at load, or [`Host::NONE`].
pub fn get() -> Host {
    HOST.get().copied().unwrap_or(Host::NONE)
}
