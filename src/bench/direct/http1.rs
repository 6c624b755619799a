//! HTTP/1.1 on the direct lane: the request as hyper would write it, the
//! response read with `httparse` in every framing a server may use.

use bytes::Bytes;

use super::lane::{Closed, Failure, Lane, Protocol, MAX_RESPONSE};
use crate::bench::request::{http_error, Prepared};

pub struct Http1 {
    /// One encoded request per prepared body, cycled.
    requests: Vec<Vec<u8>>,
}

/// How the response's body is delimited.
enum Framing {
    Length(usize),
    Chunked,
    /// Until the server closes.
    Close,
}

/// A response head: status, head length, framing, whether the connection
/// stays open after it.
struct Head {
    status: u16,
    len: usize,
    framing: Framing,
    keep_alive: bool,
}

/// hyper's words for a response cut short by the server closing.
const CLOSED: &str = "connection closed before message completed";

impl Http1 {
    pub fn new(p: &Prepared) -> Self {
        Self {
            requests: p.bodies.iter().map(|b| encode(p, b)).collect(),
        }
    }
}

impl Protocol for Http1 {
    fn opening(&mut self) -> Vec<u8> {
        Vec::new()
    }

    fn exchange(&mut self, lane: &mut Lane, i: usize) -> Result<(), Failure> {
        let request = &self.requests[i % self.requests.len()];
        let (status, body) =
            round_trip(lane, request).map_err(|f| f.prefixed("HTTP request failed: "))?;
        if (200..300).contains(&status) {
            return Ok(());
        }
        let code =
            http::StatusCode::from_u16(status).unwrap_or(http::StatusCode::INTERNAL_SERVER_ERROR);
        Err(Failure::Answer(http_error(code, &body)))
    }
}

/// The request line, the prepared headers, the length and the body: what
/// hyper writes for the same request.
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

/// Writes the request and reads the whole response: status and body.
fn round_trip(lane: &mut Lane, request: &[u8]) -> Result<(u16, Vec<u8>), Failure> {
    lane.write_all(request)?;
    let head = loop {
        if let Some(head) = parse_head(lane)? {
            break head;
        }
        if lane.fill()?.is_err() {
            return Err(Failure::Request(CLOSED.into()));
        }
    };
    let body = read_body(lane, &head)?;
    if !head.keep_alive {
        lane.conn()?.closing = true;
    }
    Ok((head.status, body))
}

/// The response head once it is all buffered, skipping interim 1xx
/// answers (consumed).
fn parse_head(lane: &mut Lane) -> Result<Option<Head>, Failure> {
    loop {
        let buf = lane.buffered();
        if buf.is_empty() {
            return Ok(None);
        }
        let mut headers = [httparse::EMPTY_HEADER; 64];
        let mut resp = httparse::Response::new(&mut headers);
        let len = match resp.parse(buf) {
            Ok(httparse::Status::Complete(n)) => n,
            Ok(httparse::Status::Partial) => return Ok(None),
            Err(e) => return Err(Failure::Request(format!("invalid HTTP response: {e}"))),
        };
        let status = resp.code.unwrap_or(0);
        if (100..200).contains(&status) {
            lane.consume(len);
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
                        Failure::Request("invalid content-length in the response".into())
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
        return Ok(Some(Head {
            status,
            len,
            framing,
            keep_alive,
        }));
    }
}

/// Reads the body after `head` and consumes both.
fn read_body(lane: &mut Lane, head: &Head) -> Result<Vec<u8>, Failure> {
    let closed = || Failure::Request(CLOSED.into());
    match head.framing {
        Framing::Length(n) => {
            while lane.buffered().len() < head.len + n {
                lane.fill()?.map_err(|Closed| closed())?;
            }
            let body = lane.buffered()[head.len..head.len + n].to_vec();
            lane.consume(head.len + n);
            Ok(body)
        }
        Framing::Close => {
            while lane.fill()?.is_ok() {}
            let body = lane.buffered()[head.len..].to_vec();
            lane.consume(usize::MAX);
            Ok(body)
        }
        Framing::Chunked => {
            let mut body = Vec::new();
            let mut pos = head.len;
            loop {
                match httparse::parse_chunk_size(&lane.buffered()[pos..]) {
                    Ok(httparse::Status::Complete((line, size))) => {
                        let size = usize::try_from(size)
                            .ok()
                            .filter(|&s| body.len() + s <= MAX_RESPONSE)
                            .ok_or_else(|| Failure::Request("response too large".into()))?;
                        if size == 0 {
                            // The last chunk, then trailers up to an empty line.
                            let end = loop {
                                if let Some(end) = trailers_end(&lane.buffered()[pos + line..]) {
                                    break pos + line + end;
                                }
                                lane.fill()?.map_err(|Closed| closed())?;
                            };
                            lane.consume(end);
                            return Ok(body);
                        }
                        let need = pos + line + size + 2;
                        while lane.buffered().len() < need {
                            lane.fill()?.map_err(|Closed| closed())?;
                        }
                        body.extend_from_slice(&lane.buffered()[pos + line..pos + line + size]);
                        pos = need;
                    }
                    Ok(httparse::Status::Partial) => {
                        lane.fill()?.map_err(|Closed| closed())?;
                    }
                    Err(_) => return Err(Failure::Request("invalid chunk in the response".into())),
                }
            }
        }
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
