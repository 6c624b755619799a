"""Starts the release `shardserve` binary on the example repository for the
tritonclient compatibility suite, on free loopback ports, and stops it
(SIGTERM, expecting a clean exit 0) at the end of the session."""

import os
import pathlib
import signal
import socket
import subprocess
import time
import urllib.request

import pytest

ROOT = pathlib.Path(__file__).resolve().parents[2]
BINARY = ROOT / "target" / "release" / "shardserve"


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Server:
    def __init__(self, proc, http_port, grpc_port, metrics_port):
        self.proc = proc
        self.http_url = f"127.0.0.1:{http_port}"
        self.grpc_url = f"127.0.0.1:{grpc_port}"
        self.metrics_url = f"127.0.0.1:{metrics_port}"


@pytest.fixture(scope="session")
def server():
    if not BINARY.exists():
        pytest.fail(f"{BINARY} is missing: run scripts/setup.sh first")
    ports = [_free_port() for _ in range(3)]
    log = open(ROOT / "target" / "python-suite-server.log", "w")
    proc = subprocess.Popen(
        [
            str(BINARY),
            "--model-repository", str(ROOT / "models"),
            "--host", "127.0.0.1",
            "--http-port", str(ports[0]),
            "--grpc-port", str(ports[1]),
            "--metrics-port", str(ports[2]),
            "--cores", "2",
            "--exit-timeout-secs", "5",
        ],
        stdout=log,
        stderr=subprocess.STDOUT,
    )
    deadline = time.time() + 60
    while True:
        try:
            with urllib.request.urlopen(f"http://127.0.0.1:{ports[0]}/v2/health/ready", timeout=1) as r:
                if r.status == 200:
                    break
        except OSError:
            pass
        if proc.poll() is not None:
            pytest.fail(f"server exited early with {proc.returncode}; see target/python-suite-server.log")
        if time.time() > deadline:
            proc.kill()
            pytest.fail("server did not become ready within 60 s")
        time.sleep(0.1)
    yield Server(proc, *ports)
    proc.send_signal(signal.SIGTERM)
    try:
        code = proc.wait(timeout=20)
    except subprocess.TimeoutExpired:
        proc.kill()
        pytest.fail("server did not stop within 20 s of SIGTERM")
    log.close()
    assert code == 0, f"server exited with {code} after SIGTERM"
