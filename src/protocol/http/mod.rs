//! HTTP/REST (KServe v2 + Triton extensions).
pub mod codec;
