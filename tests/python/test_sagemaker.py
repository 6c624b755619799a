"""The SageMaker service (`--allow-sagemaker`) with plain HTTP, as Triton's
qa/L0_sagemaker sends it: `/ping`, `/invocations` (JSON and the binary
content type) routed to SAGEMAKER_TRITON_DEFAULT_MODEL_NAME, Triton's
errors, the refused multi-model routes and the start-up checks."""

import json
import subprocess
import time

import pytest

from cloudhttp import (SAGEMAKER_MIME, call, check_simple_binary, check_simple_json,
                       environ, repo_of, simple_request)
from serverproc import BINARY, ServerProcess, free_port


def start(repo, env, args=(), log="python-sagemaker-server.log", ready_path="/v2/health/ready"):
    port = free_port()
    with environ(**env):
        server = ServerProcess([repo], ["--allow-sagemaker=true", "--sagemaker-port", str(port),
                                        *args],
                               log=log, cores=1, ready_path=ready_path)
    server.sagemaker_url = f"127.0.0.1:{port}"
    return server


@pytest.fixture(scope="module")
def sagemaker(tmp_path_factory):
    repo = repo_of(tmp_path_factory.mktemp("sagemaker"), "simple", "simple_identity")
    server = start(repo, {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "simple",
                          "SAGEMAKER_TRITON_PING_MODE": None,
                          "SAGEMAKER_TRITON_INFERENCE_TYPE": None})
    yield server
    server.stop_expecting_success()


def test_ping_answers_ready(sagemaker):
    status, _, _ = call(sagemaker.sagemaker_url, "GET", "/ping")
    assert status == 200
    status, _, answer = call(sagemaker.sagemaker_url, "POST", "/ping", b"")
    assert status == 405
    assert json.loads(answer)["error"] == "Method Not Allowed"


def test_invocations_json(sagemaker):
    body, _, a, b = simple_request(binary=False)
    status, headers, answer = call(sagemaker.sagemaker_url, "POST", "/invocations", body,
                                   {"Content-Type": "application/json"})
    assert status == 200, answer
    assert headers["content-type"] == "application/json"
    check_simple_json(answer, a, b)


def test_invocations_binary_content_type(sagemaker):
    body, header_length, a, b = simple_request(binary=True)
    status, headers, answer = call(sagemaker.sagemaker_url, "POST", "/invocations", body,
                                   {"Content-Type": f"{SAGEMAKER_MIME}{header_length}"})
    assert status == 200, answer
    # The answer's JSON length travels in its content type, not in
    # Inference-Header-Content-Length.
    content_type = headers["content-type"]
    assert content_type.startswith(SAGEMAKER_MIME), headers
    assert "inference-header-content-length" not in headers
    check_simple_binary(answer, int(content_type[len(SAGEMAKER_MIME):]), a, b)


def test_kserve_header_is_not_read(sagemaker):
    # Triton's SageMaker server takes the JSON length from the content type
    # only: with a JSON content type the whole body is the JSON header.
    body, header_length, _, _ = simple_request(binary=True)
    status, _, answer = call(sagemaker.sagemaker_url, "POST", "/invocations", body,
                             {"Content-Type": "application/json",
                              "Inference-Header-Content-Length": str(header_length)})
    assert status == 400, answer
    assert "error" in json.loads(answer)


@pytest.mark.parametrize("content_type,text", [
    (f"{SAGEMAKER_MIME}abc", "Unable to parse inference header size, got: abc"),
    (f"{SAGEMAKER_MIME}999999", "inference header size should be in range (0, "),
    (f"text/plain;{SAGEMAKER_MIME}4",
     "expect MIME type for binary data starts with 'application/vnd.sagemaker-triton"),
])
def test_bad_binary_content_type(sagemaker, content_type, text):
    body, _, _, _ = simple_request(binary=True)
    status, _, answer = call(sagemaker.sagemaker_url, "POST", "/invocations", body,
                             {"Content-Type": content_type})
    assert status == 400
    assert text in json.loads(answer)["error"]


def test_invocations_wants_post(sagemaker):
    status, _, answer = call(sagemaker.sagemaker_url, "GET", "/invocations")
    assert status == 405
    assert json.loads(answer)["error"] == "Method Not Allowed"


def test_multi_model_routes_are_refused(sagemaker):
    for method, path, body in [("GET", "/models", None), ("GET", "/models/simple", None),
                               ("POST", "/models", json.dumps({"model_name": "m",
                                                               "url": "/etc"})),
                               ("POST", "/models/simple/invoke", b"{}"),
                               ("DELETE", "/models/simple", None)]:
        status, _, answer = call(sagemaker.sagemaker_url, method, path, body)
        assert status == 501, (method, path)
        assert "multi-model endpoint" in json.loads(answer)["error"]


def test_other_paths_are_bad_requests(sagemaker):
    for method, path in [("GET", "/"), ("GET", "/v2/health/ready"),
                         ("POST", "/v2/models/simple/infer")]:
        status, _, answer = call(sagemaker.sagemaker_url, method, path, b"")
        assert (status, answer) == (400, b""), (method, path)


def test_kserve_port_still_serves(sagemaker):
    status, _, _ = call(sagemaker.http_url, "GET", "/v2/health/ready")
    assert status == 200


def test_unset_default_model_is_named_in_the_error(tmp_path):
    server = start(repo_of(tmp_path, "simple"),
                   {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": None,
                    "SAGEMAKER_TRITON_PING_MODE": None, "SAGEMAKER_TRITON_INFERENCE_TYPE": None},
                   log="python-sagemaker-unset.log")
    try:
        body, _, _, _ = simple_request(binary=False)
        status, _, answer = call(server.sagemaker_url, "POST", "/invocations", body)
        assert status in (400, 404)
        assert ("Request for unknown model: 'unspecified_SAGEMAKER_TRITON_DEFAULT_MODEL_NAME'"
                in json.loads(answer)["error"])
    finally:
        server.stop_expecting_success()


def test_ping_modes_when_not_ready(tmp_path):
    # A model that fails to load keeps a strictly ready server not ready.
    repo = repo_of(tmp_path, "simple")
    (repo / "broken").mkdir()
    (repo / "broken" / "config.pbtxt").write_text('name: "broken"\nbackend: "no_such"\n')
    for mode, expect in [("ready", (400,)), ("live", (200,))]:
        server = start(repo, {"SAGEMAKER_TRITON_DEFAULT_MODEL_NAME": "simple",
                              "SAGEMAKER_TRITON_PING_MODE": mode,
                              "SAGEMAKER_TRITON_INFERENCE_TYPE": None},
                       args=["--exit-on-error=false"], log="python-sagemaker-notready.log",
                       ready_path="/v2/health/live")
        try:
            # Live answers before the start-up load ends: wait for it.
            deadline = time.time() + 60
            while call(server.http_url, "GET", "/v2/models/simple/ready")[0] != 200:
                assert time.time() < deadline, "simple did not load"
                time.sleep(0.1)
            status, _, _ = call(server.sagemaker_url, "GET", "/ping")
            assert status in expect, (mode, status)
            # Not ready, yet the loaded model answers.
            body, _, a, b = simple_request(binary=False)
            status, _, answer = call(server.sagemaker_url, "POST", "/invocations", body)
            assert status == 200, answer
            check_simple_json(answer, a, b)
        finally:
            server.stop_expecting_success()


def run_binary(repo, args, env, timeout=60):
    with environ(**env):
        return subprocess.run([str(BINARY), "--model-repository", str(repo), "--host", "127.0.0.1",
                               "--http-port", "0", "--grpc-port", "0", "--metrics-port", "0",
                               "--cores", "1", *args],
                              capture_output=True, text=True, timeout=timeout)


def test_bad_inference_type_stops_the_start(tmp_path):
    out = run_binary(repo_of(tmp_path, "simple"), ["--allow-sagemaker", "--sagemaker-port", "0"],
                     {"SAGEMAKER_TRITON_INFERENCE_TYPE": "stream"})
    assert out.returncode == 1, out.stderr
    assert "invalid inference type 'stream'" in out.stderr + out.stdout


def test_safe_port_range_is_checked(tmp_path):
    port = free_port()
    out = run_binary(repo_of(tmp_path, "simple"),
                     ["--allow-sagemaker", "--sagemaker-port", str(port),
                      f"--sagemaker-safe-port-range={port}-{port}"],
                     {"SAGEMAKER_TRITON_INFERENCE_TYPE": None})
    assert out.returncode == 1, out.stderr
    assert "The server cannot listen to HTTP requests at port 0, allowed port range is" in (
        out.stderr + out.stdout)
