/// What went wrong with a request, independent of protocol. `protocol/`
/// maps each kind to an HTTP status and a gRPC code.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ErrorKind {
    /// Malformed or inconsistent request (HTTP 400, gRPC INVALID_ARGUMENT).
    InvalidArgument,
    /// Unknown model or version (HTTP 404, gRPC NOT_FOUND).
    NotFound,
    /// Model not ready, queue full, shutting down (HTTP 503, gRPC UNAVAILABLE).
    Unavailable,
    /// Feature not supported for this model (HTTP 501/400, gRPC UNIMPLEMENTED).
    Unsupported,
    /// Failure inside a backend while executing (HTTP 500, gRPC INTERNAL).
    Internal,
    /// A resource already exists (gRPC ALREADY_EXISTS).
    AlreadyExists,
}

/// An error answered to a client. The message is shown verbatim: it must
/// name the model/input at fault (clients also grep for Triton's phrasings).
#[derive(Debug, Clone, PartialEq, Eq, thiserror::Error)]
#[error("{message}")]
pub struct InferError {
    pub kind: ErrorKind,
    pub message: String,
}

pub type InferResult<T> = Result<T, InferError>;

impl InferError {
    pub fn new(kind: ErrorKind, message: impl Into<String>) -> Self {
        Self {
            kind,
            message: message.into(),
        }
    }
    pub fn invalid(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::InvalidArgument, message)
    }
    pub fn not_found(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::NotFound, message)
    }
    pub fn unavailable(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unavailable, message)
    }
    pub fn unsupported(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Unsupported, message)
    }
    pub fn internal(message: impl Into<String>) -> Self {
        Self::new(ErrorKind::Internal, message)
    }
}
