//! Built-in models implemented in Rust, selected by `backend:` name. They
//! serve the example contracts (`../shared/models/CONTRACTS.md`) and give
//! a zero-cost model for measuring the server's own overhead (`identity`).

mod arithmetic;
mod identity;
mod io;
mod repeat;
mod responder;
mod sequence_accumulator;
mod sequence_io;
mod simple_sequence;
mod square;
mod string_arithmetic;
mod string_sequence;

use std::sync::Arc;

use super::Backend;

/// Backend names this module provides.
pub const NAMES: &[&str] = &[
    "simple",
    "simple_int8",
    "simple_string",
    "identity",
    "simple_sequence",
    "simple_dyna_sequence",
    "simple_string_dyna_sequence",
    "sequence_accumulator",
    repeat::NAME,
    square::NAME,
];

pub use responder::responses_sent;

/// The built-in backend called `name`, if there is one.
pub fn backend(name: &str) -> Option<Arc<dyn Backend>> {
    Some(match name {
        "simple" => Arc::new(arithmetic::SimpleBackend::int32()),
        "simple_int8" => Arc::new(arithmetic::SimpleBackend::int8()),
        "simple_string" => Arc::new(string_arithmetic::SimpleStringBackend),
        "identity" => Arc::new(identity::IdentityBackend),
        "simple_sequence" => Arc::new(simple_sequence::SimpleSequenceBackend::direct()),
        "simple_dyna_sequence" => Arc::new(simple_sequence::SimpleSequenceBackend::dyna()),
        string_sequence::NAME => Arc::new(string_sequence::StringDynaSequenceBackend),
        sequence_accumulator::NAME => Arc::new(sequence_accumulator::SequenceAccumulatorBackend),
        repeat::NAME => Arc::new(repeat::RepeatBackend),
        square::NAME => Arc::new(square::SquareBackend),
        _ => return None,
    })
}
