use tonic::{Code, Status};

use crate::types::{ErrorKind, InferError};

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

pub fn to_status(e: InferError) -> Status {
    Status::new(code_for(e.kind), e.message)
}
