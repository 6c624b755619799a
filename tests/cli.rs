//! The command line against tritonserver 2.51's: every flag of its `--help`
//! (tests/data/tritonserver-2.51-flags.txt) parses with tritonserver's
//! syntax, has its row in docs/flags.md, and does what that row says —
//! served, or no effect here (logged once).

mod common;

use std::{
    collections::BTreeMap,
    process::{Command, Stdio},
};

use common::{child::ChildServer, get, repo_path};
use shardserve::cli::{self, Cli};

fn tritonserver_flags() -> Vec<String> {
    std::fs::read_to_string(repo_path("tests/data/tritonserver-2.51-flags.txt"))
        .expect("flag list")
        .lines()
        .map(str::trim)
        .filter(|l| !l.is_empty())
        .map(String::from)
        .collect()
}

/// docs/flags.md's first table: flag → disposition.
fn table() -> BTreeMap<String, String> {
    let text = std::fs::read_to_string(repo_path("docs/flags.md")).expect("docs/flags.md");
    let first = text
        .split("## shardserve's own flags")
        .next()
        .expect("the tritonserver table");
    first
        .lines()
        .filter_map(|l| {
            let cells: Vec<&str> = l.split('|').map(str::trim).collect();
            let flag = cells.get(1)?.strip_prefix("`--")?.strip_suffix('`')?;
            Some((format!("--{flag}"), cells.get(2)?.to_string()))
        })
        .collect()
}

/// A valid value for each flag (None: takes no value); for a refused flag,
/// its accepted ("off") value.
fn accepted_value(flag: &str) -> Option<&'static str> {
    Some(match flag {
        "--help" | "--disable-auto-complete-config" => return None,
        "--id" | "--model-config-name" | "--vertex-ai-default-model" | "--load-model" => "name",
        "--log-format" => "ISO8601",
        "--log-file"
        | "--model-store"
        | "--model-repository"
        | "--backend-directory"
        | "--repoagent-directory"
        | "--trace-file"
        | "--grpc-server-cert"
        | "--grpc-server-key"
        | "--grpc-root-cert" => "/tmp/x",
        "--model-control-mode" => "explicit",
        "--http-address" | "--grpc-address" | "--metrics-address" => "127.0.0.1",
        "--http-header-forward-pattern" | "--grpc-header-forward-pattern" => "x-.*",
        "--http-restricted-api" => "health:k=v",
        "--grpc-restricted-protocol" => "health:k=v",
        "--grpc-infer-response-compression-level" => "high",
        "--sagemaker-safe-port-range" => "8080-8090",
        "--metrics-interval-ms" => "1500.5",
        "--metrics-config" => "summary_latencies=true",
        "--trace-config" => "rate=10",
        "--trace-level" => "TIMESTAMPS",
        "--backend-config" => "python,shm-default-byte-size=1048576",
        "--rate-limit" => "off",
        "--cuda-memory-pool-byte-size" | "--cuda-virtual-address-size" => "0:1048576",
        "--min-supported-compute-capability" => "6.0",
        "--host-policy" => "gpu_0,numa-node=0",
        "--model-load-gpu-limit" => "0:0.8",
        "--model-namespacing" | "--allow-sagemaker" | "--allow-vertex-ai" => "false",
        "--response-cache-byte-size" => "1048576",
        "--cache-config" => "local,size=1048576",
        "--cache-directory" => "/tmp/caches",
        "--rate-limit-resource" => "R1:4:0",
        f if f.starts_with("--allow-")
            || f.starts_with("--log-")
            || f.starts_with("--reuse-")
            || [
                "--exit-on-error",
                "--strict-readiness",
                "--enable-peer-access",
                "--grpc-use-ssl",
                "--grpc-use-ssl-mutual",
                "--grpc-keepalive-permit-without-calls",
                "--strict-model-config",
            ]
            .contains(&f) =>
        {
            "true"
        }
        _ => "4",
    })
}

fn parse(args: &[&str]) -> Result<Cli, clap::Error> {
    cli::parse_from(std::iter::once("shardserve").chain(args.iter().copied()))
}

fn base_args() -> Vec<String> {
    vec![
        "--model-repository".into(),
        "/tmp/models".into(),
        "--model-control-mode".into(),
        "explicit".into(),
    ]
}

#[test]
fn every_tritonserver_flag_has_a_row_and_parses() {
    let flags = tritonserver_flags();
    assert_eq!(
        flags.len(),
        87,
        "tritonserver 2.51's --help lists 87 options"
    );
    let table = table();
    let mut problems = Vec::new();
    for flag in &flags {
        match table.get(flag).map(String::as_str) {
            Some("served" | "no effect here") => {}
            other => problems.push(format!("{flag}: table says {other:?}")),
        }
        if flag == "--help" {
            let e = parse(&["--help"]).expect_err("help exits");
            assert_eq!(e.kind(), clap::error::ErrorKind::DisplayHelp);
            continue;
        }
        let mut args = base_args();
        match accepted_value(flag) {
            Some(v) => {
                // Both of tritonserver's spellings: `--flag=value` and `--flag value`.
                let mut joined = args.clone();
                joined.push(format!("{flag}={v}"));
                let joined: Vec<&str> = joined.iter().map(String::as_str).collect();
                if let Err(e) = parse(&joined)
                    .map_err(|e| e.to_string())
                    .and_then(|c| c.validate().map_err(|e| e.to_string()))
                {
                    problems.push(format!("{flag}={v}: {e}"));
                }
                args.push(flag.clone());
                args.push(v.into());
            }
            None => args.push(flag.clone()),
        }
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        match parse(&args) {
            Ok(c) => {
                if let Err(e) = c.validate() {
                    problems.push(format!("{flag}: refused with its accepted value: {e}"));
                }
            }
            Err(e) => problems.push(format!("{args:?}: {e}")),
        }
    }
    // Every row of the table is one of 2.51's flags: the table holds no stale rows.
    for flag in table.keys() {
        if !flags.contains(flag) && flag != "--http-max-input-size" {
            problems.push(format!(
                "{flag}: in docs/flags.md but not in tritonserver 2.51"
            ));
        }
    }
    assert!(problems.is_empty(), "{}", problems.join("\n"));
}

#[test]
fn no_flag_is_refused() {
    // Issue 24 served the last eight; a new "refused" row needs a refusal in
    // `cli::disposition` and a test of it again.
    let table = table();
    assert!(table.len() >= 87, "{}", table.len());
    let refused: Vec<&String> = table
        .iter()
        .filter(|(_, d)| d.as_str() != "served" && d.as_str() != "no effect here")
        .map(|(f, _)| f)
        .collect();
    assert!(refused.is_empty(), "{refused:?}");
}

#[test]
fn no_effect_flags_say_so_and_served_flags_do_not() {
    let table = table();
    for (flag, disposition) in &table {
        let Some(value) = accepted_value(flag) else {
            continue;
        };
        if flag == "--help" {
            continue;
        }
        let mut args = base_args();
        args.push(format!("{flag}={value}"));
        let args: Vec<&str> = args.iter().map(String::as_str).collect();
        let c = parse(&args).unwrap_or_else(|e| panic!("{args:?}: {e}"));
        let says = format!("{flag} has no effect in shardserve: ");
        let notes: Vec<String> = c.notes().into_iter().map(|n| n.text).collect();
        let count = notes.iter().filter(|n| n.starts_with(&says)).count();
        match disposition.as_str() {
            "no effect here" => assert_eq!(count, 1, "{flag}: {notes:?}"),
            _ => assert_eq!(count, 0, "{flag}: {notes:?}"),
        }
    }
    // Not given: nothing said.
    let c = parse(&["--model-repository", "/tmp/m"]).expect("parse");
    assert!(c.notes().is_empty(), "{:?}", c.notes());
}

#[test]
fn rate_limit_flags_reach_the_server_options() {
    let c = parse(&[
        "--model-repository=/tmp/m",
        "--rate-limit=EXECUTION_COUNT",
        "--rate-limit-resource=R1:4",
        "--rate-limit-resource",
        "R2:2:1",
    ])
    .expect("parse");
    c.validate().expect("served, not refused");
    let o = c
        .server_options(shardserve::tuning::TuningProfile::default())
        .expect("options");
    assert!(o.rate_limit);
    let given: Vec<(String, u32, Option<u32>)> = o
        .rate_limit_resources
        .iter()
        .map(|r| (r.name.clone(), r.count, r.device))
        .collect();
    assert_eq!(
        given,
        vec![("R1".into(), 4, None), ("R2".into(), 2, Some(1))]
    );
    let c = parse(&["--model-repository=/tmp/m"]).expect("parse");
    let o = c
        .server_options(shardserve::tuning::TuningProfile::default())
        .expect("options");
    assert!(!o.rate_limit && o.rate_limit_resources.is_empty());
}

#[test]
fn flags_reach_the_server_options() {
    let c = parse(&[
        "--model-store=/tmp/m",
        "--id",
        "my-triton",
        "--exit-on-error=false",
        "--strict-readiness",
        "0",
        "--disable-auto-complete-config",
        "--model-config-name=h100",
        "--model-load-thread-count=2",
        "--model-load-retry-count=3",
        "--http-address=127.0.0.2",
        "--grpc-address=::1",
        "--reuse-http-port=ON",
        "--reuse-grpc-port=1",
        "--http-header-forward-pattern=x-.*",
        "--grpc-header-forward-pattern=y-.*",
        "--grpc-keepalive-permit-without-calls=true",
        "--grpc-http2-max-pings-without-data=0",
        "--grpc-http2-min-recv-ping-interval-without-data=1000",
        "--grpc-http2-max-ping-strikes=5",
        "--grpc-max-connection-age=60000",
        "--grpc-max-connection-age-grace=5000",
        "--metrics-address=127.0.0.3",
        "--allow-gpu-metrics=false",
        "--metrics-config=summary_latencies=true",
        "--metrics-config",
        "summary_quantiles=0.5:0.05,0.9:0.01",
        "--metrics-interval-ms=250",
        "--exit-timeout-secs=7",
        "--log-verbose=true",
        "--log-info=false",
        "--log-format=ISO8601",
        "--log-file=/tmp/triton.log",
    ])
    .expect("parse");
    c.validate().expect("valid");
    let o = c
        .server_options(shardserve::tuning::TuningProfile::default())
        .expect("options");
    assert_eq!(o.server_name, "my-triton");
    assert!(!o.exit_on_error && !o.strict_readiness && o.strict_model_config);
    assert_eq!(o.model_config_name.as_deref(), Some("h100"));
    assert_eq!(
        (o.model_load_thread_count, o.model_load_retry_count),
        (2, 3)
    );
    assert_eq!(o.http_address, Some("127.0.0.2".parse().expect("ip")));
    assert_eq!(o.grpc_address, Some("::1".parse().expect("ip")));
    assert_eq!(o.metrics_address, Some("127.0.0.3".parse().expect("ip")));
    assert!(o.reuse_http_port && o.reuse_grpc_port);
    assert_eq!(o.http_header_forward_pattern.as_deref(), Some("x-.*"));
    assert_eq!(o.grpc_header_forward_pattern.as_deref(), Some("y-.*"));
    assert!(o.grpc_keepalive_permit_without_calls);
    assert_eq!(o.grpc_http2_max_pings_without_data, 0);
    assert_eq!(
        o.grpc_http2_min_recv_ping_interval_without_data,
        std::time::Duration::from_millis(1000)
    );
    assert_eq!(o.grpc_http2_max_ping_strikes, 5);
    assert_eq!(
        o.grpc_max_connection_age,
        Some(std::time::Duration::from_millis(60_000))
    );
    assert_eq!(
        o.grpc_max_connection_age_grace,
        Some(std::time::Duration::from_millis(5_000))
    );
    assert!(!o.allow_gpu_metrics && o.allow_cpu_metrics);
    assert_eq!(o.metrics_config.len(), 2);
    assert_eq!(o.metrics_interval, std::time::Duration::from_millis(250));
    assert_eq!(o.exit_timeout, std::time::Duration::from_secs(7));
    let log = c.log_settings();
    assert_eq!(log.verbose, 1);
    assert!(!log.info && log.warning && log.error);
    assert_eq!(log.format, cli::LogFormat::Iso8601);
    assert_eq!(
        log.file.as_deref(),
        Some(std::path::Path::new("/tmp/triton.log"))
    );

    // Defaults are tritonserver's.
    let c = parse(&["--model-repository=/tmp/m"]).expect("parse");
    let o = c
        .server_options(shardserve::tuning::TuningProfile::default())
        .expect("options");
    assert!(o.exit_on_error && o.strict_readiness && !o.strict_model_config);
    assert_eq!(o.model_load_thread_count, 4);
    assert_eq!(o.server_name, "triton");
    assert_eq!(c.log_settings(), cli::LogSettings::default());
    // Deprecated spelling, and the old name of --id.
    let c = parse(&[
        "--model-repository=/tmp/m",
        "--strict-model-config",
        "--server-name=x",
    ])
    .expect("parse");
    let o = c
        .server_options(shardserve::tuning::TuningProfile::default())
        .expect("options");
    assert!(o.strict_model_config);
    assert_eq!(o.server_name, "x");
    // --allow-metrics=false turns the per-kind switches off, as tritonserver.
    let c = parse(&["--model-repository=/tmp/m", "--allow-metrics=false"]).expect("parse");
    let o = c
        .server_options(shardserve::tuning::TuningProfile::default())
        .expect("options");
    assert!(!o.allow_gpu_metrics && !o.allow_cpu_metrics);
}

#[test]
fn bad_values_name_the_flag() {
    for (args, flag) in [
        (vec!["--exit-on-error=maybe"], "--exit-on-error"),
        (
            vec!["--model-load-thread-count=-1"],
            "--model-load-thread-count",
        ),
        (
            vec!["--model-load-thread-count=0"],
            "--model-load-thread-count",
        ),
        (
            vec!["--model-load-retry-count=x"],
            "--model-load-retry-count",
        ),
        (vec!["--log-format=xml"], "--log-format"),
        (vec!["--log-verbose=-2"], "--log-verbose"),
        (vec!["--http-port=70000"], "--http-port"),
        (vec!["--http-address=not-an-ip"], "--http-address"),
        (
            vec!["--model-control-mode=sometimes"],
            "--model-control-mode",
        ),
        (vec!["--rate-limit=fast"], "--rate-limit"),
        (vec!["--rate-limit-resource=R1"], "--rate-limit-resource"),
        (
            vec!["--cuda-memory-pool-byte-size=1024"],
            "--cuda-memory-pool-byte-size",
        ),
        (
            vec!["--cuda-memory-pool-byte-size=a:1"],
            "--cuda-memory-pool-byte-size",
        ),
        (vec!["--host-policy=gpu_0,numa-node"], "--host-policy"),
        (vec!["--model-load-gpu-limit=0:2"], "--model-load-gpu-limit"),
        (
            vec!["--metrics-config=summary_latencies"],
            "--metrics-config",
        ),
        (vec!["--metrics-interval-ms=0"], "--metrics-interval-ms"),
        (vec!["--model-config-name="], "--model-config-name"),
        (
            vec!["--sagemaker-safe-port-range=9000"],
            "--sagemaker-safe-port-range",
        ),
        (vec!["--cache-config=size=10"], "--cache-config"),
        (
            vec!["--grpc-max-connection-age=-5"],
            "--grpc-max-connection-age",
        ),
    ] {
        let mut all = vec!["--model-repository=/tmp/m"];
        all.extend(args.iter().copied());
        let e = parse(&all)
            .expect_err(&format!("{args:?} must be refused"))
            .to_string();
        assert!(e.contains(flag), "{args:?}: {e}");
    }
    // A check across flags, as tritonserver's.
    let c = parse(&["--model-repository=/tmp/m", "--load-model=simple"]).expect("parse");
    let e = c
        .validate()
        .expect_err("--load-model without explicit mode")
        .to_string();
    assert!(e.contains("--model-control-mode=explicit"), "{e}");
}

#[test]
fn help_has_tritonservers_groups_and_every_flag() {
    let help = cli::help_text();
    for heading in [
        "Server:",
        "Logging:",
        "Model Repository:",
        "HTTP:",
        "GRPC:",
        "Sagemaker:",
        "Vertex:",
        "Metrics:",
        "Tracing:",
        "Backend:",
        "Repository Agent:",
        "Response Cache:",
        "Rate Limiter:",
        "Memory/Device Management:",
        "DEPRECATED:",
        "shardserve:",
    ] {
        assert!(
            help.lines().any(|l| l.trim_end() == heading),
            "no heading {heading:?} in:\n{help}"
        );
    }
    for flag in tritonserver_flags() {
        let shown = help.match_indices(flag.as_str()).any(|(at, _)| {
            !help[at + flag.len()..].starts_with(|c: char| c.is_ascii_alphanumeric() || c == '-')
        });
        assert!(shown, "{flag} missing from --help");
    }
    // Headings in tritonserver's order.
    let at = |h: &str| help.find(&format!("\n{h}:\n")).unwrap_or(usize::MAX);
    assert!(at("Server") < at("Logging") && at("Logging") < at("Model Repository"));
    assert!(at("GRPC") < at("Sagemaker") && at("Memory/Device Management") < at("DEPRECATED"));
}

fn run_binary(args: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(env!("CARGO_BIN_EXE_shardserve"))
        .args(args)
        .env_remove("SHARDSERVE_LOG")
        .stdin(Stdio::null())
        .output()
        .expect("run shardserve");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

#[test]
fn the_binary_refuses_missing_features_and_bad_values_with_status_1() {
    let repo = repo_path("models");
    let repo = repo.to_string_lossy();
    for (flag, expect) in [
        ("--cache-config=local,size=abc", "size 'abc'"),
        ("--cache-config=redis,host=x", "libtritoncache_redis.so"),
        (
            "--rate-limit-resource=R1:x",
            "--rate-limit-resource option format is '<resource_name>:<count>:<device>' or '<resource_name>:<count>'. Got R1:x",
        ),
        ("--exit-on-error=maybe", "--exit-on-error"),
        ("--model-load-thread-count=-1", "--model-load-thread-count"),
    ] {
        let (code, stderr) = run_binary(&["--model-repository", &repo, "--http-port=0", flag]);
        assert_eq!(code, Some(1), "{flag}: {stderr}");
        assert!(stderr.contains(expect), "{flag}: {stderr}");
    }
    let (code, stdout_help) = {
        let out = Command::new(env!("CARGO_BIN_EXE_shardserve"))
            .arg("--help")
            .output()
            .expect("run shardserve");
        (
            out.status.code(),
            String::from_utf8_lossy(&out.stdout).into_owned(),
        )
    };
    assert_eq!(code, Some(0));
    assert!(stdout_help.contains("Model Repository:"), "{stdout_help}");
}

#[test]
fn the_binary_serves_id_and_addresses_and_logs_no_effect_flags_once() {
    let server = ChildServer::spawn(
        "cli-flags",
        None,
        &[
            "--id=fleet-7",
            "--http-address=127.0.0.2",
            "--http-thread-count",
            "8",
            "--host-policy=gpu_0,numa-node=0",
            "--host-policy=gpu_1,numa-node=1",
            "--cuda-memory-pool-byte-size=0:1048576",
            "--enable-peer-access=false",
            "--allow-sagemaker=false",
            "--rate-limit=off",
            "--response-cache-byte-size=0",
        ],
    );
    // --http-address moves HTTP; metrics follows it (tritonserver's default); gRPC keeps --host.
    assert_eq!(server.http.ip().to_string(), "127.0.0.2");
    assert_eq!(server.metrics.ip().to_string(), "127.0.0.2");
    assert_eq!(server.grpc.ip().to_string(), "127.0.0.1");
    let meta = get(server.http, "/v2").json();
    assert_eq!(meta["name"], "fleet-7", "{meta}");
    let log = server.log();
    for flag in [
        "--http-thread-count",
        "--host-policy",
        "--cuda-memory-pool-byte-size",
        "--enable-peer-access",
    ] {
        let said = format!("{flag} has no effect in shardserve");
        assert_eq!(log.matches(&said).count(), 1, "{flag}:\n{log}");
    }
    assert_eq!(
        log.matches("--response-cache-byte-size is deprecated")
            .count(),
        1,
        "{log}"
    );
}

/// tritonserver's start-up rule through the binary: a model that fails to
/// load stops the server with status 1 naming it (`--exit-on-error`
/// defaults to true); with `--exit-on-error=false` the others serve.
#[test]
fn the_binary_exits_1_when_a_model_fails_at_start_up_unless_told_not_to() {
    let dir = std::env::temp_dir().join(format!("shardserve-cli-exit-{}", std::process::id()));
    let _ = std::fs::remove_dir_all(&dir);
    let broken = dir.join("broken");
    std::fs::create_dir_all(broken.join("1")).expect("model folder");
    std::fs::write(
        broken.join("config.pbtxt"),
        "name: \"broken\"\nbackend: \"no_such_backend\"\nmax_batch_size: 0\n",
    )
    .expect("config");
    let repo = dir.to_string_lossy().into_owned();
    let (code, stderr) = run_binary(&[
        "--model-repository",
        &repo,
        "--host=127.0.0.1",
        "--http-port=0",
        "--grpc-port=0",
        "--metrics-port=0",
        "--cores=1",
        "--no-pin",
    ]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("failed to load all models") && stderr.contains("broken"),
        "{stderr}"
    );
    // The same repository with --exit-on-error=false serves.
    // (The harness waits for ready: a failed model keeps a server with the
    // default strict readiness from ever being ready.)
    let server = ChildServer::spawn_in(
        "cli-exit",
        &dir,
        1,
        None,
        &["--exit-on-error=false", "--strict-readiness=false"],
    );
    assert_eq!(get(server.http, "/v2/health/ready").status, 200);
    let model = get(server.http, "/v2/models/broken/ready");
    assert_ne!(model.status, 200);
    let _ = std::fs::remove_dir_all(&dir);
}

// issue 24: SageMaker and Vertex AI
#[test]
fn sagemaker_and_vertex_flags_reach_the_server_options() {
    let c = parse(&[
        "--model-repository=/tmp/m",
        "--allow-sagemaker",
        "--sagemaker-port=9090",
        "--sagemaker-safe-port-range=8000-9100",
        "--allow-vertex-ai=true",
        "--vertex-ai-port",
        "9091",
        "--vertex-ai-default-model=simple",
    ])
    .expect("parse");
    c.validate().expect("valid");
    let o = c
        .server_options(shardserve::tuning::TuningProfile::default())
        .expect("options");
    assert!(o.allow_sagemaker && o.allow_vertex_ai);
    assert_eq!((o.sagemaker_port, o.vertex_ai_port), (9090, 9091));
    assert_eq!(o.sagemaker_safe_port_range, Some((8000, 9100)));
    assert_eq!(o.vertex_ai_default_model.as_deref(), Some("simple"));
    // Vertex AI on by flag leaves HTTP and gRPC on (only AIP_MODE turns them off).
    assert!(o.allow_http && o.allow_grpc);
    let c = parse(&["--model-repository=/tmp/m"]).expect("parse");
    let o = c
        .server_options(shardserve::tuning::TuningProfile::default())
        .expect("options");
    assert!(!o.allow_sagemaker && o.sagemaker_safe_port_range.is_none());
    assert_eq!((o.sagemaker_port, o.vertex_ai_port), (8080, 8080));
}
