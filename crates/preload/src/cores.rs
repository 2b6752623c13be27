//! Which core to load: the one built for the torch in the process.
//!
//! Two layouts of the directory `libopdump.so` sits in:
//! - **A build** (`target/release/`): one `libopdump_core.so`, built against
//!   the torch whose version this library was compiled with.
//! - **A wheel** (`opdump/_lib/`): one core per supported torch version,
//!   `torch-<version>/libopdump_core.so`, the version without its local tag
//!   (`2.15.0`, not `2.15.0+cu132`: a local tag does not change the C++ ABI).
//!
//! The match is exact on `major.minor.patch`: torch promises no C++ ABI
//! between versions, and a core loaded into another torch could crash the job
//! instead of refusing it with one line.

use std::path::{Path, PathBuf};

pub const CORE_FILE: &str = "libopdump_core.so";
/// Prefix of the per-version directories of a wheel.
pub const VERSION_DIR_PREFIX: &str = "torch-";

/// `2.15.0` from `2.15.0+cu132`.
pub fn base(v: &str) -> &str {
    v.split('+').next().unwrap_or(v).trim()
}

/// The torch versions a wheel's directory carries cores for, sorted.
pub fn bundled_versions(dir: &Path) -> Vec<String> {
    let mut found: Vec<String> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let name = e.file_name().into_string().ok()?;
            let v = name.strip_prefix(VERSION_DIR_PREFIX)?;
            e.path().join(CORE_FILE).is_file().then(|| v.to_string())
        })
        .collect();
    found.sort_by_key(|v| numeric(v));
    found
}

fn numeric(v: &str) -> Vec<u64> {
    v.split('.').map(|p| p.parse().unwrap_or(0)).collect()
}

/// The core to load, or the one line that says why none is.
///
/// `running`: the version of the torch in the process, with where it was
/// found, when it could be read. `built_for`: the torch this library was
/// compiled against (the core beside it in a build).
pub fn choose(
    dir: &Path,
    bundled: &[String],
    running: Option<(&str, &Path)>,
    built_for: &str,
) -> Result<PathBuf, String> {
    if bundled.is_empty() {
        // A build: its one core.
        if let Some((found, from)) = running {
            if base(found) != base(built_for) {
                return Err(format!(
                    "this opdump was built for torch {}, but this process runs torch {found} (from {}); \
                     opdump stays off. Rebuild it against this torch: \
                     OPDUMP_PYTHON=<its python> cargo build --release --workspace",
                    base(built_for),
                    from.display()
                ));
            }
        }
        return Ok(dir.join(CORE_FILE));
    }
    let supported = bundled.join(", ");
    let Some((found, from)) = running else {
        return Err(format!(
            "cannot tell the version of the torch in this process (no torch/version.py or \
             build-version beside its libtorch_cpu.so), so cannot choose among the cores for torch \
             {supported}; opdump stays off. Build opdump against this torch \
             (OPDUMP_PYTHON=<its python> cargo build --release --workspace) and load that \
             target/release/libopdump.so"
        ));
    };
    match bundled.iter().find(|v| v.as_str() == base(found)) {
        Some(v) => Ok(dir.join(format!("{VERSION_DIR_PREFIX}{v}")).join(CORE_FILE)),
        None => Err(format!(
            "this process runs torch {found} (from {}), and this opdump carries cores for torch \
             {supported} only; opdump stays off. Install torch {} or an opdump built for torch {}",
            from.display(),
            bundled.join(" or "),
            base(found)
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn wheel_dir(versions: &[&str]) -> tempfile::TempDir {
        let d = tempfile::tempdir().unwrap();
        for v in versions {
            let sub = d.path().join(format!("{VERSION_DIR_PREFIX}{v}"));
            std::fs::create_dir_all(&sub).unwrap();
            std::fs::write(sub.join(CORE_FILE), b"").unwrap();
        }
        // A directory without a core is no supported version.
        std::fs::create_dir_all(d.path().join("torch-9.9.9")).unwrap();
        d
    }

    #[test]
    fn a_wheel_loads_the_core_of_the_running_torch() {
        let d = wheel_dir(&["2.15.0", "2.11.0"]);
        let bundled = bundled_versions(d.path());
        assert_eq!(bundled, ["2.11.0", "2.15.0"]);
        let torch = Path::new("/site-packages/torch");
        let core = choose(d.path(), &bundled, Some(("2.11.0+cu128", torch)), "2.15.0").unwrap();
        assert_eq!(core, d.path().join("torch-2.11.0").join(CORE_FILE));
    }

    #[test]
    fn a_wheel_without_the_running_version_says_which_it_has() {
        let d = wheel_dir(&["2.15.0", "2.11.0"]);
        let bundled = bundled_versions(d.path());
        let torch = Path::new("/site-packages/torch");
        let why = choose(d.path(), &bundled, Some(("2.13.1", torch)), "2.15.0").unwrap_err();
        assert!(why.contains("runs torch 2.13.1"), "{why}");
        assert!(why.contains("cores for torch 2.11.0, 2.15.0 only"), "{why}");
        assert!(!why.contains('\n'));
        // A patch release is another version: no core is loaded into it.
        assert!(choose(d.path(), &bundled, Some(("2.15.1", torch)), "2.15.0").is_err());
        // An unknown torch version cannot pick a core, and the line says
        // how to get one that fits.
        let why = choose(d.path(), &bundled, None, "2.15.0").unwrap_err();
        assert!(
            why.contains("cannot tell the version of the torch"),
            "{why}"
        );
        assert!(why.contains("Build opdump against this torch"), "{why}");
        assert!(!why.contains('\n'));
    }

    #[test]
    fn a_build_checks_the_version_it_was_built_for() {
        let d = tempfile::tempdir().unwrap();
        let torch = Path::new("/venv/torch");
        assert_eq!(
            choose(d.path(), &[], Some(("2.15.0+cpu", torch)), "2.15.0+cu132").unwrap(),
            d.path().join(CORE_FILE)
        );
        let why = choose(d.path(), &[], Some(("2.11.0", torch)), "2.15.0+cu132").unwrap_err();
        assert!(
            why.contains("built for torch 2.15.0, but this process runs torch 2.11.0"),
            "{why}"
        );
        // Unknown version: load it, as before the check existed.
        assert!(choose(d.path(), &[], None, "2.15.0").is_ok());
    }
}
