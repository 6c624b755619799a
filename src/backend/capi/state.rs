//! `TRITONBACKEND_State`: implicit state of a sequence (the state's
//! output name). `StateUpdate` keeps the buffer as the slot's state for
//! the sequence's next request (the scheduler applies it once the
//! execution returns); the state object lives as long as its request.

use std::{
    ffi::c_void,
    sync::{Arc, Mutex},
};

use bytes::Bytes;

use super::memory;
use crate::{
    backend::StateUpdates,
    triton_abi::{
        buffer::TRITONSERVER_BufferAttributes,
        error::{self, non_null, ErrorPtr},
        types::{datatype_from_c, MemoryType, TritonDataType},
    },
    types::{element_count, DataType, Tensor},
};

/// Opaque to C.
pub struct TRITONBACKEND_State {
    name: String,
    datatype: DataType,
    shape: Vec<i64>,
    buffer: Vec<u8>,
    attributes: TRITONSERVER_BufferAttributes,
    updates: StateUpdates,
}

/// A request's implicit state: where `TRITONBACKEND_StateUpdate` puts
/// states (`None` without implicit state), the model's state names, and
/// the states created for the request, which live as long as it does
/// (`TRITONBACKEND_StateNew` is the request's, in `request`).
pub struct RequestStates {
    updates: Option<StateUpdates>,
    names: Arc<[String]>,
    /// Boxed: the backend holds their addresses while the list grows.
    #[allow(clippy::vec_box)]
    created: Mutex<Vec<Box<TRITONBACKEND_State>>>,
}

impl RequestStates {
    pub fn new(updates: Option<StateUpdates>, names: Arc<[String]>) -> Self {
        Self {
            updates,
            names,
            created: Mutex::new(Vec::new()),
        }
    }

    /// A new state `name` of the request, owned by it.
    ///
    /// # Safety
    /// `shape` is null or, by the header's contract, points to `dims_count`
    /// elements that stay unchanged for the call.
    pub(super) unsafe fn create(
        &self,
        name: &str,
        datatype: TritonDataType,
        shape: *const i64,
        dims_count: u32,
    ) -> Result<*mut TRITONBACKEND_State, ErrorPtr> {
        let Some(updates) = self.updates.clone() else {
            return Err(error::invalid_arg(
                "unable to add state: the model has no implicit state (sequence_batching state)",
            ));
        };
        if !self.names.iter().any(|s| s == name) {
            return Err(error::invalid_arg(format!(
                "state '{name}' is not a valid state name"
            )));
        }
        let datatype = datatype_from_c(datatype).ok_or_else(|| {
            error::invalid_arg(format!("state '{name}': invalid datatype {datatype}"))
        })?;
        let shape = if dims_count == 0 {
            Vec::new()
        } else {
            non_null(shape, "shape")?;
            // SAFETY: `shape` is non-null (checked above) and, per this function's contract,
            // points to `dims_count as usize` elements that stay unchanged for the call; they are
            // copied before it returns.
            unsafe { std::slice::from_raw_parts(shape, dims_count as usize) }.to_vec()
        };
        if element_count(&shape).is_none() {
            return Err(error::invalid_arg(format!(
                "state '{name}': invalid shape {shape:?}"
            )));
        }
        let mut boxed = Box::new(TRITONBACKEND_State {
            name: name.to_owned(),
            datatype,
            shape,
            buffer: Vec::new(),
            attributes: TRITONSERVER_BufferAttributes::host(0),
            updates,
        });
        // The state is boxed, so this address stays valid while the
        // request owns it.
        let state: *mut TRITONBACKEND_State = &mut *boxed;
        self.created
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .push(boxed);
        Ok(state)
    }
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_StateBuffer(
    s: *mut TRITONBACKEND_State,
    buffer: *mut *mut c_void,
    buffer_byte_size: u64,
    memory_type: *mut MemoryType,
    memory_type_id: *mut i64,
) -> ErrorPtr {
    ffi_entry!(non_null(s as "state", buffer) {
        // SAFETY: `s` is checked non-null above and is a state from `TRITONBACKEND_StateNew`,
        // owned (boxed) by its request, which is not released yet.
        let s = unsafe { &mut *s };
        // SAFETY: `buffer` is checked non-null above and valid for writing
        // (tritonbackend.h); `memory_type`/`memory_type_id` are null or valid
        // for writing, as `hand_out_host_buffer` requires.
        unsafe {
            memory::hand_out_host_buffer(
                &mut s.buffer,
                &mut s.attributes,
                buffer_byte_size,
                "state",
                buffer,
                memory_type,
                memory_type_id,
            )
        }
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_StateBufferAttributes(
    s: *mut TRITONBACKEND_State,
    attributes: *mut *mut TRITONSERVER_BufferAttributes,
) -> ErrorPtr {
    ffi_entry!(non_null(s as "state", attributes as "buffer_attributes") {
        // SAFETY: `attributes` is checked non-null above and, by the header's contract, valid for
        // writing one value; `s` is checked non-null above and is a state from
        // `TRITONBACKEND_StateNew`, owned (boxed) by its request, which is not released yet.
        unsafe { *attributes = &mut (*s).attributes };
        Ok(())
    })
}

#[no_mangle]
pub unsafe extern "C" fn TRITONBACKEND_StateUpdate(s: *mut TRITONBACKEND_State) -> ErrorPtr {
    ffi_entry!(non_null(s as "state") {
        // SAFETY: `s` is checked non-null above and is a state from `TRITONBACKEND_StateNew`,
        // owned (boxed) by its request, which is not released yet.
        let s = unsafe { &*s };
        s.updates.update(Tensor::new(
            s.name.clone(),
            s.datatype,
            s.shape.clone(),
            Bytes::copy_from_slice(&s.buffer),
        ));
        Ok(())
    })
}
