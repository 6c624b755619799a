//! One POSIX shared memory object mapped read/write into this process.
//!
//! The mapping lives as long as its `Arc<Mapping>`: the registry holds one,
//! and every tensor read from the region or request writing into it holds
//! another, so unregistering a region while a request uses it only drops
//! the registry's reference; `munmap` runs when the last user is done.
//!
//! Every mapping is protected against the client shrinking the object
//! under it (`fault`), and keeps its descriptor open so that `object_size`
//! can tell a shrink that no access has faulted on yet (within the last
//! page, past the new end, reads give zeros and writes are lost rather than
//! fault).

use std::{
    ffi::CString,
    io,
    os::fd::{AsRawFd, FromRawFd, OwnedFd},
    ptr::NonNull,
};

use super::fault;
use crate::{error_texts, types::InferError};

/// `mmap` of `[offset, offset + len)` of a shm object.
#[derive(Debug)]
pub struct Mapping {
    /// Start of the whole mapping (page-aligned, below the region start).
    base: NonNull<u8>,
    /// Bytes mapped from `base` (what `munmap` needs).
    mapped_len: usize,
    /// Distance from `base` to the region's first byte.
    lead: usize,
    /// The region's length.
    len: usize,
    /// The shm object, for `object_size`.
    fd: OwnedFd,
    /// The fault table's slot for `[base, base + mapped_len)`; `None` only
    /// while `drop` runs.
    protected: Option<fault::Protected>,
}

// SAFETY: the mapping is plain shared memory with no thread affinity; all
// access goes through raw-pointer copies (`read`/`write`) or `as_slice`,
// whose caveats are documented there.
unsafe impl Send for Mapping {}
// SAFETY: as for `Send`; shared access is the same raw-pointer copies.
unsafe impl Sync for Mapping {}

impl Mapping {
    /// Opens `key` (a `shm_open` name, as the client created it) and maps
    /// `byte_size` bytes at `offset`. Errors are Triton's texts.
    pub fn open(name: &str, key: &str, offset: u64, byte_size: u64) -> Result<Self, InferError> {
        let c_key = CString::new(key).map_err(|_| error_texts::shm_cannot_open(key))?;
        // SAFETY: c_key is a valid NUL-terminated string.
        let fd = unsafe { libc::shm_open(c_key.as_ptr(), libc::O_RDWR, 0o600) };
        if fd < 0 {
            tracing::debug!(key, error = %io::Error::last_os_error(), "shm_open failed");
            return Err(error_texts::shm_cannot_open(key));
        }
        // SAFETY: fd was just opened and nothing else owns it: the
        // OwnedFd closes it exactly once, on every path.
        let fd = unsafe { OwnedFd::from_raw_fd(fd) };
        Self::map_fd(name, fd, offset, byte_size)
    }

    fn map_fd(name: &str, fd: OwnedFd, offset: u64, byte_size: u64) -> Result<Self, InferError> {
        // SAFETY: an all-zero `stat` is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: fd is open; st is a valid out-pointer.
        if unsafe { libc::fstat(fd.as_raw_fd(), &mut st) } != 0 || st.st_size < 0 {
            return Err(InferError::internal(format!(
                "Invalid shared memory region: '{}'",
                crate::types::clip(name)
            )));
        }
        let object_size = st.st_size as u64;
        let end = offset.checked_add(byte_size);
        if end.is_none_or(|e| e > object_size) {
            return Err(error_texts::shm_register_invalid_args(name));
        }
        let len =
            usize::try_from(byte_size).map_err(|_| error_texts::shm_register_invalid_args(name))?;
        if len == 0 {
            // mmap refuses zero lengths; Triton maps nothing either.
            return Err(error_texts::shm_register_invalid_args(name));
        }
        // mmap wants a page-aligned offset: map from the page below and
        // remember the lead, so clients may register any offset.
        // SAFETY: sysconf has no preconditions.
        let page = unsafe { libc::sysconf(libc::_SC_PAGESIZE) }.max(4096) as u64;
        let aligned = offset - offset % page;
        let lead = (offset - aligned) as usize;
        let mapped_len = lead
            .checked_add(len)
            .ok_or_else(|| error_texts::shm_register_invalid_args(name))?;
        let file_offset = libc::off_t::try_from(aligned)
            .map_err(|_| error_texts::shm_register_invalid_args(name))?;
        // SAFETY: fd is open, the range lies within the object (checked
        // above), and the result is checked against MAP_FAILED.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                mapped_len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_SHARED,
                fd.as_raw_fd(),
                file_offset,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(InferError::invalid(format!(
                "failed to register shared memory region '{}': unable to process address space{}",
                crate::types::clip(name),
                io::Error::last_os_error()
            )));
        }
        let Some(base) = NonNull::new(ptr.cast::<u8>()) else {
            return Err(InferError::internal("mmap returned a null mapping"));
        };
        // Published before anyone can touch the mapping (see `fault`).
        let Some(protected) = fault::protect(ptr as usize, mapped_len) else {
            // SAFETY: ptr/mapped_len are what mmap just returned; nothing
            // else has seen the mapping.
            unsafe { libc::munmap(ptr, mapped_len) };
            return Err(InferError::unavailable(format!(
                "failed to register shared memory region '{}': {} regions are mapped, \
                 the most this server protects; unregister some first",
                crate::types::clip(name),
                fault::CAPACITY
            )));
        };
        Ok(Self {
            base,
            mapped_len,
            lead,
            len,
            fd,
            protected: Some(protected),
        })
    }

    /// True once an access faulted past the shm object's end (the
    /// mapping now holds private zero pages) or `mark_broken` ran.
    pub fn is_broken(&self) -> bool {
        self.protected
            .as_ref()
            .is_some_and(fault::Protected::is_broken)
    }

    /// Records that the object shrank below the mapping.
    pub fn mark_broken(&self) {
        if let Some(p) = &self.protected {
            p.mark_broken();
        }
    }

    /// True when `ptr` points into the region's bytes.
    pub fn contains(&self, ptr: *const u8) -> bool {
        let start = self.base.as_ptr() as usize + self.lead;
        (ptr as usize).wrapping_sub(start) < self.len
    }

    /// The shm object's current size in bytes.
    pub fn object_size(&self) -> io::Result<u64> {
        // SAFETY: an all-zero `stat` is a valid out-parameter.
        let mut st: libc::stat = unsafe { std::mem::zeroed() };
        // SAFETY: self.fd is open for the mapping's lifetime; st is a
        // valid out-pointer.
        if unsafe { libc::fstat(self.fd.as_raw_fd(), &mut st) } != 0 {
            return Err(io::Error::last_os_error());
        }
        Ok(u64::try_from(st.st_size).unwrap_or(0))
    }

    pub fn len(&self) -> usize {
        self.len
    }

    pub fn is_empty(&self) -> bool {
        self.len == 0
    }

    /// The region's bytes `[offset, offset + len)`; `None` when out of range.
    ///
    /// The client process may write the region while we read it, exactly
    /// as with Triton: the contract of the shared-memory extension is that
    /// a client leaves an input region alone until its response arrives.
    /// Bytes read while a client breaks that are unspecified, never out of
    /// bounds.
    pub fn slice(&self, offset: usize, len: usize) -> Option<&[u8]> {
        let end = offset.checked_add(len)?;
        if end > self.len {
            return None;
        }
        // SAFETY: [lead + offset, lead + end) lies inside the live mapping.
        Some(unsafe { std::slice::from_raw_parts(self.base.as_ptr().add(self.lead + offset), len) })
    }

    /// Copies `data` into the region at `offset`; false when it does not fit.
    pub fn write(&self, offset: usize, data: &[u8]) -> bool {
        let Some(end) = offset.checked_add(data.len()) else {
            return false;
        };
        if end > self.len {
            return false;
        }
        // SAFETY: the destination range lies inside the live mapping.
        // `ptr::copy` allows overlap: an identity model's output can be a
        // slice of an input read from this very region.
        unsafe {
            std::ptr::copy(
                data.as_ptr(),
                self.base.as_ptr().add(self.lead + offset),
                data.len(),
            );
        }
        true
    }
}

impl Drop for Mapping {
    fn drop(&mut self) {
        // Before munmap: the SIGBUS handler must never remap an address
        // range that may already belong to someone else.
        if let Some(p) = self.protected.take() {
            p.release();
        }
        // SAFETY: base/mapped_len are exactly what mmap returned; nothing
        // references the mapping any more (we are its last owner).
        if unsafe { libc::munmap(self.base.as_ptr().cast(), self.mapped_len) } != 0 {
            tracing::warn!(error = %io::Error::last_os_error(), "munmap of a shared memory region failed");
        }
    }
}
