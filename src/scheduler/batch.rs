//! Merging several requests into one execution along the batch dimension,
//! and splitting the outputs back per request. Fixed-size outputs split
//! as zero-copy `Bytes` slices of the backend's buffer.

#[cfg(test)]
use bytes::Bytes;
use bytes::BytesMut;

use crate::types::{
    bytes_elements, element_count, DataType, InferError, InferRequest, InferResult, Tensor,
};

/// Batch rows of a request (its inputs' leading dimension).
pub fn batch_rows(request: &InferRequest) -> i64 {
    request
        .inputs
        .first()
        .and_then(|t| t.shape.first().copied())
        .unwrap_or(1)
}

/// True when `b` can share an execution with `a`: same inputs with the
/// same datatypes and the same per-item shapes (Triton batches requests
/// with different variable-dim sizes only when those sizes agree).
pub fn compatible(a: &InferRequest, b: &InferRequest) -> bool {
    a.inputs.len() == b.inputs.len()
        && a.inputs.iter().all(|ta| {
            b.input(&ta.name).is_some_and(|tb| {
                tb.datatype == ta.datatype && tb.shape.get(1..) == ta.shape.get(1..)
            })
        })
}

/// Concatenates the inputs of `requests` (all compatible) along dim 0.
pub fn merge_inputs(requests: &[&InferRequest]) -> Vec<Tensor> {
    let Some(first) = requests.first() else {
        return Vec::new();
    };
    if requests.len() == 1 {
        return first.inputs.clone();
    }
    let total: i64 = requests.iter().map(|r| batch_rows(r)).sum();
    first
        .inputs
        .iter()
        .map(|t| {
            let size: usize = requests
                .iter()
                .filter_map(|r| r.input(&t.name))
                .map(|x| x.data.len())
                .sum();
            let mut data = BytesMut::with_capacity(size);
            for r in requests {
                if let Some(x) = r.input(&t.name) {
                    data.extend_from_slice(&x.data);
                }
            }
            let mut shape = t.shape.clone();
            if let Some(b) = shape.first_mut() {
                *b = total;
            }
            Tensor::new(t.name.clone(), t.datatype, shape, data.freeze())
        })
        .collect()
}

/// Splits each output of a merged execution into per-request tensors,
/// `rows[i]` batch rows for request `i`.
pub fn split_outputs(outputs: Vec<Tensor>, rows: &[i64]) -> InferResult<Vec<Vec<Tensor>>> {
    let total: i64 = rows.iter().sum();
    let mut per_request: Vec<Vec<Tensor>> = rows
        .iter()
        .map(|_| Vec::with_capacity(outputs.len()))
        .collect();
    for t in outputs {
        if t.shape.first().copied() != Some(total) {
            return Err(InferError::internal(format!(
                "output '{}' has shape {:?}, but the batch has {total} rows",
                t.name, t.shape
            )));
        }
        let items = element_count(&t.shape[1..]).unwrap_or(0);
        let offsets = row_offsets(&t, total as usize, items)?;
        let mut row = 0usize;
        for (i, &r) in rows.iter().enumerate() {
            let r = r as usize;
            let (start, end) = (offsets[row], offsets[row + r]);
            let mut shape = t.shape.clone();
            shape[0] = r as i64;
            per_request[i].push(Tensor::new(
                t.name.clone(),
                t.datatype,
                shape,
                t.data.slice(start..end),
            ));
            row += r;
        }
    }
    Ok(per_request)
}

/// Byte offset where each batch row starts, plus the end.
fn row_offsets(t: &Tensor, rows: usize, items_per_row: usize) -> InferResult<Vec<usize>> {
    match t.datatype.element_size() {
        Some(size) => {
            let row_bytes = items_per_row * size;
            if row_bytes * rows != t.data.len() {
                return Err(InferError::internal(format!(
                    "output '{}' holds {} bytes, expected {}",
                    t.name,
                    t.data.len(),
                    row_bytes * rows
                )));
            }
            Ok((0..=rows).map(|r| r * row_bytes).collect())
        }
        None => {
            debug_assert_eq!(t.datatype, DataType::Bytes);
            let mut offsets = Vec::with_capacity(rows + 1);
            let mut pos = 0usize;
            offsets.push(0);
            let elements = bytes_elements(&t.data)
                .map_err(|e| InferError::internal(format!("output '{}': {e}", t.name)))?;
            let mut in_row = 0usize;
            for e in elements {
                pos += 4 + e.len();
                in_row += 1;
                if in_row == items_per_row {
                    offsets.push(pos);
                    in_row = 0;
                }
            }
            if items_per_row == 0 {
                offsets.resize(rows + 1, 0);
            }
            if offsets.len() != rows + 1 {
                return Err(InferError::internal(format!(
                    "output '{}' has an element count that does not split into {rows} rows",
                    t.name
                )));
            }
            Ok(offsets)
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::types::encode_bytes_elements;

    fn i32_bytes(values: impl IntoIterator<Item = i32>) -> Bytes {
        values
            .into_iter()
            .flat_map(i32::to_le_bytes)
            .collect::<Vec<u8>>()
            .into()
    }

    fn req(rows: i64, base: i32) -> InferRequest {
        let data = i32_bytes((0..rows as i32 * 2).map(|x| x + base));
        InferRequest {
            inputs: vec![Tensor::new("X", DataType::Int32, vec![rows, 2], data)],
            ..Default::default()
        }
    }

    #[test]
    fn merge_then_split_round_trips() {
        let a = req(1, 0);
        let b = req(3, 100);
        assert!(compatible(&a, &b));
        let merged = merge_inputs(&[&a, &b]);
        assert_eq!(merged[0].shape, vec![4, 2]);
        let split = split_outputs(merged, &[1, 3]).unwrap();
        assert_eq!(split[0][0], a.inputs[0]);
        assert_eq!(split[1][0], b.inputs[0]);
    }

    #[test]
    fn different_item_shapes_are_not_compatible() {
        let a = req(1, 0);
        let mut b = req(1, 0);
        b.inputs[0].shape = vec![1, 3];
        assert!(!compatible(&a, &b));
    }

    #[test]
    fn bytes_outputs_split_by_elements() {
        let t = Tensor::new(
            "S",
            DataType::Bytes,
            vec![3, 2],
            encode_bytes_elements(["a", "", "bc", "d", "", "xyz"]),
        );
        let split = split_outputs(vec![t], &[2, 1]).unwrap();
        assert_eq!(
            split[0][0].data,
            encode_bytes_elements(["a", "", "bc", "d"])
        );
        assert_eq!(split[1][0].data, encode_bytes_elements(["", "xyz"]));
        assert_eq!(split[1][0].shape, vec![1, 2]);
    }

    #[test]
    fn wrong_row_count_is_an_error() {
        let t = Tensor::new("X", DataType::Int32, vec![2, 1], i32_bytes([1, 2]));
        assert!(split_outputs(vec![t], &[1, 2]).is_err());
    }
}
