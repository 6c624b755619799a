//! `TRITONSERVER_Log*` onto `tracing` (target `backend`, so
//! `RUST_LOG=backend=debug` shows a backend's verbose log), the basic
//! `TRITONSERVER_*` string functions and the server API version
//! (`TRITONBACKEND_ApiVersion` is `backend::capi`'s).

use std::ffi::{c_char, c_int, CStr};

use super::{
    error::{non_null, ErrorPtr},
    types::{
        datatype_from_c, datatype_name, datatype_to_c, InstanceGroupKind, LogLevel, MemoryType,
        TritonDataType, INSTANCEGROUPKIND_AUTO, INSTANCEGROUPKIND_CPU, INSTANCEGROUPKIND_GPU,
        INSTANCEGROUPKIND_MODEL, LOG_ERROR, LOG_INFO, LOG_VERBOSE, LOG_WARN, MEMORY_CPU,
        MEMORY_CPU_PINNED, MEMORY_GPU, TYPE_INVALID,
    },
};
use crate::types::DataType;

/// The version of `tritonserver.h` this server implements (Triton 2.5x).
pub const SERVER_API_VERSION: (u32, u32) = (1, 34);

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ApiVersion(major: *mut u32, minor: *mut u32) -> ErrorPtr {
    // SAFETY: `write_version` refuses null pointers; otherwise `major` and `minor` are the
    // caller's out-parameters, valid for writing a `uint32_t` (tritonserver.h).
    ffi_entry!(non_null(major, minor) { unsafe { write_version(major, minor, SERVER_API_VERSION) } })
}

/// Writes `v` to a C caller's version out-parameters, both or neither.
///
/// # Safety
/// `major` and `minor` are null (refused) or valid for writing a `uint32_t`.
pub unsafe fn write_version(
    major: *mut u32,
    minor: *mut u32,
    v: (u32, u32),
) -> Result<(), ErrorPtr> {
    non_null(major, "major")?;
    non_null(minor, "minor")?;
    // SAFETY: `major`, `minor` are checked non-null above and, per this function's contract, valid
    // for writing one value.
    unsafe {
        *major = v.0;
        *minor = v.1;
    }
    Ok(())
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_DataTypeString(datatype: TritonDataType) -> *const c_char {
    ffi_entry!(c"<invalid>".as_ptr(), {
        datatype_name(datatype).as_ptr().cast()
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_StringToDataType(dtype: *const c_char) -> TritonDataType {
    ffi_entry!(TYPE_INVALID, {
        if dtype.is_null() {
            return TYPE_INVALID;
        }
        // SAFETY: `dtype` is non-null (checked) and a NUL-terminated string the caller keeps valid
        // for the call (tritonserver.h); it is only read here.
        unsafe { CStr::from_ptr(dtype) }
            .to_str()
            .ok()
            .and_then(DataType::from_wire)
            .map_or(TYPE_INVALID, datatype_to_c)
    })
}

/// 0 for BYTES (variable size) and invalid types, as Triton.
#[no_mangle]
pub extern "C" fn TRITONSERVER_DataTypeByteSize(datatype: TritonDataType) -> u32 {
    ffi_entry!(0, {
        datatype_from_c(datatype)
            .and_then(DataType::element_size)
            .map_or(0, |s| s as u32)
    })
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_MemoryTypeString(memtype: MemoryType) -> *const c_char {
    ffi_entry!(c"<invalid>".as_ptr(), {
        let s: &'static [u8] = match memtype {
            MEMORY_CPU => b"CPU\0",
            MEMORY_CPU_PINNED => b"CPU_PINNED\0",
            MEMORY_GPU => b"GPU\0",
            _ => b"<invalid>\0",
        };
        s.as_ptr().cast()
    })
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_InstanceGroupKindString(kind: InstanceGroupKind) -> *const c_char {
    ffi_entry!(c"<invalid>".as_ptr(), {
        let s: &'static [u8] = match kind {
            INSTANCEGROUPKIND_AUTO => b"AUTO\0",
            INSTANCEGROUPKIND_CPU => b"CPU\0",
            INSTANCEGROUPKIND_GPU => b"GPU\0",
            INSTANCEGROUPKIND_MODEL => b"MODEL\0",
            _ => b"<invalid>\0",
        };
        s.as_ptr().cast()
    })
}

#[no_mangle]
pub extern "C" fn TRITONSERVER_LogIsEnabled(level: LogLevel) -> bool {
    ffi_entry!(false, {
        match level {
            LOG_ERROR => tracing::enabled!(target: "backend", tracing::Level::ERROR),
            LOG_WARN => tracing::enabled!(target: "backend", tracing::Level::WARN),
            LOG_INFO => tracing::enabled!(target: "backend", tracing::Level::INFO),
            LOG_VERBOSE => tracing::enabled!(target: "backend", tracing::Level::DEBUG),
            _ => false,
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_LogMessage(
    level: LogLevel,
    filename: *const c_char,
    line: c_int,
    msg: *const c_char,
) -> ErrorPtr {
    ffi_entry!({
        let text = |p: *const c_char| {
            if p.is_null() {
                String::new()
            } else {
                // SAFETY: `p` is non-null (checked) and a NUL-terminated string the backend keeps
                // valid for the call (tritonserver.h); it is copied at once.
                unsafe { CStr::from_ptr(p) }.to_string_lossy().into_owned()
            }
        };
        let (file, msg) = (text(filename), text(msg));
        match level {
            LOG_ERROR => tracing::error!(target: "backend", %file, line, "{msg}"),
            LOG_WARN => tracing::warn!(target: "backend", %file, line, "{msg}"),
            LOG_INFO => tracing::info!(target: "backend", %file, line, "{msg}"),
            _ => tracing::debug!(target: "backend", %file, line, "{msg}"),
        }
        std::ptr::null_mut()
    })
}
