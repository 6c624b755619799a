//! What the model sees in a sequence execution: each request's inputs in
//! its slot's row (zeros for not-ready rows), the control tensors (START,
//! END, READY, CORRID) for every row, and each implicit state's input;
//! and, after the execution, each state's output kept for the slot's next
//! request. Runs where the instance executes (owner shard or its compute
//! worker), so state never leaves the instance that owns the slot.

use bytes::{Bytes, BytesMut};

use super::{
    correlation::CorrelationId,
    spec::{FlagControl, SequenceSpec, StateSpec},
};
use crate::types::{
    bytes_elements, element_count, show_shape, DataType, InferError, InferRequest, InferResult,
    Tensor,
};

/// One row of a sequence execution, as the executor needs it.
#[derive(Debug, Clone)]
pub struct RowControl {
    /// Index into the batch's jobs; `None`: a not-ready padding row.
    pub job: Option<usize>,
    pub slot: usize,
    pub start: bool,
    pub end: bool,
    pub id: Option<CorrelationId>,
}

/// The implicit states of one instance's slots: `[slot][state]`, one item
/// (no batch dimension) each.
#[derive(Debug, Default)]
pub struct SlotStates {
    slots: Vec<Vec<Option<Tensor>>>,
}

impl SlotStates {
    pub fn new(spec: &SequenceSpec) -> Self {
        if spec.states.is_empty() {
            return Self::default();
        }
        Self {
            slots: (0..spec.slots_per_instance)
                .map(|_| vec![None; spec.states.len()])
                .collect(),
        }
    }

    /// Keeps `value` (named after a state's output) as `slot`'s state for
    /// its next request; `None` forgets it (the sequence ended). Fails for
    /// a name that is no state output or a tensor of the wrong type.
    pub fn keep(
        &mut self,
        spec: &SequenceSpec,
        slot: usize,
        value: Tensor,
        ended: bool,
    ) -> InferResult<()> {
        let (index, state) = spec
            .states
            .iter()
            .enumerate()
            .find(|(_, s)| s.output == value.name)
            .ok_or_else(|| {
                InferError::internal(format!(
                    "'{}' is not an implicit state output of this model",
                    value.name
                ))
            })?;
        if value.datatype != state.datatype {
            return Err(InferError::internal(format!(
                "implicit state output '{}' is {}, the configuration says {}",
                state.output, value.datatype, state.datatype
            )));
        }
        self.set(slot, index, (!ended).then_some(value));
        Ok(())
    }

    /// Forgets every state of `slot` (its sequence ended).
    pub fn forget(&mut self, slot: usize) {
        if let Some(cells) = self.slots.get_mut(slot) {
            cells.iter_mut().for_each(|c| *c = None);
        }
    }

    fn get(&self, slot: usize, state: usize) -> Option<&Tensor> {
        self.slots.get(slot)?.get(state)?.as_ref()
    }

    fn set(&mut self, slot: usize, state: usize, value: Option<Tensor>) {
        if let Some(cell) = self.slots.get_mut(slot).and_then(|s| s.get_mut(state)) {
            *cell = value;
        }
    }
}

/// The inputs of one execution of `rows` (`requests[i]` is job `i`).
pub fn build_inputs(
    spec: &SequenceSpec,
    rows: &[RowControl],
    requests: &[&InferRequest],
    states: &SlotStates,
) -> InferResult<Vec<Tensor>> {
    let first = requests
        .first()
        .ok_or_else(|| InferError::internal("a sequence execution without a request"))?;
    let n = rows.len();
    let mut inputs = Vec::with_capacity(first.inputs.len() + 4 + spec.states.len());
    if !spec.batched {
        inputs.extend(first.inputs.iter().cloned());
    } else {
        for t in &first.inputs {
            inputs.push(stack(
                &t.name,
                t.datatype,
                &t.shape[1.min(t.shape.len())..],
                rows,
                |job| requests.get(job).and_then(|r| r.input(&t.name)),
            )?);
        }
    }
    let shape = if spec.batched {
        vec![n as i64, 1]
    } else {
        vec![1]
    };
    let c = &spec.controls;
    let mut flag = |control: &Option<FlagControl>, on: &dyn Fn(&RowControl) -> bool| {
        if let Some(f) = control {
            let mut data = Vec::with_capacity(n * 4);
            for row in rows {
                f.values.push(on(row), &mut data);
            }
            inputs.push(Tensor::new(
                f.name.clone(),
                f.values.datatype(),
                shape.clone(),
                Bytes::from(data),
            ));
        }
    };
    flag(&c.start, &|r| r.job.is_some() && r.start);
    flag(&c.end, &|r| r.job.is_some() && r.end);
    flag(&c.ready, &|r| r.job.is_some());
    if let Some(corrid) = &c.corrid {
        inputs.push(Tensor::new(
            corrid.name.clone(),
            corrid.datatype,
            shape.clone(),
            corrid_data(corrid.datatype, rows)?,
        ));
    }
    for (index, state) in spec.states.iter().enumerate() {
        inputs.push(state_input(spec, state, index, rows, states)?);
    }
    Ok(inputs)
}

/// Stacks one tensor per row along a new batch dimension; rows without a
/// request get zeros (for BYTES, empty strings) of the same item shape.
fn stack<'a>(
    name: &str,
    datatype: DataType,
    item_shape: &[i64],
    rows: &[RowControl],
    tensor_of: impl Fn(usize) -> Option<&'a Tensor>,
) -> InferResult<Tensor> {
    let elements = element_count(item_shape)
        .ok_or_else(|| InferError::invalid(format!("input '{name}' has an invalid shape")))?;
    let zero_item = zero_item(datatype, elements);
    let mut data = BytesMut::new();
    let mut total_rows = 0i64;
    for row in rows {
        match row.job.and_then(&tensor_of) {
            Some(t) => {
                let rows_here = t.shape.first().copied().unwrap_or(1);
                if t.shape.get(1..) != Some(item_shape) {
                    return Err(InferError::invalid(format!(
                        "input '{name}' shape {} differs from the other sequences in its batch",
                        show_shape(&t.shape)
                    )));
                }
                total_rows += rows_here;
                data.extend_from_slice(&t.data);
            }
            None => {
                total_rows += 1;
                data.extend_from_slice(&zero_item);
            }
        }
    }
    let mut shape = Vec::with_capacity(item_shape.len() + 1);
    shape.push(total_rows);
    shape.extend_from_slice(item_shape);
    Ok(Tensor::new(
        name.to_string(),
        datatype,
        shape,
        data.freeze(),
    ))
}

fn zero_item(datatype: DataType, elements: usize) -> Vec<u8> {
    // A zero BYTES element is a 4-byte zero length (an empty string).
    vec![0u8; elements * datatype.element_size().unwrap_or(4)]
}

fn corrid_data(datatype: DataType, rows: &[RowControl]) -> InferResult<Bytes> {
    let mut data = Vec::with_capacity(rows.len() * 8);
    for row in rows {
        let id = row.id.as_ref().filter(|_| row.job.is_some());
        match datatype {
            DataType::Bytes => {
                let text = match id {
                    Some(CorrelationId::Str(s)) => s.to_string(),
                    Some(CorrelationId::Uint(v)) => v.to_string(),
                    None => String::new(),
                };
                data.extend_from_slice(&(text.len() as u32).to_le_bytes());
                data.extend_from_slice(text.as_bytes());
            }
            _ => {
                let v = match id {
                    Some(CorrelationId::Uint(v)) => *v,
                    None => 0,
                    Some(CorrelationId::Str(_)) => {
                        return Err(InferError::internal(
                            "a string correlation id reached an integer CORRID control",
                        ))
                    }
                };
                // Narrower types keep the low bits, two's complement.
                match datatype {
                    DataType::Uint64 | DataType::Int64 => data.extend_from_slice(&v.to_le_bytes()),
                    _ => data.extend_from_slice(&(v as u32).to_le_bytes()),
                }
            }
        }
    }
    Ok(Bytes::from(data))
}

fn state_input(
    spec: &SequenceSpec,
    state: &StateSpec,
    index: usize,
    rows: &[RowControl],
    states: &SlotStates,
) -> InferResult<Tensor> {
    // Each real row's state: its slot's last output, or the initial state
    // when the sequence starts (or the slot has none yet).
    let item = |row: &RowControl| -> Option<(Vec<i64>, Bytes)> {
        row.job?;
        match states.get(row.slot, index) {
            Some(t) if !row.start => Some((t.shape.clone(), t.data.clone())),
            _ => Some((state.initial.dims.clone(), state.initial.data.clone())),
        }
    };
    let items: Vec<Option<(Vec<i64>, Bytes)>> = rows.iter().map(item).collect();
    let dims = items
        .iter()
        .flatten()
        .map(|(d, _)| d.clone())
        .next()
        .unwrap_or_else(|| state.initial.dims.clone());
    if let Some((other, _)) = items.iter().flatten().find(|(d, _)| *d != dims) {
        return Err(InferError::invalid(format!(
            "implicit state '{}' has shape {} in one sequence and {} in another of the same batch; \
             sequences with different state shapes cannot execute together",
            state.input,
            show_shape(&dims),
            show_shape(other)
        )));
    }
    if !spec.batched {
        let (d, data) = items
            .into_iter()
            .flatten()
            .next()
            .ok_or_else(|| InferError::internal("a sequence execution without a request"))?;
        return Ok(Tensor::new(state.input.clone(), state.datatype, d, data));
    }
    let elements = element_count(&dims).unwrap_or(0);
    let zero = zero_item(state.datatype, elements);
    let mut data = BytesMut::new();
    for item in &items {
        match item {
            Some((_, d)) => data.extend_from_slice(d),
            None => data.extend_from_slice(&zero),
        }
    }
    let mut shape = vec![rows.len() as i64];
    shape.extend_from_slice(&dims);
    Ok(Tensor::new(
        state.input.clone(),
        state.datatype,
        shape,
        data.freeze(),
    ))
}

/// After an execution: keeps each ready row's output state for its slot
/// (forgotten at the sequence's END). Fails when the model did not
/// produce a state output or produced one of the wrong type or size.
pub fn absorb_states(
    spec: &SequenceSpec,
    rows: &[RowControl],
    outputs: &[Tensor],
    states: &mut SlotStates,
) -> InferResult<()> {
    for (index, state) in spec.states.iter().enumerate() {
        let t = outputs
            .iter()
            .find(|t| t.name == state.output)
            .ok_or_else(|| {
                InferError::internal(format!(
                    "the model did not produce the implicit state output '{}'",
                    state.output
                ))
            })?;
        if t.datatype != state.datatype {
            return Err(InferError::internal(format!(
                "implicit state output '{}' is {}, the configuration says {}",
                state.output, t.datatype, state.datatype
            )));
        }
        let items = split_rows(t, rows.len(), spec.batched)?;
        for (row, (shape, data)) in rows.iter().zip(items) {
            if row.job.is_none() {
                continue;
            }
            let value =
                (!row.end).then(|| Tensor::new(state.output.clone(), state.datatype, shape, data));
            states.set(row.slot, index, value);
        }
    }
    Ok(())
}

/// Splits a batched output into `n` per-row items (shape without the
/// batch dimension).
fn split_rows(t: &Tensor, n: usize, batched: bool) -> InferResult<Vec<(Vec<i64>, Bytes)>> {
    if !batched {
        return Ok(vec![(t.shape.clone(), t.data.clone())]);
    }
    let bad = || {
        InferError::internal(format!(
            "implicit state output '{}' has shape {} for a batch of {n}",
            t.name,
            show_shape(&t.shape)
        ))
    };
    if t.shape.first().copied() != Some(n as i64) {
        return Err(bad());
    }
    let item_shape = t.shape[1..].to_vec();
    let per_row = element_count(&item_shape).ok_or_else(bad)?;
    let mut items = Vec::with_capacity(n);
    match t.datatype.element_size() {
        Some(size) => {
            let row_bytes = per_row * size;
            if t.data.len() != row_bytes * n {
                return Err(bad());
            }
            for i in 0..n {
                items.push((
                    item_shape.clone(),
                    t.data.slice(i * row_bytes..(i + 1) * row_bytes),
                ));
            }
        }
        None => {
            let elements: Vec<&[u8]> = bytes_elements(&t.data).map_err(|_| bad())?.collect();
            if elements.len() != per_row * n {
                return Err(bad());
            }
            let mut offset = 0usize;
            for chunk in elements.chunks(per_row.max(1)).take(n) {
                let len: usize = chunk.iter().map(|e| 4 + e.len()).sum();
                items.push((item_shape.clone(), t.data.slice(offset..offset + len)));
                offset += len;
            }
            while items.len() < n {
                items.push((item_shape.clone(), Bytes::new()));
            }
        }
    }
    Ok(items)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;
    use crate::config::parse_model_config;

    fn spec(extra: &str) -> SequenceSpec {
        let c = parse_model_config(&format!(
            r#"name: "m" max_batch_size: 4
            input [ {{ name: "INPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
            output [ {{ name: "OUTPUT" data_type: TYPE_INT32 dims: [ 1 ] }} ]
            sequence_batching {{ control_input [
              {{ name: "START" control [ {{ kind: CONTROL_SEQUENCE_START int32_false_true: [ 0, 1 ] }} ] }},
              {{ name: "END" control [ {{ kind: CONTROL_SEQUENCE_END fp32_false_true: [ 0, 1 ] }} ] }},
              {{ name: "READY" control [ {{ kind: CONTROL_SEQUENCE_READY bool_false_true: [ false, true ] }} ] }},
              {{ name: "CORRID" control [ {{ kind: CONTROL_SEQUENCE_CORRID data_type: TYPE_INT32 }} ] }} ]
              {extra} }}"#
        ))
        .unwrap();
        SequenceSpec::from_config(&c, Path::new("/"))
            .unwrap()
            .unwrap()
    }

    fn request(v: i32) -> InferRequest {
        InferRequest {
            inputs: vec![Tensor::new(
                "INPUT",
                DataType::Int32,
                vec![1, 1],
                Bytes::copy_from_slice(&v.to_le_bytes()),
            )],
            ..Default::default()
        }
    }

    fn i32s(t: &Tensor) -> Vec<i32> {
        t.data
            .chunks(4)
            .map(|c| i32::from_le_bytes(c.try_into().unwrap()))
            .collect()
    }

    fn row(job: Option<usize>, slot: usize, start: bool, end: bool, id: u64) -> RowControl {
        RowControl {
            job,
            slot,
            start,
            end,
            id: Some(CorrelationId::Uint(id)),
        }
    }

    #[test]
    fn controls_for_every_row_including_padding() {
        let s = spec("");
        let (a, b) = (request(5), request(-7));
        let rows = [
            row(Some(0), 0, true, false, 1),
            row(None, 1, false, false, 0),
            row(Some(1), 2, false, true, (1 << 32) + 9),
        ];
        let inputs = build_inputs(&s, &rows, &[&a, &b], &SlotStates::new(&s)).unwrap();
        let by = |n: &str| inputs.iter().find(|t| t.name == n).unwrap();
        assert_eq!(by("INPUT").shape, vec![3, 1]);
        assert_eq!(i32s(by("INPUT")), vec![5, 0, -7]);
        assert_eq!(i32s(by("START")), vec![1, 0, 0]);
        assert_eq!(
            by("END").data.as_ref(),
            [0f32, 0.0, 1.0]
                .iter()
                .flat_map(|f| f.to_le_bytes())
                .collect::<Vec<_>>()
        );
        assert_eq!(by("READY").data.as_ref(), &[1, 0, 1]);
        assert_eq!(by("READY").datatype, DataType::Bool);
        assert_eq!(i32s(by("CORRID")), vec![1, 0, 9]);
        assert_eq!(by("CORRID").shape, vec![3, 1]);
    }

    #[test]
    fn state_flows_from_output_to_next_input_per_slot() {
        let s = spec(
            r#"state [ { input_name: "IS" output_name: "OS" data_type: TYPE_INT32 dims: [ 1 ] } ]"#,
        );
        let mut states = SlotStates::new(&s);
        let a = request(1);
        let rows = [
            row(Some(0), 0, true, false, 1),
            row(None, 1, false, false, 0),
        ];
        let inputs = build_inputs(&s, &rows, &[&a], &states).unwrap();
        let is = inputs.iter().find(|t| t.name == "IS").unwrap();
        assert_eq!(i32s(is), vec![0, 0]);
        let out = Tensor::new(
            "OS",
            DataType::Int32,
            vec![2, 1],
            Bytes::from(
                [41i32, 99]
                    .iter()
                    .flat_map(|v| v.to_le_bytes())
                    .collect::<Vec<_>>(),
            ),
        );
        absorb_states(&s, &rows, &[out], &mut states).unwrap();
        let rows = [row(Some(0), 0, false, true, 1)];
        let inputs = build_inputs(&s, &rows, &[&a], &states).unwrap();
        assert_eq!(
            i32s(inputs.iter().find(|t| t.name == "IS").unwrap()),
            vec![41]
        );
        // Padding rows never store state; END forgets it.
        let out = Tensor::new(
            "OS",
            DataType::Int32,
            vec![1, 1],
            Bytes::from(7i32.to_le_bytes().to_vec()),
        );
        absorb_states(&s, &rows, &[out], &mut states).unwrap();
        assert!(states.get(0, 0).is_none());
        assert!(states.get(1, 0).is_none());
        let missing = absorb_states(&s, &rows, &[], &mut states).unwrap_err();
        assert!(missing.message.contains("'OS'"), "{}", missing.message);
    }
}
