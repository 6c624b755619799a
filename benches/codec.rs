//! Protocol codecs on the `simple` model's traffic (two INT32 [1,16]
//! inputs, two INT32 [1,16] outputs): HTTP JSON and binary request
//! decoding, HTTP JSON and binary response encoding, gRPC raw decoding.

use std::{hint::black_box, time::Duration};

use bytes::Bytes;
use criterion::{criterion_group, criterion_main, BatchSize, Criterion};
use serde_json::json;
use shardserve::{
    frontend::{
        grpc::codec::decode_model_infer_request,
        http::codec::{decode_infer_request, encode_infer_response, AnswerForm},
    },
    proto::inference::{model_infer_request::InferInputTensor, ModelInferRequest},
    types::{DataType, InferResponse, ParamValue, Parameters, RequestedOutput, Tensor},
};

fn int32_bytes(offset: i32) -> Vec<u8> {
    (0..16)
        .flat_map(|i: i32| (i + offset).to_le_bytes())
        .collect()
}

fn json_request() -> Bytes {
    let data: Vec<i32> = (0..16).collect();
    Bytes::from(
        json!({
            "inputs": [
                {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "data": data},
                {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "data": data}
            ],
            "outputs": [{"name": "OUTPUT0"}, {"name": "OUTPUT1"}]
        })
        .to_string(),
    )
}

/// What tritonclient sends with `binary_data=True` inputs and outputs.
fn binary_request() -> (Bytes, usize) {
    let header = json!({
        "inputs": [
            {"name": "INPUT0", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}},
            {"name": "INPUT1", "datatype": "INT32", "shape": [1, 16], "parameters": {"binary_data_size": 64}}
        ],
        "outputs": [
            {"name": "OUTPUT0", "parameters": {"binary_data": true}},
            {"name": "OUTPUT1", "parameters": {"binary_data": true}}
        ]
    })
    .to_string();
    let n = header.len();
    let mut body = header.into_bytes();
    body.extend(int32_bytes(0));
    body.extend(int32_bytes(1));
    (Bytes::from(body), n)
}

fn response() -> InferResponse {
    InferResponse {
        model_name: "simple".into(),
        model_version: "1".into(),
        id: String::new(),
        outputs: vec![
            Tensor::new(
                "OUTPUT0",
                DataType::Int32,
                vec![1, 16],
                Bytes::from(int32_bytes(0)),
            ),
            Tensor::new(
                "OUTPUT1",
                DataType::Int32,
                vec![1, 16],
                Bytes::from(int32_bytes(-8)),
            ),
        ],
        parameters: Parameters::new(),
        ..Default::default()
    }
}

fn grpc_request() -> ModelInferRequest {
    let input = |name: &str| InferInputTensor {
        name: name.into(),
        datatype: "INT32".into(),
        shape: vec![1, 16],
        ..Default::default()
    };
    ModelInferRequest {
        model_name: "simple".into(),
        inputs: vec![input("INPUT0"), input("INPUT1")],
        raw_input_contents: vec![Bytes::from(int32_bytes(0)), Bytes::from(int32_bytes(1))],
        ..Default::default()
    }
}

/// ~4 MB of JSON: one FP32 input of 1M elements ("0.xyz", about 4 bytes
/// each): the large-body path (streamed into the tensor, no JSON tree).
fn large_json_request() -> Bytes {
    let data: Vec<f32> = (0..1_000_000).map(|i| (i % 1000) as f32 / 1000.0).collect();
    Bytes::from(
        json!({"inputs": [{"name": "X", "datatype": "FP32", "shape": [1, data.len()], "data": data}]})
            .to_string(),
    )
}

fn codec(c: &mut Criterion) {
    let mut g = c.benchmark_group("codec");
    // Short runs: the machines are shared; this keeps the whole bench
    // under a minute while still giving stable medians for ~µs work.
    g.warm_up_time(Duration::from_secs(1))
        .measurement_time(Duration::from_secs(2));

    let body = json_request();
    g.bench_function("http_decode_json_simple", |b| {
        b.iter(|| decode_infer_request(black_box(body.clone()), None, "simple", ""))
    });

    let (body, n) = binary_request();
    g.bench_function("http_decode_binary_simple", |b| {
        b.iter(|| decode_infer_request(black_box(body.clone()), Some(n), "simple", ""))
    });

    let resp = response();
    let json_outputs = [
        RequestedOutput {
            name: "OUTPUT0".into(),
            parameters: Parameters::new(),
        },
        RequestedOutput {
            name: "OUTPUT1".into(),
            parameters: Parameters::new(),
        },
    ];
    let json_form = AnswerForm::of(&json_outputs, &Parameters::new());
    g.bench_function("http_encode_json_simple", |b| {
        b.iter(|| encode_infer_response(black_box(&resp), &json_form))
    });

    let mut binary_params = Parameters::new();
    binary_params.insert("binary_data_output".into(), ParamValue::Bool(true));
    let binary_form = AnswerForm::of(&[], &binary_params);
    g.bench_function("http_encode_binary_simple", |b| {
        b.iter(|| encode_infer_response(black_box(&resp), &binary_form))
    });

    let large = large_json_request();
    g.sample_size(10);
    g.bench_function("http_decode_json_1m_fp32", |b| {
        b.iter(|| decode_infer_request(black_box(large.clone()), None, "m", ""))
    });
    g.sample_size(100);

    let req = grpc_request();
    g.bench_function("grpc_decode_raw_simple", |b| {
        // Decoding consumes the message: clone it outside the timed part.
        b.iter_batched(
            || req.clone(),
            decode_model_infer_request,
            BatchSize::SmallInput,
        )
    });
    g.finish();
}

criterion_group!(benches, codec);
criterion_main!(benches);
