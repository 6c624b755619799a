//! `--http-header-forward-pattern` / `--grpc-header-forward-pattern`:
//! request headers (HTTP) or metadata (gRPC) whose names match the
//! pattern become string parameters of the inference request, as in
//! Triton (`docs/protocol/extension_parameters.md`).
//!
//! Triton's rules, kept here: the pattern is matched case-insensitively
//! unless it turns that off itself (`(?-i)...`), anywhere in the name
//! (RE2 `PartialMatch`); a matching name that is a reserved parameter key
//! or starts with `triton_` makes the request fail with INVALID_ARG; a
//! forwarded header is set after the request's own parameters, so it
//! wins over an explicit parameter of the same name.

use regex::Regex;

use crate::types::{InferError, ParamValue, Parameters};

/// Parameter keys Triton keeps for itself (`kReservedParameterKeys`).
const RESERVED: [&str; 7] = [
    "sequence_id",
    "sequence_start",
    "sequence_end",
    "priority",
    "timeout",
    "headers",
    "binary_data_output",
];

/// One compiled forward pattern.
#[derive(Debug, Clone)]
pub struct HeaderForward {
    regex: Regex,
}

impl HeaderForward {
    /// Compiles `pattern` as Triton does (case-insensitive prefix);
    /// `flag` names the option in the error.
    pub fn compile(flag: &str, pattern: &str) -> Result<Self, String> {
        Regex::new(&format!("(?i){pattern}"))
            .map(|regex| Self { regex })
            .map_err(|e| format!("{flag}: invalid regular expression '{pattern}': {e}"))
    }

    /// Adds every `(name, value)` whose name matches to `parameters`.
    /// Values that are not valid UTF-8 (binary gRPC metadata, odd HTTP
    /// bytes) cannot be string parameters and are skipped.
    pub fn apply<'a>(
        &self,
        headers: impl IntoIterator<Item = (&'a str, &'a [u8])>,
        parameters: &mut Parameters,
    ) -> Result<(), InferError> {
        for (name, value) in headers {
            if !self.regex.is_match(name) {
                continue;
            }
            if RESERVED.contains(&name) || name.starts_with("triton_") {
                return Err(InferError::invalid(format!(
                    "Header '{name}' is reserved for Triton usage and cannot be forwarded."
                )));
            }
            let Ok(value) = std::str::from_utf8(value) else {
                tracing::debug!(header = name, "not forwarded: value is not UTF-8");
                continue;
            };
            parameters.insert(name.to_string(), ParamValue::String(value.to_string()));
        }
        Ok(())
    }

    /// Forwards the matching ASCII entries of gRPC metadata (binary `-bin`
    /// entries are bytes, not strings).
    pub fn apply_grpc(
        &self,
        metadata: &tonic::metadata::MetadataMap,
        parameters: &mut Parameters,
    ) -> Result<(), InferError> {
        use tonic::metadata::KeyAndValueRef;
        self.apply(
            metadata.iter().filter_map(|entry| match entry {
                KeyAndValueRef::Ascii(k, v) => Some((k.as_str(), v.as_bytes())),
                KeyAndValueRef::Binary(..) => None,
            }),
            parameters,
        )
    }

    /// Forwards the matching entries of an HTTP header map.
    pub fn apply_http(
        &self,
        headers: &http::HeaderMap,
        parameters: &mut Parameters,
    ) -> Result<(), InferError> {
        self.apply(
            headers.iter().map(|(k, v)| (k.as_str(), v.as_bytes())),
            parameters,
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn forward(pattern: &str, headers: &[(&str, &str)]) -> Result<Parameters, InferError> {
        let f = HeaderForward::compile("--test", pattern).unwrap();
        let mut p = Parameters::new();
        p.insert("x-keep".into(), ParamValue::Int(1));
        f.apply(headers.iter().map(|(k, v)| (*k, v.as_bytes())), &mut p)?;
        Ok(p)
    }

    #[test]
    fn matching_names_become_string_parameters_case_insensitively() {
        let p = forward("PREFIX_.*", &[("prefix_a", "1"), ("other", "2")]).unwrap();
        assert_eq!(p.get("prefix_a"), Some(&ParamValue::String("1".into())));
        assert!(!p.contains_key("other"));
        // Anywhere in the name, as RE2's PartialMatch.
        let p = forward("fix_", &[("prefix_a", "1")]).unwrap();
        assert!(p.contains_key("prefix_a"));
        // `(?-i)` turns case-insensitivity off.
        let p = forward("(?-i)PREFIX_.*", &[("prefix_a", "1")]).unwrap();
        assert!(!p.contains_key("prefix_a"));
    }

    #[test]
    fn a_forwarded_header_wins_over_a_parameter_of_the_same_name() {
        let p = forward("x-keep", &[("x-keep", "h")]).unwrap();
        assert_eq!(p.get("x-keep"), Some(&ParamValue::String("h".into())));
    }

    #[test]
    fn reserved_names_are_refused() {
        for name in ["priority", "triton_enable_empty_final_response"] {
            let e = forward(".*", &[(name, "1")]).unwrap_err();
            assert!(
                e.to_string().contains("is reserved for Triton usage"),
                "{e}"
            );
        }
    }

    #[test]
    fn a_bad_pattern_names_its_flag() {
        let e = HeaderForward::compile("--http-header-forward-pattern", "(").unwrap_err();
        assert!(e.starts_with("--http-header-forward-pattern"), "{e}");
    }
}
