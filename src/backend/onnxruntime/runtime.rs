//! Finding and loading the ONNX Runtime shared library, once per process.
//!
//! ort is built with `load-dynamic`: nothing links against ONNX Runtime, so
//! a server without the library still serves its built-in models, and only
//! ONNX models fail to load. Every ort call must come after [`environment`]
//! succeeded: ort would otherwise try to load a library on its own and
//! panic when there is none.

use std::{
    path::{Path, PathBuf},
    sync::OnceLock,
};

use ort::environment::Environment;

/// Overrides where the library is looked for.
pub const LIB_ENV: &str = "SHARDSERVE_ORT_LIB";

/// The ort crate's own variable, honoured too so a deployment already set
/// up for other ort users works unchanged.
pub const ORT_ENV: &str = "ORT_DYLIB_PATH";

/// Where `scripts/package.sh` puts the library, relative to the folder of
/// the executable (`<prefix>/bin/shardserve` -> `<prefix>/lib/`).
const PACKAGE_LIB_DIR: &str = "../lib";
const LIB_NAME: &str = "libonnxruntime.so";

/// Where `scripts/setup.sh` links the library in a checkout; found from the
/// executable's folder upwards (`target/release/`, `target/release/deps/`),
/// a development fallback only.
const DEV_LIB_REL: &str = ".ort/libonnxruntime.so";

const NOT_FOUND: &str = "ONNX Runtime library not found; run scripts/setup.sh (build tree), \
     put it in <prefix>/lib next to <prefix>/bin/shardserve, or set SHARDSERVE_ORT_LIB";

/// The process-wide ONNX Runtime environment. The outcome of the first
/// attempt is kept: ort cannot load a second library into a process, so
/// retrying after a failure could not help.
pub fn environment() -> anyhow::Result<&'static Environment> {
    static ENVIRONMENT: OnceLock<Result<Environment, String>> = OnceLock::new();
    ENVIRONMENT
        .get_or_init(init)
        .as_ref()
        .map_err(|e| anyhow::anyhow!("{e}"))
}

fn init() -> Result<Environment, String> {
    let path = find_library()?;
    let builder = ort::init_from(&path).map_err(|e| {
        format!(
            "cannot load the ONNX Runtime library {}: {e}",
            path.display()
        )
    })?;
    let env = builder
        .with_name("shardserve")
        .with_telemetry(false)
        .build()
        .map_err(|e| format!("cannot create the ONNX Runtime environment: {e}"))?;
    tracing::info!(library = %path.display(), "ONNX Runtime loaded");
    Ok(env)
}

/// `$SHARDSERVE_ORT_LIB`, else `$ORT_DYLIB_PATH`, else
/// `<exe>/../lib/libonnxruntime.so` (or a versioned
/// `libonnxruntime.so.X.Y.Z` there), else `.ort/libonnxruntime.so` in an
/// ancestor of the executable's folder (a build tree). Nothing depends on
/// the working directory or on where the binary was built, so an unpacked
/// package runs from anywhere.
pub fn find_library() -> Result<PathBuf, String> {
    for var in [LIB_ENV, ORT_ENV] {
        if let Some(path) = std::env::var_os(var).filter(|v| !v.is_empty()) {
            let path = PathBuf::from(path);
            return if path.is_file() {
                Ok(path)
            } else {
                Err(format!(
                    "{NOT_FOUND} ({var} is set to {}, which is not a file)",
                    path.display()
                ))
            };
        }
    }
    // `current_exe` is /proc/self/exe: symlinks to the binary are already
    // resolved, so `/usr/local/bin/shardserve -> /opt/shardserve/bin/...`
    // finds /opt/shardserve/lib.
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let Some(exe_dir) = exe_dir else {
        return Err(format!(
            "{NOT_FOUND} (the executable's location is unknown)"
        ));
    };
    let candidates = candidates(&exe_dir);
    // `is_file` follows symlinks, so a link left dangling by a removed
    // virtualenv is skipped rather than reported as found.
    candidates
        .iter()
        .find(|p| p.is_file())
        .cloned()
        .ok_or_else(|| {
            let looked: Vec<String> = candidates.iter().map(|p| p.display().to_string()).collect();
            format!("{NOT_FOUND} (looked in: {})", looked.join(", "))
        })
}

fn candidates(exe_dir: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut push = |p: PathBuf| {
        if !out.contains(&p) {
            out.push(p);
        }
    };
    let lib_dir = exe_dir.join(PACKAGE_LIB_DIR);
    push(lib_dir.join(LIB_NAME));
    for versioned in versioned_libraries(&lib_dir) {
        push(versioned);
    }
    for dir in exe_dir.ancestors() {
        push(dir.join(DEV_LIB_REL));
    }
    out
}

/// `libonnxruntime.so.*` in `dir`, newest version first (a package made
/// without the unversioned link still works).
fn versioned_libraries(dir: &Path) -> Vec<PathBuf> {
    let prefix = format!("{LIB_NAME}.");
    let mut found: Vec<(Vec<u64>, PathBuf)> = std::fs::read_dir(dir)
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|entry| {
            let name = entry.file_name().into_string().ok()?;
            let version = name.strip_prefix(&prefix)?;
            let parts: Vec<u64> = version
                .split('.')
                .map(str::parse)
                .collect::<Result<_, _>>()
                .ok()?;
            Some((parts, entry.path()))
        })
        .collect();
    found.sort_by(|a, b| b.0.cmp(&a.0));
    found.into_iter().map(|(_, p)| p).collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_are_the_package_lib_then_build_tree_ancestors() {
        let got = candidates(Path::new("/nonexistent-shardserve/target/release"));
        let want: Vec<PathBuf> = [
            "/nonexistent-shardserve/target/release/../lib/libonnxruntime.so",
            "/nonexistent-shardserve/target/release/.ort/libonnxruntime.so",
            "/nonexistent-shardserve/target/.ort/libonnxruntime.so",
            "/nonexistent-shardserve/.ort/libonnxruntime.so",
            "/.ort/libonnxruntime.so",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn versioned_libraries_newest_first_and_junk_ignored() {
        let dir = std::env::temp_dir().join(format!("ss-ortlib-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for name in [
            "libonnxruntime.so.1.9.0",
            "libonnxruntime.so.1.32.0",
            "libonnxruntime.so.bak",
            "libonnxruntime_providers_shared.so",
        ] {
            std::fs::write(dir.join(name), b"").unwrap();
        }
        let got = versioned_libraries(&dir);
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(
            got,
            vec![
                dir.join("libonnxruntime.so.1.32.0"),
                dir.join("libonnxruntime.so.1.9.0")
            ]
        );
    }

    #[test]
    fn library_is_found_in_this_checkout() {
        let path = find_library().expect("run scripts/setup.sh first");
        assert!(path.is_file());
        environment().expect("ONNX Runtime loads");
    }
}
