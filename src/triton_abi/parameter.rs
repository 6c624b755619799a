//! `TRITONSERVER_Parameter`: a named value of one of Triton's parameter
//! types. Also the representation of request and response parameters
//! (`TRITONBACKEND_RequestParameter` hands out `value_ptr`).

use std::ffi::{c_char, c_void, CString};

use super::{
    error::c_str,
    types::{
        ParameterType, PARAMETER_BOOL, PARAMETER_BYTES, PARAMETER_DOUBLE, PARAMETER_INT,
        PARAMETER_STRING,
    },
};

/// A parameter's value, stored so that the pointer Triton's API hands out
/// stays valid as long as the parameter lives.
#[derive(Debug, Clone)]
pub enum ParamValue {
    String(CString),
    Int(i64),
    Bool(bool),
    Double(f64),
    /// A shallow reference, as Triton keeps it: the caller keeps the bytes
    /// alive until the parameter is deleted.
    Bytes {
        ptr: *const c_void,
        size: u64,
    },
}

/// Opaque to C.
#[derive(Debug, Clone)]
pub struct TRITONSERVER_Parameter {
    pub name: CString,
    pub value: ParamValue,
}

// SAFETY: the only raw pointer is a BYTES parameter's shallow reference,
// which the API's contract keeps valid (and unmodified) while the parameter
// lives, whichever thread reads it.
unsafe impl Send for TRITONSERVER_Parameter {}
// SAFETY: as for `Send`: a shared parameter is only read, and the BYTES reference it holds is
// never written through.
unsafe impl Sync for TRITONSERVER_Parameter {}

impl TRITONSERVER_Parameter {
    /// Builds one from Rust values; interior NULs are dropped.
    pub fn new(name: &str, value: ParamValue) -> Self {
        Self {
            name: lossy_cstring(name),
            value,
        }
    }

    pub fn kind(&self) -> ParameterType {
        match self.value {
            ParamValue::String(_) => PARAMETER_STRING,
            ParamValue::Int(_) => PARAMETER_INT,
            ParamValue::Bool(_) => PARAMETER_BOOL,
            ParamValue::Double(_) => PARAMETER_DOUBLE,
            ParamValue::Bytes { .. } => PARAMETER_BYTES,
        }
    }

    /// What Triton hands out as `vvalue`: `const char*` for a string, a
    /// pointer to the value for INT/BOOL/DOUBLE, the data for BYTES.
    pub fn value_ptr(&self) -> *const c_void {
        match &self.value {
            ParamValue::String(s) => s.as_ptr().cast(),
            ParamValue::Int(v) => (v as *const i64).cast(),
            ParamValue::Bool(v) => (v as *const bool).cast(),
            ParamValue::Double(v) => (v as *const f64).cast(),
            ParamValue::Bytes { ptr, .. } => *ptr,
        }
    }
}

pub fn lossy_cstring(s: &str) -> CString {
    let mut bytes = s.as_bytes().to_vec();
    bytes.retain(|&b| b != 0);
    CString::new(bytes).unwrap_or_default()
}

/// Null for BYTES (use `TRITONSERVER_ParameterBytesNew`), a bad type, or
/// a null/invalid name or value, as Triton returns null.
#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ParameterNew(
    name: *const c_char,
    kind: ParameterType,
    value: *const c_void,
) -> *mut TRITONSERVER_Parameter {
    ffi_entry!(std::ptr::null_mut(), {
        // SAFETY: `name` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
        // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past
        // the call.
        let Ok(name) = (unsafe { c_str(name, "name") }).map_err(|e| unsafe { drop_error(e) })
        else {
            return std::ptr::null_mut();
        };
        if value.is_null() {
            return std::ptr::null_mut();
        }
        let value = match kind {
            PARAMETER_STRING => {
                let Ok(s) =
                    // SAFETY: `value` is non-null (checked above) and for a STRING parameter the
                    // header makes it a NUL-terminated string valid for the call (copied by
                    // `lossy_cstring`); `drop_error` frees the error `c_str` just made.
                    (unsafe { c_str(value.cast(), "value") }).map_err(|e| unsafe { drop_error(e) })
                else {
                    return std::ptr::null_mut();
                };
                ParamValue::String(lossy_cstring(s))
            }
            // SAFETY: `value` is non-null (checked above) and points to the
            // header's `int64_t`; read unaligned, as a `void*` promises no
            // alignment.
            PARAMETER_INT => ParamValue::Int(unsafe { value.cast::<i64>().read_unaligned() }),
            // SAFETY: `value` is non-null (checked above) and points to a C
            // `bool`, read as its byte: a byte other than 0 or 1 read as a
            // Rust `bool` would be undefined behaviour.
            PARAMETER_BOOL => ParamValue::Bool(unsafe { value.cast::<u8>().read() } != 0),
            // SAFETY: `value` is non-null (checked above) and points to the
            // header's `double`; read unaligned, as for INT.
            PARAMETER_DOUBLE => ParamValue::Double(unsafe { value.cast::<f64>().read_unaligned() }),
            _ => return std::ptr::null_mut(),
        };
        Box::into_raw(Box::new(TRITONSERVER_Parameter::new(name, value)))
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ParameterBytesNew(
    name: *const c_char,
    byte_ptr: *const c_void,
    size: u64,
) -> *mut TRITONSERVER_Parameter {
    ffi_entry!(std::ptr::null_mut(), {
        // SAFETY: `name` is null (refused by `c_str`) or a NUL-terminated string the caller keeps
        // valid for the call (the header's `const char*` contract); nothing keeps the `&str` past
        // the call.
        let Ok(name) = (unsafe { c_str(name, "name") }).map_err(|e| unsafe { drop_error(e) })
        else {
            return std::ptr::null_mut();
        };
        let value = ParamValue::Bytes {
            ptr: byte_ptr,
            size,
        };
        Box::into_raw(Box::new(TRITONSERVER_Parameter::new(name, value)))
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ParameterDelete(parameter: *mut TRITONSERVER_Parameter) {
    ffi_entry!((), {
        if !parameter.is_null() {
            // SAFETY: `parameter` is non-null (checked) and came from `Box::into_raw` in the
            // matching New function; the header makes this Delete its one release, so nothing uses
            // it afterwards.
            drop(unsafe { Box::from_raw(parameter) });
        }
    })
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_ParameterTypeString(kind: ParameterType) -> *const c_char {
    ffi_entry!(c"<invalid>".as_ptr(), {
        let s: &'static [u8] = match kind {
            PARAMETER_STRING => b"STRING\0",
            PARAMETER_INT => b"INT\0",
            PARAMETER_BOOL => b"BOOL\0",
            PARAMETER_DOUBLE => b"DOUBLE\0",
            PARAMETER_BYTES => b"BYTES\0",
            _ => b"<invalid>\0",
        };
        s.as_ptr().cast()
    })
}

unsafe fn drop_error(e: super::error::ErrorPtr) {
    // SAFETY: per this function's contract `e` is null or an error from
    // `TRITONSERVER_Error::boxed` not freed yet.
    unsafe { super::error::TRITONSERVER_ErrorDelete(e) }
}

#[cfg(test)]
mod tests {
    use super::*;
    use std::ffi::CStr;

    #[test]
    fn parameters_hand_out_triton_value_pointers() {
        // SAFETY: test: every pointer is a local or a parameter created just above and deleted
        // once.
        unsafe {
            let v: i64 = 42;
            let p =
                TRITONSERVER_ParameterNew(c"n".as_ptr(), PARAMETER_INT, (&v as *const i64).cast());
            assert!(!p.is_null());
            assert_eq!((*p).kind(), PARAMETER_INT);
            assert_eq!(*(*p).value_ptr().cast::<i64>(), 42);
            TRITONSERVER_ParameterDelete(p);

            let s =
                TRITONSERVER_ParameterNew(c"s".as_ptr(), PARAMETER_STRING, c"abc".as_ptr().cast());
            assert_eq!(CStr::from_ptr((*s).value_ptr().cast()).to_str(), Ok("abc"));
            TRITONSERVER_ParameterDelete(s);

            let bytes_as_new =
                TRITONSERVER_ParameterNew(c"b".as_ptr(), PARAMETER_BYTES, c"x".as_ptr().cast());
            assert!(bytes_as_new.is_null());
            // A C `bool` object holding another byte than 0 or 1 is read
            // as true (it was read as a Rust `bool`: undefined behaviour),
            // and numbers are read wherever they sit.
            let two: u8 = 2;
            let b = TRITONSERVER_ParameterNew(
                c"b".as_ptr(),
                PARAMETER_BOOL,
                (&two as *const u8).cast(),
            );
            assert!(matches!((*b).value, ParamValue::Bool(true)));
            TRITONSERVER_ParameterDelete(b);
            let mut bytes = [0u8; 9];
            bytes[1..].copy_from_slice(&(-5i64).to_ne_bytes());
            let i =
                TRITONSERVER_ParameterNew(c"i".as_ptr(), PARAMETER_INT, bytes[1..].as_ptr().cast());
            assert!(matches!((*i).value, ParamValue::Int(-5)));
            TRITONSERVER_ParameterDelete(i);
        }
    }
}
