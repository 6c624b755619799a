//! Tuning profiles (`tuning/*.toml`): which CPUs run shards, which shards
//! accept connections and which host model instances, ring capacity and
//! ONNX Runtime threads. Unknown keys are errors, so a typo never silently
//! falls back to a default.

use std::path::{Path, PathBuf};

use anyhow::{bail, Context};
use serde::Deserialize;

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct TuningProfile {
    pub name: Option<String>,
    pub description: Option<String>,
    #[serde(default)]
    pub shards: ShardsSection,
    #[serde(default)]
    pub rings: RingsSection,
    #[serde(default)]
    pub onnxruntime: OnnxRuntimeSection,
    #[serde(default)]
    pub runtime: RuntimeSection,
    #[serde(default)]
    pub compute: ComputeSection,
    #[serde(default)]
    pub gpu: GpuSection,
}

/// Host memory for GPU copies.
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct GpuSection {
    /// Bound of each NUMA node's pinned staging pool, in bytes
    /// (`--pinned-memory-pool-byte-size` overrides it; default 256 MiB).
    /// Buffers are made on first use, so a machine without GPUs pays
    /// nothing for it.
    pub pinned_pool_bytes: Option<usize>,
}

/// Compute worker threads (instances that do not run inline on a shard).
#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ComputeSection {
    /// Nice value of compute threads. Default 0: measured on one core
    /// shared by a shard and an unbatched `mlp_onnx` worker
    /// (`scripts/bench_compute_nice.sh`), nice 10 cost about a third of the
    /// throughput at concurrency 64 with health probes running alongside,
    /// for no gain in the probes' p99 (under 1 ms either way: a woken
    /// reactor already preempts the worker under CFS). Raise it where I/O
    /// latency must win over inference throughput.
    pub nice: Option<i32>,
    /// Microseconds an idle compute worker keeps looking for its next
    /// batch, yielding the CPU between looks, before it parks on a futex
    /// (0: park at once). Costs CPU only right after work, never at rest.
    /// Default 0 until measured on a quiet machine: on a 2-core box busy
    /// with builds, 50 us (with `pipeline_depth` 2) showed more CPU per
    /// inference at concurrency 64, not less (a spinning worker takes its
    /// share of an oversubscribed core), the spin's own part not isolated;
    /// at concurrency 1 the next request comes a client round trip later,
    /// longer than a useful spin. Measure with `scripts/bench_handoff.sh`
    /// and `NEW_ARGS="--tuning-profile FILE"`.
    pub spin_us: Option<u64>,
    /// Batches a model's scheduler may hand one compute worker before the
    /// first comes back (1: one at a time). Only the default (FIFO)
    /// scheduler's requests without a queue timeout are handed ahead (see
    /// `ModelScheduler::may_queue_behind`). Default 4, part of the
    /// shared-core default measured together (see
    /// `RuntimeSection::DEFAULT_SCHED_BATCH`); with ordinary preemption
    /// (`sched_batch = false`) depth 2 measured worse than 1 on the 2-core
    /// box, since the shard then has work to preempt every execution with.
    pub pipeline_depth: Option<usize>,
    /// Microseconds a compute worker with more batches waiting in its ring
    /// may keep finished ones before it wakes its shard (0: wake after
    /// each). Only matters with `pipeline_depth` above 1. Default 500, part
    /// of the shared-core default.
    pub reply_hold_us: Option<u64>,
    /// Longest (µs) a compute worker runs items back to back before it
    /// wakes its shard with what it holds and yields the CPU (0: never).
    /// With `[runtime] sched_batch` a packet does not get its shard the
    /// core a worker shares; the shard then waits for the worker to sleep
    /// or for the scheduler tick (4 ms at HZ=250), which held the
    /// `/v2/health/live` p99 at 2.6-4.0 ms without a slice. Default 500:
    /// on lent 16-core machines (unbatched `mlp_onnx`, one shared core,
    /// concurrency 64, 7 rounds over 3 machines) 500 µs gave a health p99
    /// of 0.7-2.2 ms (median 0.9) at 0.87-1.08× inline throughput; 250 µs
    /// yielded too often (4 switches per inference, 0.73-0.78×), 1000 µs
    /// was as fast with a p99 of 1.0 ms. On the 2-core VM the p99 is set by
    /// the shard's own queue at saturation, so no slice changes it there.
    pub slice_us: Option<u64>,
}

impl ComputeSection {
    pub const DEFAULT_NICE: i32 = 0;
    pub const DEFAULT_SPIN_US: u64 = 0;
    pub const DEFAULT_PIPELINE_DEPTH: usize = 4;
    pub const DEFAULT_REPLY_HOLD_US: u64 = 500;
    pub const DEFAULT_SLICE_US: u64 = 500;
    /// A deeper pipeline only holds requests out of the queue longer.
    pub const MAX_PIPELINE_DEPTH: usize = 16;

    pub fn nice(&self) -> i32 {
        self.nice.unwrap_or(Self::DEFAULT_NICE).clamp(0, 19)
    }

    /// `spin_us`, at most 10 ms (longer is a busy core, not a hand-off).
    pub fn spin(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.spin_us.unwrap_or(Self::DEFAULT_SPIN_US).min(10_000))
    }

    /// `reply_hold_us`, at most 10 ms (results wait at most this plus one
    /// batch's execution).
    pub fn reply_hold(&self) -> std::time::Duration {
        std::time::Duration::from_micros(
            self.reply_hold_us
                .unwrap_or(Self::DEFAULT_REPLY_HOLD_US)
                .min(10_000),
        )
    }

    /// `slice_us`, at most 100 ms.
    pub fn slice(&self) -> std::time::Duration {
        std::time::Duration::from_micros(
            self.slice_us.unwrap_or(Self::DEFAULT_SLICE_US).min(100_000),
        )
    }

    pub fn pipeline_depth(&self) -> usize {
        self.pipeline_depth
            .unwrap_or(Self::DEFAULT_PIPELINE_DEPTH)
            .clamp(1, Self::MAX_PIPELINE_DEPTH)
    }
}

/// Which I/O driver the shards' monoio runtimes use.
#[derive(Debug, Clone, Copy, Default, Deserialize, PartialEq, Eq)]
#[serde(rename_all = "kebab-case")]
pub enum IoDriver {
    /// io_uring where the kernel allows it, else epoll; epoll when the
    /// shards spin before parking (see [`IoDriver::resolve`]).
    #[default]
    Auto,
    /// io_uring or fail to start.
    IoUring,
    /// epoll (also where io_uring would work).
    Epoll,
}

impl IoDriver {
    /// The driver `Auto` stands for given the shards' spin window. With a
    /// window, epoll: a spinning io_uring runtime learns of a readable
    /// socket only through a `poll(2)` of its epoll instance followed by a
    /// park (`io_uring_enter`, `epoll_wait`), where the epoll runtime's
    /// spinning round is the one `epoll_wait` that delivers it. Measured on
    /// the 2-core VM, `simple` at concurrency 1 with a 250 µs window:
    /// HTTP p50 17.3 → 13.2 µs, gRPC 20.6 → 18.2 µs
    /// (`tuning/low-latency.toml` has the command). Without a window the
    /// two measured equal, and io_uring stays.
    pub fn resolve(self, spin: std::time::Duration) -> Self {
        match self {
            Self::Auto if !spin.is_zero() => Self::Epoll,
            other => other,
        }
    }
}

impl std::str::FromStr for IoDriver {
    type Err = String;
    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "auto" => Ok(Self::Auto),
            "io-uring" | "io_uring" | "iouring" => Ok(Self::IoUring),
            "epoll" => Ok(Self::Epoll),
            other => Err(format!(
                "unknown I/O driver '{other}': use auto, io-uring or epoll"
            )),
        }
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RuntimeSection {
    pub driver: Option<IoDriver>,
    /// Microseconds a shard keeps polling its ring after a request finished
    /// before it parks (0: park at once). See `RuntimeSection::DEFAULT_SPIN_US`.
    pub spin_us: Option<u64>,
    /// Run shard threads as `SCHED_BATCH` (default true): a shard's
    /// wake-up (a packet, a finished batch) then no longer preempts whatever
    /// runs on its core at once, only at the scheduler's next tick or when
    /// that thread sleeps. On a core a shard shares with a compute worker
    /// this turns one preemption per network event into one per drained
    /// batch. On a core of its own a shard wakes to an idle CPU and nothing
    /// changes. See `RuntimeSection::DEFAULT_SCHED_BATCH` for the figures.
    pub sched_batch: Option<bool>,
}

impl RuntimeSection {
    /// On, with `[compute]` pipeline_depth 4, reply_hold_us 500 and
    /// slice_us 500: the shared-core default, measured together on lent
    /// 16-core machines (`scripts/device_latency.sh`, server on one core,
    /// generator and wrk on cores of their own). Unbatched `mlp_onnx` at
    /// concurrency 64 on its compute worker, 7 rounds over 3 machines:
    /// 0.87-1.08× the inline throughput (median 0.95), `/v2/health/live`
    /// p99 alongside 0.7-2.2 ms (median 0.9); inline's p99 is 11-36 ms and
    /// the old default (ordinary preemption, depth 1) gave 0.55-0.67× at
    /// 16-19 context switches per inference. The cost falls on dynamically
    /// batched models, where a shard's packets no longer preempt the batch
    /// running on its core: `mlp_onnx_dyna` at concurrency 64 measured
    /// +14 %/+9 % (HTTP/gRPC, one round) and -8 %/-7 % (medians of three
    /// rounds, another machine), and an earlier session -8 %/-19 %, each
    /// within rounds that spread ±15 %. Set it false for a core that runs a
    /// batched model's worker beside its shard and nothing unbatched.
    pub const DEFAULT_SCHED_BATCH: bool = true;

    pub fn sched_batch(&self) -> bool {
        self.sched_batch.unwrap_or(Self::DEFAULT_SCHED_BATCH)
    }

    /// Default spin window: off. The window buys c=1 latency with CPU
    /// (on the 2-core VM, with the epoll driver, `simple` c=1 p50 about
    /// 28 → 13 µs over HTTP; `tuning/low-latency.toml` has the figures)
    /// and costs nothing at idle, but under light steady load every
    /// request keeps its shard busy for up to the window after it, which
    /// a shared node pays for in CPU time; so it is a profile setting
    /// (`tuning/low-latency.toml`) rather than the default. (It first
    /// stayed off because it made gRPC slower; that was fixed by the
    /// spinner's relay task, `shard::spin`.)
    pub const DEFAULT_SPIN_US: u64 = 0;

    pub fn spin(&self) -> std::time::Duration {
        std::time::Duration::from_micros(self.spin_us.unwrap_or(Self::DEFAULT_SPIN_US))
    }
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct ShardsSection {
    /// Logical CPUs to run shards on, one shard each (default: all usable).
    pub cpus: Option<Vec<usize>>,
    /// Number of shards on the first usable CPUs, when `cpus` is not given.
    pub count: Option<usize>,
    /// Shard indices that bind the listeners (default: all).
    pub accept: Option<Vec<usize>>,
    /// Shard indices that host model instances (default: all).
    pub compute: Option<Vec<usize>>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct RingsSection {
    pub capacity: Option<usize>,
}

#[derive(Debug, Clone, Default, Deserialize, PartialEq)]
#[serde(deny_unknown_fields)]
pub struct OnnxRuntimeSection {
    pub intra_op_threads: Option<usize>,
}

impl TuningProfile {
    pub fn parse(text: &str, origin: &Path) -> anyhow::Result<Self> {
        toml::from_str(text).with_context(|| format!("invalid tuning profile {}", origin.display()))
    }

    /// Loads `NAME` from `tuning/NAME.toml` (in the working directory, the
    /// executable's package or its checkout), or a path to a file.
    pub fn load(name_or_path: &str) -> anyhow::Result<Self> {
        let path = Self::resolve(name_or_path)?;
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("cannot read {}", path.display()))?;
        Self::parse(&text, &path)
    }

    fn resolve(name_or_path: &str) -> anyhow::Result<PathBuf> {
        let direct = PathBuf::from(name_or_path);
        if direct.is_file() {
            return Ok(direct);
        }
        let file = format!("{name_or_path}.toml");
        let mut candidates = vec![PathBuf::from("tuning").join(&file)];
        if let Ok(exe) = std::env::current_exe() {
            // A package (`<prefix>/bin/shardserve`, `<prefix>/tuning/`),
            // then a build tree (`<checkout>/target/release/shardserve`).
            let prefix = exe.parent().and_then(Path::parent);
            for root in [prefix, prefix.and_then(Path::parent)]
                .into_iter()
                .flatten()
            {
                candidates.push(root.join("tuning").join(&file));
            }
        }
        for c in &candidates {
            if c.is_file() {
                return Ok(c.clone());
            }
        }
        bail!(
            "tuning profile '{name_or_path}' not found (looked for a file and in {})",
            candidates
                .iter()
                .map(|c| c.display().to_string())
                .collect::<Vec<_>>()
                .join(", ")
        )
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_every_section() {
        let p = TuningProfile::parse(
            "name = \"x\"\n[shards]\ncpus = [0, 1]\naccept = [0]\ncompute = [1]\n[rings]\ncapacity = 256\n[onnxruntime]\nintra_op_threads = 2\n[runtime]\ndriver = \"epoll\"\nspin_us = 40\n[gpu]\npinned_pool_bytes = 1024\n",
            Path::new("x.toml"),
        )
        .unwrap();
        assert_eq!(p.shards.cpus, Some(vec![0, 1]));
        assert_eq!(p.shards.compute, Some(vec![1]));
        assert_eq!(p.rings.capacity, Some(256));
        assert_eq!(p.onnxruntime.intra_op_threads, Some(2));
        assert_eq!(p.runtime.driver, Some(IoDriver::Epoll));
        assert_eq!(p.runtime.spin(), std::time::Duration::from_micros(40));
        assert_eq!(
            TuningProfile::default().runtime.spin(),
            std::time::Duration::from_micros(RuntimeSection::DEFAULT_SPIN_US)
        );
        assert_eq!(p.gpu.pinned_pool_bytes, Some(1024));
    }

    #[test]
    fn auto_driver_is_epoll_only_with_a_spin_window() {
        use std::time::Duration;
        let window = Duration::from_micros(250);
        assert_eq!(IoDriver::Auto.resolve(Duration::ZERO), IoDriver::Auto);
        assert_eq!(IoDriver::Auto.resolve(window), IoDriver::Epoll);
        assert_eq!(IoDriver::IoUring.resolve(window), IoDriver::IoUring);
        assert_eq!(IoDriver::Epoll.resolve(Duration::ZERO), IoDriver::Epoll);
    }

    #[test]
    fn unknown_keys_are_errors() {
        let e = TuningProfile::parse("[shards]\ncpu = [0]\n", Path::new("bad.toml")).unwrap_err();
        assert!(format!("{e:#}").contains("cpu"), "{e:#}");
    }

    #[test]
    fn shipped_profiles_parse() {
        let dir = Path::new(env!("CARGO_MANIFEST_DIR")).join("tuning");
        for entry in std::fs::read_dir(dir).unwrap() {
            let path = entry.unwrap().path();
            let text = std::fs::read_to_string(&path).unwrap();
            TuningProfile::parse(&text, &path).unwrap();
        }
    }
}
