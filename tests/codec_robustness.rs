//! No request body can make the decoders or validation panic: thousands of
//! deterministic mutations (bit flips, truncations, insertions, bogus
//! header lengths) of valid JSON and binary bodies for `simple`, and of gRPC
//! messages, each either decodes and validates or fails with an error.

use bytes::Bytes;
use prost::Message;
use shardserve::{
    config::parse_model_config,
    frontend::{grpc::codec::decode_model_infer_request, http::codec::decode_infer_request},
    model::{validate_request, IoSpec},
    proto::inference::ModelInferRequest,
};

/// xorshift64*: deterministic, so a failure reproduces.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
    }
    fn below(&mut self, n: usize) -> usize {
        (self.next() % n.max(1) as u64) as usize
    }
}

fn simple_io() -> IoSpec {
    let dir = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("models/simple");
    let text = std::fs::read_to_string(dir.join("config.pbtxt")).unwrap();
    IoSpec::from_config(&parse_model_config(&text).unwrap(), &dir).unwrap()
}

fn mutate(rng: &mut Rng, body: &[u8]) -> Vec<u8> {
    let mut out = body.to_vec();
    for _ in 0..1 + rng.below(4) {
        match rng.below(5) {
            0 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] ^= 1 << rng.below(8);
            }
            1 => out.truncate(rng.below(out.len() + 1)),
            2 => {
                let i = rng.below(out.len() + 1);
                let junk: &[u8] = match rng.below(6) {
                    0 => b"[",
                    1 => b"}",
                    2 => b"-1",
                    3 => b"1e400",
                    4 => b"\"\\u0000\"",
                    _ => &[0xff, 0xfe, 0x00],
                };
                out.splice(i..i, junk.iter().copied());
            }
            3 if !out.is_empty() => {
                let i = rng.below(out.len());
                out[i] = b"0123456789,:[]{}\"-"[rng.below(18)];
            }
            _ => {
                let i = rng.below(out.len() + 1);
                out.splice(i..i, [b'9'; 12]);
            }
        }
    }
    out
}

/// Whether the body decoded and validated (so a run can show it exercised
/// both the accepting and the refusing paths).
fn check_http(io: &IoSpec, body: Vec<u8>, header_length: Option<usize>) -> bool {
    match decode_infer_request(Bytes::from(body), header_length, "simple", "") {
        Ok(mut req) => validate_request(io, "simple", &mut req).is_ok(),
        Err(e) => {
            assert!(!e.message.is_empty());
            false
        }
    }
}

#[test]
fn mutated_json_bodies_never_panic() {
    let io = simple_io();
    let body = br#"{"id":"1","parameters":{"priority":1},"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"data":[[0,1,2,3,4,5,6,7,8,9,10,11,12,13,14,15]]},{"name":"INPUT1","datatype":"INT32","shape":[1,16],"data":[1,1,1,1,1,1,1,1,1,1,1,1,1,1,1,1]}],"outputs":[{"name":"OUTPUT0","parameters":{"classification":2}}]}"#;
    let mut rng = Rng(0x5eed);
    let accepted = (0..20_000)
        .filter(|_| check_http(&io, mutate(&mut rng, body), None))
        .count();
    assert!(accepted > 0 && accepted < 20_000, "accepted {accepted}");
}

#[test]
fn mutated_binary_bodies_and_header_lengths_never_panic() {
    let io = simple_io();
    let header = br#"{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":[1,16],"parameters":{"binary_data_size":64}},{"name":"INPUT1","datatype":"INT32","shape":[1,16],"parameters":{"binary_data_size":64}}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}}]}"#;
    let mut body = header.to_vec();
    body.extend((0..32i32).flat_map(i32::to_le_bytes));
    let mut rng = Rng(0xb1_4a_72);
    let mut accepted = 0;
    for _ in 0..20_000 {
        let mutated = mutate(&mut rng, &body);
        let header_length = match rng.below(4) {
            0 => header.len(),
            1 => rng.below(mutated.len() + 8),
            2 => usize::MAX - rng.below(3),
            _ => header.len() + rng.below(9) - 4,
        };
        accepted += usize::from(check_http(&io, mutated, Some(header_length)));
    }
    assert!(accepted > 0 && accepted < 20_000, "accepted {accepted}");
}

#[test]
fn mutated_grpc_messages_never_panic() {
    let io = simple_io();
    let valid = ModelInferRequest {
        model_name: "simple".into(),
        inputs: ["INPUT0", "INPUT1"]
            .iter()
            .map(
                |n| shardserve::proto::inference::model_infer_request::InferInputTensor {
                    name: (*n).into(),
                    datatype: "INT32".into(),
                    shape: vec![1, 16],
                    ..Default::default()
                },
            )
            .collect(),
        raw_input_contents: vec![Bytes::from(vec![1u8; 64]), Bytes::from(vec![2u8; 64])],
        ..Default::default()
    }
    .encode_to_vec();
    let mut rng = Rng(0x9_7c);
    for _ in 0..20_000 {
        let bytes = mutate(&mut rng, &valid);
        // What prost refuses never reaches us (tonic answers it); what it
        // accepts must decode or fail cleanly.
        if let Ok(msg) = ModelInferRequest::decode(bytes.as_slice()) {
            if let Ok(mut req) = decode_model_infer_request(msg) {
                let _ = validate_request(&io, "simple", &mut req);
            }
        }
    }
}
