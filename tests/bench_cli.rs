//! shardserve-bench against the project's server in-process: every mode
//! gives sane numbers, rejections are counted as errors, the CSV/JSON
//! outputs have their schema, and failures exit with clear messages.

mod common;

use std::process::Command;

use clap::Parser;
use shardserve::bench::{self, cli::Options, measure::StepResult};

const BIN: &str = env!("CARGO_BIN_EXE_shardserve-bench");

fn run(extra: &[&str]) -> Vec<StepResult> {
    let opts = Options::try_parse_from(common::bench_args(extra)).expect("arguments parse");
    bench::run(&opts).expect("bench runs").results
}

fn check_sane(r: &StepResult) {
    let l = &r.latency_us;
    assert!(r.requests > 0, "no successful request: {r:?}");
    assert_eq!(r.errors, 0, "unexpected errors: {:?}", r.first_error);
    assert!(
        l.min <= l.p50 && l.p50 <= l.p90 && l.p90 <= l.p95 && l.p95 <= l.p99 && l.p99 <= l.max,
        "{l:?}"
    );
    assert!(l.min <= l.avg && l.avg <= l.max, "{l:?}");
    // Throughput is completions over the measured time, nothing more.
    let expected = r.requests as f64 / r.measured_seconds;
    assert!(
        (r.requests_per_second - expected).abs() <= expected * 1e-9,
        "{r:?}"
    );
    // The measured windows are the last (at most 3) of 150 ms each.
    assert!(
        r.measured_seconds > 0.1 && r.measured_seconds < 3.0 * 0.15 * 2.0,
        "{r:?}"
    );
    assert!((1..=3).contains(&r.windows));
}

#[test]
fn closed_loop_http_json_binary_and_grpc() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let grpc = server.grpc_addr().to_string();

    let json = run(&[
        "-m",
        "simple",
        "-u",
        &http,
        "--input-tensor-format",
        "json",
        "--output-tensor-format",
        "json",
        "--concurrency-range",
        "1:2",
    ]);
    assert_eq!(json.len(), 2);
    for r in &json {
        check_sane(r);
        assert_eq!(r.mode, "concurrency");
        let s = r
            .server
            .as_ref()
            .expect("shardserve has the statistics extension");
        assert!(s.requests > 0 && s.compute_infer_us >= 0.0, "{s:?}");
    }
    assert_eq!(json[1].load, 2.0);

    let binary = run(&[
        "-m",
        "simple",
        "-u",
        &http,
        "-b",
        "2",
        "--concurrency-range",
        "4",
    ]);
    check_sane(&binary[0]);
    // A batch of 2 per request: inferences are twice the requests.
    assert!((binary[0].throughput - 2.0 * binary[0].requests_per_second).abs() < 1e-6);

    let g = run(&[
        "-m",
        "simple",
        "-i",
        "grpc",
        "-u",
        &grpc,
        "--concurrency-range",
        "1,8",
        "--connections",
        "2",
        "--threads",
        "2",
    ]);
    assert_eq!(g.len(), 2);
    g.iter().for_each(check_sane);
    assert!(g[0].server.is_some());
    server.shutdown().expect("server stops");
}

#[test]
fn open_loop_constant_and_poisson() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let grpc = server.grpc_addr().to_string();
    // Rates the server meets easily: completions track the schedule.
    let c = run(&["-m", "simple", "-u", &http, "--request-rate-range", "200"]);
    check_sane(&c[0]);
    assert_eq!(c[0].mode, "request_rate");
    assert!(
        c[0].requests_per_second > 100.0 && c[0].requests_per_second < 300.0,
        "{:?}",
        c[0]
    );

    let p = run(&[
        "-m",
        "simple",
        "-i",
        "grpc",
        "-u",
        &grpc,
        "--request-rate-range",
        "300",
        "--request-distribution",
        "poisson",
        "--seed",
        "7",
    ]);
    check_sane(&p[0]);
    assert!(
        p[0].requests_per_second > 120.0 && p[0].requests_per_second < 600.0,
        "{:?}",
        p[0]
    );
    // The bench closed what it opened: a worker that let its runtime go
    // with connection tasks pending left their sockets open (with a
    // request maybe half sent, which held the server's shutdown to its
    // exit timeout).
    assert_connections_close(&server);
    server.shutdown().expect("server stops");
}

/// The server's open client connections (every shard, the metrics one
/// asking included) fall to that one within a few seconds.
fn assert_connections_close(server: &shardserve::server::ServerHandle) {
    let open = || common::metric_sum(server.metrics_addr(), "shardserve_shard_connections");
    let mut last = open();
    for _ in 0..100 {
        if last <= 1 {
            return;
        }
        std::thread::sleep(std::time::Duration::from_millis(30));
        last = open();
    }
    panic!("{last} connections still open after the bench ended (1 is the metrics request)");
}

/// An open loop whose gaps are under 2 ms on one generator thread: the
/// first version yielded through them, its runtime never parked, and on
/// io_uring no answer was ever read (0 completions at 500 req/s and up).
#[test]
fn open_loop_with_sub_millisecond_gaps_completes_requests() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let r = run(&[
        "-m",
        "simple",
        "-u",
        &http,
        "--threads",
        "1",
        "--request-rate-range",
        "2000",
    ]);
    check_sane(&r[0]);
    server.shutdown().expect("server stops");
}

/// Runs the binary; its exit code and stderr.
fn run_bin(extra: &[&str]) -> (Option<i32>, String) {
    let out = Command::new(BIN)
        .args(["-p", "150", "--max-trials", "3", "--warmup", "50"])
        .args(extra)
        .output()
        .expect("the bench binary runs");
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A step where every request fails is an error with the server's reason
/// (exit 1), not a table of zeros marked stable.
#[test]
fn a_step_where_every_request_fails_stops_with_the_servers_reason() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let grpc = server.grpc_addr().to_string();
    // simple's max_batch_size is 8.
    let (code, err) = run_bin(&["-m", "simple", "-u", &http, "-b", "9"]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("concurrency 1") && err.contains("failed; first error: HTTP 400"),
        "{err}"
    );

    let opts = Options::try_parse_from(common::bench_args(&[
        "-m", "simple", "-i", "grpc", "-u", &grpc, "--shape", "INPUT0:8",
    ]))
    .expect("arguments parse");
    let e = format!("{:#}", bench::run(&opts).expect_err("every request fails"));
    assert!(e.contains("INVALID_ARGUMENT"), "{e}");

    // ModelStreamInfer: the streaming mode measures like unary calls.
    check_sane(&run(&["-m", "simple", "-i", "grpc", "-u", &grpc, "--streaming"])[0]);

    // The server stays healthy and the bench still measures it.
    check_sane(&run(&["-m", "simple", "-u", &http])[0]);
    server.shutdown().expect("server stops");
}

/// gRPC pointed at the HTTP port says so instead of "connection error".
#[test]
fn grpc_against_an_http_port_is_named_as_such() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    for extra in [&["-m", "simple"][..], &["--endpoint", "live"]] {
        let mut a = vec!["-i", "grpc", "-u", &http];
        a.extend_from_slice(extra);
        let (code, err) = run_bin(&a);
        assert_eq!(code, Some(1), "{err}");
        assert!(
            err.contains(&format!("{http} is not a gRPC endpoint")),
            "{extra:?}: {err}"
        );
    }
    server.shutdown().expect("server stops");
}

/// A minimal HTTP/1.1 server answering every GET of a model's metadata
/// with `metadata` and everything else (the config) with 404.
fn fake_metadata_server(metadata: &'static str) -> std::net::SocketAddr {
    use std::io::{Read, Write};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let mut head = Vec::new();
            let mut byte = [0u8; 1];
            while !head.ends_with(b"\r\n\r\n") {
                match conn.read(&mut byte) {
                    Ok(1) => head.push(byte[0]),
                    _ => break,
                }
            }
            let head = String::from_utf8_lossy(&head);
            let path = head.split_whitespace().nth(1).unwrap_or("");
            let (status, body) = if path.ends_with("/config") || path.ends_with("/stats") {
                ("404 Not Found", r#"{"error":"not here"}"#)
            } else {
                ("200 OK", metadata)
            };
            let _ = write!(
                conn,
                "HTTP/1.1 {status}\r\nContent-Type: application/json\r\nContent-Length: {}\r\nConnection: close\r\n\r\n{body}",
                body.len()
            );
        }
    });
    addr
}

#[test]
fn a_model_whose_metadata_lists_no_inputs_is_refused_before_the_load() {
    let addr = fake_metadata_server(
        r#"{"name":"hollow","versions":["1"],"platform":"x","inputs":[],"outputs":[{"name":"OUT","datatype":"FP32","shape":[1]}]}"#,
    );
    let (code, err) = run_bin(&["-m", "hollow", "-u", &addr.to_string()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("model 'hollow' lists no inputs in its metadata"),
        "{err}"
    );
    assert!(!err.contains("connection error"), "{err}");
}

/// -H reaches the server on every request: with a forward pattern that
/// matches it, a reserved name makes the server refuse each request (its
/// reason comes back), an ordinary one is forwarded and served.
#[test]
fn headers_go_with_every_http_and_grpc_request() {
    let mut o = shardserve::server::ServerOptions::for_tests(common::repo_path("models"));
    o.cores = Some(1);
    o.http_header_forward_pattern = Some("^triton_|^x-fwd-".into());
    o.grpc_header_forward_pattern = Some("^triton_|^x-fwd-".into());
    let server = common::start_with(o);
    let http = server.http_addr().to_string();
    let grpc = server.grpc_addr().to_string();
    for (proto, url) in [("http", &http), ("grpc", &grpc)] {
        let (code, err) = run_bin(&[
            "-m",
            "simple",
            "-i",
            proto,
            "-u",
            url,
            "-H",
            "x-fwd-a: 1",
            "-H",
            "Triton_Probe:yes",
        ]);
        assert_eq!(code, Some(1), "{proto}: {err}");
        assert!(
            err.contains("Header 'triton_probe' is reserved for Triton usage"),
            "{proto}: {err}"
        );
        check_sane(&run(&["-m", "simple", "-i", proto, "-u", url, "-H", "X-Fwd-A: 1"])[0]);
    }
    let (code, err) = run_bin(&["-m", "simple", "-u", &http, "-H", "no colon"]);
    assert_eq!(code, Some(2), "{err}");
    server.shutdown().expect("server stops");
}

/// --request-intervals: one open-loop step at the intervals' mean rate,
/// also with the gaps shared by two threads.
#[test]
fn request_intervals_drive_an_open_loop() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let dir = std::env::temp_dir().join(format!("bench-intervals-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("intervals.txt");
    std::fs::write(&file, "2000\n1000\n\n3000\n").unwrap();
    let f = file.to_string_lossy().to_string();
    for threads in ["1", "2"] {
        let r = run(&[
            "-m",
            "simple",
            "-u",
            &http,
            "--request-intervals",
            &f,
            "--threads",
            threads,
        ]);
        assert_eq!(r.len(), 1);
        check_sane(&r[0]);
        assert_eq!(r[0].mode, "request_rate");
        assert!((r[0].load - 500.0).abs() < 1e-9, "{:?}", r[0].load);
    }
    std::fs::write(&file, "100\nfast\n").unwrap();
    let (code, err) = run_bin(&["-m", "simple", "-u", &http, "--request-intervals", &f]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("line 2"), "{err}");
    let (code, err) = run_bin(&[
        "-m",
        "simple",
        "-u",
        &http,
        "--request-intervals",
        &f,
        "--concurrency-range",
        "2",
    ]);
    assert_eq!(code, Some(2), "{err}");
    std::fs::remove_dir_all(&dir).ok();
    server.shutdown().expect("server stops");
}

#[test]
fn compare_two_targets_gives_ratios() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let grpc = format!("{},grpc", server.grpc_addr());
    let opts = Options::try_parse_from(common::bench_args(&[
        "-m",
        "simple",
        "-u",
        &http,
        "--compare",
        &grpc,
        "--concurrency-range",
        "1,2",
    ]))
    .unwrap();
    let report = bench::run(&opts).expect("bench runs");
    assert_eq!(report.results.len(), 4);
    // Interleaved: target 0, target 1 at each load.
    let order: Vec<(usize, f64)> = report
        .results
        .iter()
        .map(|r| (r.target_index, r.load))
        .collect();
    assert_eq!(order, vec![(0, 1.0), (1, 1.0), (0, 2.0), (1, 2.0)]);
    assert_eq!(report.ratios.len(), 2);
    assert!(report
        .ratios
        .iter()
        .all(|r| r.throughput > 0.0 && r.p50 > 0.0));

    // -f holds every server's rows, each server's in turn, naming it.
    let dir = std::env::temp_dir().join(format!("bench-compare-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("compare.csv");
    let mut a = common::bench_args(&["-m", "simple", "-u", &http, "--compare", &grpc]);
    a.extend(["--concurrency-range".into(), "1,2".into(), "-f".into()]);
    a.push(csv.to_string_lossy().to_string());
    bench::run(&Options::try_parse_from(a).unwrap()).expect("bench runs");
    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 5, "{text}");
    assert!(
        lines[0].starts_with("Concurrency,Inferences/Second,") && lines[0].ends_with(",Server")
    );
    let quoted = format!("\"{grpc}\"");
    for (line, (load, server)) in lines[1..].iter().zip([
        ("1", http.as_str()),
        ("2", http.as_str()),
        ("1", quoted.as_str()),
        ("2", quoted.as_str()),
    ]) {
        assert!(line.starts_with(&format!("{load},")), "{line}");
        assert!(line.ends_with(&format!(",{server}")), "{line}");
    }
    std::fs::remove_dir_all(&dir).ok();
    server.shutdown().expect("server stops");
}

#[test]
fn live_endpoint_mode_needs_no_model() {
    let server = common::start_server(1);
    let r = run(&[
        "--endpoint",
        "live",
        "-u",
        &server.http_addr().to_string(),
        "--concurrency-range",
        "2",
    ]);
    check_sane(&r[0]);
    assert!(r[0].server.is_none());
    let g = run(&[
        "--endpoint",
        "live",
        "-i",
        "grpc",
        "-u",
        &server.grpc_addr().to_string(),
    ]);
    check_sane(&g[0]);
    server.shutdown().expect("server stops");
}

#[test]
fn binary_writes_csv_json_and_plot() {
    let server = common::start_server(1);
    let dir = std::env::temp_dir().join(format!("bench-cli-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let (csv, json, svg) = (
        dir.join("out.csv"),
        dir.join("out.json"),
        dir.join("out.svg"),
    );
    let out = Command::new(BIN)
        .args([
            "-m",
            "simple",
            "-u",
            &server.http_addr().to_string(),
            "--concurrency-range",
            "1:3:2",
            "-p",
            "150",
            "--max-trials",
            "2",
            "--warmup",
            "20",
            "--percentile",
            "99",
        ])
        .arg("-f")
        .arg(&csv)
        .arg("--json")
        .arg(&json)
        .arg("--plot")
        .arg(&svg)
        .output()
        .expect("runs");
    let stdout = String::from_utf8_lossy(&out.stdout);
    assert!(
        out.status.success(),
        "stdout: {stdout}\nstderr: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert!(
        stdout.contains("Infer/s") && stdout.contains("p99 us"),
        "{stdout}"
    );

    let text = std::fs::read_to_string(&csv).unwrap();
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(
        lines[0],
        "Concurrency,Inferences/Second,Client Send,Network+Server Send/Recv,Server Queue,Server Compute Input,\
         Server Compute Infer,Server Compute Output,Client Recv,p50 latency,p90 latency,p95 latency,p99 latency,\
         Avg latency,request/response,response wait"
    );
    assert_eq!(lines.len(), 3, "{text}");
    for (line, conc) in lines[1..].iter().zip(["1", "3"]) {
        let f: Vec<&str> = line.split(',').collect();
        assert_eq!(f.len(), 16);
        assert_eq!(f[0], conc);
        let n: Vec<f64> = f.iter().map(|v| v.parse().expect("numeric")).collect();
        assert!(n[1] > 0.0);
        assert!(n[9] <= n[10] && n[10] <= n[11] && n[11] <= n[12], "{line}");
    }

    let v: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&json).unwrap()).unwrap();
    assert_eq!(v["tool"], "shardserve-bench");
    assert_eq!(v["run"]["mode"], "concurrency");
    assert_eq!(v["targets"][0]["protocol"], "http");
    assert_eq!(v["targets"][0]["statistics"], true);
    let steps = v["steps"].as_array().unwrap();
    assert_eq!(steps.len(), 2);
    for s in steps {
        for k in [
            "throughput",
            "requests",
            "errors",
            "stable",
            "windows",
            "load",
        ] {
            assert!(!s[k].is_null(), "missing {k} in {s}");
        }
        for k in ["avg", "p50", "p90", "p95", "p99", "percentile"] {
            assert!(s["latency_us"][k].is_number(), "missing latency {k} in {s}");
        }
        assert!(s["server"]["compute_infer_us"].is_number());
    }
    assert!(std::fs::read_to_string(&svg).unwrap().starts_with("<svg"));
    std::fs::remove_dir_all(&dir).ok();
    server.shutdown().expect("server stops");
}

#[test]
fn unknown_model_unreachable_server_and_bad_flags() {
    let server = common::start_server(1);
    let out = Command::new(BIN)
        .args(["-m", "no_such_model", "-u", &server.http_addr().to_string()])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(
        err.contains("no_such_model") && err.contains("unknown model"),
        "{err}"
    );

    let out = Command::new(BIN)
        .args([
            "-m",
            "no_such_model",
            "-i",
            "grpc",
            "-u",
            &server.grpc_addr().to_string(),
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{err}");
    assert!(err.contains("unknown model"), "{err}");
    server.shutdown().expect("server stops");

    for proto in ["http", "grpc"] {
        let out = Command::new(BIN)
            .args(["-m", "simple", "-i", proto, "-u", "127.0.0.1:1"])
            .output()
            .unwrap();
        let err = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{err}");
        assert!(
            err.contains("cannot connect to 127.0.0.1:1: connection refused"),
            "{err}"
        );
    }

    for bad in [
        &["-m", "simple", "--concurrency-range", "4:1"][..],
        &["-m", "simple", "-i", "quic"],
        &["--bogus"],
        &["-m", "simple", "--shape", "INPUT0"],
    ] {
        let out = Command::new(BIN).args(bad).output().unwrap();
        assert_eq!(
            out.status.code(),
            Some(2),
            "{bad:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
    }
}

/// A model with `sequence_batching` (the repository's `sequence_accumulator`)
/// switches the bench to sequences, as perf_analyzer: every request carries
/// sequence_id/sequence_start/sequence_end, the server accepts all of them
/// (a missing START or a reused live id would be an error), and completed
/// sequences are counted.
#[test]
fn sequence_model_runs_sequences() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let grpc = server.grpc_addr().to_string();
    let cases: [&[&str]; 4] = [
        &["-i", "http", "-u", &http],
        // Two threads sharing an id range exactly as large as the concurrency.
        &[
            "-i",
            "http",
            "-u",
            &http,
            "--threads",
            "2",
            "--sequence-id-range",
            "10:14",
            "--input-tensor-format",
            "json",
        ],
        &["-i", "grpc", "-u", &grpc],
        &["-i", "grpc", "-u", &grpc, "--streaming"],
    ];
    for case in cases {
        let mut a = vec![
            "-m",
            "sequence_accumulator",
            "--concurrency-range",
            "1,4",
            "--sequence-length",
            "4",
            "--sequence-length-variation",
            "0",
        ];
        a.extend_from_slice(case);
        for r in run(&a) {
            check_sane(&r);
            let sps = r.sequences_per_second.expect("a sequence model");
            assert!(r.sequences > 0, "{case:?}: {r:?}");
            // Every sequence has 4 requests: completions track requests / 4,
            // up to the sequences cut by the window edges.
            let expected = r.requests as f64 / 4.0;
            assert!(
                (r.sequences as f64 - expected).abs() <= 2.0 * r.load + 1.0,
                "{case:?}: {} sequences for {} requests",
                r.sequences,
                r.requests
            );
            assert!((sps - r.sequences as f64 / r.measured_seconds).abs() < 1e-6);
        }
    }

    // Open loop: three live sequences, one request in flight each.
    let open = run(&[
        "-m",
        "sequence_accumulator",
        "-u",
        &http,
        "--request-rate-range",
        "200",
        "--num-of-sequences",
        "3",
        "--serial-sequences",
        "--sequence-length",
        "5",
    ]);
    check_sane(&open[0]);
    assert!(open[0].sequences_per_second.is_some());
    // And perf_analyzer's default: each arrival to a random live sequence.
    let random = run(&[
        "-m",
        "sequence_accumulator",
        "-i",
        "grpc",
        "-u",
        &grpc,
        "--request-rate-range",
        "200",
    ]);
    check_sane(&random[0]);

    // A plain model has no sequence throughput.
    assert!(run(&["-m", "simple", "-u", &http])[0]
        .sequences_per_second
        .is_none());

    // A bounded id range smaller than the live sequences is refused (exit 2).
    let out = Command::new(BIN)
        .args([
            "-m",
            "sequence_accumulator",
            "-u",
            &http,
            "--sequence-id-range",
            "1:3",
            "--concurrency-range",
            "4",
        ])
        .output()
        .unwrap();
    let err = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{err}");
    assert!(err.contains("collide"), "{err}");
    server.shutdown().expect("server stops");
}

/// `--streaming` on a decoupled model: a request ends at its final
/// response, and every response of it is counted.
#[test]
fn streaming_counts_a_decoupled_models_responses_per_request() {
    let server = common::start_server(2);
    let grpc = server.grpc_addr().to_string();
    let data = std::env::temp_dir().join(format!("bench-repeat-{}.json", std::process::id()));
    std::fs::write(
        &data,
        r#"{"data": [{"IN": [1, 2, 3, 4, 5], "DELAY": [0, 0, 0, 0, 0], "WAIT": [0]}]}"#,
    )
    .expect("input data");
    let results = run(&[
        "-m",
        "repeat_int32",
        "-i",
        "grpc",
        "-u",
        &grpc,
        "--streaming",
        "--input-data",
        data.to_str().expect("utf-8 path"),
    ]);
    let _ = std::fs::remove_file(&data);
    let r = &results[0];
    check_sane(r);
    assert_eq!(r.responses, 5 * r.requests, "{r:?}");
    let first = r
        .first_response_us
        .as_ref()
        .expect("time to first response");
    assert!(first.p50 <= r.latency_us.p99, "{r:?}");
    server.shutdown().expect("server stops");
}

/// -l stops the sweep at the first step over the limit; --binary-search
/// measures the ends and bisects. Limits no request or every request
/// meets keep the outcome deterministic.
#[test]
fn latency_threshold_and_binary_search() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let search = |extra: &[&str]| {
        let mut a = vec!["-m", "simple", "-u", &http, "--concurrency-range", "1:4"];
        a.extend_from_slice(extra);
        bench::run(&Options::try_parse_from(common::bench_args(&a)).expect("arguments parse"))
            .expect("bench runs")
    };
    for extra in [
        &["-l", "0.000001"][..],
        &["-l", "0.000001", "--binary-search"],
    ] {
        let r = search(extra);
        let loads: Vec<f64> = r.results.iter().map(|s| s.load).collect();
        assert_eq!(loads, [1.0], "{extra:?}");
        assert!(
            r.json["search"]["best_load"].is_null(),
            "{}",
            r.json["search"]
        );
    }
    let r = search(&["-l", "60000", "--binary-search"]);
    let loads: Vec<f64> = r.results.iter().map(|s| s.load).collect();
    assert_eq!(loads, [1.0, 4.0]);
    assert_eq!(r.json["search"]["mode"], "binary");
    assert_eq!(r.json["search"]["best_load"], 4.0);
    let r = search(&["-l", "60000"]);
    assert_eq!(r.results.len(), 4);
    assert_eq!(r.json["search"]["best_load"], 4.0);
    let (code, err) = run_bin(&["-m", "simple", "-u", &http, "--binary-search"]);
    assert_eq!(code, Some(2), "{err}");
    server.shutdown().expect("server stops");
}

#[test]
fn profile_export_lists_every_measured_request_in_send_order() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let dir = std::env::temp_dir().join(format!("bench-profile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let file = dir.join("profile.json");
    let f = file.to_string_lossy().to_string();
    let r = run(&[
        "-m",
        "simple",
        "-u",
        &http,
        "--concurrency-range",
        "1:2",
        "--threads",
        "2",
        "--profile-export-file",
        &f,
    ]);
    assert_eq!(r.len(), 2);
    let export: serde_json::Value =
        serde_json::from_str(&std::fs::read_to_string(&file).unwrap()).unwrap();
    assert_eq!(export["service_kind"], "triton");
    let experiments = export["experiments"].as_array().unwrap();
    assert_eq!(experiments.len(), 2);
    for (e, step) in experiments.iter().zip(&r) {
        check_sane(step);
        assert_eq!(e["experiment"]["mode"], "concurrency");
        assert_eq!(e["experiment"]["value"].as_f64(), Some(step.load));
        let requests = e["requests"].as_array().unwrap();
        assert_eq!(requests.len() as u64, step.requests, "{e}");
        let mut last_sent = 0;
        for q in requests {
            let sent = q["timestamp"].as_u64().unwrap();
            assert!(sent >= last_sent, "requests out of send order: {q}");
            last_sent = sent;
            assert_eq!(q["sequence_id"], 0);
            let responses = q["response_timestamps"].as_array().unwrap();
            assert_eq!(responses.len(), 1, "{q}");
            assert!(responses[0].as_u64().unwrap() >= sent, "{q}");
        }
        let bounds: Vec<u64> = e["window_boundaries"]
            .as_array()
            .unwrap()
            .iter()
            .map(|b| b.as_u64().unwrap())
            .collect();
        assert_eq!(bounds.len(), step.windows.min(3) as usize + 1, "{e}");
        assert!(bounds.windows(2).all(|w| w[0] < w[1]), "{bounds:?}");
        // Every exported request completed inside the measured windows.
        let end = *bounds.last().unwrap();
        assert!(requests
            .iter()
            .all(|q| q["response_timestamps"][0].as_u64().unwrap() <= end + 1_000_000_000));
    }
    std::fs::remove_dir_all(&dir).ok();
    server.shutdown().expect("server stops");
}

#[test]
fn collect_metrics_reports_the_models_server_figures_per_step() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let url = format!("http://{}/metrics", server.metrics_addr());
    let dir = std::env::temp_dir().join(format!("bench-metrics-{}", std::process::id()));
    std::fs::create_dir_all(&dir).unwrap();
    let csv = dir.join("out.csv").to_string_lossy().to_string();
    let r = run(&[
        "-m",
        "simple",
        "-u",
        &http,
        "--concurrency-range",
        "1:2",
        "--collect-metrics",
        "--metrics-url",
        &url,
        "--metrics-interval",
        "40",
        "-f",
        &csv,
    ]);
    assert_eq!(r.len(), 2);
    for step in &r {
        check_sane(step);
        let m = step.metrics.as_ref().expect("metrics collected");
        assert_eq!(m.failed_scrapes, 0, "{:?}", m.first_error);
        assert!(m.scrapes >= 2, "{m:?}");
        let simple = m
            .models
            .iter()
            .find(|x| x.model == "simple")
            .unwrap_or_else(|| panic!("no figures for simple: {m:?}"));
        // --max-trials 3 and the stability rule's three windows: every
        // measured window is in the step's count. The scrapes bracket the
        // windows, so the server's delta holds them all (less at most the
        // requests whose count the server had not yet added at the last
        // scrape), plus those completed while the bench took the scrapes.
        assert_eq!(step.windows, 3);
        let c = step.load as u64;
        assert!(
            simple.requests + c >= step.requests,
            "{} < {}",
            simple.requests,
            step.requests
        );
        assert!(
            simple.requests <= step.requests * 2 + 200,
            "{} vs {}",
            simple.requests,
            step.requests
        );
        assert!(simple.queue_us.is_finite() && simple.queue_us >= 0.0);
        assert!(simple.compute_infer_us.is_finite() && simple.compute_infer_us > 0.0);
        assert!(m.gpus.is_empty());
    }
    let text = std::fs::read_to_string(&csv).unwrap();
    let header = text.lines().next().unwrap();
    assert!(!header.contains("GPU"), "{header}");
    let cpu = r[0].metrics.as_ref().unwrap().avg_cpu_utilization.is_some();
    assert_eq!(header.ends_with(",Avg CPU Utilization"), cpu, "{header}");
    // A wrong address fails before the load; the URL alone is refused.
    let dead = std::net::TcpListener::bind("127.0.0.1:0").unwrap();
    let dead_url = dead.local_addr().unwrap().to_string();
    drop(dead);
    let (code, err) = run_bin(&[
        "-m",
        "simple",
        "-u",
        &http,
        "--collect-metrics",
        "--metrics-url",
        &dead_url,
    ]);
    assert_eq!(code, Some(1), "{err}");
    assert!(err.contains("--collect-metrics: cannot read"), "{err}");
    let (code, err) = run_bin(&["-m", "simple", "-u", &http, "--metrics-url", &url]);
    assert_eq!(code, Some(2), "{err}");
    assert!(err.contains("needs --collect-metrics"), "{err}");
    std::fs::remove_dir_all(&dir).ok();
    server.shutdown().expect("server stops");
}

/// A KServe-looking HTTP/1.1 server for the direct lane (one request at a
/// time per thread, its own reader): model `m` with one FP32 input;
/// its answers to infer cycle through the framings a server may use —
/// content-length, chunked in small separate writes, an interim
/// `100 Continue` first, and a body delimited by closing the connection.
/// With `fail`, every infer answer is a chunked 400 with an error.
/// Returns the address and the count of infer requests answered.
fn fake_framing_server(
    fail: bool,
) -> (
    std::net::SocketAddr,
    std::sync::Arc<std::sync::atomic::AtomicU64>,
) {
    use std::io::{Read, Write};
    use std::sync::atomic::{AtomicU64, Ordering};
    let listener = std::net::TcpListener::bind("127.0.0.1:0").expect("bind");
    let addr = listener.local_addr().expect("address");
    let infers = std::sync::Arc::new(AtomicU64::new(0));
    let count = infers.clone();
    std::thread::spawn(move || {
        for conn in listener.incoming() {
            let Ok(mut conn) = conn else { continue };
            let count = count.clone();
            std::thread::spawn(move || loop {
                let mut head = Vec::new();
                let mut byte = [0u8; 1];
                while !head.ends_with(b"\r\n\r\n") {
                    match conn.read(&mut byte) {
                        Ok(1) => head.push(byte[0]),
                        _ => return,
                    }
                }
                let head = String::from_utf8_lossy(&head).to_ascii_lowercase();
                let len: usize = head
                    .lines()
                    .find_map(|l| l.strip_prefix("content-length:"))
                    .and_then(|v| v.trim().parse().ok())
                    .unwrap_or(0);
                let mut body = vec![0u8; len];
                if conn.read_exact(&mut body).is_err() {
                    return;
                }
                let path = head.split_whitespace().nth(1).unwrap_or("").to_string();
                let reply = |conn: &mut std::net::TcpStream, status: &str, body: &str| {
                    write!(
                        conn,
                        "HTTP/1.1 {status}\r\ncontent-type: application/json\r\ncontent-length: {}\r\n\r\n{body}",
                        body.len()
                    )
                };
                let ok = if !path.ends_with("/infer") {
                    if path.ends_with("/config") || path.ends_with("/stats") {
                        reply(&mut conn, "404 Not Found", r#"{"error":"not here"}"#)
                    } else {
                        reply(
                            &mut conn,
                            "200 OK",
                            r#"{"name":"m","versions":["1"],"platform":"x","inputs":[{"name":"IN","datatype":"FP32","shape":[1,4]}],"outputs":[{"name":"OUT","datatype":"FP32","shape":[1,4]}]}"#,
                        )
                    }
                } else {
                    let n = count.fetch_add(1, Ordering::Relaxed);
                    let answer = r#"{"model_name":"m","outputs":[]}"#;
                    let chunked = |conn: &mut std::net::TcpStream, status: &str, body: &str| {
                        write!(
                            conn,
                            "HTTP/1.1 {status}\r\ntransfer-encoding: chunked\r\n\r\n"
                        )?;
                        conn.flush()?;
                        for piece in body.as_bytes().chunks(7) {
                            write!(conn, "{:x}\r\n", piece.len())?;
                            conn.write_all(piece)?;
                            conn.write_all(b"\r\n")?;
                            conn.flush()?;
                        }
                        conn.write_all(b"0\r\nx-trailer: 1\r\n\r\n")
                    };
                    if fail {
                        chunked(
                            &mut conn,
                            "400 Bad Request",
                            r#"{"error":"refused by the fake"}"#,
                        )
                    } else {
                        match n % 4 {
                            0 => reply(&mut conn, "200 OK", answer),
                            1 => chunked(&mut conn, "200 OK", answer),
                            2 => conn
                                .write_all(b"HTTP/1.1 100 Continue\r\n\r\n")
                                .and_then(|()| reply(&mut conn, "200 OK", answer)),
                            _ => {
                                let _ = write!(
                                    conn,
                                    "HTTP/1.1 200 OK\r\nconnection: close\r\n\r\n{answer}"
                                );
                                return;
                            }
                        }
                    }
                };
                if ok.is_err() {
                    return;
                }
            });
        }
    });
    (addr, infers)
}

/// The direct lane (c=1 over plaintext HTTP/1.1) reads every framing a
/// server may answer with, reconnects after a server closes, and reports
/// a refusal with the server's reason.
#[test]
fn the_direct_http_lane_reads_every_response_framing() {
    use std::sync::atomic::Ordering;
    let (addr, infers) = fake_framing_server(false);
    let r = run(&["-m", "m", "-u", &addr.to_string(), "--shape", "IN:4"]);
    let r = &r[0];
    assert!(r.requests >= 8, "{r:?}");
    assert_eq!(r.errors, 0, "{:?}", r.first_error);
    assert!(infers.load(Ordering::Relaxed) >= r.requests);

    let (addr, _) = fake_framing_server(true);
    let (code, err) = run_bin(&["-m", "m", "-u", &addr.to_string()]);
    assert_eq!(code, Some(1), "{err}");
    assert!(
        err.contains("first error: HTTP 400: refused by the fake"),
        "{err}"
    );
}

/// The direct lanes carry a body larger than HTTP/2's default windows and
/// frame size (160 KB of strings, echoed back) over both protocols, as the
/// runtime path does.
#[test]
fn the_direct_lanes_carry_bodies_past_the_default_windows() {
    let server = common::start_server(1);
    let http = server.http_addr().to_string();
    let grpc = server.grpc_addr().to_string();
    for (proto, url) in [("http", &http), ("grpc", &grpc)] {
        for lane in [&[][..], &["--no-direct"]] {
            let mut a = vec![
                "-m",
                "simple_identity",
                "-i",
                proto,
                "-u",
                url,
                "--shape",
                "INPUT0:20000",
                "--string-length",
                "4",
            ];
            a.extend_from_slice(lane);
            check_sane(&run(&a)[0]);
        }
    }
    server.shutdown().expect("server stops");
}
