//! Command line: perf_analyzer's flags where it has one, so a user's
//! perf_analyzer command works with the binary name changed.

use std::{
    net::{SocketAddr, ToSocketAddrs},
    path::PathBuf,
    time::Duration,
};

use clap::{Parser, ValueEnum};
use http::{HeaderName, HeaderValue};

use super::tls::{ClientTls, ClientTlsOptions};

/// An error in the arguments (exit code 2), as opposed to a run failure (1).
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct UsageError(pub String);

fn usage(msg: impl Into<String>) -> anyhow::Error {
    UsageError(msg.into()).into()
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Protocol {
    Http,
    Grpc,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum TensorFormat {
    Binary,
    Json,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Distribution {
    Constant,
    Poisson,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
#[value(rename_all = "snake_case")]
pub enum MeasurementMode {
    TimeWindows,
    CountWindows,
}

/// Where request inputs and outputs travel: in the request and response
/// bodies, or in shared memory regions the bench registers with the server.
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum SharedMemory {
    None,
    System,
    Cuda,
}

/// perf_analyzer's default `--output-shared-memory-size`: 100 KiB.
pub const DEFAULT_OUTPUT_SHM_SIZE: u64 = 100 * 1024;

/// What each request does: an inference, or the server's liveness endpoint
/// (a trivial request, to measure the generator's own ceiling).
#[derive(Debug, Clone, Copy, PartialEq, Eq, ValueEnum)]
pub enum Endpoint {
    Infer,
    Live,
}

const AFTER_HELP: &str = "\
Load modes: --concurrency-range start:end:step (closed loop; also a comma list 1,8,64) or
--request-rate-range start:end:step (open loop, infer/s; latency is measured from each request's
intended send time, so a server or generator that falls behind shows as latency, not as fewer
requests). Without either, concurrency 1.

Targets: -u host:port (default localhost:8000 for http, localhost:8001 for grpc), or several
--target host:port[,http|grpc]; --compare host:port adds a second server. Steps are interleaved
between targets and ratios to the first target are printed.

CSV (-f) has perf_analyzer's columns, latencies in microseconds; with several targets (--compare,
--target) one file holds every server's rows, each server's in turn, and a 17th column, Server.
Measured: Inferences/Second, p50/p90/p95/p99/Avg latency; Server Queue / Compute Input / Infer / Output from the statistics
extension (0 when the server has none); Network+Server Send/Recv is the average latency minus the
server-side total. Client Send, Client Recv, request/response and response wait are not measured
and written as 0.

TLS (perf_analyzer's options): gRPC with --ssl-grpc-use-ssl (--ssl-grpc-root-certifications-file,
--ssl-grpc-certificate-chain-file and --ssl-grpc-private-key-file for mutual TLS); HTTPS with an
https:// target or any --ssl-https-*-file option (--ssl-https-verify-peer 0 and
--ssl-https-verify-host 0 turn the checks off). PEM files only; without a CA file the system bundle.

--request-intervals FILE: an open loop whose gaps come from FILE (microseconds, one per line,
cycled; with several threads each takes every n-th request); reported as one step at the mean rate.
-H 'Name: value' (repeatable) goes on every request, as an HTTP header or gRPC metadata.

-l MS stops the sweep after the first step whose latency (the --percentile value, else the
average) is over MS; with --binary-search the steps are bisected instead (lowest, highest, then
halves) for the highest load under MS, which is printed and in the JSON as search.best_load.

A step in which every request of a window fails stops the run with the first error (exit 1).

--shared-memory system|cuda: inputs are written once into one region per input (and --input-data
entry), outputs land in one region per output: its size times -b where the model fixes it, else
--output-shared-memory-size bytes (default 102400). Requests name the regions instead of carrying
data. Regions are registered with each server before the first step and unregistered after the
last (also on errors and on SIGINT/SIGTERM/SIGHUP).

-a/--async, --sync and --max-threads are accepted for compatibility: this generator is always
asynchronous, with one thread per --cpu entry (or --threads).";

#[derive(Debug, Clone, Parser)]
#[command(
    name = "shardserve-bench",
    about = "Load generator for KServe v2 servers (shardserve, Triton, others), perf_analyzer-compatible",
    after_help = AFTER_HELP
)]
pub struct Options {
    /// Model name.
    #[arg(short = 'm', long = "model-name")]
    pub model: Option<String>,
    /// Model version (empty: the server's choice).
    #[arg(short = 'x', long = "model-version", default_value = "")]
    pub model_version: String,
    /// Server host:port.
    #[arg(short = 'u', long = "url")]
    pub url: Option<String>,
    /// Protocol of -u.
    #[arg(
        short = 'i',
        long = "protocol",
        value_enum,
        default_value = "http",
        ignore_case = true
    )]
    pub protocol: Protocol,
    /// Batch size of each request.
    #[arg(short = 'b', long = "batch-size", default_value_t = 1)]
    pub batch_size: u32,
    /// Closed loop: start:end:step outstanding requests (or a list a,b,c).
    #[arg(long = "concurrency-range")]
    pub concurrency_range: Option<String>,
    /// Open loop: start:end:step requests per second (or a list a,b,c).
    #[arg(long = "request-rate-range")]
    pub request_rate_range: Option<String>,
    /// Open loop from a file: one interval in microseconds per line, the gaps
    /// between consecutive requests, cycled (instead of --request-rate-range).
    #[arg(long = "request-intervals")]
    pub request_intervals: Option<PathBuf>,
    /// Latency limit in milliseconds (the --percentile latency, or the average):
    /// the sweep stops at the first step over it; 0 is no limit.
    #[arg(short = 'l', long = "latency-threshold", default_value_t = 0.0)]
    pub latency_threshold_ms: f64,
    /// With -l: bisect the concurrency or request-rate range for the highest
    /// load whose latency stays under the limit.
    #[arg(long = "binary-search")]
    pub binary_search: bool,
    /// "Name: value" header sent with every request (gRPC: as metadata); repeatable.
    #[arg(short = 'H', long = "header")]
    pub headers: Vec<String>,
    /// Arrival process of the open loop.
    #[arg(long = "request-distribution", value_enum, default_value = "constant")]
    pub distribution: Distribution,
    /// Seed of the Poisson arrivals and random inputs.
    #[arg(long = "seed", default_value_t = 42)]
    pub seed: u64,
    /// Open loop: most requests outstanding per thread; arrivals beyond it are dropped and
    /// counted as errors.
    #[arg(long = "max-outstanding", default_value_t = 1024)]
    pub max_outstanding: usize,
    /// NAME:d1,d2,... shape of an input without the batch dimension (repeatable).
    #[arg(long = "shape")]
    pub shapes: Vec<String>,
    /// random, zero, or a JSON file in perf_analyzer's input-data format.
    #[arg(long = "input-data", default_value = "random")]
    pub input_data: String,
    /// Length of generated BYTES elements.
    #[arg(long = "string-length", default_value_t = 128)]
    pub string_length: usize,
    /// Value of every generated BYTES element.
    #[arg(long = "string-data")]
    pub string_data: Option<String>,
    /// Inputs and outputs in shared memory: none (in the requests), system
    /// (POSIX shm) or cuda (device memory shared by CUDA IPC handles); one
    /// region per input (per --input-data entry) and per output, registered
    /// with each server for the run.
    #[arg(long = "shared-memory", value_enum, default_value = "none")]
    pub shared_memory: SharedMemory,
    /// With --shared-memory: bytes of the region of each output whose size
    /// the model does not fix (a variable dimension, BYTES); an output larger
    /// than its region fails with the server's error.
    #[arg(long = "output-shared-memory-size", default_value_t = DEFAULT_OUTPUT_SHM_SIZE)]
    pub output_shared_memory_size: u64,
    /// HTTP input tensors: binary extension or JSON.
    #[arg(long = "input-tensor-format", value_enum, default_value = "binary")]
    pub input_format: TensorFormat,
    /// HTTP output tensors: binary extension or JSON.
    #[arg(long = "output-tensor-format", value_enum, default_value = "binary")]
    pub output_format: TensorFormat,
    /// Window length in milliseconds (time_windows).
    #[arg(short = 'p', long = "measurement-interval", default_value_t = 5000)]
    pub measurement_interval_ms: u64,
    #[arg(long = "measurement-mode", value_enum, default_value = "time_windows")]
    pub measurement_mode: MeasurementMode,
    /// Requests per window (count_windows).
    #[arg(long = "measurement-request-count", default_value_t = 50)]
    pub measurement_request_count: u64,
    /// Stability tolerance, percent, over the last 3 windows.
    #[arg(short = 's', long = "stability-percentage", default_value_t = 10.0)]
    pub stability_percentage: f64,
    /// Most windows per step before reporting an unstable step.
    #[arg(long = "max-trials", default_value_t = 10)]
    pub max_trials: u32,
    /// Percentile the stability check and ratios use instead of the average.
    #[arg(long = "percentile", value_parser = clap::value_parser!(u8).range(1..=99))]
    pub percentile: Option<u8>,
    /// Warm-up before the first window, ms (default: half a window, at most 1 s).
    #[arg(long = "warmup")]
    pub warmup_ms: Option<u64>,
    /// Also wait for this many completed requests before measuring.
    #[arg(long = "warmup-request-count", default_value_t = 0)]
    pub warmup_request_count: u64,
    /// Write perf_analyzer's CSV here.
    #[arg(short = 'f', long = "latency-report-file")]
    pub csv: Option<PathBuf>,
    /// Write the full results as JSON here.
    #[arg(long = "json")]
    pub json: Option<PathBuf>,
    /// perf_analyzer's per-request export: each step's measured requests
    /// with their send and response times (ns since the Unix epoch).
    #[arg(long = "profile-export-file")]
    pub profile_export_file: Option<PathBuf>,
    /// Scrape the server's Prometheus metrics while each step measures and
    /// report them per step (JSON; GPU and CPU columns in the -f CSV).
    #[arg(long = "collect-metrics")]
    pub collect_metrics: bool,
    /// With --collect-metrics: [http://]host[:port][/path]; default the
    /// target's host, port 8002, /metrics.
    #[arg(long = "metrics-url")]
    pub metrics_url: Option<String>,
    /// With --collect-metrics: ms between scrapes.
    #[arg(long = "metrics-interval", default_value_t = 1000)]
    pub metrics_interval_ms: u64,
    /// Draw latency against throughput (SVG) here.
    #[arg(long = "plot")]
    pub plot: Option<PathBuf>,
    /// Accepted for perf_analyzer compatibility (always asynchronous).
    #[arg(short = 'a', long = "async")]
    pub async_mode: bool,
    /// Accepted for perf_analyzer compatibility (always asynchronous).
    #[arg(long = "sync")]
    pub sync_mode: bool,
    /// gRPC bidirectional streaming (ModelStreamInfer), for decoupled models.
    #[arg(long = "streaming")]
    pub streaming: bool,
    /// Sequence models: base number of requests per sequence (default 20; with a
    /// --input-data file and no --sequence-length, the file's entry count).
    #[arg(long = "sequence-length", allow_hyphen_values = true)]
    pub sequence_length: Option<i64>,
    /// Sequence models: each sequence's length varies within ±this percent of
    /// --sequence-length.
    #[arg(
        long = "sequence-length-variation",
        default_value_t = 20.0,
        allow_hyphen_values = true
    )]
    pub sequence_length_variation: f64,
    /// Sequence models: correlation ids start[:end] (end excluded). Default 1
    /// with no end (perf_analyzer wraps after 2^32 - 1 ids).
    #[arg(long = "sequence-id-range")]
    pub sequence_id_range: Option<String>,
    /// Sequence models with --request-rate-range: sequences kept live at once.
    #[arg(long = "num-of-sequences", default_value_t = 4)]
    pub num_of_sequences: u32,
    /// Sequence models with --request-rate-range: at most one request in flight per
    /// sequence (an arrival waits for a sequence whose last request completed).
    #[arg(long = "serial-sequences")]
    pub serial_sequences: bool,
    /// Accepted for perf_analyzer compatibility; see --threads.
    #[arg(long = "max-threads")]
    pub max_threads: Option<usize>,
    /// Additional server host:port[,http|grpc] to run the same sweep against.
    #[arg(long = "compare")]
    pub compare: Vec<String>,
    /// Server host:port[,http|grpc]; repeat to compare servers.
    #[arg(long = "target")]
    pub targets: Vec<String>,
    /// CPUs to pin the generator's threads to, one thread per entry: 1,3 or 2-5.
    #[arg(long = "cpu")]
    pub cpu: Option<String>,
    /// Microseconds a generator thread keeps polling for completions after a response before
    /// it sleeps (0: sleep at once). A sleeping generator adds its own wake-up to every
    /// latency it measures at low concurrency.
    #[arg(long = "busy-poll-us", default_value_t = 1000)]
    pub busy_poll_us: u64,
    /// Plaintext HTTP/1.1 and unary gRPC at one request per thread normally skip the async
    /// runtime and the HTTP client libraries: the thread reads and writes its socket directly,
    /// so the generator adds less to the latency it measures. This flag sends those requests
    /// through them like every other mode.
    #[arg(long = "no-direct")]
    pub no_direct: bool,
    /// Generator threads when --cpu is not given.
    #[arg(long = "threads", default_value_t = 1)]
    pub threads: usize,
    /// gRPC: HTTP/2 connections per thread (requests are spread over them).
    #[arg(long = "connections", default_value_t = 1)]
    pub connections: usize,
    /// What each request calls.
    #[arg(long = "endpoint", value_enum, default_value = "infer")]
    pub endpoint: Endpoint,
    /// No progress line on stderr.
    #[arg(long = "no-progress")]
    pub no_progress: bool,
    /// No table on stdout.
    #[arg(short = 'q', long = "quiet")]
    pub quiet: bool,
    #[arg(short = 'v', long = "verbose")]
    pub verbose: bool,
    #[command(flatten)]
    pub ssl: SslOptions,
}

/// perf_analyzer's TLS options. gRPC: `--ssl-grpc-use-ssl`; HTTPS: an
/// `https://` target or any `--ssl-https-*` file option.
#[derive(Debug, Clone, clap::Args)]
pub struct SslOptions {
    /// gRPC over TLS.
    #[arg(long = "ssl-grpc-use-ssl")]
    pub grpc_use_ssl: bool,
    /// gRPC: PEM CA certificates to verify the server with (default: the system bundle).
    #[arg(long = "ssl-grpc-root-certifications-file")]
    pub grpc_root_certifications_file: Option<PathBuf>,
    /// gRPC: PEM private key of the client certificate (mutual TLS).
    #[arg(long = "ssl-grpc-private-key-file")]
    pub grpc_private_key_file: Option<PathBuf>,
    /// gRPC: PEM client certificate chain (mutual TLS).
    #[arg(long = "ssl-grpc-certificate-chain-file")]
    pub grpc_certificate_chain_file: Option<PathBuf>,
    /// HTTPS: verify the server's certificate chain (1) or not (0).
    #[arg(long = "ssl-https-verify-peer", default_value_t = 1, value_parser = clap::value_parser!(u8).range(0..=1))]
    pub https_verify_peer: u8,
    /// HTTPS: verify that the certificate names the host (1, 2) or not (0).
    #[arg(long = "ssl-https-verify-host", default_value_t = 2, value_parser = clap::value_parser!(u8).range(0..=2))]
    pub https_verify_host: u8,
    /// HTTPS: PEM CA certificates to verify the server with (default: the system bundle).
    #[arg(long = "ssl-https-ca-certificates-file")]
    pub https_ca_certificates_file: Option<PathBuf>,
    /// HTTPS: PEM client certificate (mutual TLS).
    #[arg(long = "ssl-https-client-certificate-file")]
    pub https_client_certificate_file: Option<PathBuf>,
    /// HTTPS: PEM private key of the client certificate.
    #[arg(long = "ssl-https-private-key-file")]
    pub https_private_key_file: Option<PathBuf>,
}

impl SslOptions {
    /// The TLS configuration for `target` (`https`: its spec had that
    /// scheme), or `None` for plaintext.
    fn client_tls(&self, target: &Target, https: bool) -> anyhow::Result<Option<ClientTls>> {
        let opts = match target.protocol {
            Protocol::Grpc if self.grpc_use_ssl => ClientTlsOptions {
                ca_file: self.grpc_root_certifications_file.as_deref(),
                cert_chain_file: self.grpc_certificate_chain_file.as_deref(),
                key_file: self.grpc_private_key_file.as_deref(),
                verify_peer: true,
                verify_host: true,
                alpn: b"h2",
            },
            Protocol::Http
                if https
                    || self.https_ca_certificates_file.is_some()
                    || self.https_client_certificate_file.is_some()
                    || self.https_private_key_file.is_some() =>
            {
                ClientTlsOptions {
                    ca_file: self.https_ca_certificates_file.as_deref(),
                    cert_chain_file: self.https_client_certificate_file.as_deref(),
                    key_file: self.https_private_key_file.as_deref(),
                    verify_peer: self.https_verify_peer != 0,
                    verify_host: self.https_verify_host != 0,
                    alpn: b"http/1.1",
                }
            }
            _ => return Ok(None),
        };
        ClientTls::new(&target.authority, &opts)
            .map(Some)
            .map_err(|e| usage(format!("target '{}': TLS: {e:#}", target.label)))
    }
}

/// perf_analyzer's default sequence length.
pub const DEFAULT_SEQUENCE_LENGTH: u64 = 20;
/// perf_analyzer's id range when no end is given: 2^32 - 1 ids, then wrap.
pub const DEFAULT_SEQUENCE_ID_RANGE: u64 = u32::MAX as u64;

/// The sequence flags as numbers (used only when the model is a sequence model).
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SequenceFlags {
    /// Requests per sequence before variation.
    pub length: u64,
    /// Whether --sequence-length was given (with a --input-data file it
    /// decides between this length and the file's entry count).
    pub length_specified: bool,
    pub variation_percent: f64,
    pub start_id: u64,
    /// Ids in [start_id, start_id + id_range).
    pub id_range: u64,
    /// Whether an end was given (then a range smaller than the live
    /// sequences is an error, as in perf_analyzer).
    pub id_end_given: bool,
}

/// One server to load.
#[derive(Debug, Clone, PartialEq)]
pub struct Target {
    /// As the user wrote it, for reports.
    pub label: String,
    pub addr: SocketAddr,
    /// host:port for the Host/:authority header.
    pub authority: String,
    pub protocol: Protocol,
    /// TLS client configuration; `None` for plaintext.
    pub tls: Option<ClientTls>,
}

/// The load of one step.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Load {
    Concurrency(u32),
    Rate(f64),
}

impl Load {
    pub fn value(&self) -> f64 {
        match *self {
            Load::Concurrency(c) => f64::from(c),
            Load::Rate(r) => r,
        }
    }
}

impl Options {
    pub fn load_steps(&self) -> anyhow::Result<Vec<Load>> {
        if let Some(intervals) = self.request_intervals()? {
            if self.concurrency_range.is_some() || self.request_rate_range.is_some() {
                return Err(usage(
                    "--request-intervals excludes --concurrency-range and --request-rate-range",
                ));
            }
            // One open-loop step, reported at the intervals' mean rate.
            let total: Duration = intervals.iter().sum();
            return Ok(vec![Load::Rate(
                intervals.len() as f64 / total.as_secs_f64(),
            )]);
        }
        match (&self.concurrency_range, &self.request_rate_range) {
            (Some(_), Some(_)) => Err(usage(
                "--concurrency-range and --request-rate-range are exclusive",
            )),
            (Some(c), None) => Ok(parse_range(c, "--concurrency-range")?
                .into_iter()
                .map(|v| {
                    if v < 1.0 || v.fract() != 0.0 || v > f64::from(u32::MAX) {
                        Err(usage(format!(
                            "--concurrency-range: {v} is not a positive integer"
                        )))
                    } else {
                        Ok(Load::Concurrency(v as u32))
                    }
                })
                .collect::<anyhow::Result<_>>()?),
            (None, Some(r)) => Ok(parse_range(r, "--request-rate-range")?
                .into_iter()
                .map(|v| {
                    if v > 0.0 && v.is_finite() {
                        Ok(Load::Rate(v))
                    } else {
                        Err(usage(format!(
                            "--request-rate-range: {v} is not a positive rate"
                        )))
                    }
                })
                .collect::<anyhow::Result<_>>()?),
            (None, None) => Ok(vec![Load::Concurrency(1)]),
        }
    }

    pub fn targets(&self) -> anyhow::Result<Vec<Target>> {
        let mut specs: Vec<(String, Option<Protocol>)> = Vec::new();
        if self.url.is_some() || self.targets.is_empty() {
            let default = match self.protocol {
                Protocol::Http => "localhost:8000",
                Protocol::Grpc => "localhost:8001",
            };
            specs.push((
                self.url.clone().unwrap_or_else(|| default.into()),
                Some(self.protocol),
            ));
        }
        for t in self.targets.iter().chain(&self.compare) {
            specs.push((t.clone(), None));
        }
        specs
            .into_iter()
            .map(|(spec, proto)| {
                let mut target = parse_target(&spec, proto.unwrap_or(self.protocol))?;
                let https = spec.trim_start().starts_with("https://");
                target.tls = self.ssl.client_tls(&target, https)?;
                Ok(target)
            })
            .collect()
    }

    /// The gaps of --request-intervals, in file order.
    pub fn request_intervals(&self) -> anyhow::Result<Option<Vec<Duration>>> {
        let Some(path) = &self.request_intervals else {
            return Ok(None);
        };
        let text = std::fs::read_to_string(path).map_err(|e| {
            usage(format!(
                "--request-intervals: cannot read '{}': {e}",
                path.display()
            ))
        })?;
        parse_intervals(&text)
            .map(Some)
            .map_err(|e| usage(format!("--request-intervals '{}': {e}", path.display())))
    }

    /// The -H headers, parsed.
    pub fn header_pairs(&self) -> anyhow::Result<Vec<(HeaderName, HeaderValue)>> {
        self.headers.iter().map(|h| parse_header(h)).collect()
    }

    /// Input shapes given with --shape, by input name.
    pub fn shape_overrides(&self) -> anyhow::Result<Vec<(String, Vec<i64>)>> {
        self.shapes.iter().map(|s| parse_shape(s)).collect()
    }

    pub fn cpus(&self) -> anyhow::Result<Option<Vec<usize>>> {
        self.cpu.as_deref().map(parse_cpu_list).transpose()
    }

    pub fn worker_count(&self) -> anyhow::Result<usize> {
        Ok(match self.cpus()? {
            Some(c) => c.len(),
            None => self.threads.max(1),
        })
    }

    /// The sequence flags, checked. Like perf_analyzer, a non-positive
    /// --sequence-length warns and keeps the default, and a start id of 0
    /// (which means "no sequence" to Triton) becomes 1.
    pub fn sequence_flags(&self) -> anyhow::Result<SequenceFlags> {
        let length = match self.sequence_length {
            None => DEFAULT_SEQUENCE_LENGTH,
            Some(l) if l > 0 => l as u64,
            Some(l) => {
                tracing::warn!(
                    "--sequence-length {l}: must be > 0; using {DEFAULT_SEQUENCE_LENGTH} for sequence models"
                );
                DEFAULT_SEQUENCE_LENGTH
            }
        };
        let v = self.sequence_length_variation;
        if !(v >= 0.0 && v.is_finite()) {
            return Err(usage(format!(
                "--sequence-length-variation: {v} must be >= 0"
            )));
        }
        let (mut start_id, id_range, id_end_given) = match self.sequence_id_range.as_deref() {
            None => (1, DEFAULT_SEQUENCE_ID_RANGE, false),
            Some(spec) => parse_sequence_id_range(spec)?,
        };
        if start_id == 0 {
            tracing::warn!("--sequence-id-range: sequence id 0 means no sequence; starting at 1");
            start_id = 1;
        }
        // gRPC carries ids as int64_param.
        if start_id
            .checked_add(id_range - 1)
            .is_none_or(|last| last > i64::MAX as u64)
        {
            return Err(usage("--sequence-id-range: ids must stay below 2^63"));
        }
        Ok(SequenceFlags {
            length,
            length_specified: self.sequence_length.is_some(),
            variation_percent: v,
            start_id,
            id_range,
            id_end_given,
        })
    }

    /// Most sequences live at once in this sweep: the largest concurrency
    /// (closed loop) or --num-of-sequences (open loop).
    pub fn max_live_sequences(&self) -> anyhow::Result<u64> {
        Ok(match self.load_steps()?.as_slice() {
            [Load::Rate(_), ..] => u64::from(self.num_of_sequences),
            steps => steps
                .iter()
                .map(|l| match l {
                    Load::Concurrency(c) => u64::from(*c),
                    Load::Rate(_) => 0,
                })
                .max()
                .unwrap_or(1),
        })
    }

    /// Checks what clap cannot: combinations and values.
    pub fn validate(&self) -> anyhow::Result<()> {
        if self.metrics_url.is_some() && !self.collect_metrics {
            return Err(usage("--metrics-url needs --collect-metrics"));
        }
        if self.collect_metrics && self.metrics_interval_ms == 0 {
            return Err(usage("--metrics-interval must be at least 1 ms"));
        }
        if let Some(url) = &self.metrics_url {
            super::metrics::MetricsUrl::parse(url).map_err(|e| usage(format!("{e:#}")))?;
        }
        if self.endpoint == Endpoint::Infer && self.model.as_deref().unwrap_or("").is_empty() {
            return Err(usage("-m/--model-name is required"));
        }
        if self.batch_size == 0 {
            return Err(usage("-b/--batch-size must be at least 1"));
        }
        if self.shared_memory != SharedMemory::None {
            if self.endpoint == Endpoint::Live {
                return Err(usage(
                    "--shared-memory needs inference requests (not --endpoint live)",
                ));
            }
            if self.output_shared_memory_size == 0 {
                return Err(usage("--output-shared-memory-size must be at least 1"));
            }
        }
        if self.measurement_interval_ms == 0 || self.max_trials == 0 {
            return Err(usage(
                "--measurement-interval and --max-trials must be positive",
            ));
        }
        if self.max_outstanding == 0 || self.connections == 0 {
            return Err(usage(
                "--max-outstanding and --connections must be positive",
            ));
        }
        let targets = self.targets()?;
        if self.streaming && targets.iter().any(|t| t.protocol != Protocol::Grpc) {
            return Err(usage("--streaming needs -i grpc"));
        }
        self.load_steps()?;
        self.header_pairs()?;
        if !(self.latency_threshold_ms >= 0.0 && self.latency_threshold_ms.is_finite()) {
            return Err(usage(
                "-l/--latency-threshold must be a number of milliseconds >= 0",
            ));
        }
        if self.binary_search && self.latency_threshold_ms == 0.0 {
            return Err(usage("--binary-search needs -l/--latency-threshold"));
        }
        self.shape_overrides()?;
        self.cpus()?;
        if self.num_of_sequences == 0 {
            return Err(usage("--num-of-sequences must be > 0"));
        }
        let seq = self.sequence_flags()?;
        // perf_analyzer refuses a bounded range that live sequences could
        // exhaust, whatever the model (ids would collide).
        let live = self.max_live_sequences()?;
        if seq.id_end_given && seq.id_range < live {
            return Err(usage(format!(
                "--sequence-id-range holds {} ids, fewer than the {live} sequences that can be live at once: sequence ids would collide",
                seq.id_range
            )));
        }
        Ok(())
    }
}

/// One interval in microseconds per line (blank lines skipped); the
/// intervals must not all be zero.
pub fn parse_intervals(text: &str) -> Result<Vec<Duration>, String> {
    let mut out = Vec::new();
    for (n, line) in text.lines().enumerate() {
        let line = line.trim();
        if line.is_empty() {
            continue;
        }
        let us: u64 = line.parse().map_err(|_| {
            format!(
                "line {}: '{line}' is not a whole number of microseconds",
                n + 1
            )
        })?;
        out.push(Duration::from_micros(us));
    }
    if out.iter().all(Duration::is_zero) {
        return Err("no interval above zero".into());
    }
    Ok(out)
}

/// perf_analyzer's `-H 'Name:value'` (spaces around the value are dropped).
pub fn parse_header(spec: &str) -> anyhow::Result<(HeaderName, HeaderValue)> {
    let Some((name, value)) = spec.split_once(':') else {
        return Err(usage(format!("-H '{spec}': expected 'Name: value'")));
    };
    let name = HeaderName::from_bytes(name.trim().as_bytes())
        .map_err(|e| usage(format!("-H '{spec}': bad header name: {e}")))?;
    let value = HeaderValue::from_str(value.trim())
        .map_err(|e| usage(format!("-H '{spec}': bad header value: {e}")))?;
    Ok((name, value))
}

/// `start[:end]`, end excluded: (start, number of ids, end given).
pub fn parse_sequence_id_range(spec: &str) -> anyhow::Result<(u64, u64, bool)> {
    let num = |t: &str| {
        t.trim().parse::<u64>().map_err(|_| {
            usage(format!(
                "--sequence-id-range: '{t}' is not a non-negative integer in '{spec}' (expected start[:end])"
            ))
        })
    };
    match spec.split(':').collect::<Vec<_>>().as_slice() {
        [start] => Ok((num(start)?, DEFAULT_SEQUENCE_ID_RANGE, false)),
        [start, end] => {
            let (start, end) = (num(start)?, num(end)?);
            if end <= start {
                return Err(usage(format!(
                    "--sequence-id-range: end must be greater than start in '{spec}'"
                )));
            }
            Ok((start, end - start, true))
        }
        _ => Err(usage(format!(
            "--sequence-id-range: expected start[:end], got '{spec}'"
        ))),
    }
}

/// `start:end:step` (end defaults to start, step to 1) or `a,b,c`.
pub fn parse_range(s: &str, flag: &str) -> anyhow::Result<Vec<f64>> {
    let num = |t: &str| {
        t.trim()
            .parse::<f64>()
            .map_err(|_| usage(format!("{flag}: '{t}' is not a number in '{s}'")))
    };
    if s.contains(',') {
        return s.split(',').map(num).collect();
    }
    let parts: Vec<&str> = s.split(':').collect();
    if parts.len() > 3 || parts[0].trim().is_empty() {
        return Err(usage(format!("{flag}: expected start:end:step, got '{s}'")));
    }
    let start = num(parts[0])?;
    let end = match parts.get(1) {
        Some(e) => num(e)?,
        None => start,
    };
    let step = match parts.get(2) {
        Some(st) => num(st)?,
        None => 1.0,
    };
    if end < start || step <= 0.0 {
        return Err(usage(format!(
            "{flag}: '{s}' needs end >= start and step > 0"
        )));
    }
    let mut out = Vec::new();
    let mut v = start;
    while v <= end + 1e-9 && out.len() < 10_000 {
        out.push(v);
        v += step;
    }
    Ok(out)
}

pub fn parse_shape(s: &str) -> anyhow::Result<(String, Vec<i64>)> {
    let (name, dims) = s
        .rsplit_once(':')
        .ok_or_else(|| usage(format!("--shape: expected NAME:d1,d2, got '{s}'")))?;
    let dims = dims
        .split(',')
        .map(|d| match d.trim().parse::<i64>() {
            Ok(v) if v >= 0 => Ok(v),
            _ => Err(usage(format!("--shape: '{d}' is not a dimension in '{s}'"))),
        })
        .collect::<anyhow::Result<Vec<_>>>()?;
    if name.is_empty() {
        return Err(usage(format!("--shape: missing input name in '{s}'")));
    }
    Ok((name.to_string(), dims))
}

pub fn parse_cpu_list(s: &str) -> anyhow::Result<Vec<usize>> {
    let mut cpus = Vec::new();
    for part in s.split(',').map(str::trim).filter(|p| !p.is_empty()) {
        let bad = || usage(format!("--cpu: '{part}' is not a CPU or range in '{s}'"));
        match part.split_once('-') {
            Some((a, b)) => {
                let (a, b): (usize, usize) =
                    (a.parse().map_err(|_| bad())?, b.parse().map_err(|_| bad())?);
                if b < a {
                    return Err(bad());
                }
                cpus.extend(a..=b);
            }
            None => cpus.push(part.parse().map_err(|_| bad())?),
        }
    }
    if cpus.is_empty() {
        return Err(usage("--cpu: empty list"));
    }
    Ok(cpus)
}

/// `[http://|https://|grpc://]host:port[,http|grpc]` (TLS is attached by
/// `Options::targets`).
pub fn parse_target(spec: &str, default: Protocol) -> anyhow::Result<Target> {
    let (url, mut protocol) = match spec.rsplit_once(',') {
        Some((u, p)) => (
            u,
            Protocol::from_str(p.trim(), true)
                .map_err(|_| usage(format!("target '{spec}': protocol must be http or grpc")))?,
        ),
        None => (spec, default),
    };
    let mut authority = url.trim();
    for (scheme, p) in [
        ("http://", None),
        ("https://", Some(Protocol::Http)),
        ("grpc://", Some(Protocol::Grpc)),
    ] {
        if let Some(rest) = authority.strip_prefix(scheme) {
            authority = rest;
            if let Some(p) = p {
                protocol = p;
            }
        }
    }
    let authority = authority.trim_end_matches('/').to_string();
    if authority.is_empty() {
        return Err(usage(format!("target '{spec}': missing host:port")));
    }
    let addrs: Vec<SocketAddr> = authority
        .to_socket_addrs()
        .map_err(|e| anyhow::anyhow!("cannot resolve '{authority}': {e}"))?
        .collect();
    // Prefer IPv4: "localhost" often resolves to ::1 first while servers bind 0.0.0.0.
    let addr = addrs
        .iter()
        .find(|a| a.is_ipv4())
        .or(addrs.first())
        .copied()
        .ok_or_else(|| anyhow::anyhow!("cannot resolve '{authority}': no address"))?;
    Ok(Target {
        label: spec.to_string(),
        addr,
        authority,
        protocol,
        tls: None,
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn headers_and_request_intervals_parse() {
        let (n, v) = parse_header("X-Token:  abc def ").unwrap();
        assert_eq!((n.as_str(), v.to_str().unwrap()), ("x-token", "abc def"));
        for bad in ["no-colon", "bad name: x", ": empty name"] {
            let e = parse_header(bad).unwrap_err();
            assert!(e.downcast_ref::<UsageError>().is_some(), "{bad}: {e}");
        }
        assert_eq!(
            parse_intervals("100\n\n 2500 \n0\n").unwrap(),
            vec![
                Duration::from_micros(100),
                Duration::from_micros(2500),
                Duration::ZERO
            ]
        );
        assert!(parse_intervals("100\n1.5\n")
            .unwrap_err()
            .contains("line 2"));
        assert!(parse_intervals("0\n").is_err());
        assert!(parse_intervals("").is_err());
    }

    fn opts(args: &[&str]) -> Options {
        let mut v = vec!["shardserve-bench"];
        v.extend_from_slice(args);
        Options::try_parse_from(v).expect("parses")
    }

    #[test]
    fn perf_analyzer_command_line_parses() {
        let o = opts(&[
            "-m",
            "simple",
            "-x",
            "1",
            "-u",
            "127.0.0.1:8001",
            "-i",
            "grpc",
            "-b",
            "2",
            "--concurrency-range",
            "1:4:2",
            "--shape",
            "INPUT0:16",
            "--input-data",
            "zero",
            "--measurement-interval",
            "200",
            "--percentile",
            "95",
            "-f",
            "out.csv",
            "-a",
        ]);
        o.validate().expect("valid");
        assert_eq!(o.model.as_deref(), Some("simple"));
        assert_eq!(o.protocol, Protocol::Grpc);
        assert_eq!(
            o.load_steps().unwrap(),
            vec![Load::Concurrency(1), Load::Concurrency(3)]
        );
        assert_eq!(
            o.shape_overrides().unwrap(),
            vec![("INPUT0".to_string(), vec![16])]
        );
        assert_eq!(o.percentile, Some(95));
        let t = o.targets().unwrap();
        assert_eq!(t.len(), 1);
        assert_eq!(t[0].addr, "127.0.0.1:8001".parse().unwrap());
    }

    #[test]
    fn ranges() {
        assert!(parse_range("1:64:x", "f").is_err());
        assert_eq!(parse_range("1,8,64", "f").unwrap(), vec![1.0, 8.0, 64.0]);
        assert_eq!(parse_range("5", "f").unwrap(), vec![5.0]);
        assert_eq!(
            parse_range("100:300:100", "f").unwrap(),
            vec![100.0, 200.0, 300.0]
        );
        assert!(parse_range("4:1", "f").is_err());
        assert!(parse_range("1:4:0", "f").is_err());
        let rate = opts(&["-m", "m", "--request-rate-range", "100.5"]);
        assert_eq!(rate.load_steps().unwrap(), vec![Load::Rate(100.5)]);
        let bad = opts(&["-m", "m", "--concurrency-range", "0:2"]);
        assert!(bad
            .load_steps()
            .unwrap_err()
            .downcast_ref::<UsageError>()
            .is_some());
    }

    #[test]
    fn targets_and_compare() {
        let o = opts(&[
            "-m",
            "m",
            "-u",
            "http://127.0.0.1:8000",
            "--compare",
            "127.0.0.1:9000",
        ]);
        let t = o.targets().unwrap();
        assert_eq!(t.len(), 2);
        assert_eq!(t[0].authority, "127.0.0.1:8000");
        assert_eq!(t[1].protocol, Protocol::Http);
        let o = opts(&[
            "-m",
            "m",
            "--target",
            "127.0.0.1:1,grpc",
            "--target",
            "127.0.0.1:2",
        ]);
        let t = o.targets().unwrap();
        assert_eq!(
            t.iter().map(|t| t.protocol).collect::<Vec<_>>(),
            [Protocol::Grpc, Protocol::Http]
        );
        assert!(parse_target("127.0.0.1:1,quic", Protocol::Http).is_err());
    }

    #[test]
    fn shapes_and_cpus() {
        assert_eq!(
            parse_shape("a:b:1,2").unwrap(),
            ("a:b".to_string(), vec![1, 2])
        );
        assert!(parse_shape("INPUT0").is_err());
        assert!(parse_shape("INPUT0:-1").is_err());
        assert_eq!(parse_cpu_list("1,3-5").unwrap(), vec![1, 3, 4, 5]);
        assert!(parse_cpu_list("5-3").is_err());
        assert!(parse_cpu_list("x").is_err());
    }

    #[test]
    fn sequence_flags_as_perf_analyzer() {
        let d = opts(&["-m", "m"]).sequence_flags().unwrap();
        assert_eq!(
            d,
            SequenceFlags {
                length: 20,
                length_specified: false,
                variation_percent: 20.0,
                start_id: 1,
                id_range: u64::from(u32::MAX),
                id_end_given: false,
            }
        );
        assert_eq!(opts(&["-m", "m"]).num_of_sequences, 4);
        assert!(!opts(&["-m", "m"]).serial_sequences);
        let o = opts(&[
            "-m",
            "m",
            "--sequence-length",
            "5",
            "--sequence-length-variation",
            "0",
            "--sequence-id-range",
            "10:20",
            "--num-of-sequences",
            "8",
            "--serial-sequences",
            "--request-rate-range",
            "100",
        ]);
        o.validate().unwrap();
        let f = o.sequence_flags().unwrap();
        assert_eq!(
            (f.length, f.length_specified, f.variation_percent),
            (5, true, 0.0)
        );
        assert_eq!((f.start_id, f.id_range, f.id_end_given), (10, 10, true));
        assert_eq!((o.num_of_sequences, o.serial_sequences), (8, true));
        assert_eq!(o.max_live_sequences().unwrap(), 8);
        // Start only: unbounded (perf_analyzer's 2^32 - 1 ids).
        assert_eq!(
            parse_sequence_id_range("7").unwrap(),
            (7, u64::from(u32::MAX), false)
        );
        for bad in ["5:5", "9:3", "1:2:3", "-1", "a:b", ""] {
            assert!(parse_sequence_id_range(bad).is_err(), "{bad}");
        }
        // perf_analyzer warns and keeps 20 for a non-positive length, and
        // turns start id 0 into 1.
        let z = opts(&[
            "-m",
            "m",
            "--sequence-length",
            "0",
            "--sequence-id-range",
            "0:4",
        ]);
        let f = z.sequence_flags().unwrap();
        assert_eq!((f.length, f.start_id, f.id_range), (20, 1, 4));
        let neg = opts(&["-m", "m", "--sequence-length", "-3"]);
        assert_eq!(neg.sequence_flags().unwrap().length, 20);
        let bad_var = opts(&["-m", "m", "--sequence-length-variation", "-1"]);
        assert!(bad_var.validate().is_err());
        assert!(Options::try_parse_from(["b", "-m", "m", "--num-of-sequences", "x"]).is_err());
        assert!(opts(&["-m", "m", "--num-of-sequences", "0"])
            .validate()
            .is_err());
        let huge = opts(&[
            "-m",
            "m",
            "--sequence-id-range",
            "9223372036854775807:18446744073709551615",
        ]);
        assert!(huge.validate().is_err(), "gRPC ids are int64");
    }

    #[test]
    fn sequence_id_range_must_cover_the_live_sequences() {
        // Closed loop: the largest concurrency of the sweep.
        let small = opts(&[
            "-m",
            "m",
            "--sequence-id-range",
            "1:8",
            "--concurrency-range",
            "1:16:15",
        ]);
        let e = small.validate().unwrap_err();
        assert!(e.downcast_ref::<UsageError>().is_some());
        assert!(e.to_string().contains("collide"), "{e}");
        let enough = opts(&[
            "-m",
            "m",
            "--sequence-id-range",
            "1:17",
            "--concurrency-range",
            "1:16:15",
        ]);
        enough.validate().unwrap();
        // Open loop: --num-of-sequences (default 4).
        let rate = opts(&[
            "-m",
            "m",
            "--sequence-id-range",
            "1:4",
            "--request-rate-range",
            "10",
        ]);
        assert!(rate.validate().is_err());
        let rate = opts(&[
            "-m",
            "m",
            "--sequence-id-range",
            "1:5",
            "--request-rate-range",
            "10",
        ]);
        rate.validate().unwrap();
        // Start only: no bound to check.
        let open = opts(&[
            "-m",
            "m",
            "--sequence-id-range",
            "3",
            "--concurrency-range",
            "1000",
        ]);
        open.validate().unwrap();
    }

    #[test]
    fn invalid_combinations() {
        let both = opts(&[
            "-m",
            "m",
            "--concurrency-range",
            "1",
            "--request-rate-range",
            "1",
        ]);
        assert!(both.validate().is_err());
        let no_model = opts(&[]);
        assert!(no_model.validate().is_err());
        let live = opts(&["--endpoint", "live"]);
        assert!(live.validate().is_ok());
        let stream_http = opts(&["-m", "m", "--streaming"]);
        assert!(stream_http.validate().is_err());
        assert!(Options::try_parse_from(["b", "-m", "m", "-i", "quic"]).is_err());
    }
}
