//! Connection hygiene: slow clients, idle connections, oversized and
//! stalled bodies, descriptor exhaustion, header and handshake timeouts,
//! graceful shutdown. Every test is bounded in time; latencies are printed
//! (benchmarks measure performance), asserted only against generous bounds.

mod common;

use std::{
    io::{ErrorKind, Read, Write},
    net::{SocketAddr, TcpStream},
    sync::{
        atomic::{AtomicBool, Ordering},
        Arc,
    },
    thread,
    time::{Duration, Instant},
};

use common::{child::*, *};
use shardserve::server::ServerOptions;

const MIB: usize = 1024 * 1024;

fn options() -> ServerOptions {
    ServerOptions::for_tests(repo_path("models"))
}

/// Raises this process's open-file limit so that it can hold `want`
/// descriptors (raising the hard limit too where permitted); returns the
/// soft limit obtained.
fn raise_own_fd_limit(want: u64) -> u64 {
    let got = shardserve::server::raise_nofile_limit().expect("read RLIMIT_NOFILE");
    if got.soft >= want {
        return got.soft;
    }
    let lim = libc::rlimit {
        rlim_cur: want,
        rlim_max: want,
    };
    // SAFETY: setrlimit reads one rlimit; failure (no privilege) is fine.
    unsafe { libc::setrlimit(libc::RLIMIT_NOFILE, &lim) };
    shardserve::server::raise_nofile_limit()
        .expect("read RLIMIT_NOFILE")
        .soft
}

fn connect(addr: SocketAddr) -> TcpStream {
    let s = TcpStream::connect(addr).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(10)))
        .expect("read timeout");
    s.set_nodelay(true).expect("nodelay");
    s
}

/// Reads until EOF, a reset or the socket's read timeout; returns the
/// bytes and whether the peer closed (EOF or reset).
fn read_until_closed(s: &mut TcpStream) -> (Vec<u8>, bool) {
    let mut out = Vec::new();
    let mut buf = [0u8; 16 * 1024];
    loop {
        match s.read(&mut buf) {
            Ok(0) => return (out, true),
            Ok(n) => out.extend_from_slice(&buf[..n]),
            Err(e) if e.kind() == ErrorKind::ConnectionReset => return (out, true),
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => {
                return (out, false)
            }
            Err(e) => panic!("read: {e}"),
        }
    }
}

/// Reads one HTTP/1.1 response with a Content-Length (status, head, body).
fn read_response(s: &mut TcpStream) -> (u16, String, Vec<u8>) {
    let mut data = Vec::new();
    let mut buf = [0u8; 8192];
    let head_end = loop {
        if let Some(p) = data.windows(4).position(|w| w == b"\r\n\r\n") {
            break p;
        }
        let n = s.read(&mut buf).expect("read response");
        assert!(
            n > 0,
            "connection closed before a response: {:?}",
            String::from_utf8_lossy(&data)
        );
        data.extend_from_slice(&buf[..n]);
    };
    let head = String::from_utf8_lossy(&data[..head_end]).to_ascii_lowercase();
    let status: u16 = head
        .split(' ')
        .nth(1)
        .and_then(|s| s.parse().ok())
        .expect("status code");
    let len: usize = head
        .lines()
        .find_map(|l| l.strip_prefix("content-length:"))
        .and_then(|v| v.trim().parse().ok())
        .unwrap_or(0);
    let mut body = data[head_end + 4..].to_vec();
    while body.len() < len {
        let n = s.read(&mut buf).expect("read body");
        assert!(n > 0, "connection closed inside a response body");
        body.extend_from_slice(&buf[..n]);
    }
    (status, head, body)
}

fn percentile(sorted: &[Duration], p: f64) -> Duration {
    let i = ((sorted.len() as f64 - 1.0) * p).round() as usize;
    sorted[i.min(sorted.len() - 1)]
}

/// `n` keep-alive GETs on one connection plus `n` on fresh connections;
/// returns the sorted latencies.
fn health_latencies(addr: SocketAddr, n: usize) -> Vec<Duration> {
    let mut lat = Vec::with_capacity(2 * n);
    let mut keep = connect(addr);
    for _ in 0..n {
        let t = Instant::now();
        keep.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
            .expect("write");
        let (status, _, _) = read_response(&mut keep);
        lat.push(t.elapsed());
        assert_eq!(status, 200);
    }
    for _ in 0..n {
        let t = Instant::now();
        let r = get(addr, "/v2/health/live");
        lat.push(t.elapsed());
        assert_eq!(r.status, 200);
    }
    lat.sort();
    lat
}

fn report(what: &str, lat: &[Duration]) {
    println!(
        "{what}: n={} p50={:?} p99={:?} max={:?}",
        lat.len(),
        percentile(lat, 0.5),
        percentile(lat, 0.99),
        lat[lat.len() - 1]
    );
}

#[test]
fn slow_headers_and_bodies_do_not_starve_other_clients() {
    let server = start_with(options());
    let addr = server.http_addr();
    // 100 clients trickle request headers, 100 trickle a declared body.
    let mut slow: Vec<TcpStream> = Vec::new();
    for i in 0..200 {
        let mut s = connect(addr);
        if i % 2 == 1 {
            s.write_all(
                b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n\
                  Content-Length: 100000\r\n\r\n{",
            )
            .expect("write");
        }
        s.set_nonblocking(true).expect("nonblocking");
        slow.push(s);
    }
    let stop = Arc::new(AtomicBool::new(false));
    let trickler = {
        let stop = stop.clone();
        thread::spawn(move || {
            let header =
                b"GET /v2/health/live HTTP/1.1\r\nX-Slow: aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa";
            let mut at = 0;
            while !stop.load(Ordering::Relaxed) {
                for (i, s) in slow.iter_mut().enumerate() {
                    let byte = if i % 2 == 0 {
                        &header[at.min(header.len() - 1)..][..1]
                    } else {
                        b" "
                    };
                    let _ = s.write(byte);
                }
                at += 1;
                thread::sleep(Duration::from_millis(50));
            }
            slow
        })
    };
    thread::sleep(Duration::from_millis(300));
    let mut lat = Vec::new();
    for i in 0..40 {
        let t = Instant::now();
        let r = post_json(addr, "/v2/models/simple/infer", &simple_json_request(i));
        lat.push(t.elapsed());
        assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    }
    lat.sort();
    report("infer while 200 slow clients trickle", &lat);
    assert!(lat[lat.len() - 1] < Duration::from_secs(1));
    stop.store(true, Ordering::Relaxed);
    let slow = trickler.join().expect("trickler");
    assert_eq!(server.transport().open_connections(), 200);
    drop(slow);
    server.shutdown().expect("shutdown");
}

#[test]
fn ten_thousand_idle_connections_while_health_answers() {
    // The server runs as a child so that each process holds one end of
    // every connection (the test's own open-file limit may be 20k or less).
    let limit = raise_own_fd_limit(32_768);
    let n = 10_000.min(limit.saturating_sub(1_000) as usize);
    if n < 10_000 {
        println!("open-file limit {limit}: holding {n} idle connections instead of 10000");
    }
    let server = ChildServer::spawn("idle", None, &[]);
    let t = Instant::now();
    let idle: Vec<TcpStream> = (0..n)
        .map(|_| TcpStream::connect(server.http).expect("connect"))
        .collect();
    wait_for(
        "the server to accept every connection",
        Duration::from_secs(20),
        || server.open_fds() >= n,
    );
    println!(
        "{n} idle connections opened and accepted in {:?}",
        t.elapsed()
    );
    let lat = health_latencies(server.http, 100);
    report(&format!("/v2/health/live with {n} idle connections"), &lat);
    assert!(lat[lat.len() - 1] < Duration::from_secs(1));
    let cpu_before = cpu_seconds(server.pid());
    thread::sleep(Duration::from_secs(1));
    let idle_cpu = cpu_seconds(server.pid()) - cpu_before;
    println!("server CPU with {n} idle connections: {idle_cpu:.3} s in 1 s");
    assert!(
        idle_cpu < 0.3,
        "idle connections cost {idle_cpu:.3} s of CPU per s"
    );
    drop(idle);
}

#[test]
fn oversized_content_length_is_413_before_the_body_is_read() {
    let mut opts = options();
    opts.http_max_input_size = MIB;
    let server = start_with(opts);
    let addr = server.http_addr();
    let t = Instant::now();
    let mut s = connect(addr);
    s.write_all(
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n\
          Content-Length: 1073741824\r\n\r\n",
    )
    .expect("write");
    let (status, head, body) = read_response(&mut s);
    assert_eq!(status, 413);
    assert!(head.contains("connection: close"), "{head}");
    let error: serde_json::Value = serde_json::from_slice(&body).expect("JSON error");
    assert!(
        error["error"]
            .as_str()
            .is_some_and(|e| e.contains("--http-max-input-size")),
        "{error}"
    );
    let (_, closed) = read_until_closed(&mut s);
    assert!(closed, "connection closed after the 413");
    println!("413 after {:?}, no body sent", t.elapsed());

    // A client that sends its whole oversized body before reading still
    // gets the 413: the server reads and drops the body before closing
    // (lingering close), instead of resetting the connection.
    let mut s = connect(addr);
    let mut upload = format!(
        "POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
        4 * MIB
    )
    .into_bytes();
    upload.extend(std::iter::repeat_n(b' ', 4 * MIB));
    s.write_all(&upload)
        .expect("the whole body is accepted (and dropped)");
    let (status, _, _) = read_response(&mut s);
    assert_eq!(status, 413);
    let (_, closed) = read_until_closed(&mut s);
    assert!(closed);

    // A chunked body is refused once it grows past the limit.
    let mut s = connect(addr);
    s.write_all(
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\n\
          Transfer-Encoding: chunked\r\n\r\n",
    )
    .expect("write");
    let chunk = vec![b' '; 256 * 1024];
    for _ in 0..5 {
        let mut framed = format!("{:x}\r\n", chunk.len()).into_bytes();
        framed.extend_from_slice(&chunk);
        framed.extend_from_slice(b"\r\n");
        if s.write_all(&framed).is_err() {
            break; // closed by the server mid-upload
        }
    }
    let (reply, _) = read_until_closed(&mut s);
    let reply = String::from_utf8_lossy(&reply);
    assert!(reply.starts_with("HTTP/1.1 413"), "{reply}");
    assert_eq!(server.transport().buffered_request_bytes(), 0);
    assert_eq!(get(addr, "/v2/health/ready").status, 200);
    server.shutdown().expect("shutdown");
}

/// VmRSS of this process, in KiB.
fn rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("VmRSS:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        })
        .unwrap_or(0)
}

#[test]
fn body_budget_bounds_buffered_bytes() {
    const BUDGET: usize = 64 * MIB;
    let mut opts = options();
    opts.max_buffered_request_bytes = Some(BUDGET);
    opts.http_max_input_size = 64 * MIB;
    let server = start_with(opts);
    let addr = server.http_addr();
    let rss_before = rss_kib();
    let part = vec![b' '; MIB];
    let mut clients = Vec::new();
    let mut refused = 0;
    for _ in 0..100 {
        let mut s = connect(addr);
        s.write_all(
            format!(
                "POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
                60 * MIB
            )
            .as_bytes(),
        )
        .expect("write head");
        // Over budget, the server answers at once, before any body byte.
        s.set_read_timeout(Some(Duration::from_millis(300)))
            .expect("timeout");
        let mut first = [0u8; 12];
        match s.read(&mut first) {
            Ok(n) if n > 0 => {
                assert!(
                    first.starts_with(b"HTTP/1.1 503"),
                    "{}",
                    String::from_utf8_lossy(&first)
                );
                refused += 1;
                continue;
            }
            _ => {}
        }
        s.write_all(&part).expect("write part of the body");
        clients.push(s); // stalls here
        let buffered = server.transport().buffered_request_bytes();
        assert!(buffered <= BUDGET, "{buffered} bytes buffered");
    }
    let peak = server.transport().peak_buffered_request_bytes();
    println!(
        "body budget {BUDGET}: {} bodies admitted, {refused} refused with 503, \
         peak buffered {peak} bytes, RSS grew {} KiB",
        clients.len(),
        rss_kib().saturating_sub(rss_before)
    );
    assert!(peak <= BUDGET, "peak {peak} > budget {BUDGET}");
    assert_eq!(clients.len(), 1, "one 60 MiB body fits in 64 MiB, not two");
    assert_eq!(server.transport().rejected_bodies(), 99);
    // The metrics port shows what is buffered and what was refused.
    let metrics = String::from_utf8(get(server.metrics_addr(), "/metrics").body).expect("UTF-8");
    assert!(
        metrics.contains(&format!(
            "shardserve_buffered_request_bytes{{shard=\"0\"}} {}",
            60 * MIB
        )),
        "{metrics}"
    );
    assert!(metrics.contains("shardserve_rejected_request_bodies_total{shard=\"0\"} 99"));
    // Small requests still fit in what is left.
    let r = post_json(addr, "/v2/models/simple/infer", &simple_json_request(3));
    assert_eq!(r.status, 200, "{}", String::from_utf8_lossy(&r.body));
    drop(clients);
    wait_for("the budget to be released", Duration::from_secs(10), || {
        server.transport().buffered_request_bytes() == 0
    });
    server.shutdown().expect("shutdown");
}

#[test]
fn stalled_body_gets_408_and_the_connection_closes() {
    let mut opts = options();
    opts.http_body_timeout = Duration::from_secs(1);
    let server = start_with(opts);
    let addr = server.http_addr();
    let mut s = connect(addr);
    let t = Instant::now();
    s.write_all(
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n{\"in",
    )
    .expect("write");
    let (status, head, body) = read_response(&mut s);
    let elapsed = t.elapsed();
    assert_eq!(status, 408, "{}", String::from_utf8_lossy(&body));
    assert!(head.contains("connection: close"), "{head}");
    assert!(String::from_utf8_lossy(&body).contains("--http-body-timeout-secs"));
    let (_, closed) = read_until_closed(&mut s);
    assert!(closed);
    println!("stalled body answered 408 after {elapsed:?}");
    assert!(elapsed >= Duration::from_millis(900) && elapsed < Duration::from_secs(5));
    assert_eq!(server.transport().buffered_request_bytes(), 0);
    server.shutdown().expect("shutdown");
}

/// A body that never stalls long enough for the between-chunks timeout
/// still meets the total one: a byte every 200 ms against 1 s between
/// chunks and 2 s in all (chunks that are already there when the read
/// looks are taken without a timer; the deadline must hold regardless).
#[test]
fn trickled_body_meets_the_total_timeout() {
    let mut opts = options();
    opts.http_body_timeout = Duration::from_secs(1);
    opts.http_body_total_timeout = Duration::from_secs(2);
    let server = start_with(opts);
    let addr = server.http_addr();
    let mut s = connect(addr);
    let t = Instant::now();
    s.write_all(
        b"POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: 1000\r\n\r\n",
    )
    .expect("write");
    s.set_read_timeout(Some(Duration::from_millis(200)))
        .expect("read timeout");
    let mut first = [0u8; 1];
    let mut reply = Vec::new();
    // Trickle until the server answers (or 6 s, well past the deadline).
    while t.elapsed() < Duration::from_secs(6) {
        if s.write_all(b" ").is_err() {
            break;
        }
        match s.read(&mut first) {
            Ok(0) => break,
            Ok(_) => {
                reply.push(first[0]);
                break;
            }
            Err(_) => continue,
        }
    }
    let elapsed = t.elapsed();
    s.set_read_timeout(Some(Duration::from_secs(5)))
        .expect("read timeout");
    let (rest, _) = read_until_closed(&mut s);
    reply.extend(rest);
    let reply = String::from_utf8_lossy(&reply);
    println!("trickled body answered after {elapsed:?}");
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.contains("--http-body-total-timeout-secs"), "{reply}");
    assert!(
        elapsed >= Duration::from_millis(1900) && elapsed < Duration::from_secs(5),
        "{elapsed:?}"
    );
    server.shutdown().expect("shutdown");
}

#[test]
fn header_timeout_answers_408_and_idle_connections_close() {
    let mut opts = options();
    opts.http_header_timeout = Duration::from_secs(1);
    opts.idle_timeout = Duration::from_secs(2);
    let server = start_with(opts);
    let addr = server.http_addr();

    // Headers that never end: 408, then the connection closes.
    let mut partial = connect(addr);
    let t = Instant::now();
    partial
        .write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nX-Slow: a")
        .expect("write");
    let (reply, closed) = read_until_closed(&mut partial);
    let header_elapsed = t.elapsed();
    let reply = String::from_utf8_lossy(&reply);
    assert!(closed, "closed after the header timeout");
    assert!(reply.starts_with("HTTP/1.1 408"), "{reply}");
    assert!(reply.to_ascii_lowercase().contains("connection: close"));

    // A connection that never sends a byte is closed quietly when idle.
    let mut silent = connect(addr);
    let t = Instant::now();
    let (reply, closed) = read_until_closed(&mut silent);
    let idle_elapsed = t.elapsed();
    assert!(closed && reply.is_empty(), "{reply:?}");

    // A keep-alive connection after its request: idle timeout too.
    let mut keep = connect(addr);
    keep.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    assert_eq!(read_response(&mut keep).0, 200);
    let t = Instant::now();
    let (reply, closed) = read_until_closed(&mut keep);
    let keep_elapsed = t.elapsed();
    assert!(closed && reply.is_empty());
    println!(
        "header timeout 1 s: 408 after {header_elapsed:?}; idle timeout 2 s: silent \
         connection closed after {idle_elapsed:?}, keep-alive after {keep_elapsed:?}"
    );
    assert!(
        header_elapsed >= Duration::from_millis(900) && header_elapsed < Duration::from_secs(5)
    );
    assert!(idle_elapsed >= Duration::from_millis(1900) && idle_elapsed < Duration::from_secs(6));
    assert!(keep_elapsed >= Duration::from_millis(1900) && keep_elapsed < Duration::from_secs(6));
    wait_for("connections to be released", Duration::from_secs(5), || {
        server.transport().open_connections() == 0
    });
    server.shutdown().expect("shutdown");
}

const H2_PREFACE: &[u8] = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n";
const H2_SETTINGS: [u8; 9] = [0, 0, 0, 4, 0, 0, 0, 0, 0];
const H2_SETTINGS_ACK: [u8; 9] = [0, 0, 0, 4, 1, 0, 0, 0, 0];
const H2_GOAWAY: u8 = 7;

/// Reads HTTP/2 frames until one of type `kind`; returns its payload, or
/// `None` if the connection closed first.
fn read_h2_frame_of(s: &mut TcpStream, kind: u8) -> Option<Vec<u8>> {
    loop {
        let mut head = [0u8; 9];
        if s.read_exact(&mut head).is_err() {
            return None;
        }
        let len = usize::from(head[0]) << 16 | usize::from(head[1]) << 8 | usize::from(head[2]);
        let mut payload = vec![0u8; len];
        if s.read_exact(&mut payload).is_err() {
            return None;
        }
        if head[3] == kind {
            return Some(payload);
        }
    }
}

/// An HTTP/2 connection past its handshake (preface and SETTINGS both ways).
fn h2_handshake(addr: SocketAddr) -> TcpStream {
    let mut s = connect(addr);
    s.write_all(H2_PREFACE).expect("preface");
    s.write_all(&H2_SETTINGS).expect("settings");
    read_h2_frame_of(&mut s, 4).expect("server SETTINGS");
    s.write_all(&H2_SETTINGS_ACK).expect("settings ack");
    s
}

#[test]
fn http2_silent_connections_close_after_the_handshake_timeout() {
    let mut opts = options();
    opts.grpc_handshake_timeout = Duration::from_secs(1);
    opts.idle_timeout = Duration::from_secs(2);
    let server = start_with(opts);
    let addr = server.grpc_addr();
    let t = Instant::now();
    let mut silent: Vec<TcpStream> = (0..200).map(|_| connect(addr)).collect();
    wait_for("the server to accept", Duration::from_secs(5), || {
        server.transport().open_connections() == 200
    });
    for s in &mut silent {
        let (_, closed) = read_until_closed(s);
        assert!(closed, "silent HTTP/2 connection closed");
    }
    let silent_elapsed = t.elapsed();
    wait_for("connections to be released", Duration::from_secs(5), || {
        server.transport().open_connections() == 0
    });

    // After the handshake, no stream for the idle timeout: GOAWAY.
    let mut idle = h2_handshake(addr);
    let t = Instant::now();
    let goaway = read_h2_frame_of(&mut idle, H2_GOAWAY).expect("GOAWAY");
    let idle_elapsed = t.elapsed();
    assert_eq!(&goaway[4..8], &[0, 0, 0, 0], "GOAWAY NO_ERROR");
    println!(
        "200 silent HTTP/2 connections closed after {silent_elapsed:?} (handshake timeout 1 s); \
         GOAWAY on an idle connection after {idle_elapsed:?} (idle timeout 2 s)"
    );
    assert!(
        silent_elapsed >= Duration::from_millis(900) && silent_elapsed < Duration::from_secs(6)
    );
    assert!(idle_elapsed >= Duration::from_millis(1500) && idle_elapsed < Duration::from_secs(6));
    server.shutdown().expect("shutdown");
}

#[test]
fn connection_cap_closes_new_connections_at_once() {
    let mut opts = options();
    opts.max_connections = Some(20);
    let server = start_with(opts);
    let addr = server.http_addr();
    let held: Vec<TcpStream> = (0..20).map(|_| connect(addr)).collect();
    wait_for("20 connections", Duration::from_secs(5), || {
        server.transport().open_connections() == 20
    });
    let mut extra = connect(addr);
    let t = Instant::now();
    let (reply, closed) = read_until_closed(&mut extra);
    assert!(closed && reply.is_empty(), "over the cap: closed at once");
    println!("connection over the cap closed after {:?}", t.elapsed());
    assert!(t.elapsed() < Duration::from_secs(2));
    assert!(server.transport().refused_connections() >= 1);
    drop(held);
    wait_for("slots to free", Duration::from_secs(5), || {
        server.transport().open_connections() == 0
    });
    assert_eq!(get(addr, "/v2/health/live").status, 200);
    server.shutdown().expect("shutdown");
}

#[test]
fn graceful_shutdown_closes_keep_alive_and_sends_goaway() {
    let server = start_with(options());
    let http = server.http_addr();
    let grpc = server.grpc_addr();

    // An idle keep-alive connection.
    let mut idle = connect(http);
    idle.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\n\r\n")
        .expect("write");
    assert_eq!(read_response(&mut idle).0, 200);
    // A request in flight: its body is half sent.
    let body = simple_json_request(7).to_string().into_bytes();
    let (first, rest) = body.split_at(body.len() / 2);
    let mut busy = connect(http);
    busy.write_all(
        format!(
            "POST /v2/models/simple/infer HTTP/1.1\r\nHost: x\r\nContent-Length: {}\r\n\r\n",
            body.len()
        )
        .as_bytes(),
    )
    .expect("write head");
    busy.write_all(first).expect("write half");
    // An HTTP/2 connection.
    let mut h2 = h2_handshake(grpc);
    wait_for("3 connections", Duration::from_secs(5), || {
        server.transport().open_connections() == 3
    });

    let t = Instant::now();
    let stopping = thread::spawn(move || server.shutdown());
    let goaway = read_h2_frame_of(&mut h2, H2_GOAWAY).expect("GOAWAY at shutdown");
    assert_eq!(&goaway[4..8], &[0, 0, 0, 0], "GOAWAY NO_ERROR");
    let (reply, closed) = read_until_closed(&mut idle);
    assert!(
        closed && reply.is_empty(),
        "idle keep-alive connection closed"
    );
    let goaway_and_close = t.elapsed();
    // The in-flight request completes, told to close the connection.
    busy.write_all(rest).expect("write the rest");
    let (status, head, resp) = read_response(&mut busy);
    assert!(head.contains("connection: close"), "{head}");
    assert!(
        status == 200 || status == 503,
        "{status}: {}",
        String::from_utf8_lossy(&resp)
    );
    let (_, closed) = read_until_closed(&mut busy);
    assert!(closed, "closed after the last response");
    stopping
        .join()
        .expect("shutdown thread")
        .expect("clean shutdown");
    println!(
        "shutdown: GOAWAY and idle keep-alive closed after {goaway_and_close:?}; in-flight \
         request answered {status} with Connection: close; shutdown took {:?}",
        t.elapsed()
    );
    assert!(t.elapsed() < Duration::from_secs(5));
}

#[test]
fn fd_exhaustion_backs_off_without_spinning() {
    let server = ChildServer::spawn(
        "fd",
        Some(256),
        // A cap far above the limit: the accepts themselves must fail.
        &[
            "--max-connections",
            "100000",
            "--grpc-handshake-timeout-secs",
            "60",
        ],
    );
    // More silent connections than the server has descriptors.
    let conns: Vec<TcpStream> = (0..300)
        .map(|_| TcpStream::connect(server.grpc).expect("connect (the backlog takes it)"))
        .collect();
    thread::sleep(Duration::from_millis(500));
    let log_before = server.log().len();
    let cpu_before = cpu_seconds(server.pid());
    thread::sleep(Duration::from_secs(2));
    let cpu = cpu_seconds(server.pid()) - cpu_before;
    let text = server.log();
    let log_growth = text.len() - log_before;
    println!(
        "300 connections against 256 descriptors: server used {cpu:.3} s of CPU in 2 s, \
         log grew {log_growth} bytes, {} descriptors open",
        server.open_fds()
    );
    assert!(
        text.contains("accept failed"),
        "the server should have hit EMFILE:\n{text}"
    );
    assert!(cpu < 0.3, "accept loop spins: {cpu:.3} s CPU in 2 s");
    assert!(log_growth < 4096, "log floods:\n{}", &text[log_before..]);

    drop(conns);
    // Descriptors come back: requests are served again.
    wait_for("the server to serve again", Duration::from_secs(15), || {
        let Ok(mut s) = TcpStream::connect(server.http) else {
            return false;
        };
        let _ = s.set_read_timeout(Some(Duration::from_secs(2)));
        let _ =
            s.write_all(b"GET /v2/health/live HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n");
        let mut buf = Vec::new();
        let _ = s.read_to_end(&mut buf);
        buf.starts_with(b"HTTP/1.1 200")
    });
}
