"""scripts/build-image.sh: the image's exported root file system runs the
server as its non-root user in a chroot (with a private mount and PID
namespace from `unshare`, since `podman run` is not allowed on these VMs)
and serves an ONNX and a Python-backend model through it.

Opt-in (SHARDSERVE_IMAGE_TEST=1): building the image downloads Debian
packages (minutes) and needs root, mmdebstrap and podman."""

import os
import shutil
import signal
import subprocess
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.http as httpclient

from serverproc import ROOT, free_port

pytestmark = pytest.mark.skipif(
    os.environ.get("SHARDSERVE_IMAGE_TEST") != "1",
    reason="set SHARDSERVE_IMAGE_TEST=1 (needs root, mmdebstrap, podman, a Debian mirror)")


@pytest.fixture(scope="module")
def rootfs(tmp_path_factory):
    out = tmp_path_factory.mktemp("image") / "rootfs"
    subprocess.run([str(ROOT / "scripts/build-image.sh"), "shardserve-test:latest", str(out)],
                   check=True, timeout=1800)
    return out


def test_image_rootfs_serves_in_a_chroot(rootfs):
    passwd = (rootfs / "etc/passwd").read_text()
    assert "shardserve:x:10001:10001:" in passwd
    models = rootfs / "models"
    for src in [ROOT / "models/mlp_onnx", ROOT / "models_python/py_simple"]:
        shutil.copytree(src, models / src.name)
    subprocess.run(["chown", "-R", "10001:10001", str(models)], check=True)
    http = free_port()
    script = (
        f'set -e; R="{rootfs}"; mount -t proc proc "$R/proc"; '
        f'mount --rbind /dev "$R/dev"; mount -t tmpfs -o size=256m tmpfs "$R/dev/shm"; '
        f'exec chroot --userspec=10001:10001 "$R" /opt/shardserve/bin/shardserve '
        f'--model-repository=/models --http-port={http} --grpc-port={free_port()} '
        f'--metrics-port={free_port()} --host=127.0.0.1 --cores=2 --exit-timeout-secs=5')
    log_path = rootfs.parent / "server.log"
    started = time.monotonic()
    with open(log_path, "w") as log:
        proc = subprocess.Popen(["unshare", "--mount", "--pid", "--fork", "--kill-child=SIGTERM",
                                 "sh", "-c", script],
                                stdout=log, stderr=subprocess.STDOUT)
    try:
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready",
                                            timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, log_path.read_text()
            assert time.monotonic() - started < 180, log_path.read_text()
            time.sleep(0.2)
        print(f"image rootfs: ready after {time.monotonic() - started:.2f} s")
        c = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        x = np.ones((1, 256), dtype=np.float32)
        inp = httpclient.InferInput("INPUT0", [1, 256], "FP32")
        inp.set_data_from_numpy(x)
        assert c.infer("mlp_onnx", [inp]).as_numpy("OUTPUT0").shape == (1, 256)
        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        inputs = [httpclient.InferInput("INPUT0", [1, 16], "INT32"),
                  httpclient.InferInput("INPUT1", [1, 16], "INT32")]
        inputs[0].set_data_from_numpy(a)
        inputs[1].set_data_from_numpy(a)
        np.testing.assert_array_equal(c.infer("py_simple", inputs).as_numpy("OUTPUT0"), a + a)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
