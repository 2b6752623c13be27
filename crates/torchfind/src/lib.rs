//! Build-time discovery of a torch installation, shared by the build scripts
//! of the core (which compiles and links against torch) and of the preload
//! entry point (which only needs the version to check against at run time).
//!
//! Modelled on tch-rs's torch-sys: `LIBTORCH` names an unpacked libtorch;
//! otherwise a Python interpreter (`OPDUMP_PYTHON`, default `python3`) is
//! asked where its `torch` package lives.

use std::env;
use std::path::{Path, PathBuf};
use std::process::Command;

/// What a build needs to know about one torch.
#[derive(Clone, Debug)]
pub struct Torch {
    /// Full version, e.g. `2.15.0+cu132`.
    pub version: String,
    /// Header directories.
    pub include_dirs: Vec<PathBuf>,
    /// Directory holding libc10.so and libtorch_cpu.so.
    pub lib_dir: PathBuf,
    /// The value of `_GLIBCXX_USE_CXX11_ABI` torch was built with.
    pub cxx11_abi: bool,
}

impl Torch {
    /// `2.15.0` from `2.15.0+cu132`: local build tags do not change the ABI.
    pub fn base_version(&self) -> &str {
        base_version(&self.version)
    }
}

pub fn base_version(v: &str) -> &str {
    v.split('+').next().unwrap_or(v).trim()
}

/// Environment variables whose change must re-run a build script.
pub const WATCHED_ENV: &[&str] = &["LIBTORCH", "OPDUMP_PYTHON", "LIBTORCH_CXX11_ABI"];

const PY_PROBE: &str = r#"
import torch
from torch.utils import cpp_extension as ce
print("version=" + torch.__version__)
print("abi=" + str(int(torch._C._GLIBCXX_USE_CXX11_ABI)))
print("lib=" + ce.library_paths()[0])
for p in ce.include_paths():
    print("include=" + p)
"#;

fn help(detail: &str) -> String {
    format!(
        "opdump: torch was not found ({detail}).\n\
         Fix it in one of these ways:\n\
         \x20 - run scripts/setup.sh, which makes .venv/ with the pinned torch and builds with it;\n\
         \x20 - set OPDUMP_PYTHON to a Python interpreter that can `import torch`;\n\
         \x20 - set LIBTORCH to an unpacked libtorch (with include/ and lib/)."
    )
}

/// Finds torch, or returns a message that lists the ways to fix it.
pub fn find() -> Result<Torch, String> {
    if let Ok(root) = env::var("LIBTORCH") {
        return from_libtorch(Path::new(&root));
    }
    let python = env::var("OPDUMP_PYTHON").unwrap_or_else(|_| "python3".to_string());
    let out = Command::new(&python)
        .arg("-c")
        .arg(PY_PROBE)
        .output()
        .map_err(|e| help(&format!("cannot run {python}: {e}")))?;
    if !out.status.success() {
        let err = String::from_utf8_lossy(&out.stderr);
        let last = err.lines().last().unwrap_or("").to_string();
        return Err(help(&format!("{python} cannot import torch: {last}")));
    }
    let text = String::from_utf8_lossy(&out.stdout);
    let (mut version, mut abi, mut lib, mut include_dirs) = (None, None, None, Vec::new());
    for line in text.lines() {
        match line.split_once('=') {
            Some(("version", v)) => version = Some(v.to_string()),
            Some(("abi", v)) => abi = Some(v == "1"),
            Some(("lib", v)) => lib = Some(PathBuf::from(v)),
            Some(("include", v)) => include_dirs.push(PathBuf::from(v)),
            _ => {}
        }
    }
    match (version, abi, lib) {
        (Some(version), Some(cxx11_abi), Some(lib_dir)) => Ok(Torch {
            version,
            include_dirs,
            lib_dir,
            cxx11_abi,
        }),
        _ => Err(help(&format!("{python} printed no torch paths"))),
    }
}

fn from_libtorch(root: &Path) -> Result<Torch, String> {
    let inc = root.join("include");
    let lib = root.join("lib");
    if !inc.is_dir() || !lib.join("libtorch_cpu.so").exists() {
        return Err(help(&format!(
            "LIBTORCH={} has no include/ and lib/libtorch_cpu.so",
            root.display()
        )));
    }
    let version = std::fs::read_to_string(root.join("build-version"))
        .map(|v| v.trim().to_string())
        .map_err(|_| {
            help(&format!(
                "LIBTORCH={} has no build-version file",
                root.display()
            ))
        })?;
    // libtorch archives built with the old ABI say so in their name; there is
    // no file inside that records it, so let the user override.
    let cxx11_abi = env::var("LIBTORCH_CXX11_ABI")
        .map(|v| v != "0")
        .unwrap_or(true);
    Ok(Torch {
        version,
        include_dirs: vec![inc.clone(), inc.join("torch/csrc/api/include")],
        lib_dir: lib,
        cxx11_abi,
    })
}

/// For build scripts: find torch or stop the build with the message.
pub fn find_or_exit() -> Torch {
    for v in WATCHED_ENV {
        println!("cargo:rerun-if-env-changed={v}");
    }
    match find() {
        Ok(t) => t,
        Err(msg) => {
            eprintln!("{msg}");
            println!("cargo:warning={}", msg.lines().next().unwrap_or(""));
            std::process::exit(1);
        }
    }
}
