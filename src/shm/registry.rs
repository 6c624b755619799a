//! The system shared memory registry: region name → mapped region.
//!
//! One per process (Triton has one per server; in-process test servers
//! share it). A `std::sync::RwLock` guards the map: registration is rare,
//! and only requests that name a region take the read lock, for one hash
//! lookup and an `Arc` clone. Requests without shared memory never touch
//! it, so the lock-free request path stays lock-free.

use std::{
    collections::BTreeMap,
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, OnceLock, RwLock,
    },
};

use super::{fault, mapping::Mapping};
use crate::{
    error_texts,
    types::{clip, InferError},
};

/// A registered region.
#[derive(Debug)]
pub struct Region {
    pub name: String,
    pub key: String,
    /// Offset of the region inside the shm object.
    pub offset: u64,
    pub byte_size: u64,
    pub mapping: Mapping,
    /// Set by the first `check` that found the region broken, so the
    /// warning is logged once.
    reported: AtomicBool,
}

impl Region {
    /// Fails, naming the region, when the client shrank its shm object
    /// below the region's end: either an access faulted on the missing
    /// pages (`fault` replaced them with zeros) or the object's size says
    /// so (one `fstat`). Once broken, a region stays broken until it is
    /// unregistered: its pages are no longer the client's.
    pub fn check(&self) -> Result<(), InferError> {
        if self.mapping.is_broken() {
            return Err(self.broken(None));
        }
        let end = self.end();
        match self.mapping.object_size() {
            Ok(size) if size >= end => Ok(()),
            Ok(size) => {
                self.mapping.mark_broken();
                Err(self.broken(Some(size)))
            }
            Err(e) => Err(InferError::internal(format!(
                "cannot check shared memory region '{}': fstat of its shm object failed: {e}",
                clip(&self.name)
            ))),
        }
    }

    /// `check` without the system call: fails only when the region is
    /// already known to be broken. For before the model runs, where a
    /// region truncated meanwhile is caught by the `check` after.
    pub fn check_known(&self) -> Result<(), InferError> {
        if self.mapping.is_broken() {
            return Err(self.broken(None));
        }
        Ok(())
    }

    fn end(&self) -> u64 {
        self.offset.saturating_add(self.byte_size)
    }

    /// The error for a broken region; the first one logs a warning.
    fn broken(&self, object_size: Option<u64>) -> InferError {
        if !self.reported.swap(true, Ordering::Relaxed) {
            tracing::warn!(
                region = %self.name,
                key = %self.key,
                region_end = self.end(),
                object_size = ?object_size,
                "a client truncated the shm object of a registered region; \
                 requests naming it fail until it is unregistered"
            );
        }
        error_texts::shm_truncated(&self.name, &self.key, self.end())
    }
}

#[derive(Debug, Default)]
pub struct Registry {
    regions: RwLock<BTreeMap<String, Arc<Region>>>,
    /// `regions.len()`, readable without the lock: requests that use no
    /// shared memory skip the lookup in `containing`.
    count: AtomicUsize,
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
        // Before the first mapping exists: a client may truncate any
        // object we map, and without the handler that kills the server.
        fault::install().map_err(|e| {
            InferError::internal(format!(
                "cannot register shared memory region '{}': installing the SIGBUS handler failed: {e}",
                clip(name)
            ))
        })?;
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
                reported: AtomicBool::new(false),
            }),
        );
        self.count.store(regions.len(), Ordering::Release);
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
        let mut regions = self.regions.write().map_err(|_| poisoned())?;
        regions.remove(name);
        self.count.store(regions.len(), Ordering::Release);
        Ok(())
    }

    pub fn unregister_all(&self) -> Result<(), InferError> {
        let mut regions = self.regions.write().map_err(|_| poisoned())?;
        regions.clear();
        self.count.store(0, Ordering::Release);
        Ok(())
    }

    /// The registered region whose mapping holds `ptr`, if any (the region
    /// an input's bytes were read from).
    pub fn containing(&self, ptr: *const u8) -> Result<Option<Arc<Region>>, InferError> {
        if self.count.load(Ordering::Acquire) == 0 {
            return Ok(None);
        }
        Ok(self
            .regions
            .read()
            .map_err(|_| poisoned())?
            .values()
            .find(|r| r.mapping.contains(ptr))
            .cloned())
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
