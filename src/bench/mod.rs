//! `shardserve-bench`: a perf_analyzer-compatible load generator for any
//! KServe v2 server. `cli` parses, `probe` reads the model from the server,
//! `input` builds and pre-encodes requests, `load` runs pinned monoio
//! worker threads, `measure` runs windows until stable, `report` writes the
//! table, CSV, JSON and SVG. See `run` for the whole flow.

pub mod cli;
pub mod direct;
pub mod grpc;
pub mod input;
pub mod load;
pub mod measure;
pub mod metrics;
pub mod probe;
pub mod profile;
pub mod report;
pub mod request;
pub mod search;
pub mod sequence;
pub mod shm;
pub mod stats;
pub mod tls;
pub mod wire;

use std::{io::IsTerminal, sync::Arc, time::Duration};

use anyhow::Context;
use clap::Parser;
use monoio::FusionDriver;

use cli::{
    Endpoint, Load, MeasurementMode, Options, Protocol, SharedMemory, TensorFormat, UsageError,
};
use input::{
    build_inputs, encode_grpc, encode_grpc_shm, encode_http, encode_http_shm, InputOptions,
};
use measure::{Plan, StepResult, TargetRun};
use sequence::SequenceOptions;

/// Everything a run produced.
#[derive(Debug)]
pub struct RunReport {
    pub results: Vec<StepResult>,
    pub ratios: Vec<report::Ratio>,
    pub json: serde_json::Value,
}

/// Parses `args` (program name first), runs, and returns the exit code:
/// 0 success, 1 run failure, 2 bad arguments.
pub fn main_with_args<I, T>(args: I) -> i32
where
    I: IntoIterator<Item = T>,
    T: Into<std::ffi::OsString> + Clone,
{
    let opts = match Options::try_parse_from(args) {
        Ok(o) => o,
        Err(e) => {
            let _ = e.print();
            return if e.use_stderr() { 2 } else { 0 };
        }
    };
    // Before any thread starts: a Ctrl-C must not leave regions registered
    // on the server and shm objects in /dev/shm.
    if opts.shared_memory != SharedMemory::None {
        if let Err(e) = shm::install_signal_cleanup() {
            eprintln!("error: {e:#}");
            return 1;
        }
    }
    match run(&opts) {
        Ok(_) => 0,
        Err(e) => {
            eprintln!("error: {e:#}");
            if e.downcast_ref::<UsageError>().is_some() {
                2
            } else {
                1
            }
        }
    }
}

/// Runs the sweep described by `opts` and writes the requested outputs.
pub fn run(opts: &Options) -> anyhow::Result<RunReport> {
    opts.validate()?;
    // The coordinator is a monoio runtime too: it makes the control calls
    // (metadata, statistics) with the same client code as the workers.
    let mut rt = crate::shard::uring::runtime_builder::<FusionDriver>()
        .enable_timer()
        .build()
        .context("cannot start the coordinator runtime")?;
    rt.block_on(async {
        let report = run_async(opts).await;
        // Its control connections (metadata, statistics) end with it.
        wire::close_connections(Duration::from_millis(500)).await;
        report
    })
}

/// A target ready to load, with its shared memory regions (--shared-memory).
type Prepared = (TargetRun, Option<shm::Regions>);

async fn prepare(opts: &Options, index: usize, target: cli::Target) -> anyhow::Result<Prepared> {
    let model = opts.model.clone().unwrap_or_default();
    if opts.endpoint == Endpoint::Live {
        probe::reachable(&target).await?;
        let prepared = match target.protocol {
            Protocol::Http => request::http_prepared(
                &target.authority,
                "/v2/health/live",
                vec![bytes::Bytes::new()],
                None,
                false,
            )?,
            Protocol::Grpc => request::grpc_prepared(
                &target.authority,
                "ServerLive",
                vec![input::grpc_frame(
                    &crate::proto::inference::ServerLiveRequest {},
                )],
                false,
            )?,
        };
        let mut prepared = prepared;
        for (name, value) in opts.header_pairs()? {
            prepared.headers.append(name, value);
        }
        let metrics_url = metrics_url(opts, &target)?;
        return Ok((
            TargetRun {
                index,
                target,
                prepared: Arc::new(prepared),
                stats_model: None,
                sequence: None,
                next_ordinal: Arc::default(),
                metrics_url,
            },
            None,
        ));
    }
    let info = probe::model_info(&target, &model, &opts.model_version).await?;
    if info.max_batch_size > 0 && i64::from(opts.batch_size) > info.max_batch_size {
        tracing::warn!(
            "batch size {} exceeds the model's max_batch_size {}: expect the server to reject requests",
            opts.batch_size,
            info.max_batch_size
        );
    }
    let shapes = opts.shape_overrides()?;
    let sets = build_inputs(
        &info,
        &InputOptions {
            batch_size: opts.batch_size,
            shapes: &shapes,
            source: &opts.input_data,
            string_length: opts.string_length,
            string_data: opts.string_data.as_deref(),
            seed: opts.seed,
        },
    )?;
    // perf_analyzer turns sequences on from the model's config alone.
    let sequence = match info.sequence {
        Some(control) => {
            let flags = opts.sequence_flags()?;
            let from_file = !matches!(opts.input_data.as_str(), "random" | "zero");
            Some(SequenceOptions {
                start_id: flags.start_id,
                id_range: flags.id_range,
                length: flags.length,
                variation_percent: flags.variation_percent,
                string_ids: control.string_ids,
                // Without --sequence-length, a data file's entries are one
                // sequence's steps, in order.
                fixed_length: (from_file && !flags.length_specified).then_some(sets.len() as u64),
            })
        }
        None => None,
    };
    let regions = match opts.shared_memory {
        SharedMemory::None => None,
        kind => Some(shm::Regions::create(
            kind,
            &target,
            &info,
            &sets,
            opts.batch_size,
            opts.output_shared_memory_size,
        )?),
    };
    let mut prepared = match (target.protocol, &regions) {
        (Protocol::Http, Some(r)) => {
            let bodies = sets
                .iter()
                .zip(&r.refs)
                .map(|(set, refs)| encode_http_shm(&info, set, refs))
                .collect::<anyhow::Result<Vec<_>>>()?;
            request::http_prepared(
                &target.authority,
                &infer_path(opts, &model),
                bodies,
                None,
                true,
            )?
        }
        (Protocol::Grpc, Some(r)) => {
            let bodies = sets
                .iter()
                .zip(&r.refs)
                .map(|(set, refs)| encode_grpc_shm(&info, set, opts.streaming, refs))
                .collect();
            request::grpc_prepared(&target.authority, grpc_method(opts), bodies, opts.streaming)?
        }
        (Protocol::Http, None) => {
            let binary_in = opts.input_format == TensorFormat::Binary;
            let binary_out = opts.output_format == TensorFormat::Binary;
            let mut bodies = Vec::with_capacity(sets.len());
            let mut header_len = None;
            for set in &sets {
                let e = encode_http(&info, set, binary_in, binary_out)?;
                // Each body has its own header length; with several data
                // entries they must agree, which holds for equal shapes.
                if header_len.is_some() && header_len != e.header_len {
                    anyhow::bail!("--input-data entries with different shapes need --input-tensor-format json");
                }
                header_len = e.header_len;
                bodies.push(e.body);
            }
            let path = infer_path(opts, &model);
            request::http_prepared(&target.authority, &path, bodies, header_len, true)?
        }
        (Protocol::Grpc, None) => {
            let bodies = sets
                .iter()
                .map(|s| encode_grpc(&info, s, opts.streaming))
                .collect();
            request::grpc_prepared(&target.authority, grpc_method(opts), bodies, opts.streaming)?
        }
    };
    // -H: part of the headers every request already clones, so a run
    // without them costs nothing more per request.
    for (name, value) in opts.header_pairs()? {
        prepared.headers.append(name, value);
    }
    if let Some(seq) = &sequence {
        prepared.template = Some(match target.protocol {
            Protocol::Http => {
                let header_len = prepared
                    .headers
                    .get("inference-header-content-length")
                    .and_then(|v| v.to_str().ok()?.parse().ok());
                sequence::Template::http(&prepared.bodies, header_len)?
            }
            Protocol::Grpc => sequence::Template::grpc(&prepared.bodies)?,
        });
        prepared.string_ids = seq.string_ids;
        tracing::info!(
            target = %target.label,
            string_ids = seq.string_ids,
            "sequence model: requests carry sequence_id/sequence_start/sequence_end"
        );
    }
    let stats_model = probe::server_counters(&target, &model, &opts.model_version)
        .await
        .map(|_| (model.clone(), opts.model_version.clone()));
    if stats_model.is_none() {
        tracing::info!(target = %target.label, "no statistics extension: server-side breakdown unavailable");
    }
    let metrics_url = metrics_url(opts, &target)?;
    Ok((
        TargetRun {
            index,
            target,
            prepared: Arc::new(prepared),
            stats_model,
            sequence,
            next_ordinal: Arc::default(),
            metrics_url,
        },
        regions,
    ))
}

fn infer_path(opts: &Options, model: &str) -> String {
    if opts.model_version.is_empty() {
        format!("/v2/models/{model}/infer")
    } else {
        format!("/v2/models/{model}/versions/{}/infer", opts.model_version)
    }
}

fn grpc_method(opts: &Options) -> &'static str {
    if opts.streaming {
        "ModelStreamInfer"
    } else {
        "ModelInfer"
    }
}

/// --collect-metrics: where this target's metrics are, checked with one
/// scrape now so a wrong address fails before any load.
fn metrics_url(
    opts: &Options,
    target: &cli::Target,
) -> anyhow::Result<Option<metrics::MetricsUrl>> {
    if !opts.collect_metrics {
        return Ok(None);
    }
    let url = match &opts.metrics_url {
        Some(u) => metrics::MetricsUrl::parse(u)?,
        None => metrics::MetricsUrl::for_target(target),
    };
    metrics::scrape(&url).with_context(|| {
        format!(
            "--collect-metrics: cannot read {}'s metrics at {} (is the server's metrics port elsewhere? see --metrics-url)",
            target.label,
            url.label()
        )
    })?;
    Ok(Some(url))
}

async fn run_async(opts: &Options) -> anyhow::Result<RunReport> {
    // Taken before any request, so every exported timestamp converts from
    // the same pairing of the monotonic and the wall clock.
    let clock = profile::Clock::now();
    let targets = opts.targets()?;
    let steps = opts.load_steps()?;
    let rate = matches!(steps.first(), Some(Load::Rate(_)));
    let mut runs = Vec::with_capacity(targets.len());
    let mut regions = Vec::with_capacity(targets.len());
    for (i, t) in targets.into_iter().enumerate() {
        let (run, r) = prepare(opts, i, t).await?;
        runs.push(run);
        regions.push(r);
    }
    let workers = opts.worker_count()?;
    let plan = Plan {
        mode: opts.measurement_mode,
        interval: Duration::from_millis(opts.measurement_interval_ms),
        request_count: opts.measurement_request_count,
        warmup: Duration::from_millis(
            opts.warmup_ms
                .unwrap_or((opts.measurement_interval_ms / 2).min(1000)),
        ),
        warmup_requests: opts.warmup_request_count,
        stability_percent: opts.stability_percentage,
        max_trials: opts.max_trials,
        percentile: opts.percentile,
        distribution: opts.distribution,
        seed: opts.seed,
        max_outstanding: opts.max_outstanding,
        connections: opts.connections,
        cpus: opts.cpus()?,
        busy_poll: std::time::Duration::from_micros(opts.busy_poll_us),
        direct: !opts.no_direct,
        workers,
        progress: !opts.no_progress && !opts.quiet && std::io::stderr().is_terminal(),
        num_of_sequences: opts.num_of_sequences,
        serial_sequences: opts.serial_sequences,
        intervals: opts.request_intervals()?.map(Arc::from),
        profile: opts.profile_export_file.is_some(),
        metrics_interval: Duration::from_millis(opts.metrics_interval_ms),
    };
    let sequences = runs.iter().any(|r| r.sequence.is_some());
    let multi = runs.len() > 1;
    if !opts.quiet {
        println!(
            "*** shardserve-bench: model '{}' batch {} ; {} ; {} thread(s); windows of {} ***",
            opts.model.as_deref().unwrap_or("(live endpoint)"),
            opts.batch_size,
            runs.iter()
                .map(|r| format!("{} ({:?})", r.target.label, r.target.protocol))
                .collect::<Vec<_>>()
                .join(" vs "),
            workers,
            match opts.measurement_mode {
                MeasurementMode::TimeWindows => format!("{} ms", opts.measurement_interval_ms),
                MeasurementMode::CountWindows =>
                    format!("{} requests", opts.measurement_request_count),
            }
        );
        if let Some(seq) = runs.iter().find_map(|r| r.sequence.as_ref()) {
            let length = match seq.fixed_length {
                Some(n) => format!("{n} requests (the input data's entries)"),
                None => format!("{} ±{}% requests", seq.length, seq.variation_percent),
            };
            let live = if rate {
                format!(
                    "{} live sequence(s){}",
                    opts.num_of_sequences,
                    if opts.serial_sequences {
                        ", serial"
                    } else {
                        ""
                    }
                )
            } else {
                "one live sequence per concurrent request".to_string()
            };
            println!(
                "*** sequence model: sequences of {length}; ids from {}; {live} ***",
                seq.start_id
            );
        }
        println!("{}", report::table_header(multi, rate, sequences));
    }
    let mut results = Vec::with_capacity(steps.len() * runs.len());
    let threshold_us =
        (opts.latency_threshold_ms > 0.0).then_some(opts.latency_threshold_ms * 1000.0);
    let mut search = search::Search::new(steps, threshold_us, opts.binary_search);
    // Interleave: every target at this load before the next load, so a
    // noisy machine affects all targets alike. The first target's latency
    // steers a -l search.
    let swept = async {
        // --shared-memory: registered once for the whole sweep, as
        // perf_analyzer does.
        for r in regions.iter().flatten() {
            r.register().await?;
        }
        while let Some(load) = search.next() {
            let mut headline = f64::NAN;
            for run in &runs {
                let r = measure::run_step(&plan, run, load, opts.batch_size).await?;
                if !opts.quiet {
                    println!("{}", report::table_row(&r, multi));
                }
                if run.index == 0 {
                    headline = r.latency_us.percentile.unwrap_or(r.latency_us.avg);
                }
                results.push(r);
            }
            search.record(headline);
        }
        anyhow::Ok(())
    }
    .await;
    // Whatever ended the sweep, no region stays registered; the shm
    // objects go when `regions` drops.
    let cleaned = shm::unregister_all(&regions).await;
    swept?;
    cleaned?;
    drop(regions);
    let best_load = search.best().map(|l| l.value());
    if let (Some(limit), false) = (threshold_us, opts.quiet) {
        match best_load {
            Some(b) => println!(
                "highest load under the {} ms latency threshold{}: {}",
                opts.latency_threshold_ms,
                if search.is_binary() {
                    " (binary search)"
                } else {
                    ""
                },
                report::fmt_load(b)
            ),
            None => println!(
                "no load measured stays under the latency threshold ({} us)",
                limit
            ),
        }
    }
    let ratios = report::ratios(&results);
    if !opts.quiet {
        print!("{}", report::ratio_table(&ratios));
        if results.iter().any(|r| !r.stable) {
            println!(
                "note: unstable steps did not settle within ±{}% in {} windows",
                opts.stability_percentage, opts.max_trials
            );
        }
    }
    let info = report::RunInfo {
        model: opts.model.as_deref().unwrap_or(""),
        model_version: &opts.model_version,
        batch_size: opts.batch_size,
        mode: if rate { "request_rate" } else { "concurrency" },
        measurement_interval_ms: opts.measurement_interval_ms,
        measurement_mode: match opts.measurement_mode {
            MeasurementMode::TimeWindows => "time_windows",
            MeasurementMode::CountWindows => "count_windows",
        },
        stability_percentage: opts.stability_percentage,
        max_trials: opts.max_trials,
        threads: workers,
    };
    let target_json: Vec<serde_json::Value> = runs
        .iter()
        .map(|r| serde_json::json!({"label": r.target.label, "address": r.target.addr.to_string(), "protocol": r.target.protocol, "statistics": r.stats_model.is_some(), "sequence_model": r.sequence.is_some(), "shared_memory": opts.shared_memory}))
        .collect();
    let mut json = report::json_report(&info, &target_json, &results, &ratios);
    if let Some(limit) = threshold_us {
        json["search"] = serde_json::json!({
            "mode": if opts.binary_search { "binary" } else { "linear" },
            "latency_threshold_us": limit,
            "best_load": best_load,
        });
    }
    if let Some(path) = &opts.csv {
        // One file: each server's rows in turn (steps run interleaved).
        let rows: Vec<&StepResult> = runs
            .iter()
            .flat_map(|run| results.iter().filter(move |r| r.target_index == run.index))
            .collect();
        report::write_file(path, &report::csv(&rows, rate, multi))?;
    }
    if let Some(path) = &opts.json {
        let text = serde_json::to_string_pretty(&json).context("encoding the JSON report")?;
        report::write_file(path, &text)?;
    }
    if let Some(path) = &opts.profile_export_file {
        let export = profile::export(&clock, &results, multi);
        let text = serde_json::to_string_pretty(&export).context("encoding the profile export")?;
        report::write_file(path, &text)?;
    }
    if let Some(path) = &opts.plot {
        let labels: Vec<String> = runs.iter().map(|r| r.target.label.clone()).collect();
        report::write_file(path, &report::svg(&results, &labels))?;
    }
    Ok(RunReport {
        results,
        ratios,
        json,
    })
}
