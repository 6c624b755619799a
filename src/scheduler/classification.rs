//! Triton's classification extension: instead of an output tensor, the
//! client gets the top `k` classes of each batch row as BYTES strings
//! `"value:index"` or `"value:index:label"`, largest value first.
//!
//! Values are printed like Triton's `std::to_string`: floating-point types
//! with six decimals (`"%f"`, so `"3.000000"`), integer types as integers.
//! Ties are broken by the lower class index (Triton's `std::sort` leaves
//! them unspecified), NaN ranks below every number. FP16/BF16 are accepted
//! (Triton refuses them) and printed from their exact f32 value.

use std::cmp::Ordering;

use half::{bf16, f16};

use crate::types::{
    element_count, encode_bytes_elements, DataType, InferError, InferResult, Tensor,
};

/// Classifies `output`: `[b, k]` BYTES with `has_batch_dim` (each row of
/// the batch is classified on its own, over all its remaining elements),
/// `[k]` without. `k` is clamped to the number of classes per row.
/// `labels[i]`, when present, names class `i`.
pub fn classify(
    output: &Tensor,
    k: usize,
    labels: Option<&[String]>,
    has_batch_dim: bool,
) -> InferResult<Tensor> {
    let name = &output.name;
    let (batch, row_shape) = if has_batch_dim {
        let Some((&b, rest)) = output.shape.split_first() else {
            return Err(InferError::invalid(format!(
                "cannot classify output '{name}': it has no batch dimension"
            )));
        };
        (b, rest)
    } else {
        (1, &output.shape[..])
    };
    let bad_shape = || {
        InferError::internal(format!(
            "cannot classify output '{name}' of shape {:?}",
            output.shape
        ))
    };
    let batch = usize::try_from(batch).map_err(|_| bad_shape())?;
    let row_len = element_count(row_shape).ok_or_else(bad_shape)?;
    let total = batch.checked_mul(row_len).ok_or_else(bad_shape)?;
    let elem = output
        .datatype
        .element_size()
        .filter(|_| output.datatype != DataType::Bool)
        .ok_or_else(|| {
            InferError::invalid(format!(
                "class result not available for output '{name}' due to unsupported type '{}'",
                output.datatype
            ))
        })?;
    // Whole elements matching the shape, so every row slice below is in bounds.
    if total.checked_mul(elem) != Some(output.data.len()) {
        return Err(InferError::internal(format!(
            "cannot classify output '{name}': {} bytes of data do not match shape {:?} of {}",
            output.data.len(),
            output.shape,
            output.datatype
        )));
    }
    let k = k.min(row_len);

    let d = &output.data[..];
    let mut strings = Vec::with_capacity(batch.saturating_mul(k));
    match output.datatype {
        DataType::Uint8 => rows(
            &mut strings,
            &values(d, u8::from_le_bytes),
            row_len,
            k,
            labels,
            int_str,
        ),
        DataType::Uint16 => rows(
            &mut strings,
            &values(d, u16::from_le_bytes),
            row_len,
            k,
            labels,
            int_str,
        ),
        DataType::Uint32 => rows(
            &mut strings,
            &values(d, u32::from_le_bytes),
            row_len,
            k,
            labels,
            int_str,
        ),
        DataType::Uint64 => rows(
            &mut strings,
            &values(d, u64::from_le_bytes),
            row_len,
            k,
            labels,
            int_str,
        ),
        DataType::Int8 => rows(
            &mut strings,
            &values(d, i8::from_le_bytes),
            row_len,
            k,
            labels,
            int_str,
        ),
        DataType::Int16 => rows(
            &mut strings,
            &values(d, i16::from_le_bytes),
            row_len,
            k,
            labels,
            int_str,
        ),
        DataType::Int32 => rows(
            &mut strings,
            &values(d, i32::from_le_bytes),
            row_len,
            k,
            labels,
            int_str,
        ),
        DataType::Int64 => rows(
            &mut strings,
            &values(d, i64::from_le_bytes),
            row_len,
            k,
            labels,
            int_str,
        ),
        DataType::Fp16 => {
            let v = values(d, |b: [u8; 2]| f16::from_le_bytes(b).to_f64());
            rows(&mut strings, &v, row_len, k, labels, float_str)
        }
        DataType::Bf16 => {
            let v = values(d, |b: [u8; 2]| bf16::from_le_bytes(b).to_f64());
            rows(&mut strings, &v, row_len, k, labels, float_str)
        }
        DataType::Fp32 => rows(
            &mut strings,
            &values(d, |b| f64::from(f32::from_le_bytes(b))),
            row_len,
            k,
            labels,
            float_str,
        ),
        DataType::Fp64 => rows(
            &mut strings,
            &values(d, f64::from_le_bytes),
            row_len,
            k,
            labels,
            float_str,
        ),
        DataType::Bool | DataType::Bytes => {}
    }
    // Both came from i64 dims (k is at most the row length), but convert
    // checked rather than trust that.
    let k_dim = i64::try_from(k).map_err(|_| bad_shape())?;
    let shape = if has_batch_dim {
        vec![i64::try_from(batch).map_err(|_| bad_shape())?, k_dim]
    } else {
        vec![k_dim]
    };
    Ok(Tensor::new(
        name.clone(),
        DataType::Bytes,
        shape,
        encode_bytes_elements(strings),
    ))
}

fn values<T, const N: usize>(data: &[u8], from: impl Fn([u8; N]) -> T) -> Vec<T> {
    data.chunks_exact(N)
        .map(|c| {
            let mut a = [0u8; N];
            a.copy_from_slice(c);
            from(a)
        })
        .collect()
}

fn int_str<T: ToString>(v: T) -> String {
    v.to_string()
}

/// C's `"%f"`, which `std::to_string(float)` uses.
fn float_str(v: f64) -> String {
    if v.is_nan() {
        "nan".to_string()
    } else {
        format!("{v:.6}")
    }
}

/// Largest first; NaN (the only value not equal to itself) after every
/// number. A total order, as `sort_by` requires.
fn desc<T: PartialOrd>(a: &T, b: &T) -> Ordering {
    #[allow(clippy::eq_op)] // x != x is the generic NaN test
    let (a_nan, b_nan) = (a != a, b != b);
    match (a_nan, b_nan) {
        (true, true) => Ordering::Equal,
        (true, false) => Ordering::Greater,
        (false, true) => Ordering::Less,
        (false, false) => b.partial_cmp(a).unwrap_or(Ordering::Equal),
    }
}

fn rows<T: PartialOrd + Copy>(
    out: &mut Vec<String>,
    values: &[T],
    row_len: usize,
    k: usize,
    labels: Option<&[String]>,
    fmt: impl Fn(T) -> String,
) {
    // An empty batch may declare a huge row: size nothing from it then.
    if row_len == 0 || k == 0 || values.is_empty() {
        return;
    }
    let mut idx: Vec<usize> = Vec::with_capacity(row_len);
    for row in values.chunks_exact(row_len) {
        idx.clear();
        idx.extend(0..row_len);
        let cmp = |a: &usize, b: &usize| desc(&row[*a], &row[*b]).then(a.cmp(b));
        // Only the top k need ordering: partition around the k-th first.
        if k < row_len {
            idx.select_nth_unstable_by(k - 1, cmp);
            idx.truncate(k);
        }
        idx.sort_unstable_by(cmp);
        for &i in &idx {
            let mut s = format!("{}:{i}", fmt(row[i]));
            if let Some(label) = labels.and_then(|l| l.get(i)) {
                s.push(':');
                s.push_str(label);
            }
            out.push(s);
        }
    }
}

#[cfg(test)]
mod tests {
    use bytes::Bytes;

    use super::*;
    use crate::types::bytes_elements;

    fn fp32(shape: Vec<i64>, v: &[f32]) -> Tensor {
        Tensor::new(
            "OUT",
            DataType::Fp32,
            shape,
            Bytes::from(v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<_>>()),
        )
    }

    fn strings(t: &Tensor) -> Vec<String> {
        bytes_elements(&t.data)
            .unwrap()
            .map(|e| String::from_utf8(e.to_vec()).unwrap())
            .collect()
    }

    #[test]
    fn top_k_floats_largest_first_with_six_decimals() {
        let t = classify(&fp32(vec![1, 4], &[0.5, 3.0, 1.25, 2.0]), 2, None, true).unwrap();
        assert_eq!(t.datatype, DataType::Bytes);
        assert_eq!(t.shape, vec![1, 2]);
        assert_eq!(strings(&t), vec!["3.000000:1", "2.000000:3"]);
    }

    #[test]
    fn each_batch_row_is_classified_separately() {
        let t = classify(
            &fp32(vec![2, 3], &[1.0, 2.0, 3.0, 9.0, 8.0, 7.0]),
            1,
            None,
            true,
        )
        .unwrap();
        assert_eq!(t.shape, vec![2, 1]);
        assert_eq!(strings(&t), vec!["3.000000:2", "9.000000:0"]);
    }

    #[test]
    fn without_batch_dim_the_shape_is_k() {
        let t = classify(&fp32(vec![3], &[1.0, 2.0, 3.0]), 2, None, false).unwrap();
        assert_eq!(t.shape, vec![2]);
        assert_eq!(strings(&t), vec!["3.000000:2", "2.000000:1"]);
    }

    #[test]
    fn labels_are_appended() {
        let labels = vec!["cat".to_string(), "dog".to_string()];
        let t = classify(&fp32(vec![1, 2], &[0.1, 0.9]), 2, Some(&labels), true).unwrap();
        assert_eq!(strings(&t), vec!["0.900000:1:dog", "0.100000:0:cat"]);
    }

    #[test]
    fn missing_label_leaves_value_index() {
        let labels = vec!["only".to_string()];
        let t = classify(&fp32(vec![2], &[0.1, 0.9]), 1, Some(&labels), false).unwrap();
        assert_eq!(strings(&t), vec!["0.900000:1"]);
    }

    #[test]
    fn k_is_clamped_to_class_count() {
        let t = classify(&fp32(vec![1, 2], &[1.0, 2.0]), 10, None, true).unwrap();
        assert_eq!(t.shape, vec![1, 2]);
        assert_eq!(strings(&t).len(), 2);
    }

    #[test]
    fn integers_print_as_integers() {
        let data: Vec<u8> = [-5i32, 7, 3].iter().flat_map(|v| v.to_le_bytes()).collect();
        let t = Tensor::new("O", DataType::Int32, vec![1, 3], Bytes::from(data));
        assert_eq!(
            strings(&classify(&t, 3, None, true).unwrap()),
            vec!["7:1", "3:2", "-5:0"]
        );
    }

    #[test]
    fn int64_ordering_is_exact_beyond_f64_precision() {
        let big = 1i64 << 60;
        let data: Vec<u8> = [big, big + 1]
            .iter()
            .flat_map(|v| v.to_le_bytes())
            .collect();
        let t = Tensor::new("O", DataType::Int64, vec![2], Bytes::from(data));
        assert_eq!(
            strings(&classify(&t, 1, None, false).unwrap()),
            vec![format!("{}:1", big + 1)]
        );
    }

    #[test]
    fn ties_go_to_the_lower_index() {
        let t = classify(&fp32(vec![4], &[1.0, 2.0, 2.0, 2.0]), 2, None, false).unwrap();
        assert_eq!(strings(&t), vec!["2.000000:1", "2.000000:2"]);
    }

    #[test]
    fn nan_ranks_last() {
        let t = classify(&fp32(vec![3], &[f32::NAN, -1.0, f32::NAN]), 3, None, false).unwrap();
        assert_eq!(strings(&t), vec!["-1.000000:1", "nan:0", "nan:2"]);
    }

    #[test]
    fn fp16_is_supported() {
        let data: Vec<u8> = [0.5f32, 0.25]
            .iter()
            .flat_map(|v| f16::from_f32(*v).to_le_bytes())
            .collect();
        let t = Tensor::new("O", DataType::Fp16, vec![2], Bytes::from(data));
        assert_eq!(
            strings(&classify(&t, 1, None, false).unwrap()),
            vec!["0.500000:0"]
        );
    }

    #[test]
    fn bytes_and_bool_are_refused() {
        let t = Tensor::new("O", DataType::Bytes, vec![1], encode_bytes_elements(["a"]));
        assert!(classify(&t, 1, None, false)
            .unwrap_err()
            .message
            .contains("unsupported type 'BYTES'"));
        let t = Tensor::new("O", DataType::Bool, vec![1], Bytes::from_static(&[1]));
        assert!(classify(&t, 1, None, false).is_err());
    }

    #[test]
    fn data_not_matching_shape_is_an_error_not_a_panic() {
        assert!(classify(&fp32(vec![1, 3], &[1.0, 2.0]), 1, None, true).is_err());
    }

    #[test]
    fn scalar_with_batch_dim_is_an_error() {
        assert!(classify(&fp32(vec![], &[1.0]), 1, None, true).is_err());
    }

    #[test]
    fn empty_batch_with_huge_rows_sizes_nothing() {
        let t = classify(&fp32(vec![0, 1 << 40], &[]), 3, None, true).unwrap();
        assert_eq!(t.shape, vec![0, 3]);
    }

    #[test]
    fn empty_batch_gives_empty_result() {
        let t = classify(&fp32(vec![0, 3], &[]), 2, None, true).unwrap();
        assert_eq!(t.shape, vec![0, 2]);
        assert!(t.data.is_empty());
    }
}
