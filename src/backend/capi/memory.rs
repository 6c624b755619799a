//! `TRITONBACKEND_MemoryManager`, and the host buffers handed to
//! backends for outputs and states. Memory is host memory only: CPU, and CPU_PINNED served from plain
//! host memory (no GPU, so nothing is pinned for DMA); GPU requests are
//! an UNSUPPORTED error.

use std::{
    alloc::{alloc, dealloc, Layout},
    collections::HashMap,
    ffi::c_void,
    sync::Mutex,
};

use crate::triton_abi::{
    buffer::TRITONSERVER_BufferAttributes,
    error::{self, ErrorPtr},
    types::{memory_type_name, MemoryType, MEMORY_CPU, MEMORY_CPU_PINNED},
};

/// Alignment of every buffer handed out (what `malloc` gives on x86-64
/// Linux, enough for any element type).
const ALIGN: usize = 64;

/// Opaque to C. Allocations are remembered by address so `Free` can
/// give back the layout and refuse an unknown pointer.
#[derive(Default)]
pub struct TRITONBACKEND_MemoryManager {
    live: Mutex<HashMap<usize, Layout>>,
}

/// Checks that `memory_type` is host memory.
pub fn host_memory(memory_type: MemoryType) -> Result<(), ErrorPtr> {
    match memory_type {
        MEMORY_CPU | MEMORY_CPU_PINNED => Ok(()),
        other => Err(error::unsupported(format!(
            "memory type {} is not available: this server has host memory only",
            memory_type_name(other)
        ))),
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_MemoryManagerAllocate(
    manager: *mut TRITONBACKEND_MemoryManager,
    buffer: *mut *mut c_void,
    memory_type: MemoryType,
    _memory_type_id: i64,
    byte_size: u64,
) -> ErrorPtr {
    ffi_entry!(non_null(manager, buffer) {
        host_memory(memory_type)?;
        let layout = Layout::from_size_align(byte_size.max(1) as usize, ALIGN)
            .map_err(|_| error::invalid_arg(format!("cannot allocate {byte_size} bytes")))?;
        // SAFETY: the layout has a non-zero size.
        let p = unsafe { alloc(layout) };
        if p.is_null() {
            return Err(error::internal(format!(
                "out of memory allocating {byte_size} bytes"
            )));
        }
        // SAFETY: `manager` is checked non-null above and is the backend's memory manager from
        // `TRITONBACKEND_BackendMemoryManager`, which lives as long as its backend.
        let manager = unsafe { &*manager };
        manager
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(p as usize, layout);
        // SAFETY: `buffer` is checked non-null above and, by the header's contract, valid for
        // writing one value.
        unsafe { *buffer = p.cast() };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_MemoryManagerFree(
    manager: *mut TRITONBACKEND_MemoryManager,
    buffer: *mut c_void,
    memory_type: MemoryType,
    _memory_type_id: i64,
) -> ErrorPtr {
    ffi_entry!(non_null(manager) {
        host_memory(memory_type)?;
        if buffer.is_null() {
            return Ok(());
        }
        // SAFETY: `manager` is checked non-null above and is the backend's memory manager from
        // `TRITONBACKEND_BackendMemoryManager`, which lives as long as its backend.
        let manager = unsafe { &*manager };
        let layout = manager
            .live
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .remove(&(buffer as usize))
            .ok_or_else(|| error::invalid_arg("buffer was not allocated by this memory manager"))?;
        // SAFETY: allocated above with this layout and not freed since.
        unsafe { dealloc(buffer.cast(), layout) };
        Ok(())
    })
}

/// A zeroed host buffer of `byte_size` bytes that a backend fills (an
/// output's or a state's), stored in `store` with its `attributes`, and
/// where it is written to the backend's out-parameters (the optional
/// memory type and id too). `what` names the buffer in the error.
///
/// # Safety
/// `buffer` must be valid for a write; `memory_type` and `memory_type_id`
/// null or valid for a write.
pub(super) unsafe fn hand_out_host_buffer(
    store: &mut Vec<u8>,
    attributes: &mut TRITONSERVER_BufferAttributes,
    byte_size: u64,
    what: &str,
    buffer: *mut *mut c_void,
    memory_type: *mut MemoryType,
    memory_type_id: *mut i64,
) -> Result<(), ErrorPtr> {
    let size = usize::try_from(byte_size)
        .map_err(|_| error::invalid_arg(format!("{what} buffer too large")))?;
    // Fallible: `vec![0; size]` panics past `isize::MAX` bytes and aborts
    // the process when the allocator fails, for a size the backend chose.
    let mut zeroed = Vec::new();
    zeroed.try_reserve_exact(size).map_err(|_| {
        error::internal(format!(
            "out of memory allocating {byte_size} bytes for the {what} buffer"
        ))
    })?;
    zeroed.resize(size, 0);
    *store = zeroed;
    *attributes = TRITONSERVER_BufferAttributes::host(size);
    // SAFETY: per this function's contract `buffer` is valid for a write and
    // the other two are null (skipped) or valid for a write.
    unsafe {
        *buffer = store.as_mut_ptr().cast();
        if !memory_type.is_null() {
            *memory_type = MEMORY_CPU;
        }
        if !memory_type_id.is_null() {
            *memory_type_id = 0;
        }
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::triton_abi::{
        error::{TRITONSERVER_ErrorCode, TRITONSERVER_ErrorDelete},
        types::{ERROR_UNSUPPORTED, MEMORY_GPU},
    };

    #[test]
    fn host_memory_round_trip_and_gpu_refused() {
        let mut m = TRITONBACKEND_MemoryManager::default();
        let mut p = std::ptr::null_mut();
        // SAFETY: test: the manager and out-pointer are locals; `p` is freed once.
        unsafe {
            assert!(
                TRITONBACKEND_MemoryManagerAllocate(&mut m, &mut p, MEMORY_CPU_PINNED, 0, 100)
                    .is_null()
            );
            assert!(!p.is_null());
            assert!(TRITONBACKEND_MemoryManagerFree(&mut m, p, MEMORY_CPU_PINNED, 0).is_null());
            let e = TRITONBACKEND_MemoryManagerFree(&mut m, p, MEMORY_CPU, 0);
            assert!(!e.is_null());
            TRITONSERVER_ErrorDelete(e);
            let e = TRITONBACKEND_MemoryManagerAllocate(&mut m, &mut p, MEMORY_GPU, 0, 8);
            assert_eq!(TRITONSERVER_ErrorCode(e), ERROR_UNSUPPORTED);
            TRITONSERVER_ErrorDelete(e);
        }
    }
}
