//! Ragged batching, batch inputs and batch outputs (`allow_ragged_batch`,
//! `batch_input`, `batch_output`) for instances that take merged tensors
//! (ONNX Runtime, built-ins). What the model sees is what Triton's backend
//! utilities (`BackendInputCollector`, `BackendOutputResponder`) give the
//! ONNX Runtime backend: a ragged input is the batch's requests
//! concatenated into one 1-D tensor, each batch input is a tensor the
//! server computes from its source input's shape in every request, and a
//! batch output is cut back into per-request tensors shaped after the
//! request's source input. C API backends get the requests one by one and
//! build all of this themselves from the configuration, as in Triton.

use bytes::{BufMut, BytesMut};

use super::batch::{batch_rows, merge_inputs, split_outputs};
use crate::{
    proto::inference::{batch_input::Kind, BatchInput, DataType as ConfigDataType, ModelConfig},
    types::{element_count, DataType, InferError, InferRequest, InferResult, Tensor},
};

/// Whether executions of this model need this module: a ragged input, a
/// batch input or a batch output.
pub fn applies(config: &ModelConfig) -> bool {
    !config.batch_input.is_empty() || !config.batch_output.is_empty() || has_ragged_inputs(config)
}

pub fn has_ragged_inputs(config: &ModelConfig) -> bool {
    config.input.iter().any(|i| i.allow_ragged_batch)
}

fn is_ragged(config: &ModelConfig, name: &str) -> bool {
    config
        .input
        .iter()
        .any(|i| i.allow_ragged_batch && i.name == name)
}

/// `batch::compatible`, except that ragged inputs may differ in shape
/// (Triton enforces equal shapes only for variable-size inputs that are
/// not ragged).
pub fn compatible(config: &ModelConfig, a: &InferRequest, b: &InferRequest) -> bool {
    a.inputs.len() == b.inputs.len()
        && a.inputs.iter().all(|ta| {
            b.input(&ta.name).is_some_and(|tb| {
                tb.datatype == ta.datatype
                    && (tb.shape.get(1..) == ta.shape.get(1..) || is_ragged(config, &ta.name))
            })
        })
}

/// The tensors one execution of `requests` gets: inputs merged along the
/// batch dimension, ragged ones flattened into one 1-D tensor (also for a
/// single request, as Triton's ONNX Runtime backend does), then every
/// batch input's targets.
pub fn merge(config: &ModelConfig, requests: &[&InferRequest]) -> InferResult<Vec<Tensor>> {
    let mut inputs = merge_inputs(requests);
    for t in &mut inputs {
        if is_ragged(config, &t.name) {
            let total = requests
                .iter()
                .map(|r| source_elements(r, &t.name))
                .try_fold(0i64, |sum, n| Ok::<_, InferError>(sum + n?))?;
            t.shape = vec![total];
        }
    }
    for b in &config.batch_input {
        let tensor = batch_input(b, requests)?;
        for target in &b.target_name {
            inputs.push(Tensor::new(
                target.clone(),
                tensor.datatype,
                tensor.shape.clone(),
                tensor.data.clone(),
            ));
        }
    }
    Ok(inputs)
}

/// A request's shape of `source` (batch dimension included, as Triton's
/// backend utilities read it).
fn source_shape<'r>(request: &'r InferRequest, source: &str) -> InferResult<&'r [i64]> {
    request
        .input(source)
        .map(|t| t.shape.as_slice())
        .ok_or_else(|| {
            InferError::invalid(format!(
                "input '{source}', the source of a batch input or output, was not given"
            ))
        })
}

fn source_elements(request: &InferRequest, source: &str) -> InferResult<i64> {
    let shape = source_shape(request, source)?;
    element_count(shape)
        .and_then(|n| i64::try_from(n).ok())
        .ok_or_else(|| InferError::invalid(format!("input '{source}' has too many elements")))
}

/// One batch input's tensor for `requests` (Triton's `BatchInputShape` and
/// `ProcessBatchInput`).
fn batch_input(b: &BatchInput, requests: &[&InferRequest]) -> InferResult<Tensor> {
    let name = b.target_name.first().cloned().unwrap_or_default();
    let source = b.source_input.first().map(String::as_str).unwrap_or("");
    let fp32 = b.data_type == ConfigDataType::TypeFp32 as i32;
    let kind = Kind::try_from(b.kind)
        .map_err(|_| InferError::internal(format!("batch input '{name}': unknown kind")))?;
    let counts = || -> InferResult<Vec<i64>> {
        requests
            .iter()
            .map(|r| source_elements(r, source))
            .collect()
    };
    let accumulated = |counts: Vec<i64>| -> Vec<i64> {
        counts
            .into_iter()
            .scan(0i64, |sum, n| {
                *sum += n;
                Some(*sum)
            })
            .collect()
    };
    let (shape, values): (Vec<i64>, Vec<i64>) = match kind {
        Kind::BatchElementCount => {
            let v = counts()?;
            (vec![v.len() as i64], v)
        }
        Kind::BatchAccumulatedElementCount => {
            let v = accumulated(counts()?);
            (vec![v.len() as i64], v)
        }
        Kind::BatchAccumulatedElementCountWithZero => {
            let mut v = vec![0];
            v.extend(accumulated(counts()?));
            (vec![v.len() as i64], v)
        }
        // Described by its shape alone; Triton leaves the data as it
        // finds it, zeros here.
        Kind::BatchMaxElementCountAsShape => {
            let max = counts()?.into_iter().max().unwrap_or(0);
            (vec![max], vec![0; usize::try_from(max).unwrap_or(0)])
        }
        Kind::BatchItemShape | Kind::BatchItemShapeFlatten => {
            // Every batch item of every request contributes its shape
            // without the batch dimension.
            let mut items = 0i64;
            let mut rank = 0usize;
            let mut v = Vec::new();
            for r in requests {
                let shape = source_shape(r, source)?;
                let (rows, item) = shape.split_first().ok_or_else(|| {
                    InferError::invalid(format!(
                        "input '{source}' needs a batch dimension for batch input '{name}'"
                    ))
                })?;
                if items > 0 && item.len() != rank {
                    return Err(InferError::invalid(format!(
                        "input '{source}' has a different rank in requests batched together \
                         for batch input '{name}'"
                    )));
                }
                rank = item.len();
                for _ in 0..*rows {
                    v.extend_from_slice(item);
                }
                items += rows;
            }
            let shape = if kind == Kind::BatchItemShape {
                vec![items, rank as i64]
            } else {
                vec![items * rank as i64]
            };
            (shape, v)
        }
    };
    let mut data = BytesMut::with_capacity(values.len() * 4);
    for v in values {
        if fp32 {
            data.put_f32_le(v as f32);
        } else {
            data.put_i32_le(i32::try_from(v).map_err(|_| {
                InferError::invalid(format!(
                    "batch input '{name}': value {v} does not fit TYPE_INT32"
                ))
            })?);
        }
    }
    let datatype = if fp32 {
        DataType::Fp32
    } else {
        DataType::Int32
    };
    Ok(Tensor::new(name, datatype, shape, data.freeze()))
}

/// Splits an execution's outputs into each request's: batch outputs are
/// scattered with the shape of their source input in each request, the
/// others split along the batch dimension (passed whole for a single
/// request, as for any execution).
pub fn split(
    config: &ModelConfig,
    outputs: Vec<Tensor>,
    requests: &[&InferRequest],
) -> InferResult<Vec<Vec<Tensor>>> {
    let (scattered, plain): (Vec<Tensor>, Vec<Tensor>) = outputs
        .into_iter()
        .partition(|t| scatter_source(config, &t.name).is_some());
    let mut per_request = if requests.len() == 1 {
        vec![plain]
    } else {
        let rows: Vec<i64> = requests.iter().map(|r| batch_rows(r)).collect();
        split_outputs(plain, &rows)?
    };
    for t in scattered {
        let Some(source) = scatter_source(config, &t.name) else {
            continue;
        };
        let size = t.datatype.element_size().ok_or_else(|| {
            InferError::internal(format!(
                "batch output '{}' is {}, which cannot be scattered by shape",
                t.name,
                t.datatype.as_str()
            ))
        })?;
        let dims = output_dims(config, &t.name);
        let mut offset = 0usize;
        for (r, outs) in requests.iter().zip(per_request.iter_mut()) {
            let input = source_shape(r, source)?;
            let shape: Vec<i64> = dims
                .iter()
                .enumerate()
                .map(|(i, &d)| {
                    if d == -1 {
                        input.get(i).copied().ok_or_else(|| {
                            InferError::internal(format!(
                                "batch output '{}' has more dimensions than its source input '{source}'",
                                t.name
                            ))
                        })
                    } else {
                        Ok(d)
                    }
                })
                .collect::<InferResult<_>>()?;
            let bytes = element_count(&shape).map_or(usize::MAX, |n| n.saturating_mul(size));
            let end = offset.saturating_add(bytes);
            if end > t.data.len() {
                return Err(InferError::internal(format!(
                    "batch output '{}' holds {} bytes, too few to scatter with the shapes of input '{source}'",
                    t.name,
                    t.data.len()
                )));
            }
            outs.push(Tensor::new(
                t.name.clone(),
                t.datatype,
                shape,
                t.data.slice(offset..end),
            ));
            offset = end;
        }
    }
    Ok(per_request)
}

/// The source input of the batch output that targets `output`, if any.
fn scatter_source<'c>(config: &'c ModelConfig, output: &str) -> Option<&'c str> {
    config
        .batch_output
        .iter()
        .find(|b| b.target_name.iter().any(|t| t == output))
        .and_then(|b| b.source_input.first())
        .map(String::as_str)
}

/// A batch output's full shape as configured (`-1` for the batch
/// dimension when batching, then its reshape or dims), whose `-1`s take
/// the source input's sizes at the same positions.
fn output_dims(config: &ModelConfig, output: &str) -> Vec<i64> {
    let mut dims = Vec::new();
    if config.max_batch_size > 0 {
        dims.push(-1);
    }
    if let Some(o) = config.output.iter().find(|o| o.name == output) {
        match &o.reshape {
            Some(r) => dims.extend_from_slice(&r.shape),
            None => dims.extend_from_slice(&o.dims),
        }
    }
    dims
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::config::parse_model_config;

    fn f32s(values: &[f32]) -> Bytes {
        values
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect::<Vec<u8>>()
            .into()
    }

    fn model(extra: &str) -> ModelConfig {
        parse_model_config(&format!(
            r#"name: "r" max_batch_size: 8
               input [ {{ name: "X" data_type: TYPE_FP32 dims: [ -1 ] allow_ragged_batch: true }} ]
               output [ {{ name: "Y" data_type: TYPE_FP32 dims: [ -1 ] }} ]
               {extra}"#
        ))
        .unwrap()
    }

    fn req(shape: Vec<i64>) -> InferRequest {
        let n = element_count(&shape).unwrap();
        let values: Vec<f32> = (0..n).map(|i| i as f32).collect();
        InferRequest {
            inputs: vec![Tensor::new("X", DataType::Fp32, shape, f32s(&values))],
            ..Default::default()
        }
    }

    fn values(t: &Tensor) -> Vec<f32> {
        match t.datatype {
            DataType::Fp32 => t
                .data
                .chunks(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            _ => t
                .data
                .chunks(4)
                .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]) as f32)
                .collect(),
        }
    }

    fn bi(kind: &str, dtype: &str) -> String {
        format!(
            "batch_input [ {{ kind: {kind} target_name: \"B\" data_type: {dtype} source_input: \"X\" }} ]"
        )
    }

    fn merged_batch_input(kind: &str, shapes: &[Vec<i64>]) -> Tensor {
        let c = model(&bi(kind, "TYPE_FP32"));
        let rs: Vec<InferRequest> = shapes.iter().cloned().map(req).collect();
        let refs: Vec<&InferRequest> = rs.iter().collect();
        merge(&c, &refs).unwrap().pop().unwrap()
    }

    #[test]
    fn ragged_requests_batch_together_and_flatten() {
        let c = model("");
        let (a, b) = (req(vec![1, 2]), req(vec![1, 4]));
        assert!(compatible(&c, &a, &b));
        assert!(!super::super::batch::compatible(&a, &b));
        let merged = merge(&c, &[&a, &b]).unwrap();
        assert_eq!(merged[0].shape, vec![6]);
        assert_eq!(values(&merged[0]), vec![0., 1., 0., 1., 2., 3.]);
        // A single request is flattened too.
        assert_eq!(merge(&c, &[&b]).unwrap()[0].shape, vec![4]);
    }

    #[test]
    fn element_count_kinds() {
        let shapes = [vec![1, 2], vec![1, 4], vec![1, 1], vec![1, 3]];
        let t = merged_batch_input("BATCH_ELEMENT_COUNT", &shapes);
        assert_eq!(
            (t.shape.clone(), values(&t)),
            (vec![4], vec![2., 4., 1., 3.])
        );
        let t = merged_batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT", &shapes);
        assert_eq!(values(&t), vec![2., 6., 7., 10.]);
        let t = merged_batch_input("BATCH_ACCUMULATED_ELEMENT_COUNT_WITH_ZERO", &shapes);
        assert_eq!(
            (t.shape.clone(), values(&t)),
            (vec![5], vec![0., 2., 6., 7., 10.])
        );
        let t = merged_batch_input("BATCH_MAX_ELEMENT_COUNT_AS_SHAPE", &shapes);
        assert_eq!(t.shape, vec![4]);
    }

    #[test]
    fn item_shape_kinds() {
        let shapes = [vec![1, 4, 1], vec![1, 1, 2], vec![2, 2, 2]];
        let t = merged_batch_input("BATCH_ITEM_SHAPE_FLATTEN", &shapes);
        assert_eq!(t.shape, vec![8]);
        assert_eq!(values(&t), vec![4., 1., 1., 2., 2., 2., 2., 2.]);
        let t = merged_batch_input("BATCH_ITEM_SHAPE", &shapes);
        assert_eq!(t.shape, vec![4, 2]);
    }

    #[test]
    fn int32_batch_inputs() {
        let c = model(&bi("BATCH_ELEMENT_COUNT", "TYPE_INT32"));
        let (a, b) = (req(vec![1, 2]), req(vec![1, 3]));
        let t = merge(&c, &[&a, &b]).unwrap().pop().unwrap();
        assert_eq!(t.datatype, DataType::Int32);
        assert_eq!(values(&t), vec![2., 3.]);
    }

    #[test]
    fn batch_output_scatters_with_the_source_shape() {
        let c = model("batch_output [ { target_name: \"Y\" kind: BATCH_SCATTER_WITH_INPUT_SHAPE source_input: \"X\" } ]");
        let (a, b) = (req(vec![1, 2]), req(vec![1, 3]));
        let y = Tensor::new("Y", DataType::Fp32, vec![5], f32s(&[1., 2., 3., 4., 5.]));
        let parts = split(&c, vec![y], &[&a, &b]).unwrap();
        assert_eq!(parts[0][0].shape, vec![1, 2]);
        assert_eq!(values(&parts[0][0]), vec![1., 2.]);
        assert_eq!(parts[1][0].shape, vec![1, 3]);
        assert_eq!(values(&parts[1][0]), vec![3., 4., 5.]);
        let short = Tensor::new("Y", DataType::Fp32, vec![2], f32s(&[1., 2.]));
        assert!(split(&c, vec![short], &[&a, &b]).is_err());
    }
}
