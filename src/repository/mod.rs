//! The model repository: finding models and their versions on disk
//! (`scan`), and turning each into loaded, placed instances (`load`).
//! Runs on the control plane, never on a shard.

mod children;
mod load;
pub mod manager;
mod scan;
mod versions;

pub use load::{load_model_with, load_repository, send_control, LoadOptions, Placement};
pub(crate) use load::{read_config, version_entry};
pub(crate) use scan::version_folders;
pub use scan::{scan_repositories, ModelDir};
pub use versions::select_versions;
