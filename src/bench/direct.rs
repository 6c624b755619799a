//! The direct lane: a worker thread with one request at a time on a
//! plaintext HTTP/1.1 connection drives its socket itself. It writes the
//! pre-encoded request, then reads the non-blocking socket in a loop for
//! the busy-poll window and sleeps in `poll(2)` after it. There is no
//! runtime, no epoll instance, no io_uring and no HTTP client stack in
//! between.
//!
//! Why: at concurrency 1 the generator's own layers are part of every
//! latency it reports. Against the same server on the 2-core VM, a client
//! reading its socket directly measured 17.7 µs p50 where the runtime and
//! hyper path measured 22.2 µs. perf_analyzer's c=1 figure is a round trip
//! too, so what the generator adds should be as close to the kernel's
//! round trip as a client can get.
//!
//! Everything else goes through monoio and hyper as before: TLS, gRPC,
//! sequences, open loops, several requests per thread, bodies over
//! [`MAX_BODY`], and `--no-direct-http`.

use std::{
    io::{self, Read, Write},
    net::TcpStream,
    os::fd::AsRawFd,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use bytes::Bytes;

use super::{
    cli::Load,
    grpc::Completion,
    load::WorkerSpec,
    request::{http_error, Prepared},
    stats::dur_ns,
    wire::Wire,
};
use crate::shard::spin::{Contention, SpinStats, YIELD_EVERY};

/// Request bodies above this go through hyper: writing a large body
/// without reading would miss an early answer (413) that hyper reads.
pub const MAX_BODY: usize = 256 << 10;

/// Responses above this are refused rather than buffered.
const MAX_RESPONSE: usize = 1 << 30;

const CONNECT_TIMEOUT: Duration = Duration::from_secs(5);

/// How long a request in flight when the step stops may still take (the
/// runtime path's bound too).
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How often a sleeping wait looks at the stop flag.
const WAKE_EVERY: Duration = Duration::from_millis(10);

/// Whether `spec` runs on the direct lane.
pub fn applies(spec: &WorkerSpec) -> bool {
    spec.direct_http
        && spec.load == Load::Concurrency(1)
        && spec.prepared.wire == Wire::Http1
        && spec.target.tls.is_none()
        && spec.sequence.is_none()
        && spec.prepared.template.is_none()
        && spec.prepared.bodies.iter().all(|b| b.len() <= MAX_BODY)
}

/// The closed loop of one request at a time, until the step stops.
pub fn run(spec: &WorkerSpec) {
    let requests: Vec<Vec<u8>> = spec
        .prepared
        .bodies
        .iter()
        .map(|b| encode(&spec.prepared, b))
        .collect();
    let mut lane = Lane {
        spec,
        conn: None,
        contention: Contention::new(),
        stats: SpinStats::default(),
        yielded: None,
        stop_seen: None,
    };
    let mut i = 0usize;
    while !spec.stop.load(Ordering::Relaxed) {
        let t0 = Instant::now();
        let result = lane.exchange(&requests[i % requests.len()]);
        let elapsed = dur_ns(t0.elapsed());
        match result {
            Ok(()) => {
                spec.recorder
                    .record_request(t0, 0, Ok((elapsed, Completion::single())), false)
            }
            // Cut off by the step's end: neither a success nor a failure.
            Err(Failure::Abandoned) => break,
            Err(Failure::Connect(e)) => {
                spec.recorder.record_request(t0, 0, Err(e), false);
                // Do not spin on a refused connection.
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(Failure::Request(e)) => spec.recorder.record_request(t0, 0, Err(e), false),
            Err(Failure::Closed) => spec.recorder.record_request(
                t0,
                0,
                Err(format!("HTTP request failed: {CLOSED}")),
                false,
            ),
        }
        i = i.wrapping_add(1);
    }
}

/// The request line, the prepared headers, the length and the body: what
/// hyper would have written for the same request.
fn encode(p: &Prepared, body: &Bytes) -> Vec<u8> {
    let path = p.uri.path_and_query().map_or("/", |pq| pq.as_str());
    let mut out = Vec::with_capacity(256 + body.len());
    out.extend_from_slice(p.method.as_str().as_bytes());
    out.push(b' ');
    out.extend_from_slice(path.as_bytes());
    out.extend_from_slice(b" HTTP/1.1\r\n");
    for (name, value) in &p.headers {
        out.extend_from_slice(name.as_str().as_bytes());
        out.extend_from_slice(b": ");
        out.extend_from_slice(value.as_bytes());
        out.extend_from_slice(b"\r\n");
    }
    if !body.is_empty() || p.method != http::Method::GET {
        out.extend_from_slice(format!("content-length: {}\r\n", body.len()).as_bytes());
    }
    out.extend_from_slice(b"\r\n");
    out.extend_from_slice(body);
    out
}

enum Failure {
    /// Counted like the runtime path's "cannot connect" (with its pause).
    Connect(String),
    Request(String),
    /// The server closed the connection before the response was complete.
    Closed,
    /// The step stopped and the grace ran out.
    Abandoned,
}

struct Conn {
    sock: TcpStream,
    /// Bytes read and not yet consumed are `buf[..filled]`.
    buf: Vec<u8>,
    filled: usize,
}

struct Lane<'a> {
    spec: &'a WorkerSpec,
    conn: Option<Conn>,
    contention: Contention,
    /// Only for the contention back-off's count.
    stats: SpinStats,
    yielded: Option<Instant>,
    stop_seen: Option<Instant>,
}

/// How the response's body is delimited.
enum Framing {
    Length(usize),
    Chunked,
    /// Until the server closes.
    Close,
}

impl Lane<'_> {
    /// One request and its whole response. A failed connection is dropped;
    /// the next request opens a new one.
    fn exchange(&mut self, request: &[u8]) -> Result<(), Failure> {
        if self.conn.is_none() {
            self.conn = Some(connect(self.spec)?);
        }
        let spin_until = Instant::now() + self.spec.busy_poll;
        let result = self.send_and_read(request, spin_until);
        match result {
            Ok((status, body, keep_alive)) => {
                if !keep_alive {
                    self.conn = None;
                }
                if (200..300).contains(&status) {
                    Ok(())
                } else {
                    let code = http::StatusCode::from_u16(status)
                        .unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
                    Err(Failure::Request(http_error(code, &body)))
                }
            }
            Err(e) => {
                self.conn = None;
                Err(e)
            }
        }
    }

    fn send_and_read(
        &mut self,
        request: &[u8],
        spin_until: Instant,
    ) -> Result<(u16, Vec<u8>, bool), Failure> {
        let failed = |e: io::Error| Failure::Request(format!("HTTP request failed: {e}"));
        let mut off = 0;
        while off < request.len() {
            let conn = self.conn.as_mut().ok_or(Failure::Abandoned)?;
            match conn.sock.write(&request[off..]) {
                Ok(0) => return Err(failed(io::ErrorKind::WriteZero.into())),
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.sleep_until_ready(libc::POLLOUT)?
                }
                Err(e) => return Err(failed(e)),
            }
        }
        // The head.
        let (status, head_len, framing, keep_alive) = loop {
            if let Some(head) = self.parse_head()? {
                break head;
            }
            self.fill(spin_until)?;
        };
        let body = self.read_body(head_len, framing, spin_until)?;
        Ok((status, body, keep_alive))
    }

    /// The response head once it is all in the buffer (skipping interim
    /// 1xx answers): status, head length, framing, whether the connection
    /// stays open.
    fn parse_head(&mut self) -> Result<Option<(u16, usize, Framing, bool)>, Failure> {
        let conn = self.conn.as_mut().ok_or(Failure::Abandoned)?;
        loop {
            if conn.filled == 0 {
                return Ok(None);
            }
            let mut headers = [httparse::EMPTY_HEADER; 64];
            let mut resp = httparse::Response::new(&mut headers);
            let head_len = match resp.parse(&conn.buf[..conn.filled]) {
                Ok(httparse::Status::Complete(n)) => n,
                Ok(httparse::Status::Partial) => return Ok(None),
                Err(e) => {
                    return Err(Failure::Request(format!(
                        "HTTP request failed: invalid HTTP response: {e}"
                    )))
                }
            };
            let status = resp.code.unwrap_or(0);
            if (100..200).contains(&status) {
                conn.consume(head_len);
                continue;
            }
            let mut framing = Framing::Close;
            let mut keep_alive = resp.version == Some(1);
            for h in resp.headers.iter() {
                if h.name.eq_ignore_ascii_case("content-length") {
                    let n = std::str::from_utf8(h.value)
                        .ok()
                        .and_then(|v| v.trim().parse::<usize>().ok())
                        .filter(|&n| n <= MAX_RESPONSE)
                        .ok_or_else(|| {
                            Failure::Request(
                                "HTTP request failed: invalid content-length in the response"
                                    .into(),
                            )
                        })?;
                    if !matches!(framing, Framing::Chunked) {
                        framing = Framing::Length(n);
                    }
                } else if h.name.eq_ignore_ascii_case("transfer-encoding") {
                    if has_token(h.value, "chunked") {
                        framing = Framing::Chunked;
                    }
                } else if h.name.eq_ignore_ascii_case("connection") {
                    if has_token(h.value, "close") {
                        keep_alive = false;
                    } else if has_token(h.value, "keep-alive") {
                        keep_alive = true;
                    }
                }
            }
            if matches!(framing, Framing::Close) {
                keep_alive = false;
            }
            return Ok(Some((status, head_len, framing, keep_alive)));
        }
    }

    /// Reads the body after a head of `head_len` bytes and consumes both.
    fn read_body(
        &mut self,
        head_len: usize,
        framing: Framing,
        spin_until: Instant,
    ) -> Result<Vec<u8>, Failure> {
        match framing {
            Framing::Length(n) => {
                while self.filled() < head_len + n {
                    self.fill(spin_until)?;
                }
                let conn = self.conn.as_mut().ok_or(Failure::Abandoned)?;
                let body = conn.buf[head_len..head_len + n].to_vec();
                conn.consume(head_len + n);
                Ok(body)
            }
            Framing::Close => {
                loop {
                    match self.fill(spin_until) {
                        Ok(()) => {}
                        Err(Failure::Closed) => break,
                        Err(e) => return Err(e),
                    }
                    if self.filled() > head_len + MAX_RESPONSE {
                        return Err(Failure::Request(
                            "HTTP request failed: response too large".into(),
                        ));
                    }
                }
                let conn = self.conn.as_mut().ok_or(Failure::Abandoned)?;
                let body = conn.buf[head_len..conn.filled].to_vec();
                conn.consume(conn.filled);
                Ok(body)
            }
            Framing::Chunked => {
                let mut body = Vec::new();
                let mut pos = head_len;
                loop {
                    let conn = self.conn.as_mut().ok_or(Failure::Abandoned)?;
                    match httparse::parse_chunk_size(&conn.buf[pos..conn.filled]) {
                        Ok(httparse::Status::Complete((line, size))) => {
                            let size = usize::try_from(size)
                                .ok()
                                .filter(|&s| body.len() + s <= MAX_RESPONSE)
                                .ok_or_else(|| {
                                    Failure::Request(
                                        "HTTP request failed: response too large".into(),
                                    )
                                })?;
                            if size == 0 {
                                // The last chunk, then trailers up to an empty line.
                                let end = loop {
                                    let conn = self.conn.as_mut().ok_or(Failure::Abandoned)?;
                                    if let Some(end) =
                                        trailers_end(&conn.buf[pos + line..conn.filled])
                                    {
                                        break pos + line + end;
                                    }
                                    self.fill(spin_until)?;
                                };
                                let conn = self.conn.as_mut().ok_or(Failure::Abandoned)?;
                                conn.consume(end);
                                return Ok(body);
                            }
                            let need = pos + line + size + 2;
                            while self.filled() < need {
                                self.fill(spin_until)?;
                            }
                            let conn = self.conn.as_mut().ok_or(Failure::Abandoned)?;
                            body.extend_from_slice(&conn.buf[pos + line..pos + line + size]);
                            pos = need;
                        }
                        Ok(httparse::Status::Partial) => self.fill(spin_until)?,
                        Err(_) => {
                            return Err(Failure::Request(
                                "HTTP request failed: invalid chunk in the response".into(),
                            ))
                        }
                    }
                }
            }
        }
    }

    fn filled(&self) -> usize {
        self.conn.as_ref().map_or(0, |c| c.filled)
    }

    /// Reads what the socket has (at least one byte): spinning until
    /// `spin_until`, then sleeping in poll(2).
    fn fill(&mut self, spin_until: Instant) -> Result<(), Failure> {
        loop {
            let conn = self.conn.as_mut().ok_or(Failure::Abandoned)?;
            if conn.filled == conn.buf.len() {
                let grown = (conn.buf.len() * 2).max(64 << 10);
                conn.buf.resize(grown, 0);
            }
            match conn.sock.read(&mut conn.buf[conn.filled..]) {
                Ok(0) => return Err(Failure::Closed),
                Ok(n) => {
                    conn.filled += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(Failure::Request(format!("HTTP request failed: {e}"))),
            }
            let now = Instant::now();
            if now < spin_until && !self.contention.backing_off(now, &self.stats) {
                if self
                    .yielded
                    .is_none_or(|at| now.duration_since(at) >= YIELD_EVERY)
                {
                    self.yielded = Some(now);
                    // Offers the core to a thread woken on it (a SCHED_BATCH
                    // shard does not preempt); returns at once otherwise.
                    std::thread::yield_now();
                }
                continue;
            }
            self.sleep_until_ready(libc::POLLIN)?;
        }
    }

    /// Sleeps until the socket is ready for `events` (or a while passed),
    /// and gives up once the step has stopped for longer than the grace.
    fn sleep_until_ready(&mut self, events: libc::c_short) -> Result<(), Failure> {
        if self.spec.stop.load(Ordering::Relaxed) {
            let seen = *self.stop_seen.get_or_insert_with(Instant::now);
            if seen.elapsed() >= STOP_GRACE {
                return Err(Failure::Abandoned);
            }
        }
        let conn = self.conn.as_ref().ok_or(Failure::Abandoned)?;
        let mut p = libc::pollfd {
            fd: conn.sock.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd on a socket this lane owns; the result
        // only says whether to read again (an error shows on the read).
        unsafe { libc::poll(&mut p, 1, WAKE_EVERY.as_millis() as libc::c_int) };
        Ok(())
    }
}

/// hyper's words for a response cut short by the server closing.
const CLOSED: &str = "connection closed before message completed";

impl Conn {
    fn consume(&mut self, n: usize) {
        self.buf.copy_within(n..self.filled, 0);
        self.filled -= n;
    }
}

fn has_token(value: &[u8], token: &str) -> bool {
    value
        .split(|&b| b == b',')
        .any(|t| t.trim_ascii().eq_ignore_ascii_case(token.as_bytes()))
}

/// Where the trailer section that starts at `buf` ends (after its empty
/// line), once it is all there.
fn trailers_end(buf: &[u8]) -> Option<usize> {
    if buf.starts_with(b"\r\n") {
        return Some(2);
    }
    buf.windows(4).position(|w| w == b"\r\n\r\n").map(|p| p + 4)
}

fn connect(spec: &WorkerSpec) -> Result<Conn, Failure> {
    let addr = spec.target.addr;
    let refused = |e: io::Error| {
        let why = match e.kind() {
            io::ErrorKind::ConnectionRefused => "connection refused".to_string(),
            io::ErrorKind::TimedOut => format!("timed out after {CONNECT_TIMEOUT:?}"),
            _ => e.to_string(),
        };
        Failure::Connect(format!("cannot connect to {addr}: {why}"))
    };
    let sock = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(refused)?;
    // Small requests: Nagle would add tens of milliseconds.
    let _ = sock.set_nodelay(true);
    sock.set_nonblocking(true).map_err(refused)?;
    Ok(Conn {
        sock,
        buf: vec![0; 64 << 10],
        filled: 0,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn tokens_are_matched_whole_and_without_case() {
        assert!(has_token(b"gzip, Chunked", "chunked"));
        assert!(has_token(b"close", "close"));
        assert!(!has_token(b"closed", "close"));
        assert!(!has_token(b"", "chunked"));
    }

    #[test]
    fn trailers_end_after_their_empty_line() {
        assert_eq!(trailers_end(b"\r\n"), Some(2));
        assert_eq!(trailers_end(b"x-t: 1\r\n\r\nnext"), Some(10));
        assert_eq!(trailers_end(b"x-t: 1\r\n"), None);
        assert_eq!(trailers_end(b""), None);
    }
}
