//! The protocol surface beyond inference against an in-process server:
//! server identity, Triton's error texts, classification with labels,
//! gRPC message compression, and system shared memory (a POSIX region
//! made here with libc, registered and used over HTTP and gRPC).

mod common;

use std::ffi::CString;

use common::*;
use serde_json::json;
use shardserve::proto::inference::{
    model_infer_request::{InferInputTensor, InferRequestedOutputTensor},
    CudaSharedMemoryRegisterRequest, CudaSharedMemoryStatusRequest,
    CudaSharedMemoryUnregisterRequest, InferParameter, ModelInferRequest, ServerMetadataRequest,
    SystemSharedMemoryRegisterRequest, SystemSharedMemoryStatusRequest,
    SystemSharedMemoryUnregisterRequest,
};
use tonic::{codec::CompressionEncoding, Code};

fn i32_bytes(v: impl IntoIterator<Item = i32>) -> Vec<u8> {
    v.into_iter().flat_map(i32::to_le_bytes).collect()
}

fn decode_i32(b: &[u8]) -> Vec<i32> {
    b.chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

use common::grpc_client as grpc;

/// The shared memory registry is one per process, and these tests run on
/// threads of one process: the gRPC test's unregister-all could land
/// between the HTTP test's register and its duplicate check (which then
/// answered 200, seen once in a fresh-clone CI run). Each test that
/// registers takes this for its whole run.
static REGISTRY: std::sync::Mutex<()> = std::sync::Mutex::new(());

fn registry_to_myself() -> std::sync::MutexGuard<'static, ()> {
    // A failed test poisons it; the next test still runs alone.
    REGISTRY.lock().unwrap_or_else(|p| p.into_inner())
}

// ------------------------------------------------------------------ identity

#[test]
fn identity_defaults_to_triton_and_says_shardserve_elsewhere() {
    let server = start_server(1);
    let r = get(server.http_addr(), "/v2");
    let meta = r.json();
    assert_eq!(meta["name"], "triton");
    assert!(meta["version"].as_str().unwrap().starts_with("shardserve-"));
    assert!(r.header("server").unwrap().starts_with("shardserve/"));
    let exts: Vec<&str> = meta["extensions"]
        .as_array()
        .unwrap()
        .iter()
        .map(|e| e.as_str().unwrap())
        .collect();
    assert!(exts.contains(&"system_shared_memory"));
    // Advertised only where register can work.
    assert_eq!(
        exts.contains(&"cuda_shared_memory"),
        shardserve::shm::cuda::unavailable().is_none()
    );
    assert!(exts.contains(&"logging"));
    assert!(exts.contains(&"trace"));
    // Not implemented here, so not advertised.
    assert!(!exts.contains(&"cuda_shared_memory"));
}

#[tokio::test]
async fn server_name_flag_overrides_the_name() {
    let mut opts = shardserve::server::ServerOptions::for_tests(repo_path("models"));
    opts.server_name = "my-inference".into();
    let server = start_with(opts);
    assert_eq!(
        get(server.http_addr(), "/v2").json()["name"],
        "my-inference"
    );
    let mut c = grpc(server.grpc_addr()).await;
    let meta = c
        .server_metadata(ServerMetadataRequest {})
        .await
        .unwrap()
        .into_inner();
    assert_eq!(meta.name, "my-inference");
    assert!(meta.version.starts_with("shardserve-"));
}

// ------------------------------------------------------------------ error texts

#[test]
fn version_strings_get_tritons_errors_over_http() {
    let server = start_server(1);
    let addr = server.http_addr();
    let r = post_json(
        addr,
        "/v2/models/simple/versions/wrong_specification/infer",
        &simple_json_request(1),
    );
    assert_eq!(r.status, 400);
    assert!(r.error().contains(
        "failed to get model version from specified version string 'wrong_specification'"
    ));
    let r = get(addr, "/v2/models/simple/versions/-1");
    assert_eq!(r.status, 400);
    assert!(r.error().contains("invalid model version specified '-1'"));
    // An integer version the model lacks is still NOT_FOUND.
    assert_eq!(get(addr, "/v2/models/simple/versions/7").status, 404);
}

#[tokio::test]
async fn version_string_error_over_grpc() {
    let server = start_server(1);
    let mut c = grpc(server.grpc_addr()).await;
    let e = c
        .model_infer(simple_grpc_request("wrong_specification"))
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::InvalidArgument);
    assert!(e.message().contains(
        "failed to get model version from specified version string 'wrong_specification'"
    ));
}

fn simple_grpc_request(version: &str) -> ModelInferRequest {
    let input = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    ModelInferRequest {
        model_name: "simple".into(),
        model_version: version.into(),
        inputs: vec![input("INPUT0"), input("INPUT1")],
        raw_input_contents: vec![
            i32_bytes(0..16).into(),
            i32_bytes(std::iter::repeat_n(1, 16)).into(),
        ],
        ..Default::default()
    }
}

// ------------------------------------------------------------------ compression

#[tokio::test]
async fn grpc_responses_are_not_compressed_by_default() {
    // grpc-core clients accept gzip on every call; like Triton (level
    // `none`), the server answers uncompressed unless told otherwise.
    let server = start_server(1);
    let mut c = grpc(server.grpc_addr())
        .await
        .send_compressed(CompressionEncoding::Gzip)
        .accept_compressed(CompressionEncoding::Gzip);
    let resp = c.model_infer(simple_grpc_request("")).await.unwrap();
    assert!(resp.metadata().get("grpc-encoding").is_none());
    assert_eq!(
        decode_i32(&resp.into_inner().raw_output_contents[0]),
        (1..17).collect::<Vec<_>>()
    );
}

#[tokio::test]
async fn grpc_gzip_and_deflate_both_ways() {
    let mut opts = shardserve::server::ServerOptions::for_tests(repo_path("models"));
    opts.grpc_compress_responses = true;
    let server = start_with(opts);
    for enc in [CompressionEncoding::Gzip, CompressionEncoding::Deflate] {
        let mut c = grpc(server.grpc_addr())
            .await
            .send_compressed(enc)
            .accept_compressed(enc);
        let resp = c.model_infer(simple_grpc_request("")).await.unwrap();
        let encoding = resp
            .metadata()
            .get("grpc-encoding")
            .map(|v| v.to_str().unwrap().to_string());
        let expected = match enc {
            CompressionEncoding::Gzip => "gzip",
            _ => "deflate",
        };
        assert_eq!(encoding.as_deref(), Some(expected), "response compressed");
        let out = resp.into_inner();
        assert_eq!(
            decode_i32(&out.raw_output_contents[0]),
            (1..17).collect::<Vec<_>>()
        );
    }
}

// ------------------------------------------------------------------ classification

#[test]
fn classification_with_labels_over_http() {
    let config = r#"
name: "labelled"
backend: "simple"
max_batch_size: 8
input [ { name: "INPUT0" data_type: TYPE_INT32 dims: [ 16 ] },
        { name: "INPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
output [ { name: "OUTPUT0" data_type: TYPE_INT32 dims: [ 16 ] label_filename: "labels.txt" },
         { name: "OUTPUT1" data_type: TYPE_INT32 dims: [ 16 ] } ]
"#;
    let repo = TempRepo::new("classify-labels", &[("labelled", config.to_string())]);
    let labels: String = (0..16).map(|i| format!("class{i}\n")).collect();
    std::fs::write(repo.root.join("labelled/labels.txt"), labels).unwrap();
    let server = start_with(shardserve::server::ServerOptions::for_tests(&repo.root));
    let body = json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [2, 16], "data": (0..32).collect::<Vec<i32>>()},
            {"name": "INPUT1", "datatype": "INT32", "shape": [2, 16], "data": vec![1; 32]}
        ],
        "outputs": [{"name": "OUTPUT0", "parameters": {"classification": 2}}]
    });
    let r = post_json(server.http_addr(), "/v2/models/labelled/infer", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let out = &r.json()["outputs"][0];
    assert_eq!(out["datatype"], "BYTES");
    assert_eq!(out["shape"], json!([2, 2]));
    assert_eq!(
        out["data"],
        json!([
            "16:15:class15",
            "15:14:class14",
            "32:15:class15",
            "31:14:class14"
        ])
    );
}

// ------------------------------------------------------------------ shared memory

/// A POSIX shm object made the way tritonclient makes one, unlinked on drop.
struct ShmObject {
    key: String,
    ptr: *mut u8,
    len: usize,
}

impl ShmObject {
    fn new(tag: &str, len: usize) -> Self {
        let key = format!("/ss_surface_{tag}_{}", std::process::id());
        let c = CString::new(key.clone()).unwrap();
        // SAFETY: plain libc calls on a fresh name; results checked.
        unsafe {
            let fd = libc::shm_open(c.as_ptr(), libc::O_RDWR | libc::O_CREAT, 0o600);
            assert!(fd >= 0, "shm_open");
            assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
            let ptr = libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd,
                0,
            );
            assert_ne!(ptr, libc::MAP_FAILED);
            libc::close(fd);
            Self {
                key,
                ptr: ptr.cast(),
                len,
            }
        }
    }

    fn bytes(&mut self) -> &mut [u8] {
        // SAFETY: the mapping is live and `len` long.
        unsafe { std::slice::from_raw_parts_mut(self.ptr, self.len) }
    }
}

impl Drop for ShmObject {
    fn drop(&mut self) {
        let c = CString::new(self.key.clone()).unwrap();
        // SAFETY: undoing what `new` did.
        unsafe {
            libc::munmap(self.ptr.cast(), self.len);
            libc::shm_unlink(c.as_ptr());
        }
    }
}

#[test]
fn system_shared_memory_over_http() {
    let _alone = registry_to_myself();
    let server = start_server(2);
    let addr = server.http_addr();
    let mut input = ShmObject::new("http_in", 8192);
    let output = ShmObject::new("http_out", 128);
    // Registered 100 bytes into the object: not page-aligned on purpose.
    input.bytes()[100..164].copy_from_slice(&i32_bytes(0..16));
    input.bytes()[164..228].copy_from_slice(&i32_bytes(std::iter::repeat_n(5, 16)));
    let reg = |name: &str, key: &str, offset: u64, size: u64| {
        post_json(
            addr,
            &format!("/v2/systemsharedmemory/region/{name}/register"),
            &json!({"key": key, "offset": offset, "byte_size": size}),
        )
    };
    assert_eq!(reg("surface_in", &input.key, 100, 128).status, 200);
    assert_eq!(reg("surface_out", &output.key, 0, 128).status, 200);

    let dup = reg("surface_in", &input.key, 100, 128);
    assert_eq!(dup.status, 400);
    assert_eq!(
        dup.error(),
        "shared memory region 'surface_in' already in manager"
    );
    let beyond = reg("beyond", &input.key, 8000, 1000);
    assert_eq!(
        beyond.error(),
        "failed to register shared memory region 'beyond': invalid args"
    );

    let status = get(addr, "/v2/systemsharedmemory/region/surface_in/status").json();
    assert_eq!(
        status,
        json!([{"name": "surface_in", "key": input.key, "offset": 100, "byte_size": 128}])
    );

    let shm_in = |name: &str, offset: u64| {
        json!({"name": name, "datatype": "INT32", "shape": [1, 16], "parameters": {
            "shared_memory_region": "surface_in", "shared_memory_offset": offset,
            "shared_memory_byte_size": 64}})
    };
    let body = json!({
        "inputs": [shm_in("INPUT0", 0), shm_in("INPUT1", 64)],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"shared_memory_region": "surface_out", "shared_memory_byte_size": 64}},
            {"name": "OUTPUT1", "parameters": {"shared_memory_region": "surface_out", "shared_memory_offset": 64, "shared_memory_byte_size": 64}}
        ]
    });
    let r = post_json(addr, "/v2/models/simple/infer", &body);
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    let out = r.json();
    assert_eq!(out["outputs"][0]["shape"], json!([1, 16]));
    assert!(out["outputs"][0].get("data").is_none());
    // SAFETY: the object is mapped and 128 bytes long.
    let written = unsafe { std::slice::from_raw_parts(output.ptr, 128) };
    assert_eq!(decode_i32(&written[..64]), (5..21).collect::<Vec<_>>());
    assert_eq!(decode_i32(&written[64..]), (-5..11).collect::<Vec<_>>());

    // Offsets beyond the region, a region too small for the output, a
    // missing region: Triton's texts, and the server keeps serving.
    let bad = |inputs: serde_json::Value, outputs: serde_json::Value| {
        post_json(
            addr,
            "/v2/models/simple/infer",
            &json!({"inputs": inputs, "outputs": outputs}),
        )
    };
    let r = bad(
        json!([shm_in("INPUT0", 128), shm_in("INPUT1", 0)]),
        json!([]),
    );
    assert_eq!(
        r.error(),
        "Invalid offset for shared memory region: 'surface_in'"
    );
    let r = bad(
        json!([shm_in("INPUT0", 100), shm_in("INPUT1", 0)]),
        json!([]),
    );
    assert_eq!(
        r.error(),
        "Invalid offset + byte size for shared memory region: 'surface_in'"
    );
    let r = bad(
        json!([shm_in("INPUT0", 0), shm_in("INPUT1", 64)]),
        json!([{"name": "OUTPUT0", "parameters": {"shared_memory_region": "surface_out", "shared_memory_byte_size": 16}}]),
    );
    assert_eq!(r.status, 500);
    assert!(r
        .error()
        .contains("(16 bytes) should be at least 64 bytes to hold the results"));
    let r = bad(
        json!([shm_in("INPUT0", 0), shm_in("INPUT1", 64)]),
        json!([{"name": "OUTPUT0", "parameters": {"shared_memory_region": "surface_out", "classification": 2}}]),
    );
    assert_eq!(
        r.error(),
        "Output can't set both 'shared_memory_region' and 'classification'"
    );

    // Unregistered while nothing uses it: further requests name a missing region.
    let r = post_json(
        addr,
        "/v2/systemsharedmemory/region/surface_in/unregister",
        &json!({}),
    );
    assert_eq!(r.status, 200);
    let r = bad(
        json!([shm_in("INPUT0", 0), shm_in("INPUT1", 64)]),
        json!([]),
    );
    assert_eq!(r.status, 404);
    assert_eq!(
        r.error(),
        "Unable to find shared memory region: 'surface_in'"
    );
    let r = post_json(addr, "/v2/systemsharedmemory/unregister", &json!({}));
    assert_eq!(r.status, 200);
    assert_eq!(get(addr, "/v2/systemsharedmemory/status").json(), json!([]));
    assert_eq!(
        post_json(addr, "/v2/models/simple/infer", &simple_json_request(1)).status,
        200
    );
}

/// Says on the terminal (past the harness's capture) that a test did not
/// run, and why.
fn skip(test: &str, why: &str) {
    use std::io::Write;
    let _ = writeln!(std::io::stderr(), "SKIPPED {test}: {why}");
}

fn has_gpu() -> bool {
    shardserve::shm::cuda::unavailable().is_none()
}

#[test]
fn cuda_shared_memory_over_http_answers_as_triton_without_gpu() {
    if has_gpu() {
        skip(
            "cuda_shared_memory_over_http_answers_as_triton_without_gpu",
            "this machine has a GPU; the no-GPU answers do not apply",
        );
        return;
    }
    let _alone = registry_to_myself();
    let server = start_server(1);
    let addr = server.http_addr();
    // Triton checks the name before anything else.
    let r = post_json(
        addr,
        "/v2/cudasharedmemory/register",
        &json!({"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 64}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "'region name' is necessary to register cuda shared memory region"
    );
    let r = post_json(
        addr,
        "/v2/cudasharedmemory/region/cu/register",
        &json!({"raw_handle": {"b64": ""}, "device_id": 0, "byte_size": 64}),
    );
    assert_eq!(r.status, 400);
    assert_eq!(
        r.error(),
        "failed to register CUDA shared memory region: 'cu', GPUs not supported"
    );
    assert_eq!(get(addr, "/v2/cudasharedmemory/status").json(), json!([]));
    assert_eq!(
        get(addr, "/v2/cudasharedmemory/region/cu/status").status,
        404
    );
    assert_eq!(
        post_json(addr, "/v2/cudasharedmemory/unregister", &json!({})).status,
        200
    );
    // One name space for both kinds, as in Triton: a system region asked
    // for as a CUDA one (and the other way round) names its kind.
    let region = ShmObject::new("cudakind", 64);
    assert_eq!(
        post_json(
            addr,
            "/v2/systemsharedmemory/region/sysk/register",
            &json!({"key": region.key, "offset": 0, "byte_size": 64}),
        )
        .status,
        200
    );
    let r = get(addr, "/v2/cudasharedmemory/region/sysk/status");
    assert_eq!(r.status, 404);
    assert_eq!(
        r.error(),
        "The region named 'sysk' is registered as system shared memory, not CUDA shared memory"
    );
    // Unregistering it as CUDA memory leaves the system region registered.
    assert_eq!(
        post_json(
            addr,
            "/v2/cudasharedmemory/region/sysk/unregister",
            &json!({})
        )
        .status,
        200
    );
    assert_eq!(
        get(addr, "/v2/systemsharedmemory/region/sysk/status").status,
        200
    );
    assert_eq!(
        post_json(
            addr,
            "/v2/systemsharedmemory/region/sysk/unregister",
            &json!({})
        )
        .status,
        200
    );
    // Inference naming a CUDA region that cannot exist: the generic text.
    let mut req = simple_json_request(1);
    req["inputs"][0]["parameters"] =
        json!({"shared_memory_region": "cu", "shared_memory_byte_size": 64});
    req["inputs"][0].as_object_mut().unwrap().remove("data");
    let r = post_json(addr, "/v2/models/simple/infer", &req);
    // NOT_FOUND, which Triton's HTTP endpoint answers with 404.
    assert_eq!(r.status, 404, "{}", r.error());
    assert_eq!(r.error(), "Unable to find shared memory region: 'cu'");
    // The server serves on.
    assert_eq!(
        post_json(addr, "/v2/models/simple/infer", &simple_json_request(1)).status,
        200
    );
    // Wrong method, unknown action.
    assert_eq!(
        post_json(addr, "/v2/systemsharedmemory/status", &json!({})).status,
        400
    );
    assert_eq!(
        get(addr, "/v2/systemsharedmemory/region/x/frobnicate").status,
        404
    );
}

#[tokio::test]
// The guard only keeps the other registry tests (on other threads) out;
// nothing on this test's runtime takes it.
#[allow(clippy::await_holding_lock)]
async fn system_shared_memory_over_grpc() {
    let _alone = registry_to_myself();
    let server = start_server(1);
    let mut c = grpc(server.grpc_addr()).await;
    let mut region = ShmObject::new("grpc", 256);
    region.bytes()[..64].copy_from_slice(&i32_bytes(0..16));
    region.bytes()[64..128].copy_from_slice(&i32_bytes(std::iter::repeat_n(2, 16)));
    c.system_shared_memory_register(SystemSharedMemoryRegisterRequest {
        name: "g".into(),
        key: region.key.clone(),
        offset: 0,
        byte_size: 256,
    })
    .await
    .unwrap();
    let params = |offset: i64| {
        [
            ("shared_memory_region", string_param("g")),
            ("shared_memory_offset", int_param(offset)),
            ("shared_memory_byte_size", int_param(64)),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v))
        .collect()
    };
    let input = |name: &str, offset: i64| InferInputTensor {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![1, 16],
        parameters: params(offset),
        ..Default::default()
    };
    // INPUT1 in memory, INPUT0 in the region: one raw content, for INPUT1.
    let request = ModelInferRequest {
        model_name: "simple".into(),
        inputs: vec![
            input("INPUT0", 0),
            InferInputTensor {
                name: "INPUT1".into(),
                datatype: "INT32".into(),
                shape: vec![1, 16],
                ..Default::default()
            },
        ],
        raw_input_contents: vec![i32_bytes(std::iter::repeat_n(3, 16)).into()],
        outputs: vec![
            InferRequestedOutputTensor {
                name: "OUTPUT0".into(),
                parameters: params(128),
            },
            InferRequestedOutputTensor {
                name: "OUTPUT1".into(),
                ..Default::default()
            },
        ],
        ..Default::default()
    };
    let out = c.model_infer(request).await.unwrap().into_inner();
    assert_eq!(
        out.raw_output_contents[0].len(),
        0,
        "OUTPUT0 went to the region"
    );
    assert_eq!(
        decode_i32(&out.raw_output_contents[1]),
        (-3..13).collect::<Vec<_>>()
    );
    assert_eq!(
        decode_i32(&region.bytes()[128..192]),
        (3..19).collect::<Vec<_>>()
    );
    let status = c
        .system_shared_memory_status(SystemSharedMemoryStatusRequest { name: "g".into() })
        .await
        .unwrap()
        .into_inner();
    assert_eq!(status.regions["g"].byte_size, 256);
    let e = c
        .system_shared_memory_register(SystemSharedMemoryRegisterRequest {
            name: "g".into(),
            key: region.key.clone(),
            offset: 0,
            byte_size: 256,
        })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::AlreadyExists);
    if has_gpu() {
        skip(
            "system_shared_memory_over_grpc (its CUDA part)",
            "this machine has a GPU; the no-GPU answers do not apply",
        );
    } else {
        let e = c
            .cuda_shared_memory_register(CudaSharedMemoryRegisterRequest {
                name: "cu".into(),
                raw_handle: vec![1; 64],
                device_id: 0,
                byte_size: 64,
            })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::InvalidArgument);
        assert_eq!(
            e.message(),
            "failed to register CUDA shared memory region: 'cu', GPUs not supported"
        );
        let status = c
            .cuda_shared_memory_status(CudaSharedMemoryStatusRequest::default())
            .await
            .unwrap()
            .into_inner();
        assert!(status.regions.is_empty());
        let e = c
            .cuda_shared_memory_status(CudaSharedMemoryStatusRequest { name: "g".into() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        assert_eq!(
            e.message(),
            "The region named 'g' is registered as system shared memory, not CUDA shared memory"
        );
        let e = c
            .cuda_shared_memory_status(CudaSharedMemoryStatusRequest { name: "cu".into() })
            .await
            .unwrap_err();
        assert_eq!(e.code(), Code::NotFound);
        assert_eq!(
            e.message(),
            "Unable to find cuda shared memory region: 'cu'"
        );
        c.cuda_shared_memory_unregister(CudaSharedMemoryUnregisterRequest { name: "g".into() })
            .await
            .unwrap();
        c.cuda_shared_memory_unregister(CudaSharedMemoryUnregisterRequest::default())
            .await
            .unwrap();
        // The system region survived both CUDA unregisters.
        assert!(c
            .system_shared_memory_status(SystemSharedMemoryStatusRequest { name: "g".into() })
            .await
            .is_ok());
    }
    c.system_shared_memory_unregister(SystemSharedMemoryUnregisterRequest {
        name: String::new(),
    })
    .await
    .unwrap();
    let e = c
        .system_shared_memory_status(SystemSharedMemoryStatusRequest { name: "g".into() })
        .await
        .unwrap_err();
    assert_eq!(e.code(), Code::NotFound);
}

fn string_param(s: &str) -> InferParameter {
    use shardserve::proto::inference::infer_parameter::ParameterChoice;
    InferParameter {
        parameter_choice: Some(ParameterChoice::StringParam(s.into())),
    }
}

fn int_param(v: i64) -> InferParameter {
    use shardserve::proto::inference::infer_parameter::ParameterChoice;
    InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(v)),
    }
}
