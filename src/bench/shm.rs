//! `--shared-memory system|cuda`: the bench's side of Triton's shared
//! memory extensions, as perf_analyzer does it. Each target gets its own
//! regions: one per input of each input set (written once, here) and one
//! per model output, which the server writes into and nobody reads: the
//! output's size times the batch when its shape and datatype fix it, else
//! `--output-shared-memory-size` bytes (as perf_analyzer sizes them).
//! Requests name the regions instead of carrying tensors
//! (`input::encode_*_shm`).
//!
//! Regions are registered with the target before the first step and
//! unregistered after the last (also when the sweep fails), over the run's
//! protocol; the shm objects (or device buffers) go when `Regions` drops.
//! Names are `ssbench_<pid>_<set>_<n>` (`set` counts the region sets of
//! this process), so two benches on one host do not collide. SIGINT/SIGTERM/SIGHUP (`install_signal_cleanup`, the
//! binary only) unregister and unlink whatever is live before exiting.
//!
//! CUDA memory is reached as the server reaches it: the driver library is
//! loaded at run time (cudarc's dynamic loading), so the bench builds and
//! runs without CUDA; `--shared-memory cuda` then fails with
//! "no CUDA device: ...".

use std::{
    cell::Cell,
    collections::HashMap,
    ffi::CString,
    sync::{
        atomic::{AtomicU64, Ordering},
        LazyLock, Mutex,
    },
    time::{Duration, Instant},
};

use anyhow::{anyhow, bail, Context};
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request};
use http_body_util::BodyExt;
use serde_json::json;

use super::{
    cli::{Protocol, SharedMemory, Target},
    grpc,
    input::{element_size, ModelInfo, ShmRefs, TensorData, TensorInfo},
    request::{header_value, http_error},
    wire::{connect_h1, connect_h2, BenchBody, H1, H2},
};
use crate::proto::inference as pb;

/// The CUDA device the bench allocates on (perf_analyzer uses device 0).
const CUDA_DEVICE: i64 = 0;

/// How long unregistering keeps retrying a region the server still holds
/// (a request of the step that had not finished yet).
const UNREGISTER_PATIENCE: Duration = Duration::from_secs(3);

/// One region: its name on the server and where its bytes are.
struct Region {
    name: String,
    byte_size: u64,
    memory: Memory,
}

enum Memory {
    /// A POSIX shm object, unlinked on drop.
    System(ShmObject),
    Cuda(cuda::Buffer),
}

/// One target's regions for the run.
pub struct Regions {
    target: Target,
    kind: SharedMemory,
    /// Per input set (data entry), the regions its requests name.
    pub refs: Vec<ShmRefs>,
    regions: Vec<Region>,
    /// How many of `regions` (from the start) are registered now.
    registered: Cell<usize>,
    /// This set's entry in `LIVE`.
    live_id: u64,
}

impl Regions {
    /// Creates the regions for `sets` (inputs written now) and the model's
    /// outputs at batch size `batch`, for `target`.
    pub fn create(
        kind: SharedMemory,
        target: &Target,
        model: &ModelInfo,
        sets: &[Vec<TensorData>],
        batch: u32,
        output_size: u64,
    ) -> anyhow::Result<Self> {
        let pid = std::process::id();
        let mut regions: Vec<Region> = Vec::new();
        // Unique in this process too (the library may run several benches
        // at once); numbers only: a tensor name may hold characters a URL
        // path or an shm name cannot.
        let live_id = NEXT_LIVE.fetch_add(1, Ordering::Relaxed);
        let mut counter = 0usize;
        let mut name = || {
            counter += 1;
            format!("ssbench_{pid}_{live_id}_{}", counter - 1)
        };
        let mut refs = Vec::with_capacity(sets.len());
        let mut outputs = Vec::with_capacity(model.outputs.len());
        for o in &model.outputs {
            let n = name();
            let size = output_bytes(model, o, batch).unwrap_or(output_size);
            let memory = Memory::new(kind, &n, None, size)
                .with_context(|| format!("creating the region '{n}' for output '{}'", o.name))?;
            outputs.push((n.clone(), size));
            regions.push(Region {
                name: n,
                byte_size: size,
                memory,
            });
        }
        for set in sets {
            let mut inputs = Vec::with_capacity(set.len());
            for t in set {
                let n = name();
                let size = t.raw.len() as u64;
                let memory = Memory::new(kind, &n, Some(&t.raw), size)
                    .with_context(|| format!("creating the region '{n}' for input '{}'", t.name))?;
                inputs.push((n.clone(), size));
                regions.push(Region {
                    name: n,
                    byte_size: size,
                    memory,
                });
            }
            refs.push(ShmRefs {
                inputs,
                outputs: outputs.clone(),
            });
        }
        let out = Self {
            target: target.clone(),
            kind,
            refs,
            regions,
            registered: Cell::new(0),
            live_id,
        };
        out.publish();
        Ok(out)
    }

    /// Lists this set in `LIVE` for the signal handler.
    fn publish(&self) {
        let entry = LiveSet {
            target: self.target.clone(),
            kind: self.kind,
            names: self.regions.iter().map(|r| r.name.clone()).collect(),
            keys: self
                .regions
                .iter()
                .filter_map(|r| match &r.memory {
                    Memory::System(o) => Some(o.key.clone()),
                    Memory::Cuda(_) => None,
                })
                .collect(),
        };
        live().insert(self.live_id, entry);
    }

    /// Registers every region with the target; on a refusal, the ones
    /// already registered stay so (`unregister` removes them) and the
    /// error carries the server's reason.
    pub async fn register(&self) -> anyhow::Result<()> {
        let mut conn = Conn::open(&self.target).await?;
        for r in &self.regions[self.registered.get()..] {
            conn.register(&self.target, r).await.with_context(|| {
                format!(
                    "{}: cannot register {} shared memory region '{}' ({} bytes)",
                    self.target.label,
                    kind_word(self.kind),
                    r.name,
                    r.byte_size
                )
            })?;
            self.registered.set(self.registered.get() + 1);
        }
        Ok(())
    }

    /// Unregisters what `register` registered. A region a late request
    /// still holds is retried for a few seconds; the first lasting
    /// failure is returned after every region was tried.
    pub async fn unregister(&self) -> anyhow::Result<()> {
        let n = self.registered.get();
        if n == 0 {
            return Ok(());
        }
        let mut conn = Conn::open(&self.target).await?;
        let mut first_error = None;
        for r in &self.regions[..n] {
            let deadline = Instant::now() + UNREGISTER_PATIENCE;
            loop {
                match conn.unregister(&self.target, self.kind, &r.name).await {
                    Ok(()) => break,
                    Err(e) if Instant::now() >= deadline => {
                        first_error.get_or_insert(e.context(format!(
                            "{}: cannot unregister shared memory region '{}'",
                            self.target.label, r.name
                        )));
                        break;
                    }
                    Err(_) => {
                        monoio::time::sleep(Duration::from_millis(50)).await;
                        // The connection may be what failed.
                        conn = Conn::open(&self.target).await?;
                    }
                }
            }
        }
        self.registered.set(0);
        first_error.map_or(Ok(()), Err)
    }
}

impl Drop for Regions {
    fn drop(&mut self) {
        live().remove(&self.live_id);
    }
}

/// Bytes of output `o` at batch size `batch`, when its shape and datatype
/// fix them (`None`: a variable dimension or BYTES).
fn output_bytes(model: &ModelInfo, o: &TensorInfo, batch: u32) -> Option<u64> {
    let batched = model.max_batch_size > 0;
    let dims = o.shape.iter().skip(usize::from(batched));
    let mut bytes = element_size(&o.datatype)? as u64;
    for &d in dims {
        bytes = bytes.checked_mul(u64::try_from(d).ok()?)?;
    }
    if batched {
        bytes = bytes.checked_mul(u64::from(batch))?;
    }
    Some(bytes)
}

fn kind_word(kind: SharedMemory) -> &'static str {
    match kind {
        SharedMemory::Cuda => "CUDA",
        _ => "system",
    }
}

impl Memory {
    fn new(kind: SharedMemory, name: &str, data: Option<&[u8]>, size: u64) -> anyhow::Result<Self> {
        let len = usize::try_from(size).context("region size exceeds the address space")?;
        match kind {
            SharedMemory::System => Ok(Memory::System(ShmObject::create(name, data, len)?)),
            SharedMemory::Cuda => Ok(Memory::Cuda(
                cuda::Buffer::new(CUDA_DEVICE, data, len).map_err(anyhow::Error::msg)?,
            )),
            SharedMemory::None => bail!("internal: a shared memory region without a kind"),
        }
    }
}

/// A POSIX shm object `/<name>` of `len` bytes; unlinked on drop (the
/// server keeps its own mapping until it unregisters).
struct ShmObject {
    key: String,
}

impl ShmObject {
    fn create(name: &str, data: Option<&[u8]>, len: usize) -> anyhow::Result<Self> {
        let key = format!("/{name}");
        let c_key = CString::new(key.clone()).context("shm name with a NUL byte")?;
        // A leftover of a killed bench that had our pid: no live process
        // can own this name but us.
        // SAFETY: c_key is a valid NUL-terminated string.
        unsafe { libc::shm_unlink(c_key.as_ptr()) };
        // SAFETY: as above; the result is checked.
        let fd = unsafe {
            libc::shm_open(
                c_key.as_ptr(),
                libc::O_RDWR | libc::O_CREAT | libc::O_EXCL,
                0o600,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error()).context(format!("shm_open {key}"));
        }
        // From here on, drop unlinks the name whatever fails next.
        let obj = Self { key };
        // SAFETY: fd was just opened and is owned here only.
        let fd = unsafe { <std::os::fd::OwnedFd as std::os::fd::FromRawFd>::from_raw_fd(fd) };
        let file = std::fs::File::from(fd);
        // A zero-byte object cannot be mapped: keep at least one byte.
        file.set_len(len.max(1) as u64)
            .with_context(|| format!("sizing {} to {len} bytes", obj.key))?;
        if let Some(data) = data {
            use std::os::unix::fs::FileExt;
            file.write_all_at(data, 0)
                .with_context(|| format!("writing {} bytes into {}", data.len(), obj.key))?;
        }
        Ok(obj)
    }
}

impl Drop for ShmObject {
    fn drop(&mut self) {
        unlink(&self.key);
    }
}

fn unlink(key: &str) {
    if let Ok(c) = CString::new(key) {
        // SAFETY: c is a valid NUL-terminated string.
        unsafe { libc::shm_unlink(c.as_ptr()) };
    }
}

/// One control connection to a target for a batch of (un)registrations.
enum Conn {
    Http(H1),
    Grpc(H2),
}

impl Conn {
    async fn open(target: &Target) -> anyhow::Result<Self> {
        Ok(match target.protocol {
            Protocol::Http => Conn::Http(connect_h1(target).await?),
            Protocol::Grpc => Conn::Grpc(connect_h2(target).await?),
        })
    }

    async fn register(&mut self, target: &Target, r: &Region) -> anyhow::Result<()> {
        match (self, &r.memory) {
            (Conn::Http(h), Memory::System(o)) => {
                let body = json!({"key": o.key, "offset": 0, "byte_size": r.byte_size});
                let path = format!("/v2/systemsharedmemory/region/{}/register", r.name);
                http_post(h, target, &path, body.to_string().into()).await
            }
            (Conn::Http(h), Memory::Cuda(b)) => {
                use base64::Engine as _;
                let b64 = base64::engine::general_purpose::STANDARD.encode(b.handle());
                let body = json!({"raw_handle": {"b64": b64}, "device_id": CUDA_DEVICE,
                                  "byte_size": r.byte_size});
                let path = format!("/v2/cudasharedmemory/region/{}/register", r.name);
                http_post(h, target, &path, body.to_string().into()).await
            }
            (Conn::Grpc(g), Memory::System(o)) => {
                let _: pb::SystemSharedMemoryRegisterResponse = grpc::call(
                    g,
                    &target.authority,
                    "SystemSharedMemoryRegister",
                    &pb::SystemSharedMemoryRegisterRequest {
                        name: r.name.clone(),
                        key: o.key.clone(),
                        offset: 0,
                        byte_size: r.byte_size,
                    },
                )
                .await?;
                Ok(())
            }
            (Conn::Grpc(g), Memory::Cuda(b)) => {
                let _: pb::CudaSharedMemoryRegisterResponse = grpc::call(
                    g,
                    &target.authority,
                    "CudaSharedMemoryRegister",
                    &pb::CudaSharedMemoryRegisterRequest {
                        name: r.name.clone(),
                        raw_handle: b.handle().to_vec(),
                        device_id: CUDA_DEVICE,
                        byte_size: r.byte_size,
                    },
                )
                .await?;
                Ok(())
            }
        }
    }

    async fn unregister(
        &mut self,
        target: &Target,
        kind: SharedMemory,
        name: &str,
    ) -> anyhow::Result<()> {
        let cuda = kind == SharedMemory::Cuda;
        match self {
            Conn::Http(h) => {
                let path = format!(
                    "/v2/{}sharedmemory/region/{name}/unregister",
                    if cuda { "cuda" } else { "system" }
                );
                http_post(h, target, &path, Bytes::new()).await
            }
            Conn::Grpc(g) if cuda => {
                let _: pb::CudaSharedMemoryUnregisterResponse = grpc::call(
                    g,
                    &target.authority,
                    "CudaSharedMemoryUnregister",
                    &pb::CudaSharedMemoryUnregisterRequest { name: name.into() },
                )
                .await?;
                Ok(())
            }
            Conn::Grpc(g) => {
                let _: pb::SystemSharedMemoryUnregisterResponse = grpc::call(
                    g,
                    &target.authority,
                    "SystemSharedMemoryUnregister",
                    &pb::SystemSharedMemoryUnregisterRequest { name: name.into() },
                )
                .await?;
                Ok(())
            }
        }
    }
}

/// POST with a JSON body; a non-2xx answer is an error with the server's reason.
async fn http_post(h: &mut H1, target: &Target, path: &str, body: Bytes) -> anyhow::Result<()> {
    let mut req = Request::new(BenchBody::Once(Some(body)));
    *req.method_mut() = Method::POST;
    *req.uri_mut() = path
        .parse()
        .map_err(|e| anyhow!("bad path '{path}': {e}"))?;
    req.headers_mut()
        .insert(header::HOST, header_value(&target.authority)?);
    req.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    h.ready()
        .await
        .map_err(|e| anyhow!("connection to {} lost: {e}", target.addr))?;
    let resp = h
        .send_request(req)
        .await
        .map_err(|e| anyhow!("POST {path} on {}: {e}", target.addr))?;
    let status = resp.status();
    let body = resp
        .into_body()
        .collect()
        .await
        .map_err(|e| anyhow!("POST {path}: {e}"))?
        .to_bytes();
    if status.is_success() {
        Ok(())
    } else {
        Err(anyhow!(http_error(status, &body)))
    }
}

/// Unregisters whatever `sets` still have registered: after the sweep,
/// whether it succeeded or not. The first failure is returned.
pub async fn unregister_all(sets: &[Option<Regions>]) -> anyhow::Result<()> {
    let mut first = None;
    for s in sets.iter().flatten() {
        if let Err(e) = s.unregister().await {
            first.get_or_insert(e);
        }
    }
    first.map_or(Ok(()), Err)
}

/// What the signal handler must undo for one target.
struct LiveSet {
    target: Target,
    kind: SharedMemory,
    names: Vec<String>,
    keys: Vec<String>,
}

static NEXT_LIVE: AtomicU64 = AtomicU64::new(0);

/// Touched only when a run creates or drops its regions, never per request.
fn live() -> std::sync::MutexGuard<'static, HashMap<u64, LiveSet>> {
    static LIVE: LazyLock<Mutex<HashMap<u64, LiveSet>>> = LazyLock::new(Mutex::default);
    // A panic while holding it leaves a usable map: take it anyway.
    LIVE.lock().unwrap_or_else(|e| e.into_inner())
}

/// Blocks SIGINT, SIGTERM and SIGHUP in this thread (and so in every
/// thread started after it) and starts a thread that waits for them: on
/// one it unregisters every live region from its server, unlinks the shm
/// objects and exits with 128 + the signal. Call before any other thread
/// starts.
pub fn install_signal_cleanup() -> anyhow::Result<()> {
    // SAFETY: sigset_t is plain data, initialised by sigemptyset before use.
    let mut set: libc::sigset_t = unsafe { std::mem::zeroed() };
    // SAFETY: `set` is a valid sigset_t; the signal numbers are valid.
    unsafe {
        libc::sigemptyset(&mut set);
        for s in [libc::SIGINT, libc::SIGTERM, libc::SIGHUP] {
            libc::sigaddset(&mut set, s);
        }
    }
    // SAFETY: `set` is initialised; the old mask is not wanted.
    let rc = unsafe { libc::pthread_sigmask(libc::SIG_BLOCK, &set, std::ptr::null_mut()) };
    if rc != 0 {
        bail!(
            "cannot block SIGINT for the shared memory cleanup: {}",
            std::io::Error::from_raw_os_error(rc)
        );
    }
    std::thread::Builder::new()
        .name("bench-signals".into())
        .spawn(move || {
            let mut sig = 0;
            // SAFETY: `set` is initialised and blocked in this thread.
            let rc = unsafe { libc::sigwait(&set, &mut sig) };
            if rc != 0 {
                tracing::warn!(rc, "sigwait failed: no shared memory cleanup on signals");
                return;
            }
            let n = cleanup_live();
            eprintln!(
                "shardserve-bench: signal {sig}: unregistered and removed {n} shared memory region(s)"
            );
            std::process::exit(128 + sig);
        })
        .context("cannot start the signal thread")?;
    Ok(())
}

/// The signal path: every live region unregistered (bounded in time) and
/// every shm object unlinked. Returns how many regions it handled.
fn cleanup_live() -> usize {
    let sets: Vec<LiveSet> = live().drain().map(|(_, s)| s).collect();
    let count = sets.iter().map(|s| s.names.len()).sum();
    for s in &sets {
        s.keys.iter().for_each(|k| unlink(k));
    }
    let rt = crate::shard::uring::runtime_builder::<monoio::FusionDriver>()
        .enable_timer()
        .build();
    match rt {
        Ok(mut rt) => rt.block_on(async {
            for s in &sets {
                let work = async {
                    let mut conn = Conn::open(&s.target).await?;
                    for name in &s.names {
                        // The workers still run: a request may hold the
                        // region for a moment; the timeout bounds this.
                        while let Err(e) = conn.unregister(&s.target, s.kind, name).await {
                            tracing::debug!(error = %e, name, "unregister on signal: retrying");
                            monoio::time::sleep(Duration::from_millis(20)).await;
                            conn = Conn::open(&s.target).await?;
                        }
                    }
                    anyhow::Ok(())
                };
                match monoio::time::timeout(Duration::from_secs(3), work).await {
                    Ok(Ok(())) => {}
                    Ok(Err(e)) => eprintln!(
                        "shardserve-bench: unregistering from {}: {e:#}",
                        s.target.label
                    ),
                    Err(_) => eprintln!(
                        "shardserve-bench: unregistering from {}: timed out",
                        s.target.label
                    ),
                }
            }
        }),
        Err(e) => eprintln!("shardserve-bench: cannot unregister regions: {e}"),
    }
    count
}

#[cfg(feature = "cuda")]
mod cuda {
    //! Device buffers shared by CUDA IPC handles, through the driver API
    //! loaded at run time (as `gpu::cuda` does for the server). Never run
    //! on this project's CI machines (no GPU): there only the "no CUDA
    //! device" branch runs; `scripts/device_bench_shm.sh` runs the rest.

    use std::{panic::AssertUnwindSafe, sync::Arc};

    use cudarc::driver::{result, sys, CudaContext};

    /// `len` bytes of device memory, freed on drop.
    pub struct Buffer {
        ctx: Arc<CudaContext>,
        ptr: sys::CUdeviceptr,
        handle: [u8; 64],
    }

    impl Buffer {
        pub fn new(device: i64, data: Option<&[u8]>, len: usize) -> Result<Self, String> {
            // SAFETY: only tries to dlopen the driver library.
            if !unsafe { sys::is_culib_present() } {
                return Err("no CUDA device: no CUDA driver (libcuda.so.1) found".into());
            }
            // cudarc panics where a symbol is missing: a refusal, not a crash.
            std::panic::catch_unwind(AssertUnwindSafe(|| Self::alloc(device, data, len)))
                .unwrap_or_else(|_| {
                    Err("no CUDA device: the CUDA driver library could not be used".into())
                })
        }

        fn alloc(device: i64, data: Option<&[u8]>, len: usize) -> Result<Self, String> {
            result::init().map_err(|e| format!("no CUDA device: cuInit: {e}"))?;
            let count = result::device::get_count()
                .map_err(|e| format!("no CUDA device: cuDeviceGetCount: {e}"))?;
            if i64::from(count) <= device {
                return Err(format!(
                    "no CUDA device: device {device} wanted, the driver reports {count}"
                ));
            }
            let ordinal = usize::try_from(device).map_err(|_| format!("bad device {device}"))?;
            let ctx = CudaContext::new(ordinal)
                .map_err(|e| format!("retaining the context of CUDA device {device}: {e}"))?;
            ctx.bind_to_thread()
                .map_err(|e| format!("binding the context of CUDA device {device}: {e}"))?;
            // cuMemAlloc refuses 0 bytes.
            // SAFETY: the context is current; the memory is written or left
            // for the server to write before anyone reads it.
            let ptr = unsafe { result::malloc_sync(len.max(1)) }
                .map_err(|e| format!("cuMemAlloc of {len} bytes on device {device}: {e}"))?;
            let buf = Self {
                ctx,
                ptr,
                handle: [0; 64],
            };
            if let Some(d) = data {
                // SAFETY: `ptr` holds at least `d.len()` (== len) bytes.
                unsafe { result::memcpy_htod_sync(buf.ptr, d) }
                    .map_err(|e| format!("cuMemcpyHtoD of {} bytes: {e}", d.len()))?;
            }
            let mut raw = sys::CUipcMemHandle_st { reserved: [0; 64] };
            // SAFETY: valid out-pointer; `ptr` is a live allocation of this context.
            let rc = unsafe { sys::cuIpcGetMemHandle(&mut raw, buf.ptr) };
            if rc != sys::CUresult::CUDA_SUCCESS {
                return Err(format!("cuIpcGetMemHandle: {rc:?}"));
            }
            let mut buf = buf;
            for (d, s) in buf.handle.iter_mut().zip(raw.reserved) {
                *d = s as u8;
            }
            Ok(buf)
        }

        pub fn handle(&self) -> &[u8; 64] {
            &self.handle
        }
    }

    impl Drop for Buffer {
        fn drop(&mut self) {
            if self.ctx.bind_to_thread().is_err() {
                return;
            }
            // SAFETY: allocated by `alloc`, freed once; the server has
            // unregistered (closed its handle) or the process is ending.
            if let Err(e) = unsafe { result::free_sync(self.ptr) } {
                tracing::warn!(error = %e, "cuMemFree failed");
            }
        }
    }
}

#[cfg(not(feature = "cuda"))]
mod cuda {
    /// Never constructed: built without the `cuda` feature.
    pub struct Buffer {
        handle: [u8; 64],
    }

    impl Buffer {
        pub fn new(_device: i64, _data: Option<&[u8]>, _len: usize) -> Result<Self, String> {
            Err("no CUDA device: this shardserve-bench was built without the cuda feature".into())
        }

        pub fn handle(&self) -> &[u8; 64] {
            &self.handle
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tensor(datatype: &str, shape: &[i64]) -> TensorInfo {
        TensorInfo {
            name: "OUT".into(),
            datatype: datatype.into(),
            shape: shape.to_vec(),
        }
    }

    #[test]
    fn outputs_of_a_fixed_size_get_it_times_the_batch() {
        let mut m = ModelInfo {
            name: "m".into(),
            version: String::new(),
            max_batch_size: 8,
            inputs: Vec::new(),
            outputs: Vec::new(),
            sequence: None,
        };
        assert_eq!(output_bytes(&m, &tensor("INT32", &[-1, 16]), 4), Some(256));
        assert_eq!(output_bytes(&m, &tensor("FP16", &[-1, 2, 3]), 1), Some(12));
        // Variable or BYTES: --output-shared-memory-size decides.
        assert_eq!(output_bytes(&m, &tensor("INT32", &[-1, -1]), 4), None);
        assert_eq!(output_bytes(&m, &tensor("BYTES", &[-1, 16]), 4), None);
        // Not batched: the shape is the whole tensor, -b does not apply.
        m.max_batch_size = 0;
        assert_eq!(output_bytes(&m, &tensor("INT64", &[3]), 4), Some(24));
    }

    #[test]
    fn system_objects_hold_the_data_and_go_on_drop() {
        let name = format!("ssbench_unit_{}", std::process::id());
        let obj = ShmObject::create(&name, Some(b"abc"), 3).expect("creates");
        let path = format!("/dev/shm/{name}");
        assert_eq!(std::fs::read(&path).expect("exists"), b"abc");
        // Created exclusively: a second one of the name replaces the first
        // (a killed bench's leftover), it does not fail.
        let again = ShmObject::create(&name, None, 8).expect("replaces");
        assert_eq!(std::fs::metadata(&path).expect("exists").len(), 8);
        drop(obj);
        drop(again);
        assert!(!std::path::Path::new(&path).exists());
    }
}
