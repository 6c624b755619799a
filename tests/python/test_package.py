"""scripts/package.sh: the tarball unpacked to a temporary folder runs from
another working directory, with no SHARDSERVE_ORT_LIB/ORT_DYLIB_PATH, and
serves an ONNX model (ONNX Runtime from <prefix>/lib), a Python-backend
model (Triton's Python backend from <prefix>/backends) and a built-in
model, over HTTP and gRPC."""

import os
import pathlib
import re
import shutil
import signal
import subprocess
import tarfile
import time
import urllib.request

import numpy as np
import pytest
import tritonclient.grpc as grpcclient
import tritonclient.http as httpclient

from serverproc import ROOT, free_port


@pytest.fixture(scope="module")
def package(tmp_path_factory):
    out = tmp_path_factory.mktemp("pkg") / "shardserve.tar.gz"
    # The tests' release build, not the shipped `dist` one (which
    # package.sh takes by default): what is tested here is the package's
    # layout and how it finds its parts, the same for both, and a dist
    # build would add some 8 minutes to the suite on a 2-core machine.
    subprocess.run([str(ROOT / "scripts" / "package.sh"), str(out)], check=True, timeout=600,
                   env={**os.environ, "PROFILE": "release"})
    unpacked = tmp_path_factory.mktemp("unpacked")
    with tarfile.open(out) as tar:
        tar.extractall(unpacked, filter="tar")
    (prefix,) = unpacked.iterdir()
    return prefix


def test_layout_and_version(package):
    for rel in ["bin/shardserve", "bin/shardserve-bench", "lib/libonnxruntime.so",
                "backends/python/libtriton_python.so",
                "backends/python/triton_python_backend_stub", "tuning", "LICENSE",
                "README.md", "CHANGELOG.md"]:
        assert (package / rel).exists(), rel
    # The real tritonserver of the build tree is not shipped.
    assert not (package / "backends/python/pytriton/tritonserver/bin").exists()
    version = subprocess.run([str(package / "bin/shardserve"), "--version"],
                             capture_output=True, text=True, check=True, timeout=60)
    assert re.fullmatch(r"shardserve \S+ \(commit [0-9a-f]{7,}\)\n", version.stdout), version.stdout


def test_unpacked_package_serves_from_another_directory(package, tmp_path):
    repo = tmp_path / "repo"
    shutil.copytree(ROOT / "models" / "mlp_onnx", repo / "mlp_onnx")
    shutil.copytree(ROOT / "models" / "simple", repo / "simple")
    shutil.copytree(ROOT / "models_python" / "py_simple", repo / "py_simple")
    elsewhere = tmp_path / "cwd"
    elsewhere.mkdir()
    env = {k: v for k, v in os.environ.items()
           if k not in ("SHARDSERVE_ORT_LIB", "ORT_DYLIB_PATH")}
    http, grpc, metrics = (free_port() for _ in range(3))
    log_path = tmp_path / "server.log"
    with open(log_path, "w") as log:
        proc = subprocess.Popen(
            [str(package / "bin/shardserve"), "--model-repository", str(repo),
             "--host", "127.0.0.1", "--http-port", str(http), "--grpc-port", str(grpc),
             "--metrics-port", str(metrics), "--cores", "2", "--exit-timeout-secs", "5"],
            cwd=elsewhere, env=env, stdout=log, stderr=subprocess.STDOUT)
    try:
        deadline = time.time() + 120
        while True:
            try:
                with urllib.request.urlopen(f"http://127.0.0.1:{http}/v2/health/ready",
                                            timeout=1) as r:
                    if r.status == 200:
                        break
            except OSError:
                pass
            assert proc.poll() is None, f"server exited: {log_path.read_text()}"
            assert time.time() < deadline, f"not ready in 120 s: {log_path.read_text()}"
            time.sleep(0.2)

        text = log_path.read_text()
        # ONNX Runtime came from the package, not from a build tree.
        assert "ONNX Runtime loaded" in text, text
        assert f"{package}/bin/../lib/libonnxruntime.so" in text, text

        import onnxruntime

        x = np.random.default_rng(7).standard_normal((3, 256), dtype=np.float32)
        session = onnxruntime.InferenceSession(
            str(ROOT / "models/mlp_onnx/1/model.onnx"), providers=["CPUExecutionProvider"])
        want = session.run(None, {session.get_inputs()[0].name: x})[0]
        c = httpclient.InferenceServerClient(f"127.0.0.1:{http}")
        inp = httpclient.InferInput("INPUT0", list(x.shape), "FP32")
        inp.set_data_from_numpy(x)
        got = c.infer("mlp_onnx", [inp]).as_numpy("OUTPUT0")
        np.testing.assert_allclose(got, want, rtol=1e-4, atol=1e-5)

        a = np.arange(16, dtype=np.int32).reshape(1, 16)
        b = np.ones((1, 16), dtype=np.int32)
        g = grpcclient.InferenceServerClient(f"127.0.0.1:{grpc}")
        for model in ["py_simple", "simple"]:
            inputs = [grpcclient.InferInput("INPUT0", [1, 16], "INT32"),
                      grpcclient.InferInput("INPUT1", [1, 16], "INT32")]
            inputs[0].set_data_from_numpy(a)
            inputs[1].set_data_from_numpy(b)
            r = g.infer(model, inputs)
            np.testing.assert_array_equal(r.as_numpy("OUTPUT0"), a + b)
            np.testing.assert_array_equal(r.as_numpy("OUTPUT1"), a - b)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            try:
                proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                proc.kill()
    assert proc.returncode == 0, log_path.read_text()
