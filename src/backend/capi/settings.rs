//! Process-wide settings of the C API: the backend directory, each
//! backend's `--backend-config` entries, and the server handle backends
//! get from `TRITONBACKEND_ModelServer`.

use std::{
    collections::BTreeMap,
    path::{Path, PathBuf},
    sync::{
        atomic::{AtomicPtr, Ordering},
        OnceLock,
    },
};

use crate::triton_abi::ffi::ServerHandle;

#[derive(Debug, Clone, Default)]
pub struct Settings {
    /// `--backend-directory`; `None`: [`default_backend_directory`].
    pub backend_directory: Option<PathBuf>,
    /// `--backend-config name,key=value`, by backend name.
    pub backend_config: BTreeMap<String, BTreeMap<String, String>>,
}

static SETTINGS: OnceLock<Settings> = OnceLock::new();
static SERVER: AtomicPtr<ServerHandle> = AtomicPtr::new(std::ptr::null_mut());

/// Sets the settings once, before any model loads; later calls are
/// ignored (the first server of the process decides).
pub fn configure(settings: Settings) {
    if SETTINGS.set(settings).is_err() {
        tracing::warn!("backend C API settings were already set; keeping the first ones");
    }
}

pub fn get() -> &'static Settings {
    SETTINGS.get_or_init(Settings::default)
}

/// The server handle handed to backends (the in-process front end's
/// server, installed by `server::start`); the caller keeps it alive.
pub fn set_server(server: *mut ServerHandle) {
    SERVER.store(server, Ordering::Release);
}

pub fn server() -> *mut ServerHandle {
    SERVER.load(Ordering::Acquire)
}

/// Parses one `--backend-config` value: `name,key=value` (or
/// `key=value`, a setting for every backend, as tritonserver's global
/// settings).
pub fn parse_backend_config(arg: &str) -> Result<(String, String, String), String> {
    let (name, setting) = match arg.split_once(',') {
        Some((name, setting)) => (name.to_owned(), setting),
        None => (String::new(), arg),
    };
    let (key, value) = setting
        .split_once('=')
        .ok_or_else(|| format!("--backend-config {arg:?}: expected <name>,<key>=<value>"))?;
    if key.is_empty() {
        return Err(format!("--backend-config {arg:?}: empty setting name"));
    }
    Ok((name, key.to_owned(), value.to_owned()))
}

pub fn backend_directory() -> PathBuf {
    get()
        .backend_directory
        .clone()
        .unwrap_or_else(default_backend_directory)
}

/// tritonserver's default, used when neither a package nor a build tree
/// is found around the executable.
const SYSTEM_BACKEND_DIRECTORY: &str = "/opt/tritonserver/backends";

/// `<exe>/../backends` (the layout of `scripts/package.sh`: a package runs
/// from wherever it is unpacked), else the nearest `.backends/` in the
/// executable's folder or above it (a build tree: `target/release/shardserve`
/// finds the checkout's), else tritonserver's `/opt/tritonserver/backends`.
/// Never the working directory, so where the server is started from does
/// not change which backends it loads.
pub fn default_backend_directory() -> PathBuf {
    let exe_dir = std::env::current_exe()
        .ok()
        .and_then(|exe| exe.canonicalize().ok())
        .and_then(|exe| exe.parent().map(Path::to_path_buf));
    exe_dir
        .and_then(|dir| backend_directory_near(&dir))
        .unwrap_or_else(|| PathBuf::from(SYSTEM_BACKEND_DIRECTORY))
}

fn backend_directory_near(exe_dir: &Path) -> Option<PathBuf> {
    let packaged = exe_dir.join("../backends");
    if packaged.is_dir() {
        // Canonical, so a backend's `$ORIGIN`-relative look-ups and the log
        // name the real folder rather than `bin/..`.
        return Some(packaged.canonicalize().unwrap_or(packaged));
    }
    find_up(exe_dir, ".backends")
}

fn find_up(start: &Path, name: &str) -> Option<PathBuf> {
    start
        .ancestors()
        .take(5)
        .map(|dir| dir.join(name))
        .find(|candidate| candidate.is_dir())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn backend_config_arguments() {
        assert_eq!(
            parse_backend_config("python,shm-default-byte-size=1048576"),
            Ok((
                "python".into(),
                "shm-default-byte-size".into(),
                "1048576".into()
            ))
        );
        assert_eq!(
            parse_backend_config("k=v=w"),
            Ok((String::new(), "k".into(), "v=w".into()))
        );
        assert!(parse_backend_config("python,novalue").is_err());
    }

    #[test]
    fn a_package_layout_wins_over_a_build_tree() {
        let root = std::env::temp_dir().join(format!("ss-backdir-{}", std::process::id()));
        let bin = root.join("pkg/bin");
        std::fs::create_dir_all(&bin).unwrap();
        std::fs::create_dir_all(root.join(".backends")).unwrap();
        assert_eq!(backend_directory_near(&bin), Some(root.join(".backends")));
        std::fs::create_dir_all(root.join("pkg/backends")).unwrap();
        let got = backend_directory_near(&bin);
        std::fs::remove_dir_all(&root).unwrap();
        assert_eq!(got, Some(root.join("pkg/backends")));
    }
}
