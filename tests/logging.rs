//! The server's log as tritonserver's: standard error (never standard
//! output), Triton's `default` and `ISO8601` line shapes and our `json`,
//! the four level switches and the format changed through the logging API
//! at run time, a line per inference request at verbose levels, bad
//! settings refused with Triton's texts, `SHARDSERVE_LOG`, and (through
//! `logs::init` in this process) the log file.

mod common;

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, Stdio},
    time::Duration,
};

use common::{get, post_json, repo_path, request, simple_json_request, wait_for};
use serde_json::{json, Value};

/// Triton's `default` preamble: `d` a digit, `L` a level letter.
const DEFAULT_LINE: &str = "Ldddd dd:dd:dd.dddddd ";
/// Triton's `ISO8601` preamble.
const ISO_LINE: &str = "dddd-dd-ddTdd:dd:ddZ L ";

/// A line shape: the preamble template, then `PID FILE:LINE] "MESSAGE"`
/// and our `key=value` fields.
struct Shape(&'static str);

impl Shape {
    fn new(template: &'static str) -> Result<Self, ()> {
        Ok(Self(template))
    }

    fn is_match(&self, line: &str) -> bool {
        let mut chars = line.chars();
        for t in self.0.chars() {
            let Some(c) = chars.next() else {
                return false;
            };
            let ok = match t {
                'd' => c.is_ascii_digit(),
                'L' => matches!(c, 'E' | 'W' | 'I'),
                t => c == t,
            };
            if !ok {
                return false;
            }
        }
        let rest = chars.as_str();
        let Some((pid, rest)) = rest.split_once(' ') else {
            return false;
        };
        let Some((location, message)) = rest.split_once("] ") else {
            return false;
        };
        let Some((file, at)) = location.rsplit_once(':') else {
            return false;
        };
        let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
        digits(pid)
            && digits(at)
            && !file.is_empty()
            && !file.contains(char::is_whitespace)
            && message.len() >= 2
            && message.starts_with('"')
    }
}

/// The binary with its standard output and error in two files.
struct Server {
    child: Child,
    dir: PathBuf,
    http: SocketAddr,
}

impl Server {
    fn start(tag: &str, env: &[(&str, &str)], args: &[&str]) -> Self {
        let dir = std::env::temp_dir().join(format!("shardserve-log-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let out = std::fs::File::create(dir.join("stdout")).expect("stdout file");
        let err = std::fs::File::create(dir.join("stderr")).expect("stderr file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardserve"));
        cmd.args(["--model-repository", &repo_path("models").to_string_lossy()])
            .args(["--model-control-mode", "explicit", "--load-model", "simple"])
            .args([
                "--host",
                "127.0.0.1",
                "--http-port",
                "0",
                "--grpc-port",
                "0",
            ])
            .args(["--metrics-port", "0", "--cores", "1", "--no-pin"])
            .args(args)
            .env_remove("SHARDSERVE_LOG")
            .env_remove("TRITON_SERVER_ESCAPE_LOG_MESSAGES")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd.spawn().expect("spawn the server");
        let mut server = Self {
            child,
            dir,
            http: "127.0.0.1:0".parse().expect("address"),
        };
        let mut http = None;
        wait_for("the listening line", Duration::from_secs(30), || {
            assert!(
                server.child.try_wait().ok().flatten().is_none(),
                "the server exited:\n{}",
                server.stderr()
            );
            http = listening_http(&server.stderr());
            http.is_some()
        });
        server.http = http.expect("address");
        wait_for("the server to be ready", Duration::from_secs(30), || {
            get(server.http, "/v2/health/ready").status == 200
        });
        server
    }

    fn stderr(&self) -> String {
        std::fs::read_to_string(self.dir.join("stderr")).unwrap_or_default()
    }

    fn stdout(&self) -> String {
        std::fs::read_to_string(self.dir.join("stdout")).unwrap_or_default()
    }

    fn settings(&self, body: Value) -> Value {
        let r = post_json(self.http, "/v2/logging", &body);
        assert_eq!(
            r.status,
            200,
            "{body}: {}",
            String::from_utf8_lossy(&r.body)
        );
        r.json()
    }

    fn infer(&self, model: &str) -> u16 {
        post_json(
            self.http,
            &format!("/v2/models/{model}/infer"),
            &simple_json_request(1),
        )
        .status
    }

    /// Waits for a line past byte `from` of standard error that contains
    /// every needle, and returns it.
    fn line_after(&self, from: usize, needles: &[&str]) -> String {
        let mut found = None;
        wait_for(
            &format!("a log line with {needles:?}"),
            Duration::from_secs(20),
            || {
                let text = self.stderr();
                found = text.get(from..).and_then(|t| {
                    t.lines()
                        .find(|l| needles.iter().all(|n| l.contains(n)))
                        .map(str::to_string)
                });
                found.is_some()
            },
        );
        found.expect("line")
    }
}

impl Drop for Server {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn listening_http(log: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains("listening"))?;
    let start = line.find("http=")? + 5;
    line[start..].split_whitespace().next()?.parse().ok()
}

#[test]
fn logs_go_to_stderr_in_tritons_default_shape() {
    let server = Server::start("stderr", &[], &[]);
    assert_eq!(server.stdout(), "", "nothing is logged to standard output");
    let text = server.stderr();
    let shape = Shape::new(DEFAULT_LINE).expect("shape");
    assert!(text.lines().count() >= 2, "{text}");
    for line in text.lines() {
        assert!(shape.is_match(line), "not Triton's default shape: {line}");
    }
    // Our structured fields follow the message as key=value.
    let listening = text
        .lines()
        .find(|l| l.contains("\"listening\""))
        .expect("listening line");
    assert!(listening.contains(" http=127.0.0.1:"), "{listening}");
    assert_eq!(
        get(server.http, "/v2/logging").json(),
        json!({"log_file": "", "log_info": true, "log_warning": true, "log_error": true,
               "log_verbose_level": 0, "log_format": "default"})
    );
    // Verbose off: no request lines.
    assert_eq!(server.infer("simple"), 200);
    let r = get(server.http, "/v2/health/live");
    assert_eq!(r.status, 200);
    assert!(
        !server.stderr().contains("inference request"),
        "{}",
        server.stderr()
    );
}

#[test]
fn the_logging_api_switches_formats_and_levels_at_once() {
    let server = Server::start("api", &[], &[]);
    // Verbose 1: a line per request, with model, version, id, protocol,
    // outcome and duration.
    let s = server.settings(json!({"log_verbose_level": 1}));
    assert_eq!(s["log_verbose_level"], 1);
    let from = server.stderr().len();
    let mut body = simple_json_request(2);
    body["id"] = json!("req-7");
    assert_eq!(
        post_json(server.http, "/v2/models/simple/infer", &body).status,
        200
    );
    let line = server.line_after(from, &["inference request succeeded"]);
    for needle in [
        "model=simple",
        "version=1",
        "id=req-7",
        "protocol=HTTP",
        "duration_us=",
    ] {
        assert!(line.contains(needle), "{needle} missing: {line}");
    }
    assert!(
        Shape::new(DEFAULT_LINE).expect("shape").is_match(&line),
        "{line}"
    );
    let from = server.stderr().len();
    assert_eq!(server.infer("nope"), 404);
    let line = server.line_after(from, &["inference request failed", "model=nope"]);
    assert!(line.contains("error="), "{line}");

    // ISO8601, Triton's other shape.
    let s = server.settings(json!({"log_format": "ISO8601"}));
    assert_eq!(s["log_format"], "ISO8601");
    let from = server.stderr().len();
    assert_eq!(server.infer("simple"), 200);
    let line = server.line_after(from, &["inference request succeeded"]);
    assert!(
        Shape::new(ISO_LINE).expect("shape").is_match(&line),
        "{line}"
    );

    // json, ours: one object a line.
    let s = server.settings(json!({"log_format": "json"}));
    assert_eq!(s["log_format"], "json");
    let from = server.stderr().len();
    assert_eq!(server.infer("simple"), 200);
    let line = server.line_after(from, &["inference request succeeded"]);
    let v: Value = serde_json::from_str(&line).expect("a JSON line");
    assert_eq!(v["level"], "DEBUG", "{line}");
    assert_eq!(v["fields"]["model"], "simple", "{line}");
    assert_eq!(v["fields"]["protocol"], "HTTP", "{line}");
    assert!(v["fields"]["duration_us"].is_u64(), "{line}");
    assert!(
        v["time"].as_str().is_some_and(|t| t.ends_with('Z')),
        "{line}"
    );

    // Info off: the settings change (an info line) and the verbose lines
    // that follow are not written; the verbose level is its own switch.
    server.settings(json!({"log_format": "default", "log_verbose_level": 0}));
    let from = server.stderr().len();
    let s = server.settings(json!({"log_info": false}));
    assert_eq!(s["log_info"], false);
    server.settings(json!({"log_warning": false, "log_error": false}));
    assert_eq!(server.infer("simple"), 200);
    assert_eq!(server.stderr().len(), from, "{}", &server.stderr()[from..]);
    server.settings(json!({"log_verbose_level": 1}));
    assert_eq!(server.infer("simple"), 200);
    let line = server.line_after(from, &["inference request succeeded"]);
    assert!(line.starts_with('I'), "{line}");
    assert!(
        !server.stderr()[from..].contains("log settings changed"),
        "{}",
        &server.stderr()[from..]
    );
    let s = server.settings(json!({"log_info": true}));
    assert_eq!(
        s,
        json!({"log_file": "", "log_info": true, "log_warning": false, "log_error": false,
               "log_verbose_level": 1, "log_format": "default"})
    );
    server.line_after(from, &["log settings changed", "log_info=true"]);
    assert_eq!(server.stdout(), "");
}

#[test]
fn bad_log_settings_are_refused_with_tritons_texts() {
    let server = Server::start("bad", &[], &[]);
    let before = get(server.http, "/v2/logging").json();
    for (body, status, text) in [
        (
            r#"{"log_file": "/tmp/x.log"}"#,
            501,
            "log file location can not be updated through network protocol",
        ),
        (
            r#"{"log_file": ""}"#,
            501,
            "log file location can not be updated through network protocol",
        ),
        (
            r#"{"log_info": "yes"}"#,
            500,
            "attempt to access JSON non-boolean as boolean",
        ),
        (
            r#"{"log_verbose_level": -1}"#,
            500,
            "attempt to access JSON non-unsigned-integer as unsigned-integer",
        ),
        (
            r#"{"log_format": 8601}"#,
            500,
            "attempt to access JSON non-string as string",
        ),
        (
            r#"{"log_format": "xml"}"#,
            503,
            "invalid argument for --log_format, got: xml",
        ),
        (
            // Nothing of a refused request is applied.
            r#"{"log_info": false, "log_format": "iso8601"}"#,
            503,
            "invalid argument for --log_format, got: iso8601",
        ),
    ] {
        let r = request(
            server.http,
            "POST",
            "/v2/logging",
            &[("Content-Type", "application/json")],
            body.as_bytes(),
        );
        assert_eq!(r.status, status, "{body}");
        assert_eq!(r.json(), json!({ "error": text }), "{body}");
    }
    let r = request(server.http, "POST", "/v2/logging", &[], b"{");
    assert_eq!(r.status, 500);
    assert!(
        r.error()
            .starts_with("failed to parse the request JSON buffer"),
        "{}",
        r.error()
    );
    // Unknown keys and nulls are ignored, as Triton ignores them.
    let r = post_json(
        server.http,
        "/v2/logging",
        &json!({"log_level": 3, "log_info": null}),
    );
    assert_eq!(r.status, 200);
    assert_eq!(r.json(), before);
    assert_eq!(get(server.http, "/v2/logging").json(), before);
    assert_eq!(get(server.http, "/v2/health/ready").status, 200);
}

#[test]
fn shardserve_log_selects_records_beyond_the_verbose_level() {
    let server = Server::start(
        "env",
        &[("SHARDSERVE_LOG", "info,shardserve::frontend::core=debug")],
        &[],
    );
    let from = server.stderr().len();
    assert_eq!(server.infer("simple"), 200);
    server.line_after(from, &["inference request succeeded", "model=simple"]);
    // A bad directive stops the start with its name.
    let out = Command::new(env!("CARGO_BIN_EXE_shardserve"))
        .args(["--model-repository", &repo_path("models").to_string_lossy()])
        .env("SHARDSERVE_LOG", "shardserve=loud")
        .stdin(Stdio::null())
        .output()
        .expect("run");
    assert!(!out.status.success());
    let err = String::from_utf8_lossy(&out.stderr);
    assert!(err.contains("SHARDSERVE_LOG"), "{err}");
}

fn read(path: &Path) -> String {
    std::fs::read_to_string(path).unwrap_or_default()
}

/// `--log-file` is the CLI's to wire; `logs::init` with a file is what it
/// calls. This process installs its own logger once, here.
#[test]
fn the_log_file_is_appended_to_and_follows_the_switches() {
    use shardserve::logs::{self, LogChanges, LogFormat, LogSettings};
    let dir = std::env::temp_dir().join(format!("shardserve-logfile-{}", std::process::id()));
    std::fs::create_dir_all(&dir).expect("temp dir");
    let missing = dir.join("no/such/dir/x.log");
    let err = logs::init(&LogSettings {
        file: Some(missing.clone()),
        ..LogSettings::default()
    })
    .expect_err("an unopenable log file");
    assert!(
        format!("{err:#}").contains(&*missing.to_string_lossy()),
        "{err:#}"
    );

    let path = dir.join("server.log");
    std::fs::write(&path, "an earlier line\n").expect("write");
    logs::init(&LogSettings {
        file: Some(path.clone()),
        format: LogFormat::Iso8601,
        ..LogSettings::default()
    })
    .expect("init");
    assert!(
        logs::init(&LogSettings::default()).is_err(),
        "installed twice"
    );
    assert_eq!(logs::settings().file.as_deref(), Some(path.as_path()));
    tracing::info!(model = "m", "one");
    tracing::debug!("not at verbose 0");
    tracing::warn!("two");
    let text = read(&path);
    let lines: Vec<&str> = text.lines().collect();
    assert_eq!(lines.len(), 3, "{text}");
    assert_eq!(lines[0], "an earlier line");
    let iso = Shape::new(ISO_LINE).expect("shape");
    assert!(iso.is_match(lines[1]) && lines[1].contains(" I "), "{text}");
    assert!(lines[1].ends_with("\"one\" model=m"), "{text}");
    assert!(iso.is_match(lines[2]) && lines[2].contains(" W "), "{text}");

    logs::update(&LogChanges {
        warning: Some(false),
        verbose: Some(1),
        format: Some(LogFormat::Default),
        ..LogChanges::default()
    })
    .expect("update");
    tracing::warn!("three");
    tracing::debug!(target: "shardserve::test", "four");
    tracing::error!("five");
    let text = read(&path);
    let new: Vec<&str> = text.lines().skip(3).collect();
    assert_eq!(new.len(), 2, "{text}");
    let default = Shape::new(DEFAULT_LINE).expect("shape");
    assert!(
        default.is_match(new[0]) && new[0].ends_with("\"four\""),
        "{text}"
    );
    assert!(new[0].contains(" logging.rs:"), "our file and line: {text}");
    assert!(
        default.is_match(new[1]) && new[1].starts_with('E'),
        "{text}"
    );
    let _ = std::fs::remove_dir_all(&dir);
}
