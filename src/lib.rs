//! The torch-linked core of opdump (`libopdump_core.so`), loaded by the
//! entry point `libopdump.so` (crates/preload) once torch is in the process.
//!
//! - `cpp/`: the dispatcher fallback, statistics and thread hook (torch work);
//! - [`bridge`]: the one cxx bridge between them and Rust;
//! - [`config`]: every `OPDUMP_*` variable;
//! - [`recorder`]: sequencing, nesting and selection of op calls;
//! - [`sink`]: the channel and the writer thread;
//! - [`runtime`]: process-wide state and the `torch.ops.opdump.*` switches.

mod bridge;
pub mod config;
mod recorder;
mod runtime;
mod sink;

/// Runs when the dynamic loader loads this library.
extern "C" fn on_load() {
    if std::panic::catch_unwind(runtime::init).is_err() {
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
