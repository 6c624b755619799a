//! The model repository: finding models and their versions on disk
//! (`scan`), and turning each into loaded, placed instances (`load`);
//! ensembles are wired last, over the loaded composing models (`ensemble`).
//! Runs on the control plane, never on a shard.

mod children;
pub mod ensemble;
mod load;
pub mod manager;
mod scan;
pub mod uploads;
mod versions;
mod warmup;

pub use load::{
    config_path, load_model_with, load_repository, send_control, LoadOptions, Placement,
};
pub(crate) use load::{read_config, version_entry};
pub(crate) use scan::{broken_link, version_folders};
pub use scan::{
    is_namespaced_key, key_name, namespaced_key, scan_repositories, ModelDir, DUPLICATE,
};
pub use versions::select_versions;
