//! Compiles `proto/` into prost messages and tonic services, and writes the
//! descriptor set that `config::text_format` parses `config.pbtxt` against.

use std::{env, path::PathBuf, process::Command};

fn main() -> Result<(), Box<dyn std::error::Error>> {
    let protoc = protoc_bin_vendored::protoc_bin_path()?;
    // SAFETY: build scripts are single-threaded; nothing else reads the environment concurrently.
    unsafe { env::set_var("PROTOC", protoc) };
    let out = PathBuf::from(env::var("OUT_DIR")?);

    tonic_prost_build::configure()
        .build_server(true)
        .build_client(true)
        .build_transport(false)
        .generate_default_stubs(true)
        .bytes(".inference.ModelInferRequest.raw_input_contents")
        .bytes(".inference.ModelInferResponse.raw_output_contents")
        .file_descriptor_set_path(out.join("shardserve_descriptor.bin"))
        .compile_protos(
            &[
                "proto/model_config.proto",
                "proto/grpc_service.proto",
                "proto/health.proto",
            ],
            &["proto"],
        )?;
    println!("cargo:rerun-if-changed=proto");
    // The backend C API: a dlopened `libtriton_<name>.so` binds to the
    // executable's `TRITONSERVER_*`/`TRITONBACKEND_*` functions, so the
    // binaries put them in their dynamic symbol table (see
    // `src/backend/capi/mod.rs`). GNU ld and lld take globs here.
    if env::var("CARGO_CFG_TARGET_OS").as_deref() == Ok("linux") {
        for pattern in ["TRITONSERVER_*", "TRITONBACKEND_*"] {
            // Tests too: an in-process test server may load a C backend.
            for kind in ["bins", "tests"] {
                println!("cargo:rustc-link-arg-{kind}=-Wl,--export-dynamic-symbol={pattern}");
            }
        }
    }
    git_commit();
    Ok(())
}

/// `SHARDSERVE_COMMIT` for `--version`: the short commit id, or "unknown"
/// when building from a tarball without `.git` (or without git). Reruns
/// only when HEAD moves: HEAD itself, the branch file it names, and
/// packed-refs (where `git gc` moves branch files).
fn git_commit() {
    let git = |args: &[&str]| -> Option<String> {
        let out = Command::new("git").args(args).output().ok()?;
        if !out.status.success() {
            return None;
        }
        let text = String::from_utf8(out.stdout).ok()?;
        let text = text.trim();
        (!text.is_empty()).then(|| text.to_owned())
    };
    let commit = git(&["rev-parse", "--short=12", "HEAD"]);
    if commit.is_some() {
        if let Some(git_dir) = git(&["rev-parse", "--absolute-git-dir"]) {
            let git_dir = PathBuf::from(git_dir);
            println!("cargo:rerun-if-changed={}", git_dir.join("HEAD").display());
            let common = git(&["rev-parse", "--git-common-dir"])
                .map(PathBuf::from)
                .map(|p| if p.is_absolute() { p } else { git_dir.join(p) })
                .unwrap_or_else(|| git_dir.clone());
            // Watched only where it exists: cargo treats a missing file
            // as changed, which would rerun this (and rebuild the crate)
            // on every build.
            let packed = common.join("packed-refs");
            if packed.exists() {
                println!("cargo:rerun-if-changed={}", packed.display());
            }
            if let Some(branch) = git(&["symbolic-ref", "-q", "HEAD"]) {
                println!("cargo:rerun-if-changed={}", common.join(branch).display());
            }
        }
    }
    println!(
        "cargo:rustc-env=SHARDSERVE_COMMIT={}",
        commit.as_deref().unwrap_or("unknown")
    );
}
