//! The `timeout` request parameter (Triton's schedule-policy extension):
//! how long, in microseconds, a request may wait in its model's queue. Read
//! here once for every queue (default, dynamic batcher, sequence batcher),
//! so a request gets the same answer whichever scheduler its model uses.
//!
//! Triton's front ends refuse a value that is not an unsigned integer (HTTP
//! "Unable to parse 'timeout'", gRPC "expected int64_param"); a negative
//! number, a double, a boolean or a string is refused here alike, before
//! the request is queued. 0 means "no timeout of its own".

use std::time::Duration;

use crate::types::{clip_to, InferError, InferResult, ParamValue, Parameters};

/// The request's own queue timeout; `None` when absent or 0.
pub(crate) fn requested_timeout(params: &Parameters) -> InferResult<Option<Duration>> {
    let Some(value) = params.get("timeout") else {
        return Ok(None);
    };
    let micros = match value {
        ParamValue::Int(i) => u64::try_from(*i).ok(),
        ParamValue::Uint(u) => Some(*u),
        ParamValue::Bool(_) | ParamValue::Double(_) | ParamValue::String(_) => None,
    }
    .ok_or_else(|| {
        InferError::invalid(format!(
            "Unable to parse 'timeout': expected a non-negative integer (microseconds), got {}",
            describe(value)
        ))
    })?;
    Ok((micros > 0).then(|| Duration::from_micros(micros)))
}

fn describe(value: &ParamValue) -> String {
    match value {
        ParamValue::Bool(b) => format!("the boolean {b}"),
        ParamValue::Int(i) => i.to_string(),
        ParamValue::Uint(u) => u.to_string(),
        ParamValue::Double(d) => format!("the number {d}"),
        ParamValue::String(s) => format!("the string {:?}", clip_to(s, 64)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(value: ParamValue) -> Parameters {
        Parameters::from([("timeout".to_string(), value)])
    }

    #[test]
    fn integers_are_microseconds_and_zero_is_none() {
        assert_eq!(requested_timeout(&Parameters::new()).unwrap(), None);
        assert_eq!(requested_timeout(&with(ParamValue::Int(0))).unwrap(), None);
        assert_eq!(
            requested_timeout(&with(ParamValue::Int(1500))).unwrap(),
            Some(Duration::from_micros(1500))
        );
        assert_eq!(
            requested_timeout(&with(ParamValue::Uint(u64::MAX))).unwrap(),
            Some(Duration::from_micros(u64::MAX))
        );
    }

    #[test]
    fn anything_else_is_refused_with_the_parameter_named() {
        for bad in [
            ParamValue::Int(-1),
            ParamValue::Double(1.5),
            ParamValue::String("1000".into()),
            ParamValue::Bool(true),
        ] {
            let e = requested_timeout(&with(bad.clone())).unwrap_err();
            assert_eq!(e.kind, crate::types::ErrorKind::InvalidArgument, "{bad:?}");
            assert!(
                e.message.contains("Unable to parse 'timeout'"),
                "{}",
                e.message
            );
        }
    }
}
