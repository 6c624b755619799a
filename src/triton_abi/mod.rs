//! The C ABI leaf that the backend API (`backend::capi`, `TRITONBACKEND_*`)
//! and the in-process server API (`frontend::inprocess`, `TRITONSERVER_*`)
//! share: errors, messages, parameters, Triton's enum values, and the
//! `ffi_entry!` guard every exported function runs under. Imports nothing
//! above `types`.

#![allow(non_camel_case_types, clippy::missing_safety_doc)]
#![deny(unsafe_op_in_unsafe_fn, clippy::undocumented_unsafe_blocks)]

// First, so that `ffi_entry!` is in scope in every module below.
#[macro_use]
pub mod ffi;

pub mod error;
pub mod message;
pub mod parameter;
pub mod types;
