#!/usr/bin/env python3
"""Peak RSS of a shardserve server while N clients upload model files at
once through the repository API (HTTP, chunked bodies), against the
server's request-body budget.

    .venv/bin/python scripts/upload_rss.py [--binary target/release/shardserve]
        [--clients 24] [--mb 60] [--budget BYTES]

Starts the binary in explicit mode on an empty repository, sends N
concurrent `POST /v2/repository/models/u<i>/load` requests whose JSON
body (one base64 file for a built-in `simple` model) is about MB
megabytes, in 1 MiB chunks, and prints the answers by status and the
server's peak RSS (VmHWM) and its RSS before the uploads.
"""

import argparse
import base64
import collections
import http.client
import json
import os
import pathlib
import socket
import subprocess
import sys
import tempfile
import threading
import time

ROOT = pathlib.Path(__file__).resolve().parents[1]


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def status_kib(pid, key):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith(key + ":"):
                return int(line.split()[1])
    return 0


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--binary", default=str(ROOT / "target" / "release" / "shardserve"))
    ap.add_argument("--clients", type=int, default=24)
    ap.add_argument("--mb", type=int, default=60)
    ap.add_argument("--budget", type=int, default=None,
                    help="--max-buffered-request-bytes (default: the server's)")
    ap.add_argument("--cores", type=int, default=2)
    args = ap.parse_args()

    config = json.dumps({
        "backend": "simple", "max_batch_size": 8,
        "input": [{"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("INPUT0", "INPUT1")],
        "output": [{"name": n, "data_type": "TYPE_INT32", "dims": [16]} for n in ("OUTPUT0", "OUTPUT1")],
    })
    file_bytes = args.mb * 1000 * 1000 * 3 // 4
    encoded = base64.b64encode(os.urandom(1 << 20) * (file_bytes >> 20)).decode()
    body = json.dumps({"parameters": {"config": config, "file:1/weights": encoded}}).encode()
    del encoded

    repo = tempfile.mkdtemp(prefix="upload-rss-repo-")
    http_port = free_port()
    cmd = [args.binary, "--model-repository", repo, "--model-control-mode", "explicit",
           "--host", "127.0.0.1", "--http-port", str(http_port), "--grpc-port", str(free_port()),
           "--metrics-port", str(free_port()), "--cores", str(args.cores)]
    if args.budget:
        cmd += ["--max-buffered-request-bytes", str(args.budget)]
    server = subprocess.Popen(cmd, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        deadline = time.time() + 30
        while True:
            try:
                c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=1)
                c.request("GET", "/v2/health/live")
                if c.getresponse().status == 200:
                    break
            except OSError:
                pass
            if time.time() > deadline or server.poll() is not None:
                sys.exit("server did not start")
            time.sleep(0.1)
        idle = status_kib(server.pid, "VmRSS")
        answers = collections.Counter()
        lock = threading.Lock()
        start = threading.Barrier(args.clients)

        def upload(i):
            c = http.client.HTTPConnection("127.0.0.1", http_port, timeout=600)
            start.wait()
            try:
                c.putrequest("POST", f"/v2/repository/models/u{i}/load")
                c.putheader("Content-Type", "application/json")
                c.putheader("Transfer-Encoding", "chunked")
                c.endheaders()
                view = memoryview(body)
                for off in range(0, len(body), 1 << 20):
                    chunk = view[off:off + (1 << 20)]
                    c.send(b"%x\r\n" % len(chunk))
                    c.send(chunk)
                    c.send(b"\r\n")
                c.send(b"0\r\n\r\n")
                status = c.getresponse().status
            except OSError as e:
                # A refused body closes the connection, maybe mid-send.
                status = f"closed ({type(e).__name__})"
            with lock:
                answers[status] += 1

        threads = [threading.Thread(target=upload, args=(i,)) for i in range(args.clients)]
        t0 = time.time()
        for t in threads:
            t.start()
        for t in threads:
            t.join()
        took = time.time() - t0
        peak = status_kib(server.pid, "VmHWM")
        print(f"binary: {args.binary}")
        print(f"{args.clients} uploads of {len(body) / 1e6:.1f} MB bodies in {took:.1f} s: "
              f"{dict(answers)}")
        print(f"RSS idle {idle / 1024:.0f} MiB, peak (VmHWM) {peak / 1024:.0f} MiB")
    finally:
        server.terminate()
        server.wait(timeout=30)
        subprocess.run(["rm", "-rf", repo])


if __name__ == "__main__":
    main()
