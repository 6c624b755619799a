//! Triton fills `backend`, `platform` and `default_model_filename` from
//! each other and from the model's files before anything else reads the
//! configuration, whether or not auto-complete is on (core's
//! `AutoCompleteBackendFields`): `platform: "tensorrt_plan"` means backend
//! `tensorrt` (library `libtriton_tensorrt.so`), a folder holding only
//! `1/model.onnx` is an `onnxruntime` / `onnxruntime_onnx` model, and so on.

use std::path::Path;

use crate::proto::inference::ModelConfig;

/// The backend a platform name is served by (Triton's platform → backend
/// mapping), or `None` for a name that is not a known platform.
pub fn backend_of_platform(platform: &str) -> Option<&'static str> {
    Some(match platform {
        "tensorrt_plan" => "tensorrt",
        "onnxruntime_onnx" => "onnxruntime",
        "pytorch_libtorch" | "pytorch_torchscript" => "pytorch",
        "torch_aoti" => "pytorch_aoti",
        "tensorflow_graphdef" | "tensorflow_savedmodel" => "tensorflow",
        _ => return None,
    })
}

/// Fills the backend fields as Triton does; `model_dir` is the model
/// folder (its lowest-numbered version folder is looked at, as Triton
/// looks at the first in its sorted listing).
pub fn complete_backend_fields(config: &mut ModelConfig, model_dir: &Path) {
    let first_version = first_version_dir(model_dir);
    let has = |file: &str, dir: bool| {
        first_version
            .as_ref()
            .map(|v| v.join(file))
            .is_some_and(|p| if dir { p.is_dir() } else { p.is_file() })
    };
    let has_any = |file: &str| {
        first_version
            .as_ref()
            .is_some_and(|v| v.join(file).exists())
    };
    let unset = |c: &ModelConfig| c.platform.is_empty() && c.default_model_filename.is_empty();

    // TensorFlow: the platform decides.
    if config.platform.is_empty() && (config.backend.is_empty() || config.backend == "tensorflow") {
        match config.default_model_filename.as_str() {
            "model.savedmodel" => config.platform = "tensorflow_savedmodel".into(),
            "model.graphdef" => config.platform = "tensorflow_graphdef".into(),
            "" if has("model.savedmodel", true) => config.platform = "tensorflow_savedmodel".into(),
            "" if has("model.graphdef", false) => config.platform = "tensorflow_graphdef".into(),
            _ => {}
        }
    }
    if let Some(file) = match config.platform.as_str() {
        "tensorflow_savedmodel" => Some("model.savedmodel"),
        "tensorflow_graphdef" => Some("model.graphdef"),
        _ => None,
    } {
        set_if_empty(&mut config.backend, "tensorflow");
        set_if_empty(&mut config.default_model_filename, file);
        return;
    }
    // TensorRT, ONNX Runtime, OpenVINO.
    for (backend, platform, file, is_dir) in [
        ("tensorrt", Some("tensorrt_plan"), "model.plan", Some(false)),
        ("onnxruntime", Some("onnxruntime_onnx"), "model.onnx", None),
        ("openvino", None, "model.xml", None),
    ] {
        if config.backend.is_empty() {
            let named = platform.is_some_and(|p| config.platform == p)
                || config.default_model_filename == file;
            let found = unset(config)
                && match is_dir {
                    Some(d) => has(file, d),
                    None => has_any(file),
                };
            if named || found {
                config.backend = backend.into();
            }
        }
        if config.backend == backend {
            if let Some(p) = platform {
                set_if_empty(&mut config.platform, p);
            }
            set_if_empty(&mut config.default_model_filename, file);
            return;
        }
    }
    // PyTorch.
    if config.backend.is_empty() {
        if matches!(
            config.platform.as_str(),
            "pytorch_libtorch" | "pytorch_torchscript"
        ) || config.default_model_filename == "model.pt"
        {
            config.backend = "pytorch".into();
        } else if config.platform == "torch_aoti" || config.default_model_filename == "model.pt2" {
            config.backend = "pytorch_aoti".into();
        } else if unset(config) && has("model.pt", false) {
            config.backend = "pytorch".into();
            config.platform = "pytorch_libtorch".into();
        }
    }
    if config.backend == "pytorch" {
        if config.platform.is_empty() {
            config.platform = "pytorch_libtorch".into();
            set_if_empty(&mut config.default_model_filename, "model.pt");
        }
        return;
    }
    // Python.
    if config.backend.is_empty()
        && (config.default_model_filename == "model.py" || (unset(config) && has_any("model.py")))
    {
        config.backend = "python".into();
    }
    if config.backend == "python" {
        set_if_empty(&mut config.default_model_filename, "model.py");
    }
}

fn set_if_empty(field: &mut String, value: &str) {
    if field.is_empty() {
        *field = value.to_string();
    }
}

fn first_version_dir(model_dir: &Path) -> Option<std::path::PathBuf> {
    // Triton takes the first subfolder name in sorted (string) order.
    let mut dirs: Vec<String> = std::fs::read_dir(model_dir)
        .ok()?
        .flatten()
        .filter(|e| e.path().is_dir())
        .filter_map(|e| e.file_name().into_string().ok())
        .collect();
    dirs.sort();
    dirs.first().map(|d| model_dir.join(d))
}

#[cfg(test)]
mod tests {
    use super::*;

    fn filled(config: &str, files: &[&str]) -> ModelConfig {
        static NEXT: std::sync::atomic::AtomicUsize = std::sync::atomic::AtomicUsize::new(0);
        let n = NEXT.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
        let dir = std::env::temp_dir().join(format!("backend_fields_{}_{n}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        for f in files {
            let p = dir.join(f);
            std::fs::create_dir_all(p.parent().unwrap()).unwrap();
            std::fs::write(p, b"x").unwrap();
        }
        let mut c = crate::config::parse_model_config(config).unwrap();
        complete_backend_fields(&mut c, &dir);
        std::fs::remove_dir_all(&dir).unwrap();
        c
    }

    #[test]
    fn platforms_name_their_backends() {
        let c = filled(r#"platform: "tensorrt_plan""#, &[]);
        assert_eq!(
            (c.backend.as_str(), c.default_model_filename.as_str()),
            ("tensorrt", "model.plan")
        );
        let c = filled(r#"platform: "onnxruntime_onnx""#, &[]);
        assert_eq!(
            (c.backend.as_str(), c.default_model_filename.as_str()),
            ("onnxruntime", "model.onnx")
        );
        let c = filled(r#"platform: "pytorch_libtorch""#, &[]);
        assert_eq!(c.backend, "pytorch");
        let c = filled(r#"platform: "tensorflow_savedmodel""#, &[]);
        assert_eq!(
            (c.backend.as_str(), c.default_model_filename.as_str()),
            ("tensorflow", "model.savedmodel")
        );
        for (p, b) in [
            ("tensorrt_plan", "tensorrt"),
            ("onnxruntime_onnx", "onnxruntime"),
            ("pytorch_libtorch", "pytorch"),
            ("tensorflow_graphdef", "tensorflow"),
        ] {
            assert_eq!(backend_of_platform(p), Some(b));
        }
    }

    #[test]
    fn backends_get_their_platform_and_files_their_backend() {
        let c = filled(r#"backend: "onnxruntime""#, &[]);
        assert_eq!(c.platform, "onnxruntime_onnx");
        let c = filled(r#"backend: "tensorrt""#, &[]);
        assert_eq!(c.platform, "tensorrt_plan");
        let c = filled("max_batch_size: 1", &["1/model.onnx"]);
        assert_eq!(
            (c.backend.as_str(), c.platform.as_str()),
            ("onnxruntime", "onnxruntime_onnx")
        );
        let c = filled("max_batch_size: 1", &["1/model.py"]);
        assert_eq!(
            (
                c.backend.as_str(),
                c.platform.as_str(),
                c.default_model_filename.as_str()
            ),
            ("python", "", "model.py")
        );
        let c = filled(r#"backend: "python""#, &[]);
        assert_eq!(c.default_model_filename, "model.py");
        // A custom backend is left alone.
        let c = filled(r#"backend: "simple""#, &["1/model.onnx"]);
        assert_eq!(
            (
                c.backend.as_str(),
                c.platform.as_str(),
                c.default_model_filename.as_str()
            ),
            ("simple", "", "")
        );
    }
}
