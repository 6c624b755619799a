//! What the files of a load request (`file:<path>` parameters) may be.
//!
//! Triton's repository API can place and run code: an uploaded
//! `libtriton_<x>.so` is found by the library search in the model's own
//! folders and `dlopen`ed (its constructors run before anything checks
//! it), and an uploaded `model.py` runs in the Python backend. Here
//! nothing uploaded becomes code by default:
//!
//! - native code (ELF, Mach-O and PE binaries by content, shared-library
//!   names) is refused whatever the flags say, before a byte is written;
//! - Python (sources and bytecode by name, bytecode and `#!` scripts by
//!   content, any upload for a model whose backend is `python`, an
//!   `EXECUTION_ENV_PATH` inside the upload) is refused unless the operator
//!   opts in (`--model-load-allow-uploaded-python`);
//! - a config override names files (`runtime`, `default_model_filename`,
//!   `cc_model_filenames`) by plain file name only, so it cannot point a
//!   backend at another upload's folder or anywhere else on disk;
//! - backend libraries are never searched for in an uploaded model folder
//!   (see [`is_upload_path`], used by the C API's library search).
//!
//! Uploaded folders are created private (0700), under an unpredictable
//! name, and never through an existing path.

use std::{
    hash::{BuildHasher, Hasher},
    path::{Component, Path, PathBuf},
};

use bytes::Bytes;

use crate::{proto::inference::ModelConfig, types::clip};

/// The flag that lets uploaded Python run (named in refusals).
pub const ALLOW_PYTHON_FLAG: &str = "--model-load-allow-uploaded-python";

/// Prefix of the temporary folders that hold uploaded model files.
const UPLOAD_PREFIX: &str = "shardserve-load-";

/// Why an uploaded file would be code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Code {
    /// Machine code a loader could map: never accepted.
    Native(&'static str),
    /// Python (or another interpreter's script): accepted with the opt-in.
    Python(&'static str),
}

/// Native binaries by their first bytes.
fn native_magic(data: &[u8]) -> Option<&'static str> {
    let head = |n: usize| data.get(..n);
    if head(4) == Some(b"\x7fELF") {
        return Some("an ELF shared library or executable");
    }
    const MACH_O: [[u8; 4]; 5] = [
        [0xfe, 0xed, 0xfa, 0xce],
        [0xfe, 0xed, 0xfa, 0xcf],
        [0xce, 0xfa, 0xed, 0xfe],
        [0xcf, 0xfa, 0xed, 0xfe],
        // Also a Java class file: both are code.
        [0xca, 0xfe, 0xba, 0xbe],
    ];
    if let Some(h) = head(4) {
        if MACH_O.iter().any(|m| m == h) {
            return Some("a Mach-O binary");
        }
    }
    // PE: "MZ", and at the offset stored at 0x3c the "PE\0\0" signature
    // (a bare "MZ" is too common a prefix to refuse on its own).
    if head(2) == Some(b"MZ") {
        let pe = data
            .get(0x3c..0x40)
            .and_then(|b| <[u8; 4]>::try_from(b).ok())
            .map(u32::from_le_bytes)
            .and_then(|off| usize::try_from(off).ok())
            .and_then(|off| data.get(off..off.checked_add(4)?));
        if pe == Some(b"PE\0\0") {
            return Some("a Windows PE binary");
        }
    }
    None
}

/// CPython bytecode: a 16-bit magic number that ends in "\r\n" (the magic
/// numbers of Python 3.0 to 3.x lie in 3000..4000).
fn python_bytecode(data: &[u8]) -> bool {
    match data.get(..4) {
        Some([a, b, b'\r', b'\n']) => (3000..4000).contains(&u16::from_le_bytes([*a, *b])),
        _ => false,
    }
}

fn classify(rel: &str, data: &[u8]) -> Option<Code> {
    if let Some(what) = native_magic(data) {
        return Some(Code::Native(what));
    }
    let file = Path::new(rel)
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or(rel)
        .to_ascii_lowercase();
    // `libfoo.so`, `libfoo.so.1.2`
    let versioned_so = file
        .match_indices(".so.")
        .any(|(i, _)| file[i + 4..].starts_with(|c: char| c.is_ascii_digit()));
    let shared_name = file.ends_with(".so")
        || versioned_so
        || file.ends_with(".dylib")
        || file.ends_with(".dll")
        || file.ends_with(".pyd");
    if shared_name {
        return Some(Code::Native("named as a shared library"));
    }
    if python_bytecode(data) {
        return Some(Code::Python("Python bytecode"));
    }
    let ext = file.rsplit_once('.').map(|(_, e)| e);
    if matches!(ext, Some("py" | "pyw" | "pyc" | "pyo" | "pth")) {
        return Some(Code::Python("a Python file"));
    }
    if data.starts_with(b"#!") {
        return Some(Code::Python("a script with an interpreter line (#!)"));
    }
    None
}

/// Refuses uploaded files that would become code, before any is written.
/// The error names the first such file.
pub fn check_files(files: &[(String, Bytes)], allow_python: bool) -> Result<(), String> {
    for (rel, data) in files {
        match classify(rel, data) {
            None => {}
            Some(Code::Native(what)) => {
                return Err(format!(
                    "uploaded file '{}' is {what}: files sent with a load request never become \
                     code in the server (backend libraries load only from the model repository \
                     and --backend-directory, and no flag allows native code in an upload)",
                    clip(rel)
                ))
            }
            Some(Code::Python(_)) if allow_python => {}
            Some(Code::Python(what)) => {
                return Err(format!(
                    "uploaded file '{}' is {what}: uploaded Python never runs unless the server \
                     is started with {ALLOW_PYTHON_FLAG}",
                    clip(rel)
                ))
            }
        }
    }
    Ok(())
}

/// The backend a configuration names (`backend`, else `platform`).
fn backend_name(config: &ModelConfig) -> &str {
    if config.backend.is_empty() {
        &config.platform
    } else {
        &config.backend
    }
}

/// A file name with no folder part: what `runtime`, `default_model_filename`
/// and `cc_model_filenames` may be in a configuration sent over the network.
fn plain_file_name(name: &str) -> bool {
    let mut parts = Path::new(name).components();
    matches!(
        (parts.next(), parts.next()),
        (Some(Component::Normal(_)), None)
    ) && !name.contains('/')
}

/// Checks a config override (network-supplied) for ways to run uploaded
/// or arbitrary files: `with_files` says the load carries uploaded files
/// (the model folder is then an upload).
pub fn check_config(
    config: &ModelConfig,
    with_files: bool,
    allow_python: bool,
) -> Result<(), String> {
    let named = std::iter::once(("runtime", config.runtime.as_str()))
        .chain(std::iter::once((
            "default_model_filename",
            config.default_model_filename.as_str(),
        )))
        .chain(
            config
                .cc_model_filenames
                .values()
                .map(|v| ("cc_model_filenames", v.as_str())),
        );
    for (field, value) in named {
        if !value.is_empty() && !plain_file_name(value) {
            return Err(format!(
                "the config override's {field} '{}' must be a plain file name (no folders): \
                 a configuration sent over the network cannot point at files outside the \
                 model's folders",
                clip(value)
            ));
        }
    }
    if allow_python {
        return Ok(());
    }
    if with_files && backend_name(config) == "python" {
        return Err(format!(
            "model files were uploaded for backend 'python', which would run them as code: \
             uploaded Python never runs unless the server is started with {ALLOW_PYTHON_FLAG}"
        ));
    }
    if let Some(env) = config.parameters.get("EXECUTION_ENV_PATH") {
        let path = env.string_value.as_str();
        let into_upload = (with_files && path.contains("$$TRITON_MODEL_DIRECTORY"))
            || is_upload_path(Path::new(path));
        if into_upload {
            return Err(format!(
                "parameter EXECUTION_ENV_PATH '{}' points into uploaded files, which the Python \
                 backend would unpack and run: not allowed unless the server is started with \
                 {ALLOW_PYTHON_FLAG}",
                clip(path)
            ));
        }
    }
    Ok(())
}

/// `path` with `.` and `..` resolved lexically (no file system access).
fn normalize(path: &Path) -> PathBuf {
    let mut out = PathBuf::new();
    for c in path.components() {
        match c {
            Component::ParentDir => {
                out.pop();
            }
            Component::CurDir => {}
            other => out.push(other),
        }
    }
    out
}

/// Whether `path` lies in a folder that holds uploaded model files (looked
/// at as written and, where it exists, with its links resolved).
pub fn is_upload_path(path: &Path) -> bool {
    let under = |p: &Path, tmp: &Path| {
        p.strip_prefix(tmp)
            .ok()
            .and_then(|rest| rest.components().next())
            .and_then(|first| first.as_os_str().to_str())
            .is_some_and(|first| first.starts_with(UPLOAD_PREFIX))
    };
    let tmp = std::env::temp_dir();
    let tmp_real = tmp.canonicalize().unwrap_or_else(|_| tmp.clone());
    let lexical = normalize(path);
    if under(&lexical, &tmp) || under(&lexical, &tmp_real) {
        return true;
    }
    path.canonicalize()
        .is_ok_and(|real| under(&real, &tmp_real) || under(&real, &tmp))
}

/// A fresh private folder for one upload: `<tmp>/shardserve-load-<pid>-<n>-<random>`,
/// created with mode 0700 and never through an existing path (a folder or
/// link planted at that name makes the creation fail).
pub fn create_upload_root(serial: u64) -> std::io::Result<PathBuf> {
    use std::os::unix::fs::DirBuilderExt;
    let mut h = std::collections::hash_map::RandomState::new().build_hasher();
    h.write_u64(serial);
    h.write_u128(
        std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map(|d| d.as_nanos())
            .unwrap_or_default(),
    );
    let root = std::env::temp_dir().join(format!(
        "{UPLOAD_PREFIX}{}-{serial}-{:016x}",
        std::process::id(),
        h.finish()
    ));
    std::fs::DirBuilder::new().mode(0o700).create(&root)?;
    Ok(root)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn files(list: &[(&str, &[u8])]) -> Vec<(String, Bytes)> {
        list.iter()
            .map(|(n, d)| (n.to_string(), Bytes::copy_from_slice(d)))
            .collect()
    }

    #[test]
    fn native_code_is_refused_by_content_and_name_whatever_the_flag() {
        for allow in [false, true] {
            for (name, data) in [
                ("1/model.onnx", &b"\x7fELF\x02\x01\x01"[..]),
                ("libtriton_x.so", b"not really a library"),
                ("1/libfoo.so.1", b""),
                ("1/libfoo.so.1.2.3", b""),
                ("x.dylib", b""),
                ("model.bin", &[0xcf, 0xfa, 0xed, 0xfe, 0, 0]),
            ] {
                let e = check_files(&files(&[(name, data)]), allow).unwrap_err();
                assert!(e.contains(name), "{e}");
                assert!(e.contains("never become code"), "{e}");
            }
        }
        let mut pe = vec![0u8; 0x90];
        pe[..2].copy_from_slice(b"MZ");
        pe[0x3c] = 0x80;
        pe[0x80..0x84].copy_from_slice(b"PE\0\0");
        assert!(check_files(&files(&[("1/model.plan", &pe)]), true).is_err());
        // A bare "MZ" prefix is data.
        assert!(check_files(&files(&[("1/model.plan", b"MZ....")]), false).is_ok());
    }

    #[test]
    fn python_is_refused_unless_allowed() {
        for (name, data) in [
            ("1/model.py", &b"import os"[..]),
            ("model.PY", b""),
            ("1/model.bin", b"\x6f\x0d\r\n\0\0\0\0"),
            ("1/__pycache__/model.cpython-311.pyc", b""),
            ("run", b"#!/bin/sh\necho hi"),
        ] {
            let e = check_files(&files(&[(name, data)]), false).unwrap_err();
            assert!(e.contains(name) && e.contains(ALLOW_PYTHON_FLAG), "{e}");
            assert!(check_files(&files(&[(name, data)]), true).is_ok());
        }
        for fine in [
            "1/model.onnx",
            "1/resnet.solver.onnx",
            "labels.txt",
            "1/model.plan",
        ] {
            assert!(
                check_files(&files(&[(fine, b"\x08\x07\x12")]), false).is_ok(),
                "{fine}"
            );
        }
    }

    #[test]
    fn config_overrides_cannot_name_paths_or_upload_python() {
        let with = |f: &dyn Fn(&mut ModelConfig)| {
            let mut c = ModelConfig {
                backend: "onnxruntime".into(),
                ..Default::default()
            };
            f(&mut c);
            c
        };
        for bad in ["/usr/lib/libx.so", "../x.so", "a/b.so", ".."] {
            let c = with(&|c| c.runtime = bad.into());
            assert!(check_config(&c, false, true).is_err(), "{bad}");
            let c = with(&|c| c.default_model_filename = bad.into());
            assert!(check_config(&c, false, true).is_err(), "{bad}");
        }
        let c = with(&|c| c.runtime = "libtriton_onnxruntime.so".into());
        assert!(check_config(&c, true, false).is_ok());
        let py = with(&|c| c.backend = "python".into());
        assert!(check_config(&py, true, false)
            .unwrap_err()
            .contains(ALLOW_PYTHON_FLAG));
        assert!(check_config(&py, false, false).is_ok());
        assert!(check_config(&py, true, true).is_ok());
        let env = with(&|c| {
            c.parameters.insert(
                "EXECUTION_ENV_PATH".into(),
                crate::proto::inference::ModelParameter {
                    string_value: "$$TRITON_MODEL_DIRECTORY/env.tar.gz".into(),
                },
            );
        });
        assert!(check_config(&env, true, false).is_err());
        assert!(check_config(&env, false, false).is_ok());
        let planted = std::env::temp_dir().join("x/../shardserve-load-1-2-3/m/env.tar.gz");
        let env = with(&|c| {
            c.parameters.insert(
                "EXECUTION_ENV_PATH".into(),
                crate::proto::inference::ModelParameter {
                    string_value: planted.to_string_lossy().into_owned(),
                },
            );
        });
        assert!(check_config(&env, false, false).is_err());
    }

    #[test]
    fn upload_roots_are_private_fresh_and_recognized() {
        use std::os::unix::fs::PermissionsExt;
        let root = create_upload_root(u64::MAX).unwrap();
        let mode = std::fs::metadata(&root).unwrap().permissions().mode();
        assert_eq!(mode & 0o777, 0o700);
        assert!(is_upload_path(&root.join("m/1")));
        assert!(!is_upload_path(Path::new("/srv/models/m")));
        // The same name cannot be created twice (nor through a planted link).
        assert!(std::fs::DirBuilder::new().create(&root).is_err());
        std::fs::remove_dir(&root).unwrap();
    }
}
