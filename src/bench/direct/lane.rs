//! The direct lane's connection: a non-blocking socket, its read buffer,
//! and the wait for it (spin for the busy-poll window, then `poll(2)`).
//! The protocols (`http1`, `grpc`) read and write through it.

use std::{
    io::{self, Read, Write},
    net::TcpStream,
    os::fd::AsRawFd,
    sync::atomic::Ordering,
    time::{Duration, Instant},
};

use crate::{
    bench::{
        load::WorkerSpec,
        wire::{connect_error, CONNECT_TIMEOUT},
    },
    shard::spin::{Contention, Courtesy, SpinStats},
};

/// Request bodies above this go the runtime's way: writing a large body
/// without reading would miss an early answer (413) that hyper reads, and
/// a gRPC body would wait on flow control.
pub const MAX_BODY: usize = 256 << 10;

/// Responses above this are refused rather than buffered.
pub const MAX_RESPONSE: usize = 1 << 30;

/// How long a request in flight when the step stops may still take (the
/// runtime path's bound too).
const STOP_GRACE: Duration = Duration::from_secs(2);

/// How often a sleeping wait looks at the stop flag.
const WAKE_EVERY: Duration = Duration::from_millis(10);

/// One request and its whole response over a lane's connection.
pub trait Protocol {
    /// What a new connection sends first (the HTTP/2 preface).
    fn opening(&mut self) -> Vec<u8>;
    /// Sends request `i` and reads its response.
    fn exchange(&mut self, lane: &mut Lane, i: usize) -> Result<(), Failure>;
}

#[derive(Debug)]
pub enum Failure {
    /// Counted like the runtime path's "cannot connect" (with its pause).
    Connect(String),
    /// The request failed; the connection is dropped.
    Request(String),
    /// The server answered with an error; the connection stays.
    Answer(String),
    /// The step stopped and the grace ran out.
    Abandoned,
}

impl Failure {
    /// A transport failure in the protocol's words ("HTTP request failed: ").
    pub fn prefixed(self, prefix: &str) -> Self {
        match self {
            Failure::Request(e) => Failure::Request(format!("{prefix}{e}")),
            f => f,
        }
    }
}

/// A read that found the connection closed.
pub struct Closed;

pub struct Conn {
    sock: TcpStream,
    /// Bytes read and not yet consumed are `buf[..filled]`.
    buf: Vec<u8>,
    filled: usize,
    /// The server said it closes after the current response.
    pub closing: bool,
}

/// A worker's connection and the way it waits for its socket.
pub struct Lane<'a> {
    spec: &'a WorkerSpec,
    conn: Option<Conn>,
    contention: Contention,
    /// Only for the contention back-off's count.
    stats: SpinStats,
    courtesy: Courtesy,
    stop_seen: Option<Instant>,
    /// The busy-poll window of the request in flight.
    spin_until: Instant,
}

impl<'a> Lane<'a> {
    pub fn new(spec: &'a WorkerSpec) -> Self {
        Self {
            spec,
            conn: None,
            contention: Contention::new(),
            stats: SpinStats::default(),
            courtesy: Courtesy::default(),
            stop_seen: None,
            spin_until: Instant::now(),
        }
    }

    /// One request and its response; a connection that failed or that the
    /// server is closing is dropped, and the next request opens a new one.
    pub fn exchange(&mut self, protocol: &mut impl Protocol, i: usize) -> Result<(), Failure> {
        if self.conn.is_none() {
            self.conn = Some(connect(self.spec)?);
            let opening = protocol.opening();
            if !opening.is_empty() {
                self.write_all(&opening).inspect_err(|_| self.conn = None)?;
            }
        }
        self.spin_until = Instant::now() + self.spec.busy_poll;
        let result = protocol.exchange(self, i);
        let closing = self.conn.as_ref().is_none_or(|c| c.closing);
        if closing || matches!(result, Err(Failure::Request(_) | Failure::Abandoned)) {
            self.conn = None;
        }
        result
    }

    pub fn conn(&mut self) -> Result<&mut Conn, Failure> {
        self.conn.as_mut().ok_or(Failure::Abandoned)
    }

    /// The bytes read and not yet consumed.
    pub fn buffered(&self) -> &[u8] {
        self.conn.as_ref().map_or(&[], |c| &c.buf[..c.filled])
    }

    pub fn consume(&mut self, n: usize) {
        if let Some(c) = self.conn.as_mut() {
            let n = n.min(c.filled);
            c.buf.copy_within(n..c.filled, 0);
            c.filled -= n;
        }
    }

    pub fn write_all(&mut self, data: &[u8]) -> Result<(), Failure> {
        let mut off = 0;
        while off < data.len() {
            match self.conn()?.sock.write(&data[off..]) {
                Ok(0) => return Err(io_failure(io::ErrorKind::WriteZero.into())),
                Ok(n) => off += n,
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {
                    self.sleep_until_ready(libc::POLLOUT)?
                }
                Err(e) => return Err(io_failure(e)),
            }
        }
        Ok(())
    }

    /// Reads what the socket has (at least one byte) into the buffer:
    /// spinning until the request's window ends, then sleeping in poll(2).
    /// `Ok(Err(Closed))` when the server closed the connection.
    pub fn fill(&mut self) -> Result<Result<(), Closed>, Failure> {
        loop {
            let conn = self.conn()?;
            if conn.filled == conn.buf.len() {
                if conn.filled > MAX_RESPONSE {
                    return Err(Failure::Request("response too large".into()));
                }
                let grown = (conn.buf.len() * 2).max(64 << 10);
                conn.buf.resize(grown, 0);
            }
            match conn.sock.read(&mut conn.buf[conn.filled..]) {
                Ok(0) => return Ok(Err(Closed)),
                Ok(n) => {
                    conn.filled += n;
                    return Ok(Ok(()));
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) if e.kind() == io::ErrorKind::WouldBlock => {}
                Err(e) => return Err(io_failure(e)),
            }
            let now = Instant::now();
            if now < self.spin_until && !self.contention.backing_off(now, &self.stats) {
                // A SCHED_BATCH shard woken on this core does not preempt.
                self.courtesy.offer(now);
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
        let mut p = libc::pollfd {
            fd: self.conn()?.sock.as_raw_fd(),
            events,
            revents: 0,
        };
        // SAFETY: one valid pollfd on a socket this lane owns; the result
        // only says whether to try again (an error shows on the next call).
        unsafe { libc::poll(&mut p, 1, WAKE_EVERY.as_millis() as libc::c_int) };
        Ok(())
    }
}

/// Words a failed read or write gets; the protocol adds its prefix.
fn io_failure(e: io::Error) -> Failure {
    Failure::Request(e.to_string())
}

fn connect(spec: &WorkerSpec) -> Result<Conn, Failure> {
    let addr = spec.target.addr;
    let refused = |e: io::Error| Failure::Connect(connect_error(addr, e));
    let sock = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT).map_err(refused)?;
    // Small requests: Nagle would add tens of milliseconds.
    let _ = sock.set_nodelay(true);
    sock.set_nonblocking(true).map_err(refused)?;
    Ok(Conn {
        sock,
        buf: vec![0; 64 << 10],
        filled: 0,
        closing: false,
    })
}
