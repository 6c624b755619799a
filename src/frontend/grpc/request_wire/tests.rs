use std::collections::HashMap;

use bytes::Bytes;
use proptest::prelude::*;
use prost::Message;

use super::{decode_plain, text, Reader};
use crate::{
    frontend::grpc::{codec::decode_model_infer_request_for, service::check_model_name},
    proto::inference::{
        infer_parameter::ParameterChoice,
        model_infer_request::{InferInputTensor, InferRequestedOutputTensor},
        InferParameter, InferTensorContents, ModelInferRequest,
    },
    types::InferRequest,
};

/// What the direct path did before this reader: prost, then the
/// conversion (with the model-name check `decode_infer_request` runs).
fn slow(bytes: &Bytes) -> Option<Result<InferRequest, String>> {
    let m = ModelInferRequest::decode(bytes.clone()).ok()?;
    Some(
        check_model_name(&m.model_name)
            .and_then(|()| decode_model_infer_request_for(m, None))
            .map_err(|e| e.to_string()),
    )
}

/// The reader may decline anything; what it takes must be exactly what
/// prost and the conversion make of the same bytes.
fn agrees(bytes: &Bytes) -> Result<bool, TestCaseError> {
    let Some(fast) = decode_plain(bytes) else {
        return Ok(false);
    };
    let slow = slow(bytes);
    prop_assert!(
        matches!(slow, Some(Ok(_))),
        "the reader took what prost or the conversion refuse: {slow:?}"
    );
    let slow = slow.and_then(Result::ok).expect("checked");
    prop_assert_eq!(format!("{fast:?}"), format!("{slow:?}"));
    // Raw contents are slices of the message, not copies.
    for t in &fast.inputs {
        let at = t.data.as_ptr() as usize;
        let base = bytes.as_ptr() as usize;
        prop_assert!(t.data.is_empty() || (at >= base && at < base + bytes.len()));
    }
    Ok(true)
}

fn input(name: &str, datatype: &str, shape: Vec<i64>) -> InferInputTensor {
    InferInputTensor {
        name: name.into(),
        datatype: datatype.into(),
        shape,
        ..Default::default()
    }
}

fn simple() -> ModelInferRequest {
    ModelInferRequest {
        model_name: "simple".into(),
        model_version: "1".into(),
        id: "call-7".into(),
        inputs: vec![
            input("INPUT0", "INT32", vec![1, 16]),
            input("INPUT1", "INT32", vec![1, 16]),
        ],
        outputs: vec![InferRequestedOutputTensor {
            name: "OUTPUT0".into(),
            ..Default::default()
        }],
        raw_input_contents: vec![Bytes::from(vec![1u8; 64]), Bytes::from(vec![2u8; 64])],
        ..Default::default()
    }
}

fn encoded(m: &ModelInferRequest) -> Bytes {
    Bytes::from(m.encode_to_vec())
}

#[test]
fn a_plain_request_is_read_as_prost_and_the_conversion_read_it() {
    let bytes = encoded(&simple());
    assert!(agrees(&bytes).unwrap(), "the plain request was declined");
}

#[test]
fn anything_beyond_the_plain_fields_goes_to_prost() {
    let param = || InferParameter {
        parameter_choice: Some(ParameterChoice::Int64Param(3)),
    };
    type Change = Box<dyn Fn(&mut ModelInferRequest)>;
    let cases: Vec<(&str, Change)> = vec![
        (
            "a request parameter without a value",
            Box::new(move |m| {
                m.parameters = HashMap::from([(
                    "priority".into(),
                    InferParameter {
                        parameter_choice: None,
                    },
                )]);
            }),
        ),
        (
            "input parameters",
            Box::new(move |m| {
                m.inputs[0].parameters = HashMap::from([("x".into(), param())]);
            }),
        ),
        (
            "output parameters",
            Box::new(move |m| {
                m.outputs[0].parameters = HashMap::from([("class_count".into(), param())]);
            }),
        ),
        (
            "typed contents",
            Box::new(|m| {
                m.inputs[0].contents = Some(InferTensorContents::default());
            }),
        ),
        (
            "no raw contents",
            Box::new(|m| m.raw_input_contents.clear()),
        ),
        (
            "a raw content missing",
            Box::new(|m| {
                m.raw_input_contents.pop();
            }),
        ),
        (
            "an unknown datatype",
            Box::new(|m| m.inputs[1].datatype = "INT33".into()),
        ),
        (
            "a negative dimension",
            Box::new(|m| m.inputs[0].shape = vec![-1, 16]),
        ),
        (
            "a raw size off by one",
            Box::new(|m| {
                m.raw_input_contents[1] = Bytes::from(vec![0u8; 63]);
            }),
        ),
        (
            "a model name over the limit",
            Box::new(|m| m.model_name = "m".repeat(100_000)),
        ),
    ];
    for (what, change) in cases {
        let mut m = simple();
        change(&mut m);
        let bytes = encoded(&m);
        assert!(decode_plain(&bytes).is_none(), "{what}: taken");
    }
}

#[test]
fn damaged_bytes_go_to_prost() {
    let good = encoded(&simple()).to_vec();
    // Every truncation, and an unknown field, a bad UTF-8 name and a
    // ten-byte varint with a high last byte.
    for cut in 0..good.len() {
        let bytes = Bytes::from(good[..cut].to_vec());
        agrees(&bytes).unwrap();
    }
    let mut unknown = good.clone();
    unknown.extend_from_slice(&[0x48, 0x01]); // field 9, varint 1
    assert!(decode_plain(&Bytes::from(unknown)).is_none());
    let mut bad_utf8 = vec![0x0a, 0x02, 0xff, 0xfe];
    bad_utf8.extend_from_slice(&good);
    assert!(decode_plain(&Bytes::from(bad_utf8)).is_none());
    let mut long_varint = good;
    long_varint.extend_from_slice(&[
        0x18, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0x02,
    ]);
    assert!(decode_plain(&Bytes::from(long_varint)).is_none());
}

#[test]
fn text_takes_ascii_and_utf8_and_refuses_the_rest() {
    assert_eq!(text(b"INT32"), Some("INT32"));
    assert_eq!(text(b""), Some(""));
    assert_eq!(
        text("caf\u{e9} \u{1f600}".as_bytes()),
        Some("caf\u{e9} \u{1f600}")
    );
    assert_eq!(text(b"INPUT\xff"), None);
    assert_eq!(text(b"\xc3"), None);
    // Past a word of ASCII, a bad byte in the second word.
    assert_eq!(text(b"ABCDEFGHIJKLMNO\x80"), None);
}

#[test]
fn varints_of_every_length_read_as_prost_writes_them() {
    let values = [
        0u64,
        1,
        127,
        128,
        300,
        16_383,
        16_384,
        u64::from(u32::MAX),
        u64::MAX,
    ];
    for v in values {
        let mut buf = Vec::new();
        prost::encoding::encode_varint(v, &mut buf);
        let mut r = Reader::new(&buf);
        assert_eq!(r.varint(), Some(v), "{v}");
        assert!(r.done(), "{v}");
        // Cut short, it is refused, never read past the end.
        let cut = &buf[..buf.len() - 1];
        assert_eq!(Reader::new(cut).varint(), None, "{v} cut");
    }
    // Shapes with multi-byte dimensions, packed, read as prost reads them.
    let mut m = simple();
    m.inputs[0].shape = vec![1, 300];
    m.inputs[1].shape = vec![1, 300];
    m.raw_input_contents = vec![Bytes::from(vec![0u8; 1200]); 2];
    assert!(
        agrees(&encoded(&m)).unwrap(),
        "declined multi-byte dimensions"
    );
}

#[test]
fn repeated_fields_behave_as_in_prost() {
    // The last model name wins; shape occurrences append, packed or not.
    let mut bytes = encoded(&simple()).to_vec();
    bytes.extend_from_slice(&[0x0a, 0x06]);
    bytes.extend_from_slice(b"simple");
    let fast = decode_plain(&Bytes::from(bytes.clone())).expect("taken");
    assert_eq!(fast.model_name, "simple");
    // An input whose shape comes as two unpacked values.
    let mut input = Vec::new();
    input.extend_from_slice(&[0x0a, 0x01, b'A', 0x12, 0x04]);
    input.extend_from_slice(b"INT8");
    input.extend_from_slice(&[0x18, 0x02, 0x18, 0x03]);
    let mut m = vec![0x0a, 0x01, b'm', 0x2a, input.len() as u8];
    m.extend_from_slice(&input);
    m.extend_from_slice(&[0x3a, 0x06, 1, 2, 3, 4, 5, 6]);
    let bytes = Bytes::from(m);
    assert!(agrees(&bytes).unwrap());
    assert_eq!(decode_plain(&bytes).unwrap().inputs[0].shape, vec![2, 3]);
}

#[test]
fn request_parameters_are_read_as_prost_reads_them() {
    let mut m = simple();
    m.parameters = HashMap::from([
        (
            "sequence_id".into(),
            choice(ParameterChoice::Uint64Param(u64::MAX)),
        ),
        (
            "sequence_start".into(),
            choice(ParameterChoice::BoolParam(true)),
        ),
        (
            "sequence_end".into(),
            choice(ParameterChoice::BoolParam(false)),
        ),
        ("priority".into(), choice(ParameterChoice::Int64Param(-3))),
        ("scale".into(), choice(ParameterChoice::DoubleParam(0.25))),
        (
            "tag".into(),
            choice(ParameterChoice::StringParam("x".into())),
        ),
    ]);
    let bytes = encoded(&m);
    assert!(agrees(&bytes).unwrap(), "declined request parameters");
    assert_eq!(decode_plain(&bytes).unwrap().parameters.len(), 6);
    // A later entry with the same key replaces the earlier one.
    let mut twice = bytes.to_vec();
    let mut again = simple();
    again.parameters = HashMap::from([("priority".into(), choice(ParameterChoice::Int64Param(9)))]);
    twice.extend_from_slice(&again.encode_to_vec());
    let twice = Bytes::from(twice);
    assert!(agrees(&twice).unwrap());
    // A value with two choices, a key given twice, and an entry with no
    // value: prost's merge rules and defaults, left to prost.
    let entry = |body: &[u8]| {
        let mut m = encoded(&simple()).to_vec();
        m.push(0x22);
        m.push(body.len() as u8);
        m.extend_from_slice(body);
        Bytes::from(m)
    };
    for body in [
        &[0x0a, 0x01, b'k', 0x12, 0x04, 0x08, 0x01, 0x10, 0x02][..],
        &[0x0a, 0x01, b'k', 0x0a, 0x01, b'j', 0x12, 0x02, 0x08, 0x01][..],
        &[0x0a, 0x01, b'k'][..],
    ] {
        let bytes = entry(body);
        assert!(decode_plain(&bytes).is_none(), "taken: {body:?}");
        assert!(slow(&bytes).is_some(), "prost refuses {body:?} too");
    }
    // The same entry, well formed, is taken, and with no key (prost's
    // encoding of the empty one).
    assert!(agrees(&entry(&[0x0a, 0x01, b'k', 0x12, 0x02, 0x08, 0x01])).unwrap());
    assert!(agrees(&entry(&[0x12, 0x02, 0x08, 0x01])).unwrap());
}

fn choice(c: ParameterChoice) -> InferParameter {
    InferParameter {
        parameter_choice: Some(c),
    }
}

/// Any parameter value, or none (an entry prost fills in with defaults).
fn parameter_value() -> impl Strategy<Value = InferParameter> {
    prop_oneof![
        any::<bool>().prop_map(ParameterChoice::BoolParam),
        any::<i64>().prop_map(ParameterChoice::Int64Param),
        any::<u64>().prop_map(ParameterChoice::Uint64Param),
        any::<f64>().prop_map(ParameterChoice::DoubleParam),
        ".{0,6}".prop_map(ParameterChoice::StringParam),
    ]
    .prop_map(choice)
}

fn parameters(with_empty: bool) -> impl Strategy<Value = HashMap<String, InferParameter>> {
    let value = (parameter_value(), any::<bool>()).prop_map(move |(p, empty)| {
        if with_empty && empty {
            InferParameter {
                parameter_choice: None,
            }
        } else {
            p
        }
    });
    prop::collection::hash_map(
        prop::sample::select(vec![
            "sequence_id",
            "sequence_start",
            "priority",
            "timeout",
            "",
            "k",
        ])
        .prop_map(str::to_owned),
        value,
        0..4,
    )
}

/// Requested outputs by name only.
fn requested(names: Vec<String>) -> Vec<InferRequestedOutputTensor> {
    names
        .into_iter()
        .map(|name| InferRequestedOutputTensor {
            name,
            ..Default::default()
        })
        .collect()
}

fn datatype() -> impl Strategy<Value = String> {
    prop::sample::select(vec![
        "BOOL", "INT8", "INT32", "INT64", "UINT16", "FP16", "FP32", "FP64", "BYTES", "BF16",
        "int32", "",
    ])
    .prop_map(str::to_owned)
}

fn request() -> impl Strategy<Value = ModelInferRequest> {
    let input = (
        "[A-Z0-9_]{0,8}",
        datatype(),
        prop::collection::vec(-1i64..6, 0..4),
        any::<bool>(),
        any::<bool>(),
    )
        .prop_map(
            |(name, datatype, shape, params, contents)| InferInputTensor {
                name,
                datatype,
                shape,
                parameters: if params {
                    HashMap::from([(
                        "shared_memory_region".into(),
                        InferParameter {
                            parameter_choice: Some(ParameterChoice::StringParam("r".into())),
                        },
                    )])
                } else {
                    HashMap::new()
                },
                contents: contents.then(InferTensorContents::default),
            },
        );
    (
        ".{0,12}",
        "[0-9]{0,2}",
        ".{0,6}",
        prop::collection::vec(input, 0..4),
        prop::collection::vec("[A-Z0-9]{0,8}", 0..3),
        prop::collection::vec(prop::collection::vec(any::<u8>(), 0..40), 0..4),
        parameters(true),
    )
        .prop_map(
            |(model_name, model_version, id, inputs, outputs, raw, parameters)| ModelInferRequest {
                model_name,
                model_version,
                id,
                parameters,
                inputs,
                outputs: requested(outputs),
                raw_input_contents: raw.into_iter().map(Bytes::from).collect(),
            },
        )
}

/// Requests the conversion takes: sizes that fit each shape.
fn plain_request() -> impl Strategy<Value = ModelInferRequest> {
    (
        (".{0,12}", "[0-9]{0,2}", ".{0,6}", parameters(false)),
        prop::collection::vec("[A-Z0-9]{0,8}", 0..3),
        prop::collection::vec(
            (
                "[A-Z0-9_]{0,8}",
                prop::sample::select(vec![("INT8", 1usize), ("INT32", 4), ("FP64", 8)]),
                prop::collection::vec(0i64..5, 0..4),
            ),
            1..4,
        ),
    )
        .prop_map(
            |((model_name, model_version, id, parameters), outputs, inputs)| {
                let raw = inputs
                    .iter()
                    .map(|(_, (_, size), shape)| {
                        let n: i64 = shape.iter().product();
                        Bytes::from(vec![7u8; n as usize * size])
                    })
                    .collect();
                ModelInferRequest {
                    model_name,
                    model_version,
                    id,
                    outputs: requested(outputs),
                    inputs: inputs
                        .into_iter()
                        .map(|(name, (dt, _), shape)| input(&name, dt, shape))
                        .collect(),
                    raw_input_contents: raw,
                    parameters,
                }
            },
        )
}

proptest! {
    #[test]
    fn generated_requests_agree_with_prost(m in request()) {
        agrees(&encoded(&m))?;
    }

    #[test]
    fn plain_requests_are_taken_and_agree(m in plain_request()) {
        prop_assert!(agrees(&encoded(&m))?, "declined a plain request");
    }

    #[test]
    fn damaged_requests_agree_with_prost(
        m in plain_request(),
        at in any::<prop::sample::Index>(),
        byte in any::<u8>(),
        cut in any::<prop::sample::Index>(),
    ) {
        let mut bytes = m.encode_to_vec();
        if !bytes.is_empty() {
            let i = at.index(bytes.len());
            bytes[i] = byte;
            let keep = cut.index(bytes.len() + 1);
            bytes.truncate(keep.max(i + 1));
        }
        agrees(&Bytes::from(bytes))?;
    }
}
