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

/// Where `scripts/setup.sh` links the library from the `onnxruntime` wheel,
/// relative to the repository root.
const LIB_REL: &str = ".ort/libonnxruntime.so";

const NOT_FOUND: &str =
    "ONNX Runtime library not found; run scripts/setup.sh or set SHARDSERVE_ORT_LIB";

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

/// `$SHARDSERVE_ORT_LIB`, else `.ort/libonnxruntime.so` in the current
/// directory or in an ancestor of the executable's directory (so
/// `target/release/shardserve` and test binaries find the repository's),
/// else the one of the source tree this binary was built from.
pub fn find_library() -> Result<PathBuf, String> {
    if let Some(path) = std::env::var_os(LIB_ENV) {
        let path = PathBuf::from(path);
        return if path.is_file() {
            Ok(path)
        } else {
            Err(format!(
                "{NOT_FOUND} ({LIB_ENV} is set to {}, which is not a file)",
                path.display()
            ))
        };
    }
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    let candidates = candidates(
        std::env::current_dir().ok().as_deref(),
        exe_dir.as_deref(),
        Path::new(env!("CARGO_MANIFEST_DIR")),
    );
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

fn candidates(cwd: Option<&Path>, exe_dir: Option<&Path>, source_root: &Path) -> Vec<PathBuf> {
    let mut out: Vec<PathBuf> = Vec::new();
    let mut push = |p: PathBuf| {
        if !out.contains(&p) {
            out.push(p);
        }
    };
    if let Some(cwd) = cwd {
        push(cwd.join(LIB_REL));
    }
    if let Some(exe_dir) = exe_dir {
        for dir in exe_dir.ancestors() {
            push(dir.join(LIB_REL));
        }
    }
    push(source_root.join(LIB_REL));
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn candidates_cover_cwd_exe_ancestors_and_source_tree_once_each() {
        let got = candidates(
            Some(Path::new("/srv")),
            Some(Path::new("/repo/target/release")),
            Path::new("/repo"),
        );
        let want: Vec<PathBuf> = [
            "/srv/.ort/libonnxruntime.so",
            "/repo/target/release/.ort/libonnxruntime.so",
            "/repo/target/.ort/libonnxruntime.so",
            "/repo/.ort/libonnxruntime.so",
            "/.ort/libonnxruntime.so",
        ]
        .iter()
        .map(PathBuf::from)
        .collect();
        assert_eq!(got, want);
    }

    #[test]
    fn library_is_found_in_this_checkout() {
        let path = find_library().expect("run scripts/setup.sh first");
        assert!(path.is_file());
        environment().expect("ONNX Runtime loads");
    }
}
