//! Control requests the coordinator makes: model metadata and config before
//! a run, statistics around each window. Not on the hot path: a fresh
//! connection per call keeps this simple.

use std::{future::poll_fn, pin::Pin, time::Duration};

use anyhow::{anyhow, Context};
use http::StatusCode;
use http_body_util::BodyExt;
use monoio::io::poll_io::{AsyncRead, AsyncWrite, ReadBuf};
use serde_json::Value;

use super::{
    cli::{Protocol, Target},
    grpc,
    input::{ModelInfo, SequenceControl, TensorInfo},
    request::{http_error, http_prepared},
    wire::{self, connect_h1, connect_h2, BenchBody},
};
use crate::proto::inference as pb;

async fn http_get(target: &Target, path: &str) -> anyhow::Result<(StatusCode, bytes::Bytes)> {
    let mut sender = connect_h1(target).await?;
    let prepared = http_prepared(
        &target.authority,
        path,
        vec![bytes::Bytes::new()],
        None,
        false,
    )?;
    sender
        .ready()
        .await
        .map_err(|e| anyhow!("connection to {} lost: {e}", target.addr))?;
    let resp = sender
        .send_request(prepared.request(BenchBody::Once(None)))
        .await
        .map_err(|e| anyhow!("GET {path} on {}: {e}", target.addr))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| anyhow!("GET {path}: {e}"))?
        .to_bytes();
    Ok((status, body))
}

fn model_path(model: &str, version: &str) -> String {
    if version.is_empty() {
        format!("/v2/models/{model}")
    } else {
        format!("/v2/models/{model}/versions/{version}")
    }
}

/// The model's inputs/outputs and max_batch_size; the server's own error
/// text when it does not know the model.
pub async fn model_info(target: &Target, model: &str, version: &str) -> anyhow::Result<ModelInfo> {
    match target.protocol {
        Protocol::Http => {
            let path = model_path(model, version);
            let (status, body) = http_get(target, &path).await?;
            if !status.is_success() {
                return Err(anyhow!(
                    "server {} rejected model '{model}': {}",
                    target.authority,
                    http_error(status, &body)
                ));
            }
            let meta: Value =
                serde_json::from_slice(&body).context("model metadata is not JSON")?;
            // The config is Triton's extension: without it, assume no batching.
            let config = match http_get(target, &format!("{path}/config")).await {
                Ok((s, b)) if s.is_success() => serde_json::from_slice::<Value>(&b).ok(),
                _ => None,
            };
            ModelInfo::from_json(&meta, config.as_ref(), version)
        }
        Protocol::Grpc => {
            let mut sender = match connect_h2(target).await {
                Ok(s) => s,
                Err(e) => return Err(not_grpc(target).await.map_or(e, |why| anyhow!(why))),
            };
            let meta: anyhow::Result<pb::ModelMetadataResponse> = grpc::call(
                &mut sender,
                &target.authority,
                "ModelMetadata",
                &pb::ModelMetadataRequest {
                    name: model.into(),
                    version: version.into(),
                },
            )
            .await;
            let meta = match meta {
                Ok(m) => m,
                Err(e) => {
                    // A server that does not speak HTTP/2 makes the call fail
                    // with a bare "connection error": say what is wrong.
                    if let Some(why) = not_grpc(target).await {
                        return Err(anyhow!(why));
                    }
                    return Err(anyhow!(
                        "server {} rejected model '{model}': {e}",
                        target.authority
                    ));
                }
            };
            let config: Option<pb::ModelConfigResponse> = grpc::call(
                &mut sender,
                &target.authority,
                "ModelConfig",
                &pb::ModelConfigRequest {
                    name: model.into(),
                    version: version.into(),
                },
            )
            .await
            .ok();
            let tensors = |ts: &[pb::model_metadata_response::TensorMetadata]| {
                ts.iter()
                    .map(|t| TensorInfo {
                        name: t.name.clone(),
                        datatype: t.datatype.clone(),
                        shape: t.shape.clone(),
                    })
                    .collect()
            };
            let config = config.and_then(|c| c.config);
            Ok(ModelInfo {
                name: meta.name.clone(),
                version: version.to_string(),
                max_batch_size: config.as_ref().map_or(0, |c| i64::from(c.max_batch_size)),
                inputs: tensors(&meta.inputs),
                outputs: tensors(&meta.outputs),
                sequence: config.as_ref().and_then(SequenceControl::from_config),
            })
        }
    }
}

/// Checks the server answers at all (for --endpoint live, which needs no model).
pub async fn reachable(target: &Target) -> anyhow::Result<()> {
    match target.protocol {
        Protocol::Http => connect_h1(target).await.map(drop),
        Protocol::Grpc => {
            // The HTTP/2 handshake does not wait for the server's answer,
            // so a server that is not gRPC is found by asking.
            let connected = connect_h2(target).await.map(drop);
            match not_grpc(target).await {
                Some(why) => Err(anyhow!(why)),
                None => connected,
            }
        }
    }
}

/// The client's HTTP/2 connection preface and an empty SETTINGS frame.
const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n\0\0\0\x04\0\0\0\0\0";

/// Why `target` is not a gRPC endpoint, when its answer to the HTTP/2
/// preface shows it: an HTTP/1 status line, or the connection closed
/// without a frame. `None` when it answers with HTTP/2 frames, or the
/// question cannot be settled (then the caller's own error stands).
pub async fn not_grpc(target: &Target) -> Option<String> {
    let mut io = wire::connect(target).await.ok()?.inner();
    let answer = match monoio::time::timeout(Duration::from_secs(3), h2_exchange(&mut io)).await {
        Ok(Ok(bytes)) => bytes,
        // A reset during the handshake is a refusal of HTTP/2 too.
        Ok(Err(e)) if e.kind() == std::io::ErrorKind::ConnectionReset => Vec::new(),
        _ => return None,
    };
    describe_h2_answer(&target.label, &answer)
}

/// Sends the preface and reads the first bytes of the answer (empty: the
/// server closed the connection).
async fn h2_exchange(io: &mut wire::BenchIo) -> std::io::Result<Vec<u8>> {
    let mut sent = 0;
    while sent < H2_PREFACE.len() {
        let n = poll_fn(|cx| Pin::new(&mut *io).poll_write(cx, &H2_PREFACE[sent..])).await?;
        if n == 0 {
            return Ok(Vec::new());
        }
        sent += n;
    }
    poll_fn(|cx| Pin::new(&mut *io).poll_flush(cx)).await?;
    let mut buf = [0u8; 16];
    let mut got = 0;
    // Enough bytes to tell "HTTP/1.1 400" from a frame header.
    while got < 9 {
        let mut rb = ReadBuf::new(&mut buf[got..]);
        poll_fn(|cx| Pin::new(&mut *io).poll_read(cx, &mut rb)).await?;
        let n = rb.filled().len();
        if n == 0 {
            break;
        }
        got += n;
    }
    Ok(buf[..got].to_vec())
}

fn describe_h2_answer(label: &str, answer: &[u8]) -> Option<String> {
    if answer.starts_with(b"HTTP/") {
        let version: String = answer[5..]
            .iter()
            .take_while(|b| b.is_ascii_digit() || **b == b'.')
            .map(|b| char::from(*b))
            .collect();
        return Some(format!(
            "{label} is not a gRPC endpoint: it answered the HTTP/2 preface with HTTP/{version} \
             (an HTTP port? use -i http, or the server's gRPC port)"
        ));
    }
    if answer.is_empty() {
        return Some(format!(
            "{label} is not a gRPC endpoint: it closed the connection during the HTTP/2 handshake"
        ));
    }
    None
}

/// Cumulative server-side counters of a model (the statistics extension).
#[derive(Debug, Clone, Copy, Default, PartialEq, serde::Serialize)]
pub struct ServerCounters {
    pub success_count: u64,
    pub queue_ns: u64,
    pub compute_input_ns: u64,
    pub compute_infer_ns: u64,
    pub compute_output_ns: u64,
    pub execution_count: u64,
}

impl ServerCounters {
    pub fn delta(&self, earlier: &Self) -> Self {
        Self {
            success_count: self.success_count.saturating_sub(earlier.success_count),
            queue_ns: self.queue_ns.saturating_sub(earlier.queue_ns),
            compute_input_ns: self
                .compute_input_ns
                .saturating_sub(earlier.compute_input_ns),
            compute_infer_ns: self
                .compute_infer_ns
                .saturating_sub(earlier.compute_infer_ns),
            compute_output_ns: self
                .compute_output_ns
                .saturating_sub(earlier.compute_output_ns),
            execution_count: self.execution_count.saturating_sub(earlier.execution_count),
        }
    }

    pub fn add(&mut self, o: &Self) {
        self.success_count += o.success_count;
        self.queue_ns += o.queue_ns;
        self.compute_input_ns += o.compute_input_ns;
        self.compute_infer_ns += o.compute_infer_ns;
        self.compute_output_ns += o.compute_output_ns;
        self.execution_count += o.execution_count;
    }

    fn from_json(v: &Value) -> Option<Self> {
        // Several versions may answer: sum them.
        let mut out = Self::default();
        for m in v["model_stats"].as_array()? {
            let s = &m["inference_stats"];
            let get = |k: &str, f: &str| s[k][f].as_u64().unwrap_or(0);
            out.add(&Self {
                success_count: get("success", "count"),
                queue_ns: get("queue", "ns"),
                compute_input_ns: get("compute_input", "ns"),
                compute_infer_ns: get("compute_infer", "ns"),
                compute_output_ns: get("compute_output", "ns"),
                execution_count: m["execution_count"].as_u64().unwrap_or(0),
            });
        }
        Some(out)
    }

    fn from_proto(r: &pb::ModelStatisticsResponse) -> Self {
        let mut out = Self::default();
        for m in &r.model_stats {
            let s = m.inference_stats.unwrap_or_default();
            let d = |x: Option<pb::StatisticDuration>| x.unwrap_or_default();
            out.add(&Self {
                success_count: d(s.success).count,
                queue_ns: d(s.queue).ns,
                compute_input_ns: d(s.compute_input).ns,
                compute_infer_ns: d(s.compute_infer).ns,
                compute_output_ns: d(s.compute_output).ns,
                execution_count: m.execution_count,
            });
        }
        out
    }
}

/// None when the server has no statistics extension (or it failed).
pub async fn server_counters(
    target: &Target,
    model: &str,
    version: &str,
) -> Option<ServerCounters> {
    let r = match target.protocol {
        Protocol::Http => {
            let (status, body) = http_get(target, &format!("{}/stats", model_path(model, version)))
                .await
                .ok()?;
            if !status.is_success() {
                return None;
            }
            ServerCounters::from_json(&serde_json::from_slice(&body).ok()?)
        }
        Protocol::Grpc => {
            let mut sender = connect_h2(target).await.ok()?;
            let r: pb::ModelStatisticsResponse = grpc::call(
                &mut sender,
                &target.authority,
                "ModelStatistics",
                &pb::ModelStatisticsRequest {
                    name: model.into(),
                    version: version.into(),
                },
            )
            .await
            .ok()?;
            Some(ServerCounters::from_proto(&r))
        }
    };
    if r.is_none() {
        tracing::debug!(target = %target.label, "bench: no server statistics");
    }
    r
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counters_from_json_and_delta() {
        let v = serde_json::json!({"model_stats": [{"name": "simple", "version": "1", "execution_count": 4,
            "inference_stats": {"success": {"count": 10, "ns": 1000}, "queue": {"count": 10, "ns": 200},
            "compute_input": {"count": 10, "ns": 30}, "compute_infer": {"count": 10, "ns": 400},
            "compute_output": {"count": 10, "ns": 50}}}]});
        let a = ServerCounters::from_json(&v).unwrap();
        assert_eq!(a.success_count, 10);
        assert_eq!(a.compute_infer_ns, 400);
        let d = a.delta(&ServerCounters {
            success_count: 4,
            queue_ns: 100,
            ..Default::default()
        });
        assert_eq!(
            (d.success_count, d.queue_ns, d.execution_count),
            (6, 100, 4)
        );
        assert!(ServerCounters::from_json(&serde_json::json!({})).is_none());
    }

    #[test]
    fn answers_to_the_h2_preface() {
        let http = describe_h2_answer("127.0.0.1:8000", b"HTTP/1.1 400 Bad Request\r\n").unwrap();
        assert!(
            http.contains("127.0.0.1:8000 is not a gRPC endpoint") && http.contains("HTTP/1.1"),
            "{http}"
        );
        assert!(describe_h2_answer("x", b"")
            .unwrap()
            .contains("closed the connection"));
        // A SETTINGS frame header: an HTTP/2 server.
        assert!(describe_h2_answer("x", &[0, 0, 6, 4, 0, 0, 0, 0, 0]).is_none());
    }
}
