//! RESOURCE_EXHAUSTED for messages over `--grpc-max-message-size`.
//!
//! gRPC (grpc-core, hence tritonserver and its clients) answers a message
//! over the size limit, received or sent, with RESOURCE_EXHAUSTED; tonic
//! answers OUT_OF_RANGE ("Error, decoded/encoded message length too
//! large"), and only a decompressed message over the limit gets
//! RESOURCE_EXHAUSTED. tonic's checks stay (the length prefix is refused
//! before the body is read); their status is rewritten on the way out: in
//! the response head for a unary call refused before its handler ran
//! (trailers-only), in the trailers when the status ends a body (a stream,
//! an answer too large to send). Nothing of ours answers OUT_OF_RANGE, and
//! the message is checked too, so nothing else is touched.

use std::{
    pin::Pin,
    task::{ready, Context, Poll},
};

use bytes::Bytes;
use http::HeaderMap;
use http_body::{Body, Frame, SizeHint};
use tonic::{Code, Status};

/// tonic's wording for both directions.
const TONIC_TOO_LARGE: &str = "message length too large";

/// Rewrites tonic's size-limit OUT_OF_RANGE in `headers` (a response head
/// or trailers) to RESOURCE_EXHAUSTED, naming the flag. Anything else is
/// left as it is; a response without `grpc-status` pays one lookup.
pub fn rewrite(headers: &mut HeaderMap) {
    if headers
        .get(Status::GRPC_STATUS)
        .is_none_or(|v| v.as_bytes() != b"11")
    {
        return;
    }
    let message = headers
        .get(Status::GRPC_MESSAGE)
        .map(|v| percent_decode(v.as_bytes()))
        .unwrap_or_default();
    if !message.contains(TONIC_TOO_LARGE) {
        return;
    }
    let message = if message.contains("--grpc-max-message-size") {
        message
    } else {
        format!("{message} (the server's --grpc-max-message-size)")
    };
    if let Err(e) = Status::new(Code::ResourceExhausted, message).add_header(headers) {
        tracing::debug!(error = %e, "grpc: size-limit status not rewritten");
    }
}

/// `grpc-message` is percent-encoded (gRPC's HTTP/2 mapping).
fn percent_decode(bytes: &[u8]) -> String {
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = |b: Option<&u8>| b.and_then(|b| (*b as char).to_digit(16));
        if bytes[i] == b'%' {
            if let (Some(h), Some(l)) = (hex(bytes.get(i + 1)), hex(bytes.get(i + 2))) {
                // Two hex digits: at most 255.
                out.push((h * 16 + l) as u8);
                i += 3;
                continue;
            }
        }
        out.push(bytes[i]);
        i += 1;
    }
    String::from_utf8_lossy(&out).into_owned()
}

/// A response body whose trailers go through [`rewrite`].
pub struct SizeLimitStatus {
    inner: tonic::body::Body,
}

impl SizeLimitStatus {
    pub fn new(inner: tonic::body::Body) -> Self {
        Self { inner }
    }
}

impl Body for SizeLimitStatus {
    type Data = Bytes;
    type Error = Status;

    fn poll_frame(
        mut self: Pin<&mut Self>,
        cx: &mut Context<'_>,
    ) -> Poll<Option<Result<Frame<Bytes>, Status>>> {
        let frame = ready!(Pin::new(&mut self.inner).poll_frame(cx));
        Poll::Ready(frame.map(|r| {
            r.map(|frame| match frame.into_trailers() {
                Ok(mut trailers) => {
                    rewrite(&mut trailers);
                    Frame::trailers(trailers)
                }
                Err(frame) => frame,
            })
        }))
    }

    fn is_end_stream(&self) -> bool {
        self.inner.is_end_stream()
    }

    fn size_hint(&self) -> SizeHint {
        self.inner.size_hint()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn status_headers(status: &Status) -> HeaderMap {
        let mut h = HeaderMap::new();
        status.add_header(&mut h).unwrap();
        h
    }

    #[test]
    fn tonic_size_limit_statuses_become_resource_exhausted() {
        for dir in ["decoded", "encoded"] {
            let mut h = status_headers(&Status::out_of_range(format!(
                "Error, {dir} message length too large: found 2000 bytes, the limit is: 1024 bytes"
            )));
            rewrite(&mut h);
            let s = Status::from_header_map(&h).unwrap();
            assert_eq!(s.code(), Code::ResourceExhausted);
            assert_eq!(
                s.message(),
                format!(
                    "Error, {dir} message length too large: found 2000 bytes, the limit is: \
                     1024 bytes (the server's --grpc-max-message-size)"
                )
            );
        }
    }

    #[test]
    fn other_statuses_are_left_alone() {
        for status in [
            Status::out_of_range("index 3 past the end"),
            Status::invalid_argument("message length too large"),
            Status::ok(""),
        ] {
            let mut h = status_headers(&status);
            let before = h.clone();
            rewrite(&mut h);
            assert_eq!(h, before);
        }
        let mut empty = HeaderMap::new();
        rewrite(&mut empty);
        assert!(empty.is_empty());
    }

    #[test]
    fn percent_decoding_tolerates_bad_escapes() {
        assert_eq!(percent_decode(b"a%20b"), "a b");
        assert_eq!(percent_decode(b"100%"), "100%");
        assert_eq!(percent_decode(b"%zz%2"), "%zz%2");
    }
}
