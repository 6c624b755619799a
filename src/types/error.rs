/// What went wrong with a request, independent of protocol. `frontend/`
/// maps each kind to an HTTP status, a gRPC code or a `TRITONSERVER_Error` code.
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

/// The most bytes of client input an error message repeats.
pub const CLIP_BYTES: usize = 256;

/// The most bytes of a whole error message sent to a client: a last guard
/// for messages that quote something not clipped on its own.
pub const MESSAGE_BYTES: usize = 4096;

/// Client-provided text (a model, tensor or parameter name, a datatype, a
/// value) as an error message may quote it: whole when at most
/// [`CLIP_BYTES`] bytes long, otherwise cut on a char boundary and marked
/// with the full length, so a 10 MB name cannot come back in a response
/// header or body.
pub fn clip(s: &str) -> std::borrow::Cow<'_, str> {
    clip_to(s, CLIP_BYTES)
}

/// [`clip`] to at most `max` bytes of `s`.
pub fn clip_to(s: &str, max: usize) -> std::borrow::Cow<'_, str> {
    if s.len() <= max {
        return std::borrow::Cow::Borrowed(s);
    }
    let mut cut = max;
    while !s.is_char_boundary(cut) {
        cut -= 1;
    }
    std::borrow::Cow::Owned(format!("{}…({} bytes)", &s[..cut], s.len()))
}

/// The most dimensions of a client's shape an error message lists.
const SHAPE_DIMS_SHOWN: usize = 16;

/// A client's shape as error messages show it (`[1, 16]`): at most
/// [`SHAPE_DIMS_SHOWN`] dimensions, then the count of the rest.
pub fn show_shape(shape: &[i64]) -> String {
    let shown = &shape[..shape.len().min(SHAPE_DIMS_SHOWN)];
    let mut s = format!("{shown:?}");
    if shape.len() > shown.len() {
        s.pop();
        s.push_str(&format!(", …({} dims)]", shape.len()));
    }
    s
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn short_text_is_kept_whole() {
        assert!(matches!(
            clip("simple"),
            std::borrow::Cow::Borrowed("simple")
        ));
        let exact = "x".repeat(CLIP_BYTES);
        assert_eq!(clip(&exact), exact);
    }

    #[test]
    fn long_text_is_cut_on_a_char_boundary_with_its_length() {
        let long = "é".repeat(1_000_000);
        let c = clip(&long);
        assert!(c.len() < CLIP_BYTES + 32, "{}", c.len());
        assert!(c.ends_with("…(2000000 bytes)"), "{c}");
        assert!(c.starts_with("éé"));
    }

    #[test]
    fn long_shapes_are_shown_in_part() {
        assert_eq!(show_shape(&[1, 16]), "[1, 16]");
        assert_eq!(show_shape(&[]), "[]");
        let long = vec![1i64; 100_000];
        let s = show_shape(&long);
        assert!(s.len() < 80 && s.ends_with(", …(100000 dims)]"), "{s}");
    }
}
