//! `shardserve-bench`: perf_analyzer-compatible load generator for KServe v2
//! servers. All logic lives in `shardserve::bench`.

fn main() {
    let filter = tracing_subscriber::EnvFilter::try_from_env("SHARDSERVE_BENCH_LOG")
        .unwrap_or_else(|_| tracing_subscriber::EnvFilter::new("warn"));
    tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_writer(std::io::stderr)
        .init();
    std::process::exit(shardserve::bench::main_with_args(std::env::args_os()));
}
