//! Unary gRPC on the direct lane: an HTTP/2 connection (RFC 9113) with one
//! stream at a time. The request's header block is encoded once, as HPACK
//! literals without indexing, so the server's decoder state never matters;
//! the server's header blocks are decoded in order with `fluke-hpack`,
//! whose table follows the server's. The connection answers SETTINGS and
//! PING, follows both flow-control windows for its DATA and returns the
//! server's DATA in WINDOW_UPDATEs. A GOAWAY ends the connection after the
//! stream it still serves. The checks on the answer (HTTP status,
//! `grpc-status` in the headers or trailers, one framed message) are the
//! runtime path's (`bench::grpc`).

use std::borrow::Cow;

use bytes::{Bytes, BytesMut};
use http::{HeaderMap, HeaderValue, StatusCode};

use super::lane::{Failure, Lane, Protocol};
use crate::bench::{
    grpc::{check_head, check_status, take_message},
    request::Prepared,
};

const PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";

const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const RST_STREAM: u8 = 0x3;
const SETTINGS: u8 = 0x4;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const WINDOW_UPDATE: u8 = 0x8;
const CONTINUATION: u8 = 0x9;

const END_STREAM: u8 = 0x1;
const ACK: u8 = 0x1;
const END_HEADERS: u8 = 0x4;
const PADDED: u8 = 0x8;
const PRIORITY: u8 = 0x20;

const SETTINGS_ENABLE_PUSH: u16 = 0x2;
const SETTINGS_INITIAL_WINDOW_SIZE: u16 = 0x4;
const SETTINGS_MAX_FRAME_SIZE: u16 = 0x5;

/// The protocol's defaults until the server's SETTINGS say otherwise; also
/// the largest frame we accept (we do not raise ours).
const DEFAULT_MAX_FRAME: usize = 16_384;
const DEFAULT_WINDOW: i64 = 65_535;

/// Our receive windows: as the runtime path's `h2` client sets them.
const STREAM_WINDOW: u32 = 4 << 20;
const CONN_WINDOW: u32 = 16 << 20;

const MAX_STREAM_ID: u32 = (1 << 31) - 1;

pub struct Grpc {
    /// The request's HPACK header block, the same for every request.
    block: Vec<u8>,
    bodies: Vec<Bytes>,
    /// Per connection, reset by `opening`.
    conn: ConnState,
}

struct ConnState {
    decoder: fluke_hpack::Decoder<'static>,
    next_stream: u32,
    peer_max_frame: usize,
    peer_initial_window: i64,
    send_window: i64,
    unreturned: Unreturned,
}

impl ConnState {
    fn new() -> Self {
        Self {
            decoder: fluke_hpack::Decoder::new(),
            next_stream: 1,
            peer_max_frame: DEFAULT_MAX_FRAME,
            peer_initial_window: DEFAULT_WINDOW,
            send_window: DEFAULT_WINDOW,
            unreturned: Unreturned::default(),
        }
    }
}

/// What one stream got back.
#[derive(Default)]
struct Answer {
    status: Option<u16>,
    /// `grpc-status` and `grpc-message` of the headers, then of the trailers.
    head: HeaderMap,
    trailers: Option<HeaderMap>,
    message: BytesMut,
    ended: bool,
}

impl Grpc {
    pub fn new(p: &Prepared) -> Self {
        Self {
            block: header_block(p),
            bodies: p.bodies.clone(),
            conn: ConnState::new(),
        }
    }

    /// Whether the request's headers fit one HEADERS frame.
    pub fn fits(p: &Prepared) -> bool {
        header_block(p).len() <= DEFAULT_MAX_FRAME
    }

    /// Sends HEADERS and the body's DATA within the server's windows.
    fn send(
        &mut self,
        lane: &mut Lane,
        id: u32,
        body: &[u8],
        answer: &mut Answer,
    ) -> Result<(), Failure> {
        let mut out = Vec::with_capacity(18 + self.block.len() + body.len());
        frame(&mut out, HEADERS, END_HEADERS, id, &self.block);
        let mut window = self.conn.peer_initial_window;
        let mut sent = 0;
        loop {
            let room = (body.len() - sent)
                .min(self.conn.peer_max_frame)
                .min(usize::try_from(window.min(self.conn.send_window)).unwrap_or(0));
            let last = sent + room == body.len();
            if room > 0 || last {
                let flags = if last { END_STREAM } else { 0 };
                frame(&mut out, DATA, flags, id, &body[sent..sent + room]);
                sent += room;
                window -= room as i64;
                self.conn.send_window -= room as i64;
                if last {
                    return lane.write_all(&out);
                }
                continue;
            }
            // Out of window: send what we have and wait for WINDOW_UPDATE.
            lane.write_all(&out)?;
            out.clear();
            self.read_frame(lane, id, answer, Some(&mut window))?;
            if answer.ended {
                // The server answered before taking the whole body.
                return Ok(());
            }
        }
    }

    /// Reads and handles one frame; `window` is the request stream's send
    /// window while its body is still going out.
    fn read_frame(
        &mut self,
        lane: &mut Lane,
        id: u32,
        answer: &mut Answer,
        window: Option<&mut i64>,
    ) -> Result<(), Failure> {
        let (kind, flags, stream, payload) = next_frame(lane)?;
        match kind {
            SETTINGS if flags & ACK == 0 => {
                let before = self.conn.peer_initial_window;
                for s in payload.chunks_exact(6) {
                    let value = be_u32(&s[2..]);
                    match u16::from_be_bytes([s[0], s[1]]) {
                        SETTINGS_INITIAL_WINDOW_SIZE => {
                            self.conn.peer_initial_window = i64::from(value);
                        }
                        SETTINGS_MAX_FRAME_SIZE => {
                            self.conn.peer_max_frame =
                                (value as usize).clamp(DEFAULT_MAX_FRAME, 1 << 24);
                        }
                        _ => {}
                    }
                }
                // A new initial window moves the open stream's by as much.
                if let Some(w) = window {
                    *w += self.conn.peer_initial_window - before;
                }
                self.ack_settings(lane)
            }
            PING if flags & ACK == 0 => {
                let mut out = Vec::with_capacity(17);
                frame(&mut out, PING, ACK, 0, &payload);
                lane.write_all(&out)
            }
            WINDOW_UPDATE => {
                let inc = be_u32(&payload) & MAX_STREAM_ID;
                if stream == 0 {
                    self.conn.send_window += i64::from(inc);
                } else if let (true, Some(w)) = (stream == id, window) {
                    *w += i64::from(inc);
                }
                Ok(())
            }
            GOAWAY => {
                lane.conn()?.closing = true;
                let last = be_u32(&payload) & MAX_STREAM_ID;
                if id > last {
                    return Err(Failure::Request(
                        "the server closed the connection (GOAWAY)".into(),
                    ));
                }
                Ok(())
            }
            RST_STREAM if stream == id => {
                let code = be_u32(&payload);
                Err(Failure::Request(format!(
                    "stream reset by the server (HTTP/2 error code {code})"
                )))
            }
            HEADERS => {
                let mut block = unpad(flags, &payload, true)?.to_vec();
                let mut end = flags & END_HEADERS != 0;
                while !end {
                    let (kind, cflags, cstream, more) = next_frame(lane)?;
                    if kind != CONTINUATION || cstream != stream {
                        return Err(Failure::Request("header block interrupted".into()));
                    }
                    block.extend_from_slice(&more);
                    end = cflags & END_HEADERS != 0;
                }
                // Every block goes through the decoder, in order, to keep
                // its table the server's.
                let mut map = HeaderMap::new();
                let mut status = None;
                self.conn
                    .decoder
                    .decode_with_cb(&block, |name, value| {
                        keep(&mut map, &mut status, name, value)
                    })
                    .map_err(|e| Failure::Request(format!("bad header block: {e:?}")))?;
                if stream == id {
                    if answer.status.is_none() {
                        answer.status = status;
                        answer.head = map;
                    } else {
                        answer.trailers = Some(map);
                    }
                    answer.ended |= flags & END_STREAM != 0;
                }
                Ok(())
            }
            DATA => {
                let data = unpad(flags, &payload, false)?;
                if stream == id {
                    answer.message.extend_from_slice(data);
                    answer.ended |= flags & END_STREAM != 0;
                }
                self.give_back(lane, stream, payload.len() as u32, answer.ended)
            }
            _ => Ok(()),
        }
    }

    fn ack_settings(&mut self, lane: &mut Lane) -> Result<(), Failure> {
        let mut out = Vec::with_capacity(9);
        frame(&mut out, SETTINGS, ACK, 0, &[]);
        lane.write_all(&out)
    }

    /// Returns received DATA to the server's windows (see [`Unreturned`]).
    fn give_back(
        &mut self,
        lane: &mut Lane,
        stream: u32,
        n: u32,
        ended: bool,
    ) -> Result<(), Failure> {
        let (conn, on_stream) = self.conn.unreturned.add(n, ended);
        let mut out = Vec::new();
        if let Some(inc) = conn {
            frame(&mut out, WINDOW_UPDATE, 0, 0, &inc.to_be_bytes());
        }
        if let Some(inc) = on_stream {
            frame(&mut out, WINDOW_UPDATE, 0, stream, &inc.to_be_bytes());
        }
        if out.is_empty() {
            Ok(())
        } else {
            lane.write_all(&out)
        }
    }
}

/// DATA received and not yet given back with WINDOW_UPDATE: the
/// connection's is returned in bulk once half its window is used; the
/// stream's only when one answer uses half of its own (a stream's window
/// is fresh for every request, so most answers never need it).
#[derive(Debug, Default)]
struct Unreturned {
    conn: u32,
    stream: u32,
}

impl Unreturned {
    /// Counts `n` bytes of DATA on the open stream (which `ended` with
    /// them): the increments to send now, for the connection and for the
    /// stream.
    fn add(&mut self, n: u32, ended: bool) -> (Option<u32>, Option<u32>) {
        self.conn += n;
        self.stream += n;
        let conn = (self.conn >= CONN_WINDOW / 2).then(|| std::mem::take(&mut self.conn));
        let stream = if ended {
            self.stream = 0;
            None
        } else {
            (self.stream >= STREAM_WINDOW / 2).then(|| std::mem::take(&mut self.stream))
        };
        (conn, stream)
    }
}

impl Protocol for Grpc {
    fn opening(&mut self) -> Vec<u8> {
        self.conn = ConnState::new();
        let mut out = PREFACE.to_vec();
        let mut settings = Vec::with_capacity(12);
        for (id, value) in [
            (SETTINGS_ENABLE_PUSH, 0u32),
            (SETTINGS_INITIAL_WINDOW_SIZE, STREAM_WINDOW),
        ] {
            settings.extend_from_slice(&id.to_be_bytes());
            settings.extend_from_slice(&value.to_be_bytes());
        }
        frame(&mut out, SETTINGS, 0, 0, &settings);
        let grow = CONN_WINDOW - DEFAULT_WINDOW as u32;
        frame(&mut out, WINDOW_UPDATE, 0, 0, &grow.to_be_bytes());
        out
    }

    fn exchange(&mut self, lane: &mut Lane, i: usize) -> Result<(), Failure> {
        let answer = self
            .call(lane, i)
            .map_err(|f| f.prefixed("gRPC request failed: "))?;
        let status = answer.status.unwrap_or(0);
        let status = StatusCode::from_u16(status).unwrap_or(StatusCode::BAD_GATEWAY);
        check_head(status, &answer.head).map_err(Failure::Answer)?;
        check_status(answer.trailers.as_ref()).map_err(Failure::Answer)?;
        let mut message = answer.message;
        match take_message(&mut message) {
            Ok(Some(_)) => Ok(()),
            Ok(None) => Err(Failure::Answer("gRPC response without a message".into())),
            Err(e) => Err(Failure::Answer(e)),
        }
    }
}

impl Grpc {
    /// One stream: the request out, frames in until the stream ends.
    fn call(&mut self, lane: &mut Lane, i: usize) -> Result<Answer, Failure> {
        let id = self.conn.next_stream;
        self.conn.next_stream += 2;
        self.conn.unreturned.stream = 0;
        if self.conn.next_stream > MAX_STREAM_ID {
            // Stream ids are used up: this is the connection's last.
            lane.conn()?.closing = true;
        }
        let body = self.bodies[i % self.bodies.len()].clone();
        let mut answer = Answer::default();
        self.send(lane, id, &body, &mut answer)?;
        while !answer.ended {
            self.read_frame(lane, id, &mut answer, None)?;
        }
        Ok(answer)
    }
}

/// Keeps what the checks read: `:status`, `grpc-status`, `grpc-message`.
fn keep(map: &mut HeaderMap, status: &mut Option<u16>, name: Cow<[u8]>, value: Cow<[u8]>) {
    match &*name {
        b":status" => {
            *status = std::str::from_utf8(&value)
                .ok()
                .and_then(|v| v.parse().ok())
        }
        b"grpc-status" | b"grpc-message" => {
            if let Ok(v) = HeaderValue::from_bytes(&value) {
                let name = if &*name == b"grpc-status" {
                    "grpc-status"
                } else {
                    "grpc-message"
                };
                map.insert(name, v);
            }
        }
        _ => {}
    }
}

/// A frame's payload without its padding (and, on HEADERS, its priority
/// fields).
fn unpad(flags: u8, payload: &[u8], headers: bool) -> Result<&[u8], Failure> {
    let bad = || Failure::Request("malformed frame padding".into());
    let mut p = payload;
    let mut pad = 0;
    if flags & PADDED != 0 {
        let (&n, rest) = p.split_first().ok_or_else(bad)?;
        pad = usize::from(n);
        p = rest;
    }
    if headers && flags & PRIORITY != 0 {
        p = p.get(5..).ok_or_else(bad)?;
    }
    p.get(..p.len().checked_sub(pad).ok_or_else(bad)?)
        .ok_or_else(bad)
}

/// Reads one whole frame: type, flags, stream id, payload (consumed).
fn next_frame(lane: &mut Lane) -> Result<(u8, u8, u32, Vec<u8>), Failure> {
    let closed = || Failure::Request("connection closed".into());
    while lane.buffered().len() < 9 {
        lane.fill()?.map_err(|_| closed())?;
    }
    let h = lane.buffered();
    let len = usize::from(h[0]) << 16 | usize::from(h[1]) << 8 | usize::from(h[2]);
    let (kind, flags) = (h[3], h[4]);
    let stream = be_u32(&h[5..]) & MAX_STREAM_ID;
    if len > DEFAULT_MAX_FRAME {
        return Err(Failure::Request(format!(
            "frame of {len} bytes over the maximum frame size"
        )));
    }
    while lane.buffered().len() < 9 + len {
        lane.fill()?.map_err(|_| closed())?;
    }
    let payload = lane.buffered()[9..9 + len].to_vec();
    lane.consume(9 + len);
    Ok((kind, flags, stream, payload))
}

/// The big-endian u32 a frame field starts with (0 if it is cut short).
fn be_u32(b: &[u8]) -> u32 {
    b.get(..4)
        .map_or(0, |b| u32::from_be_bytes([b[0], b[1], b[2], b[3]]))
}

fn frame(out: &mut Vec<u8>, kind: u8, flags: u8, stream: u32, payload: &[u8]) {
    let len = payload.len() as u32;
    out.extend_from_slice(&len.to_be_bytes()[1..]);
    out.push(kind);
    out.push(flags);
    out.extend_from_slice(&stream.to_be_bytes());
    out.extend_from_slice(payload);
}

/// The request headers as HPACK literals without indexing (RFC 7541 6.2.2),
/// pseudo-headers first.
fn header_block(p: &Prepared) -> Vec<u8> {
    let mut out = Vec::with_capacity(256);
    let authority = p.uri.authority().map_or("", |a| a.as_str());
    let path = p.uri.path_and_query().map_or("/", |pq| pq.as_str());
    for (name, value) in [
        (":method", p.method.as_str()),
        (":scheme", "http"),
        (":path", path),
        (":authority", authority),
    ] {
        literal(&mut out, name.as_bytes(), value.as_bytes());
    }
    for (name, value) in &p.headers {
        literal(&mut out, name.as_str().as_bytes(), value.as_bytes());
    }
    out
}

fn literal(out: &mut Vec<u8>, name: &[u8], value: &[u8]) {
    out.push(0x00);
    for s in [name, value] {
        integer(out, s.len(), 7, 0x00);
        out.extend_from_slice(s);
    }
}

/// An HPACK integer with an `n`-bit prefix (RFC 7541 5.1) after `high`.
fn integer(out: &mut Vec<u8>, mut v: usize, n: u32, high: u8) {
    let max = (1usize << n) - 1;
    if v < max {
        out.push(high | v as u8);
        return;
    }
    out.push(high | max as u8);
    v -= max;
    while v >= 128 {
        out.push((v % 128) as u8 | 0x80);
        v /= 128;
    }
    out.push(v as u8);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn integers_take_their_prefix_then_seven_bit_groups() {
        // RFC 7541 C.1.1 and C.1.2.
        let mut out = Vec::new();
        integer(&mut out, 10, 5, 0);
        assert_eq!(out, [10]);
        out.clear();
        integer(&mut out, 1337, 5, 0);
        assert_eq!(out, [31, 154, 10]);
    }

    #[test]
    fn the_header_block_decodes_to_the_request_headers() {
        let p = crate::bench::request::grpc_prepared(
            "127.0.0.1:8001",
            "ModelInfer",
            vec![Bytes::from_static(b"x")],
            false,
        )
        .expect("prepared");
        let block = header_block(&p);
        let got = fluke_hpack::Decoder::new()
            .decode(&block)
            .expect("a valid block");
        let got: Vec<(String, String)> = got
            .into_iter()
            .map(|(n, v)| {
                (
                    String::from_utf8_lossy(&n).into_owned(),
                    String::from_utf8_lossy(&v).into_owned(),
                )
            })
            .collect();
        let want = [
            (":method", "POST"),
            (":scheme", "http"),
            (":path", "/inference.GRPCInferenceService/ModelInfer"),
            (":authority", "127.0.0.1:8001"),
            ("content-type", "application/grpc"),
            ("te", "trailers"),
        ];
        assert_eq!(got.len(), want.len(), "{got:?}");
        for (g, w) in got.iter().zip(want) {
            assert_eq!((g.0.as_str(), g.1.as_str()), w);
        }
    }

    #[test]
    fn received_data_goes_back_to_both_windows() {
        let mut u = Unreturned::default();
        // A short answer: nothing to give back yet.
        assert_eq!(u.add(16_384, false), (None, None));
        assert_eq!(u.add(100, true), (None, None));
        // A long answer gets its stream's window back at half of it, and
        // the connection's once half of the connection window is used.
        let mut stream_back = 0;
        let mut conn_back = 0;
        let frames = (CONN_WINDOW / 16_384) as usize;
        for i in 0..frames {
            let (c, st) = u.add(16_384, i + 1 == frames);
            conn_back += c.unwrap_or(0);
            stream_back += st.unwrap_or(0);
        }
        assert!(stream_back >= STREAM_WINDOW / 2 * 3, "{stream_back}");
        assert!(conn_back >= CONN_WINDOW / 2, "{conn_back}");
        // Returned bytes never exceed received ones.
        assert!(conn_back as u64 <= 16_484 + u64::from(CONN_WINDOW));
    }

    #[test]
    fn padding_and_priority_come_off_a_payload() {
        let padded = [2, b'a', b'b', 0, 0];
        assert_eq!(unpad(PADDED, &padded, false).ok(), Some(&b"ab"[..]));
        let prio = [0, 0, 0, 1, 9, b'h'];
        assert_eq!(unpad(PRIORITY, &prio, true).ok(), Some(&b"h"[..]));
        assert!(unpad(PADDED, &[9, b'a'], false).is_err());
    }
}
