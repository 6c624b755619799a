//! A client that truncates (`ftruncate`) a registered system shared memory
//! object: before an inference, or while the model runs, for an input and
//! for an output region, over HTTP and gRPC. The request fails with an
//! error naming the region, the server keeps serving other regions, the
//! region stays broken until unregistered, and unregistering it works.
//! Against the server as a child process, since without the SIGBUS
//! handler such a truncation kills it; plus the handler itself in this
//! process, on a plain thread, and a SIGBUS outside any region, which must
//! still kill (a child of this test binary).

mod common;

use std::{
    ffi::CString,
    path::{Path, PathBuf},
    process::Command,
    time::Duration,
};

use common::{child::ChildServer, grpc_client, post_json, wait_for, TempRepo};
use serde_json::json;
use shardserve::proto::inference::{
    infer_parameter::ParameterChoice, model_infer_request::InferInputTensor,
    model_infer_request::InferRequestedOutputTensor, InferParameter, ModelInferRequest,
};

const PAGE: usize = 4096;

/// A POSIX shm object made as tritonclient makes one, written and
/// truncated through its descriptor; unlinked on drop.
struct ShmObject {
    key: String,
    fd: i32,
}

impl ShmObject {
    fn new(tag: &str, len: usize) -> Self {
        let key = format!("/ss_trunc_{tag}_{}", std::process::id());
        let c = CString::new(key.clone()).unwrap();
        // SAFETY: plain libc calls on a fresh name; results checked.
        let fd = unsafe {
            libc::shm_unlink(c.as_ptr());
            libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600)
        };
        assert!(fd >= 0, "shm_open {key}");
        let o = Self { key, fd };
        o.truncate(len);
        o
    }

    fn truncate(&self, len: usize) {
        // SAFETY: fd is open.
        assert_eq!(unsafe { libc::ftruncate(self.fd, len as libc::off_t) }, 0);
    }

    fn write(&self, offset: usize, data: &[u8]) {
        // SAFETY: fd is open; data is a valid buffer.
        let n = unsafe {
            libc::pwrite(
                self.fd,
                data.as_ptr().cast(),
                data.len(),
                offset as libc::off_t,
            )
        };
        assert_eq!(n, data.len() as isize);
    }

    fn read(&self, offset: usize, len: usize) -> Vec<u8> {
        let mut buf = vec![0u8; len];
        // SAFETY: fd is open; buf is len bytes.
        let n =
            unsafe { libc::pread(self.fd, buf.as_mut_ptr().cast(), len, offset as libc::off_t) };
        assert_eq!(n, len as isize);
        buf
    }
}

impl Drop for ShmObject {
    fn drop(&mut self) {
        let c = CString::new(self.key.clone()).unwrap();
        // SAFETY: undoing what `new` did.
        unsafe {
            libc::close(self.fd);
            libc::shm_unlink(c.as_ptr());
        }
    }
}

fn i32_bytes(v: &[i32]) -> Vec<u8> {
    v.iter().flat_map(|x| x.to_le_bytes()).collect()
}

/// Compiles `tests/capi_backends/lifecycle.c` (copies INPUT0 to OUTPUT0
/// after sleeping `execute_sleep_ms`, logging the start of each
/// execution) into `<dir>/capi_lifecycle/`.
fn build_backend(dir: &Path) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"));
    let out_dir = dir.join("capi_lifecycle");
    std::fs::create_dir_all(&out_dir).expect("backend dir");
    let status = Command::new(std::env::var("CC").unwrap_or_else(|_| "cc".into()))
        .args(["-shared", "-fPIC", "-O2", "-Wall", "-Werror", "-I"])
        .arg(root.join("include"))
        .arg(root.join("tests/capi_backends/lifecycle.c"))
        .arg("-o")
        .arg(out_dir.join("libtriton_capi_lifecycle.so"))
        .arg("-lpthread")
        .status()
        .expect("run cc (scripts/setup.sh installs gcc)");
    assert!(status.success(), "compiling lifecycle.c failed");
}

/// A server with `ident` (built-in identity, runs inline on the shard)
/// and `slow` (the C lifecycle backend, 2 s per execution, on a compute
/// worker), both INT32 [4] INPUT0 -> OUTPUT0.
struct Setup {
    _repo: TempRepo,
    base: PathBuf,
    log: PathBuf,
    server: ChildServer,
}

impl Setup {
    fn new(tag: &str) -> Self {
        let base =
            std::env::temp_dir().join(format!("shardserve-trunc-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&base);
        std::fs::create_dir_all(&base).expect("temp dir");
        let backends = base.join("backends");
        build_backend(&backends);
        let log = base.join("lifecycle.log");
        let io = r#"max_batch_size: 0
input [ { name: "INPUT0", data_type: TYPE_INT32, dims: [ 4 ] } ]
output [ { name: "OUTPUT0", data_type: TYPE_INT32, dims: [ 4 ] } ]"#;
        let repo = TempRepo::new(
            &format!("trunc-{tag}-repo"),
            &[
                ("ident", format!("name: \"ident\"\nbackend: \"identity\"\n{io}\n")),
                (
                    "slow",
                    format!(
                        "name: \"slow\"\nbackend: \"capi_lifecycle\"\n{io}\n\
                         instance_group [ {{ count: 1, kind: KIND_CPU }} ]\n\
                         parameters {{ key: \"lifecycle_log\" value: {{ string_value: \"{}\" }} }}\n\
                         parameters {{ key: \"execute_sleep_ms\" value: {{ string_value: \"2000\" }} }}\n",
                        log.display()
                    ),
                ),
            ],
        );
        let server = ChildServer::spawn_in(
            &format!("trunc-{tag}"),
            &repo.root,
            1,
            None,
            &["--backend-directory", backends.to_str().expect("utf-8")],
        );
        Self {
            _repo: repo,
            base,
            log,
            server,
        }
    }

    fn register(&self, name: &str, key: &str, byte_size: usize) -> common::HttpReply {
        post_json(
            self.server.http,
            &format!("/v2/systemsharedmemory/region/{name}/register"),
            &json!({"key": key, "offset": 0, "byte_size": byte_size}),
        )
    }

    fn unregister(&self, name: &str) -> common::HttpReply {
        post_json(
            self.server.http,
            &format!("/v2/systemsharedmemory/region/{name}/unregister"),
            &json!({}),
        )
    }

    /// `model` over HTTP with INPUT0 from `input` at `offset`, and OUTPUT0
    /// into `output` at `offset` when given (else in the response).
    fn infer(
        &self,
        model: &str,
        input: &str,
        output: Option<&str>,
        offset: usize,
    ) -> common::HttpReply {
        infer_http(self.server.http, model, input, output, offset)
    }

    /// Executions the slow model has started.
    fn executions(&self) -> usize {
        std::fs::read_to_string(&self.log)
            .unwrap_or_default()
            .lines()
            .filter(|l| l.starts_with("execute "))
            .count()
    }

    /// Fails unless the server process is alive and ready.
    fn assert_alive(&mut self) {
        assert!(
            self.server.wait_exit(Duration::ZERO).is_none(),
            "the server died:\n{}",
            self.server.log()
        );
        assert_eq!(
            common::get(self.server.http, "/v2/health/ready").status,
            200
        );
    }
}

impl Drop for Setup {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.base);
    }
}

fn infer_http(
    addr: std::net::SocketAddr,
    model: &str,
    input: &str,
    output: Option<&str>,
    offset: usize,
) -> common::HttpReply {
    let mut body = json!({
        "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [4], "parameters": {
            "shared_memory_region": input, "shared_memory_offset": offset,
            "shared_memory_byte_size": 16}}]
    });
    if let Some(out) = output {
        body["outputs"] = json!([{"name": "OUTPUT0", "parameters": {
            "shared_memory_region": out, "shared_memory_offset": offset,
            "shared_memory_byte_size": 16}}]);
    }
    post_json(addr, &format!("/v2/models/{model}/infer"), &body)
}

fn param(choice: ParameterChoice) -> InferParameter {
    InferParameter {
        parameter_choice: Some(choice),
    }
}

fn shm_params(region: &str, offset: usize) -> std::collections::HashMap<String, InferParameter> {
    [
        (
            "shared_memory_region",
            param(ParameterChoice::StringParam(region.into())),
        ),
        (
            "shared_memory_offset",
            param(ParameterChoice::Int64Param(offset as i64)),
        ),
        (
            "shared_memory_byte_size",
            param(ParameterChoice::Int64Param(16)),
        ),
    ]
    .into_iter()
    .map(|(k, v)| (k.to_string(), v))
    .collect()
}

fn grpc_request(
    model: &str,
    input: &str,
    output: Option<&str>,
    offset: usize,
) -> ModelInferRequest {
    ModelInferRequest {
        model_name: model.into(),
        inputs: vec![InferInputTensor {
            name: "INPUT0".into(),
            datatype: "INT32".into(),
            shape: vec![4],
            parameters: shm_params(input, offset),
            ..Default::default()
        }],
        outputs: output
            .map(|out| InferRequestedOutputTensor {
                name: "OUTPUT0".into(),
                parameters: shm_params(out, offset),
            })
            .into_iter()
            .collect(),
        ..Default::default()
    }
}

/// The error of a gRPC ModelInfer, which must fail with INVALID_ARGUMENT.
fn grpc_error(addr: std::net::SocketAddr, request: ModelInferRequest) -> String {
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .expect("runtime");
    rt.block_on(async {
        let mut c = grpc_client(addr).await;
        let status = c.model_infer(request).await.expect_err("the request fails");
        assert_eq!(status.code(), tonic::Code::InvalidArgument, "{status:?}");
        status.message().to_string()
    })
}

fn assert_names(error: &str, region: &str) {
    assert!(
        error.contains(&format!("shared memory region '{region}' is unusable"))
            && error.contains("truncated"),
        "the error should name region '{region}': {error}"
    );
}

#[test]
fn truncated_before_inference_fails_naming_the_region() {
    let mut s = Setup::new("before");
    let input = ShmObject::new("in", 2 * PAGE);
    let spare = ShmObject::new("spare", 2 * PAGE);
    let output = ShmObject::new("out", 2 * PAGE);
    let small = ShmObject::new("small", 64);
    for o in [&input, &spare] {
        o.write(PAGE, &i32_bytes(&[1, 2, 3, 4]));
    }
    small.write(0, &i32_bytes(&[5, 6, 7, 8]));
    for (name, o, size) in [
        ("t_in", &input, 2 * PAGE),
        ("t_spare", &spare, 2 * PAGE),
        ("t_out", &output, 2 * PAGE),
        ("t_small", &small, 64),
    ] {
        let r = s.register(name, &o.key, size);
        assert_eq!(r.status, 200, "register {name}: {}", r.error());
    }
    let ok = s.infer("ident", "t_in", Some("t_out"), PAGE);
    assert_eq!(ok.status, 200, "{}", ok.error());
    assert_eq!(output.read(PAGE, 16), i32_bytes(&[1, 2, 3, 4]));

    // Half: the input's page is gone. Over HTTP and gRPC.
    input.truncate(PAGE);
    let r = s.infer("ident", "t_in", None, PAGE);
    assert_eq!(r.status, 400);
    assert_names(&r.error(), "t_in");
    assert_names(
        &grpc_error(s.server.grpc, grpc_request("ident", "t_in", None, PAGE)),
        "t_in",
    );
    // Other regions still serve, the output one included.
    let ok = s.infer("ident", "t_spare", Some("t_out"), PAGE);
    assert_eq!(ok.status, 200, "{}", ok.error());
    s.assert_alive();

    // Grown back, the region stays broken until it is registered again.
    input.truncate(2 * PAGE);
    input.write(PAGE, &i32_bytes(&[1, 2, 3, 4]));
    assert_names(&s.infer("ident", "t_in", None, PAGE).error(), "t_in");
    assert_eq!(s.unregister("t_in").status, 200);
    assert_eq!(s.register("t_in", &input.key, 2 * PAGE).status, 200);
    let ok = s.infer("ident", "t_in", Some("t_out"), PAGE);
    assert_eq!(ok.status, 200, "{}", ok.error());

    // To zero.
    input.truncate(0);
    assert_names(&s.infer("ident", "t_in", None, PAGE).error(), "t_in");

    // The output region, over HTTP and gRPC.
    output.truncate(0);
    let r = s.infer("ident", "t_spare", Some("t_out"), PAGE);
    assert_eq!(r.status, 400);
    assert_names(&r.error(), "t_out");
    assert_names(
        &grpc_error(
            s.server.grpc,
            grpc_request("ident", "t_spare", Some("t_out"), PAGE),
        ),
        "t_out",
    );

    // Within the last page no access faults (the bytes past the new end
    // read as zeros): the object's size tells.
    small.truncate(32);
    assert_names(&s.infer("ident", "t_small", None, 0).error(), "t_small");

    let ok = s.infer("ident", "t_spare", None, PAGE);
    assert_eq!(ok.status, 200, "{}", ok.error());
    for name in ["t_in", "t_out", "t_small", "t_spare"] {
        assert_eq!(s.unregister(name).status, 200, "unregister {name}");
    }
    s.assert_alive();
    assert!(
        s.server.log().contains("truncated the shm object"),
        "a warning names the region:\n{}",
        s.server.log()
    );
}

/// Truncates `object` once the slow model has started its execution
/// number `started + 1`, while it sleeps, then waits for `request`.
fn truncate_during<T: Send + 'static>(
    s: &Setup,
    object: &ShmObject,
    request: impl FnOnce() -> T + Send + 'static,
) -> T {
    let started = s.executions();
    let pending = std::thread::spawn(request);
    wait_for(
        "the slow model to start executing",
        Duration::from_secs(30),
        || s.executions() > started,
    );
    object.truncate(0);
    pending.join().expect("request thread")
}

#[test]
fn truncated_while_the_model_runs_fails_naming_the_region() {
    let mut s = Setup::new("during");
    let input = ShmObject::new("din", 2 * PAGE);
    let spare = ShmObject::new("dspare", 2 * PAGE);
    let output = ShmObject::new("dout", 2 * PAGE);
    for o in [&input, &spare] {
        o.write(PAGE, &i32_bytes(&[1, 2, 3, 4]));
    }
    for (name, o) in [("d_in", &input), ("d_spare", &spare), ("d_out", &output)] {
        let r = s.register(name, &o.key, 2 * PAGE);
        assert_eq!(r.status, 200, "register {name}: {}", r.error());
    }

    // The input's pages vanish while the backend sleeps; its memcpy from
    // them then faults on the compute worker.
    let http = s.server.http;
    let r = truncate_during(&s, &input, move || {
        infer_http(http, "slow", "d_in", None, PAGE)
    });
    assert_eq!(r.status, 400);
    assert_names(&r.error(), "d_in");
    s.assert_alive();
    let ok = s.infer("ident", "d_spare", Some("d_out"), PAGE);
    assert_eq!(ok.status, 200, "{}", ok.error());

    // The output's pages vanish: the copy into them faults on the shard.
    let grpc = s.server.grpc;
    let error = truncate_during(&s, &output, move || {
        grpc_error(grpc, grpc_request("slow", "d_spare", Some("d_out"), PAGE))
    });
    assert_names(&error, "d_out");
    s.assert_alive();
    let ok = s.infer("ident", "d_spare", None, PAGE);
    assert_eq!(ok.status, 200, "{}", ok.error());
    for name in ["d_in", "d_out", "d_spare"] {
        assert_eq!(s.unregister(name).status, 200, "unregister {name}");
    }
    s.assert_alive();
}

/// The handler in this process: bytes read from a region on a plain
/// thread after the object was truncated come back as zeros instead of
/// killing the process, and the region reports itself broken.
#[test]
fn a_fault_in_a_region_is_absorbed_on_any_thread() {
    let object = ShmObject::new("inproc", 4 * PAGE);
    object.write(2 * PAGE, &[7u8; 64]);
    let registry = shardserve::shm::global();
    registry
        .register_system("inproc", &object.key, 0, (4 * PAGE) as u64)
        .expect("register");
    let r = shardserve::shm::ShmRef {
        region: "inproc".into(),
        offset: (2 * PAGE) as u64,
        byte_size: Some(64),
    };
    let data =
        shardserve::shm::read_input(&r, shardserve::types::DataType::Uint8, 64, &[64], "x", "m")
            .expect("read");
    assert_eq!(&data[..], &[7u8; 64]);
    object.truncate(PAGE);
    let seen = std::thread::spawn(move || data.to_vec())
        .join()
        .expect("the reading thread survives");
    assert_eq!(seen, vec![0u8; 64]);
    let region = registry
        .find("inproc")
        .expect("lookup")
        .expect("registered");
    assert_names(&region.check().expect_err("broken").message, "inproc");
    drop(region);
    registry
        .unregister("inproc", shardserve::shm::Kind::System)
        .expect("unregister");
}

/// Runs in a child of this test binary (see below): a SIGBUS outside any
/// region, with the handler installed, must still kill the process.
#[test]
fn foreign_fault_child() {
    if std::env::var_os("SHARDSERVE_FOREIGN_FAULT_CHILD").is_none() {
        return;
    }
    let object = ShmObject::new("foreign_reg", PAGE);
    shardserve::shm::global()
        .register_system("foreign", &object.key, 0, PAGE as u64)
        .expect("register installs the handler");
    let other = ShmObject::new("foreign_other", 2 * PAGE);
    // SAFETY: a fresh shared mapping of the object, checked below.
    let p = unsafe {
        libc::mmap(
            std::ptr::null_mut(),
            2 * PAGE,
            libc::PROT_READ,
            libc::MAP_SHARED,
            other.fd,
            0,
        )
    };
    assert_ne!(p, libc::MAP_FAILED);
    other.truncate(0);
    // SAFETY: deliberately reads the page that no longer exists.
    let v = unsafe { std::ptr::read_volatile(p.cast::<u8>().add(PAGE)) };
    println!("survived a foreign SIGBUS (read {v})");
}

#[test]
fn a_fault_outside_every_region_still_kills() {
    use std::os::unix::process::ExitStatusExt;
    let out = Command::new(std::env::current_exe().expect("test binary"))
        .args([
            "--exact",
            "foreign_fault_child",
            "--nocapture",
            "--test-threads=1",
        ])
        .env("SHARDSERVE_FOREIGN_FAULT_CHILD", "1")
        .output()
        .expect("run the child");
    assert_eq!(
        out.status.signal(),
        Some(libc::SIGBUS),
        "the child should die of SIGBUS: {:?}\n{}",
        out.status,
        String::from_utf8_lossy(&out.stdout)
    );
}
