use std::path::PathBuf;

use bytes::Bytes;

use super::*;
use crate::{
    proto::inference::{
        model_optimization_policy::Graph, model_sequence_batching::initial_state,
        ModelOptimizationPolicy, ModelParameter,
    },
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
        device: crate::backend::InstanceDevice::Cpu,
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
            device: crate::backend::InstanceDevice::Cpu,
        }
    );
    config
        .parameters
        .insert("intra_op_thread_count".into(), param("many"));
    assert!(SessionSettings::from_config(&config, &spec).is_err());
}

// ---- through ONNX Runtime, with tests/data/identity_all_types.onnx ----

fn identity_instance() -> Box<dyn ModelInstance> {
    Box::new(identity_onnx())
}

fn identity_onnx() -> OnnxInstance {
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
        device: crate::backend::InstanceDevice::Cpu,
    };
    OnnxInstance::create(&config, &files, &spec).unwrap()
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

// ---- input staging (GPU instances), forced onto CPU sessions ----

/// A staging pool for tests: pageable buffers (no GPU here), otherwise the
/// pool GPU instances use.
fn test_pool(capacity: usize) -> StagingPool {
    StagingPool::new(
        None,
        capacity,
        crate::gpu::pinned::DEFAULT_MAX_BUFFER,
        std::sync::Arc::new(crate::gpu::pinned::NoPinning("test: CPU session".into())),
    )
}

/// Views over staging buffers are accepted by ORT for every datatype that
/// is staged, and the others still go their own way; aligned or not, the
/// outputs are the inputs. The buffers are back in the pool after each run.
#[test]
fn staged_inputs_of_every_datatype_round_trip_through_ort() {
    let mut instance = identity_onnx();
    assert!(instance.staging.is_none(), "CPU instances do not stage");
    let pool = test_pool(crate::gpu::pinned::DEFAULT_CAPACITY);
    instance.staging = Some(InputStaging::new(pool.clone()));
    let stageable = DataType::ALL
        .iter()
        .filter(|&&dt| staging::is_stageable(dt))
        .count() as u64;
    let aligned = all_inputs(sample);
    let unaligned = all_inputs(|dt| {
        let data = sample(dt);
        if dt == DataType::Bytes {
            return data;
        }
        let mut raw = vec![0u8];
        raw.extend_from_slice(&data);
        Bytes::from(raw).slice(1..)
    });
    for inputs in [&aligned, &unaligned, &aligned] {
        let outputs = instance.execute(inputs, &[]).unwrap();
        assert_eq!(outputs.len(), DataType::ALL.len());
        for input in inputs {
            let out = by_name(&outputs, &input.name.replace("IN_", "OUT_"));
            assert_eq!(out.datatype, input.datatype, "{}", input.name);
            assert_eq!(out.shape, input.shape, "{}", input.name);
            assert_eq!(out.data, input.data, "{}", input.name);
        }
        assert_eq!(
            pool.stats().buffers as u64,
            stageable,
            "one buffer per staged input, all returned"
        );
    }
    let s = pool.stats();
    assert_eq!((s.created, s.reused), (stageable, 2 * stageable));
    let staging = instance.staging.as_ref().unwrap();
    assert_eq!((staging.staged, staging.fallback), (3 * stageable, 0));
}

/// A real model gives the same bytes from staged inputs as from the
/// request's own, and from request memory when the pool has nothing.
#[test]
fn mlp_onnx_gives_the_same_outputs_staged_unstaged_and_on_fallback() {
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
        device: crate::backend::InstanceDevice::Cpu,
    };
    let batch = 8;
    let data: Vec<u8> = (0..batch * 256)
        .flat_map(|i| (((i * 7919) % 113) as f32 / 113.0 - 0.5).to_le_bytes())
        .collect();
    let input = Tensor::new(
        "INPUT0",
        DataType::Fp32,
        vec![batch as i64, 256],
        Bytes::from(data),
    );
    let inputs = std::slice::from_ref(&input);

    let mut plain = OnnxInstance::create(&config, &files, &spec).unwrap();
    let expected = plain.execute(inputs, &[]).unwrap();
    assert_eq!(expected[0].shape, vec![batch as i64, 256]);

    let pool = test_pool(crate::gpu::pinned::DEFAULT_CAPACITY);
    let mut staged = OnnxInstance::create(&config, &files, &spec).unwrap();
    staged.staging = Some(InputStaging::new(pool.clone()));
    for _ in 0..3 {
        let got = staged.execute(inputs, &[]).unwrap();
        assert_eq!(got[0].data, expected[0].data);
        assert_eq!(got[0].shape, expected[0].shape);
    }
    let s = pool.stats();
    assert_eq!((s.created, s.reused, s.buffers), (1, 2, 1));

    let empty = test_pool(0);
    staged.staging = Some(InputStaging::new(empty.clone()));
    let got = staged.execute(inputs, &[]).unwrap();
    assert_eq!(got[0].data, expected[0].data);
    let staging = staged.staging.as_ref().unwrap();
    assert_eq!((staging.staged, staging.fallback), (0, 1));
    assert_eq!(empty.stats().buffers, 0);
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
    // Rank 3 where the graph declares rank 2: ORT refuses it.
    inputs[0].shape = vec![2, 3, 1];
    let err = instance.execute(&inputs, &[]).unwrap_err();
    assert_eq!(err.kind, crate::types::ErrorKind::Internal, "{err}");
    assert!(
        err.message
            .contains("model 'identity_all_types': ONNX Runtime failed"),
        "{err}"
    );
}

#[test]
fn a_missing_input_is_named() {
    let mut instance = identity_instance();
    let mut inputs = all_inputs(sample);
    inputs.pop();
    let err = instance.execute(&inputs, &[]).unwrap_err();
    assert_eq!(err.kind, crate::types::ErrorKind::Internal, "{err}");
    assert_eq!(
        err.message,
        "model 'identity_all_types': input 'IN_BYTES' was not given"
    );
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
        device: crate::backend::InstanceDevice::Cpu,
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

// ---- stateful models: sequence control inputs and implicit state ----

/// A configuration with the sequence batcher's tensors for [`seq_io`]:
/// controls START/READY (`int32_false_true`), state INPUT_STATE ->
/// OUTPUT_STATE, one config input INPUT and output OUTPUT.
fn seq_config(extra: &str) -> ModelConfig {
    crate::config::parse_model_config(&format!(
        r#"
name: "acc"
max_batch_size: 8
input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
sequence_batching {{
  control_input [
    {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
    {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY int32_false_true: [ 0, 1 ] }} ] }}
  ]
  state [ {{ input_name: "INPUT_STATE" output_name: "OUTPUT_STATE" data_type: TYPE_INT32 dims: [ 1 ] }} ]
  {extra}
}}
"#
    ))
    .unwrap()
}

fn seq_io() -> ModelIo {
    let i32io = |n: &str| io(n, DataType::Int32, &[-1, 1]);
    ModelIo {
        inputs: ["INPUT", "START", "READY", "INPUT_STATE"]
            .map(i32io)
            .to_vec(),
        outputs: ["OUTPUT", "OUTPUT_STATE"].map(i32io).to_vec(),
    }
}

#[test]
fn auto_complete_leaves_out_sequence_tensors() {
    let mut config = seq_config("");
    config.input.clear();
    config.output.clear();
    complete(&mut config, &seq_io()).unwrap();
    let names = |v: Vec<&str>| v.join(",");
    assert_eq!(
        names(config.input.iter().map(|i| i.name.as_str()).collect()),
        "INPUT"
    );
    assert_eq!(
        names(config.output.iter().map(|o| o.name.as_str()).collect()),
        "OUTPUT"
    );
    assert!(
        matches!(
            config.scheduling_choice,
            Some(SchedulingChoice::SequenceBatching(_))
        ),
        "the sequence batcher is kept"
    );
    check(&config, &seq_io()).unwrap();

    // Without max_batch_size either: the default batch size, no dynamic batcher.
    let mut config = seq_config("");
    config.max_batch_size = 0;
    config.input.clear();
    config.output.clear();
    complete(&mut config, &seq_io()).unwrap();
    assert_eq!(config.max_batch_size, DEFAULT_MAX_BATCH_SIZE);
    assert!(matches!(
        config.scheduling_choice,
        Some(SchedulingChoice::SequenceBatching(_))
    ));
    assert_eq!(config.input.len(), 1);
}

#[test]
fn check_accepts_sequence_inputs_and_requires_them_in_the_graph() {
    check(&seq_config(""), &seq_io()).expect("controls and state need no config input");

    // A state output the user lists in `output` for clients is fine too.
    let mut listed = seq_config("");
    listed.output.push(ModelOutput {
        name: "OUTPUT_STATE".into(),
        data_type: DataType::Int32.to_config() as i32,
        dims: vec![1],
        ..Default::default()
    });
    check(&listed, &seq_io()).unwrap();

    let without = |name: &str| {
        let mut m = seq_io();
        m.inputs.retain(|io| io.name != name);
        m.outputs.retain(|io| io.name != name);
        check(&seq_config(""), &m).unwrap_err().to_string()
    };
    let err = without("START");
    assert_eq!(
        err,
        "model 'acc': sequence_batching sequence control input 'START' is not an input of the \
         ONNX model (its inputs: INPUT, READY, INPUT_STATE)"
    );
    let err = without("INPUT_STATE");
    assert!(
        err.contains("implicit state input 'INPUT_STATE' is not an input"),
        "{err}"
    );
    let err = without("OUTPUT_STATE");
    assert!(
        err.contains("implicit state output 'OUTPUT_STATE' is not an output")
            && err.contains("(its outputs: OUTPUT)"),
        "{err}"
    );
    let err = without("INPUT");
    assert!(err.contains("input 'INPUT' is not an input"), "{err}");

    // A graph input that is neither configured nor fed by the batcher.
    let mut extra = seq_io();
    extra.inputs.push(io("OTHER", DataType::Int32, &[-1, 1]));
    let err = check(&seq_config(""), &extra).unwrap_err().to_string();
    assert!(err.contains("input 'OTHER' is missing"), "{err}");
}

#[test]
fn check_compares_sequence_datatypes_and_dims() {
    let mut fp32 = seq_config("");
    if let Some(SchedulingChoice::SequenceBatching(s)) = &mut fp32.scheduling_choice {
        let c = &mut s.control_input[0].control[0];
        c.int32_false_true.clear();
        c.fp32_false_true = vec![0.0, 1.0];
    }
    let err = check(&fp32, &seq_io()).unwrap_err().to_string();
    assert_eq!(
        err,
        "model 'acc': sequence_batching sequence control input 'START' is TYPE_FP32 \
         (fp32_false_true), but the ONNX model's input is TYPE_INT32"
    );

    let mut model = seq_io();
    model.outputs[1].dtype = DataType::Int64;
    let err = check(&seq_config(""), &model).unwrap_err().to_string();
    assert!(
        err.contains("implicit state output 'OUTPUT_STATE' is TYPE_INT32 (state data_type)")
            && err.contains("TYPE_INT64"),
        "{err}"
    );

    let mut model = seq_io();
    model.inputs[3].dims = vec![-1, 4];
    let err = check(&seq_config(""), &model).unwrap_err().to_string();
    assert!(
        err.contains("implicit state input 'INPUT_STATE' has dims [1]")
            && err.contains("[4] (without the batch dimension)"),
        "{err}"
    );

    // Controls are [b, 1]: a graph declaring them [batch] cannot take them.
    let mut model = seq_io();
    model.inputs[2].dims = vec![-1];
    let err = check(&seq_config(""), &model).unwrap_err().to_string();
    assert!(err.contains("control input 'READY' has dims [1]"), "{err}");

    // A CORRID control is checked against its data_type.
    let corrid = seq_config(
        r#"control_input [ { name: "CORRID" control [ { kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_UINT64 } ] } ]"#,
    );
    let mut model = seq_io();
    model.inputs.push(io("CORRID", DataType::Uint64, &[-1, 1]));
    check(&corrid, &model).unwrap();
    model.inputs[4].dtype = DataType::Int64;
    let err = check(&corrid, &model).unwrap_err().to_string();
    assert!(
        err.contains("'CORRID' is TYPE_UINT64 (CORRID data_type)"),
        "{err}"
    );

    // Controls are the sequence batcher's parse: a malformed one is refused
    // with its Triton text, and one tensor carrying two flag kinds is one
    // graph input.
    let no_pair = seq_config(
        r#"control_input [ { name: "END" control [ { kind: CONTROL_SEQUENCE_END } ] } ]"#,
    );
    let err = check(&no_pair, &seq_io()).unwrap_err().to_string();
    assert_eq!(
        err,
        "sequence batching must specify either 'int32_false_true', 'fp32_false_true' or \
         'bool_false_true' for CONTROL_SEQUENCE_END for acc"
    );
    let shared = crate::config::parse_model_config(
        r#"name: "acc" max_batch_size: 8
           sequence_batching { control_input [ { name: "SE" control [
             { kind: CONTROL_SEQUENCE_START fp32_false_true: [ 0, 1 ] },
             { kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] } ] } ] }"#,
    )
    .unwrap();
    let tensors = super::sequence::SequenceTensors::from_config(&shared).unwrap();
    assert_eq!(tensors.tensors.len(), 1);
    let se = tensors.feeds("SE").unwrap();
    assert_eq!(
        (se.dtype, se.dtype_source),
        (Some(DataType::Fp32), "fp32_false_true")
    );
}

// ---- the generated accumulators (models/sequence_accumulator_onnx*), through ORT ----

fn seq_model(name: &str) -> (ModelConfig, ModelFiles) {
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR"))
        .join("models")
        .join(name);
    let text = std::fs::read_to_string(root.join("config.pbtxt")).unwrap();
    let config = crate::config::parse_model_config(&text).unwrap();
    let files = ModelFiles {
        model_dir: root.clone(),
        version_dir: root.join("1"),
        version: 1,
    };
    (config, files)
}

/// An instance from the committed configuration as is (the strict path),
/// after checking that auto-complete would leave it unchanged.
fn seq_instance(name: &str) -> Box<dyn ModelInstance> {
    let (config, files) = seq_model(name);
    let mut completed = config.clone();
    OnnxRuntimeBackend
        .auto_complete(&mut completed, &files)
        .unwrap();
    assert_eq!(
        completed, config,
        "{name}: auto-complete changed the config"
    );
    // And from a configuration without I/O, auto-complete lists only the
    // client-visible tensors.
    let mut bare = config.clone();
    bare.input.clear();
    bare.output.clear();
    OnnxRuntimeBackend.auto_complete(&mut bare, &files).unwrap();
    assert_eq!(
        bare.input
            .iter()
            .map(|i| i.name.as_str())
            .collect::<Vec<_>>(),
        ["INPUT"]
    );
    assert_eq!(
        bare.output
            .iter()
            .map(|o| o.name.as_str())
            .collect::<Vec<_>>(),
        ["OUTPUT"]
    );
    let spec = InstanceSpec {
        name: format!("{name}_0"),
        index: 0,
        intra_op_threads: 1,
        device: crate::backend::InstanceDevice::Cpu,
    };
    OnnxRuntimeBackend
        .create_instance(&config, &files, &spec)
        .unwrap()
}

fn i32_tensor(name: &str, shape: Vec<i64>, values: &[i32]) -> Tensor {
    let data: Vec<u8> = values.iter().flat_map(|v| v.to_le_bytes()).collect();
    Tensor::new(name, DataType::Int32, shape, Bytes::from(data))
}

/// A `[b, 1]` INT32 tensor.
fn column(name: &str, values: &[i32]) -> Tensor {
    i32_tensor(name, vec![values.len() as i64, 1], values)
}

fn i32_values(t: &Tensor) -> Vec<i32> {
    assert_eq!(t.datatype, DataType::Int32, "{}", t.name);
    t.data
        .chunks_exact(4)
        .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
        .collect()
}

/// Executes asking for OUTPUT and OUTPUT_STATE as the batcher does; returns
/// (OUTPUT, the next state).
fn step(instance: &mut Box<dyn ModelInstance>, inputs: &[Tensor]) -> (Vec<i32>, Tensor) {
    let outputs = instance
        .execute(inputs, &["OUTPUT", "OUTPUT_STATE"])
        .unwrap();
    assert_eq!(outputs.len(), 2);
    let output = by_name(&outputs, "OUTPUT");
    let mut state = by_name(&outputs, "OUTPUT_STATE").clone();
    assert_eq!(output.shape, state.shape);
    state.name = "INPUT_STATE".into();
    (i32_values(output), state)
}

#[test]
fn accumulator_without_initial_state_follows_start_and_ready() {
    let mut instance = seq_instance("sequence_accumulator_onnx");
    // Direct strategy, three slots: slot 0 starts a sequence, slot 1
    // continues one whose state is 10, slot 2 is empty (READY 0, zero input)
    // and must keep its state.
    let (out, state) = step(
        &mut instance,
        &[
            column("INPUT", &[5, 7, 0]),
            column("START", &[1, 0, 0]),
            column("READY", &[1, 1, 0]),
            column("INPUT_STATE", &[-999, 10, 42]),
        ],
    );
    assert_eq!(out, [5, 17, 42]);
    assert_eq!(state.shape, [3, 1]);
    assert_eq!(i32_values(&state), [5, 17, 42]);

    // The output state fed back: 5 + 1 + 2 + 3 over one sequence, batch 1.
    let mut state = column("INPUT_STATE", &[0]);
    let mut seen = Vec::new();
    for (i, x) in [5, 1, 2, 3].into_iter().enumerate() {
        let (out, next) = step(
            &mut instance,
            &[
                column("INPUT", &[x]),
                column("START", &[i32::from(i == 0)]),
                column("READY", &[1]),
                state,
            ],
        );
        seen.push(out[0]);
        state = next;
    }
    assert_eq!(seen, [5, 6, 8, 11]);

    // Only what is asked for comes back; the inputs may come in any order.
    let outputs = instance
        .execute(
            &[
                column("INPUT_STATE", &[1]),
                column("READY", &[1]),
                column("START", &[0]),
                column("INPUT", &[2]),
            ],
            &["OUTPUT_STATE"],
        )
        .unwrap();
    assert_eq!(outputs.len(), 1);
    assert_eq!(i32_values(&outputs[0]), [3]);
}

#[test]
fn accumulator_from_zero_initial_state_with_variable_state_dims() {
    let mut instance = seq_instance("sequence_accumulator_onnx_init");
    // Oldest strategy: every row ready; the batcher gives a start the zero
    // initial state of dims [1], later requests the previous output state.
    let mut state = column("INPUT_STATE", &[0, 0]);
    let mut seen = Vec::new();
    for x in [[1, 10], [2, 20], [3, 30]] {
        let (out, next) = step(&mut instance, &[column("INPUT", &x), state]);
        seen.push(out);
        state = next;
    }
    assert_eq!(seen, [[1, 10], [3, 30], [6, 60]]);
    // A wider state (variable dims) broadcasts against INPUT.
    let (out, next) = step(
        &mut instance,
        &[
            column("INPUT", &[1]),
            i32_tensor("INPUT_STATE", vec![1, 3], &[1, 2, 3]),
        ],
    );
    assert_eq!(out, [2, 3, 4]);
    assert_eq!(next.shape, [1, 3]);
}

#[test]
fn accumulator_from_initial_state_file() {
    let (config, files) = seq_model("sequence_accumulator_onnx_file");
    let Some(SchedulingChoice::SequenceBatching(seq)) = &config.scheduling_choice else {
        panic!("no sequence_batching");
    };
    let Some(initial_state::StateData::DataFile(file)) = &seq.state[0].initial_state[0].state_data
    else {
        panic!("no data_file");
    };
    // Triton reads data_file from <model>/initial_state/.
    let data = std::fs::read(files.model_dir.join("initial_state").join(file)).unwrap();
    assert_eq!(data, 100i32.to_le_bytes());
    let initial = Tensor::new(
        "INPUT_STATE",
        DataType::Int32,
        vec![1, 1],
        Bytes::from(data),
    );

    let mut instance = seq_instance("sequence_accumulator_onnx_file");
    let (out, state) = step(&mut instance, &[column("INPUT", &[7]), initial]);
    assert_eq!(out, [107]);
    let (out, _) = step(&mut instance, &[column("INPUT", &[3]), state]);
    assert_eq!(out, [110]);
}

#[test]
fn missing_sequence_inputs_are_clear_errors() {
    let mut instance = seq_instance("sequence_accumulator_onnx");
    let err = instance
        .execute(
            &[
                column("INPUT", &[1]),
                column("START", &[1]),
                column("READY", &[1]),
            ],
            &["OUTPUT", "OUTPUT_STATE"],
        )
        .unwrap_err();
    assert_eq!(err.kind, crate::types::ErrorKind::Internal, "{err}");
    assert_eq!(
        err.message,
        "model 'sequence_accumulator_onnx': implicit state input 'INPUT_STATE' was not given; \
         the sequence batcher must supply it"
    );
    let err = instance
        .execute(
            &[
                column("INPUT", &[1]),
                column("READY", &[1]),
                column("INPUT_STATE", &[1]),
            ],
            &[],
        )
        .unwrap_err();
    assert!(
        err.message
            .contains("sequence control input 'START' was not given"),
        "{err}"
    );

    // A state of the wrong datatype is ORT's to refuse, still not a panic.
    let mut init = seq_instance("sequence_accumulator_onnx_init");
    let wrong = Tensor::new(
        "INPUT_STATE",
        DataType::Int64,
        vec![1, 1],
        Bytes::from(0i64.to_le_bytes().to_vec()),
    );
    let err = init
        .execute(&[column("INPUT", &[1]), wrong], &[])
        .unwrap_err();
    assert!(
        err.message
            .contains("model 'sequence_accumulator_onnx_init': ONNX Runtime failed"),
        "{err}"
    );
}

#[test]
fn sequence_model_whose_graph_lacks_the_state_fails_to_load() {
    // simple_onnx's graph under a sequence_batching that names a state it
    // does not have: a load error naming the model and the tensor.
    let root = PathBuf::from(env!("CARGO_MANIFEST_DIR")).join("models/simple_onnx");
    let files = ModelFiles {
        model_dir: root.clone(),
        version_dir: root.join("1"),
        version: 1,
    };
    let text = std::fs::read_to_string(root.join("config.pbtxt")).unwrap()
        + r#"sequence_batching { state [ { input_name: "STATE_IN" output_name: "STATE_OUT" data_type: TYPE_INT32 dims: [ 1 ] } ] }"#;
    let config = crate::config::parse_model_config(&text).unwrap();
    let spec = InstanceSpec {
        name: "simple_onnx_0".into(),
        index: 0,
        intra_op_threads: 1,
        device: crate::backend::InstanceDevice::Cpu,
    };
    let err = format!(
        "{:#}",
        OnnxRuntimeBackend
            .create_instance(&config, &files, &spec)
            .err()
            .expect("must not load")
    );
    assert!(
        err.contains(
            "model 'simple_onnx': sequence_batching implicit state input 'STATE_IN' is not an \
             input of the ONNX model (its inputs: INPUT0, INPUT1)"
        ),
        "{err}"
    );
}
