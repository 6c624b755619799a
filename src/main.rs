//! `shardserve`: the server binary. The command line is `shardserve::cli`
//! (tritonserver's flags and ours); here: parse, set up logging, run.

use std::process::ExitCode;

use shardserve::cli::{self, LogSettings};
use tracing_subscriber::EnvFilter;

/// Chosen by measurement over glibc and jemalloc (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

fn init_logging(settings: &LogSettings) {
    let default = match settings.verbose {
        0 => "info",
        1 => "debug",
        _ => "trace",
    };
    let filter =
        EnvFilter::try_from_env("SHARDSERVE_LOG").unwrap_or_else(|_| EnvFilter::new(default));
    // Colours only for a terminal: logs sent to a file or a collector stay plain text.
    let builder = tracing_subscriber::fmt()
        .with_env_filter(filter)
        .with_filter_reloading()
        .with_target(false)
        .with_ansi(std::io::IsTerminal::is_terminal(&std::io::stdout()));
    // The logging extension (`/v2/logging`, gRPC LogSettings) swaps the filter at run time.
    let handle = builder.reload_handle();
    builder.init();
    shardserve::frontend::logging::install(settings.verbose, move |directive| {
        handle
            .reload(EnvFilter::new(directive))
            .map_err(|e| e.to_string())
    });
}

fn main() -> ExitCode {
    let cli = match cli::parse_from(std::env::args_os()) {
        Ok(cli) => cli,
        Err(e) => {
            let _ = e.print();
            // As tritonserver: a bad command line exits with status 1.
            return if e.use_stderr() {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            };
        }
    };
    // Before logging starts, so a refused flag is told on stderr whatever the log settings.
    if let Err(e) = cli.validate() {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    init_logging(&cli.log_settings());
    shardserve::backend::capi::keep_exported();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
