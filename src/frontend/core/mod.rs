//! What every front end shares once it has decoded a request, written
//! once: the infer path (`infer`), which HTTP, gRPC and the in-process C
//! API call between their wire decode and their wire encode.

pub mod infer;
