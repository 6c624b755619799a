use std::path::PathBuf;

use bytes::Bytes;

use super::*;
use crate::{
    proto::inference::{model_optimization_policy::Graph, ModelOptimizationPolicy, ModelParameter},
    types::encode_bytes_elements,
};

fn io(name: &str, dtype: DataType, dims: &[i64]) -> IoInfo {
    IoInfo {
        name: name.into(),
        dtype,
        dims: dims.to_vec(),
    }
}

fn simple_io() -> ModelIo {
    ModelIo {
        inputs: vec![
            io("INPUT0", DataType::Int32, &[-1, 16]),
            io("INPUT1", DataType::Int32, &[-1, 16]),
        ],
        outputs: vec![
            io("OUTPUT0", DataType::Int32, &[-1, 16]),
            io("OUTPUT1", DataType::Int32, &[-1, 16]),
        ],
    }
}

#[test]
fn empty_config_gets_default_batch_dynamic_batcher_and_io() {
    let mut config = ModelConfig {
        name: "m".into(),
        ..Default::default()
    };
    complete(&mut config, &simple_io()).unwrap();
    assert_eq!(config.max_batch_size, DEFAULT_MAX_BATCH_SIZE);
    assert!(matches!(
        config.scheduling_choice,
        Some(SchedulingChoice::DynamicBatching(_))
    ));
    assert_eq!(config.input.len(), 2);
    assert_eq!(config.input[1].name, "INPUT1");
    assert_eq!(config.input[1].dims, vec![16]);
    assert_eq!(
        DataType::from_config_i32(config.output[0].data_type),
        Some(DataType::Int32)
    );
    check(&config, &simple_io()).unwrap();
}

#[test]
fn user_max_batch_size_is_kept_and_io_filled() {
    let mut config = ModelConfig {
        name: "m".into(),
        max_batch_size: 16,
        ..Default::default()
    };
    complete(&mut config, &simple_io()).unwrap();
    assert_eq!(config.max_batch_size, 16);
    assert!(
        config.scheduling_choice.is_none(),
        "only a defaulted max_batch_size adds a batcher"
    );
    assert_eq!(config.output[1].dims, vec![16]);
}

#[test]
fn listed_io_without_max_batch_size_is_taken_as_full_shapes() {
    let mut config = ModelConfig {
        name: "m".into(),
        input: ["INPUT0", "INPUT1"]
            .iter()
            .map(|n| ModelInput {
                name: (*n).into(),
                ..Default::default()
            })
            .collect(),
        ..Default::default()
    };
    complete(&mut config, &simple_io()).unwrap();
    assert_eq!(config.max_batch_size, 0);
    assert_eq!(config.input[0].dims, vec![-1, 16]);
    assert_eq!(
        DataType::from_config_i32(config.input[0].data_type),
        Some(DataType::Int32)
    );
    assert_eq!(config.output.len(), 2);
    check(&config, &simple_io()).unwrap();
}

#[test]
fn fixed_leading_dim_is_not_batched() {
    let model = ModelIo {
        inputs: vec![io("X", DataType::Fp32, &[3, 4])],
        outputs: vec![io("Y", DataType::Fp32, &[3, 4])],
    };
    let mut config = ModelConfig::default();
    complete(&mut config, &model).unwrap();
    assert_eq!(config.max_batch_size, 0);
    assert_eq!(config.input[0].dims, vec![3, 4]);
    let mut batched = ModelConfig {
        max_batch_size: 8,
        ..Default::default()
    };
    let err = complete(&mut batched, &model).unwrap_err().to_string();
    assert!(err.contains("dynamic first dimension"), "{err}");
}

#[test]
fn check_rejects_unknown_names_wrong_types_dims_and_missing_inputs() {
    let base = || {
        let mut c = ModelConfig {
            name: "m".into(),
            max_batch_size: 8,
            ..Default::default()
        };
        complete(&mut c, &simple_io()).unwrap();
        c
    };
    let mut c = base();
    c.input[0].name = "NOPE".into();
    let err = check(&c, &simple_io()).unwrap_err().to_string();
    assert!(
        err.contains("'NOPE' is not an input") && err.contains("INPUT0, INPUT1"),
        "{err}"
    );

    let mut c = base();
    c.output[1].data_type = DataType::Fp32.to_config() as i32;
    let err = check(&c, &simple_io()).unwrap_err().to_string();
    assert!(
        err.contains("TYPE_FP32") && err.contains("TYPE_INT32"),
        "{err}"
    );

    let mut c = base();
    c.input[0].dims = vec![8];
    let err = check(&c, &simple_io()).unwrap_err().to_string();
    assert!(err.contains("dims [8]"), "{err}");

    let mut c = base();
    c.input.truncate(1);
    let err = check(&c, &simple_io()).unwrap_err().to_string();
    assert!(err.contains("input 'INPUT1' is missing"), "{err}");

    let mut c = base();
    c.output.truncate(1);
    check(&c, &simple_io()).expect("a subset of the outputs is fine");
}

#[test]
fn settings_follow_triton_parameters() {
    let spec = InstanceSpec {
        name: "m_0".into(),
        index: 0,
        intra_op_threads: 1,
    };
    let mut config = ModelConfig::default();
    let s = SessionSettings::from_config(&config, &spec).unwrap();
    assert_eq!(s.intra_threads, 1);
    assert_eq!(s.level, GraphOptimizationLevel::All);
    assert!(!s.parallel);

    let param = |v: &str| ModelParameter {
        string_value: v.into(),
    };
    config
        .parameters
        .insert("intra_op_thread_count".into(), param("3"));
    config
        .parameters
        .insert("inter_op_thread_count".into(), param("2"));
    config
        .parameters
        .insert("execution_mode".into(), param("1"));
    config.optimization = Some(ModelOptimizationPolicy {
        graph: Some(Graph { level: -1 }),
        ..Default::default()
    });
    let s = SessionSettings::from_config(&config, &spec).unwrap();
    assert_eq!(
        s,
        SessionSettings {
            intra_threads: 3,
            inter_threads: Some(2),
            parallel: true,
            level: GraphOptimizationLevel::Level1,
        }
    );
    config
        .parameters
        .insert("intra_op_thread_count".into(), param("many"));
    assert!(SessionSettings::from_config(&config, &spec).is_err());
}

// ---- through ONNX Runtime, with tests/data/identity_all_types.onnx ----

fn identity_instance() -> Box<dyn ModelInstance> {
    let data = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("tests/data");
    let files = ModelFiles {
        model_dir: data.clone(),
        version_dir: data,
        version: 1,
    };
    let mut config = ModelConfig {
        name: "identity_all_types".into(),
        default_model_filename: "identity_all_types.onnx".into(),
        ..Default::default()
    };
    OnnxRuntimeBackend
        .auto_complete(&mut config, &files)
        .unwrap();
    assert_eq!(config.max_batch_size, DEFAULT_MAX_BATCH_SIZE);
    assert_eq!(config.input.len(), DataType::ALL.len());
    let spec = InstanceSpec {
        name: "identity_all_types_0".into(),
        index: 0,
        intra_op_threads: 1,
    };
    OnnxRuntimeBackend
        .create_instance(&config, &files, &spec)
        .unwrap()
}

/// Two rows of three elements of each datatype, with distinctive values.
fn sample(dt: DataType) -> Bytes {
    let n = 6;
    match dt {
        DataType::Bytes => {
            encode_bytes_elements([&b""[..], b"a\0b", b"\xff\xfe", b"plain", b"\0", b"x"])
        }
        DataType::Bool => Bytes::from(vec![1u8, 0, 1, 1, 0, 0]),
        _ => {
            let size = dt.element_size().unwrap();
            // Bytes 1.. with the top bit set somewhere, so signedness and
            // byte order both matter.
            Bytes::from(
                (0..n * size)
                    .map(|i| (i as u8).wrapping_mul(37).wrapping_add(0x81))
                    .collect::<Vec<u8>>(),
            )
        }
    }
}

fn all_inputs(make: impl Fn(DataType) -> Bytes) -> Vec<Tensor> {
    DataType::ALL
        .iter()
        .map(|&dt| Tensor::new(format!("IN_{dt}"), dt, vec![2, 3], make(dt)))
        .collect()
}

fn by_name<'a>(outputs: &'a [Tensor], name: &str) -> &'a Tensor {
    outputs
        .iter()
        .find(|t| t.name == name)
        .unwrap_or_else(|| panic!("no output {name}"))
}

#[test]
fn every_datatype_round_trips_through_ort() {
    let mut instance = identity_instance();
    let inputs = all_inputs(sample);
    let outputs = instance.execute(&inputs, &[]).unwrap();
    assert_eq!(outputs.len(), DataType::ALL.len());
    for input in &inputs {
        let out = by_name(&outputs, &input.name.replace("IN_", "OUT_"));
        assert_eq!(out.datatype, input.datatype, "{}", input.name);
        assert_eq!(out.shape, vec![2, 3], "{}", input.name);
        assert_eq!(out.data, input.data, "{}", input.name);
    }
}

#[test]
fn unaligned_inputs_are_copied_correctly() {
    let mut instance = identity_instance();
    // Every fixed-size input starts one byte into its buffer, as a tensor
    // sliced out of a binary HTTP body at an odd offset would.
    let inputs = all_inputs(|dt| {
        let data = sample(dt);
        if dt == DataType::Bytes {
            return data;
        }
        let mut raw = vec![0u8];
        raw.extend_from_slice(&data);
        Bytes::from(raw).slice(1..)
    });
    let outputs = instance.execute(&inputs, &[]).unwrap();
    for input in &inputs {
        assert_eq!(
            by_name(&outputs, &input.name.replace("IN_", "OUT_")).data,
            input.data,
            "{}",
            input.name
        );
    }
}

#[test]
fn bool_bytes_other_than_one_read_as_true() {
    let mut instance = identity_instance();
    let mut inputs = all_inputs(sample);
    let b = inputs
        .iter_mut()
        .find(|t| t.datatype == DataType::Bool)
        .unwrap();
    b.data = Bytes::from(vec![2u8, 0, 255, 1, 0, 7]);
    let outputs = instance.execute(&inputs, &["OUT_BOOL"]).unwrap();
    assert_eq!(outputs.len(), 1, "only the requested output is returned");
    assert_eq!(&outputs[0].data[..], &[1, 0, 1, 1, 0, 1]);
}

#[test]
fn empty_batch_and_empty_strings_work() {
    let mut instance = identity_instance();
    let inputs: Vec<Tensor> = DataType::ALL
        .iter()
        .map(|&dt| Tensor::new(format!("IN_{dt}"), dt, vec![1, 0], Bytes::new()))
        .collect();
    let outputs = instance.execute(&inputs, &[]).unwrap();
    for out in &outputs {
        assert_eq!(out.shape, vec![1, 0], "{}", out.name);
        assert!(out.data.is_empty(), "{}", out.name);
    }
}

#[test]
fn bad_input_data_is_an_invalid_argument_not_a_panic() {
    let mut instance = identity_instance();
    let mut inputs = all_inputs(sample);
    let s = inputs
        .iter_mut()
        .find(|t| t.datatype == DataType::Bytes)
        .unwrap();
    s.data = Bytes::from_static(&[9, 0, 0, 0, b'a']);
    let err = instance.execute(&inputs, &[]).unwrap_err();
    assert_eq!(err.kind, crate::types::ErrorKind::InvalidArgument, "{err}");
    assert!(err.message.contains("IN_BYTES"), "{err}");

    let mut inputs = all_inputs(sample);
    inputs[3].data = inputs[3].data.slice(1..);
    let err = instance.execute(&inputs, &[]).unwrap_err();
    assert_eq!(err.kind, crate::types::ErrorKind::InvalidArgument, "{err}");
}

#[test]
fn ort_failures_name_the_model() {
    let mut instance = identity_instance();
    let mut inputs = all_inputs(sample);
    inputs.pop();
    let err = instance.execute(&inputs, &[]).unwrap_err();
    assert_eq!(err.kind, crate::types::ErrorKind::Internal, "{err}");
    assert!(err.message.contains("model 'identity_all_types'"), "{err}");
}

#[test]
fn garbage_model_file_is_a_load_error() {
    let dir = std::env::temp_dir().join(format!("shardserve-ort-garbage-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    std::fs::write(dir.join("model.onnx"), b"this is not a protobuf").unwrap();
    let files = ModelFiles {
        model_dir: dir.clone(),
        version_dir: dir.clone(),
        version: 1,
    };
    let mut config = ModelConfig {
        name: "garbage".into(),
        ..Default::default()
    };
    let err = format!(
        "{:#}",
        OnnxRuntimeBackend
            .auto_complete(&mut config, &files)
            .unwrap_err()
    );
    assert!(
        err.contains("cannot load") && err.contains("model.onnx"),
        "{err}"
    );
    std::fs::remove_file(dir.join("model.onnx")).unwrap();
    let err = format!(
        "{:#}",
        OnnxRuntimeBackend
            .auto_complete(&mut config, &files)
            .unwrap_err()
    );
    assert!(err.contains("not found"), "{err}");
    let _ = std::fs::remove_dir_all(&dir);
}

/// Latency of `mlp_onnx` through this backend (conversions included), per
/// batch size, one intra-op thread. Compare with
/// `scripts/bench_ort_direct.py`, which calls ORT from Python.
/// `cargo test --release --lib mlp_onnx_latency -- --ignored --nocapture`
#[test]
#[ignore = "a measurement, not a check"]
fn mlp_onnx_latency() {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/mlp_onnx");
    let files = ModelFiles {
        model_dir: root.clone(),
        version_dir: root.join("1"),
        version: 1,
    };
    let mut config = ModelConfig {
        name: "mlp_onnx".into(),
        max_batch_size: 64,
        ..Default::default()
    };
    OnnxRuntimeBackend
        .auto_complete(&mut config, &files)
        .unwrap();
    let spec = InstanceSpec {
        name: "mlp_onnx_0".into(),
        index: 0,
        intra_op_threads: 1,
    };
    let mut instance = OnnxRuntimeBackend
        .create_instance(&config, &files, &spec)
        .unwrap();
    for batch in [1usize, 8, 32, 64] {
        let data: Vec<u8> = (0..batch * 256)
            .flat_map(|i| ((i % 17) as f32 / 17.0).to_le_bytes())
            .collect();
        let input = Tensor::new(
            "INPUT0",
            DataType::Fp32,
            vec![batch as i64, 256],
            Bytes::from(data),
        );
        for _ in 0..20 {
            instance.execute(std::slice::from_ref(&input), &[]).unwrap();
        }
        let mut lat: Vec<f64> = Vec::new();
        let end = std::time::Instant::now() + std::time::Duration::from_secs(2);
        while std::time::Instant::now() < end {
            let t0 = std::time::Instant::now();
            instance.execute(std::slice::from_ref(&input), &[]).unwrap();
            lat.push(t0.elapsed().as_secs_f64());
        }
        lat.sort_by(f64::total_cmp);
        let total: f64 = lat.iter().sum();
        println!(
            "batch {batch:3}: {:8.1} exec/s {:9.1} infer/s  p50 {:7.1} us  p99 {:7.1} us",
            lat.len() as f64 / total,
            (batch * lat.len()) as f64 / total,
            lat[lat.len() / 2] * 1e6,
            lat[lat.len() * 99 / 100] * 1e6
        );
    }
}
