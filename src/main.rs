//! `shardserve`: the server binary. The command line is `shardserve::cli`
//! (tritonserver's flags and ours); here: parse, set up logging, run.

use std::process::ExitCode;

use shardserve::cli;

/// Chosen by measurement over glibc and jemalloc (see Cargo.toml).
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

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
    if let Err(e) = shardserve::logs::init(&cli.log_settings()) {
        eprintln!("error: {e:#}");
        return ExitCode::FAILURE;
    }
    shardserve::backend::capi::keep_exported();
    match cli::run(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            tracing::error!("{e:#}");
            ExitCode::FAILURE
        }
    }
}
