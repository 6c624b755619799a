//! `simple` and `simple_int8`: OUTPUT0 = INPUT0 + INPUT1, OUTPUT1 = INPUT0 -
//! INPUT1, element-wise with two's-complement wrap-around. A configuration
//! that declares an INT32 output `BATCH_SIZE` (dims [1]) also gets, per
//! batch row, the number of rows in the execution (`simple_dyna_batch`):
//! that is how the dynamic batcher's merging becomes visible to clients.

use bytes::Bytes;

use super::io;
use crate::{
    backend::{Backend, InstanceSpec, ModelFiles, ModelInstance},
    proto::inference::ModelConfig,
    types::{DataType, InferError, InferResult, Tensor},
};

pub struct SimpleBackend {
    dtype: DataType,
    name: &'static str,
}

impl SimpleBackend {
    pub fn int32() -> Self {
        Self {
            dtype: DataType::Int32,
            name: "simple",
        }
    }
    pub fn int8() -> Self {
        Self {
            dtype: DataType::Int8,
            name: "simple_int8",
        }
    }
}

impl Backend for SimpleBackend {
    fn runs_inline(&self, _: &ModelConfig) -> bool {
        true
    }

    fn name(&self) -> &'static str {
        self.name
    }

    fn auto_complete(&self, config: &mut ModelConfig, _: &ModelFiles) -> anyhow::Result<()> {
        io::complete_two_by_two(config, self.dtype);
        Ok(())
    }

    fn create_instance(
        &self,
        config: &ModelConfig,
        _: &ModelFiles,
        _: &InstanceSpec,
    ) -> anyhow::Result<Box<dyn ModelInstance>> {
        let report_batch_size = config.output.iter().any(|o| o.name == BATCH_SIZE_OUTPUT);
        let mut arithmetic = config.clone();
        arithmetic.output.retain(|o| o.name != BATCH_SIZE_OUTPUT);
        io::require_dtype(&arithmetic, self.dtype)?;
        if let Some(o) = config.output.iter().find(|o| o.name == BATCH_SIZE_OUTPUT) {
            if DataType::from_config_i32(o.data_type) != Some(DataType::Int32) || o.dims != [1] {
                anyhow::bail!(
                    "model '{}': output {BATCH_SIZE_OUTPUT} must be TYPE_INT32 with dims [1]",
                    config.name
                );
            }
            if config.max_batch_size == 0 {
                anyhow::bail!(
                    "model '{}': {BATCH_SIZE_OUTPUT} needs max_batch_size > 0",
                    config.name
                );
            }
        }
        Ok(Box::new(SimpleInstance {
            dtype: self.dtype,
            model: config.name.clone(),
            report_batch_size,
        }))
    }
}

const BATCH_SIZE_OUTPUT: &str = "BATCH_SIZE";

struct SimpleInstance {
    dtype: DataType,
    model: String,
    report_batch_size: bool,
}

impl ModelInstance for SimpleInstance {
    fn execute(&mut self, inputs: &[Tensor], _outputs: &[&str]) -> InferResult<Vec<Tensor>> {
        let a = io::input(inputs, "INPUT0", &self.model)?;
        let b = io::input(inputs, "INPUT1", &self.model)?;
        if a.shape != b.shape {
            return Err(InferError::invalid(format!(
                "model '{}': INPUT0 shape {:?} differs from INPUT1 shape {:?}",
                self.model, a.shape, b.shape
            )));
        }
        let (sum, diff) = match self.dtype {
            DataType::Int8 => (
                zip_bytes::<1>(&a.data, &b.data, |x, y| {
                    (i8::from_le_bytes(x).wrapping_add(i8::from_le_bytes(y))).to_le_bytes()
                }),
                zip_bytes::<1>(&a.data, &b.data, |x, y| {
                    (i8::from_le_bytes(x).wrapping_sub(i8::from_le_bytes(y))).to_le_bytes()
                }),
            ),
            _ => (
                zip_bytes::<4>(&a.data, &b.data, |x, y| {
                    (i32::from_le_bytes(x).wrapping_add(i32::from_le_bytes(y))).to_le_bytes()
                }),
                zip_bytes::<4>(&a.data, &b.data, |x, y| {
                    (i32::from_le_bytes(x).wrapping_sub(i32::from_le_bytes(y))).to_le_bytes()
                }),
            ),
        };
        let mut outputs = vec![
            Tensor::new("OUTPUT0", self.dtype, a.shape.clone(), sum),
            Tensor::new("OUTPUT1", self.dtype, a.shape.clone(), diff),
        ];
        if self.report_batch_size {
            let rows = a.shape.first().copied().unwrap_or(1);
            let value = i32::try_from(rows).unwrap_or(i32::MAX);
            let data: Vec<u8> = (0..rows).flat_map(|_| value.to_le_bytes()).collect();
            outputs.push(Tensor::new(
                BATCH_SIZE_OUTPUT,
                DataType::Int32,
                vec![rows, 1],
                Bytes::from(data),
            ));
        }
        Ok(outputs)
    }
}

/// Applies `f` to each pair of N-byte little-endian elements. Works on
/// unaligned network buffers, which is why it reads through byte arrays.
fn zip_bytes<const N: usize>(a: &[u8], b: &[u8], f: impl Fn([u8; N], [u8; N]) -> [u8; N]) -> Bytes {
    let mut out = Vec::with_capacity(a.len());
    for (x, y) in a.chunks_exact(N).zip(b.chunks_exact(N)) {
        let mut xa = [0u8; N];
        let mut ya = [0u8; N];
        xa.copy_from_slice(x);
        ya.copy_from_slice(y);
        out.extend_from_slice(&f(xa, ya));
    }
    Bytes::from(out)
}

#[cfg(test)]
mod tests {
    use super::*;

    fn int32_tensor(name: &str, v: &[i32]) -> Tensor {
        let data: Vec<u8> = v.iter().flat_map(|x| x.to_le_bytes()).collect();
        Tensor::new(
            name,
            DataType::Int32,
            vec![1, v.len() as i64],
            Bytes::from(data),
        )
    }

    fn ints(t: &Tensor) -> Vec<i32> {
        t.data
            .chunks_exact(4)
            .map(|c| i32::from_le_bytes([c[0], c[1], c[2], c[3]]))
            .collect()
    }

    #[test]
    fn simple_adds_and_subtracts_with_wraparound() {
        let mut inst = SimpleInstance {
            dtype: DataType::Int32,
            model: "simple".into(),
            report_batch_size: false,
        };
        let out = inst
            .execute(
                &[
                    int32_tensor("INPUT0", &[i32::MAX, 5]),
                    int32_tensor("INPUT1", &[1, 7]),
                ],
                &[],
            )
            .unwrap();
        assert_eq!(ints(&out[0]), vec![i32::MIN, 12]);
        assert_eq!(ints(&out[1]), vec![i32::MAX - 1, -2]);
    }

    #[test]
    fn simple_int8_wraps() {
        let mut inst = SimpleInstance {
            dtype: DataType::Int8,
            model: "simple_int8".into(),
            report_batch_size: false,
        };
        let t =
            |n: &str, v: i8| Tensor::new(n, DataType::Int8, vec![1, 1], Bytes::from(vec![v as u8]));
        let out = inst
            .execute(&[t("INPUT0", 100), t("INPUT1", 100)], &[])
            .unwrap();
        assert_eq!(out[0].data[0] as i8, -56);
        assert_eq!(out[1].data[0] as i8, 0);
    }

    #[test]
    fn batch_size_output_reports_the_rows_executed_together() {
        let mut inst = SimpleInstance {
            dtype: DataType::Int32,
            model: "simple_dyna_batch".into(),
            report_batch_size: true,
        };
        let data = Bytes::from(vec![0u8; 3 * 16 * 4]);
        let t = |n: &str| Tensor::new(n, DataType::Int32, vec![3, 16], data.clone());
        let out = inst.execute(&[t("INPUT0"), t("INPUT1")], &[]).unwrap();
        assert_eq!(out[2].shape, vec![3, 1]);
        assert_eq!(ints(&out[2]), vec![3, 3, 3]);
    }
}
