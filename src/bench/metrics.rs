//! --collect-metrics: scrapes the server's Prometheus page on its own
//! thread while a step measures, and sums the step up: per model the
//! request delta and queue/compute time per request, CPU utilization, and
//! per GPU perf_analyzer's utilization, power and memory figures.

use std::{
    collections::BTreeMap,
    io::{Read, Write},
    net::{SocketAddr, TcpStream, ToSocketAddrs},
    sync::mpsc::{self, RecvTimeoutError},
    thread::JoinHandle,
    time::{Duration, Instant},
};

use anyhow::{anyhow, Context};
use serde::Serialize;

use super::cli::Target;

/// The server's metrics port (Triton's default, and ours).
pub const DEFAULT_PORT: u16 = 8002;
const CONNECT_TIMEOUT: Duration = Duration::from_secs(2);
const IO_TIMEOUT: Duration = Duration::from_secs(5);

/// Where to scrape: `host:port` and the path.
#[derive(Debug, Clone, PartialEq)]
pub struct MetricsUrl {
    pub authority: String,
    pub path: String,
}

impl MetricsUrl {
    /// `[http://]host[:port][/path]`; the path defaults to `/metrics`,
    /// the port to 8002.
    pub fn parse(s: &str) -> anyhow::Result<Self> {
        if s.starts_with("https://") {
            anyhow::bail!("--metrics-url '{s}': https is not supported; give an http address");
        }
        let rest = s.strip_prefix("http://").unwrap_or(s);
        let (authority, path) = match rest.find('/') {
            Some(i) => (&rest[..i], &rest[i..]),
            None => (rest, "/metrics"),
        };
        if authority.is_empty() {
            anyhow::bail!("--metrics-url '{s}' has no host");
        }
        // A port is there unless the text after the last ':' is not one
        // (or sits inside an IPv6 literal's brackets).
        let has_port = authority
            .rsplit_once(':')
            .is_some_and(|(_, p)| !p.contains(']') && !p.is_empty());
        let authority = if has_port {
            authority.to_string()
        } else {
            format!("{authority}:{DEFAULT_PORT}")
        };
        Ok(Self {
            authority,
            path: path.to_string(),
        })
    }

    /// perf_analyzer's default: the target's host on the metrics port.
    pub fn for_target(target: &Target) -> Self {
        Self {
            authority: SocketAddr::new(target.addr.ip(), DEFAULT_PORT).to_string(),
            path: "/metrics".to_string(),
        }
    }

    pub fn label(&self) -> String {
        format!("http://{}{}", self.authority, self.path)
    }
}

/// The series of one scrape that the summary uses.
#[derive(Debug, Clone, Default, PartialEq)]
pub struct Scrape {
    pub models: BTreeMap<(String, String), ModelCounters>,
    pub cpu_utilization: Option<f64>,
    pub cpu_memory_used_bytes: Option<f64>,
    pub gpus: BTreeMap<String, GpuSample>,
}

/// A model version's cumulative counters (µs for the durations).
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct ModelCounters {
    pub success: f64,
    pub inferences: f64,
    pub executions: f64,
    pub queue_us: f64,
    pub compute_input_us: f64,
    pub compute_infer_us: f64,
    pub compute_output_us: f64,
}

#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct GpuSample {
    pub utilization: Option<f64>,
    pub power_watts: Option<f64>,
    pub memory_used_bytes: Option<f64>,
    pub memory_total_bytes: Option<f64>,
}

/// Splits `a="x",b="y"` into pairs, undoing the exposition escapes.
fn labels(text: &str) -> Vec<(String, String)> {
    let mut out = Vec::new();
    let mut chars = text.chars().peekable();
    loop {
        while chars.peek().is_some_and(|c| *c == ',' || c.is_whitespace()) {
            chars.next();
        }
        let key: String = chars.by_ref().take_while(|c| *c != '=').collect();
        if key.is_empty() || chars.next() != Some('"') {
            return out;
        }
        let mut value = String::new();
        while let Some(c) = chars.next() {
            match c {
                '"' => break,
                '\\' => match chars.next() {
                    Some('n') => value.push('\n'),
                    Some(other) => value.push(other),
                    None => break,
                },
                c => value.push(c),
            }
        }
        out.push((key.trim().to_string(), value));
    }
}

/// Reads the series of interest from a Prometheus text page; others, and
/// lines that do not parse, are skipped.
pub fn parse(page: &str) -> Scrape {
    let mut s = Scrape::default();
    for line in page.lines() {
        let line = line.trim();
        if line.is_empty() || line.starts_with('#') {
            continue;
        }
        let (series, value) = match line.rsplit_once(' ') {
            Some((a, b)) => (a.trim(), b),
            None => continue,
        };
        let Ok(value) = value.parse::<f64>() else {
            continue;
        };
        let (name, pairs) = match series.split_once('{') {
            Some((n, rest)) => (n, labels(rest.trim_end_matches('}'))),
            None => (series, Vec::new()),
        };
        let label = |k: &str| {
            pairs
                .iter()
                .find(|(key, _)| key == k)
                .map(|(_, v)| v.clone())
                .unwrap_or_default()
        };
        let model_field: Option<fn(&mut ModelCounters) -> &mut f64> = match name {
            "nv_inference_request_success" => Some(|m| &mut m.success),
            "nv_inference_count" => Some(|m| &mut m.inferences),
            "nv_inference_exec_count" => Some(|m| &mut m.executions),
            "nv_inference_queue_duration_us" => Some(|m| &mut m.queue_us),
            "nv_inference_compute_input_duration_us" => Some(|m| &mut m.compute_input_us),
            "nv_inference_compute_infer_duration_us" => Some(|m| &mut m.compute_infer_us),
            "nv_inference_compute_output_duration_us" => Some(|m| &mut m.compute_output_us),
            _ => None,
        };
        if let Some(field) = model_field {
            let m = s
                .models
                .entry((label("model"), label("version")))
                .or_default();
            *field(m) += value;
            continue;
        }
        let gpu_field: Option<fn(&mut GpuSample) -> &mut Option<f64>> = match name {
            "nv_gpu_utilization" => Some(|g| &mut g.utilization),
            "nv_gpu_power_usage" => Some(|g| &mut g.power_watts),
            "nv_gpu_memory_used_bytes" => Some(|g| &mut g.memory_used_bytes),
            "nv_gpu_memory_total_bytes" => Some(|g| &mut g.memory_total_bytes),
            _ => None,
        };
        if let Some(field) = gpu_field {
            *field(s.gpus.entry(label("gpu_uuid")).or_default()) = Some(value);
            continue;
        }
        match name {
            "nv_cpu_utilization" => s.cpu_utilization = Some(value),
            "nv_cpu_memory_used_bytes" => s.cpu_memory_used_bytes = Some(value),
            _ => {}
        }
    }
    s
}

/// One GET of the page. HTTP/1.0 so the answer is never chunked.
pub fn scrape(url: &MetricsUrl) -> anyhow::Result<Scrape> {
    let addr = url
        .authority
        .to_socket_addrs()
        .with_context(|| format!("cannot resolve {}", url.authority))?
        .next()
        .ok_or_else(|| anyhow!("{} resolves to no address", url.authority))?;
    let mut stream = TcpStream::connect_timeout(&addr, CONNECT_TIMEOUT)
        .with_context(|| format!("cannot connect to {}", url.label()))?;
    stream.set_read_timeout(Some(IO_TIMEOUT))?;
    stream.set_write_timeout(Some(IO_TIMEOUT))?;
    write!(
        stream,
        "GET {} HTTP/1.0\r\nHost: {}\r\nAccept: text/plain\r\n\r\n",
        url.path, url.authority
    )
    .with_context(|| format!("cannot send to {}", url.label()))?;
    let mut reply = Vec::new();
    stream
        .read_to_end(&mut reply)
        .with_context(|| format!("cannot read {}", url.label()))?;
    let text = String::from_utf8_lossy(&reply);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .ok_or_else(|| anyhow!("{} answered without an HTTP header", url.label()))?;
    let status = head.lines().next().unwrap_or_default();
    if status.split_whitespace().nth(1) != Some("200") {
        anyhow::bail!("{} answered '{}'", url.label(), status);
    }
    Ok(parse(body))
}

/// Scrapes every `interval` on its own thread, so a slow metrics page
/// delays neither the load nor the windows.
pub struct Scraper {
    stop: mpsc::Sender<()>,
    thread: JoinHandle<Vec<(Instant, Result<Scrape, String>)>>,
    url: MetricsUrl,
}

impl Scraper {
    /// Starts once the first scrape is in, so the counts that follow are
    /// deltas from before the first measured window.
    pub fn start(url: &MetricsUrl, interval: Duration) -> anyhow::Result<Self> {
        let first = (Instant::now(), scrape(url).map_err(|e| format!("{e:#}")));
        let (stop, stopped) = mpsc::channel::<()>();
        let thread_url = url.clone();
        let thread = std::thread::Builder::new()
            .name("bench-metrics".into())
            .spawn(move || {
                let mut out = vec![first];
                // Wakes at each interval, or at once when the step ends
                // (a message, or the sender dropped on an error path).
                while let Err(RecvTimeoutError::Timeout) = stopped.recv_timeout(interval) {
                    out.push((
                        Instant::now(),
                        scrape(&thread_url).map_err(|e| format!("{e:#}")),
                    ));
                }
                out
            })
            .context("cannot start the metrics thread")?;
        Ok(Self {
            stop,
            thread,
            url: url.clone(),
        })
    }

    /// Takes a last scrape (after the last window) and sums up.
    pub fn finish(self) -> MetricsSummary {
        let _ = self.stop.send(());
        let mut scrapes = match self.thread.join() {
            Ok(s) => s,
            Err(_) => {
                tracing::warn!("bench: the metrics thread panicked");
                Vec::new()
            }
        };
        scrapes.push((
            Instant::now(),
            scrape(&self.url).map_err(|e| format!("{e:#}")),
        ));
        summarise(&self.url, &scrapes)
    }
}

/// A model version's figures over the step, from the first and the last
/// good scrape.
#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct ModelMetrics {
    pub model: String,
    pub version: String,
    /// Successful requests the server counted between the two scrapes.
    pub requests: u64,
    pub inferences: u64,
    pub executions: u64,
    /// Per request, µs.
    pub queue_us: f64,
    pub compute_input_us: f64,
    pub compute_infer_us: f64,
    pub compute_output_us: f64,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct GpuMetrics {
    pub uuid: String,
    /// Averages over the scrapes; utilization is a fraction.
    pub avg_utilization: Option<f64>,
    pub avg_power_watts: Option<f64>,
    pub max_memory_used_bytes: Option<f64>,
    pub total_memory_bytes: Option<f64>,
}

#[derive(Debug, Clone, Serialize, PartialEq)]
pub struct MetricsSummary {
    pub url: String,
    pub scrapes: u32,
    pub failed_scrapes: u32,
    pub first_error: Option<String>,
    /// From the first to the last good scrape.
    pub seconds: f64,
    /// Model versions that served requests during the step.
    pub models: Vec<ModelMetrics>,
    /// `nv_cpu_utilization` (a fraction) averaged over the scrapes; only
    /// with the server's `--allow-cpu-metrics`.
    pub avg_cpu_utilization: Option<f64>,
    pub max_cpu_memory_used_bytes: Option<f64>,
    pub gpus: Vec<GpuMetrics>,
}

fn mean(v: impl Iterator<Item = f64>) -> Option<f64> {
    let (sum, n) = v.fold((0.0, 0u32), |(s, n), x| (s + x, n + 1));
    (n > 0).then(|| sum / f64::from(n))
}

fn max(v: impl Iterator<Item = f64>) -> Option<f64> {
    v.fold(None, |m: Option<f64>, x| Some(m.map_or(x, |m| m.max(x))))
}

pub fn summarise(
    url: &MetricsUrl,
    scrapes: &[(Instant, Result<Scrape, String>)],
) -> MetricsSummary {
    let good: Vec<(Instant, &Scrape)> = scrapes
        .iter()
        .filter_map(|(t, r)| r.as_ref().ok().map(|s| (*t, s)))
        .collect();
    let first_error = scrapes.iter().find_map(|(_, r)| r.as_ref().err().cloned());
    let mut models = Vec::new();
    let mut seconds = 0.0;
    if let (Some((t0, a)), Some((t1, b))) = (good.first(), good.last()) {
        seconds = t1.duration_since(*t0).as_secs_f64();
        for ((model, version), end) in &b.models {
            let start = a
                .models
                .get(&(model.clone(), version.clone()))
                .copied()
                .unwrap_or_default();
            // A counter that went down was reset (the model reloaded):
            // count from zero.
            let delta = |e: f64, s: f64| if e >= s { e - s } else { e };
            let requests = delta(end.success, start.success);
            if requests <= 0.0 {
                continue;
            }
            let per = |e: f64, s: f64| delta(e, s) / requests;
            models.push(ModelMetrics {
                model: model.clone(),
                version: version.clone(),
                requests: requests as u64,
                inferences: delta(end.inferences, start.inferences) as u64,
                executions: delta(end.executions, start.executions) as u64,
                queue_us: per(end.queue_us, start.queue_us),
                compute_input_us: per(end.compute_input_us, start.compute_input_us),
                compute_infer_us: per(end.compute_infer_us, start.compute_infer_us),
                compute_output_us: per(end.compute_output_us, start.compute_output_us),
            });
        }
    }
    let uuids: std::collections::BTreeSet<&String> =
        good.iter().flat_map(|(_, s)| s.gpus.keys()).collect();
    let gpus = uuids
        .into_iter()
        .map(|uuid| {
            let samples = || good.iter().filter_map(|(_, s)| s.gpus.get(uuid));
            GpuMetrics {
                uuid: uuid.clone(),
                avg_utilization: mean(samples().filter_map(|g| g.utilization)),
                avg_power_watts: mean(samples().filter_map(|g| g.power_watts)),
                max_memory_used_bytes: max(samples().filter_map(|g| g.memory_used_bytes)),
                total_memory_bytes: max(samples().filter_map(|g| g.memory_total_bytes)),
            }
        })
        .collect();
    MetricsSummary {
        url: url.label(),
        scrapes: good.len() as u32,
        failed_scrapes: (scrapes.len() - good.len()) as u32,
        first_error,
        seconds,
        models,
        avg_cpu_utilization: mean(good.iter().filter_map(|(_, s)| s.cpu_utilization)),
        max_cpu_memory_used_bytes: max(good.iter().filter_map(|(_, s)| s.cpu_memory_used_bytes)),
        gpus,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn urls() {
        let u = MetricsUrl::parse("localhost:9002").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.path.as_str()),
            ("localhost:9002", "/metrics")
        );
        let u = MetricsUrl::parse("http://10.0.0.1/m").unwrap();
        assert_eq!(
            (u.authority.as_str(), u.path.as_str()),
            ("10.0.0.1:8002", "/m")
        );
        let u = MetricsUrl::parse("[::1]:7/x").unwrap();
        assert_eq!(u.authority, "[::1]:7");
        assert_eq!(MetricsUrl::parse("[::1]").unwrap().authority, "[::1]:8002");
        assert!(MetricsUrl::parse("https://h:1/").is_err());
        assert!(MetricsUrl::parse("/metrics").is_err());
    }

    #[test]
    fn page_and_deltas() {
        let page = |n: u64, q: u64, util: f64| {
            format!(
                "# HELP x\nnv_inference_request_success{{model=\"a,\\\"b\",version=\"1\"}} {n}\n\
                 nv_inference_queue_duration_us{{model=\"a,\\\"b\",version=\"1\"}} {q}\n\
                 nv_inference_compute_infer_duration_us{{model=\"a,\\\"b\",version=\"1\"}} {}\n\
                 nv_inference_request_success{{model=\"idle\",version=\"1\"}} 7\n\
                 nv_cpu_utilization {util}\n\
                 nv_gpu_utilization{{gpu_uuid=\"GPU-1\"}} {util}\n\
                 garbage line\n",
                q * 2
            )
        };
        let a = parse(&page(10, 100, 0.5));
        assert_eq!(a.models.len(), 2);
        assert_eq!(a.models[&("a,\"b".into(), "1".into())].success, 10.0);
        let b = parse(&page(30, 500, 0.7));
        let now = Instant::now();
        let url = MetricsUrl::parse("h:1").unwrap();
        let s = summarise(
            &url,
            &[
                (now, Ok(a)),
                (now, Err("refused".into())),
                (now + Duration::from_secs(1), Ok(b)),
            ],
        );
        assert_eq!((s.scrapes, s.failed_scrapes), (2, 1));
        assert_eq!(s.first_error.as_deref(), Some("refused"));
        assert_eq!(s.models.len(), 1, "the idle model is left out: {s:?}");
        let m = &s.models[0];
        assert_eq!(m.requests, 20);
        assert!((m.queue_us - 20.0).abs() < 1e-9);
        assert!((m.compute_infer_us - 40.0).abs() < 1e-9);
        assert!((s.avg_cpu_utilization.unwrap() - 0.6).abs() < 1e-9);
        assert!((s.gpus[0].avg_utilization.unwrap() - 0.6).abs() < 1e-9);
    }
}
