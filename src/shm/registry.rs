//! The system shared memory registry: region name → mapped region.
//!
//! One per process (Triton has one per server; in-process test servers
//! share it). A `std::sync::RwLock` guards the map: registration is rare,
//! and only requests that name a region take the read lock, for one hash
//! lookup and an `Arc` clone. Requests without shared memory never touch
//! it, so the lock-free request path stays lock-free.

use std::{
    collections::BTreeMap,
    sync::{Arc, OnceLock, RwLock},
};

use super::mapping::Mapping;
use crate::{error_texts, types::InferError};

/// A registered region.
#[derive(Debug)]
pub struct Region {
    pub name: String,
    pub key: String,
    /// Offset of the region inside the shm object.
    pub offset: u64,
    pub byte_size: u64,
    pub mapping: Mapping,
}

#[derive(Debug, Default)]
pub struct Registry {
    regions: RwLock<BTreeMap<String, Arc<Region>>>,
}

/// The process's registry.
pub fn global() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

fn poisoned() -> InferError {
    InferError::internal("the shared memory registry is unusable after a panic")
}

impl Registry {
    /// Registers `name` → `[offset, offset + byte_size)` of shm object `key`.
    pub fn register(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<(), InferError> {
        if key.is_empty() || key.bytes().all(|b| b == b'/') {
            return Err(error_texts::shm_invalid_key(name, key));
        }
        // Cheap refusal before any system call; checked again under the
        // write lock, since mapping happens outside it.
        // Triton keeps system and CUDA regions in one map: a name is
        // taken by either kind.
        if self
            .regions
            .read()
            .map_err(|_| poisoned())?
            .contains_key(name)
            || super::cuda::global().contains(name)?
        {
            return Err(error_texts::shm_already_registered(name));
        }
        let mapping = Mapping::open(name, key, offset, byte_size)?;
        let mut regions = self.regions.write().map_err(|_| poisoned())?;
        if regions.contains_key(name) {
            return Err(error_texts::shm_already_registered(name));
        }
        regions.insert(
            name.to_string(),
            Arc::new(Region {
                name: name.to_string(),
                key: key.to_string(),
                offset,
                byte_size,
                mapping,
            }),
        );
        tracing::debug!(
            name,
            key,
            offset,
            byte_size,
            "registered system shared memory"
        );
        Ok(())
    }

    /// Forgets `name` (no error when it is not registered, as in Triton).
    /// Requests holding the region keep it mapped until they finish.
    pub fn unregister(&self, name: &str) -> Result<(), InferError> {
        self.regions.write().map_err(|_| poisoned())?.remove(name);
        Ok(())
    }

    pub fn unregister_all(&self) -> Result<(), InferError> {
        self.regions.write().map_err(|_| poisoned())?.clear();
        Ok(())
    }

    /// `name`'s region, for a request to read or write.
    pub fn get(&self, name: &str) -> Result<Arc<Region>, InferError> {
        self.regions
            .read()
            .map_err(|_| poisoned())?
            .get(name)
            .cloned()
            .ok_or_else(|| error_texts::shm_unknown_region(name))
    }

    /// `name`'s region, if registered.
    pub fn find(&self, name: &str) -> Result<Option<Arc<Region>>, InferError> {
        Ok(self
            .regions
            .read()
            .map_err(|_| poisoned())?
            .get(name)
            .cloned())
    }

    /// Every region (empty `name`) or the one named.
    pub fn status(&self, name: &str) -> Result<Vec<Arc<Region>>, InferError> {
        let regions = self.regions.read().map_err(|_| poisoned())?;
        if name.is_empty() {
            return Ok(regions.values().cloned().collect());
        }
        if let Some(r) = regions.get(name) {
            return Ok(vec![Arc::clone(r)]);
        }
        if super::cuda::global().contains(name)? {
            return Err(error_texts::shm_wrong_kind(name, "CUDA", "system"));
        }
        Err(error_texts::shm_unknown_system_region(name))
    }
}
