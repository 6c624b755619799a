//! Protocol-independent request/response types. Everything after the
//! protocol decoders works on these; nothing here knows JSON or protobuf.

mod datatype;
mod error;
mod request;
mod tensor;

pub use datatype::DataType;
pub use error::{
    clip, clip_to, show_shape, ErrorKind, InferError, InferResult, CLIP_BYTES, MESSAGE_BYTES,
};
pub use request::{
    ComputeTimes, InferRequest, InferResponse, ParamValue, Parameters, RequestedOutput,
};
pub use tensor::{bytes_elements, element_count, encode_bytes_elements, Tensor};
