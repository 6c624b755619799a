//! What the SageMaker and Vertex AI front ends share: each of their routes
//! is rewritten into a KServe route and answered by `routes::handle` (the
//! one infer path, the restricted-API checks and Triton's error texts),
//! with the request's binary-data header carried in its content type, as
//! both services' clients send it.

use bytes::Bytes;
use http::{header, HeaderMap, HeaderValue, Method, StatusCode, Uri};
use http_body_util::Full;
use hyper::{body::Incoming, Request, Response};

use super::{codec::error_body, routes::HEADER_LENGTH, server::HttpResponse};
use crate::types::{clip, InferError, InferResult};

/// `req` addressed to `target` (a KServe path, already percent-encoded),
/// with its method replaced when `method` is given.
pub(super) fn rewrite(
    req: Request<Incoming>,
    method: Option<Method>,
    target: &str,
) -> InferResult<Request<Incoming>> {
    let uri = Uri::try_from(target)
        .map_err(|_| InferError::invalid(format!("invalid endpoint '{}'", clip(target))))?;
    let (mut parts, body) = req.into_parts();
    parts.uri = uri;
    if let Some(m) = method {
        parts.method = m;
    }
    Ok(Request::from_parts(parts, body))
}

/// Percent-encodes one path segment (a model name), so that the KServe
/// router, which decodes segments, sees the name as given.
pub(super) fn encode_segment(s: &str) -> String {
    let mut out = String::with_capacity(s.len());
    for b in s.bytes() {
        if b.is_ascii_alphanumeric() || matches!(b, b'-' | b'.' | b'_' | b'~') {
            out.push(char::from(b));
        } else {
            out.push_str(&format!("%{b:02X}"));
        }
    }
    out
}

/// Prepares an infer request's headers as Triton's SageMaker and Vertex AI
/// servers read them: the JSON header's length comes from the content type
/// `<mime><length>` (absent: the whole body is JSON; a client's own
/// `Inference-Header-Content-Length` is not read), and bodies and answers
/// are never compressed (both servers override compression to identity).
pub(super) fn binary_content_type(headers: &mut HeaderMap, mime: &str) -> InferResult<()> {
    headers.remove(&HEADER_LENGTH);
    headers.remove(header::CONTENT_ENCODING);
    headers.remove(header::ACCEPT_ENCODING);
    let Some(content_type) = headers.get(header::CONTENT_TYPE) else {
        return Ok(());
    };
    let content_type = String::from_utf8_lossy(content_type.as_bytes()).into_owned();
    let Some(pos) = content_type.find(mime) else {
        return Ok(());
    };
    if pos != 0 {
        return Err(InferError::invalid(format!(
            "expect MIME type for binary data starts with '{mime}', got: {}",
            clip(&content_type)
        )));
    }
    let raw = &content_type[mime.len()..];
    let length = match leading_int(raw) {
        Some(Ok(n)) => n,
        Some(Err(())) => {
            return Err(InferError::invalid(format!(
                "Unable to parse inference header size, value is out of range, got: {}",
                clip(raw)
            )))
        }
        None => {
            return Err(InferError::invalid(format!(
                "Unable to parse inference header size, got: {}",
                clip(raw)
            )))
        }
    };
    let content_length = headers
        .get(header::CONTENT_LENGTH)
        .and_then(|v| v.to_str().ok())
        .and_then(|v| v.trim().parse::<i64>().ok());
    // Without a Content-Length (a chunked body) the decoder checks the
    // length against the body it reads.
    if length < 0 || content_length.is_some_and(|cl| i64::from(length) > cl) {
        return Err(InferError::invalid(format!(
            "inference header size should be in range (0, {}), got: {}",
            content_length.unwrap_or_default(),
            clip(raw)
        )));
    }
    headers.insert(HEADER_LENGTH.clone(), HeaderValue::from(length));
    Ok(())
}

/// The integer at the start of `s` as C++ `std::stoi` reads it (leading
/// blanks, a sign, digits; the rest ignored): None when there is none,
/// `Err` when it does not fit an `i32`.
fn leading_int(s: &str) -> Option<Result<i32, ()>> {
    let t = s.trim_start();
    let (sign, digits) = match t.as_bytes().first() {
        Some(b'-') => (-1i64, &t[1..]),
        Some(b'+') => (1, &t[1..]),
        _ => (1, t),
    };
    let end = digits
        .bytes()
        .position(|b| !b.is_ascii_digit())
        .unwrap_or(digits.len());
    if end == 0 {
        return None;
    }
    let value = digits[..end]
        .parse::<i64>()
        .ok()
        .and_then(|v| i32::try_from(sign * v).ok());
    Some(value.ok_or(()))
}

/// The `Inference-Header-Content-Length` of an answer, taken out (the
/// SageMaker answer carries it in its content type instead).
pub(super) fn take_header_length(resp: &mut HttpResponse) -> Option<HeaderValue> {
    resp.headers_mut().remove(&HEADER_LENGTH)
}

/// An answer without a body, as Triton's `evhtp_send_reply` with no error.
pub(super) fn bare(status: StatusCode) -> HttpResponse {
    let mut resp = Response::new(Full::new(Bytes::new()));
    *resp.status_mut() = status;
    resp
}

/// `{"error": message}` with `status`.
pub(super) fn error_with(status: StatusCode, message: &str) -> HttpResponse {
    let mut resp = Response::new(Full::new(error_body(message)));
    *resp.status_mut() = status;
    resp.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    resp
}

#[cfg(test)]
mod tests {
    use super::*;

    const MIME: &str = "application/vnd.sagemaker-triton.binary+json;json-header-size=";

    fn headers(content_type: &str, length: Option<&str>) -> HeaderMap {
        let mut h = HeaderMap::new();
        h.insert(header::CONTENT_TYPE, content_type.parse().unwrap());
        if let Some(l) = length {
            h.insert(header::CONTENT_LENGTH, l.parse().unwrap());
        }
        h.insert(HEADER_LENGTH.clone(), "7".parse().unwrap());
        h
    }

    #[test]
    fn the_header_length_comes_from_the_content_type() {
        let mut h = headers(&format!("{MIME}42"), Some("100"));
        binary_content_type(&mut h, MIME).unwrap();
        assert_eq!(h.get(&HEADER_LENGTH).unwrap(), "42");
        // Plain JSON: the client's own header is not read.
        let mut h = headers("application/json", Some("100"));
        binary_content_type(&mut h, MIME).unwrap();
        assert!(h.get(&HEADER_LENGTH).is_none());
    }

    #[test]
    fn bad_header_lengths_have_tritons_texts() {
        for (ct, len, text) in [
            (
                format!("text/x;{MIME}4"),
                "10",
                "expect MIME type for binary data starts with",
            ),
            (
                format!("{MIME}abc"),
                "10",
                "Unable to parse inference header size, got: abc",
            ),
            (format!("{MIME}99999999999"), "10", "value is out of range"),
            (
                format!("{MIME}11"),
                "10",
                "inference header size should be in range (0, 10), got: 11",
            ),
            (
                format!("{MIME}-1"),
                "10",
                "inference header size should be in range",
            ),
        ] {
            let e = binary_content_type(&mut headers(&ct, Some(len)), MIME).unwrap_err();
            assert!(e.message.contains(text), "{ct}: {}", e.message);
            assert_eq!(e.kind, crate::types::ErrorKind::InvalidArgument);
        }
    }

    #[test]
    fn segments_are_encoded() {
        assert_eq!(encode_segment("simple"), "simple");
        assert_eq!(encode_segment("a b/c%"), "a%20b%2Fc%25");
    }
}
