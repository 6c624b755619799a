//! Property tests of everything that parses client or repository input:
//! the HTTP JSON and binary-extension request decoders, the gRPC
//! `ModelInfer` decoder and the `config.pbtxt` parser. Whatever they are
//! given, they never panic, their errors are in the protocol's form (a
//! request error kind and a short message), and what they accept decodes
//! to the tensor that was sent. Case counts are bounded so the file runs
//! in a few seconds; `codec_robustness.rs` adds 60k byte-level mutations.

use bytes::Bytes;
use proptest::{prelude::*, test_runner::Config};
use prost::Message;
use serde_json::{json, Value};
use shardserve::{
    config::{parse_model_config, validate},
    frontend::{
        grpc::codec::decode_model_infer_request,
        http::codec::{decode_infer_request, decode_infer_request_for},
    },
    model::{validate_request, IoSpec},
    proto::inference::{
        model_infer_request::InferInputTensor, InferTensorContents, ModelInferRequest,
    },
    types::{ErrorKind, InferError, InferRequest, MESSAGE_BYTES},
};

fn config(cases: u32) -> Config {
    Config {
        cases,
        failure_persistence: None,
        ..Config::default()
    }
}

fn simple_io() -> IoSpec {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/simple");
    let text = std::fs::read_to_string(dir.join("config.pbtxt")).unwrap();
    IoSpec::from_config(&parse_model_config(&text).unwrap(), &dir).unwrap()
}

/// An error is a request error with a message short enough for a header.
fn check_error(e: &InferError) -> Result<(), TestCaseError> {
    prop_assert!(
        matches!(e.kind, ErrorKind::InvalidArgument | ErrorKind::Unsupported),
        "{:?}: {}",
        e.kind,
        e.message
    );
    prop_assert!(!e.message.is_empty());
    prop_assert!(
        e.message.len() <= MESSAGE_BYTES,
        "{} bytes",
        e.message.len()
    );
    Ok(())
}

fn check_result(r: Result<InferRequest, InferError>) -> Result<(), TestCaseError> {
    match r {
        Ok(mut req) => {
            if let Err(e) = validate_request(&simple_io(), "simple", &mut req) {
                check_error(&e)?;
            }
            Ok(())
        }
        Err(e) => check_error(&e),
    }
}

const DATATYPES: [&str; 15] = [
    "BOOL", "UINT8", "UINT16", "UINT32", "UINT64", "INT8", "INT16", "INT32", "INT64", "FP16",
    "FP32", "FP64", "BF16", "BYTES", "INT33",
];

fn datatype() -> impl Strategy<Value = String> {
    prop_oneof![
        4 => proptest::sample::select(&DATATYPES[..]).prop_map(str::to_string),
        1 => ".{0,12}",
    ]
}

/// Any JSON value, with numbers at the edges of the integer types.
fn json_value() -> impl Strategy<Value = Value> {
    let leaf = prop_oneof![
        Just(Value::Null),
        any::<bool>().prop_map(Value::Bool),
        any::<i64>().prop_map(Value::from),
        any::<u64>().prop_map(Value::from),
        proptest::sample::select(vec![
            0i64,
            1,
            -1,
            127,
            128,
            255,
            256,
            65535,
            65536,
            i64::from(i32::MAX) + 1
        ])
        .prop_map(Value::from),
        any::<f64>()
            .prop_map(|f| serde_json::Number::from_f64(f).map_or(Value::Null, Value::Number)),
        ".{0,8}".prop_map(Value::String),
    ];
    leaf.prop_recursive(4, 64, 8, |inner| {
        prop_oneof![
            4 => proptest::collection::vec(inner.clone(), 0..8).prop_map(Value::Array),
            1 => proptest::collection::btree_map(".{0,4}", inner, 0..3)
                .prop_map(|m| Value::Object(m.into_iter().collect())),
        ]
    })
}

fn shape() -> impl Strategy<Value = Vec<i64>> {
    proptest::collection::vec(
        prop_oneof![
            6 => 0i64..20,
            1 => Just(-1i64),
            1 => Just(1i64 << 40),
            1 => any::<i64>(),
        ],
        0..4,
    )
}

fn input_name() -> impl Strategy<Value = String> {
    prop_oneof![
        3 => Just("INPUT0".to_string()),
        3 => Just("INPUT1".to_string()),
        1 => ".{0,6}",
        1 => Just("X".repeat(5000)),
    ]
}

/// A request-shaped JSON body with arbitrary field values.
fn json_request() -> impl Strategy<Value = Value> {
    let input = (
        input_name(),
        datatype(),
        shape(),
        json_value(),
        proptest::option::of(json_value()),
    )
        .prop_map(|(name, datatype, shape, data, params)| {
            let mut v = json!({"name": name, "datatype": datatype, "shape": shape, "data": data});
            if let Some(p) = params {
                v["parameters"] = json!({"binary_data_size": p});
            }
            v
        });
    (
        proptest::collection::vec(input, 0..4),
        proptest::option::of(json_value()),
        proptest::option::of(proptest::collection::vec(
            (input_name(), json_value()),
            0..3,
        )),
    )
        .prop_map(|(inputs, params, outputs)| {
            let mut v = json!({"inputs": inputs});
            if let Some(p) = params {
                v["parameters"] = json!({"p": p});
            }
            if let Some(o) = outputs {
                v["outputs"] = o
                    .into_iter()
                    .map(|(name, p)| json!({"name": name, "parameters": {"classification": p}}))
                    .collect();
            }
            v
        })
}

/// Nests a flat list into a random tree of arrays (same leaves, same order).
fn nest(values: Vec<Value>, cuts: &[usize]) -> Value {
    match cuts.split_first() {
        None => Value::Array(values),
        Some((&cut, rest)) => {
            let size = cut.max(1);
            Value::Array(
                values
                    .chunks(size)
                    .map(|c| nest(c.to_vec(), rest))
                    .collect(),
            )
        }
    }
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn json_requests_never_panic(body in json_request(), with_model in any::<bool>()) {
        let bytes = Bytes::from(body.to_string());
        let io = simple_io();
        let r = decode_infer_request_for(bytes, None, "simple", "", with_model.then_some(&io));
        check_result(r)?;
    }

    #[test]
    fn arbitrary_bytes_never_panic(body in proptest::collection::vec(any::<u8>(), 0..256),
                                   header_length in proptest::option::of(0usize..300)) {
        check_result(decode_infer_request(Bytes::from(body), header_length, "simple", ""))?;
    }

    #[test]
    fn binary_requests_never_panic(
        inputs in proptest::collection::vec(
            (input_name(), datatype(), shape(), prop_oneof![Just(json!(64)), json_value()]),
            0..3,
        ),
        chunks in proptest::collection::vec(any::<u8>(), 0..200),
        header_delta in -3i64..3,
    ) {
        let inputs: Vec<Value> = inputs
            .into_iter()
            .map(|(name, dt, shape, size)| json!({
                "name": name, "datatype": dt, "shape": shape,
                "parameters": {"binary_data_size": size}
            }))
            .collect();
        let header = json!({"inputs": inputs}).to_string();
        let n = header.len();
        let mut body = header.into_bytes();
        body.extend_from_slice(&chunks);
        let header_length = usize::try_from(n as i64 + header_delta).ok();
        check_result(decode_infer_request(Bytes::from(body), header_length, "simple", ""))?;
    }

    #[test]
    fn nested_or_flat_int32_data_decodes_to_its_values(
        values in proptest::collection::vec(any::<i32>(), 0..200),
        cuts in proptest::collection::vec(1usize..6, 0..3),
    ) {
        let data = nest(values.iter().map(|&v| json!(v)).collect(), &cuts);
        let body = json!({"inputs": [{"name": "X", "datatype": "INT32",
                                      "shape": [values.len()], "data": data}]});
        let req = decode_infer_request(Bytes::from(body.to_string()), None, "m", "").unwrap();
        let expected: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
        prop_assert_eq!(&req.inputs[0].data[..], &expected[..]);
    }

    #[test]
    fn fp64_and_bytes_data_decode_to_their_values(
        floats in proptest::collection::vec(-1e300f64..1e300, 0..50),
        strings in proptest::collection::vec(".{0,10}", 0..50),
    ) {
        let body = json!({"inputs": [
            {"name": "F", "datatype": "FP64", "shape": [floats.len()], "data": floats},
            {"name": "S", "datatype": "BYTES", "shape": [strings.len()], "data": strings},
        ]});
        let req = decode_infer_request(Bytes::from(body.to_string()), None, "m", "").unwrap();
        let expected: Vec<u8> = floats.iter().flat_map(|v| v.to_le_bytes()).collect();
        prop_assert_eq!(&req.inputs[0].data[..], &expected[..]);
        let expected = shardserve::types::encode_bytes_elements(&strings);
        prop_assert_eq!(&req.inputs[1].data, &expected);
    }
}

fn grpc_input() -> impl Strategy<Value = (InferInputTensor, Option<Vec<u8>>)> {
    let contents = (
        proptest::collection::vec(any::<bool>(), 0..4),
        proptest::collection::vec(any::<i32>(), 0..20),
        proptest::collection::vec(any::<i64>(), 0..4),
        proptest::collection::vec(any::<u32>(), 0..4),
        proptest::collection::vec(any::<f32>(), 0..20),
        proptest::collection::vec(proptest::collection::vec(any::<u8>(), 0..6), 0..4),
    )
        .prop_map(|(b, i, i64s, u, f, bytes)| InferTensorContents {
            bool_contents: b,
            int_contents: i,
            int64_contents: i64s,
            uint_contents: u,
            fp32_contents: f,
            bytes_contents: bytes,
            ..Default::default()
        });
    (
        input_name(),
        datatype(),
        shape(),
        proptest::option::of(contents),
        proptest::option::of(proptest::collection::vec(any::<u8>(), 0..80)),
    )
        .prop_map(|(name, datatype, shape, contents, raw)| {
            (
                InferInputTensor {
                    name,
                    datatype,
                    shape,
                    contents,
                    ..Default::default()
                },
                raw,
            )
        })
}

proptest! {
    #![proptest_config(config(3000))]

    #[test]
    fn grpc_requests_never_panic(
        inputs in proptest::collection::vec(grpc_input(), 0..4),
        model in prop_oneof![Just("simple".to_string()), ".{0,8}"],
    ) {
        let raw: Vec<Bytes> = inputs.iter().filter_map(|(_, r)| r.clone().map(Bytes::from)).collect();
        let req = ModelInferRequest {
            model_name: model,
            inputs: inputs.into_iter().map(|(i, _)| i).collect(),
            raw_input_contents: raw,
            ..Default::default()
        };
        // Also through the wire format, as tonic would hand it over.
        let again = ModelInferRequest::decode(req.encode_to_vec().as_slice()).unwrap();
        check_result(decode_model_infer_request(req))?;
        check_result(decode_model_infer_request(again))?;
    }

    #[test]
    fn grpc_bytes_that_prost_accepts_never_panic(bytes in proptest::collection::vec(any::<u8>(), 0..256)) {
        if let Ok(msg) = ModelInferRequest::decode(bytes.as_slice()) {
            check_result(decode_model_infer_request(msg))?;
        }
    }
}

/// Tokens that config.pbtxt files are made of.
fn config_token() -> impl Strategy<Value = String> {
    prop_oneof![
        proptest::sample::select(vec![
            "name",
            "max_batch_size",
            "input",
            "output",
            "data_type",
            "dims",
            "reshape",
            "shape",
            "instance_group",
            "count",
            "kind",
            "KIND_CPU",
            "dynamic_batching",
            "preferred_batch_size",
            "priority_levels",
            "default_priority_level",
            "priority_queue_policy",
            "key",
            "value",
            "TYPE_FP32",
            "TYPE_STRING",
            "parameters",
            "string_value",
            "{",
            "}",
            "[",
            "]",
            "<",
            ">",
            ":",
            ",",
            ";",
            "#",
            "\n",
            "\"",
            "-1",
            "0",
            "1",
            "18446744073709551616",
            "99999999999",
            "1e400",
            "\"m\"",
            "'x'",
        ])
        .prop_map(str::to_string),
        ".{0,3}",
    ]
}

proptest! {
    #![proptest_config(config(4000))]

    #[test]
    fn config_text_never_panics(tokens in proptest::collection::vec(config_token(), 0..40)) {
        let text = tokens.join(" ");
        if let Ok(c) = parse_model_config(&text) {
            let _ = validate(&c);
        }
    }

    #[test]
    fn mutated_real_configs_never_panic(
        model in proptest::sample::select(vec!["simple", "simple_dyna_batch", "simple_string", "mlp_onnx_dyna"]),
        at in any::<prop::sample::Index>(),
        cut in any::<prop::sample::Index>(),
        insert in config_token(),
    ) {
        let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR"))
            .join("models").join(model).join("config.pbtxt");
        let text = std::fs::read_to_string(path).unwrap();
        let mut at = at.index(text.len() + 1);
        while !text.is_char_boundary(at) {
            at -= 1;
        }
        let mut end = at + cut.index(text.len() - at + 1);
        while !text.is_char_boundary(end) {
            end -= 1;
        }
        let mutated = format!("{}{insert}{}", &text[..at], &text[end..]);
        if let Ok(c) = parse_model_config(&mutated) {
            let _ = validate(&c);
        }
    }
}
