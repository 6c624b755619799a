//! gRPC messages split out of a request body's frames as they arrive,
//! with tonic's statuses for every framing fault (so `size_limit` rewrites
//! the size refusal as for tonic's own answers): for the direct unary path
//! (`unary_infer`, the first message of a body) and the direct stream
//! (`stream_route`, every message in order).

use std::collections::VecDeque;

use bytes::{Buf, Bytes, BytesMut};
use tonic::Status;

use super::response_wire::HEADER_LEN;

/// Frames smaller than this are copied together while a message is read.
const SMALL_PART: usize = 4096;

/// Splits a request body into gRPC messages as its frames arrive, keeping
/// the first ([`MessageReader::first`]) or all ([`MessageReader::every`]).
/// A message that arrives within one frame is a slice of it;
/// one spread over frames keeps their bytes until it is whole, then is
/// copied once into a buffer of its own length. So memory grows with what
/// arrived, not with the length a header announces (tonic reserves that
/// at once). Frames under [`SMALL_PART`] are copied together as they
/// come: kept as handles, a message sent a byte a frame would cost a
/// handle (32 bytes) and a pinned read buffer per byte.
#[derive(Debug)]
pub(super) struct MessageReader {
    limit: usize,
    /// A message header begun in an earlier frame.
    head: [u8; HEADER_LEN],
    head_len: usize,
    /// Length of the message being read once its header is read.
    reading: Option<usize>,
    /// That message's bytes so far: frames of [`SMALL_PART`] or more as
    /// they came, smaller ones gathered in `small` (which comes after
    /// `parts`), and their total.
    parts: Vec<Bytes>,
    small: BytesMut,
    have: usize,
    /// Bytes of a later message still to drop.
    skipping: usize,
    /// Whether messages after the first are kept.
    keep_all: bool,
    /// Whole messages not taken yet, in order (a unary call's reader
    /// holds at most its first, taken only by `finish`).
    messages: VecDeque<Bytes>,
}

impl MessageReader {
    /// A unary call's reader: the first message is kept, later ones are
    /// read and dropped, as tonic does.
    pub(super) fn first(limit: usize) -> Self {
        Self::new(limit, false)
    }

    /// A stream's reader: every message, in order.
    pub(super) fn every(limit: usize) -> Self {
        Self::new(limit, true)
    }

    fn new(limit: usize, keep_all: bool) -> Self {
        Self {
            limit,
            head: [0; HEADER_LEN],
            head_len: 0,
            reading: None,
            parts: Vec::new(),
            small: BytesMut::new(),
            have: 0,
            skipping: 0,
            keep_all,
            messages: VecDeque::new(),
        }
    }

    /// Reads one frame's bytes. A fault ends the reading: the messages
    /// read whole before it can still be taken, and nothing more may be
    /// pushed.
    pub(super) fn push(&mut self, mut data: Bytes) -> Result<(), Status> {
        loop {
            if self.skipping > 0 {
                let n = self.skipping.min(data.len());
                data.advance(n);
                self.skipping -= n;
            }
            if data.is_empty() {
                return Ok(());
            }
            let Some(len) = self.reading else {
                let n = (HEADER_LEN - self.head_len).min(data.len());
                self.head[self.head_len..self.head_len + n].copy_from_slice(&data[..n]);
                self.head_len += n;
                data.advance(n);
                if self.head_len < HEADER_LEN {
                    return Ok(());
                }
                self.head_len = 0;
                let len = self.checked_len()?;
                if !self.keep_all && !self.messages.is_empty() {
                    self.skipping = len;
                } else if len == 0 {
                    self.take(Bytes::new());
                } else {
                    self.reading = Some(len);
                }
                continue;
            };
            let part = data.split_to((len - self.have).min(data.len()));
            if self.have == 0 && part.len() == len {
                self.take(part);
                continue;
            }
            self.have += part.len();
            if part.len() < SMALL_PART {
                self.small.extend_from_slice(&part);
                if self.small.len() >= SMALL_PART {
                    self.parts.push(self.small.split().freeze());
                }
            } else {
                if !self.small.is_empty() {
                    self.parts.push(self.small.split().freeze());
                }
                self.parts.push(part);
            }
            if self.have == len {
                let mut whole = BytesMut::with_capacity(len);
                for part in self.parts.drain(..) {
                    whole.extend_from_slice(&part);
                }
                whole.extend_from_slice(&self.small);
                self.small = BytesMut::new();
                self.take(whole.freeze());
            }
        }
    }

    fn take(&mut self, message: Bytes) {
        self.messages.push_back(message);
        self.reading = None;
        self.have = 0;
    }

    /// The length in a complete header, checked as tonic checks it.
    fn checked_len(&self) -> Result<usize, Status> {
        match self.head[0] {
            0 => {}
            1 => {
                return Err(Status::internal(
                    "protocol error: received message with compressed-flag but no grpc-encoding was specified",
                ))
            }
            f => {
                return Err(Status::internal(format!(
                    "protocol error: received message with invalid compression flag: {f} (valid flags are 0 and 1), while sending request"
                )))
            }
        }
        let h = &self.head;
        let len = u32::from_be_bytes([h[1], h[2], h[3], h[4]]) as usize;
        if len > self.limit {
            return Err(Status::out_of_range(format!(
                "Error, decoded message length too large: found {len} bytes, the limit is: {} bytes",
                self.limit
            )));
        }
        Ok(len)
    }

    /// The next message read whole.
    pub(super) fn next(&mut self) -> Option<Bytes> {
        self.messages.pop_front()
    }

    /// The body ended: a fault if it ended within a message.
    pub(super) fn end(&self) -> Result<(), Status> {
        if self.reading.is_some() || self.head_len > 0 || self.skipping > 0 {
            return Err(Status::internal("Unexpected EOF decoding stream."));
        }
        Ok(())
    }

    /// The body ended: its first message.
    pub(super) fn finish(mut self) -> Result<Bytes, Status> {
        self.end()?;
        self.next()
            .ok_or_else(|| Status::internal("Missing request message."))
    }
}

#[cfg(test)]
mod tests {
    use tonic::Code;

    use super::*;

    fn framed(flag: u8, message: &[u8]) -> Vec<u8> {
        let mut out = vec![flag];
        out.extend_from_slice(&(message.len() as u32).to_be_bytes());
        out.extend_from_slice(message);
        out
    }

    /// Feeds `body` to a reader in frames of `chunk` bytes.
    fn read(body: &[u8], chunk: usize, limit: usize) -> Result<Bytes, Status> {
        let mut reader = MessageReader::first(limit);
        for part in body.chunks(chunk.max(1)) {
            reader.push(Bytes::copy_from_slice(part))?;
        }
        reader.finish()
    }

    /// Cut into frames of any one size, `body` reads as `expected`.
    fn reads_at_every_cut(body: &[u8], expected: &[u8]) {
        for chunk in 1..=body.len() {
            assert_eq!(read(body, chunk, 64).unwrap(), expected, "chunk {chunk}");
        }
    }

    #[test]
    fn a_message_is_read_whatever_the_frames() {
        reads_at_every_cut(&framed(0, b"hello, world"), b"hello, world");
    }

    #[test]
    fn a_message_within_one_frame_is_not_copied() {
        let body = Bytes::from(framed(0, b"abcdef"));
        let mut reader = MessageReader::first(64);
        reader.push(body.clone()).unwrap();
        let message = reader.finish().unwrap();
        assert_eq!(message.as_ptr(), body[HEADER_LEN..].as_ptr());
    }

    #[test]
    fn a_message_in_pieces_holds_only_what_arrived() {
        // A header announcing 512 MiB, then ten bytes of it.
        let mut reader = MessageReader::first(1 << 30);
        let mut body = vec![0u8];
        body.extend_from_slice(&(1u32 << 29).to_be_bytes());
        body.extend_from_slice(b"0123456789");
        reader.push(Bytes::from(body)).unwrap();
        assert_eq!(reader.have, 10);
        assert_eq!(reader.small.len(), 10);
        assert!(reader.parts.is_empty());
        assert_eq!(
            reader.finish().unwrap_err().message(),
            "Unexpected EOF decoding stream."
        );
    }

    #[test]
    fn small_frames_are_gathered_not_kept_one_by_one() {
        let message: Vec<u8> = (0..20_000u32).map(|i| i as u8).collect();
        let body = framed(0, &message);
        let mut reader = MessageReader::first(1 << 20);
        reader
            .push(Bytes::copy_from_slice(&body[..HEADER_LEN]))
            .unwrap();
        for (i, byte) in body[HEADER_LEN..].iter().enumerate() {
            reader.push(Bytes::copy_from_slice(&[*byte])).unwrap();
            if i + 1 < message.len() {
                assert!(reader.parts.len() <= (i + 1) / SMALL_PART, "byte {i}");
            }
        }
        assert_eq!(reader.finish().unwrap(), message);
        // Large frames between small ones keep their place.
        let mut reader = MessageReader::first(1 << 20);
        reader
            .push(Bytes::copy_from_slice(&body[..HEADER_LEN + 3]))
            .unwrap();
        let rest = &body[HEADER_LEN + 3..];
        reader
            .push(Bytes::copy_from_slice(&rest[..SMALL_PART]))
            .unwrap();
        reader
            .push(Bytes::copy_from_slice(&rest[SMALL_PART..SMALL_PART + 5]))
            .unwrap();
        reader
            .push(Bytes::copy_from_slice(&rest[SMALL_PART + 5..]))
            .unwrap();
        assert_eq!(reader.finish().unwrap(), message);
    }

    #[test]
    fn later_messages_are_dropped_and_the_first_kept() {
        let mut body = framed(0, b"first");
        body.extend(framed(0, b"second message"));
        body.extend(framed(0, b""));
        reads_at_every_cut(&body, b"first");
    }

    #[test]
    fn an_empty_message_is_a_message() {
        assert_eq!(read(&framed(0, b""), 5, 64).unwrap(), Bytes::new());
    }

    #[test]
    fn framing_faults_get_tonics_statuses() {
        let err = |body: &[u8], limit| read(body, 3, limit).unwrap_err();
        let e = err(&[], 64);
        assert_eq!(
            (e.code(), e.message()),
            (Code::Internal, "Missing request message.")
        );
        for cut in [1, 4, 5, 9] {
            let e = err(&framed(0, b"truncated")[..cut], 64);
            assert_eq!(
                (e.code(), e.message()),
                (Code::Internal, "Unexpected EOF decoding stream."),
                "cut at {cut}"
            );
        }
        let mut two = framed(0, b"ok");
        two.extend(&framed(0, b"cut short")[..7]);
        assert_eq!(err(&two, 64).message(), "Unexpected EOF decoding stream.");
        let e = err(&framed(1, b"x"), 64);
        assert_eq!(e.code(), Code::Internal);
        assert!(
            e.message().contains("compressed-flag but no grpc-encoding"),
            "{e:?}"
        );
        let e = err(&framed(7, b"x"), 64);
        assert!(e.message().contains("invalid compression flag: 7"), "{e:?}");
        let e = err(&framed(0, &[0; 65]), 64);
        assert_eq!(e.code(), Code::OutOfRange);
        assert!(e.message().contains("message length too large"), "{e:?}");
        // A later message is held to the limit as well.
        let mut body = framed(0, b"ok");
        body.extend(framed(0, &[0; 65]));
        assert_eq!(err(&body, 64).code(), Code::OutOfRange);
    }

    #[test]
    fn the_size_refusal_comes_before_the_message_is_read() {
        // Only the header: the refusal needs none of the 1 GiB it announces.
        let mut reader = MessageReader::first(1 << 20);
        let mut head = vec![0u8];
        head.extend_from_slice(&(1u32 << 30).to_be_bytes());
        assert_eq!(
            reader.push(Bytes::from(head)).unwrap_err().code(),
            Code::OutOfRange
        );
    }

    #[test]
    fn a_stream_reader_keeps_every_message_in_order() {
        let mut body = framed(0, b"first");
        body.extend(framed(0, b""));
        body.extend(framed(0, b"third message"));
        for chunk in 1..=body.len() {
            let mut reader = MessageReader::every(64);
            let mut got = Vec::new();
            for part in body.chunks(chunk) {
                reader.push(Bytes::copy_from_slice(part)).unwrap();
                got.extend(std::iter::from_fn(|| reader.next()));
            }
            reader.end().unwrap();
            assert_eq!(got, [&b"first"[..], b"", b"third message"], "chunk {chunk}");
        }
    }

    #[test]
    fn a_stream_reader_gives_what_came_before_a_fault() {
        let mut body = framed(0, b"ok");
        body.extend(framed(7, b"x"));
        let mut reader = MessageReader::every(64);
        let e = reader.push(Bytes::from(body)).unwrap_err();
        assert!(e.message().contains("invalid compression flag: 7"), "{e:?}");
        assert_eq!(reader.next().unwrap(), &b"ok"[..]);
        assert_eq!(reader.next(), None);
        let mut cut = MessageReader::every(64);
        cut.push(Bytes::from(framed(0, b"cut short")[..7].to_vec()))
            .unwrap();
        assert_eq!(
            cut.end().unwrap_err().message(),
            "Unexpected EOF decoding stream."
        );
    }
}
