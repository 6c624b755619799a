//! The JSON envelope of an inference request (`id`, `parameters`, each
//! input's name, datatype, shape, parameters and unparsed `data`, the
//! requested outputs), read in one of two ways:
//!
//! - [`read_common`]: one pass over the shape every client sends (strings
//!   without escapes, integer shapes, scalar parameters, known keys once
//!   each). It answers `None` at the first thing outside that
//!   shape, without judging it.
//! - serde_json, for everything else, and for every error: its messages
//!   are the ones clients have always seen.
//!
//! [`read`] tries the first, then the second. Where the first answers, it
//! answers what serde_json would (a property test holds the two to it);
//! it exists because serde's derived visitors spent about a quarter of the
//! shard's instructions on a binary-tensor request to `simple`.

use std::borrow::Cow;

use serde::{Deserialize, Deserializer};
use serde_json::value::RawValue;

use super::{json_string_stop, InputParams, JsonParams, ParamSink};
use crate::types::ParamValue;

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(super) struct RequestJson<'a> {
    #[serde(default)]
    pub id: Option<String>,
    #[serde(default)]
    pub parameters: JsonParams,
    #[serde(borrow)]
    pub inputs: Vec<InputJson<'a>>,
    #[serde(default)]
    pub outputs: Option<Vec<OutputJson>>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(super) struct InputJson<'a> {
    pub name: String,
    /// Borrowed: it is only parsed into a `DataType`.
    #[serde(borrow)]
    pub datatype: Cow<'a, str>,
    pub shape: Vec<i64>,
    #[serde(default)]
    pub parameters: InputParams,
    /// Left as text until the shape has been checked.
    #[serde(default, borrow)]
    pub data: Option<RawData<'a>>,
}

#[derive(Deserialize)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(super) struct OutputJson {
    pub name: String,
    #[serde(default)]
    pub parameters: JsonParams,
}

/// An input's `data` as the JSON text it was sent as (a slice of the body,
/// without the whitespace around it).
#[derive(Clone, Copy)]
#[cfg_attr(test, derive(Debug, PartialEq))]
pub(super) struct RawData<'a>(pub &'a str);

impl<'de: 'a, 'a> Deserialize<'de> for RawData<'a> {
    fn deserialize<D: Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        <&'de RawValue>::deserialize(d).map(|raw| RawData(raw.get()))
    }
}

/// The envelope of `json`, by [`read_common`] where it can, else by
/// serde_json (whose error is the answer to a malformed one).
pub(super) fn read(json: &[u8]) -> Result<RequestJson<'_>, serde_json::Error> {
    match read_common(json) {
        Some(envelope) => Ok(envelope),
        None => serde_json::from_slice(json),
    }
}

/// One pass over an envelope of the common shape; `None` for any other
/// (which may still be valid JSON: serde_json decides).
pub(super) fn read_common(json: &[u8]) -> Option<RequestJson<'_>> {
    // Checked once here, so that strings are slices of it without a check
    // each (serde_json checks each string as it reads it).
    let text = std::str::from_utf8(json).ok()?;
    let mut c = Cursor { text, i: 0 };
    let (mut id, mut parameters, mut inputs, mut outputs) = (None, None, None, None);
    c.object(|c, key| match key {
        "id" => once(&mut id, c.string()?.to_owned()),
        "parameters" => once(&mut parameters, c.params::<JsonParams>()?),
        "inputs" => once(&mut inputs, c.list(Cursor::input)?),
        "outputs" => once(&mut outputs, c.list(Cursor::output)?),
        _ => None,
    })?;
    c.skip_ws();
    (c.i == json.len()).then_some(())?;
    Some(RequestJson {
        id,
        parameters: parameters.unwrap_or_default(),
        inputs: inputs?,
        outputs,
    })
}

/// Sets a field seen for the first time; a repeated one is left to serde
/// (which refuses it).
fn once<T>(slot: &mut Option<T>, value: T) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value);
    Some(())
}

/// Deeper `data` nesting than any tensor has is left to serde, which
/// knows its own recursion limit.
const MAX_DATA_DEPTH: usize = 32;

struct Cursor<'a> {
    text: &'a str,
    i: usize,
}

/// The length of the run of ASCII digits at `s[i..]`.
fn digit_run(s: &[u8], i: usize) -> usize {
    s.get(i..)
        .map_or(0, |r| r.iter().take_while(|b| b.is_ascii_digit()).count())
}

impl<'a> Cursor<'a> {
    fn bytes(&self) -> &'a [u8] {
        self.text.as_bytes()
    }

    fn skip_ws(&mut self) {
        while let Some(b' ' | b'\t' | b'\n' | b'\r') = self.bytes().get(self.i) {
            self.i += 1;
        }
    }

    /// The next byte that is not whitespace, not consumed.
    fn peek(&mut self) -> Option<u8> {
        self.skip_ws();
        self.bytes().get(self.i).copied()
    }

    fn eat(&mut self, byte: u8) -> Option<()> {
        (self.peek()? == byte).then(|| self.i += 1)
    }

    fn literal(&mut self, word: &[u8]) -> Option<()> {
        let end = self.i.checked_add(word.len())?;
        (self.bytes().get(self.i..end)? == word).then(|| self.i = end)
    }

    /// A string without escapes.
    fn string(&mut self) -> Option<&'a str> {
        self.eat(b'"')?;
        let start = self.i;
        let end = json_string_stop(self.bytes(), start)?;
        if self.bytes()[end] != b'"' {
            return None;
        }
        self.i = end + 1;
        // Both ends are at ASCII quotes, so on character boundaries.
        self.text.get(start..end)
    }

    /// An integer that fits an `i64` as serde_json reads it: no fraction
    /// or exponent, no leading zero, and not `-0` (which it reads as a
    /// float).
    fn integer(&mut self) -> Option<i64> {
        self.skip_ws();
        let s = self.bytes();
        let negative = s.get(self.i) == Some(&b'-');
        let start = self.i + usize::from(negative);
        let digits = s.get(start..)?;
        let len = digit_run(s, start);
        // 18 digits cannot overflow an i64.
        if len == 0 || len > 18 || (digits[0] == b'0' && (len > 1 || negative)) {
            return None;
        }
        if let Some(b'.' | b'e' | b'E') = digits.get(len) {
            return None;
        }
        self.i = start + len;
        let value = digits[..len]
            .iter()
            .fold(0i64, |v, d| v * 10 + i64::from(d - b'0'));
        Some(if negative { -value } else { value })
    }

    /// `{` (key `:` value),* `}`, each value read by `field`.
    fn object(&mut self, mut field: impl FnMut(&mut Self, &'a str) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        loop {
            let key = self.string()?;
            self.eat(b':')?;
            field(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    fn list<T>(&mut self, mut item: impl FnMut(&mut Self) -> Option<T>) -> Option<Vec<T>> {
        self.eat(b'[')?;
        let mut out = Vec::new();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(out);
        }
        loop {
            out.push(item(self)?);
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(out);
                }
                _ => return None,
            }
        }
    }

    /// A `parameters` object of strings, booleans and integers (what
    /// `ParamsVisitor` keeps of them, in the same order).
    fn params<S: ParamSink>(&mut self) -> Option<S> {
        let mut sink = S::default();
        self.object(|c, name| {
            let value = match c.peek()? {
                b'"' => ParamValue::String(c.string()?.to_owned()),
                b't' => c.literal(b"true").map(|()| ParamValue::Bool(true))?,
                b'f' => c.literal(b"false").map(|()| ParamValue::Bool(false))?,
                _ => ParamValue::Int(c.integer()?),
            };
            sink.keep(Cow::Borrowed(name), value);
            Some(())
        })?;
        Some(sink)
    }

    fn input(&mut self) -> Option<InputJson<'a>> {
        let (mut name, mut datatype, mut shape, mut parameters, mut data) =
            (None, None, None, None, None);
        self.object(|c, key| match key {
            "name" => once(&mut name, c.string()?.to_owned()),
            "datatype" => once(&mut datatype, c.string()?),
            "shape" => once(&mut shape, c.list(Cursor::integer)?),
            "parameters" => once(&mut parameters, c.params::<InputParams>()?),
            "data" => once(&mut data, c.data()?),
            _ => None,
        })?;
        Some(InputJson {
            name: name?,
            datatype: Cow::Borrowed(datatype?),
            shape: shape?,
            parameters: parameters.unwrap_or_default(),
            data: data.map(RawData),
        })
    }

    fn output(&mut self) -> Option<OutputJson> {
        let (mut name, mut parameters) = (None, None);
        self.object(|c, key| match key {
            "name" => once(&mut name, c.string()?.to_owned()),
            "parameters" => once(&mut parameters, c.params::<JsonParams>()?),
            _ => None,
        })?;
        Some(OutputJson {
            name: name?,
            parameters: parameters.unwrap_or_default(),
        })
    }

    /// An input's `data`: nested arrays of numbers, strings and literals,
    /// checked against JSON's grammar as serde_json's `RawValue` checks it
    /// (the values themselves are read later, by `json_data`). A bare
    /// `null` is left to serde, which reads it as no data.
    fn data(&mut self) -> Option<&'a str> {
        if self.peek()? == b'n' {
            return None;
        }
        let start = self.i;
        let mut depth = 0usize;
        loop {
            match self.peek()? {
                b'[' => {
                    self.i += 1;
                    depth += 1;
                    if depth > MAX_DATA_DEPTH {
                        return None;
                    }
                    if self.peek()? != b']' {
                        continue;
                    }
                    self.i += 1;
                    depth -= 1;
                }
                b'"' => {
                    self.string()?;
                }
                b't' => self.literal(b"true")?,
                b'f' => self.literal(b"false")?,
                b'n' => self.literal(b"null")?,
                _ => self.number()?,
            }
            // After a value: close the arrays it ends, or go on to the next.
            loop {
                if depth == 0 {
                    return self.text.get(start..self.i);
                }
                match self.peek()? {
                    b',' => {
                        self.i += 1;
                        break;
                    }
                    b']' => {
                        self.i += 1;
                        depth -= 1;
                    }
                    _ => return None,
                }
            }
        }
    }

    /// A number by JSON's grammar: `-`? (`0` | [1-9][0-9]*) (`.` [0-9]+)?
    /// ([eE] [+-]? [0-9]+)?
    fn number(&mut self) -> Option<()> {
        let s = self.bytes();
        let mut i = self.i;
        let digits = |i: &mut usize| {
            let n = digit_run(s, *i);
            *i += n;
            n
        };
        if s.get(i) == Some(&b'-') {
            i += 1;
        }
        match s.get(i)? {
            b'0' => i += 1,
            b'1'..=b'9' => {
                digits(&mut i);
            }
            _ => return None,
        }
        if s.get(i) == Some(&b'.') {
            i += 1;
            (digits(&mut i) > 0).then_some(())?;
        }
        if let Some(b'e' | b'E') = s.get(i) {
            i += 1;
            if let Some(b'+' | b'-') = s.get(i) {
                i += 1;
            }
            (digits(&mut i) > 0).then_some(())?;
        }
        self.i = i;
        Some(())
    }
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn serde_reads(json: &[u8]) -> Result<RequestJson<'_>, String> {
        serde_json::from_slice(json).map_err(|e| e.to_string())
    }

    /// The bodies real clients send are read by the one pass (else it
    /// would be dead weight), and as serde reads them.
    #[test]
    fn client_envelopes_take_the_common_path() {
        let bodies: [&str; 6] = [
            // shardserve-bench and perf_analyzer, binary tensors
            r#"{"inputs":[{"name":"INPUT0","shape":[1,16],"datatype":"INT32","parameters":{"binary_data_size":64}},{"name":"INPUT1","shape":[1,16],"datatype":"INT32","parameters":{"binary_data_size":64}}],"outputs":[{"name":"OUTPUT0","parameters":{"binary_data":true}},{"name":"OUTPUT1","parameters":{"binary_data":true}}]}"#,
            // tritonclient's JSON tensors, with an id and request parameters
            r#"{"id": "7", "parameters": {"sequence_id": 12, "sequence_start": true, "priority": 0}, "inputs": [{"name": "INPUT0", "shape": [1, 4], "datatype": "FP32", "data": [1.5, -2e3, 0, 4.25]}], "outputs": [{"name": "OUTPUT0", "parameters": {"binary_data": false}}]}"#,
            // nested and BYTES data, no outputs
            "{\n  \"inputs\": [ {\"name\":\"t\", \"datatype\":\"BYTES\", \"shape\":[2,1], \"data\":[[\"a b\"], [\"\"]]},\n {\"name\":\"b\",\"datatype\":\"BOOL\",\"shape\":[0],\"data\":[]} ]\n}\n",
            // shared memory
            r#"{"inputs":[{"name":"I","datatype":"UINT8","shape":[3],"parameters":{"shared_memory_region":"r","shared_memory_byte_size":3,"shared_memory_offset":0}}]}"#,
            r#"{"inputs":[]}"#,
            // names beyond ASCII
            r#"{"inputs":[{"name":"entrée","datatype":"BYTES","shape":[1],"data":["ü"]}]}"#,
        ];
        for body in bodies {
            let fast = read_common(body.as_bytes()).unwrap_or_else(|| panic!("not read: {body}"));
            assert_eq!(Ok(fast), serde_reads(body.as_bytes()), "{body}");
        }
    }

    #[test]
    fn what_the_pass_leaves_to_serde() {
        for body in [
            r#"{"inputs":[{"name":"a\"b","datatype":"INT32","shape":[1]}]}"#, // escape
            "{\"inputs\":[{\"name\":\"\t\",\"datatype\":\"INT32\",\"shape\":[1]}]}", // control character
            r#"{"inputs":[],"inputs":[]}"#,                                          // repeated key
            r#"{"inputs":[],"extra":1}"#,                                            // unknown key
            r#"{"inputs":[{"name":"a","datatype":"INT32","shape":[-0]}]}"#,          // -0
            r#"{"inputs":[{"name":"a","datatype":"INT32","shape":[1.0]}]}"#,         // float shape
            r#"{"inputs":[{"name":"a","datatype":"FP32","shape":[1],"data":null}]}"#,
            r#"{"parameters":{"x":0.5},"inputs":[]}"#, // double
            r#"{"inputs":[]} x"#,                      // trailing text
            r#"{"inputs":[{"name":"a","datatype":"INT32","shape":[1],"data":[01]}]}"#,
            r#"{"id":"x"}"#, // no inputs
        ] {
            assert!(read_common(body.as_bytes()).is_none(), "{body}");
        }
    }

    /// A JSON scalar (or not quite), as a parameter value or element.
    fn scalar() -> impl Strategy<Value = String> {
        prop::sample::select(vec![
            "1",
            "-7",
            "0",
            "-0",
            "01",
            "9223372036854775807",
            "123456789012345678",
            "2.5",
            "1e3",
            "1.",
            "true",
            "false",
            "null",
            "\"s\"",
            "\"a\\\"b\"",
            "\"\u{e9}\"",
            "[]",
            "{}",
        ])
        .prop_map(str::to_string)
    }

    /// A `parameters` object of names the server reads and one it does not.
    fn params() -> impl Strategy<Value = String> {
        let name = prop::sample::select(vec![
            "binary_data_size",
            "binary_data",
            "shared_memory_region",
            "shared_memory_offset",
            "p",
        ]);
        prop::collection::vec((name, scalar()), 0..4).prop_map(|kv| {
            let kv: Vec<String> = kv.iter().map(|(k, v)| format!("\"{k}\":{v}")).collect();
            format!("{{{}}}", kv.join(","))
        })
    }

    /// Field names of an object: mostly the required ones and some of the
    /// optional ones, in any order; sometimes a repeated or unknown one.
    fn keys(
        required: &'static [&'static str],
        optional: &'static [&'static str],
    ) -> impl Strategy<Value = Vec<&'static str>> {
        let mut all = required.to_vec();
        all.extend_from_slice(optional);
        all.extend_from_slice(&[required[0], "x"]);
        let n = all.len();
        prop_oneof![
            3 => prop::sample::subsequence(optional.to_vec(), 0..=optional.len()).prop_map(
                move |mut v| {
                    v.extend_from_slice(required);
                    v
                }
            ),
            1 => prop::sample::subsequence(all, 0..=n),
        ]
        .prop_shuffle()
    }

    fn input() -> impl Strategy<Value = String> {
        let data = prop::collection::vec(scalar(), 0..4).prop_map(|v| {
            if v.len() == 3 {
                format!("[[{}], []]", v.join(" , "))
            } else {
                format!("[{}]", v.join(","))
            }
        });
        let dims = prop::collection::vec(scalar(), 0..3).prop_map(|v| format!("[{}]", v.join(",")));
        let datatype = prop::sample::select(vec!["\"INT32\"", "\"FP32\"", "\"BYTES\"", "7"]);
        (
            keys(&["name", "datatype", "shape"], &["parameters", "data"]),
            dims,
            params(),
            data,
            datatype,
        )
            .prop_map(|(keys, dims, params, data, datatype)| {
                let fields: Vec<String> = keys
                    .iter()
                    .map(|k| match *k {
                        "name" => "\"name\":\"IN\"".to_string(),
                        "datatype" => format!("\"datatype\": {datatype}"),
                        "shape" => format!("\"shape\":{dims}"),
                        "parameters" => format!("\"parameters\":{params}"),
                        "data" => format!("\"data\" : {data}"),
                        other => format!("\"{other}\":1"),
                    })
                    .collect();
                format!("{{{}}}", fields.join(","))
            })
    }

    fn output() -> impl Strategy<Value = String> {
        (keys(&["name"], &["parameters"]), params()).prop_map(|(keys, params)| {
            let fields: Vec<String> = keys
                .iter()
                .map(|k| match *k {
                    "name" => "\"name\":\"OUT\"".to_string(),
                    "parameters" => format!("\"parameters\":{params}"),
                    other => format!("\"{other}\":1"),
                })
                .collect();
            format!("{{{}}}", fields.join(","))
        })
    }

    fn envelope() -> impl Strategy<Value = String> {
        (
            keys(&["inputs"], &["id", "parameters", "outputs"]),
            prop::collection::vec(input(), 0..3),
            prop::collection::vec(output(), 0..3),
            params(),
            prop::sample::select(vec!["", " ", "\n\t"]),
        )
            .prop_map(|(keys, inputs, outputs, params, ws)| {
                let fields: Vec<String> = keys
                    .iter()
                    .map(|k| match *k {
                        "id" => "\"id\":\"r1\"".to_string(),
                        "parameters" => format!("\"parameters\":{params}"),
                        "outputs" => format!("\"outputs\":[{}]", outputs.join(",")),
                        "inputs" => format!("\"inputs\":[{}]", inputs.join(&format!(",{ws}"))),
                        other => format!("\"{other}\":1"),
                    })
                    .collect();
                format!("{ws}{{{ws}{}{ws}}}{ws}", fields.join(&format!(",{ws}")))
            })
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(4000))]

        /// Where the one pass answers, serde answers the same; cut and
        /// altered bodies included.
        #[test]
        fn the_pass_agrees_with_serde(
            body in envelope(),
            cut in any::<prop::sample::Index>(),
            at in any::<prop::sample::Index>(),
            byte in prop::sample::select(b"\"\\,:[]{}0-.e \x01\xc3x".to_vec()),
            how in 0..3u8,
        ) {
            let mut bytes = body.into_bytes();
            match how {
                1 => bytes.truncate(cut.index(bytes.len() + 1)),
                2 if !bytes.is_empty() => {
                    let i = at.index(bytes.len());
                    bytes[i] = byte;
                }
                _ => {}
            }
            if let Some(fast) = read_common(&bytes) {
                prop_assert_eq!(Ok(fast), serde_reads(&bytes));
            }
        }
    }
}
