//! The shared memory registry: one name space for system and CUDA regions,
//! as Triton's `SharedMemoryManager` keeps one map, so a name is taken by
//! either kind.
//!
//! One per process (Triton has one per server; in-process test servers
//! share it). One `std::sync::RwLock` guards the one map: registration is
//! rare, and only requests that name a region take the read lock, for one
//! lookup and an `Arc` clone whatever the region's kind. Requests without
//! shared memory never touch it (`containing` reads an atomic count
//! first), so the lock-free request path stays lock-free.
//!
//! A name is claimed in one place, `insert`, under the write lock: two
//! registrations of one name racing, of whichever kinds, cannot both
//! succeed. The per-kind work before it (mapping a shm object, opening an
//! IPC handle) happens outside the lock, in `system` and `cuda`.
//!
//! Unregistering a region a request is using succeeds but is deferred, as
//! in Triton (`awaiting_unregister_`): the region stays registered, and
//! usable, until its last request has been answered. "Using" means a
//! [`Lease`], taken when the request's regions are resolved and dropped
//! before its answer is sent, so a client that unregisters after reading
//! its answer never sees the region again. The `Arc`s a request's tensors
//! hold keep the mapping alive (memory safety) but do not count: the
//! thread that ran the model may drop them after the answer is out.
//! Deferred regions leave the map at the next registry call that finds
//! them free (`sweep`); calls made while none waits pay one atomic load.

use std::{
    collections::{btree_map::Entry, BTreeMap},
    sync::{
        atomic::{AtomicBool, AtomicUsize, Ordering},
        Arc, OnceLock, RwLock,
    },
};

use super::{cuda::CudaRegion, system::SystemRegion};
use crate::{error_texts, types::InferError};

/// The two kinds of region, as the register, status and unregister
/// endpoints name them.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Kind {
    System,
    Cuda,
}

/// Who is using a region: the requests holding a [`Lease`] on it, and
/// whether an unregister waits for them.
#[derive(Debug, Default)]
pub struct Usage {
    leases: AtomicUsize,
    awaiting_unregister: AtomicBool,
}

/// A request's claim on a region, from the time its regions are resolved
/// until its answer is ready: while one is held, unregistering the region
/// is deferred.
#[derive(Debug)]
pub struct Lease(Region);

impl Lease {
    pub fn new(region: Region) -> Self {
        region.usage().leases.fetch_add(1, Ordering::AcqRel);
        Self(region)
    }
}

impl Drop for Lease {
    fn drop(&mut self) {
        self.0.usage().leases.fetch_sub(1, Ordering::AcqRel);
    }
}

/// A registered region of either kind.
#[derive(Debug, Clone)]
pub enum Region {
    System(Arc<SystemRegion>),
    Cuda(Arc<CudaRegion>),
}

impl Region {
    pub fn name(&self) -> &str {
        match self {
            Self::System(r) => &r.name,
            Self::Cuda(r) => &r.name,
        }
    }

    pub fn kind(&self) -> Kind {
        match self {
            Self::System(_) => Kind::System,
            Self::Cuda(_) => Kind::Cuda,
        }
    }

    pub fn byte_size(&self) -> u64 {
        match self {
            Self::System(r) => r.byte_size,
            Self::Cuda(r) => r.byte_size,
        }
    }

    /// Fails, naming the region, when a system region's shm object was
    /// truncated (`SystemRegion::check`). CUDA regions have no such
    /// check: a failed device copy reports itself (`CudaRegion::read`).
    pub fn check(&self) -> Result<(), InferError> {
        match self {
            Self::System(r) => r.check(),
            Self::Cuda(_) => Ok(()),
        }
    }

    /// Whether both are the same registration.
    pub fn same(&self, other: &Region) -> bool {
        match (self, other) {
            (Self::System(a), Self::System(b)) => Arc::ptr_eq(a, b),
            (Self::Cuda(a), Self::Cuda(b)) => Arc::ptr_eq(a, b),
            _ => false,
        }
    }

    fn usage(&self) -> &Usage {
        match self {
            Self::System(r) => &r.usage,
            Self::Cuda(r) => &r.usage,
        }
    }

    /// Whether a request still holds a [`Lease`] on the region (an input
    /// read from it, an output going to it).
    fn in_use(&self) -> bool {
        self.usage().leases.load(Ordering::Acquire) > 0
    }

    fn awaiting_unregister(&self) -> bool {
        self.usage().awaiting_unregister.load(Ordering::Acquire)
    }

    /// Whether the region's deferred unregister can complete now.
    fn releasable(&self) -> bool {
        self.awaiting_unregister() && !self.in_use()
    }

    /// `[offset, offset + byte_size)` of the region, checked as Triton
    /// checks it.
    pub fn bounds(&self, offset: u64, byte_size: u64) -> Result<(usize, usize), InferError> {
        let name = self.name();
        if offset >= self.byte_size() {
            return Err(error_texts::shm_invalid_offset(name));
        }
        let end = offset
            .checked_add(byte_size)
            .filter(|&e| e <= self.byte_size())
            .ok_or_else(|| error_texts::shm_invalid_range(name))?;
        // Both fit in usize: the mapping's length (system) or the device
        // allocation's (CUDA) was checked at registration.
        let offset = usize::try_from(offset).map_err(|_| error_texts::shm_invalid_range(name))?;
        let len = usize::try_from(end).map_err(|_| error_texts::shm_invalid_range(name))? - offset;
        Ok((offset, len))
    }
}

#[derive(Debug, Default)]
pub struct Registry {
    regions: RwLock<BTreeMap<String, Region>>,
    /// How many of `regions` are system regions, readable without the
    /// lock: requests that read no input from shared memory skip the
    /// lookup in `containing`.
    system_count: AtomicUsize,
    /// How many regions wait for their requests before leaving the map
    /// (see `sweep`).
    awaiting: AtomicUsize,
}

type Regions = BTreeMap<String, Region>;

/// The process's registry.
pub fn global() -> &'static Registry {
    static REGISTRY: OnceLock<Registry> = OnceLock::new();
    REGISTRY.get_or_init(Registry::default)
}

fn poisoned() -> InferError {
    InferError::internal("the shared memory registry is unusable after a panic")
}

impl Registry {
    /// Adds `region` under its name unless the name is taken, by either
    /// kind (Triton's "already in manager").
    pub(super) fn insert(&self, region: Region) -> Result<(), InferError> {
        let mut regions = self.regions.write().map_err(|_| poisoned())?;
        self.sweep_locked(&mut regions);
        match regions.entry(region.name().to_string()) {
            Entry::Occupied(_) => Err(error_texts::shm_already_registered(region.name())),
            Entry::Vacant(slot) => {
                slot.insert(region);
                self.recount(&regions);
                Ok(())
            }
        }
    }

    fn recount(&self, regions: &Regions) {
        let n = regions
            .values()
            .filter(|r| matches!(r, Region::System(_)))
            .count();
        self.system_count.store(n, Ordering::Release);
        let n = regions.values().filter(|r| r.awaiting_unregister()).count();
        self.awaiting.store(n, Ordering::Release);
    }

    /// Completes the deferred unregisters whose requests have all been
    /// answered, so that no call observes a region its client already
    /// unregistered and no longer uses.
    fn sweep(&self) -> Result<(), InferError> {
        if self.awaiting.load(Ordering::Acquire) == 0 {
            return Ok(());
        }
        let mut regions = self.regions.write().map_err(|_| poisoned())?;
        self.sweep_locked(&mut regions);
        Ok(())
    }

    fn sweep_locked(&self, regions: &mut Regions) {
        if self.awaiting.load(Ordering::Acquire) == 0 {
            return;
        }
        regions.retain(|name, r| {
            let release = r.releasable();
            if release {
                tracing::debug!(name, "unregistered shared memory after its last request");
            }
            !release
        });
        self.recount(regions);
    }

    /// Unregisters `region` (under the write lock), or defers it while a
    /// request holds it. Whether it left the map.
    fn forget(name: &str, region: &Region) -> bool {
        if region.in_use() {
            region
                .usage()
                .awaiting_unregister
                .store(true, Ordering::Release);
            tracing::debug!(
                name,
                "shared memory region will be unregistered after its in-flight requests"
            );
            false
        } else {
            true
        }
    }

    /// Whether `name` is registered, as either kind.
    pub fn contains(&self, name: &str) -> Result<bool, InferError> {
        self.sweep()?;
        Ok(self
            .regions
            .read()
            .map_err(|_| poisoned())?
            .contains_key(name))
    }

    /// `name`'s region, of whichever kind, for a request to read or write.
    pub fn find(&self, name: &str) -> Result<Option<Region>, InferError> {
        self.sweep()?;
        Ok(self
            .regions
            .read()
            .map_err(|_| poisoned())?
            .get(name)
            .cloned())
    }

    /// The registered system region whose mapping holds `ptr`, if any (the
    /// region an input's bytes were read from).
    pub fn containing(&self, ptr: *const u8) -> Result<Option<Arc<SystemRegion>>, InferError> {
        if self.system_count.load(Ordering::Acquire) == 0 {
            return Ok(None);
        }
        Ok(self
            .regions
            .read()
            .map_err(|_| poisoned())?
            .values()
            .find_map(|r| match r {
                Region::System(r) if r.mapping.contains(ptr) => Some(Arc::clone(r)),
                _ => None,
            }))
    }

    /// Forgets `name` if it is a region of `kind` (no error otherwise, as
    /// in Triton). A region a request holds is forgotten once its last
    /// request has been answered; meanwhile it stays registered and usable.
    pub fn unregister(&self, name: &str, kind: Kind) -> Result<(), InferError> {
        let mut regions = self.regions.write().map_err(|_| poisoned())?;
        self.sweep_locked(&mut regions);
        if let Some(region) = regions.get(name).filter(|r| r.kind() == kind) {
            if Self::forget(name, region) {
                regions.remove(name);
            }
            self.recount(&regions);
        }
        Ok(())
    }

    /// Forgets every region of `kind`, those in use once their requests
    /// have been answered (Triton's `UnregisterAll`).
    pub fn unregister_all(&self, kind: Kind) -> Result<(), InferError> {
        let mut regions = self.regions.write().map_err(|_| poisoned())?;
        self.sweep_locked(&mut regions);
        regions.retain(|name, r| r.kind() != kind || !Self::forget(name, r));
        self.recount(&regions);
        Ok(())
    }

    /// Every system region (empty `name`) or the one named; a name taken
    /// by a CUDA region gets Triton's text naming that kind.
    pub fn system_status(&self, name: &str) -> Result<Vec<Arc<SystemRegion>>, InferError> {
        self.status(
            name,
            |r| match r {
                Region::System(r) => Some(Arc::clone(r)),
                Region::Cuda(_) => None,
            },
            || error_texts::shm_wrong_kind(name, "CUDA", "system"),
            || error_texts::shm_unknown_system_region(name),
        )
    }

    /// Every CUDA region (empty `name`) or the one named; a name taken by
    /// a system region gets Triton's text naming that kind.
    pub fn cuda_status(&self, name: &str) -> Result<Vec<Arc<CudaRegion>>, InferError> {
        self.status(
            name,
            |r| match r {
                Region::Cuda(r) => Some(Arc::clone(r)),
                Region::System(_) => None,
            },
            || error_texts::shm_wrong_kind(name, "system", "CUDA"),
            || error_texts::cuda_shm_unknown_region(name),
        )
    }

    fn status<T>(
        &self,
        name: &str,
        of_kind: impl Fn(&Region) -> Option<T>,
        wrong_kind: impl FnOnce() -> InferError,
        unknown: impl FnOnce() -> InferError,
    ) -> Result<Vec<T>, InferError> {
        self.sweep()?;
        let regions = self.regions.read().map_err(|_| poisoned())?;
        if name.is_empty() {
            return Ok(regions.values().filter_map(&of_kind).collect());
        }
        match regions.get(name) {
            Some(r) => of_kind(r).map(|r| vec![r]).ok_or_else(wrong_kind),
            None => Err(unknown()),
        }
    }
}

#[cfg(test)]
mod tests {
    use std::{ffi::CString, sync::Barrier};

    use super::*;
    use crate::types::ErrorKind;

    /// A POSIX shm object of `len` bytes, unlinked when dropped.
    struct Object {
        key: String,
    }

    impl Object {
        fn new(tag: &str, len: usize) -> Self {
            let key = format!("/shardserve-registry-{}-{tag}", std::process::id());
            let c_key = CString::new(key.clone()).unwrap();
            // SAFETY: valid NUL-terminated name; the descriptor is closed
            // below (the registry opens the object by name).
            unsafe {
                let fd = libc::shm_open(c_key.as_ptr(), libc::O_CREAT | libc::O_RDWR, 0o600);
                assert!(fd >= 0, "shm_open {key}");
                assert_eq!(libc::ftruncate(fd, len as libc::off_t), 0);
                libc::close(fd);
            }
            Self { key }
        }
    }

    impl Drop for Object {
        fn drop(&mut self) {
            let c_key = CString::new(self.key.clone()).unwrap();
            // SAFETY: valid NUL-terminated name.
            unsafe { libc::shm_unlink(c_key.as_ptr()) };
        }
    }

    fn fake_cuda(name: &str) -> Region {
        Region::Cuda(Arc::new(CudaRegion::fake(name, 64)))
    }

    /// Many threads register one name at once, half as a system region
    /// (the whole `register_system`, mapping included) and half as a CUDA
    /// one (its `insert`; the driver side needs a GPU): exactly one wins,
    /// the others get Triton's "already in manager", and the name then
    /// resolves to the winner's kind only.
    #[test]
    fn one_name_is_registered_once_whatever_the_kinds_racing() {
        const THREADS: usize = 8;
        let object = Object::new("race", 4096);
        for round in 0..100 {
            let registry = Registry::default();
            let start = Barrier::new(THREADS);
            let results: Vec<(Kind, Result<(), InferError>)> = std::thread::scope(|s| {
                let handles: Vec<_> = (0..THREADS)
                    .map(|i| {
                        let (registry, start, key) = (&registry, &start, &object.key);
                        s.spawn(move || {
                            start.wait();
                            if i % 2 == 0 {
                                (Kind::System, registry.register_system("r", key, 0, 4096))
                            } else {
                                (Kind::Cuda, registry.insert(fake_cuda("r")))
                            }
                        })
                    })
                    .collect();
                handles.into_iter().map(|h| h.join().unwrap()).collect()
            });
            let winners: Vec<Kind> = results
                .iter()
                .filter(|(_, r)| r.is_ok())
                .map(|(k, _)| *k)
                .collect();
            assert_eq!(winners.len(), 1, "round {round}: {results:?}");
            for (_, r) in &results {
                if let Err(e) = r {
                    assert_eq!(e.message, "shared memory region 'r' already in manager");
                }
            }
            let winner = winners[0];
            assert_eq!(registry.find("r").unwrap().map(|r| r.kind()), Some(winner));
            let (systems, cudas) = (
                registry.system_status("").unwrap().len(),
                registry.cuda_status("").unwrap().len(),
            );
            assert_eq!(
                (systems, cudas),
                match winner {
                    Kind::System => (1, 0),
                    Kind::Cuda => (0, 1),
                }
            );
            assert_eq!(registry.system_count.load(Ordering::Acquire), systems);
        }
    }

    #[test]
    fn each_kind_sees_its_own_regions_and_names_the_other() {
        let object = Object::new("kinds", 4096);
        let registry = Registry::default();
        registry
            .register_system("sys", &object.key, 0, 4096)
            .unwrap();
        registry.insert(fake_cuda("dev")).unwrap();

        let e = registry
            .register_system("dev", &object.key, 0, 64)
            .unwrap_err();
        assert_eq!(e.message, "shared memory region 'dev' already in manager");
        let e = registry.insert(fake_cuda("sys")).unwrap_err();
        assert_eq!(e.message, "shared memory region 'sys' already in manager");

        let names = |v: Vec<String>| v.join(",");
        assert_eq!(
            names(
                registry
                    .system_status("")
                    .unwrap()
                    .iter()
                    .map(|r| r.name.clone())
                    .collect()
            ),
            "sys"
        );
        assert_eq!(
            names(
                registry
                    .cuda_status("")
                    .unwrap()
                    .iter()
                    .map(|r| r.name.clone())
                    .collect()
            ),
            "dev"
        );
        let e = registry.system_status("dev").unwrap_err();
        assert_eq!(
            e.message,
            "The region named 'dev' is registered as CUDA shared memory, not system shared memory"
        );
        let e = registry.cuda_status("sys").unwrap_err();
        assert_eq!(
            e.message,
            "The region named 'sys' is registered as system shared memory, not CUDA shared memory"
        );
        assert_eq!(
            registry.system_status("none").unwrap_err().kind,
            ErrorKind::NotFound
        );
        assert_eq!(
            registry.cuda_status("none").unwrap_err().kind,
            ErrorKind::NotFound
        );

        // The request's lookup: one probe, either kind.
        assert_eq!(
            registry.find("sys").unwrap().map(|r| r.kind()),
            Some(Kind::System)
        );
        assert_eq!(
            registry.find("dev").unwrap().map(|r| r.kind()),
            Some(Kind::Cuda)
        );
        assert!(registry.find("none").unwrap().is_none());

        // Unregistering as the other kind leaves a region alone, as Triton does.
        registry.unregister("sys", Kind::Cuda).unwrap();
        registry.unregister("dev", Kind::System).unwrap();
        registry.unregister_all(Kind::Cuda).unwrap();
        assert!(registry.contains("sys").unwrap());
        assert!(!registry.contains("dev").unwrap());
        registry.insert(fake_cuda("dev")).unwrap();
        registry.unregister_all(Kind::System).unwrap();
        assert!(!registry.contains("sys").unwrap());
        assert!(registry.contains("dev").unwrap());
        assert_eq!(registry.system_count.load(Ordering::Acquire), 0);
        registry.unregister("dev", Kind::Cuda).unwrap();
        assert!(registry.find("dev").unwrap().is_none());
    }
    /// As Triton: unregistering a region a request holds succeeds, by
    /// name or with all of its kind, but the region stays registered and
    /// usable until the last lease on it goes; then the next call finds it
    /// gone. A region nobody leases goes at once.
    #[test]
    fn a_region_in_use_is_unregistered_after_its_last_request() {
        let registry = Registry::default();
        let object = Object::new("in-use", 4096);
        for name in ["a", "b", "c"] {
            registry.register_system(name, &object.key, 0, 64).unwrap();
        }
        let lease_a = Lease::new(registry.find("a").unwrap().unwrap());
        let lease_c1 = Lease::new(registry.find("c").unwrap().unwrap());
        let lease_c2 = Lease::new(registry.find("c").unwrap().unwrap());
        // An `Arc` without a lease (a tensor's bytes) does not defer it.
        let plain_b = registry.find("b").unwrap().unwrap();

        registry.unregister("a", Kind::System).unwrap();
        assert!(registry.contains("a").unwrap(), "deferred while leased");
        assert!(registry.find("a").unwrap().is_some(), "still usable");
        registry.unregister_all(Kind::System).unwrap();
        assert!(!registry.contains("b").unwrap());
        assert_eq!(plain_b.name(), "b", "its mapping outlives the registration");
        let names: Vec<_> = registry
            .system_status("")
            .unwrap()
            .iter()
            .map(|r| r.name.clone())
            .collect();
        assert_eq!(names, ["a", "c"]);
        // Taken again while awaiting: Triton's "already in manager".
        let e = registry
            .register_system("a", &object.key, 0, 64)
            .unwrap_err();
        assert!(e.message.contains("already in manager"), "{}", e.message);

        drop(lease_a);
        assert!(!registry.contains("a").unwrap());
        drop(lease_c1);
        assert!(registry.contains("c").unwrap(), "one lease left");
        drop(lease_c2);
        assert!(registry.system_status("").unwrap().is_empty());
        assert_eq!(registry.system_count.load(Ordering::Acquire), 0);
        assert_eq!(registry.awaiting.load(Ordering::Acquire), 0);
        // The name is free again.
        registry.register_system("a", &object.key, 0, 64).unwrap();
        registry.unregister("a", Kind::System).unwrap();
        assert!(!registry.contains("a").unwrap());
    }
}
