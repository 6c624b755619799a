//! The sequence batcher (`sequence_batching`): stateful models whose
//! requests form sequences identified by a correlation id.
//!
//! Ownership on the sharded design: a model's sequence batcher lives in
//! its one `ModelScheduler`, on the model's owner shard, which is therefore
//! every sequence's home shard. Each request of a sequence is sent there
//! over the existing rings, whichever shard's connection received it, so
//! slot assignment, backlog and idle release are plain shard-local data
//! with no lock. Implicit state lives with the instance that owns the slot
//! (`tensors::SlotStates`, on the owner shard or that instance's compute
//! worker) and never crosses to another shard. Hashing correlation ids to
//! several home shards was rejected: it splits the slots into partitions,
//! so a new sequence could wait in one partition's backlog while another
//! has a free slot, which Triton never does.
//!
//! - `spec`: the configuration compiled and checked at load time.
//! - `correlation`: the id and START/END flags a request carries.
//! - `batcher`: slots, backlog, idle release, direct and oldest batches
//!   (decision logic only: no I/O, no clock).
//! - `tensors`: control and state tensors of an execution.

pub mod batcher;
pub mod correlation;
pub mod spec;
pub mod tensors;

pub use batcher::{Entry, Row, SeqDecision, SequenceBatcher};
pub use correlation::{sequence_flags, CorrelationId, SequenceFlags};
pub use spec::{fill_defaults, SequenceSpec, Strategy};
pub use tensors::{absorb_states, build_inputs, RowControl, SlotStates};
