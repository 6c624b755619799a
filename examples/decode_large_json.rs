//! Decodes one large JSON inference body (default 60 MB of INT32 `data`)
//! and prints the decode time and the process's peak resident memory, to
//! compare decoder versions: `cargo run --release --example
//! decode_large_json [-- <megabytes> [small]]`.

use std::time::Instant;

use bytes::Bytes;
use shardserve::frontend::http::codec::decode_infer_request;

/// `VmHWM` (peak resident set) from /proc, in KiB; 0 where unavailable.
fn peak_rss_kib() -> u64 {
    std::fs::read_to_string("/proc/self/status")
        .ok()
        .and_then(|s| {
            s.lines()
                .find(|l| l.starts_with("VmHWM:"))
                .and_then(|l| l.split_whitespace().nth(1)?.parse().ok())
        })
        .unwrap_or(0)
}

fn main() {
    let megabytes: usize = std::env::args()
        .nth(1)
        .and_then(|a| a.parse().ok())
        .unwrap_or(60);
    // "small": one-digit elements ("7,", 2 bytes each, the worst case for a
    // tree of JSON values); otherwise seven digits ("1234567,", 8 bytes).
    let small = std::env::args().nth(2).is_some_and(|a| a == "small");
    let target = megabytes * 1_000_000;
    let count = if small { target / 2 } else { target / 8 };
    let mut body = String::with_capacity(target + 128);
    body.push_str(r#"{"inputs":[{"name":"INPUT0","datatype":"INT32","shape":["#);
    body.push_str(&count.to_string());
    body.push_str(r#"],"data":["#);
    for i in 0..count {
        if i > 0 {
            body.push(',');
        }
        if small {
            body.push(char::from(b'0' + (i % 10) as u8));
        } else {
            body.push_str(&(1_000_000 + i % 8_000_000).to_string());
        }
    }
    body.push_str("]}]}");
    let body = Bytes::from(body);
    let before = peak_rss_kib();
    let start = Instant::now();
    let request = decode_infer_request(body.clone(), None, "m", "").expect("decodes");
    let elapsed = start.elapsed();
    let after = peak_rss_kib();
    println!(
        "body {} bytes, {count} INT32 elements: decode {:.3} s, peak RSS {} MiB \
         (before decode {} MiB, tensor {} MiB)",
        body.len(),
        elapsed.as_secs_f64(),
        after / 1024,
        before / 1024,
        request.inputs[0].data.len() >> 20
    );
}
