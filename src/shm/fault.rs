//! A client that shrinks (`ftruncate`) a shm object we have mapped turns
//! every later access to the pages past its new end into SIGBUS, which
//! kills the process by default. This module contains such faults the way
//! Wayland compositors contain them for `wl_shm` pools: a SIGBUS handler
//! that, when the faulting address lies in one of our mappings, maps
//! anonymous zero pages over that whole mapping (`MAP_FIXED`), marks it
//! broken and returns, so the faulting load or store completes on the
//! zero pages. The request that used the region then fails naming it
//! (`registry::Region::check`), and the region stays broken until it is
//! unregistered: its pages are no longer shared with the client.
//!
//! The handler runs on whichever thread faulted (a shard, a compute
//! worker, an offload thread, a backend's or ONNX Runtime's own threads),
//! so it only reads a fixed-capacity table of `(start, len, broken)` slots
//! through atomics, calls `mmap` (a plain system call), and allocates and
//! locks nothing. Faults outside our mappings go to the handler that was
//! installed before ours (Rust's own stack-overflow handler, normally),
//! or restore the default action, so a real bug still dies with a core.
//!
//! Why the remap cannot hit someone else's memory: a slot is published
//! only after `mmap` returned and before the mapping is handed to anyone,
//! and cleared before `munmap`. A fault inside a mapping comes from a
//! thread that holds the mapping's `Arc` (every reader and writer does),
//! so the mapping cannot be unmapped, and its address range reused, while
//! the handler runs for it. A slot caught mid-update (odd sequence, or a
//! sequence that moved during the read) belongs to a mapping being
//! created or destroyed, which nobody can be accessing, and is skipped.

use std::{
    io,
    sync::{
        atomic::{fence, AtomicBool, AtomicU64, AtomicUsize, Ordering},
        OnceLock,
    },
};

/// Mappings that can be protected at once: registered system regions, plus
/// unregistered ones still held by requests in flight.
pub const CAPACITY: usize = 4096;

/// `si_code` of a SIGBUS for an access past the end of a mapped object
/// (Linux `BUS_ADRERR`; the `libc` crate does not export it).
const BUS_ADRERR: libc::c_int = 2;

/// One protected mapping. `seq` is a sequence lock: odd while the slot is
/// being written, so a reader that sees the same even value before and
/// after reading `start` and `len` has a consistent pair. A free slot has
/// `len == 0`.
struct Slot {
    seq: AtomicU64,
    start: AtomicUsize,
    len: AtomicUsize,
    broken: AtomicBool,
}

impl Slot {
    const fn new() -> Self {
        Self {
            seq: AtomicU64::new(0),
            start: AtomicUsize::new(0),
            len: AtomicUsize::new(0),
            broken: AtomicBool::new(false),
        }
    }
}

static SLOTS: [Slot; CAPACITY] = [const { Slot::new() }; CAPACITY];

/// One past the highest slot ever used: the handler scans no further.
static HIGH: AtomicUsize = AtomicUsize::new(0);

/// The SIGBUS action installed before ours; written once, before ours is
/// installed, and only read afterwards.
static PREVIOUS: OnceLock<libc::sigaction> = OnceLock::new();

/// Installs the SIGBUS handler once per process; later calls return the
/// first call's outcome. Called before the first region is mapped, so
/// every mapping is covered (and servers that never use shared memory
/// leave SIGBUS alone).
pub fn install() -> io::Result<()> {
    static INSTALLED: OnceLock<Result<(), i32>> = OnceLock::new();
    INSTALLED
        .get_or_init(|| {
            // SAFETY: an all-zero sigaction is a valid out-parameter.
            let mut old: libc::sigaction = unsafe { std::mem::zeroed() };
            // SAFETY: with a null new action sigaction only reads the
            // current one into `old`, a valid out-pointer.
            if unsafe { libc::sigaction(libc::SIGBUS, std::ptr::null(), &mut old) } != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            // Set once, here, under `INSTALLED`'s initialisation.
            let _ = PREVIOUS.set(old);
            // SAFETY: an all-zero sigaction is valid; the mask is
            // initialised below.
            let mut action: libc::sigaction = unsafe { std::mem::zeroed() };
            action.sa_sigaction = on_sigbus as *const () as libc::sighandler_t;
            // SA_ONSTACK: a previous handler we chain to (Rust's stack
            // overflow detector) expects the alternate stack when one
            // is set up.
            action.sa_flags = libc::SA_SIGINFO | libc::SA_ONSTACK;
            // SAFETY: action.sa_mask is a valid sigset_t to initialise;
            // sigaction gets a fully initialised action whose handler has
            // the SA_SIGINFO signature.
            let rc = unsafe {
                libc::sigemptyset(&mut action.sa_mask);
                libc::sigaction(libc::SIGBUS, &action, std::ptr::null_mut())
            };
            if rc != 0 {
                return Err(io::Error::last_os_error().raw_os_error().unwrap_or(0));
            }
            tracing::debug!("SIGBUS handler for shared memory mappings installed");
            Ok(())
        })
        .map_err(io::Error::from_raw_os_error)
}

/// A claimed slot: the mapping `[start, start + len)` is protected until
/// `release`. Not `Drop`: the owner must release it before `munmap`,
/// which field drop order would not guarantee.
#[derive(Debug)]
pub struct Protected {
    index: usize,
}

/// Protects `[start, start + len)` (a live mapping, `len > 0`); `None` when
/// every slot is taken.
pub fn protect(start: usize, len: usize) -> Option<Protected> {
    for (index, slot) in SLOTS.iter().enumerate() {
        let seq = slot.seq.load(Ordering::Acquire);
        if seq & 1 == 1 || slot.len.load(Ordering::Relaxed) != 0 {
            continue;
        }
        // The exchange succeeds only if nobody wrote the slot since `seq`
        // was read, so the `len == 0` just seen still holds.
        if slot
            .seq
            .compare_exchange(seq, seq + 1, Ordering::AcqRel, Ordering::Relaxed)
            .is_err()
        {
            continue;
        }
        fence(Ordering::Release);
        slot.start.store(start, Ordering::Relaxed);
        slot.len.store(len, Ordering::Relaxed);
        slot.broken.store(false, Ordering::Relaxed);
        HIGH.fetch_max(index + 1, Ordering::AcqRel);
        slot.seq.store(seq + 2, Ordering::Release);
        return Some(Protected { index });
    }
    None
}

impl Protected {
    /// True once a fault was absorbed in the mapping or `mark_broken` ran.
    pub fn is_broken(&self) -> bool {
        SLOTS[self.index].broken.load(Ordering::Acquire)
    }

    pub fn mark_broken(&self) {
        SLOTS[self.index].broken.store(true, Ordering::Release);
    }

    /// Frees the slot; must run before the mapping is unmapped, so the
    /// handler never remaps an address range that is no longer ours.
    pub fn release(self) {
        let slot = &SLOTS[self.index];
        // Only the owner writes a live slot: no exchange needed.
        let seq = slot.seq.load(Ordering::Relaxed);
        slot.seq.store(seq + 1, Ordering::Relaxed);
        fence(Ordering::Release);
        slot.start.store(0, Ordering::Relaxed);
        slot.len.store(0, Ordering::Relaxed);
        slot.broken.store(false, Ordering::Relaxed);
        slot.seq.store(seq + 2, Ordering::Release);
    }
}

/// Replaces the protected mapping holding `addr` with zero pages; false
/// when `addr` is in none of them (or the remap failed).
///
/// Async-signal-safe: atomics and one `mmap` system call.
fn absorb(addr: usize) -> bool {
    let high = HIGH.load(Ordering::Acquire).min(CAPACITY);
    for slot in &SLOTS[..high] {
        let seq = slot.seq.load(Ordering::Acquire);
        if seq & 1 == 1 {
            continue;
        }
        let start = slot.start.load(Ordering::Relaxed);
        let len = slot.len.load(Ordering::Relaxed);
        fence(Ordering::Acquire);
        if slot.seq.load(Ordering::Relaxed) != seq
            || len == 0
            || addr < start
            || addr - start >= len
        {
            continue;
        }
        // SAFETY: [start, start + len) is a live mapping of ours (see the
        // module comment for why it cannot have been unmapped and reused);
        // MAP_FIXED replaces it atomically with private zero pages of the
        // same protection, so every pointer into it stays valid.
        let p = unsafe {
            libc::mmap(
                start as *mut libc::c_void,
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_FIXED,
                -1,
                0,
            )
        };
        if p == libc::MAP_FAILED {
            return false;
        }
        slot.broken.store(true, Ordering::Release);
        return true;
    }
    false
}

extern "C" fn on_sigbus(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    // SAFETY: __errno_location returns this thread's errno; the handler
    // puts back whatever mmap or sigaction may have changed.
    let errno = unsafe { *libc::__errno_location() };
    // SAFETY: the kernel passes a valid siginfo with SA_SIGINFO; si_addr
    // is meaningful for kernel-generated SIGBUS (si_code > 0), and only
    // BUS_ADRERR (access past the object's end) is absorbed.
    let absorbed = !info.is_null()
        && unsafe { (*info).si_code } == BUS_ADRERR
        && absorb(unsafe { (*info).si_addr() } as usize);
    if !absorbed {
        chain(sig, info, context);
    }
    // SAFETY: as above.
    unsafe { *libc::__errno_location() = errno };
}

/// Hands a fault that is not ours to the previous handler, or lets the
/// default action (terminate with a core) take it.
fn chain(sig: libc::c_int, info: *mut libc::siginfo_t, context: *mut libc::c_void) {
    if let Some(previous) = PREVIOUS.get() {
        let handler = previous.sa_sigaction;
        if handler != libc::SIG_DFL && handler != libc::SIG_IGN {
            if previous.sa_flags & libc::SA_SIGINFO != 0 {
                // SAFETY: with SA_SIGINFO the previous action's handler
                // has the three-argument signature; we pass what we got.
                let f: extern "C" fn(libc::c_int, *mut libc::siginfo_t, *mut libc::c_void) =
                    unsafe { std::mem::transmute(handler) };
                f(sig, info, context);
            } else {
                // SAFETY: without SA_SIGINFO it is a one-argument handler.
                let f: extern "C" fn(libc::c_int) = unsafe { std::mem::transmute(handler) };
                f(sig);
            }
            return;
        }
    }
    // SAFETY: resetting to SIG_DFL with a zeroed action is valid and
    // async-signal-safe. A fault re-executes the faulting instruction on
    // return and dies of the default action; a SIGBUS sent by a process
    // (si_code <= 0) is raised again, pending until we return.
    unsafe {
        let mut default: libc::sigaction = std::mem::zeroed();
        default.sa_sigaction = libc::SIG_DFL;
        libc::sigemptyset(&mut default.sa_mask);
        libc::sigaction(sig, &default, std::ptr::null_mut());
        if info.is_null() || (*info).si_code <= 0 {
            libc::raise(sig);
        }
    }
}
