//! Large `raw_output_contents` sent without copying them.
//!
//! tonic encodes a unary response into one buffer on the shard: for a
//! 60 MB output that is a 60 MB copy into freshly faulted memory in a
//! single poll (~25-50 ms during which the shard's other connections
//! wait). Protobuf lets a message's fields come in any order and repeated
//! fields be appended, so `model_infer` takes the raw outputs out of the
//! message it hands to tonic and attaches them to the response as a
//! [`RawTail`]; [`with_raw_tail`] then wraps tonic's body: it rewrites the
//! length in the gRPC message header and, after the encoded message,
//! sends for each output its field key and length and the output's own
//! `Bytes` (h2 writes them to the socket from where the model left them).
//!
//! The tail goes out in slices of a MiB with a short pause of the shard
//! between them (`transport::Pacer`): h2 writes what it holds to the
//! socket in one go, which for 60 MB kept the shard's other connections
//! waiting as long as the copy did.
//!
//! Only for uncompressed responses (the tail cannot join a compressed
//! message) and messages within the encoding limit (tonic reports those
//! itself); the caller checks both.

use std::{
    collections::VecDeque,
    pin::Pin,
    task::{Context, Poll},
};

use bytes::{BufMut, Bytes, BytesMut};
use http_body::{Body, Frame, SizeHint};

use crate::frontend::transport::{Pacer, PAUSE_EVERY_BYTES};

/// Responses whose raw outputs are smaller go through tonic whole: one
/// frame is cheaper than several for small answers.
pub const MIN_TAIL_BYTES: usize = 64 << 10;

/// `raw_output_contents` (field 6, length-delimited) of `ModelInferResponse`.
const RAW_OUTPUT_KEY: u8 = (6 << 3) | 2;

/// The raw outputs taken out of a response message, in order.
#[derive(Clone, Debug)]
pub struct RawTail(pub Vec<Bytes>);

impl RawTail {
    /// Bytes the tail adds to the protobuf message.
    pub fn encoded_len(&self) -> usize {
        self.0.iter().map(|b| raw_output_field_len(b.len())).sum()
    }
}

/// Bytes one `raw_output_contents` entry of `len` bytes takes in the
/// message: its key, its length and the bytes.
pub fn raw_output_field_len(len: usize) -> usize {
    1 + prost::length_delimiter_len(len) + len
}

/// Wraps tonic's response body so that `tail` follows the message.
pub fn with_raw_tail(inner: tonic::body::Body, tail: RawTail) -> tonic::body::Body {
    let tail_len = tail.encoded_len();
    let mut frames = VecDeque::with_capacity(tail.0.len() * 2);
    for chunk in tail.0 {
        let mut key = BytesMut::with_capacity(11);
        key.put_u8(RAW_OUTPUT_KEY);
        prost::encoding::encode_varint(chunk.len() as u64, &mut key);
        frames.push_back(key.freeze());
        // Slices of a MiB, with a pause of the shard between them: h2
        // writes a frame it holds to the socket without yielding.
        let mut at = 0;
        while at < chunk.len() {
            let end = (at + PAUSE_EVERY_BYTES).min(chunk.len());
            frames.push_back(chunk.slice(at..end));
            at = end;
        }
    }
    tonic::body::Body::new(TailBody {
        inner,
        tail: frames,
        tail_len,
        header_sent: false,
        message_done: false,
        trailers: None,
        pacer: Pacer::default(),
    })
}

struct TailBody {
    inner: tonic::body::Body,
    /// Key-and-length frames, each followed by its output's bytes.
    tail: VecDeque<Bytes>,
    tail_len: usize,
    header_sent: bool,
    /// tonic's message has been sent whole; the tail goes next.
    message_done: bool,
    /// tonic's trailers (grpc-status), held back until the tail is out.
    trailers: Option<Frame<Bytes>>,
    pacer: Pacer,
}

type FrameResult = Option<Result<Frame<Bytes>, tonic::Status>>;

impl TailBody {
    /// Rewrites the first frame's gRPC header to the length with the tail.
    fn rewrite_header(&self, data: Bytes) -> Result<Bytes, tonic::Status> {
        if data.len() < 5 {
            return Err(tonic::Status::internal(
                "gRPC response framing: the message header was split",
            ));
        }
        if data[0] != 0 {
            // The caller never attaches a tail where compression may apply.
            return Err(tonic::Status::internal(
                "gRPC response framing: raw outputs cannot follow a compressed message",
            ));
        }
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        let total = u32::try_from(len + self.tail_len).map_err(|_| {
            tonic::Status::resource_exhausted("the response exceeds gRPC's 4 GiB message limit")
        })?;
        let mut out = BytesMut::with_capacity(data.len());
        out.put_u8(0);
        out.put_u32(total);
        out.extend_from_slice(&data[5..]);
        Ok(out.freeze())
    }
}

impl Body for TailBody {
    type Data = Bytes;
    type Error = tonic::Status;

    fn poll_frame(mut self: Pin<&mut Self>, cx: &mut Context<'_>) -> Poll<FrameResult> {
        let this = &mut *self;
        loop {
            if this.message_done {
                if this.pacer.poll_ready(cx).is_pending() {
                    return Poll::Pending;
                }
                if let Some(b) = this.tail.pop_front() {
                    this.pacer.account(b.len(), cx);
                    return Poll::Ready(Some(Ok(Frame::data(b))));
                }
                return Poll::Ready(this.trailers.take().map(Ok));
            }
            let frame = match Pin::new(&mut this.inner).poll_frame(cx) {
                Poll::Pending => return Poll::Pending,
                Poll::Ready(None) if !this.header_sent => return Poll::Ready(None),
                Poll::Ready(None) => {
                    this.message_done = true;
                    continue;
                }
                Poll::Ready(Some(Err(e))) => return Poll::Ready(Some(Err(e))),
                Poll::Ready(Some(Ok(frame))) => frame,
            };
            match frame.into_data() {
                Ok(data) if this.header_sent => return Poll::Ready(Some(Ok(Frame::data(data)))),
                Ok(data) => {
                    this.header_sent = true;
                    return Poll::Ready(Some(this.rewrite_header(data).map(Frame::data)));
                }
                // Trailers with no message before them: an error status,
                // which the tail must not follow.
                Err(trailers) if !this.header_sent => {
                    this.tail.clear();
                    this.message_done = true;
                    return Poll::Ready(Some(Ok(trailers)));
                }
                Err(trailers) => {
                    this.trailers = Some(trailers);
                    this.message_done = true;
                }
            }
        }
    }

    fn is_end_stream(&self) -> bool {
        self.message_done && self.tail.is_empty() && self.trailers.is_none()
    }

    fn size_hint(&self) -> SizeHint {
        SizeHint::default()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::proto::inference::{model_infer_response::InferOutputTensor, ModelInferResponse};
    use http_body_util::{BodyExt, StreamBody};
    use prost::Message;

    /// tonic's framing of `message`: the 5-byte header, the message, then
    /// the trailers with grpc-status 0.
    fn tonic_body(message: &ModelInferResponse, split_header: bool) -> tonic::body::Body {
        let encoded = message.encode_to_vec();
        let mut framed = vec![0u8];
        framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        framed.extend_from_slice(&encoded);
        let framed = Bytes::from(framed);
        let mut frames: Vec<Result<Frame<Bytes>, tonic::Status>> = if split_header {
            vec![
                Ok(Frame::data(framed.slice(..3))),
                Ok(Frame::data(framed.slice(3..))),
            ]
        } else {
            vec![Ok(Frame::data(framed))]
        };
        let mut trailers = http::HeaderMap::new();
        trailers.insert("grpc-status", http::HeaderValue::from_static("0"));
        frames.push(Ok(Frame::trailers(trailers)));
        tonic::body::Body::new(StreamBody::new(futures::stream::iter(frames)))
    }

    fn response(raw: Vec<Bytes>) -> ModelInferResponse {
        ModelInferResponse {
            model_name: "m".into(),
            model_version: "1".into(),
            id: "x".into(),
            outputs: (0..raw.len())
                .map(|i| InferOutputTensor {
                    name: format!("OUT{i}"),
                    datatype: "UINT8".into(),
                    shape: vec![raw[i].len() as i64],
                    ..Default::default()
                })
                .collect(),
            raw_output_contents: raw,
            ..Default::default()
        }
    }

    /// Collects the wrapped body: (the gRPC message bytes, trailers seen
    /// last, data frames).
    fn collect(body: tonic::body::Body) -> (Vec<u8>, bool, usize) {
        futures::executor::block_on(async {
            let mut body = body;
            let mut data = Vec::new();
            let mut frames = 0;
            let mut trailers_last = false;
            while let Some(frame) = body.frame().await {
                let frame = frame.expect("frame");
                assert!(!trailers_last, "a frame after the trailers");
                match frame.into_data() {
                    Ok(d) => {
                        frames += 1;
                        data.extend_from_slice(&d);
                    }
                    Err(f) => {
                        assert!(f.is_trailers());
                        trailers_last = true;
                    }
                }
            }
            (data, trailers_last, frames)
        })
    }

    #[test]
    fn the_tail_decodes_as_the_original_message() {
        // Three outputs, one empty and one over a MiB (sent in slices).
        let raw = vec![
            Bytes::from(vec![7u8; 3 << 20 | 5]),
            Bytes::new(),
            Bytes::from_static(b"abc"),
        ];
        let original = response(raw.clone());
        let mut head = original.clone();
        let tail = RawTail(std::mem::take(&mut head.raw_output_contents));
        let (data, trailers_last, frames) = collect(with_raw_tail(tonic_body(&head, false), tail));
        assert!(trailers_last);
        // Head, 3 key frames, 4 slices of the big output, "abc".
        assert_eq!(frames, 1 + 3 + 4 + 1);
        assert_eq!(data[0], 0);
        let len = u32::from_be_bytes([data[1], data[2], data[3], data[4]]) as usize;
        assert_eq!(len, data.len() - 5);
        assert_eq!(len, original.encoded_len());
        let decoded = ModelInferResponse::decode(&data[5..]).expect("decodes");
        assert_eq!(decoded, original);
    }

    #[test]
    fn a_split_header_or_a_compressed_message_is_an_error_not_a_corrupt_answer() {
        let mut head = response(vec![Bytes::from_static(b"abc")]);
        let tail = RawTail(std::mem::take(&mut head.raw_output_contents));
        let mut body = with_raw_tail(tonic_body(&head, true), tail);
        let first = futures::executor::block_on(body.frame()).expect("a frame");
        assert_eq!(first.unwrap_err().code(), tonic::Code::Internal);

        let encoded = head.encode_to_vec();
        let mut framed = vec![1u8];
        framed.extend_from_slice(&(encoded.len() as u32).to_be_bytes());
        framed.extend_from_slice(&encoded);
        let frames: Vec<Result<Frame<Bytes>, tonic::Status>> =
            vec![Ok(Frame::data(Bytes::from(framed)))];
        let inner = tonic::body::Body::new(StreamBody::new(futures::stream::iter(frames)));
        let mut body = with_raw_tail(inner, RawTail(vec![Bytes::from_static(b"x")]));
        let first = futures::executor::block_on(body.frame()).expect("a frame");
        assert_eq!(first.unwrap_err().code(), tonic::Code::Internal);
    }

    #[test]
    fn an_error_status_passes_without_the_tail() {
        let status = tonic::Status::not_found("no such model");
        let inner = status.into_http::<tonic::body::Body>().into_body();
        let (data, _, frames) = collect(with_raw_tail(
            inner,
            RawTail(vec![Bytes::from_static(b"x")]),
        ));
        assert!(data.is_empty());
        assert_eq!(frames, 0);
    }
}
