//! What shardserve does with the tritonserver flags it has no use for: it
//! accepts a setting that means nothing in this process and says so once.
//! (Since issue 24 no flag is refused: every tritonserver 2.51 feature a
//! flag asks for is served.)

use super::args::Cli;

/// A flag accepted with no effect, or a deprecated spelling: logged once at start-up.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Note {
    /// Warnings for settings that change nothing; info for deprecated spellings that work.
    pub warn: bool,
    pub text: String,
}

/// The flags given that change nothing here, and the deprecated spellings used.
pub fn notes(cli: &Cli) -> Vec<Note> {
    let mut out = Vec::new();
    let mut none = |given: bool, flag: &str, why: &str| {
        if given {
            out.push(Note {
                warn: true,
                text: format!("{flag} has no effect in shardserve: {why}"),
            });
        }
    };
    none(
        cli.repository.enable_peer_access.is_some(),
        "--enable-peer-access",
        "it never copies tensors from one GPU to another; GPU backends place their own memory",
    );
    none(
        cli.http.http_thread_count.is_some(),
        "--http-thread-count",
        "HTTP is served by the shard threads (one per core, see --cores)",
    );
    none(
        cli.grpc.grpc_infer_allocation_pool_size.is_some(),
        "--grpc-infer-allocation-pool-size",
        "gRPC requests and responses are not pooled; each shard allocates its own",
    );
    // issue 24: response cache
    none(
        cli.cache.cache_directory.is_some(),
        "--cache-directory",
        "only the built-in 'local' response cache exists; no cache library is loaded",
    );
    none(
        cli.sagemaker.sagemaker_thread_count.is_some(),
        "--sagemaker-thread-count",
        "the SageMaker service is served by the shard threads (one per core, see --cores)",
    );
    none(
        cli.vertex.vertex_ai_thread_count.is_some(),
        "--vertex-ai-thread-count",
        "the Vertex AI service is served by the shard threads (one per core, see --cores)",
    );
    none(
        cli.repoagent.repoagent_directory.is_some(),
        "--repoagent-directory",
        "it loads no repository agents (a model whose config names one is refused at load)",
    );
    none(
        !cli.memory.cuda_memory_pool_byte_size.is_empty(),
        "--cuda-memory-pool-byte-size",
        "it keeps no CUDA device memory pool; GPU backends allocate device memory themselves",
    );
    none(
        !cli.memory.cuda_virtual_address_size.is_empty(),
        "--cuda-virtual-address-size",
        "it reserves no CUDA virtual address space; GPU backends allocate device memory themselves",
    );
    none(
        cli.memory.min_supported_compute_capability.is_some(),
        "--min-supported-compute-capability",
        "it does not filter GPUs by compute capability; each GPU backend's CUDA runtime decides",
    );
    none(
        cli.memory.buffer_manager_thread_count.is_some(),
        "--buffer-manager-thread-count",
        "request inputs are gathered on the shard threads",
    );
    none(
        !cli.memory.host_policy.is_empty(),
        "--host-policy",
        "threads are placed by --cores, --no-pin and the tuning profile (--tuning-profile)",
    );
    none(
        !cli.memory.model_load_gpu_limit.is_empty(),
        "--model-load-gpu-limit",
        "it does not measure GPU memory while models load",
    );
    let mut deprecated = |given: bool, flag: &str, instead: &str| {
        if given {
            out.push(Note {
                warn: true,
                text: format!("{flag} is deprecated (as in tritonserver): use {instead}"),
            });
        }
    };
    deprecated(
        cli.deprecated.strict_model_config.is_some(),
        "--strict-model-config",
        "--disable-auto-complete-config",
    );
    deprecated(
        cli.deprecated.response_cache_byte_size.is_some(),
        "--response-cache-byte-size",
        "--cache-config",
    );
    deprecated(
        cli.deprecated.trace_file.is_some(),
        "--trace-file",
        "--trace-config triton,file=<path>",
    );
    deprecated(
        !cli.deprecated.trace_level.is_empty(),
        "--trace-level",
        "--trace-config level=<level>",
    );
    deprecated(
        cli.deprecated.trace_rate.is_some(),
        "--trace-rate",
        "--trace-config rate=<rate>",
    );
    deprecated(
        cli.deprecated.trace_count.is_some(),
        "--trace-count",
        "--trace-config count=<count>",
    );
    deprecated(
        cli.deprecated.trace_log_frequency.is_some(),
        "--trace-log-frequency",
        "--trace-config triton,log-frequency=<n>",
    );
    if cli.repository.disable_auto_complete_config
        && cli.deprecated.strict_model_config == Some(false)
    {
        out.push(Note {
            warn: true,
            text: "--strict-model-config=false is overridden by --disable-auto-complete-config"
                .into(),
        });
    }
    out
}
