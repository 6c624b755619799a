//! Issue 21: files uploaded through the repository API never become code
//! (native libraries never, Python only with the operator's opt-in), load
//! uploads count in the shard's body budget, and broken symbolic links in
//! a repository are reported in the index.

mod common;

use std::{
    path::{Path, PathBuf},
    process::Command,
};

use base64::Engine as _;
use common::*;
use serde_json::{json, Value};
use shardserve::{
    proto::inference::{
        model_repository_parameter::ParameterChoice, ModelRepositoryParameter,
        RepositoryModelLoadRequest,
    },
    server::{ModelControlMode, ServerHandle, ServerOptions},
};

const SIMPLE_CONFIG: &str = r#"name: "a"
backend: "simple"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] }, { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"#;

/// A scratch folder of this test process, removed on drop.
struct Scratch(PathBuf);

impl Scratch {
    fn new(tag: &str) -> Self {
        let dir = std::env::temp_dir().join(format!("shardserve-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&dir);
        std::fs::create_dir_all(&dir).unwrap();
        Self(dir)
    }
}

impl Drop for Scratch {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

/// Compiles `tests/capi_backends/upload_marker.c` with its marker at
/// `marker`: a shared library whose constructor creates that file.
fn marker_library(out: &Path, marker: &Path) -> Vec<u8> {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror"])
        .arg(format!("-DMARKER=\"{}\"", marker.display()))
        .arg(root.join("tests/capi_backends/upload_marker.c"))
        .arg("-o")
        .arg(out)
        .status()
        .expect("run cc (scripts/setup.sh installs gcc)");
    assert!(status.success(), "compiling upload_marker.c failed");
    std::fs::read(out).unwrap()
}

fn explicit_server(
    repo: &Path,
    cores: usize,
    tweak: impl FnOnce(&mut ServerOptions),
) -> ServerHandle {
    let mut opts = ServerOptions::for_tests(repo);
    opts.cores = Some(cores);
    opts.model_control_mode = ModelControlMode::Explicit;
    tweak(&mut opts);
    start_with(opts)
}

fn b64(data: &[u8]) -> String {
    base64::engine::general_purpose::STANDARD.encode(data)
}

fn http_load(
    server: &ServerHandle,
    model: &str,
    config: Value,
    files: &[(&str, &[u8])],
) -> HttpReply {
    let mut params = serde_json::Map::new();
    params.insert("config".into(), json!(config.to_string()));
    for (name, data) in files {
        params.insert(format!("file:{name}"), json!(b64(data)));
    }
    post_json(
        server.http_addr(),
        &format!("/v2/repository/models/{model}/load"),
        &json!({ "parameters": params }),
    )
}

fn grpc_load(
    server: &ServerHandle,
    model: &str,
    config: Value,
    files: &[(&str, &[u8])],
) -> Result<(), tonic::Status> {
    let mut parameters = std::collections::HashMap::new();
    parameters.insert(
        "config".to_string(),
        ModelRepositoryParameter {
            parameter_choice: Some(ParameterChoice::StringParam(config.to_string())),
        },
    );
    for (name, data) in files {
        parameters.insert(
            format!("file:{name}"),
            ModelRepositoryParameter {
                parameter_choice: Some(ParameterChoice::BytesParam(data.to_vec())),
            },
        );
    }
    let addr = server.grpc_addr();
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    rt.block_on(async move {
        grpc_client(addr)
            .await
            .repository_model_load(RepositoryModelLoadRequest {
                model_name: model.into(),
                parameters,
                ..Default::default()
            })
            .await
            .map(|_| ())
    })
}

fn live(server: &ServerHandle) -> bool {
    get(server.http_addr(), "/v2/health/live").status == 200
}

#[test]
fn uploaded_native_code_never_runs() {
    let scratch = Scratch::new("upload-native");
    let repo = scratch.0.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let marker = scratch.0.join("constructor-ran");
    let library = marker_library(&scratch.0.join("libtriton_x.so"), &marker);
    // The opt-in for Python changes nothing for native code.
    for allow_python in [false, true] {
        let server = explicit_server(&repo, 1, |o| {
            o.model_load_allow_uploaded_python = allow_python
        });
        for file in ["libtriton_x.so", "1/libtriton_x.so", "1/model.onnx"] {
            let config = json!({"backend": "x"});
            // A version folder, so that the library search would run.
            let upload: &[(&str, &[u8])] = &[("1/config.txt", b"v"), (file, &library)];
            let r = http_load(&server, "x", config.clone(), upload);
            assert_eq!(r.status, 400, "{file}: {}", r.error());
            let e = r.error();
            assert!(e.starts_with("failed to load 'x'"), "{e}");
            assert!(
                e.contains(&format!("'{file}'")),
                "the answer names the file: {e}"
            );
            let e = grpc_load(&server, "x", config, upload).unwrap_err();
            assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
            assert!(e.message().contains(&format!("'{file}'")), "{e:?}");
            assert!(
                !marker.exists(),
                "the uploaded library's constructor ran ({file})"
            );
        }
        // Beside a harmless upload, and for a model of another backend.
        let r = http_load(
            &server,
            "a",
            json!({"backend": "simple"}),
            &[("1/data.bin", b"data"), ("1/model.onnx", &library)],
        );
        assert_eq!(r.status, 400, "{}", r.error());
        assert!(!marker.exists());
        assert!(live(&server));
        server.shutdown().unwrap();
    }
}

#[test]
fn uploaded_python_needs_the_opt_in() {
    let scratch = Scratch::new("upload-python");
    let repo = scratch.0.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    let simple = || {
        json!({"backend": "simple", "max_batch_size": 8,
            "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
                      {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]}],
            "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]},
                       {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]}]})
    };
    let py: &[u8] = b"import os\nos.system('touch /tmp/pwned')\n";
    let server = explicit_server(&repo, 1, |_| {});
    let refused = [
        (simple(), "1/model.py", py),
        // The Python backend runs whatever default_model_filename names.
        (
            json!({"backend": "python", "default_model_filename": "model.txt"}),
            "1/model.txt",
            py,
        ),
        // CPython 3.11 bytecode under a harmless name.
        (
            simple(),
            "1/model.bin",
            b"\xa7\x0d\r\n\0\0\0\0\0\0\0\0\0\0\0\0",
        ),
    ];
    for (config, file, data) in &refused {
        let r = http_load(&server, "p", config.clone(), &[(file, data)]);
        assert_eq!(r.status, 400, "{file}: {}", r.error());
        let e = r.error();
        assert!(
            e.contains("--model-load-allow-uploaded-python"),
            "the answer names the flag: {e}"
        );
        let e = grpc_load(&server, "p", config.clone(), &[(file, data)]).unwrap_err();
        assert_eq!(e.code(), tonic::Code::InvalidArgument, "{e:?}");
    }
    let named = http_load(&server, "p", simple(), &[("1/model.py", py)]).error();
    assert!(named.contains("'1/model.py'"), "{named}");
    // An execution environment inside the upload would be unpacked and run.
    let mut env = simple();
    env["parameters"] = json!({"EXECUTION_ENV_PATH":
        {"string_value": "$$TRITON_MODEL_DIRECTORY/env.tar.gz"}});
    let r = http_load(
        &server,
        "p",
        env,
        &[("env.tar.gz", b"\x1f\x8b\x08\0"), ("1/x", b"")],
    );
    assert_eq!(r.status, 400, "{}", r.error());
    assert!(r.error().contains("EXECUTION_ENV_PATH"), "{}", r.error());
    // A config override names files, never paths.
    for (field, value) in [
        ("runtime", "/usr/lib/libtriton_x.so"),
        ("default_model_filename", "../../x"),
    ] {
        let mut c = simple();
        c[field] = json!(value);
        let r = http_load(&server, "p", c, &[("1/x", b"")]);
        assert_eq!(r.status, 400, "{field}: {}", r.error());
        assert!(r.error().contains(field), "{}", r.error());
    }
    // Data uploads still load.
    let r = http_load(&server, "p", simple(), &[("1/data.bin", b"weights")]);
    assert_eq!(r.status, 200, "{}", r.error());
    assert!(live(&server));
    server.shutdown().unwrap();

    // With the opt-in the same Python upload is accepted.
    let server = explicit_server(&repo, 1, |o| o.model_load_allow_uploaded_python = true);
    let r = http_load(&server, "p", simple(), &[("1/model.py", py)]);
    assert_eq!(r.status, 200, "{}", r.error());
    grpc_load(&server, "p", simple(), &[("1/model.py", py)]).unwrap();
    server.shutdown().unwrap();
}

#[test]
fn uploaded_folders_are_never_searched_for_backend_libraries() {
    // Even a library that got past the content checks (here written by
    // hand into a folder named as an upload) is not found there.
    let root = std::env::temp_dir().join(format!("shardserve-load-{}-test", std::process::id()));
    let model = root.join("x");
    std::fs::create_dir_all(model.join("1")).unwrap();
    std::fs::write(model.join("libtriton_x.so"), b"\x7fELF").unwrap();
    std::fs::write(model.join("1/libtriton_x.so"), b"\x7fELF").unwrap();
    let found = shardserve::backend::capi::backend::find_library("x", "", &model, &model.join("1"));
    let _ = std::fs::remove_dir_all(&root);
    let e = format!("{:#}", found.unwrap_err());
    assert!(
        e.contains("never in a model folder sent with a load request"),
        "{e}"
    );
}

fn index(server: &ServerHandle) -> Vec<Value> {
    let r = post_json(server.http_addr(), "/v2/repository/index", &json!({}));
    assert_eq!(r.status, 200, "{}", r.error());
    r.json().as_array().cloned().unwrap()
}

fn row<'a>(rows: &'a [Value], name: &str) -> &'a Value {
    rows.iter()
        .find(|r| r["name"] == name)
        .unwrap_or_else(|| panic!("{name} is missing from the index: {rows:?}"))
}

#[test]
fn broken_symlinks_are_reported_in_the_index() {
    use std::os::unix::fs::symlink;
    let scratch = Scratch::new("broken-links");
    let repo = scratch.0.join("repo");
    for m in ["a", "badcfg", "badver"] {
        std::fs::create_dir_all(repo.join(m).join("1")).unwrap();
    }
    std::fs::write(repo.join("a/config.pbtxt"), SIMPLE_CONFIG).unwrap();
    std::fs::write(
        repo.join("badver/config.pbtxt"),
        SIMPLE_CONFIG.replace("name: \"a\"", "name: \"badver\"") + "version_policy: { all: {} }\n",
    )
    .unwrap();
    symlink("loop", repo.join("loop")).unwrap();
    symlink(scratch.0.join("nowhere"), repo.join("dangling")).unwrap();
    symlink("config.pbtxt", repo.join("badcfg/config.pbtxt")).unwrap();
    symlink("2", repo.join("badver/2")).unwrap();

    for mode in [ModelControlMode::None, ModelControlMode::Explicit] {
        let mut opts = ServerOptions::for_tests(&repo);
        opts.cores = Some(1);
        opts.model_control_mode = mode;
        let server = start_with(opts);
        let rows = index(&server);
        for name in ["loop", "dangling"] {
            let r = row(&rows, name);
            assert_eq!(r["state"], "UNAVAILABLE", "{mode:?} {r}");
            let reason = r["reason"].as_str().unwrap();
            assert!(
                reason.contains("symbolic link that cannot be followed"),
                "{reason}"
            );
        }
        if mode == ModelControlMode::None {
            assert!(
                rows.iter()
                    .any(|r| r["name"] == "a" && r["state"] == "READY"),
                "{rows:?}"
            );
            let r = row(&rows, "badcfg");
            assert_eq!(r["state"], "UNAVAILABLE", "{r}");
            assert!(
                r["reason"].as_str().unwrap().contains("config.pbtxt"),
                "{r}"
            );
            // The broken version fails with its reason; version 1 serves.
            let versions: Vec<&Value> = rows.iter().filter(|r| r["name"] == "badver").collect();
            let v1 = versions.iter().find(|r| r["version"] == "1").unwrap();
            let v2 = versions.iter().find(|r| r["version"] == "2").unwrap();
            assert_eq!(v1["state"], "READY", "{versions:?}");
            assert_eq!(v2["state"], "UNAVAILABLE", "{versions:?}");
            assert!(
                v2["reason"].as_str().unwrap().contains("symbolic link"),
                "{v2}"
            );
        } else {
            let r = post_json(
                server.http_addr(),
                "/v2/repository/models/loop/load",
                &json!({}),
            );
            assert_eq!(r.status, 500, "{}", r.error());
            assert!(r.error().contains("symbolic link"), "{}", r.error());
            let r = post_json(
                server.http_addr(),
                "/v2/repository/models/a/load",
                &json!({}),
            );
            assert_eq!(r.status, 200, "{}", r.error());
        }
        server.shutdown().unwrap();
    }
}

#[test]
fn uploads_count_in_the_buffer_budget() {
    let scratch = Scratch::new("upload-budget");
    let repo = scratch.0.join("repo");
    std::fs::create_dir_all(&repo).unwrap();
    // One accepting shard with a 1 MiB budget.
    let server = explicit_server(&repo, 1, |o| o.max_buffered_request_bytes = Some(1 << 20));
    let config = json!({"backend": "simple", "max_batch_size": 8,
        "input": [{"name": "INPUT0", "data_type": "TYPE_INT32", "dims": [16]},
                  {"name": "INPUT1", "data_type": "TYPE_INT32", "dims": [16]}],
        "output": [{"name": "OUTPUT0", "data_type": "TYPE_INT32", "dims": [16]},
                   {"name": "OUTPUT1", "data_type": "TYPE_INT32", "dims": [16]}]});
    // ~850 KiB of body fits alone; with its 640 KiB decoded it does not.
    let big = vec![7u8; 640 << 10];
    let r = http_load(&server, "a", config.clone(), &[("1/weights", &big)]);
    assert_eq!(r.status, 503, "{}", r.error());
    assert!(
        r.error().contains("--max-buffered-request-bytes"),
        "{}",
        r.error()
    );
    let e = grpc_load(
        &server,
        "a",
        config.clone(),
        &[("1/weights", &vec![7u8; 3 << 19])],
    )
    .unwrap_err();
    assert_eq!(e.code(), tonic::Code::Unavailable, "{e:?}");
    // What was reserved went back: smaller uploads load.
    let small = vec![7u8; 200 << 10];
    let r = http_load(&server, "a", config.clone(), &[("1/weights", &small)]);
    assert_eq!(r.status, 200, "{}", r.error());
    grpc_load(&server, "a", config, &[("1/weights", &small)]).unwrap();
    server.shutdown().unwrap();
}
