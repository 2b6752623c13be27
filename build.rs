// Builds the torch-linked core: finds torch (through Python or LIBTORCH, see
// crates/torchfind), compiles cpp/ and the cxx bridge as C++20 with torch's
// ABI flag, links c10 and torch_cpu, and sets an rpath to torch's lib
// directory so the library loads without LD_LIBRARY_PATH.
fn main() {
    let torch = opdump_torchfind::find_or_exit();

    let sources = cpp_sources();
    let mut build = cxx_build::bridge("src/bridge.rs");
    build
        .files(&sources.baseline)
        // The torch 2.15 headers refuse anything older than C++20.
        .std("c++20")
        .define(
            "_GLIBCXX_USE_CXX11_ABI",
            if torch.cxx11_abi { "1" } else { "0" },
        )
        .define(
            "TORCH_VERSION_AT_BUILD",
            format!("\"{}\"", torch.version).as_str(),
        )
        .flag_if_supported("-fvisibility=hidden")
        // The project's own C++ builds clean with -Wall -Wextra; torch's
        // headers come in as system headers below, so their warnings do not.
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        // Another torch version may deprecate an API this code still uses:
        // that is a warning to act on, not a reason to fail its build.
        .flag("-Wno-error=deprecated-declarations");
    for dir in &torch.include_dirs {
        // -isystem keeps torch's own warnings out of our build log.
        build.flag(format!("-isystem{}", dir.display()));
    }
    // The vector statistics kernels: x86-64 only, compiled with AVX2, FMA and
    // F16C, or AVX-512, on their own (the rest of the library keeps the
    // baseline ISA) and called only where the CPU reports them at run time.
    let avx2 = std::env::var("CARGO_CFG_TARGET_ARCH").as_deref() == Ok("x86_64");
    build.define("STATS_HAVE_AVX2", if avx2 { "1" } else { "0" });
    build.compile("opdump_cpp");
    if avx2 {
        compile_with_isa(
            &sources.avx2,
            &["-mavx2", "-mfma", "-mf16c"],
            "opdump_stats_avx2",
        );
        compile_with_isa(
            &sources.avx512,
            &["-mavx512f", "-mavx512vl", "-mavx512dq", "-mfma"],
            "opdump_stats_avx512",
        );
    }

    let lib = torch.lib_dir.display();
    println!("cargo:rustc-link-search=native={lib}");
    println!("cargo:rustc-link-lib=dylib=c10");
    println!("cargo:rustc-link-lib=dylib=torch_cpu");
    println!("cargo:rustc-link-arg=-Wl,-rpath,{lib}");
    println!("cargo:rustc-env=TORCH_VERSION_AT_BUILD={}", torch.version);

    println!("cargo:rerun-if-changed=build.rs");
    println!("cargo:rerun-if-changed=src/bridge.rs");
    // A directory is scanned whole, its folders included.
    println!("cargo:rerun-if-changed=cpp");
}

/// Kernels that build with ISA flags of their own (and no torch headers):
/// the same warnings as the rest of the C++, as errors.
fn compile_with_isa(files: &[std::path::PathBuf], isa: &[&str], name: &str) {
    let mut build = cc::Build::new();
    build.cpp(true).files(files).flag("-std=c++17");
    for flag in isa {
        build.flag(flag);
    }
    build
        .flag_if_supported("-fvisibility=hidden")
        .warnings(true)
        .extra_warnings(true)
        .warnings_into_errors(true)
        .compile(name);
}

/// The C++ sources: every `*.cpp` in the folders of cpp/ (a folder per
/// concern, see the layout in README.md), those named `*_avx2.cpp` and
/// `*_avx512.cpp` apart, since they build with their own ISA flags. Sorted,
/// so the build does not depend on the order the file system lists them in.
struct Sources {
    baseline: Vec<std::path::PathBuf>,
    avx2: Vec<std::path::PathBuf>,
    avx512: Vec<std::path::PathBuf>,
}

fn cpp_sources() -> Sources {
    let mut sources = Sources {
        baseline: Vec::new(),
        avx2: Vec::new(),
        avx512: Vec::new(),
    };
    let folders = std::fs::read_dir("cpp").expect("cpp/ is readable");
    for folder in folders.map(|e| e.expect("cpp/ is readable").path()) {
        if !folder.is_dir() {
            continue;
        }
        for file in std::fs::read_dir(&folder).expect("a folder of cpp/ is readable") {
            let path = file.expect("a folder of cpp/ is readable").path();
            let name = path.file_name().and_then(|n| n.to_str()).unwrap_or("");
            if name.ends_with("_avx2.cpp") {
                sources.avx2.push(path);
            } else if name.ends_with("_avx512.cpp") {
                sources.avx512.push(path);
            } else if name.ends_with(".cpp") {
                sources.baseline.push(path);
            }
        }
    }
    sources.baseline.sort();
    sources.avx2.sort();
    sources.avx512.sort();
    sources
}
