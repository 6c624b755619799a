//! Model description and request inputs: shapes resolved from the server's
//! metadata plus `--shape`/`-b`, data generated (random, zero) or read from a
//! perf_analyzer input-data JSON file, encoded once per protocol.

use std::path::Path;

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use serde_json::{json, Value};

use super::stats::SplitMix64;

#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
}

/// What the bench needs to know of a model (metadata + max_batch_size).
#[derive(Debug, Clone, PartialEq)]
pub struct ModelInfo {
    pub name: String,
    pub version: String,
    pub max_batch_size: i64,
    pub inputs: Vec<TensorInfo>,
    pub outputs: Vec<TensorInfo>,
    /// The config has `sequence_batching`: requests go out in sequences.
    pub sequence: Option<SequenceControl>,
}

/// What the bench needs of a model's sequence batcher.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Default)]
pub struct SequenceControl {
    /// The CONTROL_SEQUENCE_CORRID control input is TYPE_STRING: the server
    /// expects string correlation ids.
    pub string_ids: bool,
}

impl SequenceControl {
    /// From Triton's config JSON (`sequence_batching` is present only when
    /// the model uses the sequence batcher).
    pub fn from_config_json(config: &Value) -> Option<Self> {
        let sb = config.get("sequence_batching").filter(|v| v.is_object())?;
        let string_ids = sb
            .get("control_input")
            .and_then(Value::as_array)
            .into_iter()
            .flatten()
            .filter_map(|ci| ci.get("control").and_then(Value::as_array))
            .flatten()
            .any(|c| {
                c.get("kind").and_then(Value::as_str) == Some("CONTROL_SEQUENCE_CORRID")
                    && c.get("data_type").and_then(Value::as_str) == Some("TYPE_STRING")
            });
        Some(Self { string_ids })
    }

    /// From the gRPC ModelConfig.
    pub fn from_config(config: &crate::proto::inference::ModelConfig) -> Option<Self> {
        use crate::proto::inference::{
            model_config::SchedulingChoice, model_sequence_batching::control::Kind, DataType,
        };
        let Some(SchedulingChoice::SequenceBatching(sb)) = &config.scheduling_choice else {
            return None;
        };
        let string_ids = sb.control_input.iter().flat_map(|ci| &ci.control).any(|c| {
            c.kind == Kind::ControlSequenceCorrid as i32
                && c.data_type == DataType::TypeString as i32
        });
        Some(Self { string_ids })
    }
}

impl ModelInfo {
    /// From the KServe v2 metadata JSON and Triton's config JSON (optional).
    pub fn from_json(meta: &Value, config: Option<&Value>, version: &str) -> anyhow::Result<Self> {
        let tensors = |key: &str| -> anyhow::Result<Vec<TensorInfo>> {
            meta.get(key)
                .and_then(Value::as_array)
                .map(Vec::as_slice)
                .unwrap_or_default()
                .iter()
                .map(|t| {
                    Ok(TensorInfo {
                        name: t["name"]
                            .as_str()
                            .ok_or_else(|| anyhow!("{key}: tensor without name"))?
                            .to_string(),
                        datatype: t["datatype"].as_str().unwrap_or_default().to_string(),
                        shape: t["shape"]
                            .as_array()
                            .ok_or_else(|| anyhow!("{key}: tensor without shape"))?
                            .iter()
                            .map(|d| {
                                d.as_i64()
                                    .ok_or_else(|| anyhow!("{key}: bad dimension {d}"))
                            })
                            .collect::<anyhow::Result<_>>()?,
                    })
                })
                .collect()
        };
        Ok(Self {
            name: meta["name"].as_str().unwrap_or_default().to_string(),
            version: version.to_string(),
            max_batch_size: config
                .and_then(|c| c["max_batch_size"].as_i64())
                .unwrap_or(0),
            inputs: tensors("inputs")?,
            outputs: tensors("outputs")?,
            sequence: config.and_then(SequenceControl::from_config_json),
        })
    }
}

/// One input, ready to encode: final shape (batch included), raw bytes in
/// Triton's layout (little-endian; BYTES as 4-byte length + bytes) and the
/// JSON `data` array.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorData {
    pub name: String,
    pub datatype: String,
    pub shape: Vec<i64>,
    pub raw: Vec<u8>,
    pub json: Vec<Value>,
}

#[derive(Debug, Clone)]
pub struct InputOptions<'a> {
    pub batch_size: u32,
    pub shapes: &'a [(String, Vec<i64>)],
    pub source: &'a str,
    pub string_length: usize,
    pub string_data: Option<&'a str>,
    pub seed: u64,
}

/// Bytes of one element; `None` for BYTES (variable) and unknown types.
pub fn element_size(datatype: &str) -> Option<usize> {
    Some(match datatype {
        "BOOL" | "UINT8" | "INT8" => 1,
        "UINT16" | "INT16" | "FP16" | "BF16" => 2,
        "UINT32" | "INT32" | "FP32" => 4,
        "UINT64" | "INT64" | "FP64" => 8,
        _ => return None,
    })
}

/// Appends one element given as JSON to `raw`.
fn push_element(datatype: &str, v: &Value, raw: &mut Vec<u8>) -> anyhow::Result<()> {
    let int = || {
        v.as_i64()
            .or_else(|| v.as_bool().map(i64::from))
            .ok_or_else(|| anyhow!("{v} is not an integer"))
    };
    let float = || v.as_f64().ok_or_else(|| anyhow!("{v} is not a number"));
    match datatype {
        "BOOL" => raw.push(u8::from(
            v.as_bool().map_or_else(|| int().map(|i| i != 0), Ok)?,
        )),
        "UINT8" | "INT8" => raw.push(int()? as u8),
        "UINT16" | "INT16" => raw.extend_from_slice(&(int()? as u16).to_le_bytes()),
        "UINT32" | "INT32" => raw.extend_from_slice(&(int()? as u32).to_le_bytes()),
        "UINT64" => raw.extend_from_slice(
            &v.as_u64()
                .map_or_else(|| int().map(|i| i as u64), Ok)?
                .to_le_bytes(),
        ),
        "INT64" => raw.extend_from_slice(&int()?.to_le_bytes()),
        "FP16" => raw.extend_from_slice(&half::f16::from_f64(float()?).to_le_bytes()),
        "BF16" => raw.extend_from_slice(&half::bf16::from_f64(float()?).to_le_bytes()),
        "FP32" => raw.extend_from_slice(&(float()? as f32).to_le_bytes()),
        "FP64" => raw.extend_from_slice(&float()?.to_le_bytes()),
        "BYTES" => {
            let s = match v {
                Value::String(s) => s.clone(),
                other => other.to_string(),
            };
            let len = u32::try_from(s.len()).context("BYTES element over 4 GiB")?;
            raw.extend_from_slice(&len.to_le_bytes());
            raw.extend_from_slice(s.as_bytes());
        }
        other => bail!("datatype {other} is not supported"),
    }
    Ok(())
}

fn generated_element(
    datatype: &str,
    zero: bool,
    rng: &mut SplitMix64,
    opts: &InputOptions,
) -> Value {
    // Small non-negative values: models that add or multiply stay in range.
    let r = if zero { 0 } else { rng.next_u64() % 100 };
    match datatype {
        "BOOL" => json!(r % 2 == 1),
        "FP16" | "BF16" | "FP32" | "FP64" => json!(if zero { 0.0 } else { rng.next_f64() }),
        "BYTES" => {
            let s = match opts.string_data {
                Some(s) => s.to_string(),
                None if zero => String::new(),
                None => (0..opts.string_length)
                    .map(|_| char::from(b'a' + (rng.next_u64() % 26) as u8))
                    .collect(),
            };
            json!(s)
        }
        _ => json!(r),
    }
}

fn flatten(v: &Value, out: &mut Vec<Value>) {
    match v {
        Value::Array(items) => items.iter().for_each(|i| flatten(i, out)),
        other => out.push(other.clone()),
    }
}

fn element_count(shape: &[i64]) -> usize {
    shape.iter().map(|&d| d.max(0) as usize).product()
}

/// Input sets to cycle through: one for generated data, one per entry of
/// an input-data file.
pub fn build_inputs(
    model: &ModelInfo,
    opts: &InputOptions,
) -> anyhow::Result<Vec<Vec<TensorData>>> {
    if model.max_batch_size == 0 && opts.batch_size > 1 {
        bail!(
            "model '{}' does not support batching (max_batch_size 0); -b must be 1",
            model.name
        );
    }
    if model.inputs.is_empty() {
        // Requests are built from the metadata's inputs: with none there is
        // nothing to send, and a server would reject every empty request.
        bail!(
            "model '{}' lists no inputs in its metadata, so the bench has nothing to send: \
             check the model's configuration on the server (its metadata must name every input), \
             or measure the server without a model with --endpoint live",
            model.name
        );
    }
    let batched = model.max_batch_size > 0;
    for (name, _) in opts.shapes {
        if !model.inputs.iter().any(|i| &i.name == name) {
            bail!("--shape: model '{}' has no input '{name}'", model.name);
        }
    }
    let file_entries: Option<Vec<Value>> = match opts.source {
        "random" | "zero" => None,
        path => Some(read_data_file(Path::new(path))?),
    };
    let mut rng = SplitMix64::new(opts.seed);
    let entries = file_entries.as_ref().map_or(1, Vec::len);
    let mut sets = Vec::with_capacity(entries);
    for e in 0..entries {
        let mut set = Vec::with_capacity(model.inputs.len());
        for input in &model.inputs {
            let from_file = file_entries.as_ref().map(|f| {
                f[e].get(&input.name).ok_or_else(|| {
                    anyhow!(
                        "input-data entry {e} has no data for input '{}'",
                        input.name
                    )
                })
            });
            let from_file = from_file.transpose()?;
            let (content, file_shape) = match from_file {
                Some(Value::Object(o)) if o.contains_key("content") => {
                    let shape = o
                        .get("shape")
                        .and_then(Value::as_array)
                        .map(|s| s.iter().filter_map(Value::as_i64).collect::<Vec<_>>());
                    (o.get("content"), shape)
                }
                Some(v) => (Some(v), None),
                None => (None, None),
            };
            let mut dims: Vec<i64> = input
                .shape
                .iter()
                .skip(usize::from(batched))
                .copied()
                .collect();
            if let Some((_, s)) = opts.shapes.iter().find(|(n, _)| n == &input.name) {
                dims = s.clone();
            } else if let Some(s) = file_shape {
                dims = s;
            }
            let mut values = Vec::new();
            if let Some(c) = content {
                flatten(c, &mut values);
                if dims.iter().any(|&d| d < 0) {
                    // A variable 1-D input takes its length from the data.
                    if dims.len() == 1 {
                        dims = vec![values.len() as i64];
                    }
                }
            }
            if dims.iter().any(|&d| d < 0) {
                bail!(
                    "input '{}' has a variable dimension ({:?}); give its shape with --shape {}:d1,d2",
                    input.name,
                    input.shape,
                    input.name
                );
            }
            let per_item = element_count(&dims);
            if content.is_none() {
                let zero = opts.source == "zero";
                values = (0..per_item)
                    .map(|_| generated_element(&input.datatype, zero, &mut rng, opts))
                    .collect();
            } else if values.len() != per_item {
                bail!(
                    "input-data for '{}' has {} elements, shape {:?} needs {per_item}",
                    input.name,
                    values.len(),
                    dims
                );
            }
            let mut shape = dims;
            let copies = if batched {
                shape.insert(0, i64::from(opts.batch_size));
                opts.batch_size as usize
            } else {
                1
            };
            let mut raw =
                Vec::with_capacity(per_item * copies * element_size(&input.datatype).unwrap_or(8));
            for v in &values {
                push_element(&input.datatype, v, &mut raw)
                    .with_context(|| format!("input '{}'", input.name))?;
            }
            let one = raw.clone();
            let mut json = values.clone();
            for _ in 1..copies {
                raw.extend_from_slice(&one);
                json.extend_from_slice(&values);
            }
            set.push(TensorData {
                name: input.name.clone(),
                datatype: input.datatype.clone(),
                shape,
                raw,
                json,
            });
        }
        sets.push(set);
    }
    Ok(sets)
}

/// `{"data": [ {INPUT: [...] | {"content": [...], "shape": [...]}}, ... ]}`.
fn read_data_file(path: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(path)
        .with_context(|| format!("--input-data: cannot read '{}'", path.display()))?;
    let v: Value = serde_json::from_str(&text)
        .with_context(|| format!("--input-data: '{}' is not JSON", path.display()))?;
    let data = v
        .get("data")
        .and_then(Value::as_array)
        .ok_or_else(|| anyhow!("--input-data: '{}' has no \"data\" array", path.display()))?;
    if data.is_empty() {
        bail!(
            "--input-data: '{}' has an empty \"data\" array",
            path.display()
        );
    }
    data.iter()
        .map(|entry| match entry {
            Value::Object(_) => Ok(entry.clone()),
            // perf_analyzer allows [[{...}]] for sequences: take the steps in order.
            Value::Array(_) => {
                bail!("--input-data: sequence data (nested arrays of steps) is not supported")
            }
            _ => bail!("--input-data: each \"data\" entry must be an object"),
        })
        .collect()
}

/// The parts of a request that vary by wire format.
pub struct Encoded {
    pub body: Bytes,
    /// HTTP binary extension: the JSON header's length.
    pub header_len: Option<usize>,
}

fn outputs_json(model: &ModelInfo, binary: bool) -> Vec<Value> {
    model
        .outputs
        .iter()
        .map(|o| json!({"name": o.name, "parameters": {"binary_data": binary}}))
        .collect()
}

/// HTTP/REST body: plain JSON, or the binary-tensor extension.
pub fn encode_http(
    model: &ModelInfo,
    set: &[TensorData],
    binary_in: bool,
    binary_out: bool,
) -> anyhow::Result<Encoded> {
    let inputs: Vec<Value> = set
        .iter()
        .map(|t| {
            if binary_in {
                json!({"name": t.name, "datatype": t.datatype, "shape": t.shape,
                       "parameters": {"binary_data_size": t.raw.len()}})
            } else {
                json!({"name": t.name, "datatype": t.datatype, "shape": t.shape, "data": t.json})
            }
        })
        .collect();
    let mut header = json!({ "inputs": inputs });
    if binary_out {
        header["outputs"] = Value::Array(outputs_json(model, true));
    }
    let mut body = serde_json::to_vec(&header).context("encoding the request JSON")?;
    if !binary_in {
        return Ok(Encoded {
            body: body.into(),
            header_len: None,
        });
    }
    let header_len = body.len();
    for t in set {
        body.extend_from_slice(&t.raw);
    }
    Ok(Encoded {
        body: body.into(),
        header_len: Some(header_len),
    })
}

/// gRPC `ModelInferRequest`, 5-byte framed. On a stream (`streaming`)
/// the request asks for Triton's empty final response, so that the end of
/// a decoupled model's many responses is known.
pub fn encode_grpc(model: &ModelInfo, set: &[TensorData], streaming: bool) -> Bytes {
    grpc_frame(&grpc_request(model, set, streaming, None))
}

/// Shared memory regions a request names instead of carrying tensors.
#[derive(Debug, Clone, PartialEq)]
pub struct ShmRefs {
    /// Region name and bytes of each input of the set, in the set's order.
    pub inputs: Vec<(String, u64)>,
    /// Region name and bytes of each of the model's outputs, in order.
    pub outputs: Vec<(String, u64)>,
}

/// HTTP/REST body whose tensors are all in shared memory: plain JSON (no
/// binary part; the server's response carries no tensor data either).
pub fn encode_http_shm(
    model: &ModelInfo,
    set: &[TensorData],
    refs: &ShmRefs,
) -> anyhow::Result<Bytes> {
    let shm = |(name, size): &(String, u64)| json!({"shared_memory_region": name, "shared_memory_byte_size": size});
    let inputs: Vec<Value> = set
        .iter()
        .zip(&refs.inputs)
        .map(|(t, r)| json!({"name": t.name, "datatype": t.datatype, "shape": t.shape, "parameters": shm(r)}))
        .collect();
    let outputs: Vec<Value> = model
        .outputs
        .iter()
        .zip(&refs.outputs)
        .map(|(o, r)| json!({"name": o.name, "parameters": shm(r)}))
        .collect();
    let body = serde_json::to_vec(&json!({"inputs": inputs, "outputs": outputs}))
        .context("encoding the request JSON")?;
    Ok(body.into())
}

/// gRPC `ModelInferRequest` whose tensors are all in shared memory.
pub fn encode_grpc_shm(
    model: &ModelInfo,
    set: &[TensorData],
    streaming: bool,
    refs: &ShmRefs,
) -> Bytes {
    grpc_frame(&grpc_request(model, set, streaming, Some(refs)))
}

fn grpc_request(
    model: &ModelInfo,
    set: &[TensorData],
    streaming: bool,
    shm: Option<&ShmRefs>,
) -> crate::proto::inference::ModelInferRequest {
    use crate::proto::inference::{
        infer_parameter::ParameterChoice,
        model_infer_request::{InferInputTensor, InferRequestedOutputTensor},
        InferParameter,
    };
    use std::collections::HashMap;
    let shm_params = |r: Option<&(String, u64)>| -> HashMap<String, InferParameter> {
        let Some((name, size)) = r else {
            return HashMap::new();
        };
        let param = |p| InferParameter {
            parameter_choice: Some(p),
        };
        [
            (
                "shared_memory_region".to_string(),
                param(ParameterChoice::StringParam(name.clone())),
            ),
            (
                "shared_memory_byte_size".to_string(),
                // Region sizes come from in-memory buffers: far below 2^63.
                param(ParameterChoice::Int64Param(*size as i64)),
            ),
        ]
        .into()
    };
    crate::proto::inference::ModelInferRequest {
        model_name: model.name.clone(),
        model_version: model.version.clone(),
        inputs: set
            .iter()
            .enumerate()
            .map(|(i, t)| InferInputTensor {
                name: t.name.clone(),
                datatype: t.datatype.clone(),
                shape: t.shape.clone(),
                parameters: shm_params(shm.and_then(|s| s.inputs.get(i))),
                ..Default::default()
            })
            .collect(),
        outputs: model
            .outputs
            .iter()
            .enumerate()
            .map(|(i, o)| InferRequestedOutputTensor {
                name: o.name.clone(),
                parameters: shm_params(shm.and_then(|s| s.outputs.get(i))),
            })
            .collect(),
        raw_input_contents: if shm.is_some() {
            Vec::new()
        } else {
            set.iter().map(|t| Bytes::from(t.raw.clone())).collect()
        },
        parameters: if streaming {
            [(
                "triton_enable_empty_final_response".to_string(),
                InferParameter {
                    parameter_choice: Some(ParameterChoice::BoolParam(true)),
                },
            )]
            .into()
        } else {
            Default::default()
        },
        ..Default::default()
    }
}

/// gRPC length-prefixed message: uncompressed flag + 4-byte BE length.
pub fn grpc_frame<M: prost::Message>(m: &M) -> Bytes {
    let len = m.encoded_len();
    let mut buf = Vec::with_capacity(len + 5);
    buf.push(0);
    buf.extend_from_slice(&(len as u32).to_be_bytes());
    // Encoding into a Vec cannot run out of space.
    let _ = m.encode(&mut buf);
    buf.into()
}

#[cfg(test)]
mod tests {
    use super::*;

    fn simple() -> ModelInfo {
        let meta = json!({"name": "simple", "versions": ["1"], "platform": "x",
            "inputs": [{"name": "INPUT0", "datatype": "INT32", "shape": [-1, 16]},
                       {"name": "INPUT1", "datatype": "INT32", "shape": [-1, 16]}],
            "outputs": [{"name": "OUTPUT0", "datatype": "INT32", "shape": [-1, 16]}]});
        ModelInfo::from_json(&meta, Some(&json!({"max_batch_size": 8})), "").unwrap()
    }

    fn opts<'a>(source: &'a str, shapes: &'a [(String, Vec<i64>)], b: u32) -> InputOptions<'a> {
        InputOptions {
            batch_size: b,
            shapes,
            source,
            string_length: 4,
            string_data: None,
            seed: 1,
        }
    }

    #[test]
    fn shared_memory_requests_name_regions_and_carry_no_tensor() {
        let m = simple();
        let sets = build_inputs(&m, &opts("zero", &[], 2)).unwrap();
        let refs = ShmRefs {
            inputs: vec![("in0".into(), 128), ("in1".into(), 128)],
            outputs: vec![("out0".into(), 128)],
        };
        let body = encode_http_shm(&m, &sets[0], &refs).unwrap();
        let v: Value = serde_json::from_slice(&body).expect("plain JSON, no binary part");
        assert_eq!(v["inputs"][1]["name"], "INPUT1");
        assert_eq!(v["inputs"][1]["shape"], json!([2, 16]));
        assert_eq!(
            v["inputs"][1]["parameters"],
            json!({"shared_memory_region": "in1", "shared_memory_byte_size": 128})
        );
        assert!(v["inputs"][0].get("data").is_none());
        assert_eq!(
            v["outputs"][0]["parameters"]["shared_memory_region"],
            "out0"
        );
        let frame = encode_grpc_shm(&m, &sets[0], false, &refs);
        let req: crate::proto::inference::ModelInferRequest =
            prost::Message::decode(&frame[5..]).expect("decodes");
        assert!(req.raw_input_contents.is_empty());
        use crate::proto::inference::infer_parameter::ParameterChoice;
        let p = &req.inputs[0].parameters;
        assert_eq!(
            p["shared_memory_region"].parameter_choice,
            Some(ParameterChoice::StringParam("in0".into()))
        );
        assert_eq!(
            p["shared_memory_byte_size"].parameter_choice,
            Some(ParameterChoice::Int64Param(128))
        );
        assert_eq!(
            req.outputs[0].parameters["shared_memory_region"].parameter_choice,
            Some(ParameterChoice::StringParam("out0".into()))
        );
    }

    #[test]
    fn batched_shapes_and_zero_data() {
        let m = simple();
        let sets = build_inputs(&m, &opts("zero", &[], 3)).unwrap();
        assert_eq!(sets.len(), 1);
        assert_eq!(sets[0][0].shape, vec![3, 16]);
        assert_eq!(sets[0][0].raw, vec![0u8; 3 * 16 * 4]);
        assert_eq!(sets[0][0].json.len(), 48);
    }

    #[test]
    fn variable_dims_need_shape() {
        let meta = json!({"name": "id", "inputs": [{"name": "INPUT0", "datatype": "BYTES", "shape": [-1]}], "outputs": []});
        let m = ModelInfo::from_json(&meta, None, "").unwrap();
        let err = build_inputs(&m, &opts("random", &[], 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("--shape INPUT0"), "{err}");
        let shapes = [("INPUT0".to_string(), vec![3])];
        let sets = build_inputs(&m, &opts("random", &shapes, 1)).unwrap();
        assert_eq!(sets[0][0].shape, vec![3]);
        assert_eq!(sets[0][0].raw.len(), 3 * (4 + 4));
        assert!(
            build_inputs(&m, &opts("random", &shapes, 2)).is_err(),
            "no batching"
        );
        let unknown = [("NOPE".to_string(), vec![3])];
        assert!(build_inputs(&m, &opts("random", &unknown, 1)).is_err());
    }

    #[test]
    fn data_file_in_perf_analyzer_format() {
        let dir = std::env::temp_dir().join(format!("bench-input-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("data.json");
        let input0: Vec<i32> = (0..16).collect();
        std::fs::write(
            &path,
            json!({"data": [
            {"INPUT0": input0, "INPUT1": {"content": vec![[1; 8], [2; 8]], "shape": [16]}},
            {"INPUT0": vec![5; 16], "INPUT1": vec![6; 16]}]})
            .to_string(),
        )
        .unwrap();
        let p = path.to_string_lossy().to_string();
        let sets = build_inputs(&simple(), &opts(&p, &[], 2)).unwrap();
        assert_eq!(sets.len(), 2);
        assert_eq!(sets[0][0].shape, vec![2, 16]);
        assert_eq!(&sets[0][0].raw[4..8], &1i32.to_le_bytes());
        assert_eq!(&sets[0][1].raw[32..36], &2i32.to_le_bytes());
        assert_eq!(sets[1][1].raw.len(), 2 * 64);
        std::fs::write(
            &path,
            json!({"data": [{"INPUT0": vec![1; 16]}]}).to_string(),
        )
        .unwrap();
        let err = build_inputs(&simple(), &opts(&p, &[], 1))
            .unwrap_err()
            .to_string();
        assert!(err.contains("INPUT1"), "{err}");
        std::fs::remove_dir_all(&dir).ok();
    }

    #[test]
    fn encodings() {
        let m = simple();
        let sets = build_inputs(&m, &opts("random", &[], 1)).unwrap();
        let bin = encode_http(&m, &sets[0], true, true).unwrap();
        let n = bin.header_len.unwrap();
        let header: Value = serde_json::from_slice(&bin.body[..n]).unwrap();
        assert_eq!(header["inputs"][0]["parameters"]["binary_data_size"], 64);
        assert_eq!(header["outputs"][0]["parameters"]["binary_data"], true);
        assert_eq!(bin.body.len(), n + 128);
        let js = encode_http(&m, &sets[0], false, false).unwrap();
        assert!(js.header_len.is_none());
        let v: Value = serde_json::from_slice(&js.body).unwrap();
        assert_eq!(v["inputs"][1]["data"].as_array().unwrap().len(), 16);
        let g = encode_grpc(&m, &sets[0], false);
        assert_eq!(g[0], 0);
        let len = u32::from_be_bytes([g[1], g[2], g[3], g[4]]) as usize;
        assert_eq!(len + 5, g.len());
        let req: crate::proto::inference::ModelInferRequest =
            prost::Message::decode(&g[5..]).unwrap();
        assert_eq!(req.model_name, "simple");
        assert_eq!(req.raw_input_contents.len(), 2);
    }
}
