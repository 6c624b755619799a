//! Checks a request against its model's configuration before it is queued,
//! on the shard that decoded it, so a bad request never crosses shards.
//! Messages follow Triton's wording where clients are known to match them.

use super::{InputSpec, IoSpec, OutputSpec};
use crate::types::{
    clip, element_count, show_shape, DataType, InferError, InferRequest, InferResult,
};

impl IoSpec {
    /// Checks one input's name, datatype and shape against the model before
    /// any of its data is looked at: everything [`validate_request`] checks
    /// per input except the data's size. Protocols call it as soon as a
    /// request's header is parsed, so a shape the model would refuse (or
    /// one declaring 2**40 elements) is answered before its data is read.
    /// `batch` carries the batch size of the inputs checked before.
    pub fn check_input(
        &self,
        model: &str,
        name: &str,
        datatype: DataType,
        shape: &[i64],
        batch: &mut Option<i64>,
    ) -> InferResult<&InputSpec> {
        let spec = self.input(name).ok_or_else(|| {
            InferError::invalid(format!(
                "unexpected inference input '{}' for model '{model}'",
                clip(name)
            ))
        })?;
        let name = clip(name);
        if datatype != spec.datatype {
            return Err(InferError::invalid(format!(
                "inference input '{name}' data-type is '{datatype}', but model '{model}' expects '{}'",
                spec.datatype
            )));
        }
        let item_shape = if self.batching() {
            let Some((&b, rest)) = shape.split_first() else {
                return Err(InferError::invalid(format!(
                    "input '{name}' for model '{model}' has no batch dimension; expected shape {:?}",
                    self.client_shape(&spec.dims)
                )));
            };
            if b < 1 || b > self.max_batch_size {
                return Err(InferError::invalid(format!(
                    "inference request batch-size must be <= {} for '{model}' (input '{name}' has batch size {b})",
                    self.max_batch_size
                )));
            }
            if let Some(prev) = batch.replace(b) {
                if prev != b {
                    return Err(InferError::invalid(format!(
                        "inputs of the request for model '{model}' disagree on the batch size ({prev} vs {b})"
                    )));
                }
            }
            rest
        } else {
            shape
        };
        if !dims_match(&spec.dims, item_shape) {
            return Err(InferError::invalid(format!(
                "unexpected shape for input '{name}' for model '{model}'. Expected {:?}, got {}",
                self.client_shape(&spec.dims),
                show_shape(shape)
            )));
        }
        Ok(spec)
    }
}

/// Validates `req` for model `model` and rewrites input shapes the
/// configuration reshapes, so the backend sees its own shapes.
pub fn validate_request(io: &IoSpec, model: &str, req: &mut InferRequest) -> InferResult<()> {
    let mut batch: Option<i64> = None;
    for (i, t) in req.inputs.iter().enumerate() {
        if req.inputs[..i].iter().any(|o| o.name == t.name) {
            return Err(InferError::invalid(format!(
                "input '{}' appears more than once in the request for model '{model}'",
                clip(&t.name)
            )));
        }
        io.check_input(model, &t.name, t.datatype, &t.shape, &mut batch)?;
        t.check_size()
            .map_err(|e| InferError::invalid(format!("{} (model '{model}')", e.message)))?;
    }
    let required = io.inputs.iter().filter(|s| !s.optional).count();
    let missing: Vec<&str> = io
        .inputs
        .iter()
        .filter(|s| !s.optional && req.input(&s.name).is_none())
        .map(|s| s.name.as_str())
        .collect();
    if !missing.is_empty() {
        return Err(InferError::invalid(format!(
            "expected {required} inputs but got {} inputs for model '{model}'; missing: {}",
            req.inputs.len(),
            missing.join(", ")
        )));
    }
    for (i, o) in req.outputs.iter().enumerate() {
        if io.output(&o.name).is_none() {
            return Err(InferError::invalid(format!(
                "unexpected inference output '{}' for model '{model}'",
                clip(&o.name)
            )));
        }
        if req.outputs[..i].iter().any(|p| p.name == o.name) {
            return Err(InferError::invalid(format!(
                "output '{}' is requested more than once for model '{model}'",
                clip(&o.name)
            )));
        }
    }
    apply_input_reshapes(io, req);
    Ok(())
}

/// `-1` in the configuration matches any size.
fn dims_match(config: &[i64], actual: &[i64]) -> bool {
    config.len() == actual.len()
        && config
            .iter()
            .zip(actual)
            .all(|(&c, &a)| a >= 0 && (c == -1 || c == a))
}

fn apply_input_reshapes(io: &IoSpec, req: &mut InferRequest) {
    for t in &mut req.inputs {
        let Some(target) = io.input(&t.name).and_then(|s| s.reshape.as_ref()) else {
            continue;
        };
        let batch = io.batching().then(|| t.shape.first().copied()).flatten();
        let items = element_count(&t.shape).unwrap_or(0) / batch.map_or(1, |b| b.max(1) as usize);
        t.shape = batch
            .into_iter()
            .chain(resolve_wildcard(target, items))
            .collect();
    }
}

/// Resolves one `-1` in a reshape target from the element count.
pub(crate) fn resolve_wildcard(target: &[i64], elements: usize) -> Vec<i64> {
    let known: i64 = target.iter().filter(|&&d| d >= 0).product();
    target
        .iter()
        .map(|&d| {
            if d < 0 && known > 0 {
                elements as i64 / known
            } else {
                d
            }
        })
        .collect()
}

/// Shape a client sees for an output the backend produced in its reshaped form.
pub(crate) fn client_output_shape(io: &IoSpec, spec: &OutputSpec, produced: &[i64]) -> Vec<i64> {
    if spec.reshape.is_none() {
        return produced.to_vec();
    }
    let batch = if io.batching() {
        produced.first().copied()
    } else {
        None
    };
    let items = element_count(produced).unwrap_or(0) / batch.map_or(1, |b| b.max(1) as usize);
    batch
        .into_iter()
        .chain(resolve_wildcard(&spec.dims, items))
        .collect()
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::{
        model::{InputSpec, OutputSpec},
        types::{DataType, RequestedOutput, Tensor},
    };

    fn simple_io() -> IoSpec {
        let input = |n: &str| InputSpec {
            name: n.into(),
            datatype: DataType::Int32,
            dims: vec![16],
            reshape: None,
            optional: false,
        };
        let output = |n: &str| OutputSpec {
            name: n.into(),
            datatype: DataType::Int32,
            dims: vec![16],
            reshape: None,
            labels: None,
        };
        IoSpec {
            max_batch_size: 8,
            inputs: vec![input("INPUT0"), input("INPUT1")],
            outputs: vec![output("OUTPUT0"), output("OUTPUT1")],
        }
    }

    fn t(name: &str, dt: DataType, shape: Vec<i64>, bytes: usize) -> Tensor {
        Tensor::new(name, dt, shape, Bytes::from(vec![0u8; bytes]))
    }

    fn req(inputs: Vec<Tensor>) -> InferRequest {
        InferRequest {
            model_name: "simple".into(),
            inputs,
            ..Default::default()
        }
    }

    #[test]
    fn accepts_a_correct_request() {
        let mut r = req(vec![
            t("INPUT0", DataType::Int32, vec![2, 16], 128),
            t("INPUT1", DataType::Int32, vec![2, 16], 128),
        ]);
        validate_request(&simple_io(), "simple", &mut r).unwrap();
    }

    #[test]
    fn rejects_wrong_dtype() {
        let mut r = req(vec![
            t("INPUT0", DataType::Fp32, vec![1, 16], 64),
            t("INPUT1", DataType::Int32, vec![1, 16], 64),
        ]);
        let e = validate_request(&simple_io(), "simple", &mut r).unwrap_err();
        assert!(e.message.contains("data-type is 'FP32'"), "{}", e.message);
    }

    #[test]
    fn rejects_batch_over_max() {
        let mut r = req(vec![
            t("INPUT0", DataType::Int32, vec![9, 16], 9 * 64),
            t("INPUT1", DataType::Int32, vec![9, 16], 9 * 64),
        ]);
        let e = validate_request(&simple_io(), "simple", &mut r).unwrap_err();
        assert!(
            e.message.contains("batch-size must be <= 8"),
            "{}",
            e.message
        );
    }

    #[test]
    fn rejects_wrong_shape_missing_extra_and_duplicate_inputs() {
        let io = simple_io();
        let mut r = req(vec![
            t("INPUT0", DataType::Int32, vec![1, 15], 60),
            t("INPUT1", DataType::Int32, vec![1, 16], 64),
        ]);
        assert!(validate_request(&io, "simple", &mut r)
            .unwrap_err()
            .message
            .contains("unexpected shape"));
        let mut r = req(vec![t("INPUT0", DataType::Int32, vec![1, 16], 64)]);
        assert!(validate_request(&io, "simple", &mut r)
            .unwrap_err()
            .message
            .contains("expected 2 inputs"));
        let mut r = req(vec![
            t("INPUT0", DataType::Int32, vec![1, 16], 64),
            t("INPUT1", DataType::Int32, vec![1, 16], 64),
            t("INPUT2", DataType::Int32, vec![1, 16], 64),
        ]);
        assert!(validate_request(&io, "simple", &mut r)
            .unwrap_err()
            .message
            .contains("unexpected inference input"));
        let mut r = req(vec![
            t("INPUT0", DataType::Int32, vec![1, 16], 64),
            t("INPUT0", DataType::Int32, vec![1, 16], 64),
        ]);
        assert!(validate_request(&io, "simple", &mut r)
            .unwrap_err()
            .message
            .contains("more than once"));
    }

    #[test]
    fn rejects_size_mismatch_and_unknown_output() {
        let io = simple_io();
        let mut r = req(vec![
            t("INPUT0", DataType::Int32, vec![1, 16], 63),
            t("INPUT1", DataType::Int32, vec![1, 16], 64),
        ]);
        assert!(validate_request(&io, "simple", &mut r).is_err());
        let mut r = req(vec![
            t("INPUT0", DataType::Int32, vec![1, 16], 64),
            t("INPUT1", DataType::Int32, vec![1, 16], 64),
        ]);
        r.outputs.push(RequestedOutput {
            name: "NOPE".into(),
            ..Default::default()
        });
        assert!(validate_request(&io, "simple", &mut r)
            .unwrap_err()
            .message
            .contains("unexpected inference output"));
    }

    #[test]
    fn reshape_rewrites_the_backend_shape() {
        let mut io = simple_io();
        io.inputs[0].reshape = Some(vec![4, 4]);
        let mut r = req(vec![
            t("INPUT0", DataType::Int32, vec![2, 16], 128),
            t("INPUT1", DataType::Int32, vec![2, 16], 128),
        ]);
        validate_request(&io, "simple", &mut r).unwrap();
        assert_eq!(r.inputs[0].shape, vec![2, 4, 4]);
        assert_eq!(r.inputs[1].shape, vec![2, 16]);
    }
}
