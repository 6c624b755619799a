//! A system shared memory region: `[offset, offset + byte_size)` of a
//! client's POSIX shm object, mapped into this process (`mapping`), and
//! its registration into the one registry (`registry`).

use std::sync::{
    atomic::{AtomicBool, Ordering},
    Arc,
};

use super::{
    fault,
    mapping::Mapping,
    registry::{Region, Registry, Usage},
};
use crate::{
    error_texts,
    types::{clip, InferError},
};

/// A registered system region.
#[derive(Debug)]
pub struct SystemRegion {
    pub name: String,
    pub key: String,
    /// Offset of the region inside the shm object.
    pub offset: u64,
    pub byte_size: u64,
    pub mapping: Mapping,
    /// Set by the first `check` that found the region broken, so the
    /// warning is logged once.
    reported: AtomicBool,
    pub(super) usage: Usage,
}

impl SystemRegion {
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

impl Registry {
    /// Registers `name` → `[offset, offset + byte_size)` of shm object `key`.
    pub fn register_system(
        &self,
        name: &str,
        key: &str,
        offset: u64,
        byte_size: u64,
    ) -> Result<(), InferError> {
        if key.is_empty() || key.bytes().all(|b| b == b'/') {
            return Err(error_texts::shm_invalid_key(name, key));
        }
        // Cheap refusal before any system call; `insert` decides, since
        // mapping happens outside the lock.
        if self.contains(name)? {
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
        // Refused here, the mapping is dropped (unmapped) on return.
        self.insert(Region::System(Arc::new(SystemRegion {
            name: name.to_string(),
            key: key.to_string(),
            offset,
            byte_size,
            mapping,
            reported: AtomicBool::new(false),
            usage: Usage::default(),
        })))?;
        tracing::debug!(
            name,
            key,
            offset,
            byte_size,
            "registered system shared memory"
        );
        Ok(())
    }
}
