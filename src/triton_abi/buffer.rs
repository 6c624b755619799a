//! `TRITONSERVER_BufferAttributes`: where a buffer lives and how large it
//! is, shared by backend inputs, outputs and states and by the in-process
//! API's response allocator.

use std::ffi::c_void;

use super::{
    error::{non_null, ErrorPtr},
    types::{MemoryType, MEMORY_CPU},
};

/// Opaque to C.
#[derive(Debug, Clone, Default)]
pub struct TRITONSERVER_BufferAttributes {
    pub memory_type: MemoryType,
    pub memory_type_id: i64,
    pub byte_size: usize,
    pub cuda_ipc_handle: usize,
}

impl TRITONSERVER_BufferAttributes {
    pub fn host(byte_size: usize) -> Self {
        Self {
            memory_type: MEMORY_CPU,
            byte_size,
            ..Self::default()
        }
    }
}

macro_rules! attr_get {
    ($fn_name:ident, $field:ident, $ty:ty, $conv:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $fn_name(
            attributes: *mut TRITONSERVER_BufferAttributes,
            out: *mut $ty,
        ) -> ErrorPtr {
            ffi_entry!(non_null(attributes as "buffer_attributes") {
                non_null(out, stringify!($field))?;
                let conv: fn(&TRITONSERVER_BufferAttributes) -> $ty = $conv;
                // SAFETY: `out` is checked non-null above and, by the header's contract, valid for
                // writing one value; `attributes` is checked non-null above and is a buffer-
                // attributes object (from `TRITONSERVER_BufferAttributesNew`, or one that a live
                // input, output or state owns) not deleted yet.
                unsafe { *out = conv(&*attributes) };
                Ok(())
            })
        }
    };
}

macro_rules! attr_set {
    ($fn_name:ident, $field:ident, $ty:ty, $conv:expr) => {
        #[no_mangle]
        pub unsafe extern "C" fn $fn_name(
            attributes: *mut TRITONSERVER_BufferAttributes,
            value: $ty,
        ) -> ErrorPtr {
            ffi_entry!(non_null(attributes as "buffer_attributes") {
                let conv: fn(&mut TRITONSERVER_BufferAttributes, $ty) = $conv;
                // SAFETY: `attributes` is checked non-null above and is a buffer-attributes object
                // (from `TRITONSERVER_BufferAttributesNew`, or one that a live input, output or
                // state owns) not deleted yet.
                unsafe { conv(&mut *attributes, value) };
                Ok(())
            })
        }
    };
}

attr_get!(
    TRITONSERVER_BufferAttributesMemoryType,
    memory_type,
    MemoryType,
    |a| a.memory_type
);
attr_get!(
    TRITONSERVER_BufferAttributesMemoryTypeId,
    memory_type_id,
    i64,
    |a| a.memory_type_id
);
attr_get!(
    TRITONSERVER_BufferAttributesByteSize,
    byte_size,
    usize,
    |a| a.byte_size
);
attr_get!(
    TRITONSERVER_BufferAttributesCudaIpcHandle,
    cuda_ipc_handle,
    *mut c_void,
    |a| { a.cuda_ipc_handle as *mut c_void }
);
attr_set!(
    TRITONSERVER_BufferAttributesSetMemoryType,
    memory_type,
    MemoryType,
    |a, v| { a.memory_type = v }
);
attr_set!(
    TRITONSERVER_BufferAttributesSetMemoryTypeId,
    memory_type_id,
    i64,
    |a, v| { a.memory_type_id = v }
);
attr_set!(
    TRITONSERVER_BufferAttributesSetByteSize,
    byte_size,
    usize,
    |a, v| a.byte_size = v
);
attr_set!(
    TRITONSERVER_BufferAttributesSetCudaIpcHandle,
    cuda_ipc_handle,
    *mut c_void,
    |a, v| { a.cuda_ipc_handle = v as usize }
);

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_BufferAttributesNew(
    attributes: *mut *mut TRITONSERVER_BufferAttributes,
) -> ErrorPtr {
    ffi_entry!(non_null(attributes as "buffer_attributes") {
        // SAFETY: `attributes` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *attributes = Box::into_raw(Box::default()) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_BufferAttributesDelete(
    attributes: *mut TRITONSERVER_BufferAttributes,
) -> ErrorPtr {
    ffi_entry!({
        if !attributes.is_null() {
            // SAFETY: `attributes` is non-null (checked) and came from `Box::into_raw` in the
            // matching New function; the header makes this Delete its one release, so nothing uses
            // it afterwards.
            drop(unsafe { Box::from_raw(attributes) });
        }
        std::ptr::null_mut()
    })
}
