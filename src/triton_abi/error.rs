//! `TRITONSERVER_Error`: a heap object owned by whoever receives it (a
//! null pointer means success). Errors created here and by backends are
//! the same type, so a backend may free ours and we free its.

use std::{
    ffi::{c_char, CStr, CString},
    ptr,
};

use super::types::{
    error_code_to_kind, ErrorCode, ERROR_ALREADY_EXISTS, ERROR_CANCELLED, ERROR_INTERNAL,
    ERROR_INVALID_ARG, ERROR_NOT_FOUND, ERROR_UNAVAILABLE, ERROR_UNKNOWN, ERROR_UNSUPPORTED,
};
use crate::types::InferError;

/// Opaque to C.
pub struct TRITONSERVER_Error {
    pub code: ErrorCode,
    pub message: CString,
}

/// The C API's result: null for success.
pub type ErrorPtr = *mut TRITONSERVER_Error;

impl TRITONSERVER_Error {
    /// A new error for C; interior NULs in `message` are dropped.
    pub fn boxed(code: ErrorCode, message: impl Into<String>) -> ErrorPtr {
        let mut bytes = message.into().into_bytes();
        bytes.retain(|&b| b != 0);
        let message = CString::new(bytes).unwrap_or_default();
        Box::into_raw(Box::new(Self { code, message }))
    }

    pub fn message_str(&self) -> String {
        self.message.to_string_lossy().into_owned()
    }
}

pub fn invalid_arg(message: impl Into<String>) -> ErrorPtr {
    TRITONSERVER_Error::boxed(ERROR_INVALID_ARG, message)
}

pub fn internal(message: impl Into<String>) -> ErrorPtr {
    TRITONSERVER_Error::boxed(ERROR_INTERNAL, message)
}

pub fn not_found(message: impl Into<String>) -> ErrorPtr {
    TRITONSERVER_Error::boxed(ERROR_NOT_FOUND, message)
}

pub fn unavailable(message: impl Into<String>) -> ErrorPtr {
    TRITONSERVER_Error::boxed(ERROR_UNAVAILABLE, message)
}

pub fn unsupported(message: impl Into<String>) -> ErrorPtr {
    TRITONSERVER_Error::boxed(ERROR_UNSUPPORTED, message)
}

/// Takes ownership of an error a backend returned and turns it into ours;
/// `None` for success (null).
///
/// # Safety
/// `err` is null or a pointer from `TRITONSERVER_ErrorNew` not yet freed.
pub unsafe fn take(err: ErrorPtr) -> Option<InferError> {
    if err.is_null() {
        return None;
    }
    // SAFETY: `err` is non-null (checked) and, per this function's contract, came from
    // `TRITONSERVER_ErrorNew` (a `Box::into_raw`) and was not freed; taking it here is its one
    // release.
    let boxed = unsafe { Box::from_raw(err) };
    Some(InferError::new(
        error_code_to_kind(boxed.code),
        boxed.message_str(),
    ))
}

/// Reads a C string argument, or says which one was bad.
///
/// # Safety
/// `s` is null or points to a NUL-terminated string valid for `'a`.
pub unsafe fn c_str<'a>(s: *const c_char, what: &str) -> Result<&'a str, ErrorPtr> {
    if s.is_null() {
        return Err(invalid_arg(format!("{what} is null")));
    }
    // SAFETY: `s` is non-null (checked) and, per this function's contract, a NUL-terminated string
    // valid for `'a`.
    unsafe { CStr::from_ptr(s) }
        .to_str()
        .map_err(|_| invalid_arg(format!("{what} is not valid UTF-8")))
}

/// Fails with INVALID_ARG when a required pointer argument is null.
pub fn non_null<T>(p: *const T, what: &str) -> Result<(), ErrorPtr> {
    if p.is_null() {
        Err(invalid_arg(format!("{what} is null")))
    } else {
        Ok(())
    }
}

/// Runs an API body that returns `Result<(), ErrorPtr>` as the C result.
pub fn status(result: Result<(), ErrorPtr>) -> ErrorPtr {
    match result {
        Ok(()) => ptr::null_mut(),
        Err(e) => e,
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ErrorNew(code: ErrorCode, msg: *const c_char) -> ErrorPtr {
    ffi_entry!({
        let message = if msg.is_null() {
            String::new()
        } else {
            // SAFETY: `msg` is non-null (checked) and a NUL-terminated string the caller keeps
            // valid for the call (tritonserver.h); it is copied at once.
            unsafe { CStr::from_ptr(msg) }
                .to_string_lossy()
                .into_owned()
        };
        TRITONSERVER_Error::boxed(code, message)
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ErrorDelete(error: ErrorPtr) {
    ffi_entry!((), {
        if !error.is_null() {
            // SAFETY: `error` is non-null (checked) and came from `Box::into_raw` in the matching
            // New function; the header makes this Delete its one release, so nothing uses it
            // afterwards.
            drop(unsafe { Box::from_raw(error) });
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ErrorCode(error: ErrorPtr) -> ErrorCode {
    ffi_entry!(ERROR_UNKNOWN, {
        if error.is_null() {
            return ERROR_UNKNOWN;
        }
        // SAFETY: `error` is checked non-null above and is an error from `TRITONSERVER_ErrorNew`
        // or from us, not deleted yet.
        unsafe { (*error).code }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ErrorCodeString(error: ErrorPtr) -> *const c_char {
    ffi_entry!(c"Unknown".as_ptr(), {
        let code = if error.is_null() {
            ERROR_UNKNOWN
        } else {
            // SAFETY: `error` is checked non-null above and is an error from
            // `TRITONSERVER_ErrorNew` or from us, not deleted yet.
            unsafe { (*error).code }
        };
        let s: &'static [u8] = match code {
            ERROR_INTERNAL => b"Internal\0",
            ERROR_NOT_FOUND => b"Not found\0",
            ERROR_INVALID_ARG => b"Invalid argument\0",
            ERROR_UNAVAILABLE => b"Unavailable\0",
            ERROR_UNSUPPORTED => b"Unsupported\0",
            ERROR_ALREADY_EXISTS => b"Already exists\0",
            ERROR_CANCELLED => b"Cancelled\0",
            _ => b"Unknown\0",
        };
        s.as_ptr().cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ErrorMessage(error: ErrorPtr) -> *const c_char {
    ffi_entry!(c"".as_ptr(), {
        if error.is_null() {
            return c"".as_ptr();
        }
        // SAFETY: `error` is checked non-null above and is an error from `TRITONSERVER_ErrorNew`
        // or from us, not deleted yet.
        unsafe { (*error).message.as_ptr() }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn error_round_trip_through_the_c_functions() {
        // SAFETY: test: `e` is an error made just above by `TRITONSERVER_ErrorNew`, deleted once
        // by `take`, and the message is copied before that.
        unsafe {
            let e = TRITONSERVER_ErrorNew(ERROR_NOT_FOUND, c"no such thing".as_ptr());
            assert_eq!(TRITONSERVER_ErrorCode(e), ERROR_NOT_FOUND);
            assert_eq!(
                CStr::from_ptr(TRITONSERVER_ErrorMessage(e)).to_str(),
                Ok("no such thing")
            );
            assert_eq!(
                CStr::from_ptr(TRITONSERVER_ErrorCodeString(e)).to_str(),
                Ok("Not found")
            );
            let taken = take(e).map(|e| (e.kind, e.message));
            assert_eq!(
                taken,
                Some((crate::types::ErrorKind::NotFound, "no such thing".into()))
            );
            assert!(take(ptr::null_mut()).is_none());
        }
    }
}
