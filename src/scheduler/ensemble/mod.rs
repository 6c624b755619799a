//! The ensemble scheduler: `platform: "ensemble"` models, whose
//! `ensemble_scheduling` steps form a DAG of composing models.
//!
//! - `graph`: the ensemble's own data flow checked (Triton's
//!   `ValidateEnsembleSchedulingConfig`);
//! - `plan`: compiled at load against the loaded composing models (their
//!   versions, batch sizes, datatypes and shapes) into slot indices;
//! - loading (`repository::ensemble`, control plane): ensembles load after
//!   every other model, in dependency order, each compiled into a plan here;
//! - `execute`: a request runs on the shard that received it; each step is
//!   an ordinary request to its composing model's scheduler (so it batches
//!   with direct traffic and counts in that model's statistics), started
//!   as soon as its inputs exist.
//!
//! Readiness: an ensemble is loaded (READY) only when every composing
//! model is ready at load time. When the repository API unloads a
//! composing model, `repository::manager` marks its ensembles UNAVAILABLE
//! ("composing model 'x' is not available") and loads them again once the
//! model is back.

mod execute;
pub mod graph;
pub mod plan;

pub use execute::start;
pub use plan::EnsemblePlan;
