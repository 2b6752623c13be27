//! `libopdump.so`, the library users load: torch-free, so that it costs
//! nothing in processes that never use torch.
//!
//! - Loaded by `torch.ops.load_library`, torch is already in the process: the
//!   core (`libopdump_core.so`, beside this file) is loaded at once.
//! - Loaded by `LD_PRELOAD`, it is in every process, compilers and shell
//!   commands included. It then waits: it wraps `dlopen`, and loads the core
//!   right after the `dlopen` that brought `libtorch_cpu.so` into the process.
//!   Processes that never load torch never load the core, while `torchrun`
//!   workers and spawned DataLoader workers, which inherit `LD_PRELOAD` and do
//!   load torch, keep opdump.
//!
//! Before loading a core it compares the torch in the process with the
//! torch the core was built for, so a mismatch is one `opdump:` line instead
//! of an undefined-symbol failure. A wheel carries one core per supported
//! torch version and loads the one that matches ([`cores`]).

use std::ffi::{c_char, c_int, c_void, CStr, CString};
use std::path::{Path, PathBuf};
use std::sync::atomic::{AtomicU8, Ordering};

mod cores;

const TORCH_LIB: &CStr = c"libtorch_cpu.so";
const BUILD_TORCH_VERSION: &str = env!("TORCH_VERSION_AT_BUILD");

const WAITING: u8 = 0;
const DONE: u8 = 1;
static STATE: AtomicU8 = AtomicU8::new(WAITING);

type DlopenFn = unsafe extern "C" fn(*const c_char, c_int) -> *mut c_void;

fn real_dlopen() -> Option<DlopenFn> {
    use std::sync::OnceLock;
    static REAL: OnceLock<usize> = OnceLock::new();
    // SAFETY: dlsym with a valid handle constant and a NUL-terminated name.
    let addr =
        *REAL.get_or_init(|| unsafe { libc::dlsym(libc::RTLD_NEXT, c"dlopen".as_ptr()) as usize });
    // SAFETY: the address is libc's own `dlopen`, whose signature this is.
    (addr != 0).then(|| unsafe { std::mem::transmute::<usize, DlopenFn>(addr) })
}

/// Wraps libc's `dlopen` when this library is preloaded: after each load,
/// checks once whether torch has arrived.
///
/// # Safety
/// Same contract as `dlopen(3)`.
#[no_mangle]
pub unsafe extern "C" fn dlopen(filename: *const c_char, flags: c_int) -> *mut c_void {
    let Some(real) = real_dlopen() else {
        return std::ptr::null_mut();
    };
    // SAFETY: the caller's arguments, passed on unchanged to libc's dlopen.
    let handle = unsafe { real(filename, flags) };
    if !handle.is_null() && STATE.load(Ordering::Acquire) == WAITING && torch_loaded(real) {
        load_core_once(real);
    }
    handle
}

fn torch_loaded(real: DlopenFn) -> bool {
    // SAFETY: RTLD_NOLOAD only looks the library up; the extra reference is
    // dropped again at once.
    unsafe {
        let h = real(TORCH_LIB.as_ptr(), libc::RTLD_LAZY | libc::RTLD_NOLOAD);
        if h.is_null() {
            return false;
        }
        libc::dlclose(h);
        true
    }
}

fn load_core_once(real: DlopenFn) {
    if STATE
        .compare_exchange(WAITING, DONE, Ordering::AcqRel, Ordering::Acquire)
        .is_err()
    {
        return;
    }
    let Some(dir) = own_dir() else {
        eprintln!("opdump: cannot find where libopdump.so was loaded from; opdump stays off");
        return;
    };
    let running = loaded_torch_version();
    let core = match cores::choose(
        &dir,
        &cores::bundled_versions(&dir),
        running.as_ref().map(|(v, p)| (v.as_str(), p.as_path())),
        BUILD_TORCH_VERSION,
    ) {
        Ok(core) => core,
        Err(why) => {
            eprintln!("opdump: {why}");
            return;
        }
    };
    let Ok(c_core) = CString::new(core.as_os_str().as_encoded_bytes()) else {
        return;
    };
    // SAFETY: plain dlopen of our own core; its constructor does the rest.
    let h = unsafe { real(c_core.as_ptr(), libc::RTLD_NOW | libc::RTLD_LOCAL) };
    if h.is_null() {
        // SAFETY: dlerror returns a thread-local message or null.
        let why = unsafe {
            let e = libc::dlerror();
            if e.is_null() {
                "unknown error".into()
            } else {
                CStr::from_ptr(e).to_string_lossy().into_owned()
            }
        };
        eprintln!(
            "opdump: cannot load {}: {why}. The torch in this process (or its C++ ABI) differs from \
             the one this core was built for; opdump stays off. Rebuild it against this torch.",
            core.display()
        );
    }
}

/// The directory this library was loaded from.
fn own_dir() -> Option<PathBuf> {
    // SAFETY: Dl_info is plain data (pointers and integers); all-zero is valid.
    let mut info: libc::Dl_info = unsafe { std::mem::zeroed() };
    // SAFETY: dladdr only reads the address of one of our own functions.
    let ok = unsafe { libc::dladdr(own_dir as *const c_void, &mut info) };
    if ok == 0 || info.dli_fname.is_null() {
        return None;
    }
    // SAFETY: dladdr succeeded and dli_fname is not null: a NUL-terminated
    // path owned by the loader, valid while this library is loaded.
    let path = unsafe { CStr::from_ptr(info.dli_fname) }
        .to_string_lossy()
        .into_owned();
    let path = std::fs::canonicalize(&path).unwrap_or_else(|_| PathBuf::from(path));
    path.parent().map(Path::to_path_buf)
}

/// The version of the torch whose libtorch_cpu.so is loaded, read from the
/// files next to it: `torch/version.py` for the wheel, `build-version` for
/// an unpacked libtorch.
fn loaded_torch_version() -> Option<(String, PathBuf)> {
    let lib = loaded_library_path("libtorch_cpu.so")?;
    let root = lib.parent()?.parent()?.to_path_buf();
    if let Ok(text) = std::fs::read_to_string(root.join("version.py")) {
        for line in text.lines() {
            if let Some(rest) = line.strip_prefix("__version__") {
                let v = rest
                    .trim_start_matches([' ', '='])
                    .trim()
                    .trim_matches(['\'', '"']);
                return Some((v.to_string(), root));
            }
        }
    }
    let v = std::fs::read_to_string(root.join("build-version")).ok()?;
    Some((v.trim().to_string(), root))
}

fn loaded_library_path(name: &str) -> Option<PathBuf> {
    struct Search<'a> {
        name: &'a str,
        found: Option<PathBuf>,
    }
    unsafe extern "C" fn visit(
        info: *mut libc::dl_phdr_info,
        _size: libc::size_t,
        data: *mut c_void,
    ) -> c_int {
        // SAFETY: `data` is the `Search` passed to dl_iterate_phdr below, and
        // `info` an entry the loader hands over for the duration of the call.
        let (search, p) = unsafe { (&mut *(data as *mut Search), (*info).dlpi_name) };
        if p.is_null() {
            return 0;
        }
        // SAFETY: a non-null dlpi_name is a NUL-terminated path.
        let path = unsafe { CStr::from_ptr(p) }.to_string_lossy();
        if Path::new(path.as_ref())
            .file_name()
            .is_some_and(|f| f == search.name)
        {
            search.found = Some(PathBuf::from(path.as_ref()));
            return 1;
        }
        0
    }
    let mut search = Search { name, found: None };
    // SAFETY: the callback only reads the entries it is given.
    unsafe { libc::dl_iterate_phdr(Some(visit), &mut search as *mut Search as *mut c_void) };
    search.found
}

/// Runs when the library is loaded: with torch already present, load the
/// core now; otherwise the `dlopen` wrapper waits for it.
extern "C" fn on_load() {
    if let Some(real) = real_dlopen() {
        if torch_loaded(real) {
            load_core_once(real);
        }
    }
}

#[used]
#[link_section = ".init_array"]
static ON_LOAD: extern "C" fn() = on_load;
