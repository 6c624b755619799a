//! Page-locked ("pinned") host staging buffers for copies between host
//! and GPU memory, one pool per NUMA node.
//!
//! A copy from pageable memory makes the driver bounce it through its
//! own small pinned buffer; from pinned memory the GPU's DMA engine reads
//! the bytes directly, at full PCIe speed. Pinning is expensive (a system
//! call that faults in and locks every page, milliseconds per MiB), so
//! buffers are made once, kept, and handed out again: a request never
//! pins or maps memory unless its size class has never been used before.
//!
//! - Size classes are powers of two from [`MIN_CLASS`]; a request takes a
//!   free buffer of its class or makes one while the pool's total stays
//!   under its bound; past the bound (or above the largest class) the
//!   caller gets `None` and copies through its own pageable memory.
//! - Buffers are anonymous `mmap`s bound to the pool's NUMA node with
//!   `mbind(MPOL_BIND)` before their pages are touched, so the pages sit
//!   next to the GPU (or shard) the pool serves; when binding fails (no
//!   NUMA support, a node the kernel does not know) the buffer is used
//!   unbound and the reason is logged once.
//! - Pinning is a [`Pinner`]: with a CUDA driver, `cuMemHostRegister`
//!   (`gpu::cuda::HostRegister`); without one, or when registering fails
//!   (RLIMIT_MEMLOCK, driver error), buffers stay pageable and the reason
//!   is logged once and kept in [`PoolStats::unpinned_reason`].
//!
//! Users: CUDA shared memory's device → host reads (`shm::cuda`), and the
//! ONNX Runtime backend, which stages every input of a GPU instance into a
//! buffer of its GPU's node before `run` so the CUDA execution provider
//! copies from pinned memory (`backend::onnxruntime::staging`). ORT's
//! outputs are not staged: ORT copies them into its own pageable memory.
//!
//! The host-side logic (classes, reuse, bound, binding, fallback) is what
//! the unit tests below exercise, with fake pinners; the CUDA pinner ran on
//! an H200 through `examples/pinned_bandwidth` (`scripts/device_check.sh`).

use std::{
    collections::HashMap,
    fmt,
    ptr::NonNull,
    sync::{
        atomic::{AtomicU64, AtomicUsize, Ordering},
        Arc, Mutex, OnceLock,
    },
};

/// Smallest size class (64 KiB): smaller copies gain little from pinning.
pub const MIN_CLASS: usize = 64 * 1024;
/// Default largest buffer (64 MiB).
pub const DEFAULT_MAX_BUFFER: usize = 64 * 1024 * 1024;
/// Default bound on one pool's bytes: Triton's default
/// `--pinned-memory-pool-byte-size` (256 MiB).
pub const DEFAULT_CAPACITY: usize = 256 * 1024 * 1024;

/// The bound `pool_for_node` gives the pools it makes.
static CAPACITY: std::sync::atomic::AtomicUsize =
    std::sync::atomic::AtomicUsize::new(DEFAULT_CAPACITY);

/// Sets the bound of each NUMA node's pool (`--pinned-memory-pool-byte-size`;
/// 0: no staging buffers, every copy goes through pageable memory). Takes
/// effect for pools not yet made: call it before the server starts.
pub fn set_pool_capacity(bytes: usize) {
    CAPACITY.store(bytes, Ordering::Relaxed);
}

/// Locks and unlocks host memory for DMA.
pub trait Pinner: Send + Sync + fmt::Debug {
    /// Pins `[ptr, ptr + len)`, or says why it cannot.
    fn pin(&self, ptr: NonNull<u8>, len: usize) -> Result<(), String>;
    /// Undoes a successful `pin` (before the memory is unmapped).
    fn unpin(&self, ptr: NonNull<u8>, len: usize);
}

/// No pinning: the buffers stay pageable, for `reason`.
#[derive(Debug)]
pub struct NoPinning(pub String);

impl Pinner for NoPinning {
    fn pin(&self, _: NonNull<u8>, _: usize) -> Result<(), String> {
        Err(self.0.clone())
    }
    fn unpin(&self, _: NonNull<u8>, _: usize) {}
}

/// The pinner this process can use: the CUDA driver's host registration
/// when a GPU is present, otherwise none, with the reason.
pub fn system_pinner() -> Arc<dyn Pinner> {
    #[cfg(feature = "cuda")]
    {
        let inventory = super::GpuInventory::shared();
        if let Some(gpu) = inventory.gpus.first() {
            return Arc::new(super::cuda::HostRegister::new(gpu.id));
        }
        Arc::new(NoPinning(inventory.absent.clone().unwrap_or_else(|| {
            "no GPU: nothing to pin host memory for".to_string()
        })))
    }
    #[cfg(not(feature = "cuda"))]
    {
        Arc::new(NoPinning("built without the `cuda` feature".to_string()))
    }
}

/// One mapped (maybe bound, maybe pinned) buffer.
#[derive(Debug)]
struct Chunk {
    ptr: NonNull<u8>,
    /// Mapped bytes: the size class.
    len: usize,
    pinned: bool,
}

// SAFETY: a chunk is plain anonymous memory owned by one holder at a time
// (the free list or one `StagingBuffer`).
unsafe impl Send for Chunk {}

impl Chunk {
    fn map(len: usize) -> Result<Self, String> {
        // SAFETY: anonymous private mapping, no address hint, no fd.
        let p = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return Err(format!(
                "mmap of {len} bytes: {}",
                std::io::Error::last_os_error()
            ));
        }
        let ptr = NonNull::new(p.cast::<u8>()).ok_or("mmap returned null")?;
        Ok(Self {
            ptr,
            len,
            pinned: false,
        })
    }

    /// Writes one byte per page so the pages exist (on the bound node)
    /// now, not on the request path.
    fn touch(&self) {
        // SAFETY: sysconf has no preconditions.
        let page = (unsafe { libc::sysconf(libc::_SC_PAGESIZE) }).max(4096) as usize;
        let mut off = 0;
        while off < self.len {
            // SAFETY: in bounds of the mapping, which is writable.
            unsafe { self.ptr.as_ptr().add(off).write_volatile(0) };
            off += page;
        }
    }
}

/// Binds `[ptr, ptr + len)` to NUMA node `node` (`mbind`, `MPOL_BIND`).
fn bind_to_node(ptr: NonNull<u8>, len: usize, node: usize) -> Result<(), String> {
    const MPOL_BIND: libc::c_long = 2;
    let words = node / 64 + 1;
    let mut mask = vec![0u64; words];
    mask[node / 64] |= 1 << (node % 64);
    // The kernel reads `maxnode - 1` bits.
    let maxnode = (words * 64 + 1) as libc::c_ulong;
    // SAFETY: the range is our own mapping; the mask holds `maxnode - 1` bits.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_mbind,
            ptr.as_ptr(),
            len as libc::c_ulong,
            MPOL_BIND,
            mask.as_ptr(),
            maxnode,
            0 as libc::c_ulong,
        )
    };
    if rc != 0 {
        return Err(format!(
            "mbind to NUMA node {node}: {}",
            std::io::Error::last_os_error()
        ));
    }
    Ok(())
}

/// The NUMA node holding the first page of `mem` (`get_mempolicy`), for
/// tests and diagnostics.
pub fn node_of(mem: &[u8]) -> Option<usize> {
    let ptr = mem.as_ptr();
    const MPOL_F_NODE: libc::c_ulong = 1;
    const MPOL_F_ADDR: libc::c_ulong = 2;
    let mut node: libc::c_int = -1;
    // SAFETY: `node` is a valid out-pointer; no mask is asked for.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_get_mempolicy,
            &mut node as *mut libc::c_int,
            std::ptr::null_mut::<libc::c_ulong>(),
            0 as libc::c_ulong,
            ptr,
            MPOL_F_NODE | MPOL_F_ADDR,
        )
    };
    (rc == 0 && node >= 0).then_some(node as usize)
}

/// The pool's size class for `len`, or `None` above `max`.
fn class_of(len: usize, max: usize) -> Option<usize> {
    let class = len.max(MIN_CLASS).checked_next_power_of_two()?;
    (class <= max).then_some(class)
}

/// How a pool is doing.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct PoolStats {
    /// Bytes of all buffers made (free or in use).
    pub total_bytes: usize,
    pub buffers: usize,
    /// Buffers pinned (the rest are pageable).
    pub pinned_buffers: usize,
    /// Takes served by a free buffer.
    pub reused: u64,
    /// Takes that made a new buffer.
    pub created: u64,
    /// Takes refused (too large, or the bound reached).
    pub refused: u64,
    /// Bytes of the buffers taken and not yet given back.
    pub used_bytes: usize,
    /// Why buffers are pageable, when they are.
    pub unpinned_reason: Option<String>,
    /// Why buffers are not bound to the node, when they are not.
    pub unbound_reason: Option<String>,
}

#[derive(Debug, Default)]
struct PoolState {
    free: HashMap<usize, Vec<Chunk>>,
    total_bytes: usize,
    buffers: usize,
    pinned_buffers: usize,
    unpinned_reason: Option<String>,
    unbound_reason: Option<String>,
}

#[derive(Debug)]
struct PoolInner {
    node: Option<usize>,
    capacity: usize,
    max_buffer: usize,
    pinner: Arc<dyn Pinner>,
    state: Mutex<PoolState>,
    reused: AtomicU64,
    created: AtomicU64,
    refused: AtomicU64,
    /// Bytes of the buffers out with callers (`nv_pinned_memory_pool_used_bytes`).
    used: AtomicUsize,
}

/// Staging buffers for one NUMA node (or none: unbound).
#[derive(Debug, Clone)]
pub struct StagingPool(Arc<PoolInner>);

impl StagingPool {
    /// A pool of at most `capacity` bytes in buffers of at most
    /// `max_buffer` bytes, on `node` when given.
    pub fn new(
        node: Option<usize>,
        capacity: usize,
        max_buffer: usize,
        pinner: Arc<dyn Pinner>,
    ) -> Self {
        Self(Arc::new(PoolInner {
            node,
            capacity,
            max_buffer: max_buffer.max(MIN_CLASS),
            pinner,
            state: Mutex::new(PoolState::default()),
            reused: AtomicU64::new(0),
            created: AtomicU64::new(0),
            refused: AtomicU64::new(0),
            used: AtomicUsize::new(0),
        }))
    }

    pub fn node(&self) -> Option<usize> {
        self.0.node
    }

    /// A buffer of at least `len` bytes (its `len()` is `len`), or `None`
    /// when `len` is above the largest class or the pool is full: the
    /// caller then uses pageable memory of its own.
    pub fn take(&self, len: usize) -> Option<StagingBuffer> {
        let inner = &self.0;
        let Some(class) = class_of(len, inner.max_buffer) else {
            inner.refused.fetch_add(1, Ordering::Relaxed);
            return None;
        };
        {
            let mut st = inner.state.lock().ok()?;
            if let Some(chunk) = st.free.get_mut(&class).and_then(Vec::pop) {
                inner.reused.fetch_add(1, Ordering::Relaxed);
                inner.used.fetch_add(class, Ordering::Relaxed);
                return Some(StagingBuffer {
                    pool: Arc::clone(inner),
                    chunk: Some(chunk),
                    len,
                });
            }
            if st.total_bytes + class > inner.capacity {
                inner.refused.fetch_add(1, Ordering::Relaxed);
                return None;
            }
            // Reserve the bytes now; mapping and pinning happen outside the
            // lock (pinning takes milliseconds).
            st.total_bytes += class;
        }
        let chunk = self.make(class);
        let mut st = inner.state.lock().ok()?;
        match chunk {
            Ok(chunk) => {
                st.buffers += 1;
                st.pinned_buffers += usize::from(chunk.pinned);
                inner.created.fetch_add(1, Ordering::Relaxed);
                inner.used.fetch_add(class, Ordering::Relaxed);
                Some(StagingBuffer {
                    pool: Arc::clone(inner),
                    chunk: Some(chunk),
                    len,
                })
            }
            Err(e) => {
                st.total_bytes -= class;
                inner.refused.fetch_add(1, Ordering::Relaxed);
                tracing::warn!(node = ?inner.node, class, error = %e, "staging buffer not made");
                None
            }
        }
    }

    fn make(&self, class: usize) -> Result<Chunk, String> {
        let inner = &self.0;
        let mut chunk = Chunk::map(class)?;
        if let Some(node) = inner.node {
            if let Err(e) = bind_to_node(chunk.ptr, class, node) {
                self.note(
                    |st| &mut st.unbound_reason,
                    e,
                    "staging buffers are not NUMA-bound",
                );
            }
        }
        chunk.touch();
        match inner.pinner.pin(chunk.ptr, class) {
            Ok(()) => chunk.pinned = true,
            Err(e) => self.note(
                |st| &mut st.unpinned_reason,
                e,
                "staging buffers are pageable, not pinned",
            ),
        }
        Ok(chunk)
    }

    /// Keeps the first reason for a degradation and logs it once.
    fn note(&self, field: fn(&mut PoolState) -> &mut Option<String>, reason: String, what: &str) {
        let Ok(mut st) = self.0.state.lock() else {
            return;
        };
        let slot = field(&mut st);
        if slot.is_none() {
            tracing::warn!(node = ?self.0.node, reason = %reason, "{what}");
            *slot = Some(reason);
        }
    }

    pub fn stats(&self) -> PoolStats {
        let inner = &self.0;
        let st = inner.state.lock().map(|s| {
            (
                s.total_bytes,
                s.buffers,
                s.pinned_buffers,
                s.unpinned_reason.clone(),
                s.unbound_reason.clone(),
            )
        });
        let (total_bytes, buffers, pinned_buffers, unpinned_reason, unbound_reason) =
            st.unwrap_or_default();
        PoolStats {
            total_bytes,
            buffers,
            pinned_buffers,
            reused: inner.reused.load(Ordering::Relaxed),
            created: inner.created.load(Ordering::Relaxed),
            refused: inner.refused.load(Ordering::Relaxed),
            used_bytes: inner.used.load(Ordering::Relaxed),
            unpinned_reason,
            unbound_reason,
        }
    }
}

impl Drop for PoolInner {
    fn drop(&mut self) {
        // Every buffer in use holds an `Arc` of the pool, so all are free.
        let Ok(st) = self.state.get_mut() else {
            return;
        };
        for chunk in st.free.drain().flat_map(|(_, v)| v) {
            if chunk.pinned {
                self.pinner.unpin(chunk.ptr, chunk.len);
            }
            // SAFETY: mapped by `Chunk::map` with this length, unused now.
            unsafe { libc::munmap(chunk.ptr.as_ptr().cast(), chunk.len) };
        }
    }
}

/// A buffer taken from a pool; goes back to it when dropped.
#[derive(Debug)]
pub struct StagingBuffer {
    pool: Arc<PoolInner>,
    chunk: Option<Chunk>,
    len: usize,
}

impl StagingBuffer {
    pub fn is_pinned(&self) -> bool {
        self.chunk.as_ref().is_some_and(|c| c.pinned)
    }

    /// The buffer's start, for the driver's copies.
    pub fn as_mut_ptr(&mut self) -> *mut u8 {
        self.chunk
            .as_ref()
            .map_or(std::ptr::null_mut(), |c| c.ptr.as_ptr())
    }

    /// Bytes of the mapping this buffer came from (its size class).
    pub fn capacity(&self) -> usize {
        self.chunk.as_ref().map_or(0, |c| c.len)
    }
}

impl std::ops::Deref for StagingBuffer {
    type Target = [u8];
    fn deref(&self) -> &[u8] {
        match &self.chunk {
            // SAFETY: `len <= chunk.len`, the mapping is ours while held.
            Some(c) => unsafe { std::slice::from_raw_parts(c.ptr.as_ptr(), self.len) },
            None => &[],
        }
    }
}

impl std::ops::DerefMut for StagingBuffer {
    fn deref_mut(&mut self) -> &mut [u8] {
        match &self.chunk {
            // SAFETY: as in `deref`, and this holder is the only one.
            Some(c) => unsafe { std::slice::from_raw_parts_mut(c.ptr.as_ptr(), self.len) },
            None => &mut [],
        }
    }
}

impl AsRef<[u8]> for StagingBuffer {
    fn as_ref(&self) -> &[u8] {
        self
    }
}

impl Drop for StagingBuffer {
    fn drop(&mut self) {
        let Some(chunk) = self.chunk.take() else {
            return;
        };
        self.pool.used.fetch_sub(chunk.len, Ordering::Relaxed);
        // A poisoned pool: the chunk (which has no `Drop`) is leaked rather
        // than unmapped while a pinner may still have it registered.
        if let Ok(mut st) = self.pool.state.lock() {
            st.free.entry(chunk.len).or_default().push(chunk);
        }
    }
}

/// The process's pools, one per NUMA node (and one unbound), made on first
/// use with the system pinner and the bound `set_pool_capacity` gave.
pub fn pool_for_node(node: Option<usize>) -> StagingPool {
    let mut map = pools();
    map.entry(node)
        .or_insert_with(|| {
            StagingPool::new(
                node,
                CAPACITY.load(Ordering::Relaxed),
                DEFAULT_MAX_BUFFER,
                system_pinner(),
            )
        })
        .clone()
}

fn pools() -> std::sync::MutexGuard<'static, HashMap<Option<usize>, StagingPool>> {
    static POOLS: OnceLock<Mutex<HashMap<Option<usize>, StagingPool>>> = OnceLock::new();
    match POOLS.get_or_init(Default::default).lock() {
        Ok(m) => m,
        Err(poisoned) => poisoned.into_inner(),
    }
}

/// The process's pinned pool as Triton's metrics show it: (total bytes,
/// bytes in use). Total is the configured bound of each pool made (of one
/// pool before any is made, as Triton reports its pool's size from the
/// start); in use, the bytes of the buffers held by callers.
pub fn pool_usage() -> (u64, u64) {
    let map = pools();
    if map.is_empty() {
        return (CAPACITY.load(Ordering::Relaxed) as u64, 0);
    }
    map.values().fold((0, 0), |(total, used), p| {
        (
            total + p.0.capacity as u64,
            used + p.0.used.load(Ordering::Relaxed) as u64,
        )
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Pins by recording: counts pins and unpins, can refuse.
    #[derive(Debug, Default)]
    struct FakePinner {
        pins: AtomicUsize,
        unpins: AtomicUsize,
        refuse: bool,
    }

    impl Pinner for FakePinner {
        fn pin(&self, _: NonNull<u8>, _: usize) -> Result<(), String> {
            if self.refuse {
                return Err("RLIMIT_MEMLOCK too low (fake)".into());
            }
            self.pins.fetch_add(1, Ordering::SeqCst);
            Ok(())
        }
        fn unpin(&self, _: NonNull<u8>, _: usize) {
            self.unpins.fetch_add(1, Ordering::SeqCst);
        }
    }

    const MIB: usize = 1024 * 1024;

    #[test]
    fn size_classes_are_powers_of_two_from_the_minimum() {
        assert_eq!(class_of(1, MIB), Some(MIN_CLASS));
        assert_eq!(class_of(MIN_CLASS, MIB), Some(MIN_CLASS));
        assert_eq!(class_of(MIN_CLASS + 1, MIB), Some(2 * MIN_CLASS));
        assert_eq!(class_of(MIB, MIB), Some(MIB));
        assert_eq!(class_of(MIB + 1, MIB), None);
        assert_eq!(class_of(usize::MAX, usize::MAX), None);
    }

    #[test]
    fn used_bytes_count_buffers_out_with_callers() {
        let pool = StagingPool::new(None, 8 * MIB, MIB, Arc::new(FakePinner::default()));
        let a = pool.take(100_000).expect("buffer");
        let b = pool.take(MIB).expect("buffer");
        assert_eq!(pool.stats().used_bytes, 128 * 1024 + MIB);
        drop(a);
        assert_eq!(pool.stats().used_bytes, MIB);
        let c = pool.take(70_000).expect("reused");
        assert_eq!(pool.stats().used_bytes, MIB + 128 * 1024);
        drop((b, c));
        assert_eq!(pool.stats().used_bytes, 0);
    }

    #[test]
    fn buffers_are_made_once_and_reused() {
        let pinner = Arc::new(FakePinner::default());
        let pool = StagingPool::new(None, 8 * MIB, MIB, pinner.clone());
        let first_ptr = {
            let mut b = pool.take(100_000).expect("buffer");
            assert_eq!(b.len(), 100_000);
            assert_eq!(b.capacity(), 128 * 1024);
            assert!(b.is_pinned());
            b.fill(7);
            b.as_mut_ptr()
        };
        for _ in 0..10 {
            let mut b = pool.take(90_000).expect("buffer");
            assert_eq!(b.as_mut_ptr(), first_ptr, "the same buffer comes back");
        }
        let s = pool.stats();
        assert_eq!((s.created, s.reused, s.buffers), (1, 10, 1));
        assert_eq!(pinner.pins.load(Ordering::SeqCst), 1, "pinned once");
        assert_eq!(s.total_bytes, 128 * 1024);
        drop(pool);
        assert_eq!(
            pinner.unpins.load(Ordering::SeqCst),
            1,
            "unpinned at the end"
        );
    }

    #[test]
    fn buffers_in_use_are_distinct_and_the_total_is_bounded() {
        let pool = StagingPool::new(None, MIB, MIB, Arc::new(FakePinner::default()));
        let mut held: Vec<_> = (0..4).map(|_| pool.take(200_000).expect("fits")).collect();
        // 4 × 256 KiB = the whole MiB: the next one is refused, not made.
        assert!(pool.take(200_000).is_none());
        assert!(pool.take(1).is_none());
        let mut ptrs: Vec<_> = held.iter_mut().map(|b| b.as_mut_ptr()).collect();
        ptrs.dedup();
        assert_eq!(ptrs.len(), 4);
        held.pop();
        assert!(
            pool.take(200_000).is_some(),
            "a returned buffer serves again"
        );
        let s = pool.stats();
        assert_eq!(s.total_bytes, MIB);
        assert_eq!(s.refused, 2);
    }

    #[test]
    fn a_zero_bound_pool_makes_nothing() {
        let pool = StagingPool::new(None, 0, MIB, Arc::new(FakePinner::default()));
        assert!(pool.take(1).is_none());
        assert_eq!(pool.stats().buffers, 0);
    }

    #[test]
    fn too_large_requests_are_refused() {
        let pool = StagingPool::new(None, 8 * MIB, MIB, Arc::new(FakePinner::default()));
        assert!(pool.take(MIB + 1).is_none());
        assert_eq!(pool.stats().buffers, 0);
    }

    #[test]
    fn without_pinning_buffers_are_pageable_with_the_reason_kept() {
        let pool = StagingPool::new(None, 8 * MIB, MIB, Arc::new(NoPinning("no driver".into())));
        let mut b = pool.take(4096).expect("pageable buffer");
        assert!(!b.is_pinned());
        b.copy_from_slice(&[1u8; 4096]);
        assert!(b.iter().all(|&x| x == 1));
        let s = pool.stats();
        assert_eq!(s.unpinned_reason.as_deref(), Some("no driver"));
        assert_eq!(s.pinned_buffers, 0);

        let refusing = Arc::new(FakePinner {
            refuse: true,
            ..Default::default()
        });
        let pool = StagingPool::new(None, 8 * MIB, MIB, refusing.clone());
        assert!(!pool.take(10).expect("buffer").is_pinned());
        drop(pool);
        assert_eq!(
            refusing.unpins.load(Ordering::SeqCst),
            0,
            "nothing to unpin"
        );
    }

    #[test]
    fn buffers_are_bound_to_their_numa_node() {
        // Node 0 exists on every Linux machine (NUMA or not).
        let pool = StagingPool::new(Some(0), 8 * MIB, MIB, Arc::new(FakePinner::default()));
        let b = pool.take(MIN_CLASS).expect("buffer");
        let s = pool.stats();
        match s.unbound_reason {
            // Containers may forbid mbind (seccomp): then the reason is kept.
            Some(reason) => println!("mbind unavailable here: {reason}"),
            None => assert_eq!(node_of(&b), Some(0)),
        }
    }

    #[test]
    fn a_node_the_kernel_does_not_know_leaves_buffers_unbound_but_usable() {
        let pool = StagingPool::new(Some(1000), 8 * MIB, MIB, Arc::new(FakePinner::default()));
        let mut b = pool.take(10).expect("unbound buffer");
        b.fill(3);
        let reason = pool.stats().unbound_reason.expect("the reason is kept");
        assert!(reason.contains("node 1000"), "{reason}");
    }

    #[test]
    fn buffers_cross_threads() {
        let pool = StagingPool::new(None, 8 * MIB, MIB, Arc::new(FakePinner::default()));
        let b = pool.take(1000).expect("buffer");
        let bytes = bytes::Bytes::from_owner(b);
        std::thread::spawn(move || assert_eq!(bytes.len(), 1000))
            .join()
            .expect("thread");
        assert_eq!(pool.stats().buffers, 1);
        assert!(pool.take(1000).is_some());
        assert_eq!(pool.stats().reused, 1, "the Bytes gave its buffer back");
    }
}
