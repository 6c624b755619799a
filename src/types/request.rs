use std::{collections::BTreeMap, time::Duration};

use super::Tensor;

/// A request/response/tensor parameter value (KServe `parameters`).
#[derive(Debug, Clone, PartialEq)]
pub enum ParamValue {
    Bool(bool),
    Int(i64),
    Uint(u64),
    Double(f64),
    String(String),
}

pub type Parameters = BTreeMap<String, ParamValue>;

/// An output the client asked for, with protocol-level options kept as
/// parameters (`binary_data`, `classification`) for the protocol layer.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct RequestedOutput {
    pub name: String,
    pub parameters: Parameters,
}

impl RequestedOutput {
    /// Classification extension: `classification` (HTTP) or `class_count` (gRPC).
    pub fn class_count(&self) -> Option<u64> {
        ["classification", "class_count"]
            .iter()
            .find_map(|k| match self.parameters.get(*k) {
                Some(ParamValue::Int(v)) if *v > 0 => Some(*v as u64),
                Some(ParamValue::Uint(v)) if *v > 0 => Some(*v),
                _ => None,
            })
    }
}

/// One inference request, decoded from any protocol.
#[derive(Debug, Clone, Default)]
pub struct InferRequest {
    pub model_name: String,
    /// Empty means "let the version policy choose" (KServe semantics).
    pub model_version: String,
    pub id: String,
    pub inputs: Vec<Tensor>,
    /// Empty means "all outputs of the model".
    pub outputs: Vec<RequestedOutput>,
    pub parameters: Parameters,
    /// The request's trace when it was sampled (trace extension).
    pub trace: crate::trace::TraceSlot,
}

impl InferRequest {
    pub fn input(&self, name: &str) -> Option<&Tensor> {
        self.inputs.iter().find(|t| t.name == name)
    }
}

/// The answer to an [`InferRequest`].
#[derive(Debug, Clone, Default)]
pub struct InferResponse {
    pub model_name: String,
    pub model_version: String,
    pub id: String,
    pub outputs: Vec<Tensor>,
    pub parameters: Parameters,
    /// The request's trace, handed back for the protocol's last stamps.
    pub trace: crate::trace::TraceSlot,
    /// How long the execution that produced this response spent in each
    /// compute phase; an ensemble's response carries the sum over its
    /// steps, which is what Triton reports as the ensemble's compute time.
    pub compute: ComputeTimes,
}

/// Triton's per-request compute phases: `compute_input`, `compute_infer`
/// and `compute_output` of the execution (or executions) a request took.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct ComputeTimes {
    pub input: Duration,
    pub infer: Duration,
    pub output: Duration,
}

impl std::ops::AddAssign for ComputeTimes {
    fn add_assign(&mut self, o: Self) {
        self.input += o.input;
        self.infer += o.infer;
        self.output += o.output;
    }
}
