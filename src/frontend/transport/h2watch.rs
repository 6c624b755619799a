//! gRPC-core's HTTP/2 connection rules on our hyper HTTP/2 server, as
//! Triton sets them (`--grpc-keepalive-*`, `--grpc-http2-*`):
//!
//! - keepalive: after `keepalive_time` without a frame from the client the
//!   server PINGs it, and closes the connection when the ACK does not come
//!   within `keepalive_timeout`; with no call open only when
//!   `permit_without_calls`; and at most `max_pings_without_data` pings
//!   (0 = no limit) until the server sends DATA or HEADERS again — then it
//!   waits rather than pings;
//! - ping abuse: a client PING sooner than `min_recv_ping_interval` after
//!   its previous one (2 hours when no call is open and
//!   `permit_without_calls` is off) with no DATA or HEADERS sent since is a
//!   strike; more than `max_ping_strikes` (0 = no limit) and the server
//!   sends GOAWAY ENHANCE_YOUR_CALM "too_many_pings" and closes.
//!
//! hyper (h2) neither limits the pings it receives nor counts the ones it
//! sends, so [`ConnIo`](super::ConnIo) watches the frames crossing the
//! socket: it reads each frame's 9-byte header (and a PING's 8-byte
//! payload), skipping payloads, and writes our own PING and GOAWAY frames
//! between hyper's, only at a frame boundary of what hyper writes. The
//! ACKs of our pings are taken out of what hyper reads when a read holds
//! them whole (h2 would log an ACK it never asked for).
//!
//! Costs: a few compares per frame header on each read and write of a
//! gRPC connection; nothing on HTTP/1 connections, which have no watch.

use std::{
    cell::RefCell,
    time::{Duration, Instant},
};

const FRAME_HEADER: usize = 9;
const DATA: u8 = 0x0;
const HEADERS: u8 = 0x1;
const PING: u8 = 0x6;
const GOAWAY: u8 = 0x7;
const ACK: u8 = 0x1;
const ENHANCE_YOUR_CALM: u32 = 0xb;
/// HTTP/2's client connection preface, before the first frame.
const CLIENT_PREFACE: u32 = 24;
/// Our keepalive PING's opaque data (h2's own pings use other values).
const KEEPALIVE_PAYLOAD: [u8; 8] = *b"ssrvkeep";
/// gRPC-core's minimum interval between client pings when no call is
/// open and pings without calls are not permitted.
const IDLE_PING_INTERVAL: Duration = Duration::from_secs(2 * 60 * 60);

/// The limits of one gRPC connection, from the server's options.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct H2Rules {
    pub keepalive_time: Option<Duration>,
    pub keepalive_timeout: Duration,
    pub permit_without_calls: bool,
    pub max_pings_without_data: u32,
    pub min_recv_ping_interval: Duration,
    pub max_ping_strikes: u32,
}

/// What a frame scan found.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Frame {
    /// A frame header: type, flags, stream id.
    Header(u8, u8, u32),
    /// A whole PING: ACK flag, payload; `start` is where its header began
    /// in the scanned chunk, when it began there.
    Ping {
        ack: bool,
        payload: [u8; 8],
        start: Option<usize>,
    },
}

/// Follows frame boundaries across a byte stream cut anywhere.
#[derive(Debug, Default)]
struct Scanner {
    /// Bytes still to skip before the first frame (the client preface).
    skip: u32,
    head: [u8; FRAME_HEADER],
    /// Header bytes collected; `FRAME_HEADER` while in a payload.
    have: usize,
    /// Payload bytes left of the current frame.
    left: u32,
    kind: u8,
    flags: u8,
    ping: [u8; 8],
    ping_have: usize,
    /// Where the current frame's header began in the chunk being scanned.
    start: Option<usize>,
}

impl Scanner {
    fn at_boundary(&self) -> bool {
        self.skip == 0 && self.have == 0
    }

    /// Bytes until the current frame ends (0 at a boundary).
    fn until_boundary(&self) -> usize {
        if self.skip > 0 {
            return self.skip as usize;
        }
        match self.have {
            0 => 0,
            FRAME_HEADER => self.left as usize,
            n => {
                // In a header: its payload length is not known yet; the
                // rest of the header is the least that must go first.
                FRAME_HEADER - n
            }
        }
    }

    fn feed(&mut self, chunk: &[u8], mut on: impl FnMut(Frame)) {
        let mut at = 0;
        while at < chunk.len() {
            let rest = &chunk[at..];
            if self.skip > 0 {
                let n = rest.len().min(self.skip as usize);
                self.skip -= n as u32;
                at += n;
                continue;
            }
            if self.have < FRAME_HEADER {
                if self.have == 0 {
                    self.start = Some(at);
                }
                let n = rest.len().min(FRAME_HEADER - self.have);
                self.head[self.have..self.have + n].copy_from_slice(&rest[..n]);
                self.have += n;
                at += n;
                if self.have == FRAME_HEADER {
                    let h = &self.head;
                    self.left = u32::from_be_bytes([0, h[0], h[1], h[2]]);
                    self.kind = h[3];
                    self.flags = h[4];
                    let stream = u32::from_be_bytes([h[5], h[6], h[7], h[8]]) & 0x7fff_ffff;
                    self.ping_have = 0;
                    on(Frame::Header(self.kind, self.flags, stream));
                    if self.left == 0 {
                        self.have = 0;
                    }
                }
                continue;
            }
            let n = rest.len().min(self.left as usize);
            if self.kind == PING && self.ping_have < 8 {
                let take = n.min(8 - self.ping_have);
                self.ping[self.ping_have..self.ping_have + take].copy_from_slice(&rest[..take]);
                self.ping_have += take;
            }
            self.left -= n as u32;
            at += n;
            if self.left == 0 {
                if self.kind == PING && self.ping_have == 8 {
                    on(Frame::Ping {
                        ack: self.flags & ACK != 0,
                        payload: self.ping,
                        start: self.start,
                    });
                }
                self.have = 0;
            }
        }
        // A frame continued in the next chunk did not begin in it.
        self.start = None;
    }
}

#[derive(Debug)]
struct State {
    rx: Scanner,
    tx: Scanner,
    /// Frames of ours to write at the next boundary of hyper's writes.
    inject: Vec<u8>,
    injected: usize,
    /// A GOAWAY that ends the connection is queued or sent.
    aborting: bool,
    /// That GOAWAY is written and flushed: reads end, writes fail.
    closed: bool,
    last_rx: Instant,
    /// Our keepalive PING in flight, since then.
    ping_sent: Option<Instant>,
    pings_without_data: u32,
    last_client_ping: Option<Instant>,
    strikes: u32,
    /// Highest stream id the client opened (GOAWAY's last stream).
    last_stream: u32,
}

/// One gRPC connection's frame watch (see the module docs).
#[derive(Debug)]
pub struct H2Watch {
    rules: H2Rules,
    state: RefCell<State>,
}

/// What the keepalive wants of the connection.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum KeepAlive {
    /// Nothing before then (`None`: keepalive off).
    Until(Option<Instant>),
    /// Our PING was not acknowledged in time.
    Dead,
}

impl H2Watch {
    pub fn new(rules: H2Rules) -> Self {
        Self {
            rules,
            state: RefCell::new(State {
                rx: Scanner {
                    skip: CLIENT_PREFACE,
                    ..Scanner::default()
                },
                tx: Scanner::default(),
                inject: Vec::new(),
                injected: 0,
                aborting: false,
                closed: false,
                last_rx: Instant::now(),
                ping_sent: None,
                pings_without_data: 0,
                last_client_ping: None,
                strikes: 0,
                last_stream: 0,
            }),
        }
    }

    /// Scans bytes hyper is about to read (`chunk`, read now); returns the
    /// range of `chunk` holding the ACK of our ping, to be taken out (one
    /// ping of ours is in flight at a time).
    pub(super) fn on_read(&self, chunk: &[u8], calls_open: bool) -> Option<(usize, usize)> {
        let now = Instant::now();
        let mut strip = None;
        let mut s = self.state.borrow_mut();
        let s = &mut *s;
        let mut abuse = false;
        if !chunk.is_empty() {
            s.last_rx = now;
        }
        let rules = self.rules;
        let (rx, last_stream, ping_sent, last_client_ping, strikes) = (
            &mut s.rx,
            &mut s.last_stream,
            &mut s.ping_sent,
            &mut s.last_client_ping,
            &mut s.strikes,
        );
        rx.feed(chunk, |frame| match frame {
            Frame::Header(HEADERS, _, stream) => *last_stream = (*last_stream).max(stream),
            Frame::Header(..) => {}
            Frame::Ping {
                ack: true,
                payload,
                start,
            } if payload == KEEPALIVE_PAYLOAD => {
                *ping_sent = None;
                if let (Some(start), None) = (start, strip) {
                    strip = Some((start, start + FRAME_HEADER + 8));
                }
            }
            Frame::Ping { ack: true, .. } => {}
            Frame::Ping { ack: false, .. } => {
                let interval = if !calls_open && !rules.permit_without_calls {
                    IDLE_PING_INTERVAL
                } else {
                    rules.min_recv_ping_interval
                };
                let too_soon = last_client_ping.is_some_and(|t| now < t + interval);
                *last_client_ping = Some(now);
                if too_soon {
                    *strikes += 1;
                    if rules.max_ping_strikes != 0 && *strikes > rules.max_ping_strikes {
                        abuse = true;
                    }
                }
            }
        });
        if abuse && !s.aborting {
            tracing::info!(
                strikes = s.strikes,
                "grpc: the client pings too often (--grpc-http2-max-ping-strikes); \
                 GOAWAY ENHANCE_YOUR_CALM \"too_many_pings\""
            );
            s.aborting = true;
            // Our own frames still queued are dropped: the GOAWAY goes
            // first, at the next boundary.
            if s.injected == 0 {
                s.inject.clear();
            }
            let debug = b"too_many_pings";
            let mut frame = Vec::with_capacity(FRAME_HEADER + 8 + debug.len());
            frame.extend_from_slice(&((8 + debug.len()) as u32).to_be_bytes()[1..]);
            frame.extend_from_slice(&[GOAWAY, 0, 0, 0, 0, 0]);
            frame.extend_from_slice(&s.last_stream.to_be_bytes());
            frame.extend_from_slice(&ENHANCE_YOUR_CALM.to_be_bytes());
            frame.extend_from_slice(debug);
            s.inject.extend_from_slice(&frame);
        }
        strip
    }

    /// Scans bytes hyper wrote.
    pub(super) fn on_written(&self, bytes: &[u8]) {
        let mut s = self.state.borrow_mut();
        let s = &mut *s;
        let (tx, last_client_ping, strikes, pings) = (
            &mut s.tx,
            &mut s.last_client_ping,
            &mut s.strikes,
            &mut s.pings_without_data,
        );
        tx.feed(bytes, |frame| {
            if let Frame::Header(DATA | HEADERS, ..) = frame {
                // Data flows: gRPC-core forgives the client's pings and
                // may ping again.
                *last_client_ping = None;
                *strikes = 0;
                *pings = 0;
            }
        });
    }

    /// Our frames waiting to be written, when hyper's writes are at a frame
    /// boundary; `None` when there is nothing to write now.
    pub(super) fn injectable(&self) -> Option<Vec<u8>> {
        let s = self.state.borrow();
        (s.injected < s.inject.len() && s.tx.at_boundary()).then(|| s.inject[s.injected..].to_vec())
    }

    /// Records `n` bytes of our frames written.
    pub(super) fn injected(&self, n: usize) {
        let mut s = self.state.borrow_mut();
        s.injected += n;
        if s.injected >= s.inject.len() {
            s.inject.clear();
            s.injected = 0;
            if s.aborting {
                s.closed = true;
            }
        }
    }

    /// How much of hyper's `len` bytes may be written before ours: all
    /// when nothing of ours waits, else up to the current frame's end.
    pub(super) fn writable(&self, len: usize) -> usize {
        let s = self.state.borrow();
        if s.injected < s.inject.len() {
            len.min(s.tx.until_boundary())
        } else {
            len
        }
    }

    /// The connection's GOAWAY is sent: hyper reads EOF and fails writes.
    pub(super) fn is_closed(&self) -> bool {
        self.state.borrow().closed
    }

    /// Keepalive: queues our PING when it is due and allowed, and says
    /// when to look again.
    pub fn keepalive(&self, now: Instant, calls_open: bool) -> KeepAlive {
        let Some(every) = self.rules.keepalive_time else {
            return KeepAlive::Until(None);
        };
        let mut s = self.state.borrow_mut();
        if s.aborting {
            return KeepAlive::Until(None);
        }
        if let Some(sent) = s.ping_sent {
            let by = sent + self.rules.keepalive_timeout;
            return if now >= by {
                KeepAlive::Dead
            } else {
                KeepAlive::Until(Some(by))
            };
        }
        let due = s.last_rx + every;
        if now < due {
            return KeepAlive::Until(Some(due));
        }
        let allowed = (calls_open || self.rules.permit_without_calls)
            && (self.rules.max_pings_without_data == 0
                || s.pings_without_data < self.rules.max_pings_without_data);
        if !allowed {
            // gRPC-core waits for a call or for data rather than ping.
            return KeepAlive::Until(Some(now + every));
        }
        s.ping_sent = Some(now);
        s.pings_without_data += 1;
        s.inject.extend_from_slice(&[0, 0, 8, PING, 0, 0, 0, 0, 0]);
        s.inject.extend_from_slice(&KEEPALIVE_PAYLOAD);
        KeepAlive::Until(Some(now + self.rules.keepalive_timeout))
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn frame(kind: u8, flags: u8, stream: u32, payload: &[u8]) -> Vec<u8> {
        let mut f = (payload.len() as u32).to_be_bytes()[1..].to_vec();
        f.extend_from_slice(&[kind, flags]);
        f.extend_from_slice(&stream.to_be_bytes());
        f.extend_from_slice(payload);
        f
    }

    #[test]
    fn frames_are_found_across_any_cut() {
        let mut bytes = frame(HEADERS, 4, 3, &[1, 2, 3]);
        bytes.extend(frame(PING, 0, 0, b"abcdefgh"));
        bytes.extend(frame(DATA, 0, 3, &[]));
        for cut in 0..bytes.len() {
            let mut s = Scanner::default();
            let mut seen = Vec::new();
            s.feed(&bytes[..cut], |f| seen.push(f));
            s.feed(&bytes[cut..], |f| seen.push(f));
            assert!(s.at_boundary());
            let kinds: Vec<_> = seen
                .iter()
                .map(|f| match f {
                    Frame::Header(k, _, _) => *k,
                    Frame::Ping { payload, .. } => {
                        assert_eq!(payload, b"abcdefgh");
                        0xff
                    }
                })
                .collect();
            assert_eq!(kinds, [HEADERS, PING, 0xff, DATA], "cut at {cut}");
        }
    }

    #[test]
    fn a_boundary_is_known_mid_frame() {
        let mut s = Scanner::default();
        s.feed(&frame(DATA, 0, 1, &[0; 10])[..12], |_| {});
        assert_eq!(s.until_boundary(), 7);
        s.feed(&[0; 7], |_| {});
        assert!(s.at_boundary());
    }

    fn rules() -> H2Rules {
        H2Rules {
            keepalive_time: Some(Duration::from_secs(60)),
            keepalive_timeout: Duration::from_secs(5),
            permit_without_calls: false,
            max_pings_without_data: 2,
            min_recv_ping_interval: Duration::from_secs(300),
            max_ping_strikes: 2,
        }
    }

    fn client_ping(w: &H2Watch, calls_open: bool) {
        w.on_read(&frame(PING, 0, 0, b"12345678"), calls_open);
    }

    #[test]
    fn pings_past_the_strikes_queue_a_goaway_and_data_forgives_them() {
        let w = H2Watch::new(rules());
        w.on_read(&[0; CLIENT_PREFACE as usize], true);
        // The first ping is never a strike; two more are; a third ends it.
        for _ in 0..3 {
            client_ping(&w, true);
        }
        assert!(w.injectable().is_none());
        // Data sent by the server resets the count.
        w.on_written(&frame(DATA, 0, 1, &[1]));
        for _ in 0..3 {
            client_ping(&w, true);
        }
        assert!(w.injectable().is_none());
        client_ping(&w, true);
        let goaway = w.injectable().unwrap();
        assert_eq!(goaway[3], GOAWAY);
        assert_eq!(&goaway[13..17], &ENHANCE_YOUR_CALM.to_be_bytes());
        assert!(goaway.ends_with(b"too_many_pings"));
        w.injected(goaway.len());
        assert!(w.is_closed());
    }

    #[test]
    fn keepalive_pings_stop_after_max_pings_without_data() {
        let w = H2Watch::new(rules());
        w.on_read(&[0; CLIENT_PREFACE as usize], true);
        let t0 = Instant::now() + Duration::from_secs(61);
        // No call open and not permitted: no ping.
        assert_eq!(
            w.keepalive(t0, false),
            KeepAlive::Until(Some(t0 + Duration::from_secs(60)))
        );
        let mut at = t0;
        for _ in 0..2 {
            assert!(matches!(w.keepalive(at, true), KeepAlive::Until(Some(_))));
            let ping = w.injectable().unwrap();
            w.injected(ping.len());
            // The client's ACK, read whole, is taken out.
            let ack = frame(PING, ACK, 0, &KEEPALIVE_PAYLOAD);
            assert_eq!(w.on_read(&ack, true), Some((0, ack.len())));
            at += Duration::from_secs(61);
        }
        // A third ping waits for data.
        let _ = w.keepalive(at + Duration::from_secs(61), true);
        assert!(w.injectable().is_none());
        w.on_written(&frame(HEADERS, 4, 1, &[0x88]));
        let _ = w.keepalive(at + Duration::from_secs(122), true);
        assert!(w.injectable().is_some());
    }

    #[test]
    fn an_unacknowledged_ping_is_a_dead_connection() {
        let w = H2Watch::new(rules());
        let t0 = Instant::now() + Duration::from_secs(61);
        let _ = w.keepalive(t0, true);
        assert_eq!(
            w.keepalive(t0 + Duration::from_secs(6), true),
            KeepAlive::Dead
        );
    }
}
