//! The server binary as a child process: for what an in-process server
//! cannot show (signals, exit codes, resource limits, the process's own
//! memory and CPU).

use std::{
    net::SocketAddr,
    path::{Path, PathBuf},
    process::{Child, Command, ExitStatus, Stdio},
    thread,
    time::{Duration, Instant},
};

use super::{get, repo_path, wait_for};

/// `shardserve` running as a child process (logs in a temporary file),
/// killed on drop if it is still running.
pub struct ChildServer {
    child: Child,
    dir: PathBuf,
    log: PathBuf,
    pub http: SocketAddr,
    pub grpc: SocketAddr,
    pub metrics: SocketAddr,
}

impl ChildServer {
    /// Starts `shardserve` on the example repository, one shard, with
    /// `nofile` as its open-file limit (soft and hard) if given.
    pub fn spawn(tag: &str, nofile: Option<u64>, args: &[&str]) -> Self {
        Self::spawn_in(tag, &repo_path("models"), 1, nofile, args)
    }

    /// Starts `shardserve` on ephemeral loopback ports with `repo` and
    /// `cores` shards, unpinned.
    pub fn spawn_in(
        tag: &str,
        repo: &Path,
        cores: usize,
        nofile: Option<u64>,
        args: &[&str],
    ) -> Self {
        use std::os::unix::process::CommandExt;
        let dir = std::env::temp_dir().join(format!("shardserve-{tag}-{}", std::process::id()));
        std::fs::create_dir_all(&dir).expect("temp dir");
        let log = dir.join("server.log");
        let out = std::fs::File::create(&log).expect("log file");
        let err = out.try_clone().expect("log file");
        let mut cmd = Command::new(env!("CARGO_BIN_EXE_shardserve"));
        cmd.args(["--model-repository", &repo.to_string_lossy()])
            .args([
                "--host",
                "127.0.0.1",
                "--http-port",
                "0",
                "--grpc-port",
                "0",
            ])
            .args([
                "--metrics-port",
                "0",
                "--cores",
                &cores.to_string(),
                "--no-pin",
            ])
            .args(args)
            .env_remove("SHARDSERVE_LOG")
            .stdin(Stdio::null())
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        if let Some(n) = nofile {
            // SAFETY: only setrlimit (async-signal-safe) runs between fork and exec.
            unsafe {
                cmd.pre_exec(move || {
                    let lim = libc::rlimit {
                        rlim_cur: n,
                        rlim_max: n,
                    };
                    if libc::setrlimit(libc::RLIMIT_NOFILE, &lim) != 0 {
                        return Err(std::io::Error::last_os_error());
                    }
                    Ok(())
                });
            }
        }
        let mut child = cmd.spawn().expect("spawn the server");
        let mut addrs = None;
        let until = Instant::now() + Duration::from_secs(20);
        while addrs.is_none() {
            if Instant::now() > until || child.try_wait().ok().flatten().is_some() {
                let _ = child.kill();
                let _ = child.wait();
                panic!("server did not start:\n{}", read_text(&log));
            }
            thread::sleep(Duration::from_millis(20));
            let text = read_text(&log);
            addrs = (|| {
                Some((
                    find_addr(&text, "http")?,
                    find_addr(&text, "grpc")?,
                    find_addr(&text, "metrics")?,
                ))
            })();
        }
        let (http, grpc, metrics) = addrs.expect("addresses");
        let server = Self {
            child,
            dir,
            log,
            http,
            grpc,
            metrics,
        };
        wait_for("the server to be ready", Duration::from_secs(20), || {
            get(server.http, "/v2/health/ready").status == 200
        });
        server
    }

    pub fn pid(&self) -> u32 {
        self.child.id()
    }

    pub fn log(&self) -> String {
        read_text(&self.log)
    }

    /// Descriptors the server has open.
    pub fn open_fds(&self) -> usize {
        std::fs::read_dir(format!("/proc/{}/fd", self.pid())).map_or(0, |d| d.count())
    }

    /// Resident memory in bytes (`VmRSS`), 0 once the process is gone.
    pub fn rss_bytes(&self) -> u64 {
        std::fs::read_to_string(format!("/proc/{}/status", self.pid()))
            .ok()
            .and_then(|s| {
                let line = s.lines().find(|l| l.starts_with("VmRSS:"))?;
                line.split_whitespace().nth(1)?.parse::<u64>().ok()
            })
            .map_or(0, |kib| kib * 1024)
    }

    pub fn signal(&self, sig: libc::c_int) {
        // SAFETY: kill(2) on our own child's pid.
        let rc = unsafe { libc::kill(self.pid() as libc::pid_t, sig) };
        assert_eq!(rc, 0, "kill({sig}): {}", std::io::Error::last_os_error());
    }

    /// Waits up to `limit` for the process to exit; `None` if it has not.
    pub fn wait_exit(&mut self, limit: Duration) -> Option<ExitStatus> {
        let until = Instant::now() + limit;
        loop {
            if let Ok(Some(status)) = self.child.try_wait() {
                return Some(status);
            }
            if Instant::now() > until {
                return None;
            }
            thread::sleep(Duration::from_millis(10));
        }
    }
}

impl Drop for ChildServer {
    fn drop(&mut self) {
        let _ = self.child.kill();
        let _ = self.child.wait();
        let _ = std::fs::remove_dir_all(&self.dir);
    }
}

fn read_text(p: &Path) -> String {
    std::fs::read_to_string(p).unwrap_or_default()
}

/// An address from the server's `listening` log line (`http=127.0.0.1:N`).
fn find_addr(log: &str, key: &str) -> Option<SocketAddr> {
    let line = log.lines().find(|l| l.contains("listening"))?;
    let start = line.find(&format!("{key}="))? + key.len() + 1;
    line[start..]
        .split(|c: char| c.is_whitespace() || c == '\x1b')
        .next()?
        .parse()
        .ok()
}

/// CPU seconds (user + system) the process `pid` has used.
pub fn cpu_seconds(pid: u32) -> f64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).expect("stat");
    // Fields after the command name, which is in parentheses.
    let after = &stat[stat.rfind(')').expect("comm") + 2..];
    let fields: Vec<&str> = after.split(' ').collect();
    let ticks =
        fields[11].parse::<f64>().expect("utime") + fields[12].parse::<f64>().expect("stime");
    // SAFETY: sysconf only reads configuration.
    ticks / unsafe { libc::sysconf(libc::_SC_CLK_TCK) } as f64
}
