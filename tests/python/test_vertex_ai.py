"""The Vertex AI service (`--allow-vertex-ai`) with plain HTTP, as Triton's
qa/L0_vertex_ai sends it: the AIP_HEALTH_ROUTE and AIP_PREDICT_ROUTE
routes, the default model rules, the `X-Vertex-Ai-Triton-Redirect` header
and the start-up checks (AIP_MODE, AIP_HTTP_PORT, missing routes)."""

import json
import subprocess
import time

import pytest

from cloudhttp import (VERTEX_MIME, call, check_simple_binary, check_simple_json, environ,
                       repo_of, simple_request)
from serverproc import BINARY, ServerProcess, free_port

ROUTES = {"AIP_PREDICT_ROUTE": "/predict", "AIP_HEALTH_ROUTE": "/health", "AIP_MODE": None,
          "AIP_HTTP_PORT": None, "AIP_STORAGE_URI": None}
REDIRECT = "X-Vertex-Ai-Triton-Redirect"


def start(repo, args=(), env=ROUTES, log="python-vertex-server.log"):
    port = free_port()
    with environ(**env):
        server = ServerProcess([repo], ["--allow-vertex-ai=true", "--vertex-ai-port", str(port),
                                        *args], log=log, cores=1)
    server.vertex_url = f"127.0.0.1:{port}"
    return server


@pytest.fixture(scope="module")
def vertex(tmp_path_factory):
    repo = repo_of(tmp_path_factory.mktemp("vertex"), "simple", "simple_identity")
    server = start(repo, ["--vertex-ai-default-model=simple"])
    yield server
    server.stop_expecting_success()


def test_health_route(vertex):
    assert call(vertex.vertex_url, "GET", "/health")[0] == 200
    status, _, answer = call(vertex.vertex_url, "POST", "/health", b"")
    assert status == 405
    assert json.loads(answer)["error"] == "Method Not Allowed"


def test_predict_goes_to_the_default_model(vertex):
    body, _, a, b = simple_request(binary=False)
    status, headers, answer = call(vertex.vertex_url, "POST", "/predict", body,
                                   {"Content-Type": "application/json"})
    assert status == 200, answer
    assert headers["content-type"] == "application/json"
    check_simple_json(answer, a, b)


def test_predict_binary_content_type(vertex):
    body, header_length, a, b = simple_request(binary=True)
    status, headers, answer = call(vertex.vertex_url, "POST", "/predict", body,
                                   {"Content-Type": f"{VERTEX_MIME}{header_length}"})
    assert status == 200, answer
    # Triton's Vertex AI server answers binary data as KServe does.
    assert headers["content-type"] == "application/octet-stream"
    check_simple_binary(answer, int(headers["inference-header-content-length"]), a, b)


def test_bad_binary_content_type(vertex):
    body, _, _, _ = simple_request(binary=True)
    status, _, answer = call(vertex.vertex_url, "POST", "/predict", body,
                             {"Content-Type": f"{VERTEX_MIME}x"})
    assert status == 400
    assert "Unable to parse inference header size, got: x" in json.loads(answer)["error"]


def test_predict_wants_post(vertex):
    assert call(vertex.vertex_url, "GET", "/predict")[0] == 405
    # With a redirect too (Triton: a bare 405).
    assert call(vertex.vertex_url, "GET", "/predict", None, {REDIRECT: "v2"})[:3:2] == (405, b"")


def test_other_routes_are_bad_requests(vertex):
    for path in ["/", "/v2/health/ready", "/predict/x", "/healthz"]:
        assert call(vertex.vertex_url, "GET", path)[:3:2] == (400, b""), path


def test_redirect_to_read_only_routes(vertex):
    def redirect(endpoint, body=b""):
        return call(vertex.vertex_url, "POST", "/predict", body, {REDIRECT: endpoint})

    status, _, answer = redirect("v2")
    assert status == 200 and json.loads(answer)["name"] == "triton"
    assert redirect("v2/health/live")[0] == 200
    assert redirect("v2/health/ready")[0] == 200
    assert redirect("v2/models/simple_identity/ready")[0] == 200
    assert redirect("v2/models/simple_identity/versions/1/ready")[0] == 200
    status, _, answer = redirect("v2/models/simple_identity/config")
    assert status == 200 and json.loads(answer)["name"] == "simple_identity"
    status, _, answer = redirect("v2/models/simple_identity")
    assert status == 200 and json.loads(answer)["name"] == "simple_identity"
    status, _, answer = redirect("v2/models/stats")
    assert status == 200 and "model_stats" in json.loads(answer)
    status, _, answer = redirect("v2/models/simple/stats")
    assert status == 200 and json.loads(answer)["model_stats"][0]["name"] == "simple"
    status, _, answer = redirect("v2/systemsharedmemory/status")
    assert status == 200 and json.loads(answer) == []
    status, _, answer = redirect("v2/repository/index")
    assert status == 200 and {m["name"] for m in json.loads(answer)} == {
        "simple", "simple_identity"}
    status, headers, answer = redirect("metrics")
    assert status == 200 and b"nv_inference_request_success" in answer
    status, _, answer = redirect("v2/models/unknown/config")
    assert status in (400, 404) and "unknown" in json.loads(answer)["error"]


def test_redirect_to_infer(vertex):
    body, _, a, b = simple_request(binary=False)
    status, _, answer = call(vertex.vertex_url, "POST", "/predict", body,
                             {REDIRECT: "v2/models/simple/infer"})
    assert status == 200, answer
    check_simple_json(answer, a, b)
    body, header_length, a, b = simple_request(binary=True)
    status, headers, answer = call(vertex.vertex_url, "POST", "/predict", body,
                                   {REDIRECT: "v2/models/simple/versions/1/infer",
                                    "Content-Type": f"{VERTEX_MIME}{header_length}"})
    assert status == 200, answer
    check_simple_binary(answer, int(headers["inference-header-content-length"]), a, b)


def test_redirect_refuses_what_changes_the_server(vertex):
    for endpoint in ["v2/repository/models/simple/unload", "v2/repository/models/simple/load",
                     "v2/systemsharedmemory/region/r/register",
                     "v2/systemsharedmemory/unregister", "v2/cudasharedmemory/register"]:
        status, _, answer = call(vertex.vertex_url, "POST", "/predict", b"{}",
                                 {REDIRECT: endpoint})
        assert (status, answer) == (403, b""), endpoint
    for endpoint in ["v2/logging", "v2/trace/setting", "v2/models/simple/generate", "x"]:
        status, _, answer = call(vertex.vertex_url, "POST", "/predict", b"{}",
                                 {REDIRECT: endpoint})
        assert (status, answer) == (400, b""), endpoint
    # The model is still served.
    assert call(vertex.http_url, "GET", "/v2/models/simple/ready")[0] == 200


def test_the_only_model_is_the_default(tmp_path):
    server = start(repo_of(tmp_path, "simple"), log="python-vertex-single.log")
    try:
        body, _, a, b = simple_request(binary=False)
        status, _, answer = call(server.vertex_url, "POST", "/predict", body)
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


@pytest.mark.parametrize("args,env,text", [
    ([], ROUTES, "Expect the model repository contains only a single model if default model is "
                 "not specified"),
    (["--vertex-ai-default-model=nope"], ROUTES, "Expect the default model 'nope' is loaded"),
    ([], {**ROUTES, "AIP_PREDICT_ROUTE": None}, "PREDICT_ROUTE is not defined for Vertex AI"),
    ([], {**ROUTES, "AIP_HEALTH_ROUTE": None}, "AIP_HEALTH_ROUTE is not defined for Vertex AI"),
])
def test_start_fails_as_tritons(tmp_path, args, env, text):
    repo = repo_of(tmp_path, "simple", "simple_identity")
    out = run_binary(repo, ["--allow-vertex-ai", "--vertex-ai-port", "0", *args], env)
    assert out.returncode == 1, out.stderr
    assert text in out.stderr + out.stdout


def test_aip_mode_prediction_defaults(tmp_path):
    # AIP_MODE=PREDICTION: Vertex AI on at AIP_HTTP_PORT, HTTP and gRPC off,
    # the repository from AIP_STORAGE_URI.
    port = free_port()
    repo = repo_of(tmp_path, "simple")
    env = {**ROUTES, "AIP_MODE": "PREDICTION", "AIP_HTTP_PORT": str(port),
           "AIP_STORAGE_URI": str(repo)}
    with environ(**env):
        proc = subprocess.Popen([str(BINARY), "--host", "127.0.0.1", "--metrics-port", "0",
                                 "--cores", "1", "--exit-timeout-secs", "5"],
                                stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
    try:
        deadline = time.time() + 60
        while True:
            try:
                if call(f"127.0.0.1:{port}", "GET", "/health", timeout=2)[0] == 200:
                    break
            except OSError:
                pass
            assert proc.poll() is None, proc.stdout.read()
            assert time.time() < deadline, "the Vertex AI service did not answer"
            time.sleep(0.1)
        body, _, a, b = simple_request(binary=False)
        status, _, answer = call(f"127.0.0.1:{port}", "POST", "/predict", body)
        assert status == 200, answer
        check_simple_json(answer, a, b)
    finally:
        proc.terminate()
        proc.wait(timeout=30)
    log = proc.stdout.read()
    assert proc.returncode == 0, log
    # HTTP and gRPC were off.
    assert "http=off" in log and "grpc=off" in log, log

