use tonic::{Code, Status};

use crate::types::{clip_to, ErrorKind, InferError, MESSAGE_BYTES};

/// Triton's gRPC status code for each error kind.
pub fn code_for(kind: ErrorKind) -> Code {
    match kind {
        ErrorKind::InvalidArgument => Code::InvalidArgument,
        ErrorKind::NotFound => Code::NotFound,
        ErrorKind::Unavailable => Code::Unavailable,
        ErrorKind::Unsupported => Code::Unimplemented,
        ErrorKind::Internal => Code::Internal,
        ErrorKind::AlreadyExists => Code::AlreadyExists,
    }
}

/// The status for an error; its message (the `grpc-message` trailer) is
/// kept to [`MESSAGE_BYTES`] whatever it quotes.
pub fn to_status(e: InferError) -> Status {
    let message = match clip_to(&e.message, MESSAGE_BYTES) {
        std::borrow::Cow::Borrowed(_) => e.message,
        std::borrow::Cow::Owned(clipped) => clipped,
    };
    Status::new(code_for(e.kind), message)
}
