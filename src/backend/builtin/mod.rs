//! Built-in models implemented in Rust, selected by `backend:` name. They
//! serve the example contracts (`../shared/models/CONTRACTS.md`) and give
//! a zero-cost model for measuring the server's own overhead (`identity`).

mod arithmetic;
mod identity;
mod io;
mod string_arithmetic;

use std::sync::Arc;

use super::Backend;

/// Backend names this module provides.
pub const NAMES: &[&str] = &["simple", "simple_int8", "simple_string", "identity"];

/// The built-in backend called `name`, if there is one.
pub fn backend(name: &str) -> Option<Arc<dyn Backend>> {
    Some(match name {
        "simple" => Arc::new(arithmetic::SimpleBackend::int32()),
        "simple_int8" => Arc::new(arithmetic::SimpleBackend::int8()),
        "simple_string" => Arc::new(string_arithmetic::SimpleStringBackend),
        "identity" => Arc::new(identity::IdentityBackend),
        _ => return None,
    })
}
