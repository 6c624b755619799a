//! `TRITONSERVER_Message`: a serialized JSON document (model config,
//! backend config, metadata). Kept in serialized form, as backends only
//! ever ask for the bytes.

use std::ffi::c_char;

use super::error::{invalid_arg, non_null, ErrorPtr};

/// Opaque to C.
pub struct TRITONSERVER_Message {
    json: String,
}

impl TRITONSERVER_Message {
    pub fn new(json: String) -> Self {
        Self { json }
    }

    /// A new message for C, owned by the receiver
    /// (`TRITONSERVER_MessageDelete`).
    pub fn boxed(json: String) -> *mut TRITONSERVER_Message {
        Box::into_raw(Box::new(Self::new(json)))
    }

    pub fn json(&self) -> &str {
        &self.json
    }
}

/// Like Triton, the bytes are taken as they are; whoever reads the
/// message parses them.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MessageNewFromSerializedJson(
    message: *mut *mut TRITONSERVER_Message,
    base: *const c_char,
    byte_size: usize,
) -> ErrorPtr {
    ffi_entry!(non_null(message) {
        let bytes = if byte_size == 0 {
            &[][..]
        } else {
            non_null(base, "base")?;
            // SAFETY: `base` is non-null (checked above) and, by the header's contract, points to
            // `byte_size` elements that stay unchanged for the call; they are copied before it
            // returns.
            unsafe { std::slice::from_raw_parts(base.cast::<u8>(), byte_size) }
        };
        let json = std::str::from_utf8(bytes)
            .map_err(|_| invalid_arg("serialized JSON message is not valid UTF-8"))?;
        // SAFETY: `message` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *message = TRITONSERVER_Message::boxed(json.to_owned()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MessageDelete(
    message: *mut TRITONSERVER_Message,
) -> ErrorPtr {
    ffi_entry!({
        if !message.is_null() {
            // SAFETY: `message` is non-null (checked) and came from `Box::into_raw` in the
            // matching New function; the header makes this Delete its one release, so nothing uses
            // it afterwards.
            drop(unsafe { Box::from_raw(message) });
        }
        std::ptr::null_mut()
    })
}

/// The bytes stay owned by the message (valid until it is deleted); they
/// are not NUL-terminated, as in Triton.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_MessageSerializeToJson(
    message: *mut TRITONSERVER_Message,
    base: *mut *const c_char,
    byte_size: *mut usize,
) -> ErrorPtr {
    ffi_entry!(non_null(message, base, byte_size) {
        // SAFETY: `message` is checked non-null above and is a message from
        // `TRITONSERVER_MessageNewFromSerializedJson` or handed out by us, not deleted yet.
        let json = unsafe { &(*message).json };
        // SAFETY: `base`, `byte_size` are checked non-null above and, by the header's contract,
        // valid for writing one value.
        unsafe {
            *base = json.as_ptr().cast();
            *byte_size = json.len();
        }
        Ok(())
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn message_keeps_its_json() {
        let text = r#"{"cmdline":{"k":"v"}}"#;
        let mut m = std::ptr::null_mut();
        let mut base = std::ptr::null();
        let mut len = 0usize;
        // SAFETY: `base` is non-null (checked above) and, by the header's contract, points to
        // `len` elements that stay unchanged for the call; they are copied before it returns.
        unsafe {
            assert!(TRITONSERVER_MessageNewFromSerializedJson(
                &mut m,
                text.as_ptr().cast(),
                text.len()
            )
            .is_null());
            assert!(TRITONSERVER_MessageSerializeToJson(m, &mut base, &mut len).is_null());
            let back = std::slice::from_raw_parts(base.cast::<u8>(), len);
            assert_eq!(back, text.as_bytes());
            assert!(TRITONSERVER_MessageDelete(m).is_null());
        }
    }
}
