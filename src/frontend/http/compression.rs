//! HTTP body compression (`Content-Encoding` / `Accept-Encoding`).
//!
//! What tritonclient actually sends (tritonclient/http/_client.py):
//! - `request_compression_algorithm="gzip"`: `Content-Encoding: gzip`,
//!   body from Python's `gzip.compress` (RFC 1952).
//! - `request_compression_algorithm="deflate"`: `Content-Encoding: deflate`,
//!   body from `zlib.compress`, i.e. the zlib format (RFC 1950: 2-byte
//!   header, deflate stream, Adler-32), which is what HTTP's "deflate"
//!   means. Triton's server also writes zlib-wrapped "deflate".
//! - `response_compression_algorithm=...`: `Accept-Encoding: gzip` or
//!   `deflate`; the client decodes the answer with `gzip.decompress` /
//!   `zlib.decompress`, so "deflate" responses must be zlib-wrapped too.
//!
//! Some other HTTP clients send raw deflate (RFC 1951) under "deflate";
//! [`decompress`] detects the zlib header and accepts both.

use std::io::{Read, Write};

use bytes::Bytes;
use flate2::{
    read::{DeflateDecoder, MultiGzDecoder, ZlibDecoder},
    write::{GzEncoder, ZlibEncoder},
    Compression,
};

use crate::types::InferError;

/// Decodes a request body sent with `Content-Encoding: encoding`, refusing
/// to produce more than `limit` bytes (a small compressed body can expand
/// to gigabytes).
pub fn decompress(encoding: &str, body: &[u8], limit: usize) -> Result<Bytes, InferError> {
    let encoding = encoding.trim().to_ascii_lowercase();
    let too_big = || {
        InferError::invalid(format!(
            "decompressed request body exceeds the server's limit of {limit} bytes \
             (--http-max-input-size)"
        ))
    };
    let reader: Box<dyn Read + '_> = match encoding.as_str() {
        "identity" | "" => {
            if body.len() > limit {
                return Err(too_big());
            }
            return Ok(Bytes::copy_from_slice(body));
        }
        // "x-gzip" is gzip's historical name (RFC 9110 §8.4.1.3).
        "gzip" | "x-gzip" => Box::new(MultiGzDecoder::new(body)),
        "deflate" if is_zlib_header(body) => Box::new(ZlibDecoder::new(body)),
        "deflate" => Box::new(DeflateDecoder::new(body)),
        other => {
            return Err(InferError::invalid(format!(
                "unsupported Content-Encoding '{other}': expected gzip, deflate or identity"
            )))
        }
    };
    // Read at most one byte past the limit: enough to tell "too big"
    // without ever holding more than limit + 1 bytes.
    let cap = u64::try_from(limit).unwrap_or(u64::MAX).saturating_add(1);
    let mut out = Vec::new();
    reader.take(cap).read_to_end(&mut out).map_err(|e| {
        InferError::invalid(format!(
            "failed to decompress the {encoding} request body: {e}"
        ))
    })?;
    if out.len() > limit {
        return Err(too_big());
    }
    Ok(Bytes::from(out))
}

/// RFC 1950 header: compression method 8 (deflate), window ≤ 32 KiB, and
/// the 16-bit header a multiple of 31. A raw deflate stream would need a
/// first byte with low nibble 8, i.e. a non-final stored block with
/// non-zero padding bits, which encoders do not write.
fn is_zlib_header(body: &[u8]) -> bool {
    match body {
        [cmf, flg, ..] => {
            cmf & 0x0f == 8 && cmf >> 4 <= 7 && (u16::from(*cmf) << 8 | u16::from(*flg)) % 31 == 0
        }
        _ => false,
    }
}

/// Compresses a response body for `Content-Encoding: encoding` ("gzip" or
/// "deflate", the latter zlib-wrapped as clients expect). `None` for any
/// other encoding, in which case the body goes out uncompressed.
pub fn compress(encoding: &str, body: &[u8]) -> Option<Bytes> {
    // Writing into a Vec cannot fail; errors map to "send it uncompressed".
    let out = Vec::with_capacity(body.len() / 2 + 64);
    match encoding {
        "gzip" => {
            let mut e = GzEncoder::new(out, Compression::default());
            e.write_all(body).ok()?;
            e.finish().ok().map(Bytes::from)
        }
        "deflate" => {
            let mut e = ZlibEncoder::new(out, Compression::default());
            e.write_all(body).ok()?;
            e.finish().ok().map(Bytes::from)
        }
        _ => None,
    }
}

/// Picks the response encoding from `Accept-Encoding`: the supported coding
/// (gzip, deflate) with the highest q-value, q=0 meaning "not acceptable";
/// `*` stands for any coding not listed. On equal q the earlier listed
/// wins. `None` (send identity) when nothing supported is acceptable or
/// `identity` itself is preferred.
pub fn choose_response_encoding(accept_encoding: &str) -> Option<&'static str> {
    let mut listed: Vec<(String, f32)> = Vec::new();
    for item in accept_encoding.split(',') {
        let mut parts = item.split(';');
        let coding = parts.next().unwrap_or("").trim().to_ascii_lowercase();
        if coding.is_empty() {
            continue;
        }
        let mut q = 1.0f32;
        for p in parts {
            if let Some((k, v)) = p.split_once('=') {
                if k.trim().eq_ignore_ascii_case("q") {
                    // A malformed q-value makes the entry unusable: skip it.
                    q = v
                        .trim()
                        .parse::<f32>()
                        .ok()
                        .filter(|q| (0.0..=1.0).contains(q))
                        .unwrap_or(0.0);
                }
            }
        }
        listed.push((coding, q));
    }
    let q_of = |name: &str| -> Option<f32> {
        listed
            .iter()
            .find(|(c, _)| c == name || (name == "gzip" && c == "x-gzip"))
            .or_else(|| listed.iter().find(|(c, _)| c == "*"))
            .map(|(_, q)| *q)
    };
    let position = |name: &str| {
        listed
            .iter()
            .position(|(c, _)| c == name)
            .unwrap_or(usize::MAX)
    };
    let mut best: Option<(&'static str, f32, usize)> = None;
    for name in ["gzip", "deflate"] {
        if let Some(q) = q_of(name).filter(|q| *q > 0.0) {
            let pos = position(name);
            let better = match best {
                None => true,
                Some((_, bq, bpos)) => q > bq || (q == bq && pos < bpos),
            };
            if better {
                best = Some((name, q, pos));
            }
        }
    }
    let (name, q, _) = best?;
    // An explicitly preferred identity keeps the body as is.
    match listed.iter().find(|(c, _)| c == "identity") {
        Some((_, iq)) if *iq > q => None,
        _ => Some(name),
    }
}

#[cfg(test)]
mod tests {
    use flate2::write::DeflateEncoder;

    use super::*;
    use crate::types::ErrorKind;

    fn zlib(data: &[u8]) -> Vec<u8> {
        let mut e = ZlibEncoder::new(Vec::new(), Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn gzip(data: &[u8]) -> Vec<u8> {
        let mut e = GzEncoder::new(Vec::new(), Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    fn raw_deflate(data: &[u8]) -> Vec<u8> {
        let mut e = DeflateEncoder::new(Vec::new(), Compression::default());
        e.write_all(data).unwrap();
        e.finish().unwrap()
    }

    #[test]
    fn gzip_round_trip() {
        let body = b"{\"inputs\": []}".repeat(10);
        assert_eq!(
            &decompress("gzip", &gzip(&body), 1 << 20).unwrap()[..],
            &body[..]
        );
    }

    #[test]
    fn concatenated_gzip_members_are_all_read() {
        let mut two = gzip(b"ab");
        two.extend(gzip(b"cd"));
        assert_eq!(&decompress("gzip", &two, 100).unwrap()[..], b"abcd");
    }

    #[test]
    fn deflate_is_zlib_wrapped_like_python_zlib_compress() {
        let body = b"hello hello hello";
        let z = zlib(body);
        assert!(is_zlib_header(&z));
        assert_eq!(&decompress("deflate", &z, 100).unwrap()[..], body);
    }

    #[test]
    fn raw_deflate_is_accepted_too() {
        let body = b"raw deflate from some other client";
        assert_eq!(
            &decompress("deflate", &raw_deflate(body), 100).unwrap()[..],
            body
        );
    }

    #[test]
    fn encoding_name_is_case_insensitive() {
        assert!(decompress("GZIP", &gzip(b"x"), 10).is_ok());
    }

    #[test]
    fn identity_passes_through_within_limit() {
        assert_eq!(&decompress("identity", b"abc", 3).unwrap()[..], b"abc");
        assert_eq!(
            decompress("identity", b"abcd", 3).unwrap_err().kind,
            ErrorKind::InvalidArgument
        );
    }

    #[test]
    fn zip_bomb_is_refused_at_the_limit() {
        let bomb = gzip(&vec![0u8; 10 << 20]);
        assert!(bomb.len() < 64 << 10);
        let err = decompress("gzip", &bomb, 1 << 20).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
        assert!(err.message.contains("limit"), "{}", err.message);
    }

    #[test]
    fn output_exactly_at_limit_is_accepted() {
        assert_eq!(
            decompress("deflate", &zlib(&[7u8; 1000]), 1000)
                .unwrap()
                .len(),
            1000
        );
    }

    #[test]
    fn corrupt_stream_is_invalid_argument() {
        let err = decompress("gzip", b"not gzip at all", 100).unwrap_err();
        assert_eq!(err.kind, ErrorKind::InvalidArgument);
    }

    #[test]
    fn truncated_stream_is_invalid_argument() {
        let z = gzip(&[1u8; 5000]);
        assert!(decompress("gzip", &z[..z.len() / 2], 1 << 20).is_err());
    }

    #[test]
    fn unknown_encoding_is_refused() {
        let err = decompress("br", b"x", 100).unwrap_err();
        assert!(err.message.contains("unsupported Content-Encoding 'br'"));
    }

    #[test]
    fn compress_gzip_and_deflate_round_trip() {
        let body = b"0123456789".repeat(100);
        let g = compress("gzip", &body).unwrap();
        assert_eq!(&g[..2], &[0x1f, 0x8b]);
        assert_eq!(&decompress("gzip", &g, 1 << 20).unwrap()[..], &body[..]);
        let d = compress("deflate", &body).unwrap();
        assert!(is_zlib_header(&d));
        assert_eq!(&decompress("deflate", &d, 1 << 20).unwrap()[..], &body[..]);
    }

    #[test]
    fn compress_unknown_encoding_is_none() {
        assert_eq!(compress("br", b"x"), None);
    }

    #[test]
    fn accept_encoding_single_values_as_tritonclient_sends() {
        assert_eq!(choose_response_encoding("gzip"), Some("gzip"));
        assert_eq!(choose_response_encoding("deflate"), Some("deflate"));
        assert_eq!(choose_response_encoding(""), None);
        assert_eq!(choose_response_encoding("br"), None);
    }

    #[test]
    fn accept_encoding_q_zero_excludes() {
        assert_eq!(
            choose_response_encoding("gzip;q=0, deflate"),
            Some("deflate")
        );
        assert_eq!(choose_response_encoding("gzip;q=0"), None);
        assert_eq!(choose_response_encoding("*;q=0"), None);
    }

    #[test]
    fn accept_encoding_highest_q_wins() {
        assert_eq!(
            choose_response_encoding("gzip;q=0.5, deflate;q=0.8"),
            Some("deflate")
        );
        assert_eq!(choose_response_encoding("deflate, gzip"), Some("deflate"));
        assert_eq!(choose_response_encoding("br, gzip;q=0.1"), Some("gzip"));
    }

    #[test]
    fn accept_encoding_wildcard() {
        assert_eq!(choose_response_encoding("*"), Some("gzip"));
        assert_eq!(choose_response_encoding("gzip;q=0, *"), Some("deflate"));
    }

    #[test]
    fn accept_encoding_preferred_identity() {
        assert_eq!(choose_response_encoding("identity, gzip;q=0.5"), None);
        assert_eq!(
            choose_response_encoding("identity;q=0.5, gzip"),
            Some("gzip")
        );
    }

    #[test]
    fn accept_encoding_malformed_q_is_ignored() {
        assert_eq!(
            choose_response_encoding("gzip;q=abc, deflate;q=0.3"),
            Some("deflate")
        );
        assert_eq!(choose_response_encoding("GZIP ; Q=1"), Some("gzip"));
    }
}
