//! A `ModelInferRequest` read straight from its wire bytes into an
//! [`InferRequest`], for the plain shape nearly every client sends: names,
//! datatypes and shapes, one raw content per input, requested outputs by
//! name, request parameters (a sequence's id and flags, a priority, a
//! timeout, a stream's final-response flag), and no input or output
//! parameters, typed contents or shared memory.
//!
//! prost's decode and the conversion after it were about 13 % of the
//! shard's instructions for `simple` over gRPC (callgrind,
//! `scripts/bench_instructions.sh`): a generic merge per field, a
//! `Vec<InferInputTensor>` and a `String` per datatype that the conversion
//! drops again. Here each field is read once into what the request keeps.
//!
//! Anything else, and anything this reader is not sure of (a field it does
//! not take, a bad varint or length, invalid UTF-8, a datatype, shape or
//! raw size the conversion would refuse), answers `None` and the caller
//! decodes the same bytes with prost and converts as before. So every
//! error, and every request with more than the plain fields, keeps its
//! exact text and path; the unit tests hold this reader to prost plus the
//! conversion on generated and on damaged messages.

use bytes::Bytes;

use super::codec::check_raw;
use crate::types::{
    element_count, DataType, InferRequest, ParamValue, Parameters, RequestedOutput, Tensor,
};

/// Protobuf wire types this reader meets.
const VARINT: u64 = 0;
const I64: u64 = 1;
const LEN: u64 = 2;

/// The request, when `message` holds only the plain fields and the
/// conversion would take it as it is; `None` sends the caller to prost.
pub(super) fn decode_plain(message: &Bytes) -> Option<InferRequest> {
    let mut r = Reader::new(message);
    let mut model_name = String::new();
    let mut model_version = String::new();
    let mut id = String::new();
    // Four is what a first push would reserve; a plain request always has
    // an input, and building at that size skips the growth path.
    let mut inputs: Vec<PlainInput> = Vec::with_capacity(4);
    let mut outputs = Vec::new();
    let mut raw: Vec<Bytes> = Vec::with_capacity(4);
    let mut parameters = Parameters::new();
    while !r.done() {
        let (field, wire) = r.key()?;
        if wire != LEN {
            return None;
        }
        let (start, end) = r.len_delimited()?;
        let body = &message[start..end];
        match field {
            // Singular strings: the last occurrence wins, as in prost.
            1 => model_name = utf8(body)?,
            2 => model_version = utf8(body)?,
            3 => id = utf8(body)?,
            // Map entries: a later one with the same key replaces it.
            4 => {
                let (key, value) = parameter(body)?;
                parameters.insert(key, value);
            }
            5 => inputs.push(PlainInput::read(body)?),
            6 => outputs.push(RequestedOutput {
                name: output_name(body)?,
                parameters: Default::default(),
            }),
            7 => raw.push(message.slice(start..end)),
            _ => return None,
        }
    }
    if super::service::check_model_name(&model_name).is_err()
        || raw.is_empty()
        || raw.len() != inputs.len()
    {
        return None;
    }
    let mut tensors = Vec::with_capacity(inputs.len());
    for (input, data) in inputs.into_iter().zip(raw) {
        let datatype = DataType::from_wire(input.datatype)?;
        if input.shape.iter().any(|&d| d < 0) {
            return None;
        }
        let count = element_count(&input.shape)?;
        check_raw(datatype, &data, count).ok()?;
        tensors.push(Tensor {
            name: input.name,
            datatype,
            shape: input.shape,
            data,
        });
    }
    Some(InferRequest {
        model_name,
        model_version,
        id,
        inputs: tensors,
        outputs,
        parameters,
        trace: Default::default(),
    })
}

/// One entry of the request's parameter map: its key (prost leaves out an
/// empty one) and a value of exactly one kind (an entry without a value,
/// or a value with none or several kinds, goes to prost).
fn parameter(body: &[u8]) -> Option<(String, ParamValue)> {
    let mut r = Reader::new(body);
    let mut key = None;
    let mut value = None;
    while !r.done() {
        match r.key()? {
            (1, LEN) if key.is_none() => key = Some(utf8(r.bytes()?)?),
            (2, LEN) if value.is_none() => value = Some(parameter_value(r.bytes()?)?),
            _ => return None,
        }
    }
    Some((key.unwrap_or_default(), value?))
}

/// An `InferParameter` holding one of its choices once.
fn parameter_value(body: &[u8]) -> Option<ParamValue> {
    let mut r = Reader::new(body);
    let value = match r.key()? {
        (1, VARINT) => ParamValue::Bool(r.varint()? != 0),
        (2, VARINT) => ParamValue::Int(r.varint()? as i64),
        (3, LEN) => ParamValue::String(utf8(r.bytes()?)?),
        (4, I64) => ParamValue::Double(f64::from_le_bytes(r.fixed64()?)),
        (5, VARINT) => ParamValue::Uint(r.varint()?),
        _ => return None,
    };
    r.done().then_some(value)
}

/// An input's plain fields; its datatype stays borrowed from the message.
struct PlainInput<'a> {
    name: String,
    datatype: &'a str,
    shape: Vec<i64>,
}

impl<'a> PlainInput<'a> {
    fn read(body: &'a [u8]) -> Option<Self> {
        let mut r = Reader::new(body);
        let mut name = String::new();
        let mut datatype = "";
        let mut shape = Vec::new();
        while !r.done() {
            match r.key()? {
                (1, LEN) => name = utf8(r.bytes()?)?,
                (2, LEN) => datatype = text(r.bytes()?)?,
                // Repeated int64, packed or not; occurrences append.
                (3, LEN) => {
                    let bytes = r.bytes()?;
                    // One varint ends at each byte below 0x80.
                    shape.reserve(bytes.iter().filter(|&&b| b < 0x80).count());
                    let mut packed = Reader::new(bytes);
                    while !packed.done() {
                        shape.push(packed.varint()? as i64);
                    }
                }
                (3, VARINT) => shape.push(r.varint()? as i64),
                _ => return None,
            }
        }
        Some(Self {
            name,
            datatype,
            shape,
        })
    }
}

/// A requested output with a name only.
fn output_name(body: &[u8]) -> Option<String> {
    let mut r = Reader::new(body);
    let mut name = String::new();
    while !r.done() {
        match r.key()? {
            (1, LEN) => name = utf8(r.bytes()?)?,
            _ => return None,
        }
    }
    Some(name)
}

fn utf8(bytes: &[u8]) -> Option<String> {
    text(bytes).map(str::to_owned)
}

/// `bytes` as text if they are UTF-8. Names, versions and datatypes are
/// short and nearly always ASCII, which `is_ascii` confirms a word at a
/// time; the general validator costs some 85 instructions a call on them
/// (callgrind, seven calls in each `simple` request).
fn text(bytes: &[u8]) -> Option<&str> {
    if bytes.is_ascii() {
        // SAFETY: a sequence of ASCII bytes is valid UTF-8.
        Some(unsafe { std::str::from_utf8_unchecked(bytes) })
    } else {
        std::str::from_utf8(bytes).ok()
    }
}

/// A cursor over protobuf bytes; every read checks its bounds.
struct Reader<'a> {
    buf: &'a [u8],
    at: usize,
}

impl<'a> Reader<'a> {
    fn new(buf: &'a [u8]) -> Self {
        Self { buf, at: 0 }
    }

    fn done(&self) -> bool {
        self.at >= self.buf.len()
    }

    /// A base-128 varint of at most ten bytes, the tenth at most 1 (what
    /// prost accepts). Keys, lengths and small shapes are one byte, read
    /// here inline; longer ones take the loop.
    #[inline]
    fn varint(&mut self) -> Option<u64> {
        let byte = *self.buf.get(self.at)?;
        if byte < 0x80 {
            self.at += 1;
            return Some(u64::from(byte));
        }
        self.varint_long()
    }

    #[inline(never)]
    fn varint_long(&mut self) -> Option<u64> {
        let mut value = 0u64;
        for i in 0..10 {
            let byte = *self.buf.get(self.at)?;
            self.at += 1;
            if i == 9 && byte > 1 {
                return None;
            }
            value |= u64::from(byte & 0x7f) << (7 * i);
            if byte < 0x80 {
                return Some(value);
            }
        }
        None
    }

    /// A field's number and wire type; field 0 is invalid.
    fn key(&mut self) -> Option<(u64, u64)> {
        let key = self.varint()?;
        if key > u64::from(u32::MAX) || key >> 3 == 0 {
            return None;
        }
        Some((key >> 3, key & 7))
    }

    /// The bounds of a length-delimited field's bytes, stepped over.
    fn len_delimited(&mut self) -> Option<(usize, usize)> {
        let len = usize::try_from(self.varint()?).ok()?;
        let start = self.at;
        let end = start.checked_add(len).filter(|&e| e <= self.buf.len())?;
        self.at = end;
        Some((start, end))
    }

    fn fixed64(&mut self) -> Option<[u8; 8]> {
        let end = self.at.checked_add(8)?;
        let bytes = self.buf.get(self.at..end)?.try_into().ok()?;
        self.at = end;
        Some(bytes)
    }

    fn bytes(&mut self) -> Option<&'a [u8]> {
        let (start, end) = self.len_delimited()?;
        Some(&self.buf[start..end])
    }
}

#[cfg(test)]
mod tests;
