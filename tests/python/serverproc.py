"""One way to run the release `shardserve` binary for the Python suites: on
free loopback ports, waiting until it answers, stopped with SIGTERM and
expected to exit 0 (graceful shutdown is part of what the suites check)."""

import pathlib
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "release" / "shardserve"


_HANDED_OUT = set()


def free_port():
    """A port free now and not handed out before in this process: the
    kernel may give a just-released port again, and a server given the same
    port for two of its listeners refuses to start."""
    while True:
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        if port not in _HANDED_OUT:
            _HANDED_OUT.add(port)
            return port


class ServerProcess:
    """`repos`: model repository paths; `args`: further command-line
    arguments; `log`: a file name under target/ for the server's output, or
    None to discard it; `ready_path`: the URL path that answers 200 once the
    server is up (`/v2/health/live` where no model needs to be ready);
    `https_context`: an `ssl.SSLContext` to poll that path over HTTPS with
    (a server started with `--http-use-ssl`)."""

    def __init__(self, repos, args=(), log="python-suite-server.log", cores=2,
                 ready_path="/v2/health/ready", ready_timeout_s=60, https_context=None):
        if not BINARY.exists():
            pytest.fail(f"{BINARY} is missing: run scripts/setup.sh first")
        http, grpc, metrics = (free_port() for _ in range(3))
        self.http_url = f"127.0.0.1:{http}"
        self.grpc_url = f"127.0.0.1:{grpc}"
        self.metrics_url = f"127.0.0.1:{metrics}"
        self.log_path = ROOT / "target" / log if log else None
        self._log = open(self.log_path, "w") if self.log_path else subprocess.DEVNULL
        command = [str(BINARY)]
        for repo in repos:
            command += ["--model-repository", str(repo)]
        command += [
            "--host", "127.0.0.1",
            "--http-port", str(http),
            "--grpc-port", str(grpc),
            "--metrics-port", str(metrics),
            "--cores", str(cores),
            "--exit-timeout-secs", "5",
            *args,
        ]
        self.proc = subprocess.Popen(command, stdout=self._log, stderr=subprocess.STDOUT)
        self._https_context = https_context
        self._wait_until_up(ready_path, ready_timeout_s)

    def _where(self):
        return f"see {self.log_path}" if self.log_path else "its output was discarded"

    def _wait_until_up(self, path, timeout_s):
        deadline = time.time() + timeout_s
        while True:
            try:
                scheme = "https" if self._https_context else "http"
                with urllib.request.urlopen(f"{scheme}://{self.http_url}{path}", timeout=1,
                                            context=self._https_context) as r:
                    if r.status == 200:
                        return
            except OSError:
                pass
            if self.proc.poll() is not None:
                pytest.fail(f"server exited early with {self.proc.returncode}; {self._where()}")
            if time.time() > deadline:
                self.proc.kill()
                pytest.fail(f"server did not answer {path} within {timeout_s} s; {self._where()}")
            time.sleep(0.1)

    def stop(self, timeout_s=20):
        """SIGTERM, then the exit status (the process is killed, and the test
        fails, when it does not exit within `timeout_s`)."""
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(timeout=timeout_s)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                pytest.fail(f"server did not stop within {timeout_s} s of SIGTERM")
        if self.log_path:
            self._log.close()
        return self.proc.returncode

    def stop_expecting_success(self, timeout_s=20):
        code = self.stop(timeout_s)
        assert code == 0, f"server exited with {code} after SIGTERM; {self._where()}"
