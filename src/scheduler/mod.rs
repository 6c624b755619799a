//! Schedulers: how requests reach a model instance and how its results go
//! back. `submit` is the entry point every protocol calls after decoding.
//!
//! Only the default scheduler exists so far (one request per execution per
//! instance, in arrival order); the dynamic, sequence and ensemble
//! schedulers are refused at load time by `config::check_supported`.

mod batch;
mod default;
mod dispatch;
pub mod dynamic_batcher;
mod job;
mod output;

pub use default::InstanceSlot;
pub use dispatch::infer;
pub use job::{Job, Responder};
