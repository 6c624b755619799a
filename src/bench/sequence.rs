//! Sequence (stateful) load as perf_analyzer generates it for models with
//! Triton's sequence batcher: every request carries a correlation id and
//! start/end flags, ids are unique among live sequences, lengths vary
//! ±`--sequence-length-variation`% around `--sequence-length`.
//!
//! Requests stay pre-encoded: each body is split once into a template, and
//! a send only writes the few bytes that carry the id and the flags in
//! front of it (`encode`), so a sequence request costs one small buffer
//! more than a plain one, not a re-encode of its tensors.

use std::collections::HashSet;

use bytes::{BufMut, Bytes, BytesMut};

use super::stats::SplitMix64;

/// The sequence flags, resolved against the model.
#[derive(Debug, Clone, PartialEq)]
pub struct SequenceOptions {
    /// First correlation id (never 0: 0 means "no sequence" to Triton).
    pub start_id: u64,
    /// How many ids `[start_id, start_id + id_range)` holds.
    pub id_range: u64,
    /// Base requests per sequence.
    pub length: u64,
    /// ± percent around `length`.
    pub variation_percent: f64,
    /// The model's CONTROL_SEQUENCE_CORRID is TYPE_STRING: ids go out as
    /// decimal strings (Triton rejects a number for a string correlation id).
    pub string_ids: bool,
    /// Every sequence has this many requests (an --input-data file's entry
    /// count when --sequence-length is not given, as perf_analyzer).
    pub fixed_length: Option<u64>,
}

/// What one request of a sequence carries.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SeqStep {
    pub id: u64,
    pub start: bool,
    pub end: bool,
    /// Index of this request within its sequence (picks the input-data step).
    pub position: u64,
}

/// One worker thread's share of the id range and its length draws. Worker
/// `w` of `n` owns the ids `start + w + k·n`, so threads never share an id
/// and need no lock; within the thread, a new sequence skips ids that a
/// live sequence holds (perf_analyzer's collision rule).
#[derive(Debug)]
pub struct SequenceGen {
    first: u64,
    stride: u64,
    /// Ids this worker owns.
    count: u64,
    /// Ordinal of the next id to try; carried across steps by the caller so
    /// a step does not reuse the ids the previous one just ended.
    next: u64,
    live: HashSet<u64>,
    length: u64,
    variation_percent: f64,
    rng: SplitMix64,
}

/// How many of `total` things worker `w` of `n` gets (the first `total % n`
/// workers get one more), the split used for concurrency, sequences and ids.
pub fn share(total: u64, worker: usize, workers: usize) -> u64 {
    let n = workers.max(1) as u64;
    total / n + u64::from((worker as u64) < total % n)
}

impl SequenceGen {
    pub fn new(
        opts: &SequenceOptions,
        worker: usize,
        workers: usize,
        first_ordinal: u64,
        seed: u64,
    ) -> Self {
        Self {
            first: opts.start_id.max(1) + worker as u64,
            stride: workers.max(1) as u64,
            count: share(opts.id_range, worker, workers),
            next: first_ordinal,
            live: HashSet::new(),
            length: opts.length.max(1),
            variation_percent: opts.variation_percent.max(0.0),
            rng: SplitMix64::new(seed),
        }
    }

    /// Ids this worker can hand out; at least its number of live sequences
    /// (checked up front, as perf_analyzer refuses a range too small).
    pub fn capacity(&self) -> u64 {
        self.count
    }

    /// The ordinal the next sequence would start from (for the next step).
    pub fn next_ordinal(&self) -> u64 {
        self.next
    }

    /// A sequence length: `length` plus a uniform offset within
    /// ±variation%, truncated toward zero, at least 1 (perf_analyzer's rule).
    pub fn draw_length(&mut self) -> u64 {
        let unit = self.rng.next_f64() * 2.0 - 1.0;
        let offset = (unit * self.variation_percent / 100.0 * self.length as f64) as i64;
        let len = self.length as i64 + offset;
        len.max(1) as u64
    }

    /// Takes an id no live sequence of this worker holds, or None when all
    /// are taken (a range smaller than the live sequences).
    fn take_id(&mut self) -> Option<u64> {
        if self.count == 0 {
            return None;
        }
        for _ in 0..self.count.min(self.live.len() as u64 + 1) {
            let k = self.next % self.count;
            self.next = self.next.wrapping_add(1);
            let id = self.first + k * self.stride;
            if self.live.insert(id) {
                return Some(id);
            }
        }
        None
    }

    fn release(&mut self, id: u64) {
        self.live.remove(&id);
    }
}

/// One live sequence: a closed-loop task's own, or one of the open loop's
/// `--num-of-sequences`. It keeps its id until it begins the next
/// sequence, as perf_analyzer's sequence status does, so an id is not
/// handed out again while its last request may still be in flight.
#[derive(Debug, Default, Clone)]
pub struct Slot {
    id: Option<u64>,
    remaining: u64,
    position: u64,
}

impl Slot {
    /// The next request of this slot's sequence, starting a new sequence
    /// when the last one has ended. None only when the id range is
    /// exhausted, which the options check rules out.
    pub fn next_step(
        &mut self,
        gen: &mut SequenceGen,
        fixed_length: Option<u64>,
    ) -> Option<SeqStep> {
        let start = self.remaining == 0;
        if start {
            if let Some(old) = self.id.take() {
                gen.release(old);
            }
            self.id = Some(gen.take_id()?);
            self.remaining = fixed_length.unwrap_or_else(|| gen.draw_length()).max(1);
            self.position = 0;
        }
        let id = self.id?;
        let step = SeqStep {
            id,
            start,
            end: self.remaining == 1,
            position: self.position,
        };
        self.remaining -= 1;
        self.position += 1;
        Some(step)
    }

    /// The request that ends the sequence now (perf_analyzer sends one for
    /// each unfinished sequence when a step ends, so the server does not
    /// hold their state until its idle timeout). None when none is open.
    pub fn finish(&mut self) -> Option<SeqStep> {
        if self.remaining == 0 {
            return None;
        }
        let id = self.id?;
        let step = SeqStep {
            id,
            start: false,
            end: true,
            position: self.position,
        };
        self.remaining = 0;
        Some(step)
    }

    /// Whether a sequence is open (started, not ended).
    pub fn is_open(&self) -> bool {
        self.remaining > 0
    }
}

/// Pre-encoded requests split for splicing the sequence parameters in.
#[derive(Debug, Clone)]
pub enum Template {
    /// HTTP: each body without its leading `{`, and the length of what is
    /// left of its JSON header (binary extension), or None for pure JSON.
    Http(Vec<(Bytes, Option<usize>)>),
    /// gRPC: each `ModelInferRequest` message without its 5-byte frame.
    Grpc(Vec<Bytes>),
}

/// One request's bytes: a small freshly written head and the shared
/// pre-encoded rest (None when it was small enough to copy into the head:
/// one buffer is cheaper to send than two below a few KiB).
#[derive(Debug, Clone)]
pub struct Spliced {
    pub head: Bytes,
    pub tail: Option<Bytes>,
    /// HTTP binary extension: the new JSON header length.
    pub header_len: Option<usize>,
}

/// Below this the template is copied after the head instead of sent as a
/// second buffer (a second DATA frame or write costs more than the copy).
const COPY_LIMIT: usize = 4096;

impl Template {
    /// Splits pre-encoded HTTP bodies (each a JSON object, optionally
    /// followed by binary tensors) or gRPC frames.
    pub fn http(bodies: &[Bytes], header_len: Option<usize>) -> anyhow::Result<Self> {
        bodies
            .iter()
            .map(|b| {
                if b.first() != Some(&b'{') || b.get(1) != Some(&b'"') {
                    anyhow::bail!("internal: an HTTP request body is not a non-empty JSON object");
                }
                Ok((b.slice(1..), header_len.map(|h| h - 1)))
            })
            .collect::<anyhow::Result<_>>()
            .map(Template::Http)
    }

    pub fn grpc(frames: &[Bytes]) -> anyhow::Result<Self> {
        frames
            .iter()
            .map(|f| {
                if f.len() < 5 || f[0] != 0 {
                    anyhow::bail!("internal: a gRPC request is not one uncompressed frame");
                }
                Ok(f.slice(5..))
            })
            .collect::<anyhow::Result<_>>()
            .map(Template::Grpc)
    }

    fn len(&self) -> usize {
        match self {
            Template::Http(v) => v.len(),
            Template::Grpc(v) => v.len(),
        }
    }

    /// The request for `step`: with input data of several entries, entry
    /// `position` of the sequence (perf_analyzer's step within a stream).
    pub fn encode(&self, step: &SeqStep, string_ids: bool) -> Spliced {
        let i = (step.position % self.len().max(1) as u64) as usize;
        match self {
            Template::Http(v) => {
                let (tail, rest_len) = &v[i];
                let mut head = BytesMut::with_capacity(96);
                head.put_slice(b"{\"parameters\":{\"sequence_id\":");
                if string_ids {
                    head.put_u8(b'"');
                    put_decimal(&mut head, step.id);
                    head.put_u8(b'"');
                } else {
                    put_decimal(&mut head, step.id);
                }
                head.put_slice(if step.start {
                    b",\"sequence_start\":true"
                } else {
                    b",\"sequence_start\":false"
                });
                head.put_slice(if step.end {
                    b",\"sequence_end\":true},"
                } else {
                    b",\"sequence_end\":false},"
                });
                let header_len = rest_len.map(|r| head.len() + r);
                join(head, tail, header_len)
            }
            Template::Grpc(v) => {
                let tail = &v[i];
                let mut params = BytesMut::with_capacity(96);
                grpc_params(&mut params, step, string_ids);
                let mut head = BytesMut::with_capacity(5 + params.len());
                head.put_u8(0);
                // The message length a frame can carry was checked when the
                // template was encoded; the parameters add under 100 bytes.
                head.put_u32((params.len() + tail.len()) as u32);
                head.put_slice(&params);
                join(head, tail, None)
            }
        }
    }
}

fn join(mut head: BytesMut, tail: &Bytes, header_len: Option<usize>) -> Spliced {
    if tail.len() <= COPY_LIMIT {
        head.put_slice(tail);
        Spliced {
            head: head.freeze(),
            tail: None,
            header_len,
        }
    } else {
        Spliced {
            head: head.freeze(),
            tail: Some(tail.clone()),
            header_len,
        }
    }
}

fn put_decimal(buf: &mut BytesMut, v: u64) {
    let mut digits = [0u8; 20];
    let mut i = digits.len();
    let mut v = v;
    loop {
        i -= 1;
        digits[i] = b'0' + (v % 10) as u8;
        v /= 10;
        if v == 0 {
            break;
        }
    }
    buf.put_slice(&digits[i..]);
}

fn put_varint(buf: &mut BytesMut, mut v: u64) {
    while v >= 0x80 {
        buf.put_u8((v as u8) | 0x80);
        v >>= 7;
    }
    buf.put_u8(v as u8);
}

/// `ModelInferRequest.parameters` entries (field 4, a map<string,
/// InferParameter>) for the sequence, encoded by hand. Protobuf merges
/// repeated fields across concatenated encodings, so these bytes in front
/// of the pre-encoded message give the same request tritonclient sends:
/// `sequence_id` as int64_param (string_param for string ids),
/// `sequence_start`/`sequence_end` as bool_param.
fn grpc_params(buf: &mut BytesMut, step: &SeqStep, string_ids: bool) {
    let mut value = BytesMut::with_capacity(24);
    if string_ids {
        let mut digits = BytesMut::with_capacity(20);
        put_decimal(&mut digits, step.id);
        value.put_u8(0x1a); // string_param = 3, length-delimited
        put_varint(&mut value, digits.len() as u64);
        value.put_slice(&digits);
    } else {
        value.put_u8(0x10); // int64_param = 2, varint
        put_varint(&mut value, step.id);
    }
    map_entry(buf, b"sequence_id", &value);
    map_entry(buf, b"sequence_start", &[0x08, u8::from(step.start)]); // bool_param = 1
    map_entry(buf, b"sequence_end", &[0x08, u8::from(step.end)]);
}

fn map_entry(buf: &mut BytesMut, key: &[u8], value: &[u8]) {
    // Entry: key = 1 (string), value = 2 (message); both short.
    let entry_len = 2 + key.len() + 1 + varint_len(value.len() as u64) + value.len();
    buf.put_u8(0x22); // parameters = 4, length-delimited
    put_varint(buf, entry_len as u64);
    buf.put_u8(0x0a);
    put_varint(buf, key.len() as u64);
    buf.put_slice(key);
    buf.put_u8(0x12);
    put_varint(buf, value.len() as u64);
    buf.put_slice(value);
}

fn varint_len(v: u64) -> usize {
    (64 - v.max(1).leading_zeros() as usize).div_ceil(7)
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inference::{infer_parameter::ParameterChoice, ModelInferRequest};
    use prost::Message;

    fn opts(range: u64, length: u64, variation: f64) -> SequenceOptions {
        SequenceOptions {
            start_id: 1,
            id_range: range,
            length,
            variation_percent: variation,
            string_ids: false,
            fixed_length: None,
        }
    }

    #[test]
    fn flags_ids_and_lengths_of_one_slot() {
        let mut gen = SequenceGen::new(&opts(1000, 3, 0.0), 0, 1, 0, 1);
        let mut slot = Slot::default();
        let steps: Vec<SeqStep> = (0..6)
            .map(|_| slot.next_step(&mut gen, None).unwrap())
            .collect();
        let flags: Vec<(u64, bool, bool, u64)> = steps
            .iter()
            .map(|s| (s.id, s.start, s.end, s.position))
            .collect();
        assert_eq!(
            flags,
            [
                (1, true, false, 0),
                (1, false, false, 1),
                (1, false, true, 2),
                (2, true, false, 0),
                (2, false, false, 1),
                (2, false, true, 2)
            ]
        );
        // Length 1: every request both starts and ends its sequence.
        let mut gen = SequenceGen::new(&opts(1000, 1, 0.0), 0, 1, 0, 1);
        let s = slot_steps(&mut gen, 1);
        assert!(s[0].start && s[0].end);
    }

    fn slot_steps(gen: &mut SequenceGen, n: usize) -> Vec<SeqStep> {
        let mut slot = Slot::default();
        (0..n).map(|_| slot.next_step(gen, None).unwrap()).collect()
    }

    #[test]
    fn lengths_stay_within_the_variation_and_are_seeded() {
        let mut gen = SequenceGen::new(&opts(1000, 20, 20.0), 0, 1, 0, 7);
        let lengths: Vec<u64> = (0..10_000).map(|_| gen.draw_length()).collect();
        assert!(lengths.iter().all(|l| (16..=24).contains(l)), "{lengths:?}");
        // Both ends of the range are reached: the variation is ± not +.
        assert!(lengths.contains(&16) || lengths.contains(&17));
        assert!(lengths.contains(&23) || lengths.contains(&24));
        let mut again = SequenceGen::new(&opts(1000, 20, 20.0), 0, 1, 0, 7);
        let same: Vec<u64> = (0..10_000).map(|_| again.draw_length()).collect();
        assert_eq!(lengths, same, "same seed, same lengths");
        let mut other = SequenceGen::new(&opts(1000, 20, 20.0), 0, 1, 0, 8);
        let different: Vec<u64> = (0..100).map(|_| other.draw_length()).collect();
        assert_ne!(&lengths[..100], &different[..]);
        // A large variation never gives an empty sequence.
        let mut wide = SequenceGen::new(&opts(1000, 2, 400.0), 0, 1, 0, 3);
        assert!((0..1000).all(|_| wide.draw_length() >= 1));
        // A fixed length (input-data steps) overrides the draw.
        let mut slot = Slot::default();
        let s: Vec<SeqStep> = (0..4)
            .map(|_| slot.next_step(&mut gen, Some(2)).unwrap())
            .collect();
        assert_eq!(s.iter().filter(|s| s.end).count(), 2);
    }

    #[test]
    fn live_ids_are_unique_within_and_across_workers() {
        // 3 workers share 12 ids; each keeps 4 sequences of varying length
        // live and interleaves them randomly.
        let workers = 3;
        let mut live_everywhere = HashSet::new();
        let mut rng = SplitMix64::new(99);
        let mut gens: Vec<SequenceGen> = (0..workers)
            .map(|w| SequenceGen::new(&opts(12, 5, 60.0), w, workers, 0, w as u64))
            .collect();
        let mut slots: Vec<Vec<Slot>> = (0..workers).map(|_| vec![Slot::default(); 4]).collect();
        let mut ids_seen = HashSet::new();
        let mut open: Vec<Vec<Option<u64>>> = vec![vec![None; 4]; workers];
        for _ in 0..20_000 {
            let w = (rng.next_u64() % workers as u64) as usize;
            let s = (rng.next_u64() % 4) as usize;
            let step = slots[w][s]
                .next_step(&mut gens[w], None)
                .expect("an id is free");
            if step.start {
                assert!(
                    live_everywhere.insert(step.id),
                    "id {} started while live",
                    step.id
                );
                open[w][s] = Some(step.id);
            } else {
                assert_eq!(open[w][s], Some(step.id), "id changed mid-sequence");
            }
            if step.end {
                live_everywhere.remove(&step.id);
            }
            assert!((1..=12).contains(&step.id));
            ids_seen.insert(step.id);
        }
        assert_eq!(ids_seen.len(), 12, "the whole range is used");
    }

    #[test]
    fn ids_cycle_through_the_range_and_continue_across_steps() {
        let o = SequenceOptions {
            start_id: 100,
            ..opts(4, 1, 0.0)
        };
        let mut gen = SequenceGen::new(&o, 0, 1, 0, 0);
        let ids: Vec<u64> = slot_steps(&mut gen, 6).iter().map(|s| s.id).collect();
        assert_eq!(ids, [100, 101, 102, 103, 100, 101]);
        let mut next_step_gen = SequenceGen::new(&o, 0, 1, gen.next_ordinal(), 0);
        assert_eq!(slot_steps(&mut next_step_gen, 1)[0].id, 102);
        // Worker 1 of 2 owns every other id.
        let mut w1 = SequenceGen::new(&o, 1, 2, 0, 0);
        let ids: Vec<u64> = slot_steps(&mut w1, 3).iter().map(|s| s.id).collect();
        assert_eq!(ids, [101, 103, 101]);
        assert_eq!(share(5, 0, 2), 3);
        assert_eq!(share(5, 1, 2), 2);
        // No id at all: the caller's range check failed to run.
        let mut none = SequenceGen::new(&opts(1, 1, 0.0), 1, 2, 0, 0);
        assert_eq!(none.capacity(), 0);
        assert!(Slot::default().next_step(&mut none, None).is_none());
    }

    #[test]
    fn finish_ends_an_open_sequence_once() {
        let mut gen = SequenceGen::new(&opts(10, 5, 0.0), 0, 1, 0, 0);
        let mut slot = Slot::default();
        assert!(slot.finish().is_none());
        slot.next_step(&mut gen, None).unwrap();
        assert!(slot.is_open());
        let end = slot.finish().unwrap();
        assert_eq!((end.id, end.start, end.end), (1, false, true));
        assert!(!slot.is_open());
        assert!(slot.finish().is_none());
        assert!(slot.next_step(&mut gen, None).unwrap().start);
    }

    fn step(id: u64, start: bool, end: bool) -> SeqStep {
        SeqStep {
            id,
            start,
            end,
            position: 0,
        }
    }

    #[test]
    fn http_splice_is_the_request_with_parameters() {
        let json_body = Bytes::from_static(
            br#"{"inputs":[{"name":"INPUT","datatype":"INT32","shape":[1],"data":[1]}]}"#,
        );
        let t = Template::http(std::slice::from_ref(&json_body), None).unwrap();
        let s = t.encode(&step(7, true, false), false);
        assert!(s.tail.is_none() && s.header_len.is_none());
        let v: serde_json::Value = serde_json::from_slice(&s.head).unwrap();
        assert_eq!(
            v["parameters"],
            serde_json::json!({"sequence_id": 7, "sequence_start": true, "sequence_end": false})
        );
        assert_eq!(v["inputs"][0]["data"], serde_json::json!([1]));
        let s = t.encode(&step(u64::from(u32::MAX) + 5, false, true), true);
        let v: serde_json::Value = serde_json::from_slice(&s.head).unwrap();
        assert_eq!(v["parameters"]["sequence_id"], "4294967300");
        assert_eq!(v["parameters"]["sequence_end"], true);

        // Binary extension: the header length moves with the id's digits,
        // and a large binary tail is shared, not copied.
        let header = br#"{"inputs":[{"name":"I","datatype":"UINT8","shape":[5000],"parameters":{"binary_data_size":5000}}]}"#;
        let mut body = header.to_vec();
        body.extend(std::iter::repeat_n(3u8, 5000));
        let t = Template::http(&[Bytes::from(body)], Some(header.len())).unwrap();
        for id in [1, 12345] {
            let s = t.encode(&step(id, false, false), false);
            let tail = s.tail.clone().expect("large tail sent as is");
            let mut whole = s.head.to_vec();
            whole.extend_from_slice(&tail);
            let h = s.header_len.unwrap();
            let v: serde_json::Value = serde_json::from_slice(&whole[..h]).unwrap();
            assert_eq!(v["parameters"]["sequence_id"], id);
            assert_eq!(whole.len() - h, 5000);
            assert!(whole[h..].iter().all(|&b| b == 3));
        }
        assert!(Template::http(&[Bytes::from_static(b"[]")], None).is_err());
    }

    #[test]
    fn grpc_splice_decodes_as_tritonclient_sends_it() {
        use crate::proto::inference::model_infer_request::InferInputTensor;
        let request = ModelInferRequest {
            model_name: "sequence_accumulator".into(),
            inputs: vec![InferInputTensor {
                name: "INPUT".into(),
                datatype: "INT32".into(),
                shape: vec![1, 1],
                ..Default::default()
            }],
            raw_input_contents: vec![Bytes::from_static(&[1, 0, 0, 0])],
            ..Default::default()
        };
        let small = crate::bench::input::grpc_frame(&request);
        let big_request = ModelInferRequest {
            raw_input_contents: vec![Bytes::from(vec![9u8; 10_000])],
            ..request.clone()
        };
        let big = crate::bench::input::grpc_frame(&big_request);
        let t = Template::grpc(&[small]).unwrap();
        let tb = Template::grpc(&[big]).unwrap();
        for (id, start, end, strings) in [
            (1u64, true, false, false),
            (300, false, false, false),
            (u64::from(u32::MAX), false, true, true),
            (i64::MAX as u64, true, true, false),
        ] {
            for (template, original) in [(&t, &request), (&tb, &big_request)] {
                let s = template.encode(&step(id, start, end), strings);
                let mut frame = s.head.to_vec();
                if let Some(tail) = &s.tail {
                    frame.extend_from_slice(tail);
                }
                let len = u32::from_be_bytes([frame[1], frame[2], frame[3], frame[4]]) as usize;
                assert_eq!((frame[0], len), (0, frame.len() - 5));
                let got = ModelInferRequest::decode(&frame[5..]).unwrap();
                let p = |k: &str| {
                    got.parameters
                        .get(k)
                        .and_then(|p| p.parameter_choice.clone())
                };
                let expected_id = if strings {
                    ParameterChoice::StringParam(id.to_string())
                } else {
                    ParameterChoice::Int64Param(id as i64)
                };
                assert_eq!(p("sequence_id"), Some(expected_id));
                assert_eq!(p("sequence_start"), Some(ParameterChoice::BoolParam(start)));
                assert_eq!(p("sequence_end"), Some(ParameterChoice::BoolParam(end)));
                assert_eq!(got.parameters.len(), 3);
                let mut rest = got.clone();
                rest.parameters.clear();
                assert_eq!(&rest, original);
            }
        }
        assert!(Template::grpc(&[Bytes::from_static(&[1, 0, 0, 0, 0])]).is_err());
    }

    #[test]
    fn varints() {
        for v in [0u64, 1, 127, 128, 16_383, 16_384, u64::MAX] {
            let mut b = BytesMut::new();
            put_varint(&mut b, v);
            assert_eq!(b.len(), varint_len(v), "{v}");
        }
    }
}
