//! `simple_string`: BYTES elements holding decimal INT32 text; OUTPUT0 is
//! the text of the wrapped sum, OUTPUT1 of the wrapped difference.

use super::io;
use crate::{
    backend::{Backend, InstanceSpec, ModelFiles, ModelInstance},
    proto::inference::ModelConfig,
    types::{bytes_elements, encode_bytes_elements, DataType, InferError, InferResult, Tensor},
};

pub struct SimpleStringBackend;

impl Backend for SimpleStringBackend {
    fn runs_inline(&self, _: &ModelConfig) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        "simple_string"
    }

    fn auto_complete(&self, config: &mut ModelConfig, _: &ModelFiles) -> anyhow::Result<()> {
        io::complete_two_by_two(config, DataType::Bytes);
        Ok(())
    }

    fn create_instance(
        &self,
        config: &ModelConfig,
        _: &ModelFiles,
        _: &InstanceSpec,
    ) -> anyhow::Result<Box<dyn ModelInstance>> {
        io::require_dtype(config, DataType::Bytes)?;
        Ok(Box::new(SimpleStringInstance {
            model: config.name.clone(),
        }))
    }
}

struct SimpleStringInstance {
    model: String,
}

impl SimpleStringInstance {
    fn parse_all(&self, t: &Tensor) -> InferResult<Vec<i32>> {
        let elements = bytes_elements(&t.data).map_err(|e| {
            InferError::invalid(format!("model '{}', input '{}': {e}", self.model, t.name))
        })?;
        elements
            .enumerate()
            .map(|(i, raw)| {
                parse_int32(raw).ok_or_else(|| {
                    InferError::internal(format!(
                        "model '{}': element {i} of input '{}' is not a decimal INT32: {:?}",
                        self.model,
                        t.name,
                        String::from_utf8_lossy(raw)
                    ))
                })
            })
            .collect()
    }
}

/// Decimal text with optional sign and surrounding whitespace, in INT32 range.
fn parse_int32(raw: &[u8]) -> Option<i32> {
    std::str::from_utf8(raw).ok()?.trim().parse::<i32>().ok()
}

impl ModelInstance for SimpleStringInstance {
    fn execute(&mut self, inputs: &[Tensor], _outputs: &[&str]) -> InferResult<Vec<Tensor>> {
        let a_t = io::input(inputs, "INPUT0", &self.model)?;
        let b_t = io::input(inputs, "INPUT1", &self.model)?;
        let a = self.parse_all(a_t)?;
        let b = self.parse_all(b_t)?;
        if a.len() != b.len() {
            return Err(InferError::invalid(format!(
                "model '{}': INPUT0 and INPUT1 have different element counts",
                self.model
            )));
        }
        let sum = encode_bytes_elements(
            a.iter()
                .zip(&b)
                .map(|(x, y)| x.wrapping_add(*y).to_string()),
        );
        let diff = encode_bytes_elements(
            a.iter()
                .zip(&b)
                .map(|(x, y)| x.wrapping_sub(*y).to_string()),
        );
        Ok(vec![
            Tensor::new("OUTPUT0", DataType::Bytes, a_t.shape.clone(), sum),
            Tensor::new("OUTPUT1", DataType::Bytes, a_t.shape.clone(), diff),
        ])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_signed_padded_decimal_and_rejects_others() {
        assert_eq!(parse_int32(b" -17 "), Some(-17));
        assert_eq!(parse_int32(b"+3"), Some(3));
        assert_eq!(parse_int32(b"2147483648"), None);
        assert_eq!(parse_int32(b"abc"), None);
        assert_eq!(parse_int32(b""), None);
    }

    #[test]
    fn string_arithmetic_wraps_and_prints_plain_decimal() {
        let mut inst = SimpleStringInstance {
            model: "simple_string".into(),
        };
        let t = |n: &str, v: &[&str]| {
            Tensor::new(
                n,
                DataType::Bytes,
                vec![1, v.len() as i64],
                encode_bytes_elements(v),
            )
        };
        let out = inst
            .execute(
                &[t("INPUT0", &["2147483647", "5"]), t("INPUT1", &["1", " 8"])],
                &[],
            )
            .unwrap();
        let got: Vec<&[u8]> = bytes_elements(&out[0].data).unwrap().collect();
        assert_eq!(got, vec![&b"-2147483648"[..], b"13"]);
        let got: Vec<&[u8]> = bytes_elements(&out[1].data).unwrap().collect();
        assert_eq!(got, vec![&b"2147483646"[..], b"-3"]);
    }

    #[test]
    fn non_integer_element_is_an_error() {
        let mut inst = SimpleStringInstance {
            model: "simple_string".into(),
        };
        let t = |n: &str, v: &[&str]| {
            Tensor::new(n, DataType::Bytes, vec![1, 1], encode_bytes_elements(v))
        };
        assert!(inst
            .execute(&[t("INPUT0", &["x"]), t("INPUT1", &["1"])], &[])
            .is_err());
    }
}
