//! `TRITONSERVER_ResponseAllocator`: the caller's functions that allocate
//! (and later release) the memory each output of an in-process response is
//! written to. Our outputs are computed before the response exists, so
//! building a response means: `start_fn` once, then `alloc_fn` per output
//! and a copy into the buffer it returned.

use std::{
    ffi::{c_char, c_void},
    ptr,
};

use crate::triton_abi::{error::ErrorPtr, types::MemoryType};

pub type AllocFn = unsafe extern "C" fn(
    allocator: *mut TRITONSERVER_ResponseAllocator,
    tensor_name: *const c_char,
    byte_size: usize,
    memory_type: MemoryType,
    memory_type_id: i64,
    userp: *mut c_void,
    buffer: *mut *mut c_void,
    buffer_userp: *mut *mut c_void,
    actual_memory_type: *mut MemoryType,
    actual_memory_type_id: *mut i64,
) -> ErrorPtr;

pub type ReleaseFn = unsafe extern "C" fn(
    allocator: *mut TRITONSERVER_ResponseAllocator,
    buffer: *mut c_void,
    buffer_userp: *mut c_void,
    byte_size: usize,
    memory_type: MemoryType,
    memory_type_id: i64,
) -> ErrorPtr;

pub type StartFn = unsafe extern "C" fn(
    allocator: *mut TRITONSERVER_ResponseAllocator,
    userp: *mut c_void,
) -> ErrorPtr;

pub type QueryFn = unsafe extern "C" fn(
    allocator: *mut TRITONSERVER_ResponseAllocator,
    userp: *mut c_void,
    tensor_name: *const c_char,
    byte_size: *mut usize,
    memory_type: *mut MemoryType,
    memory_type_id: *mut i64,
) -> ErrorPtr;

pub type BufferAttributesFn = unsafe extern "C" fn(
    allocator: *mut TRITONSERVER_ResponseAllocator,
    tensor_name: *const c_char,
    buffer_attributes: *mut c_void,
    userp: *mut c_void,
    buffer_userp: *mut c_void,
) -> ErrorPtr;

/// Opaque to C. Immutable once a request uses it (the API's contract:
/// the allocator outlives every request that names it).
pub struct TRITONSERVER_ResponseAllocator {
    pub alloc_fn: AllocFn,
    pub release_fn: ReleaseFn,
    pub start_fn: Option<StartFn>,
    /// Kept for completeness: we always offer CPU memory, and the only
    /// question the query answers (preferred memory) has one answer here.
    pub query_fn: Option<QueryFn>,
    /// Stored but never called: our buffers carry no attributes beyond
    /// CPU memory (no CUDA IPC handles).
    pub buffer_attributes_fn: Option<BufferAttributesFn>,
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ResponseAllocatorNew(
    allocator: *mut *mut TRITONSERVER_ResponseAllocator,
    alloc_fn: Option<AllocFn>,
    release_fn: Option<ReleaseFn>,
    start_fn: Option<StartFn>,
) -> ErrorPtr {
    ffi_entry!(non_null(allocator) {
        let (Some(alloc_fn), Some(release_fn)) = (alloc_fn, release_fn) else {
            return Err(crate::triton_abi::error::invalid_arg(
                "a response allocator needs an alloc function and a release function",
            ));
        };
        let boxed = Box::new(TRITONSERVER_ResponseAllocator {
            alloc_fn,
            release_fn,
            start_fn,
            query_fn: None,
            buffer_attributes_fn: None,
        });
        // SAFETY: `allocator` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *allocator = Box::into_raw(boxed) };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ResponseAllocatorSetQueryFunction(
    allocator: *mut TRITONSERVER_ResponseAllocator,
    query_fn: Option<QueryFn>,
) -> ErrorPtr {
    ffi_entry!(non_null(allocator) {
        // SAFETY: `allocator` is checked non-null above and is an allocator from
        // `TRITONSERVER_ResponseAllocatorNew`, not deleted yet.
        unsafe { (*allocator).query_fn = query_fn };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ResponseAllocatorSetBufferAttributesFunction(
    allocator: *mut TRITONSERVER_ResponseAllocator,
    buffer_attributes_fn: Option<BufferAttributesFn>,
) -> ErrorPtr {
    ffi_entry!(non_null(allocator) {
        // SAFETY: `allocator` is checked non-null above and is an allocator from
        // `TRITONSERVER_ResponseAllocatorNew`, not deleted yet.
        unsafe { (*allocator).buffer_attributes_fn = buffer_attributes_fn };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONSERVER_ResponseAllocatorDelete(
    allocator: *mut TRITONSERVER_ResponseAllocator,
) -> ErrorPtr {
    ffi_entry!({
        if !allocator.is_null() {
            // SAFETY: `allocator` is non-null (checked) and came from `Box::into_raw` in the
            // matching New function; the header makes this Delete its one release, so nothing uses
            // it afterwards.
            drop(unsafe { Box::from_raw(allocator) });
        }
        ptr::null_mut()
    })
}
