//! Triton's C enums with their ABI values (`tritonserver.h`,
//! `tritonbackend.h`), and conversions to the server's own types. C enums
//! cross the ABI as `int` (`u32` here) so an out-of-range value from a
//! backend is an error, never undefined behaviour.

use crate::types::{DataType, ErrorKind};

/// `TRITONSERVER_DataType`.
pub type TritonDataType = u32;
pub const TYPE_INVALID: TritonDataType = 0;
pub const TYPE_BOOL: TritonDataType = 1;
pub const TYPE_UINT8: TritonDataType = 2;
pub const TYPE_UINT16: TritonDataType = 3;
pub const TYPE_UINT32: TritonDataType = 4;
pub const TYPE_UINT64: TritonDataType = 5;
pub const TYPE_INT8: TritonDataType = 6;
pub const TYPE_INT16: TritonDataType = 7;
pub const TYPE_INT32: TritonDataType = 8;
pub const TYPE_INT64: TritonDataType = 9;
pub const TYPE_FP16: TritonDataType = 10;
pub const TYPE_FP32: TritonDataType = 11;
pub const TYPE_FP64: TritonDataType = 12;
pub const TYPE_BYTES: TritonDataType = 13;
pub const TYPE_BF16: TritonDataType = 14;

/// `TRITONSERVER_MemoryType`.
pub type MemoryType = u32;
pub const MEMORY_CPU: MemoryType = 0;
pub const MEMORY_CPU_PINNED: MemoryType = 1;
pub const MEMORY_GPU: MemoryType = 2;

/// `TRITONSERVER_ParameterType`.
pub type ParameterType = u32;
pub const PARAMETER_STRING: ParameterType = 0;
pub const PARAMETER_INT: ParameterType = 1;
pub const PARAMETER_BOOL: ParameterType = 2;
pub const PARAMETER_DOUBLE: ParameterType = 3;
pub const PARAMETER_BYTES: ParameterType = 4;

/// `TRITONSERVER_InstanceGroupKind`.
pub type InstanceGroupKind = u32;
pub const INSTANCEGROUPKIND_AUTO: InstanceGroupKind = 0;
pub const INSTANCEGROUPKIND_CPU: InstanceGroupKind = 1;
pub const INSTANCEGROUPKIND_GPU: InstanceGroupKind = 2;
pub const INSTANCEGROUPKIND_MODEL: InstanceGroupKind = 3;

/// `TRITONSERVER_LogLevel`.
pub type LogLevel = u32;
pub const LOG_INFO: LogLevel = 0;
pub const LOG_WARN: LogLevel = 1;
pub const LOG_ERROR: LogLevel = 2;
pub const LOG_VERBOSE: LogLevel = 3;

/// `TRITONSERVER_Error_Code`.
pub type ErrorCode = u32;
pub const ERROR_UNKNOWN: ErrorCode = 0;
pub const ERROR_INTERNAL: ErrorCode = 1;
pub const ERROR_NOT_FOUND: ErrorCode = 2;
pub const ERROR_INVALID_ARG: ErrorCode = 3;
pub const ERROR_UNAVAILABLE: ErrorCode = 4;
pub const ERROR_UNSUPPORTED: ErrorCode = 5;
pub const ERROR_ALREADY_EXISTS: ErrorCode = 6;
pub const ERROR_CANCELLED: ErrorCode = 7;

/// `TRITONSERVER_RequestFlag`.
pub const REQUEST_FLAG_SEQUENCE_START: u32 = 1;
pub const REQUEST_FLAG_SEQUENCE_END: u32 = 2;
/// `TRITONSERVER_RequestReleaseFlag`.
pub const REQUEST_RELEASE_ALL: u32 = 1;
pub const REQUEST_RELEASE_RESCHEDULE: u32 = 2;
/// `TRITONSERVER_ResponseCompleteFlag`.
pub const RESPONSE_COMPLETE_FINAL: u32 = 1;

/// `TRITONBACKEND_ExecutionPolicy`.
pub type ExecutionPolicy = u32;
pub const EXECUTION_BLOCKING: ExecutionPolicy = 0;
pub const EXECUTION_DEVICE_BLOCKING: ExecutionPolicy = 1;

/// `TRITONBACKEND_ArtifactType`.
pub type ArtifactType = u32;
pub const ARTIFACT_FILESYSTEM: ArtifactType = 0;

pub fn datatype_to_c(dt: DataType) -> TritonDataType {
    match dt {
        DataType::Bool => TYPE_BOOL,
        DataType::Uint8 => TYPE_UINT8,
        DataType::Uint16 => TYPE_UINT16,
        DataType::Uint32 => TYPE_UINT32,
        DataType::Uint64 => TYPE_UINT64,
        DataType::Int8 => TYPE_INT8,
        DataType::Int16 => TYPE_INT16,
        DataType::Int32 => TYPE_INT32,
        DataType::Int64 => TYPE_INT64,
        DataType::Fp16 => TYPE_FP16,
        DataType::Fp32 => TYPE_FP32,
        DataType::Fp64 => TYPE_FP64,
        DataType::Bytes => TYPE_BYTES,
        DataType::Bf16 => TYPE_BF16,
    }
}

/// `None` for `TYPE_INVALID` and values outside the enum.
pub fn datatype_from_c(dt: TritonDataType) -> Option<DataType> {
    Some(match dt {
        TYPE_BOOL => DataType::Bool,
        TYPE_UINT8 => DataType::Uint8,
        TYPE_UINT16 => DataType::Uint16,
        TYPE_UINT32 => DataType::Uint32,
        TYPE_UINT64 => DataType::Uint64,
        TYPE_INT8 => DataType::Int8,
        TYPE_INT16 => DataType::Int16,
        TYPE_INT32 => DataType::Int32,
        TYPE_INT64 => DataType::Int64,
        TYPE_FP16 => DataType::Fp16,
        TYPE_FP32 => DataType::Fp32,
        TYPE_FP64 => DataType::Fp64,
        TYPE_BYTES => DataType::Bytes,
        TYPE_BF16 => DataType::Bf16,
        _ => return None,
    })
}

/// Our error kinds as Triton codes, and back (Triton has no separate
/// "cancelled" kind in ours: it maps onto UNAVAILABLE, as our cancelled
/// requests are answered).
pub fn error_kind_to_code(kind: ErrorKind) -> ErrorCode {
    match kind {
        ErrorKind::InvalidArgument => ERROR_INVALID_ARG,
        ErrorKind::NotFound => ERROR_NOT_FOUND,
        ErrorKind::Unavailable => ERROR_UNAVAILABLE,
        ErrorKind::Unsupported => ERROR_UNSUPPORTED,
        ErrorKind::Internal => ERROR_INTERNAL,
        ErrorKind::AlreadyExists => ERROR_ALREADY_EXISTS,
    }
}

pub fn error_code_to_kind(code: ErrorCode) -> ErrorKind {
    match code {
        ERROR_NOT_FOUND => ErrorKind::NotFound,
        ERROR_INVALID_ARG => ErrorKind::InvalidArgument,
        ERROR_UNAVAILABLE | ERROR_CANCELLED => ErrorKind::Unavailable,
        ERROR_UNSUPPORTED => ErrorKind::Unsupported,
        ERROR_ALREADY_EXISTS => ErrorKind::AlreadyExists,
        _ => ErrorKind::Internal,
    }
}

/// Static, NUL-terminated names for the `*String` functions.
pub fn datatype_name(dt: TritonDataType) -> &'static [u8] {
    match dt {
        TYPE_BOOL => b"BOOL\0",
        TYPE_UINT8 => b"UINT8\0",
        TYPE_UINT16 => b"UINT16\0",
        TYPE_UINT32 => b"UINT32\0",
        TYPE_UINT64 => b"UINT64\0",
        TYPE_INT8 => b"INT8\0",
        TYPE_INT16 => b"INT16\0",
        TYPE_INT32 => b"INT32\0",
        TYPE_INT64 => b"INT64\0",
        TYPE_FP16 => b"FP16\0",
        TYPE_FP32 => b"FP32\0",
        TYPE_FP64 => b"FP64\0",
        TYPE_BYTES => b"BYTES\0",
        TYPE_BF16 => b"BF16\0",
        _ => b"<invalid>\0",
    }
}

pub fn memory_type_name(memory_type: MemoryType) -> &'static str {
    match memory_type {
        MEMORY_CPU => "CPU",
        MEMORY_CPU_PINNED => "CPU_PINNED",
        MEMORY_GPU => "GPU",
        _ => "<invalid>",
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn datatypes_round_trip_with_triton_values() {
        for dt in DataType::ALL {
            let c = datatype_to_c(dt);
            assert_eq!(datatype_from_c(c), Some(dt));
            let name = datatype_name(c);
            assert_eq!(&name[..name.len() - 1], dt.as_str().as_bytes());
        }
        assert_eq!(datatype_to_c(DataType::Int32), 8);
        assert_eq!(datatype_to_c(DataType::Bf16), 14);
        assert_eq!(datatype_from_c(TYPE_INVALID), None);
        assert_eq!(datatype_from_c(99), None);
    }
}
