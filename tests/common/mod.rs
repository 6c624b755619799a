//! Shared test harness: an in-process server on ephemeral loopback ports
//! and a minimal blocking HTTP/1.1 client that can also send malformed
//! requests on purpose.
#![allow(dead_code)]

pub mod child;

use std::{
    io::{Read, Write},
    net::{SocketAddr, TcpStream},
    path::PathBuf,
    thread,
    time::{Duration, Instant},
};

use shardserve::server::{self, ServerHandle, ServerOptions};

pub fn repo_path(rel: &str) -> PathBuf {
    PathBuf::from(env!("CARGO_MANIFEST_DIR")).join(rel)
}

/// Polls `cond` every 20 ms until it holds; panics after `timeout`.
pub fn wait_for(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let until = Instant::now() + timeout;
    while !cond() {
        assert!(Instant::now() < until, "timed out waiting for {what}");
        thread::sleep(Duration::from_millis(20));
    }
}

/// Starts a server on the example repository with `shards` shards.
pub fn start_server(shards: usize) -> ServerHandle {
    let mut opts = ServerOptions::for_tests(repo_path("models"));
    opts.cores = Some(shards);
    start_with(opts)
}

pub fn start_with(opts: ServerOptions) -> ServerHandle {
    server::start(opts).expect("server starts")
}

#[derive(Debug)]
pub struct HttpReply {
    pub status: u16,
    pub headers: Vec<(String, String)>,
    pub body: Vec<u8>,
}

impl HttpReply {
    pub fn header(&self, name: &str) -> Option<&str> {
        self.headers
            .iter()
            .find(|(k, _)| k.eq_ignore_ascii_case(name))
            .map(|(_, v)| v.as_str())
    }

    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(&self.body).unwrap_or_else(|e| {
            panic!(
                "body is not JSON ({e}): {}",
                String::from_utf8_lossy(&self.body)
            )
        })
    }

    /// The `error` field of a Triton-style error body.
    pub fn error(&self) -> String {
        self.json()["error"]
            .as_str()
            .unwrap_or_else(|| panic!("no error field in {}", String::from_utf8_lossy(&self.body)))
            .to_string()
    }
}

/// Sends raw bytes as one HTTP/1.1 request (with `Connection: close`
/// added by the caller's headers) and reads the whole reply.
pub fn raw_request(addr: SocketAddr, raw: &[u8]) -> HttpReply {
    let mut stream = TcpStream::connect(addr).expect("connect");
    stream
        .set_read_timeout(Some(Duration::from_secs(20)))
        .expect("timeout");
    stream.write_all(raw).expect("write");
    let mut buf = Vec::new();
    stream.read_to_end(&mut buf).expect("read");
    parse_reply(&buf)
}

pub fn request(
    addr: SocketAddr,
    method: &str,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> HttpReply {
    let mut raw = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\nContent-Length: {}\r\n",
        body.len()
    );
    for (k, v) in headers {
        raw.push_str(&format!("{k}: {v}\r\n"));
    }
    raw.push_str("\r\n");
    let mut bytes = raw.into_bytes();
    bytes.extend_from_slice(body);
    raw_request(addr, &bytes)
}

pub fn get(addr: SocketAddr, path: &str) -> HttpReply {
    request(addr, "GET", path, &[], b"")
}

pub fn post_json(addr: SocketAddr, path: &str, body: &serde_json::Value) -> HttpReply {
    request(
        addr,
        "POST",
        path,
        &[("Content-Type", "application/json")],
        body.to_string().as_bytes(),
    )
}

fn parse_reply(buf: &[u8]) -> HttpReply {
    let split = buf
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .unwrap_or_else(|| panic!("no header end in reply: {}", String::from_utf8_lossy(buf)));
    let head = String::from_utf8_lossy(&buf[..split]).to_string();
    let mut lines = head.split("\r\n");
    let status_line = lines.next().unwrap_or_default();
    let status: u16 = status_line
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let headers: Vec<(String, String)> = lines
        .filter_map(|l| l.split_once(':'))
        .map(|(k, v)| (k.trim().to_string(), v.trim().to_string()))
        .collect();
    let mut body = buf[split + 4..].to_vec();
    let chunked = headers
        .iter()
        .any(|(k, v)| k.eq_ignore_ascii_case("transfer-encoding") && v.contains("chunked"));
    if chunked {
        body = dechunk(&body);
    }
    HttpReply {
        status,
        headers,
        body,
    }
}

fn dechunk(mut data: &[u8]) -> Vec<u8> {
    let mut out = Vec::new();
    while let Some(eol) = data.windows(2).position(|w| w == b"\r\n") {
        let size =
            usize::from_str_radix(std::str::from_utf8(&data[..eol]).unwrap_or("0").trim(), 16)
                .unwrap_or(0);
        if size == 0 {
            break;
        }
        out.extend_from_slice(&data[eol + 2..eol + 2 + size]);
        data = &data[eol + 4 + size..];
    }
    out
}

/// `simple`'s inputs as JSON: INPUT0 = 0..16, INPUT1 = all `b`.
pub fn simple_json_request(b: i32) -> serde_json::Value {
    let input0: Vec<i32> = (0..16).collect();
    serde_json::json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": input0},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": vec![b; 16]},
        ]
    })
}

pub fn i32s(v: &serde_json::Value) -> Vec<i64> {
    v.as_array()
        .expect("array")
        .iter()
        .map(|x| x.as_i64().expect("integer"))
        .collect()
}

/// A model repository in a temporary folder, removed on drop: each model a
/// `config.pbtxt` and an empty version folder `1/`.
pub struct TempRepo {
    pub root: PathBuf,
}

impl TempRepo {
    pub fn new(tag: &str, models: &[(&str, String)]) -> Self {
        let root = std::env::temp_dir().join(format!("shardserve-{tag}-{}", std::process::id()));
        let _ = std::fs::remove_dir_all(&root);
        for (name, config) in models {
            std::fs::create_dir_all(root.join(name).join("1")).expect("model dir");
            std::fs::write(root.join(name).join("config.pbtxt"), config).expect("config");
        }
        Self { root }
    }
}

impl Drop for TempRepo {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.root);
    }
}

/// Sum over every label set of the integer metric `family` on the
/// server's metrics page.
pub fn metric_sum(metrics_addr: SocketAddr, family: &str) -> u64 {
    let page = String::from_utf8(get(metrics_addr, "/metrics").body).expect("utf-8 metrics");
    let prefix = format!("{family}{{");
    page.lines()
        .filter(|l| l.starts_with(&prefix))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<u64>().ok())
        .sum()
}

/// Sum of `shardserve_forwarded_requests_total` (requests that crossed
/// shards) from a metrics page.
pub fn forwarded_requests(metrics_addr: SocketAddr) -> u64 {
    metric_sum(metrics_addr, "shardserve_forwarded_requests_total")
}

/// A gRPC client of the inference service connected to `addr`.
pub async fn grpc_client(
    addr: SocketAddr,
) -> shardserve::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient<
    tonic::transport::Channel,
> {
    let channel = tonic::transport::Channel::from_shared(format!("http://{addr}"))
        .expect("uri")
        .connect()
        .await
        .expect("connect");
    shardserve::proto::inference::grpc_inference_service_client::GrpcInferenceServiceClient::new(
        channel,
    )
}

/// `shardserve-bench` arguments with short windows, so every bench test
/// stays bounded (warm-up 50 ms + at most 3 × 150 ms per step), then `extra`.
pub fn bench_args(extra: &[&str]) -> Vec<String> {
    let mut v: Vec<String> = [
        "shardserve-bench",
        "-p",
        "150",
        "--max-trials",
        "3",
        "--warmup",
        "50",
        "-q",
        "--no-progress",
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    v.extend(extra.iter().map(|s| s.to_string()));
    v
}
