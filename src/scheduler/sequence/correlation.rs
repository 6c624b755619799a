//! The sequence a request belongs to: its correlation id and START/END
//! flags, read from the request parameters every protocol fills in the
//! same way (`sequence_id`, `sequence_start`, `sequence_end`).

use std::fmt;

use super::spec::SequenceSpec;
use crate::types::{clip, DataType, InferError, ParamValue, Parameters};

/// A correlation id: unsigned integer or string. `7` and `"7"` are
/// different sequences, as in Triton.
#[derive(Debug, Clone, PartialEq, Eq, Hash)]
pub enum CorrelationId {
    Uint(u64),
    Str(Box<str>),
}

impl fmt::Display for CorrelationId {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            CorrelationId::Uint(v) => write!(f, "{v}"),
            CorrelationId::Str(s) => f.write_str(&clip(s)),
        }
    }
}

/// What a sequence request says about its sequence.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SequenceFlags {
    pub id: CorrelationId,
    pub start: bool,
    pub end: bool,
}

/// Longest string id accepted (ids are kept per live sequence).
pub const MAX_STRING_ID: usize = 256;

/// Reads the sequence flags of a request to a sequence model, with
/// Triton's errors for a missing id and a CORRID type mismatch.
pub fn sequence_flags(
    model: &str,
    spec: &SequenceSpec,
    params: &Parameters,
) -> Result<SequenceFlags, InferError> {
    let missing = || {
        InferError::invalid(format!(
            "inference request to model '{}' must specify a non-zero or non-empty correlation ID",
            clip(model)
        ))
    };
    let id = match params.get("sequence_id") {
        None => return Err(missing()),
        Some(ParamValue::Uint(0)) | Some(ParamValue::Int(0)) => return Err(missing()),
        Some(ParamValue::Uint(v)) => CorrelationId::Uint(*v),
        // gRPC carries ids as int64_param: Triton's C++ client (and
        // perf_analyzer) sends a uint64 id >= 2^63 as a negative int64,
        // and Triton takes the same 64 bits as the id.
        Some(ParamValue::Int(v)) => CorrelationId::Uint(*v as u64),
        Some(ParamValue::String(s)) if s.is_empty() => return Err(missing()),
        Some(ParamValue::String(s)) => {
            if s.len() > MAX_STRING_ID {
                return Err(InferError::invalid(format!(
                    "inference request to model '{}': string sequence_id is longer than {MAX_STRING_ID} bytes",
                    clip(model)
                )));
            }
            CorrelationId::Str(s.as_str().into())
        }
        Some(_) => {
            return Err(InferError::invalid(format!(
                "inference request to model '{}': invalid value type for 'sequence_id' parameter, expected an integer or a string",
                clip(model)
            )))
        }
    };
    if let (Some(corrid), CorrelationId::Str(_)) = (&spec.controls.corrid, &id) {
        if corrid.datatype != DataType::Bytes {
            return Err(InferError::invalid(format!(
                "sequence batching control '{}' data-type is 'BYTES', but model '{}' expects '{}'",
                corrid.name,
                clip(model),
                corrid.datatype
            )));
        }
    }
    Ok(SequenceFlags {
        id,
        start: flag(model, params, "sequence_start")?,
        end: flag(model, params, "sequence_end")?,
    })
}

fn flag(model: &str, params: &Parameters, key: &str) -> Result<bool, InferError> {
    match params.get(key) {
        None => Ok(false),
        Some(ParamValue::Bool(b)) => Ok(*b),
        Some(_) => Err(InferError::invalid(format!(
            "inference request to model '{}': invalid value type for '{key}' parameter, expected a boolean",
            clip(model)
        ))),
    }
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::parse_model_config;

    fn spec(corrid: &str) -> SequenceSpec {
        let c = parse_model_config(&format!(
            r#"name: "m" max_batch_size: 1 sequence_batching {{ control_input [
                {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: {corrid} }} ] }} ] }}"#
        ))
        .unwrap();
        SequenceSpec::from_config(&c, Path::new("/"))
            .unwrap()
            .unwrap()
    }

    fn params(pairs: &[(&str, ParamValue)]) -> Parameters {
        pairs
            .iter()
            .map(|(k, v)| (k.to_string(), v.clone()))
            .collect()
    }

    #[test]
    fn ids_and_flags() {
        let s = spec("TYPE_UINT64");
        let f = sequence_flags(
            "m",
            &s,
            &params(&[
                ("sequence_id", ParamValue::Int(7)),
                ("sequence_start", ParamValue::Bool(true)),
            ]),
        )
        .unwrap();
        assert_eq!(
            f,
            SequenceFlags {
                id: CorrelationId::Uint(7),
                start: true,
                end: false
            }
        );
        let s = spec("TYPE_STRING");
        let f = sequence_flags(
            "m",
            &s,
            &params(&[
                ("sequence_id", ParamValue::String("7".into())),
                ("sequence_end", ParamValue::Bool(true)),
            ]),
        )
        .unwrap();
        assert_eq!(f.id, CorrelationId::Str("7".into()));
        assert!(f.end && !f.start);
    }

    #[test]
    fn tritons_errors() {
        let s = spec("TYPE_UINT64");
        for p in [
            vec![],
            vec![("sequence_id", ParamValue::Uint(0))],
            vec![("sequence_id", ParamValue::String(String::new()))],
        ] {
            assert_eq!(
                sequence_flags("m", &s, &params(&p)).unwrap_err().message,
                "inference request to model 'm' must specify a non-zero or non-empty correlation ID"
            );
        }
        assert_eq!(
            sequence_flags("m", &s, &params(&[("sequence_id", ParamValue::String("x".into()))]))
                .unwrap_err()
                .message,
            "sequence batching control 'CORRID' data-type is 'BYTES', but model 'm' expects 'UINT64'"
        );
        let long = "x".repeat(MAX_STRING_ID + 1);
        let s_str = spec("TYPE_STRING");
        assert_eq!(
            sequence_flags("m", &s_str, &params(&[("sequence_id", ParamValue::String(long))]))
                .unwrap_err()
                .message,
            format!("inference request to model 'm': string sequence_id is longer than {MAX_STRING_ID} bytes")
        );
        // A negative int64 is the uint64 id with the same bits (gRPC).
        assert_eq!(
            sequence_flags("m", &s, &params(&[("sequence_id", ParamValue::Int(-1))]))
                .unwrap()
                .id,
            CorrelationId::Uint(u64::MAX)
        );
        assert!(sequence_flags(
            "m",
            &s,
            &params(&[("sequence_id", ParamValue::Double(1.5))])
        )
        .is_err());
        assert!(sequence_flags(
            "m",
            &s,
            &params(&[
                ("sequence_id", ParamValue::Int(3)),
                ("sequence_start", ParamValue::String("yes".into()))
            ])
        )
        .is_err());
    }
}
