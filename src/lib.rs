//! The torch-linked plugin (`libopdump_core.so`), loaded by the entry point
//! `libopdump.so` (crates/preload) once torch is in the process.
//!
//! It is thin on purpose: `cpp/` does the torch work (the dispatcher
//! fallback, statistics, the thread hook), [`bridge`] is the one FFI edge,
//! and everything else (configuration, selection, sequencing, the channel,
//! the writer, process state) is the torch-free engine in crates/engine.
//! The arrows point one way: `cpp → bridge → engine → format`.

mod bridge;

/// Runs when the dynamic loader loads this library.
extern "C" fn on_load() {
    if std::panic::catch_unwind(|| opdump_engine::runtime::init(bridge::HOST)).is_err() {
        eprintln!("opdump: internal error at load; opdump stays off, the job goes on");
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;

/// Records are built on the job's threads and freed on the writer thread.
/// With glibc's malloc those frees refill the job's arena under its lock, and
/// the job's next allocation waits on a futex (measured: most of the per-op
/// cost on small tensors). mimalloc frees across threads without a lock.
/// Only Rust's allocations (records, and the strings and vectors C++ fills
/// through the bridge) use it; torch's own memory is untouched.
#[global_allocator]
static ALLOC: mimalloc::MiMalloc = mimalloc::MiMalloc;
